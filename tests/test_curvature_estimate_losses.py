"""Monte-Carlo and Hutchinson diagonals for every loss, output layout and reduction.

Over generated models (:mod:`seam_grammar`) with a loss (cross-entropy with integer labels,
``ignore_index`` and label smoothing, probability targets, MSE, BCE with logits), a layout
(``[N, C]``, ``[N, C, d]``, ``[N, T, V]``), a reduction (mean, sum) and an input structure
(tensor, tuple, dict: :func:`test_curvature_losses_generated.setup`), the MC and Hutchinson
means meet ``exact_diagonals(..., loss=...)`` within 5 of the estimators' exact sampling
standard errors, computed here from an independent float64 reference:

* per example ``i`` the output Jacobian ``J_i [E, P]`` one entry at a time and the Hessian
  block ``H_i`` of the reduced loss by ``torch.autograd.functional.hessian``;
* the MC law written out per position (:func:`laws`: the sampled Fisher's ``C`` outcomes for
  cross-entropy, two Bernoulli outcomes per BCE entry, a Gaussian per MSE entry, two signs
  per entry for the Jacobian Gram), whose second moments must add up to ``H_i`` (checked);
* the sampling variance of ``x = (J_i^T v)^2`` from those laws: positions are independent and
  zero-mean, so with ``a_p = J_p^T v_p``, per entry ``Var(u^2) = sum_p (E a_p^4 - 3 (E a_p^2)^2)
  + 2 (sum_p E a_p^2)^2`` and for the trace ``Var(|u|^2) = sum_p (E|a_p|^4 - (tr S_p)^2
  - 2 tr S_p^2) + 2 tr S^2`` (``S_p = E a_p a_p^T``, ``S = sum_p S_p``);
* Hutchinson's from the full matrix ``M = sum_i J_i^T H_i J_i``: ``Var(z_j (M z)_j) = sum_{l !=
  j} M_jl^2``, ``Var(z^T M z) = 2 sum_{j != l} M_jl^2``.

The draws are fixed (seeded; the hypothesis profile is derandomized), so nothing flakes;
Chebyshev bounds a 5-SE miss by 1/25 whatever the law. The reported standard errors are
checked against the spread of repeated seeds on one case per loss, and the samplers'
second moments against torch's loss Hessian with a large fixed K.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from torch import nn

from fathom.curvature import Budget, diagonals, exact_diagonals
from fathom.curvature.estimate import loss_diagonals, loss_hessian_product, loss_sampler
from fathom.curvature.language import token_diagonals
from fathom.errors import FathomError
from fathom.losses import make_loss
from fathom.models.gpt import token_loss
from test_curvature_estimate import assert_replays, assert_same_estimate, hutchinson_reference
from test_curvature_language import tiny
from test_curvature_losses_generated import _BASE, _call, _map, loss_specs, setup
from test_seam_generated import _dense_copy

torch.set_num_threads(1)
DT = torch.float64
SAMPLED = ("ggn", "jacobian_gram")


# -- the independent reference -------------------------------------------------------------
def reference(model, x, y, loss, output):
    """``(z, J [N, E, P], H [N, E, E])``: the output, every example's output Jacobian in every
    parameter (flattened in ``named_parameters`` order) and the reduced loss's Hessian blocks."""
    ref = _dense_copy(model)
    x64 = _map(x, lambda t: t.double() if t.is_floating_point() else t)
    params = [p for _, p in ref.named_parameters()]

    def out(xi):
        o = _call(ref, xi)
        return o if output is None else o[output]

    with torch.no_grad():
        z = out(x64)
    n, e = z.shape[0], z[0].numel()
    h = torch.autograd.functional.hessian(loss.terms(z, y).value, z).reshape(n, e, n, e)
    jac = []
    for i in range(n):
        zi = out(_map(x64, lambda t, i=i: t[i : i + 1]))[0].reshape(-1)
        rows = []
        for j in range(e):
            g = torch.autograd.grad(zi[j], params, retain_graph=True, allow_unused=True)
            rows.append(torch.cat([(torch.zeros_like(p) if gj is None else gj).flatten()
                                   for p, gj in zip(params, g, strict=True)]))  # fmt: skip
        jac.append(torch.stack(rows))
    return z, torch.stack(jac), torch.stack([h[i, :, i] for i in range(n)])


def laws(loss, z, y, family: str) -> list[list[tuple]]:
    """Per example, its positions' MC laws, each ``("discrete", values [O, E], probs [O])`` or
    ``("gaussian", g [E])`` (``v = eps g``), written from each loss's definition (the
    weights ``w = 1/M`` or one included)."""
    n, e = z.shape[0], z[0].numel()
    zf = z.reshape(n, e)
    eye = torch.eye(e, dtype=DT)
    if family == "jacobian_gram":
        c = 1.0 / n if loss.reduction == "mean" else 1.0
        two = torch.tensor([0.5, 0.5], dtype=DT)
        return [
            [("discrete", torch.stack([eye[j], -eye[j]]) * math.sqrt(c), two) for j in range(e)]
        ] * n
    if loss.name == "mse":
        w = 1.0 / (n * e) if loss.reduction == "mean" else 1.0
        return [[("gaussian", eye[j] * math.sqrt(2 * w)) for j in range(e)]] * n
    if loss.name == "bce_with_logits":
        w = 1.0 / (n * e) if loss.reduction == "mean" else 1.0
        out = []
        for i in range(n):
            s = torch.sigmoid(zf[i])
            out.append([
                ("discrete", torch.stack([(s[j] - 1) * eye[j], s[j] * eye[j]]) * math.sqrt(w),
                 torch.stack([s[j], 1 - s[j]]))
                for j in range(e)
            ])  # fmt: skip
        return out
    # cross-entropy: classes at class_dim, every other dimension a position
    cd = 1 if loss.class_dim is None else loss.class_dim % z.dim()
    ncls = z.shape[cd]
    ids = torch.arange(e).reshape(z.shape[1:]).movedim(cd - 1, -1).reshape(-1, ncls)
    eps = loss.label_smoothing
    if y.is_floating_point():
        t = y.reshape(n, e)
        mass = [[(1 - eps) * float(t[i, ids[p]].sum()) + eps for p in range(len(ids))]
                for i in range(n)]  # fmt: skip
        valid = [[True] * len(ids) for _ in range(n)]
    else:
        labels = y.reshape(n, -1)
        valid = [[int(labels[i, p]) != loss.ignore_index for p in range(len(ids))]
                 for i in range(n)]  # fmt: skip
        mass = [[1.0] * len(ids) for _ in range(n)]
    count = sum(map(sum, valid))
    w = 1.0 / count if loss.reduction == "mean" else 1.0
    out = []
    for i in range(n):
        row = []
        for p, cls in enumerate(ids):
            if not valid[i][p]:
                continue
            prob = torch.softmax(zf[i, cls], 0)
            vals = torch.zeros(ncls, e, dtype=DT)
            vals[:, cls] = prob[None, :] - torch.eye(ncls, dtype=DT)
            row.append(("discrete", vals * math.sqrt(w * mass[i][p]), prob))
        out.append(row)
    return out


def second_moment(law) -> torch.Tensor:
    if law[0] == "gaussian":
        return law[1][:, None] * law[1][None, :]
    vals, prob = law[1], law[2]
    return torch.einsum("o,oa,ob->ab", prob, vals, vals)


def mc_moments(law, jac_i: torch.Tensor):
    """``(E a^2 [P], E a^4 [P], E|a|^4, S [P, P])`` of ``a = J_i^T v`` under one position's law."""
    if law[0] == "gaussian":
        g = law[1] @ jac_i
        m2 = g.square()
        return m2, 3 * m2.square(), 3 * float(m2.sum()) ** 2, g[:, None] * g[None, :]
    a, prob = law[1] @ jac_i, law[2]  # [O, P]
    m2 = (prob[:, None] * a.square()).sum(0)
    m4 = (prob[:, None] * a.pow(4)).sum(0)
    norm4 = float((prob * a.square().sum(1).square()).sum())
    return m2, m4, norm4, torch.einsum("o,oa,ob->ab", prob, a, a)


def true_standard_errors(per_example_laws, jac, blocks, estimator: str, k: int):
    """The estimators' exact sampling SEs ``(entries [P], trace)`` for ``k`` draws (module
    docstring), and (MC) the mean the laws give, ``sum_i sum_p E a_p^2``."""
    if estimator == "hutchinson":
        m = torch.einsum("nep,nef,nfq->pq", jac, blocks, jac)
        off = m - torch.diag_embed(m.diagonal())
        return (off.square().sum(1) / k).sqrt(), math.sqrt(2 * float(off.square().sum()) / k), None
    var = torch.zeros(jac.shape[-1], dtype=DT)
    t_var, mean = 0.0, torch.zeros_like(var)
    for positions, jac_i in zip(per_example_laws, jac, strict=True):
        m2s, s_all, kappa, t_part = torch.zeros_like(var), 0.0, torch.zeros_like(var), 0.0
        for law in positions:
            m2, m4, norm4, s = mc_moments(law, jac_i)
            m2s += m2
            kappa += m4 - 3 * m2.square()
            t_part += norm4 - float(s.trace()) ** 2 - 2 * float((s * s).sum())
            s_all = s_all + s
        var += kappa + 2 * m2s.square()
        t_var += t_part + 2 * float((s_all * s_all).sum()) if positions else 0.0
        mean += m2s
    return (var.clamp_min(0) / k).sqrt(), math.sqrt(max(t_var, 0.0) / k), mean


def flat(d: dict, names) -> torch.Tensor:
    return torch.cat([d[p].flatten() for p in names])


def check(spec: dict, k: int = 32) -> None:
    """Refused where exact is refused (Hutchinson also where torch has no second derivative,
    naming the fix); otherwise every entry and the trace within 5 true SEs, the law's second
    moments equal to torch's Hessian blocks and its mean to the exact diagonal, and the
    reported trace SE within a factor 3 of the true one where it is not negligible."""
    model, x, y, loss, output = setup(spec)
    try:
        exact = exact_diagonals(model, x, y, loss=loss, output=output, families=SAMPLED)
    except FathomError:
        for estimator in ("mc", "hutchinson"):
            with pytest.raises(FathomError):
                diagonals(model, x, y, loss=loss, output=output, estimator=estimator, samples=2)
        return
    z, jac, blocks = reference(model, x, y, loss, output)
    n, e = z.shape[0], z[0].numel()
    names = list(exact["ggn"])
    for f in SAMPLED:
        per = laws(loss, z, y, f)
        h = (
            blocks
            if f == "ggn"
            else torch.eye(e, dtype=DT).expand(n, e, e) / (n if loss.reduction == "mean" else 1)
        )
        for i, positions in enumerate(per):  # the law's second moments are the Hessian
            got = sum((second_moment(law) for law in positions), torch.zeros(e, e, dtype=DT))
            torch.testing.assert_close(got, h[i], rtol=1e-10, atol=1e-14)
        want = flat(exact[f], names)
        for estimator in ("mc", "hutchinson"):
            try:
                est = diagonals(model, x, y, loss=loss, output=output, families=SAMPLED,
                                estimator=estimator, samples=k, seed=7)  # fmt: skip
            except FathomError as err:  # an op without a second derivative (cdist): by name
                assert estimator == "hutchinson" and "estimator='mc'" in str(err), str(err)
                continue
            se, t_se, mean = true_standard_errors(per, jac, h, estimator, k)
            if mean is not None:
                torch.testing.assert_close(
                    mean, want, rtol=1e-9, atol=1e-12 * float(want.abs().max())
                )
            got = flat(est.diagonals[f], names)
            floor = 1e-9 * float(want.abs().max()) + 1e-300
            assert bool(((got - want).abs() <= 5 * se + floor).all()), (estimator, f)
            t_want = float(want.sum())
            assert abs(est.traces[f] - t_want) <= 5 * t_se + 1e-9 * abs(t_want) + 1e-300
            if t_se > 1e-6 * abs(t_want):
                assert 1 / 3 < est.trace_standard_errors[f] / t_se < 3, (estimator, f)
            assert est.estimators[f] == estimator and (est.samples, est.seed) == (k, 7)
            assert est.record()["layout"]["loss"] == repr(loss)


_FIXED = _BASE | {"blocks": [{"kind": "linear", "out": 3, "bias": True, "lead": False}]}
_FIXED |= {"structure": "tensor", "smoothing": 0.0, "ignore": False, "n": 3, "t": 2}


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("head", ["mean", "channels", "tokens"])
@pytest.mark.parametrize("loss", ["cross_entropy", "ce_prob", "mse", "bce_with_logits"])
def test_every_loss_layout_and_reduction_meets_the_exact_diagonals(loss, head, reduction):
    """Every (loss, layout, reduction) on one small model; ``ignore_index`` and label
    smoothing with integer labels, smoothing with probability targets."""
    spec = _FIXED | {"loss": loss, "head": head, "reduction": reduction}
    if loss == "cross_entropy":
        spec |= {"ignore": True, "smoothing": 0.2}
    if loss == "ce_prob":
        spec |= {"smoothing": 0.2}
    check(spec)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=loss_specs())
@example(spec=_FIXED | {"loss": "mse", "head": "tokens", "reduction": "mean", "structure": "dict"})
def test_generated_models_losses_and_layouts_meet_the_exact_diagonals(spec) -> None:
    check(spec)


# -- the samplers and products: unbiased, against torch's own loss Hessian ----------------------
def _torch_loss(name: str, z, y, **kw):
    f = nn.functional
    if name == "mse":
        return f.mse_loss(z, y, **kw)
    if name == "bce_with_logits":
        return f.binary_cross_entropy_with_logits(z, y, **kw)
    return f.cross_entropy(z, y, **kw)


_CASES = {
    "mse [N, T, E] sum": ("mse", (3, 2, 2), {"reduction": "sum"}, None),
    "mse [N, E] mean": ("mse", (3, 4), {"reduction": "mean"}, None),
    "bce [N, C, d] mean": ("bce_with_logits", (2, 3, 2), {"reduction": "mean"}, None),
    "ce [N, C, d] ignore, smoothing": (
        "cross_entropy", (3, 3, 2), {"ignore_index": -100, "label_smoothing": 0.1}, 1,
    ),
    "ce probabilities, sum": ("cross_entropy", (3, 4), {"reduction": "sum"}, "prob"),
}  # fmt: skip


def _case(name: str):
    loss_name, shape, kw, how = _CASES[name]
    g = torch.Generator().manual_seed(4)
    z = torch.randn(shape, dtype=DT, generator=g)
    if loss_name != "cross_entropy":
        y = torch.rand(shape, dtype=DT, generator=g)
    elif how == "prob":
        y = torch.softmax(torch.randn(shape, dtype=DT, generator=g), 1) * 0.8
    else:
        y = torch.randint(0, shape[1], (shape[0], *shape[2:]), generator=g)
        y.view(-1)[1] = -100
    loss = make_loss(loss_name, class_dim=1 if len(shape) > 2 and how else None, **kw)
    n, e = shape[0], math.prod(shape[1:])
    h = torch.autograd.functional.hessian(lambda o: _torch_loss(loss_name, o, y, **kw), z)
    blocks = torch.stack([h.reshape(n, e, n, e)[i, :, i] for i in range(n)])
    return loss, z, y, blocks


@pytest.mark.parametrize("case", list(_CASES))
def test_sampler_second_moment_is_torchs_loss_hessian(case: str) -> None:
    """Unbiasedness in float64 with a fixed large K: ``(1/N) E[v_i v_i^T]`` of the MC draws is
    the Hessian block of torch's own loss (``autograd.functional.hessian``), within 5 SE of
    the second-moment estimate per entry (SE from the same draws; K = 40000)."""
    loss, z, y, blocks = _case(case)
    n, e = blocks.shape[:2]
    sampler = loss_sampler(loss.terms(z, y), "ggn")
    k = 40_000
    v = sampler(z, torch.arange(n), k, torch.Generator().manual_seed(0)).reshape(
        k, n, e
    ) / math.sqrt(n)
    outer = v[:, :, :, None] * v[:, :, None, :]  # [K, N, E, E]
    got, se = outer.mean(0), outer.std(0) / math.sqrt(k)
    assert bool(((got - blocks).abs() <= 5 * se + 1e-12).all()), (got - blocks).abs().max()
    assert float(blocks.abs().max()) > 0


@pytest.mark.parametrize("case", list(_CASES))
def test_hutchinson_product_is_torchs_loss_hessian_applied(case: str) -> None:
    """Hutchinson's closed-form product ``(1/N) N a D_i v`` is torch's Hessian block times
    ``v`` (deterministic: to rounding), for each chunk start."""
    loss, z, y, blocks = _case(case)
    n, e = blocks.shape[:2]
    terms = loss.terms(z, y)
    product = loss_hessian_product(terms, "ggn")
    v = torch.randn(z.shape, dtype=DT, generator=torch.Generator().manual_seed(1))
    want = torch.einsum("nef,nf->ne", blocks, v.reshape(n, e))
    got = product(z, v, 0).reshape(n, e) / n
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-15)
    tail = product(z[1:], v[1:], 1).reshape(n - 1, e) / n  # a chunk from example 1 on
    torch.testing.assert_close(tail, want[1:], rtol=1e-12, atol=1e-15)


def mlp_case(loss_name: str):
    """A small MLP and targets for one loss over ``[N, C, d]`` (cross-entropy: ``[N, T, V]``
    with an ignored position), for the repeated-seed and large-K checks."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 2, 3, generator=g)
    model = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 3))  # [N, 2, 3]
    if loss_name == "cross_entropy":
        y = torch.randint(0, 3, (4, 2), generator=g)
        y[0, 1] = -100
        return model, x, y, make_loss("cross_entropy", class_dim=-1)
    return model, x, torch.rand(4, 2, 3, generator=g), make_loss(loss_name, reduction="sum")


@pytest.mark.parametrize("loss_name", ["cross_entropy", "mse", "bce_with_logits"])
def test_standard_error_matches_the_spread_over_repeated_seeds(loss_name: str) -> None:
    """Over 150 seeds per estimator: the mean reported SE^2 of the trace and of every entry of
    a weight is the empirical variance of the estimates (within 25%; the relative SE of a
    variance from 150 replicates is about sqrt(2/149) = 12%)."""
    model, x, y, loss = mlp_case(loss_name)
    for estimator in ("mc", "hutchinson"):
        runs = [
            loss_diagonals(model, x, y, loss=loss, estimator=estimator, samples=4, seed=s)
            for s in range(150)
        ]
        traces = torch.tensor([r.traces["ggn"] for r in runs], dtype=DT)
        se2 = torch.tensor([r.trace_standard_errors["ggn"] ** 2 for r in runs], dtype=DT)
        assert 0.75 < float(se2.mean() / traces.var()) < 1.33, (estimator, loss_name)
        w = torch.stack([r.diagonals["ggn"]["2.weight"] for r in runs])
        w_se2 = torch.stack([r.standard_errors["ggn"]["2.weight"].square() for r in runs])
        ratio = float(w_se2.mean(0).sum() / w.var(0).sum())
        assert 0.75 < ratio < 1.33, (estimator, loss_name, ratio)


@pytest.mark.parametrize("loss_name", ["cross_entropy", "mse", "bce_with_logits"])
def test_large_k_mean_is_the_exact_diagonal(loss_name: str) -> None:
    """Unbiasedness in float64 with a fixed large K = 3000: the MC mean within 4 of its SEs
    on the trace and per weight entry, and within 3% of the exact trace."""
    model, x, y, loss = mlp_case(loss_name)
    exact = exact_diagonals(model, x, y, loss=loss, families="ggn")["ggn"]
    est = loss_diagonals(model, x, y, loss=loss, estimator="mc", samples=3000, seed=11)
    t_want = sum(float(v.sum()) for v in exact.values())
    assert abs(est.traces["ggn"] - t_want) <= 4 * est.trace_standard_errors["ggn"]
    assert abs(est.traces["ggn"] / t_want - 1) < 0.03
    for p, v in exact.items():
        se = est.standard_errors["ggn"][p]
        assert bool(((est.diagonals["ggn"][p] - v).abs() <= 4 * se + 1e-12).all()), p


# -- the plain [N, C] path is one case of the loss path ----------------------------------------
@pytest.mark.parametrize("estimator", ["mc", "hutchinson", "exact"])
def test_naming_the_default_loss_gives_the_same_draws(estimator: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 4))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(6, 5, generator=g), torch.randint(0, 4, (6,), generator=g)
    kw = {"families": "all", "estimator": estimator, "samples": 5, "seed": 3}
    plain, named = diagonals(model, x, y, **kw), diagonals(model, x, y, loss="cross_entropy", **kw)
    assert plain.estimators == named.estimators
    for f, d in plain.diagonals.items():
        for p, v in d.items():
            torch.testing.assert_close(named.diagonals[f][p], v, rtol=1e-13, atol=0)
    for f, se in plain.trace_standard_errors.items():
        assert (se is None) == (named.trace_standard_errors[f] is None), f
        assert se is None or named.trace_standard_errors[f] == pytest.approx(se, rel=1e-12)


# -- the language model's token loss: Hutchinson as well as MC --------------------------------
def test_token_loss_hutchinson_meets_the_exact_value() -> None:
    model, x, y = tiny(seed=1)
    y[1, :2] = token_loss().ignore_index
    exact = token_diagonals(model, x, y, loss=token_loss(), estimator="exact")
    est = token_diagonals(
        model, x, y, loss=token_loss(), estimator="hutchinson", samples=48, seed=2
    )
    assert est.estimators == {"ggn": "hutchinson", "empirical_fisher": "exact"}
    assert (est.samples, est.seed) == (48, 2)
    rec = est.record()
    assert rec["layout"]["products"]["ggn"].startswith("H v = (sum_c t'_c)")
    se = est.trace_standard_errors["ggn"]
    assert se > 0 and abs(est.traces["ggn"] - exact.traces["ggn"]) <= 5 * se
    z = [
        (est.parameter_traces["ggn"][p] - exact.parameter_traces["ggn"][p]) / s
        for p, s in est.parameter_trace_standard_errors["ggn"].items()
        if s > 0
    ]
    assert len(z) > 10 and max(abs(v) for v in z) < 5
    for p, v in exact.diagonals["empirical_fisher"].items():
        torch.testing.assert_close(est.diagonals["empirical_fisher"][p], v, rtol=1e-10, atol=0)


# -- auto and bad input ---------------------------------------------------------------------
def test_auto_over_a_loss_picks_exact_when_it_fits_and_names_why() -> None:
    model, x, y, loss = mlp_case("mse")
    fits = loss_diagonals(model, x, y, loss=loss)
    # [N, 2, 3] with MSE: E = 6 positions of one direction each
    assert fits.estimators == {"ggn": "exact"} and "6 directions per example" in fits.choice
    exact = exact_diagonals(model, x, y, loss=loss, families="ggn")["ggn"]
    for p, v in exact.items():
        torch.testing.assert_close(fits.diagonals["ggn"][p], v, rtol=0, atol=0)
    tight = loss_diagonals(model, x, y, loss=loss, samples=4, budget=Budget(backward_passes=5))
    assert tight.estimators == {"ggn": "mc"} and tight.choice.startswith("auto chose mc")
    assert tight.record()["layout"]["draws"]["ggn"].startswith("v = sqrt(2) eps")
    with pytest.raises(FathomError, match="no curvature estimator fits the budget"):
        loss_diagonals(model, x, y, loss=loss, budget=Budget(backward_passes=1))


def test_mc_without_standard_errors_over_a_loss_is_the_same_estimate() -> None:
    model, x, y, loss = mlp_case("bce_with_logits")
    kw = {"loss": loss, "families": SAMPLED, "estimator": "mc", "samples": 6, "seed": 9}
    with_se = diagonals(model, x, y, **kw)
    plain = diagonals(model, x, y, standard_errors=False, **kw)
    assert plain.standard_errors == {"ggn": None, "jacobian_gram": None}
    for f in SAMPLED:
        for p, v in with_se.diagonals[f].items():
            torch.testing.assert_close(plain.diagonals[f][p], v, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"estimator": "hutchinsn"}, "did you mean 'hutchinson'"),
        ({"estimator": "mc", "samples": 1}, "at least 2 samples"),
        ({"loss": "mes"}, "did you mean 'mse'"),
        ({"loss": "cross_entropy"}, "class_dim"),  # [N, T, V] without saying where the classes are
        ({"loss": "mse", "class_dim": -1}, "takes no option 'class_dim'"),
    ],
)
def test_bad_input_over_a_loss_is_refused_with_the_fix(kwargs: dict, match: str) -> None:
    model, x, y, _ = mlp_case("mse")
    kwargs = {"loss": "mse", "estimator": "mc", **kwargs}
    with pytest.raises(FathomError, match=match):
        diagonals(model, x, y, **kwargs)


@pytest.mark.parametrize("estimator", ["mc", "hutchinson", "auto"])
def test_a_target_that_does_not_fit_is_refused_before_any_draw(estimator: str) -> None:
    model, x, y, _ = mlp_case("mse")
    with pytest.raises(FathomError, match="the target must have the output's shape"):
        diagonals(model, x, y[:, :1], loss="mse", estimator=estimator)
    labels = torch.full((4, 2), -100)
    with pytest.raises(FathomError, match="every position of the target is masked"):
        diagonals(model, x, labels, loss="cross_entropy", class_dim=-1, estimator=estimator)


def test_the_estimators_table_is_in_the_generated_docs() -> None:
    """Every loss has its MC draws and Hutchinson product in docs/curvature.md, from the
    tables beside the code (the page itself is held current by test_curvature_losses)."""
    from fathom.curvature.docs import render
    from fathom.curvature.estimate import estimator_rows
    from fathom.losses import LOSSES

    text = render()
    rows = estimator_rows()
    assert {r[0] for r in rows} >= {f"`{name}`" for name in LOSSES}
    for loss_name, draws, product in rows:
        assert f"| {loss_name} | {draws} | {product} |" in text


def test_chunks_over_a_loss_change_the_draws_not_the_law() -> None:
    """A memory budget that forces one example per chunk: Hutchinson draws the same ``z``
    (per probe, not per chunk), so its estimate is the one-chunk estimate to rounding, its
    Hessian products read each chunk's own targets and weights; MC's draws differ and it
    stays within its SE of the exact value."""
    model, x, y, loss = mlp_case("cross_entropy")
    kw = {"loss": loss, "families": SAMPLED, "samples": 24, "seed": 3}
    tight, loose = Budget(memory=600), Budget()
    one = loss_diagonals(model, x, y, estimator="hutchinson", budget=tight, **kw)
    whole = loss_diagonals(model, x, y, estimator="hutchinson", budget=loose, **kw)
    assert (one.layout["examples_per_chunk"], whole.layout["examples_per_chunk"]) == (1, 4)
    for f in SAMPLED:
        for p, v in whole.diagonals[f].items():
            torch.testing.assert_close(one.diagonals[f][p], v, rtol=1e-12, atol=1e-15)
    exact = exact_diagonals(model, x, y, loss=loss, families=SAMPLED)
    mc = loss_diagonals(model, x, y, estimator="mc", budget=Budget(memory=2_000), **kw)
    assert mc.layout["examples_per_chunk"] < 4
    for f in SAMPLED:
        t_want = sum(float(v.sum()) for v in exact[f].values())
        assert abs(mc.traces[f] - t_want) <= 5 * mc.trace_standard_errors[f]


_BATCHED_CASES = {
    "ce [N, T, V] ignore, smoothing, mean": {"loss": "cross_entropy", "head": "tokens",
                                             "reduction": "mean", "ignore": True,
                                             "smoothing": 0.2},
    "ce probabilities [N, C, d] sum": {"loss": "ce_prob", "head": "channels", "reduction": "sum",
                                       "smoothing": 0.2},
    "mse [N, T, E] mean, dict input": {"loss": "mse", "head": "tokens", "reduction": "mean",
                                       "structure": "dict"},
    "bce [N, C, d] sum": {"loss": "bce_with_logits", "head": "channels", "reduction": "sum"},
}  # fmt: skip


@pytest.mark.parametrize("case", list(_BATCHED_CASES))
def test_batched_probes_replay_their_draws_for_every_loss_and_layout(monkeypatch, case) -> None:
    """Every loss's Hessian product on batched probes (all at once; groups of 5 probes over
    chunks of 2 examples, each chunk's own targets and weights) and one probe at a time: each
    the float64 brute force from the same draws (:func:`test_curvature_estimate.
    hutchinson_reference`, ``M = sum_i J_i^T H_i J_i`` from this module's :func:`reference`),
    and the batched estimate the looped one within ``1e-12`` of its scale."""
    import fathom.curvature.estimate as estimate

    model, x, y, loss, output = setup(_FIXED | _BATCHED_CASES[case])
    z, jac, blocks = reference(model, x, y, loss, output)
    n, e = z.shape[0], z[0].numel()
    gram = torch.eye(e, dtype=DT).expand(n, e, e) / (n if loss.reduction == "mean" else 1)
    ms = {f: torch.einsum("nep,nef,nfq->pq", jac, h, jac) for f, h in zip(SAMPLED, (blocks, gram))}
    ref = hutchinson_reference(model, ms, 12, 6)
    names = list(dict(model.named_parameters()))
    kw = {"loss": loss, "output": output, "families": SAMPLED, "estimator": "hutchinson"}
    batched = diagonals(model, x, y, samples=12, seed=6, **kw)
    assert (batched.layout["probes_per_chunk"], batched.layout["batched"]) == (12, True)
    assert_replays(batched, ref, names)
    monkeypatch.setattr(estimate, "_hutchinson_chunks", lambda *a: (2, 5))
    grouped = diagonals(model, x, y, samples=12, seed=6, **kw)
    assert (grouped.layout["examples_per_chunk"], grouped.layout["batched"]) == (2, True)
    assert_replays(grouped, ref, names)
    monkeypatch.setattr(estimate, "_hutchinson_chunks", lambda *a: (n, 1))
    looped = diagonals(model, x, y, samples=12, seed=6, **kw)
    assert looped.layout["batched"] is False
    assert_replays(looped, ref, names)
    assert_same_estimate(batched, looped)
    assert_same_estimate(grouped, looped)


def test_a_loss_without_its_own_draws_is_sampled_through_its_hessian_factor() -> None:
    """A user's :class:`fathom.losses.Loss` (here a renamed BCE, so no row of the draws
    table names it): MC draws ``F xi`` and Hutchinson applies ``F (F^T v)``; both unbiased
    within 5 SE at a large K, and the record says so."""
    from fathom.losses.kinds import BCEWithLogits

    class MyBCE(BCEWithLogits):
        name = "my_bce"

    model, x, y, _ = mlp_case("bce_with_logits")
    loss = MyBCE(reduction="mean")
    exact = exact_diagonals(model, x, y, loss=loss, families="ggn")["ggn"]
    t_want = sum(float(v.sum()) for v in exact.values())
    for estimator, key in (("mc", "draws"), ("hutchinson", "products")):
        est = loss_diagonals(model, x, y, loss=loss, estimator=estimator, samples=400, seed=5)
        assert "Hessian factor" in est.record()["layout"][key]["ggn"]
        assert abs(est.traces["ggn"] - t_want) <= 5 * est.trace_standard_errors["ggn"]
        assert abs(est.traces["ggn"] / t_want - 1) < 0.1


def test_token_snapshot_records_hutchinson() -> None:
    """The language model's snapshot record (what ``fathom curvature --estimator hutchinson``
    writes) says the estimator, samples, seed and the product it applied."""
    from fathom.curvature.language import token_snapshot

    model, x, y = tiny(seed=2)
    rec = token_snapshot(model, x, y, loss=token_loss(), estimator="hutchinson", samples=3, seed=4)
    assert rec["estimator"] == {"ggn": "hutchinson", "empirical_fisher": "exact"}
    assert (rec["samples"], rec["seed"]) == (3, 4) and rec["choice"] == "hutchinson requested"
    assert rec["trace_standard_errors"]["ggn"] > 0
    assert "products" in rec["layout"] and rec["layout"]["loss"] == repr(token_loss())
