"""The gradient families' fields: backpropagated signals, probe mean gradients and the
moments of per-example weight gradients (declared here, collected by
:mod:`fathom.telemetry.registry`).
"""

from __future__ import annotations

from fathom.telemetry.field import QUANTILES, Field, quantile_key

NORM_QUANTILES: tuple[float, ...] = (0.1, 0.5, 0.9)  # of per-example gradient norms

_DELTA = "delta_i = dL_i/dz_i, L_i the unaveraged cross entropy of example i, z the layer output"
_G = (
    "g_i = dL_i/dW of the layer's weights (every covered parameter whose name does not end in "
    "'bias', flattened and concatenated; biases excluded); Linear/Conv: g_i = sum_t delta_it a_it^T "
    "over positions t (a_it the input or unfolded patch), eval BatchNorm / LayerNorm: "
    "g_i(w) = sum_t delta_it * x_hat_it, other modules: exact torch.func vjp"
)
_GRAM = f"{_G}; {_DELTA}; N = probe size; computed from Gram matrices K_ij = g_i.g_j, float64"


def backprop_fields() -> list[Field]:
    base = f"all N x units entries of delta; {_DELTA}"
    units = "nats per unit of z"
    out = [
        Field("probe/delta/mean/{layer}", "backprop", f"mean(delta); {base}", units, "probe"),
        Field(
            "probe/delta/std/{layer}",
            "backprop",
            f"population std of delta (1/n); {base}",
            units,
            "probe",
        ),
        Field(
            "probe/delta/rms/{layer}",
            "backprop",
            f"sqrt(mean(delta^2)); {base}",
            units,
            "probe",
            "per-example (unaveraged) signals: a training step's gradient uses delta / batch size",
        ),
        Field("probe/delta/absmax/{layer}", "backprop", f"max |delta|; {base}", units, "probe"),
    ]
    out += [
        Field(
            f"probe/delta/{quantile_key(q)}/{{layer}}",
            "backprop",
            f"{q:g}-quantile of delta (linear interpolation); {base}",
            units,
            "probe",
        )
        for q in QUANTILES
    ]
    return out


def gradient_fields() -> list[Field]:
    return [
        Field(
            "grad/mean/weight_norm/{layer}",
            "gradients",
            f"||m||_F, m = (1/N) sum_i g_i = d(mean_i L_i)/dW_l; ||m||^2 = (1/N^2) sum_ij (a_i.a_j)(delta_i.delta_j); {_G}",
            "nats per parameter unit",
            "probe",
        ),
        Field(
            "grad/mean/bias_norm/{layer}",
            "gradients",
            f"||(1/N) sum_i g_i(b)||_2 = ||d(mean_i L_i)/db_l|| over the layer's biases "
            f"(Linear: g_i(b) = sum_t delta_it); {_DELTA}",
            "nats per parameter unit",
            "probe",
            "null for a layer without a bias",
        ),
    ]


def moment_fields() -> list[Field]:
    """Moments of the per-example weight gradients g_i over the probe (from Gram matrices)."""
    return [
        Field(
            "grad/pex/mean_sq_norm/{layer}",
            "moments",
            f"(1/N) sum_i ||g_i||^2 (one-row Linear: ||g_i||^2 = ||a_i||^2 ||delta_i||^2); {_GRAM}",
            "(nats per parameter unit)^2",
            "probe",
        ),
        Field(
            "grad/pex/diversity/{layer}",
            "moments",
            f"D = (1/N) sum_i ||g_i||^2 / ||m||^2, m = (1/N) sum_i g_i; {_GRAM}",
            "dimensionless, in [1, inf)",
            "probe",
            "D near N can mean one example dominates nearly vanishing gradients (a single non-zero g_i gives D = N); "
            "not a count of useful independent examples; small denominators limit late-training interpretation; null when m = 0",
        ),
        Field(
            "grad/pex/max_share/{layer}",
            "moments",
            f"max_i ||g_i||^2 / sum_i ||g_i||^2 (largest-example energy share); {_GRAM}",
            "fraction in [1/N, 1]",
            "probe",
            "null when every g_i = 0",
        ),
        Field(
            "grad/pex/participation/{layer}",
            "moments",
            f"(sum_i ||g_i||)^2 / sum_i ||g_i||^2 (norm participation); {_GRAM}",
            "effective count in [1, N]",
            "probe",
            "1 when one example carries all the norm; not a count of statistically independent samples; null when every g_i = 0",
        ),
        Field(
            "grad/pex/cos_cyclic_mean/{layer}",
            "moments",
            f"mean over i of cos(g_i, g_(i+1 mod N)) = K_i,i+1 / (||g_i|| ||g_i+1||), pairs with both norms > 0; {_GRAM}",
            "cosine in [-1, 1]",
            "probe",
            "neighbours in the fixed probe order, not consecutive optimization steps; null when no pair is defined",
        ),
        Field(
            "grad/pex/noise_scale/{layer}",
            "moments",
            f"tr(S) / ||m||^2 with S = (1/N) sum_i (g_i - m)(g_i - m)^T (plug-in covariance, 1/N): "
            f"the covariance-to-mean quadratic ratio, a plug-in simple gradient noise scale B_simple; equals D - 1; {_GRAM}",
            "examples",
            "probe",
            "a single non-zero g_i gives N - 1 without any critical batch size existing; null when m = 0",
        ),
        Field(
            "grad/pex/cov_along_mean/{layer}",
            "moments",
            f"m^T S m / ||m||^4 = (1/N) sum_i (m.g_i - ||m||^2)^2 / ||m||^4 (covariance along the mean direction); {_GRAM}",
            "dimensionless",
            "probe",
            "a single non-zero g_i gives N - 1; null when m = 0",
        ),
    ]


def norm_quantile_fields() -> list[Field]:
    """Quantiles and maximum of the per-example gradient norms ||g_i|| over the probe."""
    fields = [
        Field(
            f"grad/pex/norm_{quantile_key(q)}/{{layer}}",
            "moments",
            f"{q:g}-quantile over the probe of ||g_i|| = sqrt(K_ii) (linear interpolation between "
            f"order statistics, torch.quantile's default); {_GRAM}",
            "nats per parameter unit",
            "probe",
            "a small median with a large max means few examples carry the gradient",
        )
        for q in NORM_QUANTILES
    ]
    fields.append(
        Field(
            "grad/pex/norm_max/{layer}",
            "moments",
            f"max_i ||g_i|| over the probe; {_GRAM}",
            "nats per parameter unit",
            "probe",
        )
    )
    return fields
