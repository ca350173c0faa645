"""The field registry: every telemetry field declared once, with formula, units, scope, caveats.

A field's ``pattern`` names it with placeholders that expand per model and data:

* ``{layer}``: an instrumented layer's qualified module name (:mod:`fathom.seam`), e.g.
  ``stem``, ``blocks.0.res.branch``, ``head`` for the Ciresan MLP, ``blocks.1.body.branch.0``
  for a staged conv net, ``<model>`` for parameters the root module uses itself;
* ``{input}``: the name of an instrumented layer whose input is a hidden activation (it
  depends on parameters): the distribution of that input (for the Ciresan MLP the ReLU
  output feeding each body block and the head; the stem's input, the data, is excluded);
* ``{split}``: ``fit``, ``val``, ``test`` (those with examples);
* ``{cls}``: class index ``0 .. C-1``.

Scopes: ``probe`` (the fixed probe: the first ``probe_size`` fitting examples, dense
evaluation mode), ``split`` (a whole split, dense evaluation mode), ``state`` (parameters
and optimizer state only; no data). ``docs/metrics.md`` is generated from this module by
``python -m fathom.telemetry.docs``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache

from fathom.errors import FathomError
from fathom.telemetry.distributions import QUANTILES, quantile_key

NORM_QUANTILES: tuple[float, ...] = (0.1, 0.5, 0.9)  # of per-example gradient norms

FAMILIES: dict[str, str] = {
    "probe": "probe cross entropy and accuracy (one probe forward pass)",
    "activations": "distributions of each layer's input activations on the probe",
    "backprop": "distributions of dL_i/dz (gradients w.r.t. each layer's output) on the probe",
    "params": "parameter norms, displacement from init, momentum-buffer norms, update-to-weight ratios",
    "gradients": "norms of the probe mean gradient, per layer (weights and biases)",
    "moments": "fixed-probe per-example gradient moments and norm quantiles of each layer's weights",
    "scores": "per-class counts, per-class accuracy and confusion matrices on full splits",
}
ALIASES: dict[str, tuple[str, ...]] = {
    "all": tuple(FAMILIES),
    "cheap": ("probe", "activations", "params"),
}
SCOPES: tuple[str, ...] = ("probe", "split", "state", "training", "health_probe")
"""``training``: over an epoch's optimizer steps; ``health_probe``: the health instrument's
probe (the first ``health.probe_size`` validation examples). Both are used by the trainer's
own fields (:mod:`fathom.telemetry.trainer_fields`)."""


@dataclass(frozen=True)
class Field:
    """One declared field (or family of per-layer / per-class fields)."""

    pattern: str
    family: str
    formula: str
    units: str
    scope: str
    caveats: str = ""
    kind: str = "scalar"  # scalar | matrix (list of lists)

    @property
    def regex(self) -> re.Pattern[str]:
        return _compile(self.pattern)

    def expand(
        self,
        layers: Sequence[str],
        splits: Sequence[str],
        classes: int,
        inputs: Sequence[str] = (),
    ) -> list[str]:
        """Concrete names for a model with these layer names, input layers and classes."""
        names = [self.pattern]
        axes = {
            "{layer}": list(layers),
            "{input}": list(inputs),
            "{split}": list(splits),
            "{cls}": [str(c) for c in range(classes)],
        }
        for key, values in axes.items():
            names = (
                [n.replace(key, v, 1) for n in names for v in values]
                if any(key in n for n in names)
                else names
            )
        return names


@cache
def _compile(pattern: str) -> re.Pattern[str]:
    rx = re.escape(pattern)
    for key, sub in {
        "{layer}": r"[^/]+",
        "{input}": r"[^/]+",
        "{split}": r"fit|val|test",
        "{cls}": r"\d+",
    }.items():
        rx = rx.replace(re.escape(key), f"(?:{sub})")
    return re.compile(f"^{rx}$")


_PROBE_DEF = (
    "the probe: the first `probe_size` fitting examples, dense evaluation (gain one, dropout off)"
)
_DELTA = "delta_i = dL_i/dz_i, L_i the unaveraged cross entropy of example i, z the layer output"
_G = (
    "g_i = dL_i/dW of the layer's weights (every covered parameter whose name does not end in "
    "'bias', flattened and concatenated; biases excluded); Linear/Conv: g_i = sum_t delta_it a_it^T "
    "over positions t (a_it the input or unfolded patch), eval BatchNorm / LayerNorm: "
    "g_i(w) = sum_t delta_it * x_hat_it, other modules: exact torch.func vjp"
)


def _activation_fields() -> list[Field]:
    base = (
        "h = the layer's input on the probe (a hidden activation, e.g. the ReLU output feeding it), "
        "all N x units entries (a unit = every non-example entry)"
    )
    out = [
        Field(
            "probe/act/mean/{input}",
            "activations",
            f"mean(h); {base}",
            "activation units",
            "probe",
        ),
        Field(
            "probe/act/std/{input}",
            "activations",
            f"sqrt(mean((h - mean h)^2)) (population, 1/n); {base}",
            "activation units",
            "probe",
        ),
        Field(
            "probe/act/rms/{input}",
            "activations",
            f"sqrt(mean(h^2)); {base}",
            "activation units",
            "probe",
        ),
        Field(
            "probe/act/absmax/{input}",
            "activations",
            f"max |h|; {base}",
            "activation units",
            "probe",
        ),
        Field(
            "probe/act/zero_frac/{input}",
            "activations",
            f"#{{entries h == 0.0 exactly}} / (N x units); {base}",
            "fraction in [0, 1]",
            "probe",
            "a zero on this probe does not prove a permanently dead unit",
        ),
        Field(
            "probe/act/dead_frac/{input}",
            "activations",
            f"#{{units with h == 0.0 for every probe example}} / units; {base}",
            "fraction in [0, 1]",
            "probe",
            "dead on the probe only; other inputs may activate the unit",
        ),
    ]
    out += [
        Field(
            f"probe/act/{quantile_key(q)}/{{input}}",
            "activations",
            f"{q:g}-quantile of h (linear interpolation between order statistics); {base}",
            "activation units",
            "probe",
        )
        for q in QUANTILES
    ]
    return out


def _backprop_fields() -> list[Field]:
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


def _param_fields() -> list[Field]:
    return [
        Field(
            "param/weight_norm/{layer}",
            "params",
            "||W_l||_F, W_l = the layer's weights (non-bias parameters, jointly)",
            "parameter units",
            "state",
        ),
        Field(
            "param/bias_norm/{layer}",
            "params",
            "||b_l||_2 over the layer's bias parameters jointly",
            "parameter units",
            "state",
            "null for a layer without a bias",
        ),
        Field(
            "param/disp/{layer}",
            "params",
            "||W_l - W_l(epoch 0)||_F (weights only)",
            "parameter units",
            "state",
        ),
        Field(
            "param/disp_rel/{layer}",
            "params",
            "||W_l - W_l(0)||_F / ||W_l(0)||_F",
            "dimensionless",
            "state",
            "null when the initial weights are all zero",
        ),
        Field(
            "param/disp_total",
            "params",
            "sqrt(sum over every parameter tensor (weights and biases) of ||theta - theta(0)||^2)",
            "parameter units",
            "state",
        ),
        Field(
            "param/momentum_norm/{layer}",
            "params",
            "||buf_W||_F, the SGD momentum buffer of W_l",
            "gradient units",
            "state",
            "null before the first step or without momentum; a skipped SD branch keeps the buffer of its last computed step",
        ),
        Field(
            "param/update_ratio/{layer}",
            "params",
            "lr * ||buf_W||_F / ||W_l||_F: the last SGD update of W_l relative to its norm "
            "(for SGD with momentum, dampening 0 and no Nesterov, W <- W - lr * buf, so lr * buf is the last update)",
            "dimensionless",
            "state",
            "null without a momentum buffer, with Nesterov or dampening, or when ||W_l|| = 0",
        ),
    ]


def _gradient_fields() -> list[Field]:
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


def _moment_fields() -> list[Field]:
    g = f"{_G}; {_DELTA}; N = probe size; computed from Gram matrices K_ij = g_i.g_j, float64"
    quantiles = [
        Field(
            f"grad/pex/norm_{quantile_key(q)}/{{layer}}",
            "moments",
            f"{q:g}-quantile over the probe of ||g_i|| = sqrt(K_ii) (linear interpolation between "
            f"order statistics, torch.quantile's default); {g}",
            "nats per parameter unit",
            "probe",
            "a small median with a large max means few examples carry the gradient",
        )
        for q in NORM_QUANTILES
    ]
    quantiles.append(
        Field(
            "grad/pex/norm_max/{layer}",
            "moments",
            f"max_i ||g_i|| over the probe; {g}",
            "nats per parameter unit",
            "probe",
        )
    )
    core = [
        Field(
            "grad/pex/mean_sq_norm/{layer}",
            "moments",
            f"(1/N) sum_i ||g_i||^2 (one-row Linear: ||g_i||^2 = ||a_i||^2 ||delta_i||^2); {g}",
            "(nats per parameter unit)^2",
            "probe",
        ),
        Field(
            "grad/pex/diversity/{layer}",
            "moments",
            f"D = (1/N) sum_i ||g_i||^2 / ||m||^2, m = (1/N) sum_i g_i; {g}",
            "dimensionless, in [1, inf)",
            "probe",
            "D near N can mean one example dominates nearly vanishing gradients (a single non-zero g_i gives D = N); "
            "not a count of useful independent examples; small denominators limit late-training interpretation; null when m = 0",
        ),
        Field(
            "grad/pex/max_share/{layer}",
            "moments",
            f"max_i ||g_i||^2 / sum_i ||g_i||^2 (largest-example energy share); {g}",
            "fraction in [1/N, 1]",
            "probe",
            "null when every g_i = 0",
        ),
        Field(
            "grad/pex/participation/{layer}",
            "moments",
            f"(sum_i ||g_i||)^2 / sum_i ||g_i||^2 (norm participation); {g}",
            "effective count in [1, N]",
            "probe",
            "1 when one example carries all the norm; not a count of statistically independent samples; null when every g_i = 0",
        ),
        Field(
            "grad/pex/cos_cyclic_mean/{layer}",
            "moments",
            f"mean over i of cos(g_i, g_(i+1 mod N)) = K_i,i+1 / (||g_i|| ||g_i+1||), pairs with both norms > 0; {g}",
            "cosine in [-1, 1]",
            "probe",
            "neighbours in the fixed probe order, not consecutive optimization steps; null when no pair is defined",
        ),
        Field(
            "grad/pex/noise_scale/{layer}",
            "moments",
            f"tr(S) / ||m||^2 with S = (1/N) sum_i (g_i - m)(g_i - m)^T (plug-in covariance, 1/N): "
            f"the covariance-to-mean quadratic ratio, a plug-in simple gradient noise scale B_simple; equals D - 1; {g}",
            "examples",
            "probe",
            "a single non-zero g_i gives N - 1 without any critical batch size existing; null when m = 0",
        ),
        Field(
            "grad/pex/cov_along_mean/{layer}",
            "moments",
            f"m^T S m / ||m||^4 = (1/N) sum_i (m.g_i - ||m||^2)^2 / ||m||^4 (covariance along the mean direction); {g}",
            "dimensionless",
            "probe",
            "a single non-zero g_i gives N - 1; null when m = 0",
        ),
    ]
    return [*core, *quantiles]


def _probe_fields() -> list[Field]:
    return [
        Field(
            "probe/ce",
            "probe",
            f"(1/N) sum_i L_i, L_i = -log softmax(logits_i)[y_i]; {_PROBE_DEF}",
            "nats",
            "probe",
        ),
        Field(
            "probe/acc",
            "probe",
            f"(1/N) #{{argmax logits_i == y_i}}; {_PROBE_DEF}",
            "fraction in [0, 1]",
            "probe",
        ),
    ]


def _score_fields() -> list[Field]:
    dense = "whole split, dense evaluation (gain one, dropout off); argmax of logits, ties to the lowest index"
    return [
        Field(
            "split/{split}/class_count/{cls}",
            "scores",
            f"#{{examples with label c}}; {dense}",
            "examples",
            "split",
        ),
        Field(
            "split/{split}/class_acc/{cls}",
            "scores",
            f"C[c, c] / count_c; {dense}",
            "fraction in [0, 1]",
            "split",
            "null for an empty class; equal-weight averages over classes need not equal overall accuracy",
        ),
        Field(
            "split/{split}/confusion",
            "scores",
            f"C[t][p] = #{{label t, predicted p}} (rows true, columns predicted); {dense}",
            "examples",
            "split",
            kind="matrix",
        ),
    ]


FIELDS: tuple[Field, ...] = (
    *_probe_fields(),
    *_activation_fields(),
    *_backprop_fields(),
    *_param_fields(),
    *_gradient_fields(),
    *_moment_fields(),
    *_score_fields(),
)


def resolve_families(names: Iterable[str]) -> tuple[str, ...]:
    """Expand aliases (``all``, ``cheap``) and validate family names; registry order."""
    chosen: set[str] = set()
    for name in names:
        if name in ALIASES:
            chosen.update(ALIASES[name])
        elif name in FAMILIES:
            chosen.add(name)
        else:
            valid = ", ".join([*FAMILIES, *ALIASES])
            raise FathomError(
                f"unknown telemetry family {name!r}; valid families: {valid} (set telemetry.families to some of these)"
            )
    return tuple(f for f in FAMILIES if f in chosen)


def field_for(name: str) -> Field:
    """The registry entry a concrete field name belongs to (exactly one, or an error).

    Searches the telemetry families and the trainer's own fields.
    """
    from fathom.telemetry.trainer_fields import TRAINER_FIELDS

    hits = [f for f in (*FIELDS, *TRAINER_FIELDS) if f.regex.match(name)]
    if len(hits) != 1:
        raise FathomError(
            f"telemetry field {name!r} matches {len(hits)} registry entries; "
            "declare it exactly once in fathom.telemetry.registry"
        )
    return hits[0]


def expected_names(
    families: Iterable[str],
    layers: Sequence[str],
    splits: Sequence[str],
    classes: int,
    inputs: Sequence[str] = (),
) -> list[str]:
    """Every concrete field name the selected families produce for this model and data.

    ``layers``: the instrumented layers' names; ``inputs``: those whose input is a hidden
    activation (see the module docstring).
    """
    fams = set(families)
    return [
        n for f in FIELDS if f.family in fams for n in f.expand(layers, splits, classes, inputs)
    ]
