"""Fields the trainer itself writes into history rows (not selectable telemetry families).

Declared here once, with the registry's :class:`~fathom.telemetry.field.Field` shape, so
``field_for`` and ``docs/metrics.md`` cover them: the applied learning rate, the regularized
step's per-epoch means, and the health instrument (``[health]`` in a run config).
"""

from __future__ import annotations

from fathom.telemetry.field import Field

GROUPS: dict[str, str] = {
    "trainer": "progress, running loss, full-split evaluation, clocks and divergence of every run",
    "optimizer": "the learning rate actually applied (one owner: fathom.train.schedule)",
    "regularized": "per-epoch means of the regularized step (CE + λ_reg · P), training mode",
    "health": "dynamics health on the first health.probe_size validation examples",
}

_STEP = "mean over the epoch's optimizer steps (training mode: BatchNorm batch statistics)"
_HEALTH = "the first `health.probe_size` validation examples, eval mode, no gradient to parameters"
_JAC = "J = d logits / d input of one health-probe example, float64; σ over numerically nonzero singular values"


def _trainer() -> list[Field]:
    g = "trainer"
    dense = "whole split, dense evaluation (gain one, dropout off)"
    clock = "cumulative over the run's invocations (a resume continues the clock)"
    return [
        Field("epoch", g, "epochs completed (0 = before training)", "epochs", "state"),
        Field("step", g, "optimizer steps completed", "steps", "state"),
        Field(
            "train/loss_running",
            g,
            "(1/steps) Σ_steps L_b: mean training-batch loss over the epoch (the run's "
            "[loss], cross-entropy by default)",
            "nats (cross-entropy; the [loss]'s own units otherwise)",
            "training",
            "training mode (gates and dropout on), parameters moving; null at epoch 0",
        ),
        Field(
            "{split}/acc",
            g,
            f"(1/N) #{{argmax logits_i == y_i}}, ties to the lowest index; {dense}",
            "fraction in [0, 1]",
            "split",
        ),
        Field(
            "{split}/ce",
            g,
            f"(1/N) Σ_i -log softmax(logits_i)[y_i] (natural log); {dense}",
            "nats",
            "split",
        ),
        Field(
            "clock/training_s",
            g,
            f"training clock: optimizer steps only (synchronized on GPU); {clock}",
            "s",
            "state",
        ),
        Field(
            "clock/training_cpu_s",
            g,
            "CPU training clock: the training thread's CPU time (time.thread_time) of the "
            f"optimizer steps; {clock}",
            "s",
            "state",
            "one thread only (torch's intra-op workers and GPU time not counted; with one "
            "torch thread it is the steps' whole CPU work); time waiting for a "
            "core held by another job is not counted, so on a shared machine it is the clock "
            "to compare; absent from histories written before it existed",
        ),
        Field("clock/evaluation_s", g, f"full-split evaluations; {clock}", "s", "state"),
        Field("clock/telemetry_s", g, f"epoch-boundary instruments; {clock}", "s", "state"),
        Field(
            "clock/elapsed_s",
            g,
            f"elapsed wall time of the invocations, set-up included; {clock}",
            "s",
            "state",
        ),
        Field(
            "clock/unix_s",
            g,
            "Unix time (UTC seconds since 1970-01-01, time.time()) when the row was written: "
            "the run's own timestamp, the wall time of every export",
            "s since epoch",
            "state",
            "a wall clock: not monotonic across machines; absent from histories written "
            "before it existed (exports then fall back to clock/elapsed_s, and say so)",
        ),
        Field(
            "diverged",
            g,
            "true on the row of the epoch whose loss or parameters became non-finite (the last row)",
            "boolean",
            "training",
            "absent on every other row; that row carries no evaluation fields",
        ),
    ]


def _clipping() -> list[Field]:
    """Gradient clipping (``optim.clip_norm``): the pre-clip norms of the epoch's steps."""
    g = "optimizer"
    norm = "||g_b||_2 = sqrt(Σ_p ||∂L_b/∂p||²) over the step's parameters with a gradient, before clipping"
    why = "only with optim.clip_norm; a skipped branch's parameters have no gradient and are not in it"
    return [
        Field(
            "optim/grad_norm_mean", g, f"(1/steps) Σ_b {norm}", "gradient units", "training", why
        ),
        Field("optim/grad_norm_max", g, f"max_b {norm}", "gradient units", "training", why),
        Field(
            "optim/clipped_frac",
            g,
            "(1/steps) #{b : ||g_b||_2 > clip_norm}: the steps whose gradient was scaled by "
            "clip_norm / ||g_b||_2",
            "fraction in [0, 1]",
            "training",
            why,
        ),
    ]


def _configured_loss() -> list[Field]:
    """A run with a ``[loss]`` table: its loss over each split (``{split}/ce`` stays the
    cross-entropy of the logits)."""
    return [
        Field(
            "{split}/loss",
            "trainer",
            "the [loss] over the whole split as one batch: (1/M) Σ_ip m_ip l_ip (mean; M the "
            "valid terms, n C entries for mse and bce_with_logits with one-hot targets) or "
            "Σ_ip m_ip l_ip (sum), float64; whole split, dense evaluation",
            "the loss's units (nats for the cross-entropies, logit² for mse)",
            "split",
            "runs with a [loss] table other than the default only (fathom.losses.labels); "
            "val/loss selects such a run's checkpoint and ranks its tuning grid "
            "(fathom.config.run.objective_field)",
        ),
    ]


def _language_model() -> list[Field]:
    """A language-model run's scores (``{split}/acc`` and ``{split}/ce`` are then per token)."""
    return [
        Field(
            "{split}/ppl",
            "trainer",
            "exp({split}/ce): perplexity per token, with {split}/ce = (1/M) Σ_(n,t) "
            "-log softmax(logits_nt)[y_nt] over the split's M token positions (a "
            "language model's {split}/acc is then the fraction of positions whose argmax is "
            "the next token); whole split, dense evaluation",
            "tokens (effective vocabulary)",
            "split",
            "language-model runs only (model.kind gpt); the data.info unigram_val_ppl is the "
            "baseline a model must beat",
        ),
    ]


def _regularized() -> list[Field]:
    g = "regularized"
    return [
        Field("train/ce", g, "(1/N) Σ_batches n_b · CE_b (per example)", "nats", "training"),
        Field(
            "train/acc",
            g,
            "(1/N) #{argmax logits == label} over the epoch's batches",
            "fraction in [0, 1]",
            "training",
            "training mode, parameters moving during the epoch",
        ),
        Field(
            "train/penalty",
            g,
            f"P = mean_b (λ̂_b - λ_target)^2 on the sub-batch; {_STEP}",
            "nats^2 per layer^2",
            "training",
            "null when λ_reg = 0 (not in the loss)",
        ),
        Field(
            "train/lyapunov",
            g,
            f"mean_b λ̂_b on the sub-batch; {_STEP}",
            "nats per block",
            "training",
            "null when λ_reg = 0",
        ),
        Field(
            "grad_norm/total",
            g,
            f"||∇CE + ∇(λ_reg P)||_2 over all parameters; {_STEP}",
            "gradient units",
            "training",
        ),
        Field("grad_norm/ce", g, f"||∇CE||_2; {_STEP}", "gradient units", "training"),
        Field(
            "grad_norm/penalty",
            g,
            f"||∇(λ_reg P)||_2; {_STEP}",
            "gradient units",
            "training",
            "null when λ_reg = 0",
        ),
    ]


def _lyapunov() -> list[Field]:
    """The health instrument's depth-wise Lyapunov exponents."""
    g = "health"
    return [
        Field(
            "lyap/maximal",
            g,
            f"mean over {_HEALTH} of the maximal depth-wise Lyapunov exponent λ̂",
            "nats per block",
            "health_probe",
            "tangents from a per-epoch seeded generator",
        ),
        Field(
            "lyap/blocks",
            g,
            "per block: mean over health-probe examples of log(||J_l v|| / ||v||)",
            "nats",
            "health_probe",
            "a list, one value per block",
            kind="list",
        ),
    ]


def _jacobian() -> list[Field]:
    """The health instrument's input-output Jacobian spectrum."""
    g = "health"
    return [
        Field(
            "jac/sigma_max",
            g,
            f"median over health-probe examples of σ_max(J); {_JAC}",
            "logit / input units",
            "health_probe",
        ),
        Field(
            "jac/sigma_min",
            g,
            f"median of the smallest numerically nonzero σ(J); {_JAC}",
            "logit / input units",
            "health_probe",
        ),
        Field(
            "jac/kappa",
            g,
            f"median of σ_max / σ_min; {_JAC}",
            "ratio",
            "health_probe",
            "null when no singular value is numerically nonzero",
        ),
        Field(
            "jac/stable_rank", g, "median of ||J||_F^2 / σ_max^2", "dimensionless", "health_probe"
        ),
        Field(
            "jac/numerical_rank",
            g,
            "median count of numerically nonzero σ(J)",
            "count",
            "health_probe",
        ),
        Field("jac/full_rank", g, "min(classes, input dimension)", "count", "health_probe"),
        Field("jac/examples", g, "number of health-probe examples", "examples", "health_probe"),
        Field(
            "jac/rank_floor_rule",
            g,
            "the rule deciding 'numerically nonzero'",
            "text",
            "health_probe",
            kind="text",
        ),
        Field(
            "jac/ill_conditioned",
            g,
            "jac/kappa > ILL_CONDITIONED_KAPPA (1e6)",
            "boolean",
            "health_probe",
            "null when κ is undefined",
        ),
    ]


def _spikes() -> list[Field]:
    """The health instrument's spike rates of LIF layers."""
    g = "health"
    return [
        Field(
            "spike/rates",
            g,
            "per LIF layer: mean spike indicator over health-probe examples, time and units",
            "spikes per unit per timestep",
            "health_probe",
            "null for an ANN",
            kind="map",
        ),
        Field(
            "spike/silent_layers",
            g,
            "LIF layers whose rate is below SILENT_RATE",
            "layer names",
            "health_probe",
            "null for an ANN",
            kind="list",
        ),
    ]


TRAINER_FIELDS: tuple[Field, ...] = (
    *_trainer(),
    Field(
        "optim/lr",
        "optimizer",
        "optim.lr · m(t) at the epoch's last step, t = epoch - 1 + (steps - 1) / steps",
        "learning rate",
        "training",
        "null at epoch 0 (no step yet); read from the epoch plan, the one channel of the rate "
        "(param_group['lr'] is written only on a torch optimizer's path)",
    ),
    *_clipping(),
    *_configured_loss(),
    *_language_model(),
    *_regularized(),
    *_lyapunov(),
    *_jacobian(),
    *_spikes(),
)
