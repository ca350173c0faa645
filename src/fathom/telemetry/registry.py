"""The field registry: every telemetry field declared once, with formula, units, scope, caveats.

A field's ``pattern`` names it with placeholders that expand per model and data:

* ``{layer}``: an instrumented layer's qualified module name (:mod:`fathom.seam`), e.g.
  ``stem``, ``blocks.0.res.branch``, ``head`` for the Ciresan MLP, ``blocks.1.body.branch.0``
  for a staged conv net, ``<model>`` for parameters the root module uses itself;
* ``{input}``: the name of an instrumented layer whose input is a hidden activation (it
  depends on parameters): the distribution of that input (for the Ciresan MLP the ReLU
  output feeding each body block and the head; the stem's input, the data, is excluded);
* ``{block}``: a residual block's qualified module name (every
  :class:`fathom.depth.SkippableResidual`, :mod:`fathom.telemetry.blocks`), e.g.
  ``blocks.0`` of a GPT, ``blocks.1.res`` of a residual Ciresan MLP;
* ``{split}``: ``fit``, ``val``, ``test`` (those with examples);
* ``{cls}``: class index ``0 .. C-1``.

Scopes: ``probe`` (the fixed probe: the first ``probe_size`` fitting examples, dense
evaluation mode), ``split`` (a whole split, dense evaluation mode), ``state`` (parameters
and optimizer state only; no data). ``docs/metrics.md`` is generated from this module by
``python -m fathom.telemetry.docs``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from fathom.errors import FathomError, with_suggestion
from fathom.telemetry.field import QUANTILES, Field, quantile_key
from fathom.telemetry.gradient_fields import (
    backprop_fields,
    gradient_fields,
    moment_fields,
    norm_quantile_fields,
)
from fathom.telemetry.trainer_fields import TRAINER_FIELDS

FAMILIES: dict[str, str] = {
    "probe": "probe cross entropy and accuracy (one probe forward pass)",
    "activations": "distributions of each layer's input activations on the probe; each residual block's relative update",
    "backprop": "distributions of dL_i/dz (gradients w.r.t. each layer's output) on the probe",
    "params": "parameter norms, displacement from init, momentum-buffer norms, update-to-weight ratios",
    "gradients": "norms of the probe mean gradient, per layer (weights and biases) and per residual block",
    "moments": "fixed-probe per-example gradient moments and norm quantiles of each layer's weights",
    "scores": "per-class counts, per-class accuracy and confusion matrices on full splits",
}
ALIASES: dict[str, tuple[str, ...]] = {
    "all": tuple(FAMILIES),
    "cheap": ("probe", "activations", "params"),
}

_PROBE_DEF = (
    "the probe: the first `probe_size` fitting examples, dense evaluation (gain one, dropout off)"
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


UPDATE = "probe/block/update_rel"
GRAD = "grad/block/mean_norm"
"""The per-block fields' prefixes (the block's name follows)."""


def _block_fields() -> list[Field]:
    """One field per residual block (:mod:`fathom.telemetry.blocks`, where the formulas are
    defined once)."""
    block = (
        "block b = a SkippableResidual, y = s(x) + g_b f(x) in dense evaluation (s the bypass, "
        "f the branch, g_b the evaluation gain)"
    )
    return [
        Field(
            f"{UPDATE}/{{block}}",
            "activations",
            f"||g_b f(X)||_F / ||s(X)||_F, X = the block's input over every probe example and "
            f"every entry (every token position of a language model), float64 sums; {block}",
            "dimensionless",
            "probe",
            "null for a block not called on the probe or with ||s(X)|| = 0",
        ),
        Field(
            f"{GRAD}/{{block}}",
            "gradients",
            "sqrt(sum over the block's parameters theta (block.parameters(), each once) of "
            f"||d(mean_i L_i)/d theta||_F^2), L_i example i's loss; {block}",
            "nats per parameter unit",
            "probe",
            "null for a block without parameters that require gradients",
        ),
    ]


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
            "(for SGD with momentum, dampening 0 and no Nesterov, W <- W - lr * buf, so lr * buf is the last update); "
            "lr is the rate that update applied: the trainer's plan (optim/lr), or param_group['lr'] "
            "when Instruments.observe is given none",
            "dimensionless",
            "state",
            "null without a momentum buffer, with Nesterov or dampening, or when ||W_l|| = 0",
        ),
    ]


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
    *backprop_fields(),
    *_param_fields(),
    *gradient_fields(),
    *_block_fields(),
    *moment_fields(),
    *norm_quantile_fields(),
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
            unknown = with_suggestion(
                f"unknown telemetry family {name!r}", name, [*FAMILIES, *ALIASES]
            )
            raise FathomError(
                f"{unknown}; valid families: {valid} (families= of fathom.Instruments, "
                "telemetry.families of a config)"
            )
    return tuple(f for f in FAMILIES if f in chosen)


def field_for(name: str) -> Field:
    """The registry entry a concrete field name belongs to (exactly one, or an error).

    Searches the telemetry families and the trainer's own fields.
    """
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
    blocks: Sequence[str] = (),
) -> list[str]:
    """Every concrete field name the selected families produce for this model and data.

    ``layers``: the instrumented layers' names; ``inputs``: those whose input is a hidden
    activation; ``blocks``: the residual blocks' names (see the module docstring).
    """
    fams = set(families)
    return [
        n
        for f in FIELDS
        if f.family in fams
        for n in f.expand(layers, splits, classes, inputs, blocks)
    ]
