"""Every field of ``Instruments.observe`` (default families) against the plain formulas, bit
for bit.

``observe`` takes fast paths that must not change a single bit: order statistics sorted by
numpy in the tensor's dtype and picked in Python floats, exact-zero counts read from the sorted
entries, the first layer's input Gram reused while its input is unchanged, float64 weight
copies shared between a norm and a displacement, float64 references kept across observations,
norm quantiles interpolated in numpy. The reference here is written out plainly and
independently of the seam: layer inputs and outputs captured by forward hooks, cotangents by
``autograd.grad`` of the summed cross entropy, every statistic from a float64 copy by
``torch.sort`` and tensor formulas, Gram matrices ``(A A^T) * (Delta Delta^T)`` in float64 and
``moments_from_grams`` (tested against per-example float64 gradients in
``tests/test_telemetry.py``), parameter norms from ``t.to(float64)``. Three observations with
SGD steps between them (so that references, momentum buffers and reused Grams are exercised).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from fathom import Instruments
from fathom.depth import SkippableResidual
from fathom.models.ciresan import CiresanMLP
from fathom.telemetry.field import QUANTILES, quantile_key
from fathom.telemetry.gradient_fields import NORM_QUANTILES
from fathom.telemetry.moments import moments_from_grams
from fathom.telemetry.registry import GRAD, UPDATE

torch.set_num_threads(1)

_MOMENTS = (
    "mean_sq_norm",
    "diversity",
    "max_share",
    "participation",
    "cos_cyclic_mean",
    "noise_scale",
    "cov_along_mean",
)


def _sorted_quantiles(xs: torch.Tensor, qs: tuple[float, ...]) -> torch.Tensor:
    """Linear interpolation between order statistics of the ascending float64 ``xs``, as
    tensors (``torch.quantile``'s rule)."""
    pos = torch.tensor(qs, dtype=torch.float64) * (xs.shape[-1] - 1)
    lo, hi = pos.floor().long(), pos.ceil().long()
    return xs[..., lo] + (pos - lo.to(torch.float64)) * (xs[..., hi] - xs[..., lo])


def _entries(prefix: str, t: torch.Tensor, name: str) -> dict[str, float]:
    x = t.detach().reshape(-1).to(torch.float64)
    q = _sorted_quantiles(torch.sort(x).values, QUANTILES).tolist()
    out = {
        "mean": float(x.mean()),
        "std": float(x.std(correction=0)),
        "rms": float(x.square().mean().sqrt()),
        "absmax": float(x.abs().max()),
        **{quantile_key(p): v for p, v in zip(QUANTILES, q, strict=True)},
    }
    return {f"{prefix}/{k}/{name}": v for k, v in out.items()}


def _norm(t: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(t.detach().to(torch.float64)))


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0.0 else a / b


def plain_fields(model, x, y, opt, initial, layers: list[str]) -> dict[str, float | None]:
    """Every default-family field of ``model`` on the probe ``(x, y)``, written out plainly."""
    mods = dict(model.named_modules())
    seen: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    handles = [
        mods[n].register_forward_hook(lambda m, a, o, n=n: seen.__setitem__(n, (a[0], o)))
        for n in layers
    ]
    was = model.training
    model.eval()
    try:
        with torch.enable_grad():
            logits = model(x)
            outs = [seen[n][1] for n in layers]
            deltas = torch.autograd.grad(F.cross_entropy(logits, y, reduction="sum"), outs)
    finally:
        model.train(was)
        for h in handles:
            h.remove()
    row: dict[str, float | None] = {
        "probe/ce": float(F.cross_entropy(logits.detach(), y, reduction="none").double().mean()),
        "probe/acc": float((logits.argmax(1) == y).double().mean()),
    }
    grams = []
    for n, d in zip(layers, deltas, strict=True):
        a = seen[n][0].detach()
        if n != layers[0]:  # every layer input but the stem's (the data) is an activation
            row |= _entries("probe/act", a, n)
            row[f"probe/act/zero_frac/{n}"] = int((a == 0).sum()) / a.numel()
            row[f"probe/act/dead_frac/{n}"] = int((a == 0).all(dim=0).sum()) / a.shape[1]
        row |= _entries("probe/delta", d, n)
        a64, d64 = a.to(torch.float64), d.to(torch.float64)
        grams.append((a64 @ a64.T) * (d64 @ d64.T))
        row[f"grad/mean/bias_norm/{n}"] = float(d64.mean(dim=0).norm())
    k = torch.stack(grams)
    norms = torch.sort(torch.diagonal(k, dim1=1, dim2=2).clamp_min(0.0).sqrt(), dim=1).values
    quantiles = torch.cat([_sorted_quantiles(norms, NORM_QUANTILES), norms[:, -1:]], 1).tolist()
    for n, mom, qs in zip(layers, moments_from_grams(k), quantiles, strict=True):
        row[f"grad/mean/weight_norm/{n}"] = mom.mean_norm
        row |= {f"grad/pex/{key}/{n}": getattr(mom, key) for key in _MOMENTS}
        row |= {
            f"grad/pex/norm_{quantile_key(q)}/{n}": v
            for q, v in zip(NORM_QUANTILES, qs, strict=False)
        }
        row[f"grad/pex/norm_max/{n}"] = qs[-1]
    lr = opt.param_groups[0]["lr"]
    for n in layers:
        w, b = mods[n].weight, mods[n].bias
        w0 = initial[f"{n}.weight"]
        buf = opt.state[w]["momentum_buffer"]
        row[f"param/weight_norm/{n}"] = _norm(w)
        row[f"param/bias_norm/{n}"] = _norm(b)
        disp = _norm(w.detach().to(torch.float64) - w0.to(torch.float64))
        row[f"param/disp/{n}"] = disp
        row[f"param/disp_rel/{n}"] = _ratio(disp, _norm(w0))
        row[f"param/momentum_norm/{n}"] = _norm(buf)
        row[f"param/update_ratio/{n}"] = _ratio(float(lr) * _norm(buf), _norm(w))
    parts = [
        _norm(p.detach().to(torch.float64) - initial[k].to(torch.float64))
        for k, p in model.named_parameters()
    ]
    row["param/disp_total"] = sum(v * v for v in parts) ** 0.5
    return row


def plain_block_fields(model, x, y) -> dict[str, float | None]:
    """The residual blocks' fields (:mod:`fathom.telemetry.blocks`), written out plainly:
    branch and bypass outputs captured by hooks on the float32 model in evaluation mode and
    squared in float64 (each block's evaluation gain is one here), and the gradient of the
    mean cross entropy w.r.t. each block's parameters by ``autograd.grad``. Not bit for bit:
    ``observe`` sums the squares in another order and takes the gradient norm from the
    layer's per-example Gram, ``||m||^2 = (1/N^2) sum_ij K_ij`` (checked against float64
    brute force in ``tests/test_telemetry_blocks.py``)."""
    blocks = [(n, m) for n, m in model.named_modules() if isinstance(m, SkippableResidual)]
    seen: dict[str, list[torch.Tensor]] = {}
    handles = [
        mod.register_forward_hook(lambda m, a, o, k=k: seen.setdefault(k, []).append(o))
        for n, b in blocks
        for k, mod in ((f"f/{n}", b.branch), (f"s/{n}", b.bypass))
    ]
    was = model.training
    model.eval()
    try:
        with torch.enable_grad():
            loss = F.cross_entropy(model(x), y)
            row: dict[str, float | None] = {}
            for n, b in blocks:
                f, s = (
                    torch.cat([t.detach().double().reshape(-1) for t in seen[k + n]])
                    for k in ("f/", "s/")
                )
                row[f"{UPDATE}/{n}"] = float(f.square().sum() / s.square().sum()) ** 0.5
                gs = torch.autograd.grad(loss, list(b.parameters()), retain_graph=True)
                row[f"{GRAD}/{n}"] = float(sum(g.double().square().sum() for g in gs)) ** 0.5
    finally:
        model.train(was)
        for h in handles:
            h.remove()
    return row


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.copysign(1.0, a) == math.copysign(1.0, b) and (a == b or (a != a and b != b))
    return a == b


@pytest.mark.parametrize("recipe", ["residual", "plain"])
def test_every_field_equals_the_plain_formulas_bit_for_bit(recipe: str) -> None:
    g = torch.Generator().manual_seed(7)
    x = torch.randint(0, 256, (128, 30), generator=g, dtype=torch.uint8)
    y = torch.randint(0, 5, (128,), generator=g)
    torch.manual_seed(7)
    model = CiresanMLP(widths=(40, 24, 24, 12), classes=5, in_features=30, recipe=recipe)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    initial = {k: v.detach().clone() for k, v in model.named_parameters()}
    ins = Instruments(model, x, y)
    layers = [layer.name for layer in ins.layers]
    body = "res.branch" if recipe == "residual" else "res"
    assert layers == ["stem", *(f"blocks.{i}.{body}" for i in range(3)), "head"]
    checked = 0
    for _ in range(3):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        got = ins.observe(optimizer=opt)
        want = plain_fields(model, x, y, opt, initial, layers)
        blocks = plain_block_fields(model, x, y)
        assert set(got) == set(want) | set(blocks) and not set(want) & set(blocks)
        bad = [f"{k}: {got[k]!r} != {want[k]!r}" for k in want if not _same(got[k], want[k])]
        assert not bad, "\n".join(bad)
        # relative 1e-12: the update sums in another order; 1e-5: a float32 autograd
        # gradient against the Gram's float64 sum of float32 per-example products
        for k, v in blocks.items():
            assert got[k] == pytest.approx(v, rel=1e-12 if k.startswith(UPDATE) else 1e-5), k
        assert len(blocks) == (6 if recipe == "residual" else 0)
        checked += len(want)
    assert checked == 3 * (len(ins.field_names()) - len(ins.blocks) * 2)


@pytest.mark.parametrize("budget", [2**24, 100])
def test_displacements_follow_references_and_weights_changed_in_place(monkeypatch, budget):
    """The float64 reference copies kept across observations (within the budget, or converted
    inside the subtraction beyond it) and a weight's float64 copy reused from its norm give
    ``||W - W_0||`` of float64 copies, also after ``W_0`` or ``W`` changed in place."""
    from fathom.telemetry import params as P

    monkeypatch.setattr(P, "REFERENCE_ELEMENTS", budget)
    g = torch.Generator().manual_seed(3)
    w, w0, w1 = (torch.randn(40, 7, generator=g) for _ in range(3))

    def want(a: torch.Tensor, b: torch.Tensor) -> float:
        return float(torch.linalg.vector_norm(a.double() - b.double()))

    scratch: dict = {}
    norms = P.Norms(scratch)
    assert norms.frob(w) == _norm(w)
    assert norms.displacement(w, w0) == want(w, w0)
    assert bool(scratch["reference_copies"]) == (budget >= w0.numel())
    w0.mul_(1.5)  # the kept copy is stale now
    norms = P.Norms(scratch)
    assert norms.frob(w) == _norm(w)
    w.add_(0.25)  # after its norm was taken: the float64 copy in the scratch slot is stale
    assert norms.displacement(w, w0) == want(w, w0)
    assert P.Norms(scratch).displacement(w, w1) == want(w, w1)
    assert P.Norms(scratch).displacement(w1, w0) == want(w1, w0)
