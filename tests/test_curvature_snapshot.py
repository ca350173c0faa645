"""curvature_snapshot's diagonals come from exact_diagonals (one accumulation loop, chunked).

Two independent references for every zoo model and probe: the float64 ``vmap(jacrev)``
brute force of ``test_curvature_zoo``, and the snapshot's old whole-probe loop (one
pull-back of the ``C`` unit directions for all examples, ``layer_sums`` per layer), kept
here as it was. The chunk budget is shrunk so the probe is split into chunks of every size
from one example up, and the number of chunks is checked, so the chunked path is the one
under test.
"""

from __future__ import annotations

import math
from unittest import mock

import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

import fathom.curvature.exact as exact
from fathom.curvature.exact import CURVATURE_FAMILIES, OutputDirections, layer_sums
from fathom.curvature.probe import probe_labels, pull_back
from fathom.curvature.snapshot import curvature_snapshot
from fathom.curvature.twin import prepared
from model_zoo import make
from test_curvature_zoo import RTOL, ZOO, brute_force, relative_error

torch.set_num_threads(1)
IDS = [c["id"] for c in ZOO]


def whole_probe_diagonals(model, x, y) -> dict[str, dict[str, torch.Tensor]]:
    """The snapshot's accumulation before it called ``exact_diagonals``: the whole probe at
    once, ``diag = (1/N) sum_i sum_k (J_i^T v_ik)^2`` per family from one pull-back."""
    model64, x, seam = prepared(model, x)
    pb = pull_back(seam, x)
    n, c = pb.logits.shape
    dirs = OutputDirections.of(pb.logits, probe_labels(y, n, c))
    diag = {k: {} for k in CURVATURE_FAMILIES}
    for layer in seam.layers:
        sums = layer_sums(layer, pb.calls[layer.name], pb.cotangents[layer.name], n, dirs)
        for local, q in zip(layer.params, layer.qualified, strict=True):
            for kind in CURVATURE_FAMILIES:
                diag[kind][q] = sums[local][kind] / n
    names = [name for name, _ in model64.named_parameters()]
    return {k: {q: diag[k][q] for q in names} for k in CURVATURE_FAMILIES}


def _snapshot_in_chunks(model, x, y, chunk: int):
    """The snapshot with the chunk budget set so the largest materialized layer takes
    ``chunk`` examples per chunk; returns it and the number of chunked pull-backs."""
    _, x64, seam = prepared(model, x)
    _, per_chunk = exact._layout(seam, x64, exact.Plan())
    budget = max(1, exact._ELEMENTS // per_chunk) * chunk  # elements per example x chunk
    pulls = []

    def counted(*args, **kwargs):
        pulls.append(args[1].shape[0])
        return pull_back(*args, **kwargs)

    with (
        mock.patch.object(exact, "_ELEMENTS", budget),
        mock.patch.object(exact, "pull_back", counted),
    ):
        snap = curvature_snapshot(model, x, y)
    return snap, pulls


@settings(max_examples=12, deadline=None)
@given(
    case_id=st.sampled_from(IDS),
    n=st.integers(1, 6),
    chunk=st.integers(1, 6),
    seed=st.integers(0, 3),
)
@example(case_id="residual_cnn", n=5, chunk=2, seed=0)
@example(case_id="transformer", n=4, chunk=1, seed=1)
def test_snapshot_diagonals_are_exact_diagonals_chunked(case_id, n, chunk, seed) -> None:
    case = next(c for c in ZOO if c["id"] == case_id)
    model, x, y = make(case, n=n, seed=seed)
    snap, pulls = _snapshot_in_chunks(model, x, y, chunk)
    if pulls and max(pulls) < n:  # a materialized layer: the probe went in chunks
        assert len(pulls) == math.ceil(n / max(pulls)) and sum(pulls) == n
    old = whole_probe_diagonals(model, x, y)
    brute = brute_force(model, x, y)
    bad = []
    for kind in CURVATURE_FAMILIES:
        assert list(snap.diagonals[kind]) == list(old[kind])
        for name, got in snap.diagonals[kind].items():
            vs_old = relative_error(got, old[kind][name])
            vs_brute = relative_error(got, brute[kind][name])
            if not (vs_old <= 1e-12 and vs_brute <= RTOL):
                bad.append(f"{kind}/{name}: {vs_old:.3g} vs old path, {vs_brute:.3g} vs brute")
    assert not bad, "\n".join(bad)


def test_snapshot_traces_are_the_sums_of_its_diagonals() -> None:
    """The record's per-layer and total traces name each family once (its
    ``CURVATURE_FAMILIES`` name) and sum the returned diagonals."""
    case = next(c for c in ZOO if c["id"] == "residual_cnn")
    model, x, y = make(case, n=4)
    snap = curvature_snapshot(model, x, y)
    for kind in CURVATURE_FAMILIES:
        total = 0.0
        for layer in snap.record["layers"]:
            weights = [q for q in layer["parameters"] if not q.endswith("bias")]
            want = sum(float(snap.diagonals[kind][q].sum()) for q in weights)
            assert layer[f"{kind}_weight_trace"] == want or math.isclose(
                layer[f"{kind}_weight_trace"], want, rel_tol=1e-12
            )
            total += layer[f"{kind}_weight_trace"]
        assert math.isclose(snap.record["totals"][f"{kind}_weight_trace"], total, rel_tol=1e-12)
