"""Validated configuration: pydantic models, TOML loading, clear errors.

A run is one :class:`RunConfig`. Unknown keys are rejected everywhere (``extra="forbid"``),
so a typo never silently falls back to a default.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    Strict,
    ValidationError,
    model_serializer,
    model_validator,
)

from fathom.config.limits import MAX_EPOCHS, MAX_EXAMPLES, SEED_BOUND
from fathom.config.live import LiveConfig
from fathom.config.model_kinds import DEFAULT_KIND, MODEL_KINDS, ModelSpec, model_kind
from fathom.config.models import (
    EVERY_FIELD,
    SPLITS,
    TEXT_DATASETS,
    Bool,
    DataConfig,
    Float,
    Int,
    ModelConfig,
    Name,
    PythonModelConfig,
    Split,
    StagedConvConfig,
    _Strict,
    omit_unset_additions,
)
from fathom.config.tomlfile import load_toml, parse_toml
from fathom.errors import FathomError, table_given_a_value, unknown_key, validation_message

__all__ = [
    "MODEL_KINDS",
    "DataConfig",
    "LiveConfig",
    "LossConfig",
    "ModelConfig",
    "OptimConfig",
    "PythonModelConfig",
    "RunConfig",
    "StagedConvConfig",
    "load_toml",
    "parse_toml",
]


class ScheduleConfig(_Strict):
    """The learning-rate multiplier ``m(t)``; ``t`` = fractional epochs done, ``E`` = epochs.

    * ``constant``: ``m = 1``;
    * ``piecewise``: linear interpolation of ``points = [[epoch, m], ...]`` (constant outside);
    * ``warmup_linear`` / ``warmup_cosine``: ``m`` rises linearly from ``warmup_start`` to 1
      over ``warmup_epochs``, then falls to ``final`` at ``E``, linearly or as
      ``final + (1 - final) (1 + cos(pi u)) / 2`` with ``u = (t - w) / (E - w)``;
    * ``exponential``: ``m = gamma ** floor(t)`` (shrinkage once per epoch).

    Evaluated per step at ``t = epoch - 1 + i / steps`` (:mod:`fathom.train.schedule`).
    """

    kind: Literal["constant", "piecewise", "warmup_linear", "warmup_cosine", "exponential"] = (
        "constant"
    )
    points: tuple[tuple[Float, Float], ...] | None = None
    warmup_epochs: Float = Field(default=0.0, ge=0)
    warmup_start: Float = Field(default=0.0, ge=0)
    final: Float = Field(default=0.0, ge=0)
    gamma: Float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _fields(self) -> ScheduleConfig:
        if self.kind == "piecewise":
            v = self.points
            if not v:
                raise ValueError("schedule 'piecewise' needs points = [[epoch, multiplier], ...]")
            epochs = [e for e, _ in v]
            if epochs != sorted(epochs) or any(m < 0 for _, m in v):
                raise ValueError("schedule points need increasing epochs and multipliers >= 0")
        elif self.points is not None:
            raise ValueError(
                f"schedule.points is only used with kind 'piecewise', not {self.kind!r}"
            )
        if self.kind == "exponential" and self.gamma is None:
            raise ValueError("schedule 'exponential' needs gamma (the per-epoch factor)")
        if self.kind != "exponential" and self.gamma is not None:
            raise ValueError("schedule.gamma is only used with kind 'exponential'")
        return self


class OptimConfig(_Strict):
    """The optimizer (SGD with momentum / Nesterov, or AdamW), its rate and its schedule.

    ``weight_decay``: L2 added to the gradient for SGD, decoupled (``p -= lr * wd * p``) for
    AdamW. ``clip_norm``: each step's gradient is scaled by ``min(1, clip_norm / ||g||_2)``
    (``torch.nn.utils.clip_grad_norm_``, the norm over every parameter with a gradient) before
    the update; the pre-clip norms are recorded per epoch (``optim/grad_norm_*``). The step
    then runs eagerly through ``loss.backward()``. A skipped branch (``grad is None``) gets no update of any kind: no momentum, no
    moments, no step count, no decay.
    """

    name: Literal["sgd", "adamw"] = "sgd"
    lr: Float = Field(default=0.01, gt=0)
    momentum: Float = Field(default=0.9, ge=0, lt=1)
    nesterov: Bool = False
    betas: tuple[Float, Float] = (0.9, 0.999)
    eps: Float = Field(default=1e-8, gt=0)
    weight_decay: Float = Field(default=0.0, ge=0)
    clip_norm: Float | None = Field(default=None, gt=0)
    batch_size: Int = Field(default=64, gt=0, le=MAX_EXAMPLES)
    epochs: Int = Field(default=100, gt=0, le=MAX_EPOCHS)
    # torch's SGD kernel. "fused" (one kernel over every parameter) is ~2x cheaper on the CPU than
    # "foreach" (which there falls back to per-tensor ops) but agrees only to rounding (its vector
    # tails use FMA): as the default it flipped a near-tie in the quick study's LR selection and
    # with it verdicts, so the default stays "foreach" (BENCHMARKS.md); choose "fused" per run
    impl: Literal["foreach", "for-loop", "fused"] = "foreach"
    schedule: ScheduleConfig = ScheduleConfig()

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> Any:
        return omit_unset_additions(handler(self), self, ("clip_norm",), info)

    @model_validator(mode="after")
    def _combination(self) -> OptimConfig:
        if self.nesterov and (self.name != "sgd" or self.momentum == 0):
            raise ValueError("nesterov needs optimizer 'sgd' with momentum > 0")
        if not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"AdamW betas must lie in [0, 1), got {list(self.betas)}")
        return self


class RegularizerConfig(_Strict):
    """The Lyapunov penalty (:mod:`fathom.dynamics.regularizer`): ``L = CE + weight · P``.

    ``weight = 0`` trains on CE alone through the same step (the vanilla arm), so both arms
    record the same per-step fields. Needs a model with ``lyapunov_blocks()``.
    """

    kind: Literal["lyapunov"] = "lyapunov"
    weight: Float = Field(default=0.3, ge=0)
    target: Float = -0.1
    sub_batch: Int = Field(default=16, gt=0, le=MAX_EXAMPLES)


class HealthConfig(_Strict):
    """Dynamics health at epoch boundaries, on the first ``probe_size`` *validation* examples.

    λ̂ (maximal depth-wise Lyapunov exponent), the float64 input-output Jacobian spectrum
    and spiking firing rates (:mod:`fathom.dynamics.probe`), at epoch 0, every ``every``
    epochs and at the last one. Needs a model with ``lyapunov_blocks()``.
    """

    enabled: Bool = False
    every: Int = Field(default=10, gt=0, le=MAX_EPOCHS)
    probe_size: Int = Field(default=8, gt=0, le=MAX_EXAMPLES)


class ExecutionConfig(_Strict):
    """How steps are executed; never changes what is computed (beyond stated precision).

    path: ``eager`` (any device), ``graph`` (CUDA graphs, one per branch topology), or
    ``auto`` (graph on CUDA when 2**branches <= 2**max_graph_branches, else eager).
    precision: ``fp32`` (strict), ``tf32`` (FP32 storage, TF32 matmuls on CUDA) or ``bf16``
    (autocast to bfloat16 for the forward/backward matmuls).
    """

    path: Literal["auto", "eager", "graph"] = "auto"
    precision: Literal["fp32", "tf32", "bf16"] = "tf32"
    max_graph_branches: Int = Field(default=6, ge=0, le=10)


class StopConfig(_Strict):
    """Stop early when the *official test* accuracy first reaches ``target_test_acc``.

    The target is monitored on the test set (the output says so); it is a speed benchmark
    rule, not a model-selection rule.
    """

    target_test_acc: Float | None = Field(default=None, gt=0, le=1)


Epoch = Annotated[int, Strict(), Field(ge=0)]
"""An epoch number: 0 is the state before training, ``optim.epochs`` the last."""


class EvalConfig(_Strict):
    every: Int = Field(default=5, gt=0, le=MAX_EPOCHS)
    first: tuple[Epoch, ...] = (1,)
    splits: tuple[Split, ...] = SPLITS
    batch_size: Int = Field(default=2000, gt=0, le=MAX_EXAMPLES)


DEFAULT_SAVE_EPOCHS: tuple[int, ...] = (0, 1, 5, 10, 20, 50, 100)
"""The default snapshot schedule; its epochs beyond ``optim.epochs`` are not written (a
``save_epochs`` the user lists must lie within training)."""


class CheckpointConfig(_Strict):
    save_epochs: tuple[Epoch, ...] = DEFAULT_SAVE_EPOCHS
    resume_every: Int = Field(default=1, gt=0, le=MAX_EPOCHS)


TelemetryFamily = Literal[
    "probe", "activations", "backprop", "params", "gradients", "moments", "scores", "all", "cheap"
]
"""The names ``telemetry.families`` takes: the families of ``fathom.telemetry.registry.FAMILIES``
then its aliases (``ALIASES``), in that order (a test holds the two lists equal)."""


class TelemetryConfig(_Strict):
    enabled: Bool = False
    first: tuple[Epoch, ...] = (0, 1)
    every: Int = Field(default=10, gt=0, le=MAX_EPOCHS)
    probe_size: Int = Field(default=128, gt=0, le=MAX_EXAMPLES)
    families: tuple[TelemetryFamily, ...] = ("all",)


class DepthConfig(_Strict):
    """How a stochastic-depth branch's output is scaled (:mod:`fathom.depth`), per branch
    ``l`` of drop probability ``p_l`` and survival ``s_l = 1 - p_l``:

    * ``convention = "inverse"`` (the default, the seed's): a kept branch has gain
      ``1 / s_l`` in training; gain one at evaluation and for a kept branch under a mask;
    * ``"huang"`` (Huang et al. 2016, *Deep Networks with Stochastic Depth*): a kept branch
      is unscaled in training (gain one: no multiply at all); at evaluation, and for a kept
      branch under a mask (the audit, curvature), it is weighted by ``s_l``.

    Both give the pre-activation the same expectation over the draws; they parameterise the
    branch differently, so a recipe transferred from Huang et al. needs ``"huang"``. The
    section is left out of the config's dump (and so of ``config_hash``) while it holds the
    default, so every config written before it existed keeps its hash.
    """

    convention: Literal["inverse", "huang"] = "inverse"


_CROSS_ENTROPY_ONLY: dict[str, Any] = {"label_smoothing": 0.0, "ignore_index": -100}
"""Cross-entropy's own options of ``[loss]`` and their defaults: another loss holds them at
these values (its validator) and its dump leaves them out."""

LossName = Literal["cross_entropy", "mse", "bce_with_logits"]
"""The names ``loss.name`` takes: the keys of ``fathom.losses.LOSSES`` (a test holds them equal)."""


class LossConfig(_Strict):
    """The training loss (``[loss]``; :mod:`fathom.losses`), on a batch's logits ``z [n, C]``
    and integer labels ``y``, reduced by ``reduction`` (``mean`` over the ``M`` valid terms,
    or ``sum``):

    * ``cross_entropy`` (the default): ``F.cross_entropy(z, y, ignore_index=ignore_index,
      label_smoothing=label_smoothing)``; labels equal to ``ignore_index`` weigh zero and are
      not counted by the mean;
    * ``mse``: ``F.mse_loss(z, t)``, ``l = sum_c (z_c - t_c)^2`` (no 1/2; the mean counts the
      ``n C`` entries);
    * ``bce_with_logits``: ``F.binary_cross_entropy_with_logits(z, t)``, ``C`` independent
      binary labels (one-vs-rest; the mean counts the ``n C`` entries).

    ``target`` says how a label meets the logits: ``labels`` (the integer itself,
    cross-entropy's) or ``one_hot`` (``t = e_y``, float, one entry per class: what ``mse``
    and ``bce_with_logits`` need, and must be stated for them). The table is left out of the
    config's dump (and so of ``config_hash``) while it holds the default, so every config
    written before it existed keeps its hash; an absent table is cross-entropy. The dump of
    another loss's table holds its own options only (not cross-entropy's ``label_smoothing``
    and ``ignore_index``, which do not apply to it), so a recorded config says what trained.
    """

    name: LossName = "cross_entropy"
    reduction: Literal["mean", "sum"] = "mean"
    label_smoothing: Float = Field(default=0.0, ge=0, le=1)
    ignore_index: Int = -100
    target: Literal["labels", "one_hot"] = "labels"

    @model_validator(mode="after")
    def _fits(self) -> LossConfig:
        if self.name == "cross_entropy":
            if self.target != "labels":
                raise ValueError(
                    "cross_entropy reads the class labels themselves: remove loss.target "
                    "(or set it to 'labels')"
                )
            return self
        for key, default in _CROSS_ENTROPY_ONLY.items():
            if getattr(self, key) != default:
                raise ValueError(
                    f"loss.{key} is an option of cross_entropy, not of {self.name!r}: remove it"
                )
        if self.target != "one_hot":
            raise ValueError(
                f"loss {self.name!r} compares the logits with a floating target of their shape, "
                "but a run's labels are integer classes: state the encoding, "
                "loss.target = 'one_hot' (t = e_y, one entry per class; fathom curvature: "
                "--target one_hot)"
            )
        return self

    @model_serializer(mode="wrap")
    def _own_options(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> Any:
        """The dump without cross-entropy's options (:data:`_CROSS_ENTROPY_ONLY`) where
        ``name`` is another loss; a dump with the context :data:`EVERY_FIELD` keeps them
        (``with_updates`` edits them, and the validator refuses a changed one by name)."""
        data = handler(self)
        if self.name != "cross_entropy" and not (info.context or {}).get("every_field"):
            for key in _CROSS_ENTROPY_ONLY:
                data.pop(key, None)
        return data


def objective_field(cfg: RunConfig) -> Literal["val/ce", "val/loss"]:
    """The history field a run is selected and ranked by: ``"val/ce"`` (validation
    cross-entropy of the logits, nats) for the default loss (no ``[loss]`` table, or one at its
    default), ``"val/loss"`` (the ``[loss]`` table's loss over the validation split, in its
    reduction and units) otherwise. The one reading of "the objective": checkpoint selection
    (:func:`fathom.train.observe.select`), the tuning grid's rate selection
    (:func:`fathom.study.selection.select_lr`) and a report's objective curve use it."""
    return "val/ce" if cfg.loss == LossConfig() else "val/loss"


def loss_with(base: LossConfig, origin: str, **changes: Any) -> LossConfig:
    """``base`` with ``changes`` (``None`` values left out), re-validated: a table of another
    ``name`` starts from that loss's defaults (cross-entropy's options do not carry over to
    ``mse``). Refused with a :class:`FathomError` naming ``origin`` (e.g. the command-line
    flags) and the fix."""
    given = {k: v for k, v in changes.items() if v is not None}
    start = base.model_dump() if given.get("name", base.name) == base.name else {}
    try:  # within a table named loss, so errors say loss.<key> as in a config
        return _LossTable.model_validate({"loss": {**start, **given}}).loss
    except ValidationError as e:
        raise FathomError(validation_message(e, origin)) from None


class _LossTable(_Strict):
    loss: LossConfig


def _lyapunov_models() -> str:
    """The models that may provide ``lyapunov_blocks()``, from the kinds' ``lyapunov`` column:
    ``model.kind 'staged_conv', or a 'python' model providing it`` (a kind with a user's
    factory provides them only where its model does)."""
    rows = [row for row in MODEL_KINDS.values() if row.lyapunov]
    built = ", ".join(repr(row.name) for row in rows if row.factory is None)
    factories = " or ".join(repr(row.name) for row in rows if row.factory is not None)
    said = [f"model.kind {built}"] if built else []
    said += [f"a {factories} model providing it"] if factories else []
    return ", or ".join(said)


class RunConfig(_Strict):
    """One training run. ``tags`` are labels a driver attaches (e.g. a depth-scaling arm);
    they never change training. ``live`` (:mod:`fathom.config.live`) is excluded from
    ``model_dump()``: it is not part of the training config and never of ``config_hash``."""

    kind: Literal["run"] = "run"
    name: Name = "run"
    study: Name = "default"
    seed: Int = Field(default=101, ge=-SEED_BOUND, lt=SEED_BOUND)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    data: DataConfig = DataConfig()
    model: ModelSpec = ModelConfig()
    optim: OptimConfig = OptimConfig()
    regularizer: RegularizerConfig | None = None
    health: HealthConfig = HealthConfig()
    tags: dict[str, str | Int | Float | Bool] = Field(default_factory=dict)
    eval: EvalConfig = EvalConfig()
    checkpoints: CheckpointConfig = CheckpointConfig()
    telemetry: TelemetryConfig = TelemetryConfig()
    execution: ExecutionConfig = ExecutionConfig()
    stop: StopConfig = StopConfig()
    depth: DepthConfig = DepthConfig()
    loss: LossConfig = LossConfig()
    live: LiveConfig = Field(default_factory=LiveConfig, exclude=True)

    @model_serializer(mode="wrap")
    def _default_tables_left_out(self, handler: Any) -> dict[str, Any]:
        """The dump without ``depth`` and ``loss`` while each is its default
        (:class:`DepthConfig`, :class:`LossConfig`): tables added after runs were recorded."""
        data = handler(self)
        if isinstance(data, dict):
            for key, default in _LEFT_OUT_WHEN_DEFAULT.items():
                if getattr(self, key) == default:
                    data.pop(key, None)
        return data

    @model_validator(mode="before")
    @classmethod
    def _default_model_kind(cls, data: Any) -> Any:
        """``[model]`` without ``kind`` is the table's default kind
        (:data:`fathom.config.model_kinds.DEFAULT_KIND`: the Ciresan MLP)."""
        model = data.get("model") if isinstance(data, dict) else None
        if isinstance(model, dict) and "kind" not in model:
            data = {**data, "model": {"kind": DEFAULT_KIND, **model}}
        return data

    @model_validator(mode="after")
    def _epochs_in_range(self) -> RunConfig:
        epochs = self.optim.epochs
        late = {
            "telemetry.first": self.telemetry.first if self.telemetry.enabled else (),
            "eval.first": self.eval.first,
            "checkpoints.save_epochs": ()
            if self.checkpoints.save_epochs == DEFAULT_SAVE_EPOCHS
            else self.checkpoints.save_epochs,
        }
        for key, values in late.items():
            beyond = [e for e in values if e > epochs]
            if beyond:
                raise ValueError(
                    f"{key} names epochs {beyond} beyond training (optim.epochs = {epochs}): "
                    f"list epochs from 0 to {epochs}, or raise optim.epochs"
                )
        if self.data.split == "fit-all" and "val" in self.eval.splits:
            raise ValueError(
                "split 'fit-all' has no validation set, but eval.splits includes 'val' "
                "(checkpoint selection needs it): use split 'fit-val' or drop 'val'"
            )
        check_language_model(self)
        check_loss(self)
        if not model_kind(self.model.kind).lyapunov and (self.regularizer or self.health.enabled):
            raise ValueError(
                "the Lyapunov regularizer and the health instrument need a model with "
                f"lyapunov_blocks() ({_lyapunov_models()})"
            )
        return self

    def with_updates(self, updates: dict[str, Any]) -> RunConfig:
        """A copy with dotted-key updates, re-validated: ``{"optim.lr": 0.03}`` (``live`` kept)."""
        data = {**self.model_dump(context=EVERY_FIELD), "live": self.live.model_dump()}
        for key in _LEFT_OUT_WHEN_DEFAULT:  # left out of the dump by default
            data.setdefault(key, getattr(self, key).model_dump())
        for key, value in updates.items():
            node = data
            parts = key.split(".")
            for p in parts[:-1]:
                if p not in node or not isinstance(node[p], dict):
                    raise unknown_key(key, data)
                node = node[p]
            if parts[-1] not in node:
                raise unknown_key(key, data)
            if isinstance(node[parts[-1]], dict) and not isinstance(value, dict):
                raise table_given_a_value(key, node[parts[-1]], value)
            node[parts[-1]] = value
        return validate_run_config(data, origin="updates")


_LEFT_OUT_WHEN_DEFAULT: dict[str, _Strict] = {"depth": DepthConfig(), "loss": LossConfig()}


def check_loss(cfg: RunConfig) -> None:
    """A ``[loss]`` other than the default is a classifier's, through the eager step: not a
    language model's (token cross-entropy), not the Lyapunov-regularized step's (CE +
    penalty); with one-hot targets, no probe telemetry (its instruments read the labels as
    the loss's targets)."""
    if cfg.loss == LossConfig():
        return
    if model_kind(cfg.model.kind).tokens:
        raise ValueError(
            "a language-model run trains on token cross-entropy; remove the [loss] table"
        )
    if cfg.regularizer is not None:
        raise ValueError(
            "the Lyapunov-regularized step trains on CE + penalty; remove the [loss] table or "
            "the [regularizer]"
        )
    if cfg.loss.target == "one_hot" and cfg.telemetry.enabled:
        raise ValueError(
            f"telemetry's probe instruments read the labels as the loss's targets, and loss "
            f"{cfg.loss.name!r} needs one-hot targets: set telemetry.enabled = false (the "
            "curvature and audit of the run use its loss), or train with cross_entropy"
        )


def check_language_model(cfg: RunConfig) -> None:
    """A next-token model (its kind's row says ``tokens``) trains on a text dataset, and a
    text dataset trains such a model; its step is token cross-entropy, eager (no Lyapunov
    regularizer, no stopping target on test accuracy)."""
    tokens = model_kind(cfg.model.kind).tokens
    text = cfg.data.dataset in TEXT_DATASETS
    if tokens and not text:
        raise ValueError(
            f"model.kind {cfg.model.kind!r} predicts next tokens and needs a text dataset "
            f"({', '.join(TEXT_DATASETS)}, with data.context), not {cfg.data.dataset!r}"
        )
    if text and not tokens:
        known = [k for k, row in MODEL_KINDS.items() if row.tokens]
        raise ValueError(
            f"dataset {cfg.data.dataset!r} is text (token windows): train a next-token model "
            f"(model.kind {', '.join(known)}), not {cfg.model.kind!r}"
        )
    if cfg.optim.clip_norm is not None and cfg.regularizer is not None:
        raise ValueError(
            "optim.clip_norm is not applied by the regularized step; remove one of them"
        )
    if tokens and (cfg.regularizer is not None or cfg.stop.target_test_acc is not None):
        raise ValueError(
            "a language-model run takes no regularizer and no stop.target_test_acc; remove them"
        )


def config_diff(
    a: dict, b: dict, labels: tuple[str, str] = ("", ""), prefix: str = ""
) -> list[str]:
    """Dotted keys whose values differ: ``["optim.lr: 0.01 != 0.03", ...]``.

    ``labels`` name the two sides, e.g. ``(" (on disk)", " (study)")``.
    """
    out = []
    for k in sorted(set(a) | set(b)):
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += config_diff(va, vb, labels, f"{prefix}{k}.")
        elif va != vb:
            out.append(f"{prefix}{k}: {va!r}{labels[0]} != {vb!r}{labels[1]}")
    return out


def describe_config_change(
    recorded: dict, recorded_hash: str | None, new: dict, labels: tuple[str, str] = ("", "")
) -> str:
    """Why ``new`` is not the recorded config: its :func:`config_diff`, or — when every value
    agrees — that the recorded ``config_hash`` is not the digest of the recorded config (the
    manifest's hash or config was edited), never an empty ``()``."""
    from fathom.base.io import config_digest

    diff = config_diff(recorded, new, labels)
    if diff:
        return "; ".join(diff)
    return (
        f"every value agrees, but the recorded config_hash {str(recorded_hash)[:12]}… is not "
        f"the digest {config_digest(recorded)[:12]}… of the recorded config: the manifest's "
        "config or hash was edited, or its config was written incomplete (by hand)"
    )


def validate_run_config(data: dict[str, Any], origin: str = "config") -> RunConfig:
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        raise FathomError(validation_message(e, origin)) from None
