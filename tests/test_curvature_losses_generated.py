"""The seam's model grammar (:mod:`seam_grammar`) with losses, output layouts and input
structures: every generated (model, loss, layout, inputs) gets exact diagonals against a
float64 per-example loop, or a refusal that names a module, with the model left as found.

The loop (:func:`loop_reference`) forwards one example at a time through a float64 dense
copy, takes every output entry's gradient by autograd (the Jacobian rows ``J_i``), and the
loss Hessian of the reduced loss by ``torch.autograd.functional.hessian`` of the loss's
value (itself held to torch's own loss in ``test_losses``): ``GGN = sum_i J_i^T H_ii J_i``,
``EF = c sum_i g_i g_i^T`` with ``g_i = J_i^T dL/dz_i / c``, ``Gram = c sum_i J_i^T J_i``.
"""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from torch import nn

from fathom.curvature import exact_diagonals
from fathom.errors import FathomError
from fathom.losses import make_loss
from seam_grammar import build, specs
from test_seam_generated import _dense_copy, assert_as_found, names_a_module, snapshot

torch.set_num_threads(1)


class Structured(nn.Module):
    """The model behind a tuple (``model(x, gain)``) or dict (``model(x=..., gain=...)``)
    input, returning its output in a tuple ``(aux, z)`` or a dict ``{"logits": z}``; ``gain``
    ``[N]`` scales each example's output."""

    def __init__(self, net: nn.Module, how: str) -> None:
        super().__init__()
        self.net, self.how = net, how

    def forward(self, x, gain):
        z = self.net(x) * gain.reshape(-1, *([1] * (self.net_dims - 1)))
        return {"logits": z} if self.how == "dict" else (gain, z)

    net_dims = 2


@st.composite
def loss_specs(draw) -> dict:
    spec = draw(specs())
    spec["head"] = draw(st.sampled_from(["mean", "tokens", "channels"]))
    spec["structure"] = draw(st.sampled_from(["tensor", "tuple", "dict"]))
    spec["loss"] = draw(st.sampled_from(["cross_entropy", "ce_prob", "mse", "bce_with_logits"]))
    spec["reduction"] = draw(st.sampled_from(["mean", "sum"]))
    spec["smoothing"] = draw(st.sampled_from([0.0, 0.2]))
    spec["ignore"] = draw(st.booleans())
    return spec


def setup(spec: dict):
    """``(model, x, y, loss, output)`` of a spec (its targets fit the output's layout)."""
    net, x, _ = build(spec)
    with torch.no_grad():
        shape = tuple(_dense_copy(net)(x.double() if x.is_floating_point() else x).shape)
    g = torch.Generator().manual_seed(spec["seed"])
    class_dim = {"mean": None, "tokens": -1, "channels": 1}[spec["head"]]
    name = spec["loss"]
    if name in ("cross_entropy", "ce_prob"):
        loss = make_loss(
            "cross_entropy",
            reduction=spec["reduction"],
            label_smoothing=spec["smoothing"],
            class_dim=class_dim,
        )
        cd = 1 if class_dim is None else class_dim % len(shape)
        if name == "ce_prob":
            y = torch.rand(shape, generator=g, dtype=torch.float64)
            y = y / y.sum(cd, keepdim=True)
        else:
            pos = shape[:cd] + shape[cd + 1 :]
            y = torch.randint(0, shape[cd], pos, generator=g)
            if spec["ignore"] and y.numel() > 1:
                y.view(-1)[0] = -100
    else:
        loss = make_loss(name, reduction=spec["reduction"])
        y = torch.rand(shape, generator=g, dtype=torch.float64)
    output = None
    if spec["structure"] != "tensor":
        model = Structured(net, spec["structure"])
        model.net_dims = len(shape)
        gain = 0.5 + torch.rand(shape[0], generator=g).to(
            x.dtype if x.is_floating_point() else torch.float32
        )
        gain = gain.to(next(net.parameters()).dtype)
        x = (x, gain) if spec["structure"] == "tuple" else {"x": x, "gain": gain}
        output = 1 if spec["structure"] == "tuple" else "logits"
    else:
        model = net
    return model, x, y, loss, output


def _call(m, x):
    if isinstance(x, dict):
        return m(**x)
    if isinstance(x, tuple):
        return m(*x)
    return m(x)


def loop_reference(model, x, y, loss, output) -> dict:
    """The families from a per-example loop (module docstring), float64."""
    ref = _dense_copy(model)
    x64 = _map(x, lambda t: t.double() if t.is_floating_point() else t)
    names = [n for n, _ in ref.named_parameters()]
    params = [p for _, p in ref.named_parameters()]

    def out(xi):
        o = _call(ref, xi)
        return o if output is None else o[output]

    with torch.no_grad():
        z = out(x64)
    n, e = z.shape[0], z[0].numel()
    terms = loss.terms(z, y)
    h = torch.autograd.functional.hessian(terms.value, z).reshape(n, e, n, e)
    resid = terms.residual(z).reshape(n, e)
    c = float(terms.scale)
    res = {k: {m: torch.zeros_like(p) for m, p in zip(names, params)} for k in FAMILIES}
    for i in range(n):
        zi = out(_map(x64, lambda t, i=i: t[i : i + 1]))[0].reshape(-1)
        rows = []
        for j in range(e):
            g = torch.autograd.grad(zi[j], params, retain_graph=True, allow_unused=True)
            rows.append([torch.zeros_like(p) if gj is None else gj for p, gj in zip(params, g)])
        for k, name in enumerate(names):
            jac = torch.stack([r[k] for r in rows])  # [E, *shape]
            res["ggn"][name] += torch.einsum("ab,a...,b...->...", h[i, :, i], jac, jac)
            gi = torch.tensordot(resid[i], jac, dims=1) / c
            res["empirical_fisher"][name] += c * gi.square()
            res["jacobian_gram"][name] += c * jac.square().sum(0)
    return res


def _map(x, fn):
    if isinstance(x, dict):
        return {k: fn(v) for k, v in x.items()}
    if isinstance(x, tuple):
        return tuple(fn(v) for v in x)
    return fn(x)


FAMILIES = ("ggn", "empirical_fisher", "jacobian_gram")


def check(spec: dict) -> None:
    model, x, y, loss, output = setup(spec)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = snapshot(model, opt)
    try:
        got = exact_diagonals(model, x, y, loss=loss, output=output)
    except FathomError as err:
        assert names_a_module(err, model), str(err)
        assert_as_found(model, opt, before, "refused exact_diagonals")
        return
    assert_as_found(model, opt, before, "exact_diagonals")
    want = loop_reference(model, x, y, loss, output)
    for fam in FAMILIES:
        scale = max(float(v.abs().max()) for v in want[fam].values()) or 1.0
        for name, w in want[fam].items():
            err = float((got[fam][name] - w).abs().max()) if w.numel() else 0.0
            assert err <= 1e-9 * scale, (fam, name, err, scale)


_BASE = {
    "dtype": "float64", "n": 3, "classes": 3, "t": 3, "d": 2, "input": "float", "features": 2,
    "padding_idx": None, "max_norm": False, "root_scale": False, "seed": 0, "d_out": 2,
}  # fmt: skip


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=loss_specs())
@example(
    spec=_BASE
    | {"blocks": [{"kind": "linear", "out": 3, "bias": True, "lead": False}], "head": "tokens"}
    | {"structure": "dict", "loss": "cross_entropy", "reduction": "mean", "smoothing": 0.2}
    | {"ignore": True}
)
def test_generated_models_losses_and_layouts_are_exact_or_refused(spec):
    check(spec)
