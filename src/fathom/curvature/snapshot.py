"""One curvature snapshot: every quantity of :mod:`fathom.curvature` for one model and probe.

Any ``nn.Module`` returning logits: a float64 copy in dense evaluation mode
(:mod:`fathom.curvature.probe`). The exact diagonals of the three families are
:func:`fathom.curvature.exact.exact_diagonals`' (the one accumulation loop, in chunks of
examples that bound its per-example rows to ``_ELEMENTS`` float64 values, 256 MiB); KFAC
and the per-example gradient Grams then need the whole probe at once: one forward under
the seam's hooks and one batched backward of the ``C`` unit logit directions (cotangents
``[C, N, *out]`` per layer output, the Fisher gradients' Gram ``[N, N]``). Layers are the
seam's (qualified module names, first-call order); KFAC covers ``nn.Linear`` and
``nn.Conv2d`` and lists every other layer as not covered. The per-example gradients'
concentration (:func:`gradient_concentration`) is read off their Gram.

Under a loss other than plain cross-entropy (a run's ``[loss]``, ``fathom curvature
--loss``), :func:`loss_snapshot` records the exact diagonals of that loss
(:func:`~fathom.curvature.exact.exact_diagonals` with ``loss=``, normalization
:data:`fathom.losses.kinds.NORMALIZATION`), their per-layer traces and the probe's loss;
KFAC and the per-example gradient Grams, from that loss's output directions
(:func:`_loss_directions`, which states their normalization under the mean and the sum); the
output mismatch is softmax cross-entropy's and is recorded as not computed, with the reason.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
from torch import nn

from fathom.curvature.definitions import DEFINITIONS, NORMALIZATION
from fathom.curvature.exact import CURVATURE_FAMILIES, OutputDirections, exact_diagonals
from fathom.curvature.families import scaled
from fathom.curvature.kfac import (
    KFAC_KINDS,
    Spectrum,
    effective_rank,
    exact_ggn_quadratic,
    kfac_diagonal,
    kfac_factors,
    kfac_quadratic,
    per_example_kfac_curvatures,
    relative_l1_error,
)
from fathom.curvature.mismatch import output_mismatch
from fathom.curvature.probe import (
    mix_cotangents,
    probe_labels,
    pull_back,
)
from fathom.curvature.twin import prepared
from fathom.losses.kinds import LOSS_DEFINITIONS
from fathom.losses.kinds import NORMALIZATION as LOSS_NORMALIZATION
from fathom.losses.labels import LabelLoss
from fathom.losses.softmax import cross_entropy
from fathom.seam import Layer
from fathom.seam.inputs import first_device
from fathom.seam.pex import linear_rows, per_example_grams, summed_gram
from fathom.telemetry.moments import moments_from_gram


@dataclass(frozen=True)
class Snapshot:
    """The JSON-ready record, the exact diagonals ``{kind: {param: tensor}}`` and the float64 logits."""

    record: dict
    diagonals: dict[str, dict[str, torch.Tensor]]
    logits: torch.Tensor


def _spectrum_record(spec: Spectrum) -> dict:
    return {
        "dim": spec.dim,
        "eigenvalues": spec.values.tolist(),
        "implied_zeros": spec.implied_zeros,
        "solver": spec.solver,
        "effective_rank": effective_rank(spec.values),
        "trace": float(spec.values.sum()),
    }


def _kfac_record(layer: Layer, calls, cots, n: int, dirs: OutputDirections, ggn_w) -> dict:
    """KFAC of one Linear / Conv2d layer's weight (see :mod:`fathom.curvature.kfac`)."""
    a, u = linear_rows(layer, calls, cots, n, directions=True)  # [N,T,d_in], [C,N,T,d_out]
    u_ggn = torch.einsum("ick,cito->kito", dirs.sqrt_hessian, u)
    delta = torch.einsum("ic,cito->ito", dirs.residual, u)  # dCE_i / dz_it
    f = kfac_factors(u_ggn, a)
    g_bar = torch.einsum("ito,itj->oj", delta, a) / n  # probe-mean CE gradient of W
    g_sq = float(g_bar.square().sum())
    spec_a, spec_g = f.A.spectrum(), f.G.spectrum()
    erank_a, erank_g = effective_rank(spec_a.values), effective_rank(spec_g.values)
    kfac_q = kfac_quadratic(g_bar, f)
    exact_q = exact_ggn_quadratic(g_bar, u_ggn, a)
    return {
        "covered": True,
        "positions_per_example": f.positions,
        "A": _spectrum_record(spec_a),
        "G": _spectrum_record(spec_g),
        "kfac_effective_rank": erank_a * erank_g if erank_a and erank_g else None,
        "kfac_effective_rank_note": "spectrum of G (x) A is all products; its entropy is the "
        "sum, so its effective rank is erank(G) * erank(A)",
        "kfac_diag_rel_l1_error": relative_l1_error(kfac_diagonal(f), ggn_w.reshape(g_bar.shape)),
        "kfac_quadratic_mean_gradient": kfac_q,
        "kfac_rayleigh_mean_gradient": kfac_q / g_sq if g_sq > 0 else None,
        "exact_ggn_rayleigh_mean_gradient": exact_q / g_sq if g_sq > 0 else None,
        "mean_gradient_sq_norm": g_sq,
        "kfac_rayleigh_per_example": per_example_kfac_curvatures(delta, a, f),
    }


def _not_kfac(layer: Layer) -> dict:
    return {
        "covered": False,
        "reason": f"not covered by KFAC: {layer.type_name} (fathom's KFAC covers nn.Linear "
        "and nn.Conv2d weights); its exact diagonals are above",
    }


def _sum(ts: list[torch.Tensor]) -> float | None:
    return float(sum(float(t.sum()) for t in ts)) if ts else None


def gradient_concentration(gram: torch.Tensor) -> dict[str, float | None]:
    """Concentration of per-example gradients ``g_i`` from their Gram ``K_ij = <g_i, g_j>``.

    The curvature job's names for quantities defined once in
    :func:`fathom.telemetry.moments.moments_from_gram` (``N`` examples, ``gbar = (1/N) sum_i g_i``):

    * ``mean_gradient_sq_norm = ||gbar||^2 = 1^T K 1 / N^2`` (telemetry's ``mean_norm``, squared);
    * ``covariance_trace = (1/N) sum_i ||g_i - gbar||^2 = tr(K)/N - ||gbar||^2`` (population, 1/N);
    * ``covariance_to_mean_ratio = covariance_trace / ||gbar||^2`` (telemetry's ``noise_scale``:
      N-1 when one example carries all the gradient; ``None`` when ``gbar = 0``);
    * ``norm_participation = (sum_i ||g_i||)^2 / sum_i ||g_i||^2`` in ``[1, N]`` (telemetry's
      ``participation``; ``None`` if all zero).
    """
    m = moments_from_gram(gram)
    mean_sq = m.mean_norm**2
    return {
        "mean_gradient_sq_norm": mean_sq,
        "covariance_trace": max(m.mean_sq_norm - mean_sq, 0.0),
        "covariance_to_mean_ratio": m.noise_scale,
        "norm_participation": m.participation,
    }


def _layer_record(layer: Layer, diag: dict, kfac: dict, gram) -> dict:
    """Traces over the layer's weights and (separately) biases, from the exact diagonals."""
    w = [layer.qualified[layer.params.index(p)] for p in layer.weights]
    b = [layer.qualified[layer.params.index(p)] for p in layer.biases]
    rec = {
        "name": layer.name,
        "type": layer.type_name,
        "path": layer.path,  # the coverage table's text (fathom.seam.types.Layer.path)
        "parameters": {q: list(diag["ggn"][q].shape) for q in layer.qualified},
    }
    for kind in CURVATURE_FAMILIES:
        rec[f"{kind}_weight_trace"] = _sum([diag[kind][q] for q in w]) or 0.0
        rec[f"{kind}_bias_trace"] = _sum([diag[kind][q] for q in b])
    rec["ggn_weight_diag_max"] = max((float(diag["ggn"][q].max()) for q in w), default=None)
    rec["kfac"] = kfac
    rec["activation_effective_rank"] = kfac["A"]["effective_rank"] if kfac["covered"] else None
    rec["gradient_concentration"] = gradient_concentration(gram) if gram is not None else None
    return rec


def curvature_snapshot(model: nn.Module, x: torch.Tensor, labels: torch.Tensor) -> Snapshot:
    """All curvature quantities of ``model`` on the probe ``(x, labels)``; see :data:`DEFINITIONS`."""
    t0 = time.perf_counter()
    diag = exact_diagonals(model, x, labels)  # every family, chunked
    _, x, seam = prepared(model, x)
    pb = pull_back(seam, x)
    n, c = pb.logits.shape
    labels = probe_labels(labels.to(first_device(x)), n, c)
    dirs = OutputDirections.of(pb.logits, labels)
    layers, grams = _layer_records(seam, pb, dirs, diag)
    return Snapshot(_record(seam, pb.logits, labels, layers, grams, t0), diag, pb.logits)


def _layer_records(seam, pb, dirs: OutputDirections, diag: dict) -> tuple[list[dict], list]:
    """Every layer's record (traces, KFAC, per-example gradient Gram) and the Grams, from the
    pulled-back unit directions ``pb`` mixed by ``dirs`` (per example: ``(1/N) sum_i`` forms)."""
    n = pb.logits.shape[0]
    layers, grams = [], []
    for layer in seam.layers:
        calls, cots = pb.calls[layer.name], pb.cotangents[layer.name]
        fisher_cots = mix_cotangents(calls, cots, dirs.residual)
        gram = summed_gram(per_example_grams(layer, calls, fisher_cots, n), layer.weights)
        if gram is not None:
            grams.append(gram)
        if layer.kind in KFAC_KINDS and calls:
            ggn_w = diag["ggn"][layer.qualified[layer.params.index("weight")]]
            kfac = _kfac_record(layer, calls, cots, n, dirs, ggn_w)
        else:
            kfac = _not_kfac(layer)
        layers.append(_layer_record(layer, diag, kfac, gram))
    return layers, grams


def _record(
    seam,
    logits,
    labels,
    layers: list[dict],
    grams: list,
    t0: float,
    *,
    normalization: str = NORMALIZATION,
    definitions: dict | None = None,
    probe_loss: float | None = None,
    mismatch: dict | None = None,
) -> dict:
    """The snapshot's record: its mode and definitions, the probe, every layer's record and
    the totals over weights. ``probe_loss`` (the run's ``[loss]`` on the probe) and its own
    ``normalization``/``definitions`` come from :func:`loss_snapshot`; ``mismatch`` defaults
    to softmax cross-entropy's :func:`output_mismatch`."""
    record = {
        "dtype": str(logits.dtype).removeprefix("torch."),
        "mode": "dense evaluation: eval() (BatchNorm on running statistics), every branch at "
        "gain one, dropout off; spiking nets: surrogate Jacobians",
        "normalization": normalization,
        "definitions": DEFINITIONS if definitions is None else definitions,
        "estimator": {
            **dict.fromkeys(CURVATURE_FAMILIES, "exact"),
            "kfac": "exact factors (KFC / KFAC-expand convention)",
        },
        "samples": None,
        "seed": None,
        "probe_size": int(logits.shape[0]),
        "classes": int(logits.shape[1]),
        **({} if probe_loss is None else {"probe_loss": probe_loss}),
        "probe_ce_mean": float(cross_entropy(logits, labels).mean()),
        "probe_accuracy": float((logits.argmax(1) == labels).double().mean()),
        "coverage": dict(seam.coverage),
        "kfac_not_covered": [
            {"layer": la["name"], "type": la["type"]} for la in layers if not la["kfac"]["covered"]
        ],
        "layers": layers,
        "totals": {
            "scope": "sum over every layer's weights (biases excluded; a parameter whose name "
            "ends in 'bias' is a bias); off-diagonal blocks do not enter a trace",
            **{
                f"{label}_weight_trace": sum(la[f"{label}_weight_trace"] for la in layers)
                for label in CURVATURE_FAMILIES
            },
        },
        "gradient_concentration_all_weights": gradient_concentration(sum(grams)) if grams else None,
        "output_mismatch": output_mismatch(logits, labels) if mismatch is None else mismatch,
    }
    record["compute_s"] = time.perf_counter() - t0
    return record


def _loss_directions(
    loss: LabelLoss, logits: torch.Tensor, target: torch.Tensor
) -> OutputDirections:
    """The per-example directions of ``loss`` in the snapshot's ``(1/N) sum_i`` forms (KFAC's
    factors, the exact-GGN quadratic, the probe-mean gradient, the Gram's moments), for
    either reduction. With ``L = c sum_i L_i`` (:data:`fathom.losses.kinds.NORMALIZATION`:
    ``c = 1/N`` for the mean, ``1`` for the sum; ``L_i`` example ``i``'s own loss):

    * ``S_i = sqrt(N) [v_di]_d`` ``[N, C, D]``, ``v`` the exact GGN output directions of ``L``
      (:meth:`fathom.losses.kinds.Terms.directions`, ``sum_(d,i) J^T v v^T J`` the GGN of
      ``L``; ``v`` carries the reduction's weight), so ``(1/N) sum_i J_i^T S_i S_i^T J_i``
      is the GGN of ``L`` and KFAC's ``G (x) A`` approximates it: ``c sum_i`` of the
      examples' own GGNs, i.e. with the sum ``N`` times their ``(1/N) sum_i`` mean (each
      per-example term ``N`` times the mean's), exact on one example under either;
    * ``r_i = dL_i/dz_i = (1/c) dL/dz_i``, so ``g_i = J_i^T r_i`` is example ``i``'s own
      gradient under either reduction: the Gram is ``K_ij = g_i . g_j`` and ``(1/N) sum_i
      g_i`` the probe-mean gradient (``grad L`` for the mean, ``grad L / N`` for the sum);
      ``(1/N) sum_i g_i g_i^T`` is the empirical Fisher ``c sum_i g_i g_i^T`` for the mean
      and ``1/N`` of it for the sum.
    """
    terms = loss.loss.terms(logits, target)
    n = logits.shape[0]
    v = terms.directions(logits)  # [D, N, C]
    residual = scaled(terms.residual(logits), 1 / terms.scale)  # (1/c) dL/dz_i = dL_i/dz_i
    return OutputDirections(v.permute(1, 2, 0) * math.sqrt(n), residual)


def loss_snapshot(
    model: nn.Module, x: torch.Tensor, labels: torch.Tensor, loss: LabelLoss
) -> Snapshot:
    """Every curvature quantity of ``model`` on the probe ``(x, labels)`` under ``loss``
    (module docstring), integer labels meeting the loss through ``loss.target``: the exact
    diagonals of every family, KFAC and the per-example gradient Grams
    (:func:`_loss_directions`, either reduction); the output mismatch is softmax
    cross-entropy's and is not computed."""
    t0 = time.perf_counter()
    _, x64, seam = prepared(model, x)
    pb = pull_back(seam, x64)
    logits = pb.logits
    labels = probe_labels(labels.to(first_device(x64)), *logits.shape)
    target = loss.targets(labels, int(logits.shape[1]), torch.float64)
    diag = exact_diagonals(model, x, target, loss=loss.loss)
    layers, grams = _layer_records(seam, pb, _loss_directions(loss, logits, target), diag)
    mismatch = {
        "rho": None,
        "cheap_rho": None,
        "reason": "not computed: the output mismatch is defined for softmax cross-entropy",
    }
    record = _record(
        seam,
        logits,
        labels,
        layers,
        grams,
        t0,
        normalization=LOSS_NORMALIZATION,
        definitions={**DEFINITIONS, "loss": LOSS_DEFINITIONS[loss.loss.name]},
        probe_loss=float(loss.loss(logits, target)),
        mismatch=mismatch,
    )
    return Snapshot(record, diag, logits)
