"""Depth-wise Lyapunov exponents, the Lyapunov regularizer, and gradient health."""

from fathom.dynamics.health import (
    ILL_CONDITIONED_KAPPA,
    RANK_FLOOR_RULE,
    SILENT_RATE,
    SpectrumSummary,
    firing_rates,
    input_output_jacobian,
    jacobian_health,
    spectrum_summary,
)
from fathom.dynamics.lyapunov import (
    LyapunovEstimate,
    eval_mode,
    jvp,
    lyapunov_exponents,
    model_lyapunov,
    random_tangents,
    rms,
)
from fathom.dynamics.regularizer import (
    DEFAULT_TARGET,
    DEFAULT_WEIGHT,
    StepRecord,
    global_norm,
    lyapunov_penalty,
    regularized_gradients,
)

__all__ = [
    "DEFAULT_TARGET",
    "DEFAULT_WEIGHT",
    "ILL_CONDITIONED_KAPPA",
    "RANK_FLOOR_RULE",
    "SILENT_RATE",
    "LyapunovEstimate",
    "SpectrumSummary",
    "StepRecord",
    "eval_mode",
    "firing_rates",
    "global_norm",
    "input_output_jacobian",
    "jacobian_health",
    "jvp",
    "lyapunov_exponents",
    "lyapunov_penalty",
    "model_lyapunov",
    "random_tangents",
    "regularized_gradients",
    "rms",
    "spectrum_summary",
]
