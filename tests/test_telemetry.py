"""Telemetry statistics against brute-force float64 per-example autograd references."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fathom.config import RunConfig, TelemetryConfig
from fathom.depth import dense_eval
from fathom.errors import FathomError
from fathom.models.ciresan import CiresanMLP
from fathom.seam import discover
from fathom.telemetry import (
    Recorder,
    gradient_gram,
    gradient_moments,
    moments_from_gram,
    moments_from_grams,
    schedule_due,
)
from fathom.telemetry.context import EpochContext
from fathom.telemetry.distributions import entry_summary
from fathom.telemetry.field import QUANTILES, quantile_key
from fathom.telemetry.scores import class_scores, confusion_matrix

torch.set_num_threads(1)

IN = 12
CLASSES = 4


@dataclass
class Splits:
    fit_x: torch.Tensor
    fit_y: torch.Tensor
    val_x: torch.Tensor
    val_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor


def make_splits(n_fit: int = 24, n_val: int = 10, n_test: int = 0, seed: int = 0) -> Splits:
    g = torch.Generator().manual_seed(seed)

    def part(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randint(0, 256, (n, IN), generator=g, dtype=torch.uint8)
        return x, torch.randint(0, CLASSES, (n,), generator=g)

    return Splits(*part(n_fit), *part(n_val), *part(n_test))


# Test cases as data: small models, including the crop-residual body and SD recipes (run
# dense: the gains set here must be ignored by telemetry and restored afterwards).
CASES = [
    {"id": "plain", "recipe": "plain", "widths": (9, 7, 8), "gains": None, "seed": 1},
    {"id": "residual", "recipe": "residual", "widths": (10, 8, 8, 5), "gains": None, "seed": 2},
    {
        "id": "residual_dropout",
        "recipe": "residual_dropout",
        "widths": (10, 7, 6),
        "gains": None,
        "seed": 3,
    },
    {
        "id": "sd_constant_dense",
        "recipe": "sd_constant",
        "widths": (10, 8, 6, 6, 5),
        "gains": (0.0, 1.25, 0.0, 2.5),
        "seed": 4,
    },
    {
        "id": "sd_decreasing_dense",
        "recipe": "sd_decreasing",
        "widths": (9, 9, 7, 7, 6),
        "gains": (1.25, 0.0, 5.0, 0.0),
        "seed": 5,
    },
]


def build(case: dict, dtype: torch.dtype = torch.float64) -> CiresanMLP:
    torch.manual_seed(case["seed"])
    model = CiresanMLP(
        widths=case["widths"],
        classes=CLASSES,
        recipe=case["recipe"],
        in_features=IN,
        input_scale=1 / 64,
    )
    model = model.to(dtype)
    if case["gains"] is not None:
        for b, gain in zip(model.branches(), case["gains"], strict=True):
            b.gain = gain
    return model


def context(
    model: torch.nn.Module,
    splits: Splits,
    optimizer: torch.optim.Optimizer | None = None,
    init=None,
):
    opt = optimizer or torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    init = init or {k: v.detach().clone() for k, v in model.state_dict().items()}
    return EpochContext(
        epoch=0,
        step=0,
        model=model,
        optimizer=opt,
        controller=None,
        splits=splits,
        initial_params=init,
        device=torch.device("cpu"),
        config=RunConfig(),
    )


def recorder(model, splits, probe=16, families=("all",), epochs=3) -> Recorder:
    cfg = TelemetryConfig(enabled=True, probe_size=probe, families=families)
    return Recorder(cfg, epochs=epochs, splits=splits, model=model, seed=0)


def affine(model: CiresanMLP) -> list[torch.nn.Linear]:
    """The affine layers, written out: stem, the body blocks' linear maps, head."""
    return [model.stem, *(b.linear for b in model.blocks), model.head]


def layer_names(model: CiresanMLP) -> list[str]:
    """Their qualified module names, the telemetry keys (one naming scheme for every model)."""
    body = "res.branch" if model.recipe.residual else "res"
    return ["stem", *(f"blocks.{j}.{body}" for j in range(len(model.blocks))), "head"]


def per_example_grads(
    model: CiresanMLP, x: torch.Tensor, y: torch.Tensor
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Brute force: one autograd call per example; ``[(G_w (N, P), G_b (N, out))]`` per layer."""
    layers = affine(model)
    rows: list[list[tuple[torch.Tensor, torch.Tensor]]] = []
    with dense_eval(model):
        for i in range(x.shape[0]):
            loss = F.cross_entropy(model(x[i : i + 1]), y[i : i + 1].long(), reduction="sum")
            params = [p for lin in layers for p in (lin.weight, lin.bias)]
            grads = torch.autograd.grad(loss, params)
            rows.append([(grads[2 * k].reshape(-1), grads[2 * k + 1]) for k in range(len(layers))])
    return [
        (torch.stack([r[k][0] for r in rows]), torch.stack([r[k][1] for r in rows]))
        for k in range(len(layers))
    ]


def brute_moments(g: torch.Tensor) -> dict[str, float | None]:
    """Every moment straight from the materialised per-example gradients ``g`` (N, P)."""
    n = g.shape[0]
    m = g.mean(dim=0)
    sq = (g * g).sum(dim=1)
    norms = sq.sqrt()
    m2 = float(m @ m)
    centred = g - m
    trace_s = float((centred * centred).sum()) / n
    along = float(((centred @ m) ** 2).sum()) / n
    cos = []
    for i in range(n):
        j = (i + 1) % n
        if norms[i] > 0 and norms[j] > 0:
            cos.append(float(g[i] @ g[j] / (norms[i] * norms[j])))
    return {
        "mean_norm": math.sqrt(m2),
        "mean_sq_norm": float(sq.mean()),
        "diversity": float(sq.mean()) / m2,
        "max_share": float(sq.max() / sq.sum()),
        "participation": float(norms.sum() ** 2 / sq.sum()),
        "cos_cyclic_mean": sum(cos) / len(cos),
        "noise_scale": trace_s / m2,
        "cov_along_mean": along / m2**2,
    }


def allclose_report(got: dict, want: dict, rtol: float = 1e-9, atol: float = 1e-12) -> list[str]:
    """Entries that differ, with both values (empty list = all close)."""
    bad = []
    for k, w in want.items():
        v = got[k]
        if (v is None) != (w is None) or (
            w is not None and not math.isclose(v, w, rel_tol=rtol, abs_tol=atol)
        ):
            bad.append(f"{k}: got {v!r}, want {w!r}")
    return bad


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_per_example_moments_match_brute_force(case):
    model = build(case)
    splits = make_splits(seed=case["seed"])
    rec = recorder(model, splits, probe=16)
    row = rec.observe(context(model, splits))
    x, y = splits.fit_x[:16], splits.fit_y[:16]
    grads = per_example_grads(model, x, y)
    names = layer_names(model)
    bad = []
    for i, (gw, gb) in enumerate(grads):
        want = brute_moments(gw)
        got = {k: row[f"grad/pex/{k}/{names[i]}"] for k in want if k != "mean_norm"}
        got["mean_norm"] = row[f"grad/mean/weight_norm/{names[i]}"]
        bad += [f"L{i} {b}" for b in allclose_report(got, want)]
        bias_mean = float(gb.mean(dim=0).norm())
        bad += [
            f"L{i} {b}"
            for b in allclose_report(
                {"b": row[f"grad/mean/bias_norm/{names[i]}"]}, {"b": bias_mean}
            )
        ]
        # dL_i/db = delta_i exactly, so the brute-force bias gradients are the backprop signals.
        want_delta = entry_summary(gb)
        got_delta = {k: row[f"probe/delta/{k}/{names[i]}"] for k in want_delta}
        norms = gw.norm(dim=1)
        want_q = {f"q{round(q * 100)}": float(torch.quantile(norms, q)) for q in (0.1, 0.5, 0.9)}
        want_q["max"] = float(norms.max())
        got_q = {k: row[f"grad/pex/norm_{k}/{names[i]}"] for k in want_q}
        bad += [f"L{i} norm {b}" for b in allclose_report(got_q, want_q)]
        bad += [f"L{i} delta {b}" for b in allclose_report(got_delta, want_delta)]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("include_bias", [False, True])
def test_functional_moments_with_and_without_bias(include_bias):
    case = CASES[1]
    model = build(case)
    splits = make_splits(seed=7)
    x, y = splits.fit_x[:12], splits.fit_y[:12]
    seam = discover(model, x)
    with dense_eval(model), seam.capture() as calls:
        logits = model(x)
    cots = seam.cotangents(calls, F.cross_entropy(logits, y, reduction="sum"))
    taps = [calls[name][0].args[0] for name in layer_names(model)]
    deltas = [cots[name][0][0] for name in layer_names(model)]
    for i, (a, d, (gw, gb)) in enumerate(
        zip(taps, deltas, per_example_grads(model, x, y), strict=True)
    ):
        g = torch.cat([gw, gb], dim=1) if include_bias else gw
        got = gradient_moments(a, d, include_bias=include_bias).as_dict()
        bad = allclose_report(got, brute_moments(g))
        assert not bad, f"layer {i}: " + "; ".join(bad)


def test_activation_summaries_match_reference_forward():
    case = CASES[3]
    model = build(case)
    splits = make_splits(seed=4)
    row = recorder(model, splits, probe=16, families=("activations",)).observe(
        context(model, splits)
    )
    # Reference forward written out from the architecture: h = relu(crop(h) + linear(h)).
    x = splits.fit_x[:16].to(torch.float64) / 64
    with torch.no_grad():
        hs = [F.relu(model.stem(x))]
        for block in model.blocks:
            lin = block.linear
            hs.append(F.relu(hs[-1][:, : lin.out_features] + lin(hs[-1])))
    inputs = layer_names(model)[1:]  # h_i is the input of the next layer
    for i, h in enumerate(hs):
        assert row[f"probe/act/zero_frac/{inputs[i]}"] == pytest.approx(
            float((h == 0).double().mean()), abs=0
        )
        assert row[f"probe/act/dead_frac/{inputs[i]}"] == pytest.approx(
            float((h == 0).all(dim=0).double().mean()), abs=0
        )
        assert row[f"probe/act/mean/{inputs[i]}"] == pytest.approx(float(h.mean()), rel=1e-12)
        assert row[f"probe/act/std/{inputs[i]}"] == pytest.approx(
            float(h.std(unbiased=False)), rel=1e-12
        )
        for q in QUANTILES:
            assert row[f"probe/act/{quantile_key(q)}/{inputs[i]}"] == pytest.approx(
                float(torch.quantile(h.reshape(-1), q)), rel=1e-12
            )
    assert len(hs) == len(inputs)
    assert "probe/act/mean/stem" not in row, "the stem's input is the data, not an activation"


def test_probe_scores_match_direct_computation():
    model = build(CASES[0])
    splits = make_splits(seed=9)
    row = recorder(model, splits, probe=20, families=("probe",)).observe(context(model, splits))
    with torch.no_grad():
        logits = model(splits.fit_x[:20])
    y = splits.fit_y[:20]
    assert row["probe/ce"] == pytest.approx(float(F.cross_entropy(logits, y)), rel=1e-12)
    assert row["probe/acc"] == pytest.approx(float((logits.argmax(1) == y).double().mean()), abs=0)


def test_scores_confusion_against_loop_and_null_for_empty_class():
    model = build(CASES[1])
    splits = make_splits(n_fit=30, n_val=9, seed=11)
    splits.val_y[:] = torch.tensor([0, 0, 1, 1, 1, 2, 2, 0, 1])  # class 3 absent from val
    row = recorder(model, splits, probe=8, families=("scores",)).observe(context(model, splits))
    for split in ("fit", "val"):
        x, y = getattr(splits, f"{split}_x"), getattr(splits, f"{split}_y")
        with torch.no_grad():
            pred = model(x).argmax(1)
        want = [[0] * CLASSES for _ in range(CLASSES)]
        for t, p in zip(y.tolist(), pred.tolist(), strict=True):
            want[t][p] += 1
        assert row[f"split/{split}/confusion"] == want
        for c in range(CLASSES):
            count = sum(want[c])
            assert row[f"split/{split}/class_count/{c}"] == count
            assert row[f"split/{split}/class_acc/{c}"] == (
                None if count == 0 else want[c][c] / count
            )
    assert row["split/val/class_acc/3"] is None
    assert not any(k.startswith("split/test/") for k in row), "an empty split produces no fields"


def test_params_family_and_update_ratio_is_the_last_step():
    model = build(CASES[1])
    splits = make_splits(seed=12)
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)
    rec = recorder(model, splits, probe=8, families=("params",))
    row0 = rec.observe(context(model, splits, opt, init))
    names = layer_names(model)
    assert all(row0[f"param/momentum_norm/{n}"] is None for n in names), (
        "no buffer before the first step"
    )
    assert all(row0[f"param/update_ratio/{n}"] is None for n in names)
    assert row0["param/disp_total"] == 0.0
    for _ in range(2):
        before = [lin.weight.detach().clone() for lin in affine(model)]
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(splits.fit_x), splits.fit_y).backward()
        opt.step()
    row = rec.observe(context(model, splits, opt, init))
    for i, (lin, w_before) in enumerate(zip(affine(model), before, strict=True)):
        w = lin.weight.detach()
        step = float((w - w_before).norm())
        assert row[f"param/update_ratio/{names[i]}"] == pytest.approx(
            step / float(w.norm()), rel=1e-9
        )
        assert row[f"param/weight_norm/{names[i]}"] == pytest.approx(float(w.norm()), rel=1e-12)
        assert row[f"param/bias_norm/{names[i]}"] == pytest.approx(
            float(lin.bias.detach().norm()), rel=1e-12
        )
        w_name = next(n for n, p in model.named_parameters() if p is lin.weight)
        disp = float((w - init[w_name]).norm())
        assert row[f"param/disp/{names[i]}"] == pytest.approx(disp, rel=1e-12)
        assert row[f"param/disp_rel/{names[i]}"] == pytest.approx(
            disp / float(init[w_name].norm()), rel=1e-12
        )
    total = math.sqrt(
        sum(float((p.detach() - init[n]).norm()) ** 2 for n, p in model.named_parameters())
    )
    assert row["param/disp_total"] == pytest.approx(total, rel=1e-12)


def test_nesterov_update_ratio_is_null():
    model = build(CASES[0])
    splits = make_splits(seed=13)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    F.cross_entropy(model(splits.fit_x), splits.fit_y).backward()
    opt.step()
    row = recorder(model, splits, probe=8, families=("params",)).observe(
        context(model, splits, opt)
    )
    assert row["param/update_ratio/stem"] is None
    assert row["param/momentum_norm/stem"] is not None


def test_undefined_moments_are_null_not_zero():
    zero = moments_from_gram(torch.zeros(5, 5, dtype=torch.float64))
    assert zero.mean_norm == 0.0 and zero.mean_sq_norm == 0.0
    for key in (
        "diversity",
        "max_share",
        "participation",
        "cos_cyclic_mean",
        "noise_scale",
        "cov_along_mean",
    ):
        assert getattr(zero, key) is None, key
    one = gradient_moments(torch.ones(1, 3), torch.ones(1, 2))
    assert one.cos_cyclic_mean is None and one.diversity == pytest.approx(1.0)
    # Balanced gradients: the mean is zero, D is undefined, the energy share is defined.
    a = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    d = torch.tensor([[1.0], [-1.0]])
    bal = gradient_moments(a, d)
    assert bal.diversity is None and bal.noise_scale is None and bal.max_share == pytest.approx(0.5)
    assert entry_summary(torch.zeros(0))["mean"] is None


def test_single_dominant_example_gives_n_and_n_minus_one():
    n = 8
    a = torch.randn(n, 5, dtype=torch.float64)
    d = torch.zeros(n, 3, dtype=torch.float64)
    d[3] = torch.tensor([0.5, -1.0, 2.0])
    mom = gradient_moments(a, d)
    assert mom.diversity == pytest.approx(n)
    assert mom.noise_scale == pytest.approx(n - 1)
    assert mom.cov_along_mean == pytest.approx(n - 1)
    assert mom.max_share == pytest.approx(1.0)
    assert mom.participation == pytest.approx(1.0)
    assert mom.cos_cyclic_mean is None


def test_confusion_and_class_scores_functions():
    conf = confusion_matrix(torch.tensor([0, 1, 1, 2]), torch.tensor([0, 1, 2, 2]), 4)
    assert conf.tolist() == [[1, 0, 0, 0], [0, 1, 0, 0], [0, 1, 1, 0], [0, 0, 0, 0]]
    counts, acc = class_scores(conf)
    assert counts == [1, 1, 2, 0] and acc == [1.0, 1.0, 0.5, None]


def test_schedule():
    due = [e for e in range(0, 31) if schedule_due(e, (0, 1), 10, 25)]
    assert due == [0, 1, 10, 20, 25]
    rec = recorder(build(CASES[0]), make_splits(), probe=4, epochs=25)
    assert [e for e in range(26) if rec.due(e)] == [0, 1, 10, 20, 25]


def test_family_selection_returns_only_those_fields():
    model = build(CASES[0])
    splits = make_splits()
    row = recorder(model, splits, probe=4, families=("cheap",)).observe(context(model, splits))
    assert row and all(k.startswith(("probe/ce", "probe/acc", "probe/act/", "param/")) for k in row)
    row = recorder(model, splits, probe=4, families=("moments",)).observe(context(model, splits))
    assert row and all(k.startswith("grad/pex/") for k in row)


def test_bad_input_errors_name_problem_and_fix():
    model = build(CASES[0])
    splits = make_splits(n_fit=10)
    with pytest.raises(FathomError, match=r"probe_size = 11 .*at most 10"):
        recorder(model, splits, probe=11)
    with pytest.raises(ValueError, match=r"'probe', 'activations'.*'cheap'"):  # the config
        recorder(model, splits, probe=4, families=("activation",))
    unchecked = TelemetryConfig.model_construct(
        enabled=True, probe_size=4, families=("activation",)
    )
    with pytest.raises(FathomError, match=r"valid families: probe, activations.*cheap"):
        Recorder(unchecked, epochs=3, splits=splits, model=model, seed=0)  # and the registry
    with pytest.raises(FathomError, match=r"epochs \[7\] outside training"):
        Recorder(TelemetryConfig(first=(0, 7)), epochs=5, splits=splits, model=model, seed=0)
    no_params = Recorder(
        TelemetryConfig(probe_size=4), epochs=5, splits=splits, model=torch.nn.Flatten(), seed=0
    )
    with pytest.raises(FathomError, match="Flatten has no parameters"):
        no_params.observe(context(model, splits))


def test_batched_moments_equal_per_layer():
    g = torch.Generator().manual_seed(3)
    ks = []
    for _ in range(3):
        a, d = torch.randn(6, 4, generator=g), torch.randn(6, 2, generator=g)
        ks.append(gradient_gram(a, d))
    ks[1] = torch.zeros_like(ks[1])
    batched = moments_from_grams(torch.stack(ks))
    assert batched == [moments_from_gram(k) for k in ks]
    assert batched[1].diversity is None


def test_scores_from_callers_predictions_equal_own_forward():
    model = build(CASES[2])
    splits = make_splits(n_fit=20, n_val=10, n_test=7, seed=17)
    rec = recorder(model, splits, probe=4, families=("scores",))
    own = rec.observe(context(model, splits))
    with torch.no_grad(), dense_eval(model):
        preds = {s: model(getattr(splits, f"{s}_x")).argmax(1) for s in ("fit", "val", "test")}
    assert rec.observe(context(model, splits), predictions=preds) == own
    with pytest.raises(FathomError, match="one predicted class per example"):
        rec.observe(context(model, splits), predictions={"val": preds["val"][:3]})


def sorted_quantiles(xs: torch.Tensor, quantiles: tuple[float, ...]) -> torch.Tensor:
    """Linearly interpolated quantiles of an ascending 1-D tensor, as a tensor formula (no
    size limit, unlike ``torch.quantile``): the reference ``entry_summary`` is checked against."""
    pos = torch.tensor(quantiles, dtype=torch.float64, device=xs.device) * (xs.numel() - 1)
    lo = pos.floor().long()
    hi = pos.ceil().long()
    return xs[lo] + (pos - lo.to(torch.float64)) * (xs[hi] - xs[lo])


def test_sorted_quantiles_match_torch_quantile():
    for n in (1, 2, 7, 100):
        x = torch.randn(n, dtype=torch.float64, generator=torch.Generator().manual_seed(n))
        want = torch.quantile(x, torch.tensor(QUANTILES, dtype=torch.float64))
        assert torch.allclose(
            sorted_quantiles(torch.sort(x).values, QUANTILES), want, rtol=0, atol=1e-15
        )


_DTYPES = st.sampled_from([torch.float32, torch.float64, torch.float16])


@example(values=[float("inf")], dtype=torch.float32)  # inf - inf: NaN in both
@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(
        st.one_of(st.floats(allow_nan=False, width=16), st.sampled_from([0.0, -0.0, 1.0, -1.0])),
        min_size=1,
        max_size=300,
    ),
    dtype=_DTYPES,
)
def test_entry_summary_sorts_like_torch_sort_in_float64(values, dtype):
    """The quantiles from the fast ascending sort (numpy's, in the tensor's own dtype) are
    those of ``torch.sort`` of the float64 entries, bit for bit."""
    from fathom.telemetry.distributions import ascending

    x = torch.tensor(values, dtype=dtype)
    want = sorted_quantiles(torch.sort(x.to(torch.float64)).values, QUANTILES)
    got = sorted_quantiles(ascending(x).to(torch.float64), QUANTILES)
    assert torch.equal(got.view(torch.int64), want.view(torch.int64))  # NaN (inf - inf) too
    summary = entry_summary(x)
    x64 = x.to(torch.float64)
    assert math.copysign(1.0, summary["absmax"]) == 1.0 or math.isnan(summary["absmax"])
    assert summary["absmax"] == float(x64.abs().max()) or math.isnan(float(x64.abs().max()))
    got_fields = torch.tensor([summary[quantile_key(q)] for q in QUANTILES], dtype=torch.float64)
    assert torch.equal(got_fields.view(torch.int64), want.view(torch.int64))


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 400), min_size=1, max_size=6),
    scale=st.sampled_from([1e-20, 1.0, 1e20]),
    seed=st.integers(0, 2**16),
)
def test_norms_equal_float64_copies_bit_for_bit(sizes, scale, seed):
    """``Norms`` (scratch buffers reused across tensors of growing and shrinking sizes and
    across observations) gives the bits of ``vector_norm(t.to(float64))``."""
    from fathom.telemetry.params import Norms

    g = torch.Generator().manual_seed(seed)
    scratch: dict = {}
    for _ in range(2):  # the second observation reuses the first one's buffers
        norms = Norms(scratch)
        for n in sizes:
            w, w0 = (torch.randn(n, 3, generator=g) * scale for _ in range(2))
            disp = torch.linalg.vector_norm(w.to(torch.float64) - w0.to(torch.float64))
            assert norms.displacement(w, w0) == float(disp)
            assert norms.frob(w) == float(torch.linalg.vector_norm(w.to(torch.float64)))
            assert norms.frob(w0) == float(torch.linalg.vector_norm(w0.to(torch.float64)))


class _Scaled(torch.nn.Module):
    """A first layer reading the probe through a parameter-free scale held in a buffer (a
    user's normalization changed in place between observations)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scale", torch.tensor(1.0))
        self.fc1, self.fc2 = torch.nn.Linear(IN, 6), torch.nn.Linear(6, CLASSES)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x.float() * self.scale)))


def test_first_layer_reuse_follows_a_changed_input():
    """Observations reuse the first layer's input Gram only while its input is the same bit
    for bit: after the input changes (a buffer changed in place, which
    no structure key sees) every field equals a fresh object's, and before it, a repeated
    observation equals the first."""
    from fathom import Instruments

    torch.manual_seed(0)
    model = _Scaled()
    splits = make_splits()
    x, y = splits.fit_x, splits.fit_y
    ins = Instruments(model, x, y)
    first = ins.observe()
    assert ins.observe() == first
    with torch.no_grad():
        model.scale.fill_(0.5)
    changed = ins.observe()
    assert changed == Instruments(model, x, y).observe()
    assert changed["probe/act/mean/fc2"] != first["probe/act/mean/fc2"]
    assert changed["grad/pex/mean_sq_norm/fc1"] != first["grad/pex/mean_sq_norm/fc1"]
    with torch.no_grad():
        model.scale.fill_(1.0)
    assert ins.observe() == first


def test_reference_norms_follow_a_reference_changed_in_place():
    """A reference norm kept across observations is taken again when the reference changed
    in place (its version) or is another tensor; only the last observation's are kept."""
    from fathom.telemetry.params import Norms

    scratch: dict = {}
    w0 = torch.ones(4)
    assert Norms(scratch).frob(w0, reference=True) == 2.0
    w0.mul_(2.0)
    assert Norms(scratch).frob(w0, reference=True) == 4.0
    other = torch.full((4,), 3.0)
    assert Norms(scratch).frob(other, reference=True) == 6.0
    assert [t for t, *_ in scratch["references"].values()] == [other]
