"""The defects in the seam core, one named regression test each, against an
independent float64 loop over examples (``tests/seam_edge_models.py``): every case is
either exact (per-example gradients, Gram matrices, all three curvature diagonals within
1e-9 relative) or refused naming the module, and every call leaves the model as found."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fathom
from fathom.curvature import exact_diagonals
from fathom.curvature.twin import clear_twins
from fathom.errors import FathomError
from fathom.seam import discover
from fathom.seam.pex import per_example_grads, per_example_grams
from seam_edge_models import CASES, IDS, differences, loop_diagonals, loop_grads, make, state

torch.set_num_threads(1)
RTOL = 1e-9


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).norm() / want.norm().clamp_min(1e-300))


def seam_grads(model, x, y):
    seam = discover(model, x)
    with seam.capture() as calls:
        logits = model(x)
    cots = seam.cotangents(calls, F.cross_entropy(logits, y, reduction="sum"))
    out, grams = {}, {}
    for layer in seam.layers:
        got = per_example_grads(layer, calls[layer.name], cots[layer.name], len(y))
        gram = per_example_grams(layer, calls[layer.name], cots[layer.name], len(y))
        for key, q in zip(layer.params, layer.qualified, strict=True):
            out[q], grams[q] = got[key], gram[key]
    return seam, out, grams


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_exact_per_example_gradients_and_grams(case) -> None:
    model, x, y = make(case)
    want = loop_grads(model, x, y)
    before = state(model)
    seam, got, grams = seam_grads(model, x, y)
    for q in set(want) - set(got):  # not covered: must be unused, with gradient zero
        assert "unused" in seam.coverage[q] and float(want[q].abs().max()) == 0.0, q
    want = {q: w for q, w in want.items() if q in got}
    assert set(got) == set(want)
    bad = [q for q in want if not rel_err(got[q], want[q]) <= RTOL]
    flat = {q: w.reshape(len(y), -1) for q, w in want.items()}
    bad += [f"gram {q}" for q in want if not rel_err(grams[q], flat[q] @ flat[q].T) <= RTOL]
    assert not bad, bad
    for layer, text in case["path"].items():
        line = [c for c in seam.coverage.values() if c.startswith(f"{layer} (")]
        assert line and all(text in c for c in line), (layer, seam.coverage)
    after = state(model)
    # the capture forward above is the test's own; discovery and the gradients changed nothing
    assert differences(before, after) in ([], ["attrs"]) and before["params"][0][0]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_exact_curvature_diagonals_and_model_untouched(case) -> None:
    clear_twins()
    model, x, y = make(case, n=4)
    want = loop_diagonals(model, x, y)
    before = state(model)
    got = exact_diagonals(model, x, y)
    assert differences(before, state(model)) == []
    bad = [
        f"{k}/{n}: {rel_err(got[k][n], w):.2e}"
        for k in want
        for n, w in want[k].items()
        if float(w.norm()) > 0 and not rel_err(got[k][n], w) <= RTOL
    ]
    assert not bad, bad
    clear_twins()


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_observe_leaves_everything_as_found(case) -> None:
    model, x, y = make(case, dtype=torch.float32)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    model.train()
    F.cross_entropy(model(x), y).backward()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.eval()  # a trained BatchNorm in train mode would refuse; keep it eval-ready
    model.eval()
    before = state(model)
    row = fathom.Instruments(model, x, y).observe(optimizer=opt)
    assert differences(before, state(model)) == []
    assert row["probe/ce"] is not None


def test_hooked_linear_ggn_is_exact_not_a_quarter() -> None:
    """A forward hook doubling a Linear's output once made the fast path report
    0.25 of the GGN diagonal (0.5 of the norms) while calling itself "fast linear"."""
    case = CASES[IDS.index("hooked_linear")]
    model, x, y = make(case, n=4)
    clear_twins()
    got = exact_diagonals(model, x, y, families="ggn")["ggn"]["0.weight"]
    want = loop_diagonals(model, x, y)["ggn"]["0.weight"]
    assert rel_err(got, want) <= RTOL
    assert "fast" not in discover(model, x).coverage["0.weight"]


def test_root_bias_is_attributed_to_itself_not_to_attn_bias() -> None:
    model, x, y = make(CASES[IDS.index("root_bias_into_attn")])
    seam, got, _ = seam_grads(model, x, y)
    layer = seam.layer("attn")
    assert "<model>.attn_bias" in layer.params and "in_proj_bias" in layer.params
    want = loop_grads(model, x, y)
    assert rel_err(got["attn_bias"], want["attn_bias"]) <= RTOL
    assert rel_err(got["attn.in_proj_bias"], want["attn.in_proj_bias"]) <= RTOL


def test_parametrized_weight_keys_are_the_originals() -> None:
    model, x, _ = make(CASES[IDS.index("weight_norm")])
    layer = discover(model, x).layer("0")
    assert layer.kind == "generic"
    assert set(layer.params) == {
        "parametrizations.weight.original0",
        "parametrizations.weight.original1",
        "bias",
    }
    assert set(layer.weights) == {
        "parametrizations.weight.original0",
        "parametrizations.weight.original1",
    }


def test_recurrent_biases_are_biases_by_module_type() -> None:
    model, x, _ = make(CASES[IDS.index("lstm_bidirectional_time_major_proj")])
    layer = discover(model, x).layer("rnn")
    assert layer.kind == "recurrent"
    assert set(layer.biases) == {f"bias_{a}_l0{s}" for a in ("ih", "hh") for s in ("", "_reverse")}
    assert "weight_hr_l0" in layer.weights and "weight_hr_l0_reverse" in layer.weights


@pytest.mark.parametrize("rnn", ["gru", "lstm_bidirectional_time_major_proj", "rnn_relu_with_h0"])
def test_recurrent_float32_within_rounding(rnn) -> None:
    model, x, y = make(CASES[IDS.index(rnn)], dtype=torch.float32)
    want = loop_grads(model.double(), x.double(), y)
    model.float()
    _, got, _ = seam_grads(model, x, y)
    assert all(rel_err(got[q].double(), want[q]) <= 1e-5 for q in want)


def test_embedding_max_norm_refused_before_any_forward() -> None:
    model = nn.Sequential(nn.Embedding(11, 6, max_norm=0.5), nn.Flatten(), nn.Linear(24, 3))
    x = torch.randint(0, 11, (5, 4))
    before = state(model)
    with pytest.raises(FathomError, match=r"module '0' \(Embedding\) has max_norm=0.5"):
        discover(model, x)
    with pytest.raises(FathomError, match="max_norm"):
        fathom.Instruments(model, x, torch.zeros(5, dtype=torch.long)).observe()
    clear_twins()
    with pytest.raises(FathomError, match="max_norm"):
        exact_diagonals(model, x, torch.zeros(5, dtype=torch.long))
    assert differences(before, state(model)) == []
    assert float(model[0].weight.norm(dim=1).max()) > 0.5  # no row was renormalized


def test_inference_mode_is_refused_clearly() -> None:
    model, x, y = make(CASES[IDS.index("hooked_linear")], dtype=torch.float32)
    ins = fathom.Instruments(model, x, y)
    with torch.inference_mode():
        with pytest.raises(FathomError, match="inference_mode"):
            discover(model, x)
        with pytest.raises(FathomError, match="inference_mode"):
            ins.observe()
        with pytest.raises(FathomError, match="inference_mode"):
            exact_diagonals(model, x, y)
    ins.observe()  # and works outside it, on the same object
    with torch.inference_mode(), pytest.raises(FathomError, match="inference_mode"):
        ins.observe()


def test_global_forward_hooks_refused() -> None:
    model, x, _ = make(CASES[IDS.index("pre_hooked_linear")])
    handle = nn.modules.module.register_module_forward_hook(lambda m, a, o: None)
    try:
        with pytest.raises(FathomError, match="global module forward hooks"):
            discover(model, x)
    finally:
        handle.remove()


def test_legacy_weight_norm_leaves_no_grad_tracking_tensor() -> None:
    from torch._C._functorch import is_gradtrackingtensor

    for cid in ("legacy_weight_norm", "pruned"):
        model, x, y = make(CASES[IDS.index(cid)], dtype=torch.float32)
        fathom.Instruments(model, x, y).observe()
        assert not is_gradtrackingtensor(model[0].weight), cid
        model(x)  # and the module still runs afterwards


def _mlp64(frozen: bool = False) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)).double()
    model[0].requires_grad_(not frozen)
    g = torch.Generator().manual_seed(4)
    return model, torch.randn(6, 6, generator=g, dtype=torch.float64), torch.arange(6) % 3


def test_unfreezing_a_backbone_gives_its_layers_fields() -> None:
    model, x, y = _mlp64(frozen=True)
    ins = fathom.Instruments(model, x, y, families=("gradients", "params"))
    assert not any(k.endswith("/0") for k in ins.observe())
    model[0].requires_grad_(True)  # the fine-tuning pattern
    row = ins.observe()
    want = loop_grads(model, x, y)["0.weight"].mean(0).norm()
    assert abs(row["grad/mean/weight_norm/0"] - float(want)) <= 1e-9 * float(want)


def test_swapping_the_head_reports_the_new_head() -> None:
    model, x, y = _mlp64()
    ins = fathom.Instruments(model, x, y, families=("params",))
    old = ins.observe()["param/weight_norm/2"]
    assert old == float(model[2].weight.norm())
    model[2] = nn.Linear(8, 3).double()
    row = ins.observe()
    assert row["param/weight_norm/2"] == float(model[2].weight.norm()) != old
    assert row["param/disp/2"] == 0.0  # a new parameter is measured from first sight


def test_unchanged_structure_is_not_rediscovered() -> None:
    from model_zoo import CASES as ZOO
    from model_zoo import make as make_zoo

    model, x, y = make_zoo(next(c for c in ZOO if c["id"] == "residual_mlp"))
    ins = fathom.Instruments(model, x, y, families=("gradients",))
    ins.observe()
    seam = ins.seam
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.9)  # an optimizer step: values, not structure
    model.blocks[0].gain = 2.0  # a gate drawn by the trainer: dense evaluation ignores it
    model.blocks[1].p = 0.3
    ins.observe()
    assert ins.seam is seam
    model.blocks[0].register_forward_hook(lambda m, a, o: o)
    assert ins.seam is not seam


def test_exact_diagonals_are_dense_with_a_mask_left_on() -> None:
    from fathom.curvature.probe import float64_copy
    from model_zoo import CASES as ZOO
    from model_zoo import make as make_zoo

    model, x, y = make_zoo(next(c for c in ZOO if c["id"] == "residual_mlp"), n=5)
    clear_twins()
    dense = exact_diagonals(model, x, y)
    model.blocks[1].mask = False  # a deletion left on by an audit
    clear_twins()
    got = exact_diagonals(model, x, y)
    assert model.blocks[1].mask is False  # the user's model keeps its mask
    for kind in dense:
        for name, t in dense[kind].items():
            assert torch.equal(got[kind][name], t), (kind, name)
    assert float(got["ggn"]["blocks.1.branch.0.weight"].abs().max()) > 0
    twin = float64_copy(model)
    assert all(b.mask is None for b in twin.blocks) and not twin.training
    clear_twins()


GRU_MODULE = """
import torch
from torch import nn


class GRUNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(3, 8, batch_first=True)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        out, _ = self.gru(x.reshape(x.shape[0], 4, 3))
        return self.head(out[:, -1])


def gru():
    return GRUNet()
"""


def test_fathom_train_with_telemetry_on_a_gru(tmp_path, monkeypatch) -> None:
    """``nn.GRU`` was once refused on every path, so training with telemetry
    failed at epoch 0. Now every field of the GRU's layer is measured at every boundary."""
    import sys

    from fathom.config import validate_run_config
    from fathom.rundir import RunDir
    from fathom.train.loop import train
    from test_train_kinds import user_config, user_files

    _, npz = user_files(tmp_path, n=120)
    (tmp_path / "grumodels.py").write_text(GRU_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("grumodels", None)
    cfg = user_config(
        npz,
        model={"kind": "python", "factory": "grumodels:gru", "kwargs": {}},
        optim={"epochs": 1, "batch_size": 32},
        telemetry={"enabled": True, "probe_size": 16, "first": [0, 1]},
        checkpoints={"save_epochs": [1]},
    )
    assert train(validate_run_config(cfg), tmp_path / "run").status == "complete"
    rd = RunDir(tmp_path / "run")
    layers = {la["name"]: la["kind"] for la in rd.manifest["telemetry"]["layers"]}
    assert layers == {"gru": "recurrent", "head": "linear"}
    rows = rd.history()
    assert len(rows) == 2
    for row in rows:
        assert row["grad/pex/norm_max/gru"] > 0 and row["grad/mean/bias_norm/gru"] > 0
        assert row["param/bias_norm/gru"] > 0


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("cid", ["hooked_linear", "hooked_conv_bn", "pre_hooked_linear"])
def test_self_check_would_catch_a_fast_path_that_ignored_hooks(cid, dtype, monkeypatch) -> None:
    """With the hook rule switched off (the old behaviour) discovery itself refuses, naming
    the module and the parameter: the self-check now runs fast layers too. In float32 the
    float64 confirmation of a mismatch fails as well (the error is structural)."""
    import fathom.seam.attribution as attribution

    monkeypatch.setattr(attribution, "_why_generic", lambda *a, **k: "")
    model, x, _ = make(CASES[IDS.index(cid)], dtype=dtype)
    with pytest.raises(FathomError, match=r"module '\w+' \(\w+, fast \w+\): per-example gradients"):
        discover(model, x)
