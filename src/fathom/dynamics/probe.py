"""The health instrument: λ̂, the float64 Jacobian spectrum and firing rates on the health probe.

On the *health probe* (the trainer passes the first ``health.probe_size`` *validation*
examples; not the telemetry probe, the first ``telemetry.probe_size`` fitting examples,
which bare "probe" and the ``probe/*`` fields always mean), in eval mode, without touching parameters, running statistics or the
training RNG:

* ``lyap/maximal``: mean over health-probe examples of the maximal depth-wise Lyapunov exponent λ̂
  (:func:`fathom.dynamics.lyapunov.model_lyapunov`, tangents from a generator seeded by the
  caller); ``lyap/blocks``: its per-block log gains, averaged over examples;
* ``jac/*``: :func:`fathom.dynamics.health.jacobian_health` of the network;
* ``spike/rates``, ``spike/silent_layers``: :func:`fathom.dynamics.health.firing_rates`
  (``None`` for an ANN).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fathom.dynamics.health import firing_rates, jacobian_health
from fathom.dynamics.lyapunov import model_lyapunov
from fathom.models.prep import network_and_input

HEALTH_KEYS: tuple[str, ...] = (
    "lyap/maximal",
    "lyap/blocks",
    "jac/sigma_max",
    "jac/sigma_min",
    "jac/kappa",
    "jac/stable_rank",
    "jac/numerical_rank",
    "jac/full_rank",
    "jac/examples",
    "jac/rank_floor_rule",
    "jac/ill_conditioned",
    "spike/rates",
    "spike/silent_layers",
)


def health_row(model: nn.Module, probe: torch.Tensor, seed: int) -> dict[str, Any]:
    """The health fields on ``probe`` (raw dataset examples; the model's prep is applied)."""
    net, x = network_and_input(model, probe)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        est = model_lyapunov(net, x, generator=gen)
    row: dict[str, Any] = {
        "lyap/maximal": float(est.maximal.mean()),
        "lyap/blocks": [float(v) for v in est.log_gains[:, :, 0].mean(0)],
    }
    row.update(jacobian_health(net, x))
    rates = firing_rates(net, x)
    row["spike/rates"] = {r["layer"]: r["rate"] for r in rates} if rates else None
    row["spike/silent_layers"] = [r["layer"] for r in rates if r["silent"]] if rates else None
    return row
