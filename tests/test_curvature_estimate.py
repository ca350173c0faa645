"""Monte-Carlo and Hutchinson curvature diagonals: unbiased within their standard errors.

Property over generated models (:mod:`seam_grammar`): every model the exact path refuses,
the estimators refuse too; on every other one the estimates meet the exact float64 values
within their own standard errors, judged by a test that cannot flake (fixed seeds, and a
tolerance of 5 standard errors on the trace and 4 on every entry, with at most 2% of the
entries allowed beyond 4 SE: under the estimators' sampling law that is a tail a few
parts in a million per entry for a normal mean, and the SE's own noise with K = 24 draws is
covered by the 2% allowance). The standard-error formula itself is checked against the
empirical spread of 150 repeated seeds on a small case.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from torch import nn

from fathom.curvature import Budget, diagonals, exact_diagonals
from fathom.curvature.estimate import (
    Costs,
    bce_samples,
    choose,
    mse_samples,
    softmax_ce_samples,
)
from fathom.curvature.exact import Plan
from fathom.errors import FathomError
from seam_grammar import build, specs
from test_seam_generated import _dense_copy

torch.set_num_threads(1)
DT = torch.float64
SAMPLED = ("ggn", "jacobian_gram")


def mlp(classes: int = 4, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, classes))


def probe(n: int = 6, classes: int = 4, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 5, generator=g), torch.randint(0, classes, (n,), generator=g)


def assert_within_standard_errors(est, exact, families) -> None:
    """The module docstring's criterion, with a float64 rounding floor for zero-variance
    entries (e.g. the Jacobian Gram of a readout bias: ``v^2 = 1`` for every Rademacher ``v``)."""
    for f in families:
        want = torch.cat([v.flatten() for v in exact[f].values()])
        got = torch.cat([est.diagonals[f][p].flatten() for p in exact[f]])
        se = torch.cat([est.standard_errors[f][p].flatten() for p in exact[f]])
        floor = 1e-9 * float(want.abs().max()) + 1e-300
        beyond = (got - want).abs() > 4 * se + floor
        assert float(beyond.double().mean()) <= 0.02, (f, int(beyond.sum()), len(beyond))
        assert bool(((got - want).abs() <= 8 * se + floor).all()), f
        t_want = float(want.sum())
        t_se = est.trace_standard_errors[f]
        assert abs(est.traces[f] - t_want) <= 5 * t_se + 1e-9 * abs(t_want) + 1e-300, (
            f,
            est.traces[f],
            t_want,
            t_se,
        )


# -- the samplers: E[v v^T] is the output Hessian -------------------------------------------------
def test_softmax_samples_have_the_softmax_hessian_as_second_moment() -> None:
    logits = torch.randn(3, 4, dtype=DT, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(1)
    v = softmax_ce_samples(logits, torch.zeros(3, dtype=torch.long), 200_000, g)
    p = torch.softmax(logits, -1)
    want = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]
    got = torch.einsum("kic,kid->icd", v, v) / v.shape[0]
    # every entry of v is bounded by 1: SE of a second moment <= 1/sqrt(K) = 0.0022
    torch.testing.assert_close(got, want, atol=0.012, rtol=0)
    assert float(v.sum(-1).abs().max()) < 1e-12  # p - e_c sums to zero


def test_mse_and_bce_samples_match_torch_hessians() -> None:
    g = torch.Generator().manual_seed(2)
    out = torch.randn(2, 3, dtype=DT, generator=g)
    target = torch.rand(2, 3, dtype=DT, generator=g)
    for sampler, loss in (
        (mse_samples, lambda o: nn.functional.mse_loss(o, target, reduction="sum")),
        (
            bce_samples,
            lambda o: nn.functional.binary_cross_entropy_with_logits(o, target, reduction="sum"),
        ),
    ):
        v = sampler(out, target, 200_000, g).reshape(200_000, -1)
        got = v.T @ v / v.shape[0]
        want = torch.autograd.functional.hessian(loss, out).reshape(6, 6)
        torch.testing.assert_close(got, want, atol=0.03, rtol=0)


# -- MC and Hutchinson meet the exact values ---------------------------------------------------------
@pytest.mark.parametrize("estimator", ["mc", "hutchinson"])
def test_estimates_meet_the_exact_diagonals_on_an_mlp(estimator: str) -> None:
    model, (x, y) = mlp(), probe()
    exact = exact_diagonals(model, x, y, families=SAMPLED)
    est = diagonals(model, x, y, families=SAMPLED, estimator=estimator, samples=64, seed=3)
    assert est.estimators == {"ggn": estimator, "jacobian_gram": estimator}
    assert (est.samples, est.seed) == (64, 3)
    assert_within_standard_errors(est, exact, SAMPLED)
    record = est.record()
    assert record["estimator"]["ggn"] == estimator and record["samples"] == 64
    assert record["seed"] == 3 and record["trace_standard_errors"]["ggn"] > 0


def test_mc_is_closer_with_more_samples_and_the_fisher_stays_exact() -> None:
    model, (x, y) = mlp(), probe()
    exact = exact_diagonals(model, x, y, families="all")
    few = diagonals(model, x, y, families="all", estimator="mc", samples=4, seed=0)
    many = diagonals(model, x, y, families="all", estimator="mc", samples=400, seed=0)
    assert many.trace_standard_errors["ggn"] < few.trace_standard_errors["ggn"] / 5
    assert few.estimators["empirical_fisher"] == "exact"
    assert few.standard_errors["empirical_fisher"] is None
    for p, v in exact["empirical_fisher"].items():
        torch.testing.assert_close(few.diagonals["empirical_fisher"][p], v, rtol=1e-12, atol=0)


def test_mc_without_standard_errors_is_the_same_estimate_from_the_same_draws() -> None:
    model, (x, y) = mlp(), probe()
    for budget in (Budget(), Budget(memory=2_000)):  # one chunk; one example per chunk
        kw = {"families": SAMPLED, "estimator": "mc", "samples": 6, "seed": 9, "budget": budget}
        with_se = diagonals(model, x, y, **kw)
        plain = diagonals(model, x, y, standard_errors=False, **kw)
        assert plain.standard_errors == {"ggn": None, "jacobian_gram": None}
        assert plain.trace_standard_errors == {"ggn": None, "jacobian_gram": None}
        assert plain.layout["standard_errors"] is False
        for f in SAMPLED:
            for p, v in with_se.diagonals[f].items():
                torch.testing.assert_close(plain.diagonals[f][p], v, rtol=1e-12, atol=1e-15)


class _Tokens(nn.Module):
    """Embedding (repeated tokens), attention, LayerNorm, a linear map over positions, mean
    pool, head: the embedding, attention-form and per-position linear paths."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(4)
        self.embed, self.ln = nn.Embedding(7, 6), nn.LayerNorm(6)
        self.attn = nn.MultiheadAttention(6, 2, batch_first=True)
        self.mix, self.head = nn.Linear(6, 5), nn.Linear(5, 3)

    def forward(self, tok: torch.Tensor) -> torch.Tensor:
        h = self.ln(self.embed(tok))
        h = h + self.attn(h, h, h, need_weights=False)[0]
        return self.head(torch.tanh(self.mix(h)).mean(1))


def _conv() -> nn.Module:
    """Conv2d and BatchNorm (materialized per-example rows) and a one-row linear head."""
    torch.manual_seed(5)
    bn = nn.BatchNorm2d(3)
    bn.running_mean.uniform_(-0.3, 0.3)
    bn.running_var.uniform_(0.5, 1.5)
    net = nn.Sequential(nn.Conv2d(2, 3, 3), bn, nn.Tanh(), nn.Flatten(), nn.Linear(12, 4))
    return net.eval()


def reference_mc(model, x, layout: dict, samples: int, seed: int):
    """Float64 brute force of the MC estimate and its standard errors from the same draws:
    one autograd gradient per (example, draw) of ``<v_ik, f_i>``, ``x_ik`` its square; the
    draws replayed in :func:`fathom.curvature.estimate.mc_diagonals`' order (chunks of
    ``layout["examples_per_chunk"]`` examples, groups of ``layout["samples_per_chunk"]``
    draws); ``SE^2 = sum_i sum_k (x_ik - xbar_i)^2 / (N^2 K (K - 1))``, the traces alike."""
    model = _dense_copy(model).double().eval()
    x = x.double() if x.is_floating_point() else x
    params = dict(model.named_parameters())
    n, gen = x.shape[0], torch.Generator().manual_seed(seed)
    logits = model(x)
    per = layout["samples_per_chunk"]
    ex = 1 if per < samples else layout["examples_per_chunk"]
    v = torch.empty(n, samples, logits.shape[1], dtype=DT)
    for a in range(0, n, ex):
        for b in range(0, samples, per):
            k = min(per, samples - b)
            draws = softmax_ce_samples(logits[a : a + ex].detach(), None, k, gen)
            v[a : a + ex, b : b + k] = draws.transpose(0, 1)
    xs = {p: torch.zeros(n, samples, *t.shape, dtype=DT) for p, t in params.items()}
    for i in range(n):
        for k in range(samples):
            out = model(x)
            g = torch.autograd.grad(out[i] @ v[i, k], list(params.values()), allow_unused=True)
            for p, gi in zip(params, g, strict=True):
                xs[p][i, k] = 0.0 if gi is None else gi.square()
    norm = n * n * samples * (samples - 1)
    diag = {p: t.sum((0, 1)) / (n * samples) for p, t in xs.items()}
    se = {
        p: ((t - t.mean(1, keepdim=True)).square().sum((0, 1)) / norm).sqrt() for p, t in xs.items()
    }

    def spread(t: torch.Tensor) -> float:
        return math.sqrt(float((t - t.mean(1, keepdim=True)).square().sum()) / norm)

    traces = {p: t.flatten(2).sum(2) for p, t in xs.items()}
    return diag, se, {p: spread(t) for p, t in traces.items()}, spread(sum(traces.values()))


@pytest.mark.parametrize("tight", [False, True])
@pytest.mark.parametrize("which", ["tokens", "conv", "mlp"])
def test_mc_standard_errors_are_the_per_example_spread_of_the_same_draws(which, tight) -> None:
    """Every path of the per-layer sums (one-row linear, materialized conv and BatchNorm,
    embedding pairs, attention and per-position linear forms), one chunk or one example per
    chunk with its draws in groups (Chan's combination): the estimate and every standard
    error equal the float64 per-(example, draw) brute force from the same draws."""
    g = torch.Generator().manual_seed(6)
    if which == "tokens":
        model, x = _Tokens(), torch.randint(0, 7, (5, 4), generator=g)
    elif which == "conv":
        model, x = _conv(), torch.randn(5, 2, 4, 4, generator=g)
    else:
        model, x = mlp(classes=3), probe(n=5)[0]
    y = torch.zeros(5, dtype=torch.long)
    est = diagonals(model, x, y, estimator="mc", samples=5, seed=11)
    if tight:  # the largest budget that splits one example's draws into groups
        memory = 2 * 8 * 5 * est.layout["examples_per_chunk"] * 200  # above per_row x 5 x 16
        while est.layout["samples_per_chunk"] == 5:
            memory //= 2
            est = diagonals(
                model, x, y, estimator="mc", samples=5, seed=11, budget=Budget(memory=memory)
            )
        assert est.layout["examples_per_chunk"] == 1, est.layout
    diag, se, ptr_se, tr_se = reference_mc(model, x, est.layout, 5, 11)
    for p in diag:
        torch.testing.assert_close(est.diagonals["ggn"][p], diag[p], rtol=1e-10, atol=1e-15)
        torch.testing.assert_close(est.standard_errors["ggn"][p], se[p], rtol=1e-7, atol=1e-12)
        want = ptr_se[p]
        assert abs(est.parameter_trace_standard_errors["ggn"][p] - want) <= 1e-7 * want + 1e-12
        t = float(diag[p].sum())  # the trace from the per-draw traces is the diagonal's sum
        assert abs(est.parameter_traces["ggn"][p] - t) <= 1e-12 * abs(t) + 1e-300
    assert abs(est.trace_standard_errors["ggn"] - tr_se) <= 1e-7 * tr_se


def test_the_chunk_layout_changes_the_draws_not_the_law() -> None:
    """Chunks of one example (the brief's per-example variance) and of several samples at a
    time: unbiased either way, and the SE agrees to its own precision."""
    model, (x, y) = mlp(), probe(n=8)
    exact = exact_diagonals(model, x, y, families="ggn")
    tight = diagonals(model, x, y, estimator="mc", samples=32, seed=5, budget=Budget(memory=2_000))
    assert tight.layout["examples_per_chunk"] == 1 and tight.layout["samples_per_chunk"] < 32
    assert_within_standard_errors(tight, exact, ["ggn"])
    loose = diagonals(model, x, y, estimator="mc", samples=32, seed=5)
    assert loose.layout["examples_per_chunk"] == 8
    assert 0.5 < tight.trace_standard_errors["ggn"] / loose.trace_standard_errors["ggn"] < 2


def test_standard_error_matches_the_spread_over_repeated_seeds() -> None:
    """Over 150 seeds: the mean reported SE^2 of the trace and of every entry is the empirical
    variance of the estimates (the reported SE^2 is unbiased: within 25% with 150 replicates,
    whose relative standard error for a variance is about sqrt(2/149) = 12%)."""
    model, (x, y) = mlp(classes=3), probe(n=4, classes=3)
    for estimator in ("mc", "hutchinson"):
        runs = [diagonals(model, x, y, estimator=estimator, samples=4, seed=s) for s in range(150)]
        traces = torch.tensor([r.traces["ggn"] for r in runs], dtype=DT)
        se2 = torch.tensor([r.trace_standard_errors["ggn"] ** 2 for r in runs], dtype=DT)
        assert 0.75 < float(se2.mean() / traces.var()) < 1.33, estimator
        w = torch.stack([r.diagonals["ggn"]["2.weight"] for r in runs])
        w_se2 = torch.stack([r.standard_errors["ggn"]["2.weight"].square() for r in runs])
        ratio = float(w_se2.mean(0).sum() / w.var(0).sum())
        assert 0.75 < ratio < 1.33, (estimator, ratio)


# -- generated models ---------------------------------------------------------------------------
def jacobians(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list]:
    """Independent float64 reference, one example at a time: ``J [N, C, P]`` (every parameter
    flattened in ``named_parameters`` order), ``p [N, C]`` and the parameters' shapes."""
    ref = _dense_copy(model)
    params = [p for _, p in ref.named_parameters()]
    xs = x.double() if x.is_floating_point() else x
    jac, probs = [], []
    for i in range(x.shape[0]):
        logits = ref(xs[i : i + 1])[0]
        rows = []
        for c in range(logits.shape[0]):
            g = torch.autograd.grad(logits[c], params, retain_graph=True, allow_unused=True)
            rows.append(torch.cat([(torch.zeros_like(p) if gi is None else gi).flatten()
                                   for p, gi in zip(params, g, strict=True)]))  # fmt: skip
        jac.append(torch.stack(rows))
        probs.append(torch.softmax(logits.detach(), 0))
    return torch.stack(jac), torch.stack(probs), [p.shape for p in params]


def true_standard_errors(jac, probs, estimator: str, family: str, k: int):
    """The estimators' exact sampling standard errors ``(entries [P], trace)`` for ``k`` draws,
    by enumerating the output law (MC: the ``C`` classes with probabilities ``p``, or the
    ``2^C`` Rademacher sign vectors) or from the full matrix ``M`` (Hutchinson with Rademacher
    ``z``: ``Var(z_j (M z)_j) = sum_{l != j} M_jl^2``, ``Var(z^T M z) = 2 sum_{j != l} M_jl^2``)."""
    n, c, _ = jac.shape
    if estimator == "mc":
        if family == "ggn":
            v = probs[:, None, :] - torch.eye(c, dtype=DT)[None]  # [N, outcome, C]
            w = probs  # [N, outcome]
        else:
            signs = torch.tensor(list(itertools.product((-1.0, 1.0), repeat=c)), dtype=DT)
            v, w = signs[None].expand(n, -1, -1), torch.full((n, len(signs)), 0.5**c, dtype=DT)
        x = torch.einsum("noc,ncp->nop", v, jac).square()  # [N, outcome, P]
        t = x.sum(-1)
        var = (w[..., None] * x.square()).sum(1) - (w[..., None] * x).sum(1).square()
        t_var = (w * t.square()).sum(1) - (w * t).sum(1).square()
        return (var.sum(0) / (n * n * k)).clamp_min(0).sqrt(), math.sqrt(
            max(float(t_var.sum()), 0.0) / (n * n * k)
        )
    if family == "ggn":
        h = torch.diag_embed(probs) - probs[:, :, None] * probs[:, None, :]
    else:
        h = torch.eye(c, dtype=DT).expand(n, c, c)
    m = torch.einsum("ncp,ncd,ndq->pq", jac, h, jac) / n
    off = m - torch.diag_embed(m.diagonal())
    return (off.square().sum(1) / k).sqrt(), math.sqrt(2 * float(off.square().sum()) / k)


def check_estimators(spec: dict) -> None:
    """Refused where exact is refused (Hutchinson also where torch has no second derivative of
    an operation, naming it and the fix); otherwise every entry and the trace within 5 of the
    estimator's exact sampling SEs (:func:`true_standard_errors`; Chebyshev bounds the chance
    of a miss by 1/25 whatever the law, the draws are fixed, so nothing flakes) and the
    reported trace SE within a factor 3 of the true one where it is not negligible."""
    model, x, y = build(spec)
    try:
        exact = exact_diagonals(model, x, y, families=SAMPLED)
    except FathomError:
        for estimator in ("mc", "hutchinson"):
            with pytest.raises(FathomError):
                diagonals(model, x, y, families=SAMPLED, estimator=estimator, samples=2)
        return
    jac, probs, _ = jacobians(model, x)
    k = 32
    for estimator in ("mc", "hutchinson"):
        try:
            est = diagonals(model, x, y, families=SAMPLED, estimator=estimator, samples=k, seed=7)
        except FathomError as err:  # an op without a second derivative (cdist): by name
            assert estimator == "hutchinson" and "estimator='mc'" in str(err), str(err)
            assert "derivative" in str(err), str(err)
            continue
        for f in SAMPLED:
            want = torch.cat([v.flatten() for v in exact[f].values()])
            got = torch.cat([est.diagonals[f][p].flatten() for p in exact[f]])
            se, t_se = true_standard_errors(jac, probs, estimator, f, k)
            floor = 1e-9 * float(want.abs().max()) + 1e-300
            assert bool(((got - want).abs() <= 5 * se + floor).all()), (estimator, f)
            t_want = float(want.sum())
            assert abs(est.traces[f] - t_want) <= 5 * t_se + 1e-9 * abs(t_want) + 1e-300
            if t_se > 1e-6 * abs(t_want):
                assert 1 / 3 < est.trace_standard_errors[f] / t_se < 3, (estimator, f)


@settings(max_examples=40)
@given(spec=specs())
def test_generated_models_meet_the_exact_diagonals_within_standard_errors(spec) -> None:
    check_estimators(spec)


# -- Hutchinson: probes in batches, the same draws as one at a time ------------------------------
def hutchinson_reference(model: nn.Module, ms: dict[str, torch.Tensor], samples: int, seed: int):
    """Float64 brute force of Hutchinson's estimate from the estimator's own draws: per family
    (in order) ``samples`` probes replayed from ``torch.Generator().manual_seed(seed)`` (probe
    after probe, parameter after parameter in ``named_parameters`` order, ``2 b - 1`` for
    ``b = randint(0, 2)``), ``d_k = z_k * (M z_k)`` with ``M [P, P]`` the family's full matrix,
    then ``(mean_k d_k, sqrt(var_k d_k / K), mean_k t_k, sqrt(var_k t_k / K))`` with
    ``t_k = sum_j d_k[j]`` (unbiased variances over the ``K`` probes)."""
    shapes = [p.shape for _, p in model.named_parameters()]
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for f, m in ms.items():
        z = torch.stack(
            [
                torch.cat(
                    [(2.0 * torch.randint(0, 2, s, generator=gen) - 1.0).flatten() for s in shapes]
                )
                for _ in range(samples)
            ]
        ).to(DT)
        d = z * (z @ m.T)  # [K, P]
        t = d.sum(1)
        k = samples
        out[f] = (d.mean(0), (d.var(0) / k).sqrt(), float(t.mean()), float((t.var() / k).sqrt()))
    return out


def assert_replays(est, ref: dict, names: list[str], rel: float = 1e-10) -> None:
    """``est`` is ``ref`` (:func:`hutchinson_reference`) to float64 rounding: every entry of
    the diagonal and of its standard error within ``rel`` of the largest, the trace within
    ``rel`` of ``sum |d|`` and its standard error within ``rel`` of the per-probe traces'
    largest magnitude (a variance of sums, whose rounding is the sums')."""
    for f, (d, se, t, t_se) in ref.items():
        got = torch.cat([est.diagonals[f][p].flatten() for p in names])
        got_se = torch.cat([est.standard_errors[f][p].flatten() for p in names])
        assert float((got - d).abs().max()) <= rel * float(d.abs().max()), f
        assert float((got_se - se).abs().max()) <= rel * float(se.abs().max()) + 1e-300, f
        assert abs(est.traces[f] - t) <= rel * float(d.abs().sum()), (f, est.traces[f], t)
        assert abs(est.trace_standard_errors[f] - t_se) <= rel * (abs(t) + t_se), f


def assert_same_estimate(a, b, rel: float = 1e-12) -> None:
    """Two estimates equal to rounding: per parameter, every entry of the diagonal and of its
    standard error within ``rel`` of that parameter's largest, every trace and trace SE within
    ``rel`` of its magnitude (plus the diagonal's ``sum |d|`` for a trace)."""
    for f, diag in b.diagonals.items():
        for p, want in diag.items():
            for got, ref in (
                (a.diagonals[f][p], want),
                (a.standard_errors[f][p], b.standard_errors[f][p]),
            ):
                assert float((got - ref).abs().max()) <= rel * float(ref.abs().max()), (f, p)
            size = float(want.abs().sum())
            got_t, want_t = a.parameter_traces[f][p], b.parameter_traces[f][p]
            assert abs(got_t - want_t) <= rel * size + 1e-300, (f, p)
            got_s = a.parameter_trace_standard_errors[f][p]
            want_s = b.parameter_trace_standard_errors[f][p]
            assert abs(got_s - want_s) <= rel * (want_s + size) + 1e-300, (f, p)
        total = sum(float(v.abs().sum()) for v in diag.values())
        assert abs(a.traces[f] - b.traces[f]) <= rel * total, f
        want_s = b.trace_standard_errors[f]
        assert abs(a.trace_standard_errors[f] - want_s) <= rel * (want_s + total), f


def _matrices(model: nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """``{family: M [P, P]}`` of the mean cross-entropy's GGN and the Jacobian Gram from the
    per-example Jacobians (:func:`jacobians`): ``(1/N) sum_i J_i^T H_i J_i``."""
    jac, probs, _ = jacobians(model, x)
    n, c, _ = jac.shape
    h = {
        "ggn": torch.diag_embed(probs) - probs[:, :, None] * probs[:, None, :],
        "jacobian_gram": torch.eye(c, dtype=DT).expand(n, c, c),
    }
    return {f: torch.einsum("ncp,ncd,ndq->pq", jac, h[f], jac) / n for f in SAMPLED}


def _models(which: str):
    g = torch.Generator().manual_seed(6)
    if which == "tokens":
        return _Tokens(), torch.randint(0, 7, (5, 4), generator=g)
    if which == "conv":
        return _conv(), torch.randn(5, 2, 4, 4, generator=g)
    return mlp(), probe(n=5)[0]


def _with_chunks(monkeypatch, chunks: tuple[int, int] | None) -> None:
    """Hutchinson's ``(examples, probes)`` per pass fixed to ``chunks`` (``None``: the rule)."""
    import fathom.curvature.estimate as estimate

    if chunks is not None:
        monkeypatch.setattr(estimate, "_hutchinson_chunks", lambda *a, chunks=chunks: chunks)


@pytest.mark.parametrize("chunks", [None, (2, 5), (1, 3), (5, 1)], ids=str)
@pytest.mark.parametrize("which", ["mlp", "tokens", "conv"])
def test_hutchinson_replays_its_draws_in_every_chunk_layout(monkeypatch, which, chunks) -> None:
    """One pass of all the probes (the rule's layout here), probes in groups of 5 over chunks
    of 2 examples (the last group short), 3 probes over single examples, and one probe at a
    time (the looped estimator): the same draws in the same order, so every layout is the
    float64 brute force from :func:`hutchinson_reference` to rounding; batched wherever a
    pass holds several probes (linear, embedding, attention, LayerNorm, conv, BatchNorm)."""
    model, x = _models(which)
    y = torch.zeros(x.shape[0], dtype=torch.long)
    _with_chunks(monkeypatch, chunks)
    est = diagonals(model, x, y, families=SAMPLED, estimator="hutchinson", samples=12, seed=5)
    ex, probes = chunks if chunks is not None else (5, 12)
    assert (est.layout["examples_per_chunk"], est.layout["probes_per_chunk"]) == (ex, probes)
    assert est.layout["batched"] is (probes > 1)
    ref = hutchinson_reference(model, _matrices(model, x), 12, 5)
    assert_replays(est, ref, [n for n, _ in model.named_parameters()])


@pytest.mark.parametrize("which", ["mlp", "tokens", "conv"])
def test_batched_probes_are_the_one_at_a_time_estimate(monkeypatch, which) -> None:
    """The batched passes (32 probes at a time, then a group of 8) against the one-probe-at-a-
    time estimator (``_PROBES_PER_PASS = 1``: a forward and a double-vjp per probe, as before
    the probes were batched): every entry, standard error and trace within ``1e-12`` of its
    parameter's scale (float64; about ``1e-15`` in practice: the batched sums are reordered)."""
    import fathom.curvature.estimate as estimate

    model, x = _models(which)
    y = torch.zeros(x.shape[0], dtype=torch.long)
    kw = {"families": SAMPLED, "estimator": "hutchinson", "samples": 40, "seed": 2}
    batched = diagonals(model, x, y, **kw)
    assert (batched.layout["probes_per_chunk"], batched.layout["batched"]) == (32, True)
    monkeypatch.setattr(estimate, "_PROBES_PER_PASS", 1)
    looped = diagonals(model, x, y, **kw)
    assert (looped.layout["probes_per_chunk"], looped.layout["batched"]) == (1, False)
    assert_same_estimate(batched, looped)


def test_hutchinson_chunks_keep_to_the_budget() -> None:
    """Probes per pass at most 32, ``samples`` and what one example with them fits in half the
    budget (never fewer than one); then examples within half the budget with those probes."""
    from fathom.curvature.estimate import _hutchinson_chunks

    costs = Costs(largest=0, activations=1_000, parameters=9_000, classes=10)
    assert _hutchinson_chunks(costs, 64, 100, 2**40) == (100, 32)
    assert _hutchinson_chunks(costs, 6, 100, 2**40) == (100, 6)
    per_probe = 2 * 8 * 3 * (1_000 + 9_000)
    ex, probes = _hutchinson_chunks(costs, 64, 100, 10 * per_probe)
    assert probes == 10 and ex == 10 * per_probe // (2 * 8 * 3 * 1_000 * 10) == 10
    assert _hutchinson_chunks(costs, 64, 100, 100) == (1, 1)


class _PReLUNet(nn.Module):
    """``nn.PReLU``: torch has no batching rule for its backward, so the seam pulls its
    directions back one at a time (:mod:`fathom.seam.check`)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(8)
        self.a, self.act, self.b = nn.Linear(3, 4), nn.PReLU(4, init=0.2), nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(self.act(self.a(x))))


def test_a_seam_that_loops_directions_loops_the_probes() -> None:
    """Where the seam says a batched pullback is unreliable (a layer with
    ``loop_directions``), the probes go one at a time on each pass's graph: the brute force
    from the same draws, ``batched`` false in the record."""
    from fathom.curvature.twin import prepared

    model = _PReLUNet()
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(3))
    y = torch.zeros(4, dtype=torch.long)
    est = diagonals(model, x, y, families=SAMPLED, estimator="hutchinson", samples=10, seed=4)
    assert any(la.loop_directions for la in prepared(model, x)[2].layers)
    assert est.layout["batched"] is False and est.layout["probes_per_chunk"] == 10
    assert_replays(
        est,
        hutchinson_reference(model, _matrices(model, x), 10, 4),
        list(dict(model.named_parameters())),
    )


@pytest.mark.parametrize("fault", ["no batching rule", "wrong batching rule", "raises later"])
def test_batched_probes_that_fail_or_differ_are_looped(monkeypatch, fault) -> None:
    """autograd's ``is_grads_batched`` raising (simulated: an operation without a batching
    rule, whose message says "not implemented" and must not be taken for a missing second
    derivative) or giving another value (simulated: scaled, as ``torch.cdist``'s rule is
    wrong) on a seam that trusts it: the first pass's check against its first probe alone
    catches it and every probe is looped; raising only after the first pass passed its check
    (passes of 5 probes over chunks of 2 examples), that pass and the rest are looped. The
    estimate is the brute force's from the same draws either way."""
    from fathom.curvature.twin import prepared

    model, x = _models("mlp")
    y = torch.zeros(x.shape[0], dtype=torch.long)
    kw = {"families": SAMPLED, "estimator": "hutchinson", "samples": 12, "seed": 1}
    assert diagonals(model, x, y, **kw).layout["batched"] is True  # (the seam, built unpatched)
    real, calls = torch.autograd.grad, []

    def grad(*args, is_grads_batched=False, **kwargs):
        calls.append(is_grads_batched)
        fails = fault == "no batching rule" or (fault == "raises later" and sum(calls) > 2)
        if is_grads_batched and fails:
            raise RuntimeError("Batching rule not implemented for aten::made_up")
        out = real(*args, is_grads_batched=is_grads_batched, **kwargs)
        scale = 1.5 if is_grads_batched and fault == "wrong batching rule" else 1.0
        return tuple(g if g is None else scale * g for g in out)

    monkeypatch.setattr(torch.autograd, "grad", grad)
    if fault == "raises later":
        _with_chunks(monkeypatch, (2, 5))
    est = diagonals(model, x, y, **kw)
    assert prepared(model, x)[2].batched_pullback
    assert sum(calls) >= (3 if fault == "raises later" else 1)  # the fault was met
    assert est.layout["batched"] is False
    assert_replays(
        est,
        hutchinson_reference(model, _matrices(model, x), 12, 1),
        list(dict(model.named_parameters())),
    )


# -- auto and bad input -------------------------------------------------------------------------
def test_auto_picks_exact_when_it_fits_and_names_why() -> None:
    model, (x, y) = mlp(), probe()
    est = diagonals(model, x, y)
    assert est.estimators == {"ggn": "exact"} and est.samples is None
    assert est.choice.startswith("auto chose exact") and "GiB" in est.choice
    exact = exact_diagonals(model, x, y, families="ggn")
    for p, v in exact["ggn"].items():
        torch.testing.assert_close(est.diagonals["ggn"][p], v, rtol=0, atol=0)


def test_auto_falls_back_by_the_cost_model() -> None:
    plan = Plan(("ggn",))
    resnet_like = Costs(
        largest=2_359_296, activations=1_000_000, parameters=11_700_000, classes=1000
    )
    name, why = choose(resnet_like, plan, 8, Budget(memory="4GB"), 32)
    assert name == "mc" and "exact needs" in why
    assert choose(resnet_like, plan, 8, Budget(memory="0.5GB"), 32)[0] == "mc"
    with pytest.raises(FathomError, match=r"no curvature estimator fits .* raise the budget"):
        choose(resnet_like, plan, 8, Budget(memory="10MB"), 32)
    small = Costs(largest=0, activations=20, parameters=100, classes=10)
    assert choose(small, plan, 8, Budget(), 32)[0] == "exact"
    # time: 32k classes exceed the default backward passes even where memory would fit
    vocab = Costs(largest=0, activations=20, parameters=100, classes=32_000)
    assert choose(vocab, plan, 8, Budget(memory="1TB"), 32)[0] == "mc"


def test_auto_on_a_tiny_budget_picks_an_estimator_and_records_it() -> None:
    model, (x, y) = mlp(), probe()
    est = diagonals(model, x, y, samples=16, seed=2, budget=Budget(memory=3_000))
    assert est.estimators["ggn"] == "mc" and est.choice.startswith("auto chose mc")
    assert est.record()["seed"] == 2


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"estimator": "montecarlo"}, "unknown curvature estimator"),
        ({"estimator": "hutchinsn"}, "did you mean 'hutchinson'"),
        ({"estimator": "mc", "samples": 1}, "at least 2 samples"),
        ({"budget": Budget(memory="4 parsecs")}, "is not a size"),
        ({"budget": 4e9}, "budget must be a fathom.curvature.Budget"),
        ({"families": "ggm"}, "unknown curvature families"),
        ({"budget": Budget(memory=10)}, "no curvature estimator fits"),
    ],
)
def test_bad_input_is_refused_with_the_fix(kwargs: dict, match: str) -> None:
    model, (x, y) = mlp(), probe()
    with pytest.raises(FathomError, match=match):
        diagonals(model, x, y, **kwargs)


def test_estimate_leaves_the_model_as_found() -> None:
    model, (x, y) = mlp(), probe()
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    diagonals(model, x, y, estimator="mc", samples=3)
    diagonals(model, x, y, estimator="hutchinson", samples=3)
    assert model.training and all(p.grad is None for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert torch.equal(rng, torch.get_rng_state())
    assert math.isfinite(diagonals(model, x, y, estimator="mc", samples=2).traces["ggn"])
