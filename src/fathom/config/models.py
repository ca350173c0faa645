"""The data and model sections of a run config, and the config's shared field types.

Models, one class per ``model.kind``: ``ciresan`` (the residual MLP), ``staged_conv`` (conv
/ spiking conv nets) and ``python`` (a user's factory); their table, and
:data:`~fathom.config.model_kinds.ModelSpec` (the discriminated union of these classes), is
:mod:`fathom.config.model_kinds`. A ``[model]`` table without ``kind`` is the Ciresan MLP. Names of runs
and studies are one directory component (:func:`check_name`).
"""

from __future__ import annotations

from collections.abc import Collection
from itertools import pairwise
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    Strict,
    field_validator,
    model_serializer,
    model_validator,
)

import fathom.config.limits as limits
from fathom.config.recipes import RECIPES
from fathom.errors import InvalidValue

#: Numbers of every config: an integer field takes no ``true`` or ``2.0``, a float field
#: takes integers but no booleans or strings, and no float is ``inf`` or ``nan``.
Int = Annotated[int, Strict()]
Float = Annotated[float, Strict()]
Bool = Annotated[bool, Strict()]


Split = Literal["fit", "val", "test"]
SPLITS: tuple[Split, ...] = get_args(Split)
"""The splits of a run, in this order: fitting, validation, test (a history row's
``<split>/acc`` and ``<split>/ce``, ``data.sizes``, ``eval.splits``)."""


def schedule_due(epoch: int, first: Collection[int], every: int, last: int) -> bool:
    """Whether an epoch-boundary schedule is due at ``epoch`` of a run of ``last`` epochs.

    Due at the epochs in ``first``, at the positive multiples of ``every``, and at ``last``;
    never outside ``0 .. last``. The one definition of every "due" of a run: telemetry
    (``telemetry.first`` / ``every``), evaluation (epoch 0 and ``eval.first`` / ``every``),
    the health instrument (epoch 0 and ``health.every``) and the resume state
    (``checkpoints.resume_every``).
    """
    if epoch < 0 or epoch > last:
        return False
    return epoch in first or (epoch > 0 and epoch % every == 0) or epoch == last


NAME_MAX_BYTES = 128


def check_name(value: str) -> str:
    """A run or study name: exactly one directory name under ``--runs-dir``.

    Refused: the empty name, ``.`` and ``..``, a leading ``.`` (hidden; Fathom's lock and
    temporary files start with one), ``/`` or ``\\``, NUL or any other control character,
    and more than :data:`NAME_MAX_BYTES` bytes of UTF-8. So ``runs_dir / study / name`` is
    always a directory two levels inside ``runs_dir``.
    """
    fix = "use one plain directory name, e.g. 'my-run' (letters, digits, '-', '_', '.')"
    if not value:
        raise ValueError(f"the name is empty; {fix}")
    bad = sorted({c for c in value if c in "/\\" or ord(c) < 32 or ord(c) == 127})
    if bad:
        raise ValueError(
            f"the name {value!r} contains {', '.join(repr(c) for c in bad)}, which would "
            f"leave or split its directory; {fix}"
        )
    if value.startswith("."):
        raise ValueError(f"the name {value!r} starts with '.' (hidden or a parent); {fix}")
    if len(value.encode("utf-8")) > NAME_MAX_BYTES:
        raise ValueError(f"the name is longer than {NAME_MAX_BYTES} bytes; {fix}")
    return value


#: A validated run or study name (:func:`check_name`).
Name = Annotated[str, AfterValidator(check_name)]


# -- the models' checks, written once and torch-free: the validators below and the
# constructors of fathom.models call the same functions, so a config that validates builds
STAGES = 4
"""The stages of the staged conv net a config builds (:class:`StagedConvConfig`)."""


def check_hidden_widths(widths: tuple[int, ...]) -> tuple[int, ...]:
    """The Ciresan MLP's hidden widths: at least two (stem + one body block), all positive."""
    if len(widths) < 2 or any(w <= 0 for w in widths):
        raise InvalidValue(
            f"widths {list(widths)}: need at least two positive hidden widths (stem + one "
            "body block)"
        )
    return widths


def check_unit_dropout(p: float) -> float:
    """A unit-dropout probability in ``[0, 1)``."""
    if not 0.0 <= p < 1.0:
        raise InvalidValue(f"unit_dropout must be in [0, 1), got {p}")
    return p


def check_narrowing(widths: tuple[int, ...]) -> tuple[int, ...]:
    """Widths a crop bypass can follow: non-increasing (``h[:, :d_out]`` needs d_out <= d_in)."""
    for a, b in pairwise(widths):
        if b > a:
            raise InvalidValue(
                f"widths {list(widths)} increase ({a} -> {b}); a crop bypass needs "
                "non-increasing widths (or use recipe 'plain')"
            )
    return widths


def check_stage_depth(depth: int, stages: int = STAGES) -> int:
    """A conv depth of ``stages`` equal stages: a positive multiple of ``stages``."""
    if depth < stages or depth % stages:
        raise InvalidValue(
            f"depth {depth} is not a positive multiple of the {stages} stages; "
            f"use depths like {', '.join(str(stages * n) for n in range(1, 6))}"
        )
    if depth > limits.MAX_LAYERS:
        raise InvalidValue(
            f"depth {depth} exceeds {limits.MAX_LAYERS} layers, the limit of a config: use a "
            "smaller depth"
        )
    return depth


Neuron = Literal["lif", "relu"]
NEURONS: tuple[Neuron, ...] = get_args(Neuron)
"""The conv net's neurons: ``lif`` (spiking, with ``timesteps >= 1``) or ``relu`` (ANN)."""


def check_timesteps(timesteps: int) -> int:
    """The LIF simulation steps per input: ``>= 0`` (0 = the ANN)."""
    if timesteps < 0:
        raise InvalidValue(
            f"timesteps must be >= 0 (0 = ANN), got {timesteps}; use e.g. --timesteps 4"
        )
    return timesteps


def check_image_size(size: int, stages: int = STAGES) -> int:
    """An input size that passes ``stages`` 2×2 poolings: a positive multiple of ``2**stages``."""
    shrink = 2**stages
    if size % shrink or size < shrink:
        raise InvalidValue(
            f"image size {size} cannot pass {stages} 2×2 poolings (needs a multiple "
            f"of {shrink}); pad or crop the images (MNIST-like 28×28 is padded to 32×32)"
        )
    return size


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


EVERY_FIELD = {"every_field": True}
"""The dump context that keeps :func:`omit_unset_additions`' fields (``with_updates`` edits them)."""


def omit_unset_additions(
    data: dict[str, Any], model: BaseModel, fields: tuple[str, ...], info: SerializationInfo
) -> dict[str, Any]:
    """``data`` (a section's dump) without ``fields`` that are ``None``: fields added to a
    section after runs were recorded, left out while unset, so every config written before
    them dumps, and hashes (``config_hash``), exactly as it did (a recorded run resumes; a
    study finds its runs unchanged). A dump with the context :data:`EVERY_FIELD` keeps them."""
    if (info.context or {}).get("every_field"):
        return data
    for name in fields:
        if getattr(model, name) is None:
            data.pop(name, None)
    return data


def _check_factory_path(path: str, key: str) -> str:
    """``"package.module:function"`` (syntax only; importing happens when the run starts)."""
    module, sep, attr = path.partition(":")
    if not sep or not module or not attr.isidentifier():
        raise ValueError(
            f"{key} = {path!r} is not of the form 'package.module:function' "
            "(e.g. 'mypkg.models:make_net')"
        )
    return path


def _check_drop_probs(v: tuple[float, ...] | None) -> tuple[float, ...] | None:
    """``model.drop_probs``: every probability in ``[0, 1)``."""
    for p in v or ():
        if not 0.0 <= p < 1.0:
            raise ValueError(
                f"drop probability {p} is outside [0, 1); to delete a branch use an explicit mask"
            )
    return v


class ModelConfig(_Strict):
    """The Ciresan residual MLP (:class:`fathom.models.ciresan.CiresanMLP`)."""

    kind: Literal["ciresan"] = "ciresan"
    recipe: Literal[tuple(RECIPES)] = "residual"  # type: ignore[valid-type]  # the one table
    widths: tuple[Int, ...] = Field(
        default=(2500, 2000, 1500, 1000, 500), max_length=limits.MAX_LAYERS
    )
    width_mult: Float = Field(default=1.0, gt=0, le=limits.MAX_WIDTH_MULT)
    input_scale: Float = Field(default=1 / 255, gt=0)
    output_relu: Bool = False
    unit_dropout: Float | None = None
    drop_probs: tuple[Float, ...] | None = None

    @field_validator("widths")
    @classmethod
    def _positive(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        return check_hidden_widths(v)

    @field_validator("unit_dropout")
    @classmethod
    def _dropout(cls, v: float | None) -> float | None:
        return None if v is None else check_unit_dropout(v)

    @field_validator("drop_probs")
    @classmethod
    def _probs(cls, v: tuple[float, ...] | None) -> tuple[float, ...] | None:
        return _check_drop_probs(v)

    @model_validator(mode="after")
    def _crop_needs_narrowing(self) -> ModelConfig:
        wide = [w for w in self.widths if w * self.width_mult > limits.MAX_WIDTH]
        if wide:
            raise ValueError(
                f"widths {wide} x width_mult {self.width_mult:g} exceed {limits.MAX_WIDTH} units "
                "per layer, the limit of a config: use smaller widths"
            )
        if self.recipe != "plain":
            check_narrowing(self.widths)
        return self


class StagedConvConfig(_Strict):
    """The staged conv net, ANN or spiking LIF (:class:`fathom.models.convnet.StagedConvNet`).

    ``depth`` conv layers in four stages (a multiple of 4); ``neuron = "lif"`` with
    ``timesteps >= 1`` is spiking, ``timesteps = 0`` or ``neuron = "relu"`` the ANN. Inputs
    are zero-padded to ``image_size`` and normalized with the dataset's channel moments
    (:mod:`fathom.models.prep`).
    """

    kind: Literal["staged_conv"] = "staged_conv"
    depth: Int = Field(default=4, gt=0)
    neuron: Neuron = "lif"
    timesteps: Int = Field(default=4, le=limits.MAX_TIMESTEPS)
    residual: Bool = False
    batchnorm: Bool = True
    width_mult: Float = Field(default=1.0, gt=0, le=limits.MAX_WIDTH_MULT)
    image_size: Int = Field(default=32, gt=0, le=limits.MAX_IMAGE_SIZE)

    @field_validator("depth")
    @classmethod
    def _depth(cls, v: int) -> int:
        return check_stage_depth(v)

    @field_validator("image_size")
    @classmethod
    def _image_size(cls, v: int) -> int:
        return check_image_size(v)

    @field_validator("timesteps")
    @classmethod
    def _timesteps(cls, v: int) -> int:
        return check_timesteps(v)


class PythonModelConfig(_Strict):
    """A user's model: ``factory = "package.module:function"`` called with ``kwargs``.

    The function must return a ``torch.nn.Module`` mapping a batch of inputs to logits.
    ``drop_probs`` (one probability per :class:`fathom.depth.SkippableResidual`, in module
    order) asks the trainer to drive those branches by a drop schedule, as for the Ciresan
    recipes: ``drop_schedule = "constant"`` (``p_l``) or ``"linear_decrease"``
    (``p_l · max(0, 1 - e / E)``, zero at the last epoch); the branches' own ``p`` is then
    overridden. Without ``drop_probs`` the branches draw by their own ``p`` (or not at all).
    """

    kind: Literal["python"] = "python"
    factory: str
    kwargs: dict[str, Any] = Field(default_factory=dict)
    drop_probs: tuple[Float, ...] | None = None
    drop_schedule: Literal["constant", "linear_decrease"] = "constant"

    @model_validator(mode="after")
    def _drop(self) -> PythonModelConfig:
        _check_drop_probs(self.drop_probs)
        if self.drop_probs is None and self.drop_schedule != "constant":
            raise ValueError("model.drop_schedule needs model.drop_probs (one per branch)")
        return self

    @field_validator("factory")
    @classmethod
    def _factory(cls, v: str) -> str:
        return _check_factory_path(v, "model.factory")


class GPTConfig(_Strict):
    """A small GPT (:class:`fathom.models.gpt.GPT`): ``layers`` pre-LayerNorm blocks (causal
    self-attention with ``heads`` heads + an MLP of ``4 · width``), each one skippable
    residual; learned positions, output weights tied to the token embedding; logits
    ``[N, T, V]``.

    ``vocab`` and ``context`` default to the data's (256 byte tokens, ``data.context``); given,
    they must cover it. LayerDrop: ``layerdrop`` is ``p_L``, every block's drop probability
    (``layerdrop_rule = "uniform"``) or the last one's with ``p_l = l / L · p_L``
    (``"linear"``, Huang et al.'s rule); or ``drop_probs``, one per block. The probabilities
    are constant over the epochs.
    """

    kind: Literal["gpt"] = "gpt"
    layers: Int = Field(default=4, gt=0, le=limits.MAX_LAYERS)
    width: Int = Field(default=128, gt=0, le=limits.MAX_WIDTH)
    heads: Int = Field(default=4, gt=0)
    vocab: Int | None = Field(default=None, gt=0, le=limits.MAX_WIDTH)
    context: Int | None = Field(default=None, gt=0, le=limits.MAX_EXAMPLES)
    layerdrop: Float = Field(default=0.0, ge=0)
    layerdrop_rule: Literal["uniform", "linear"] = "uniform"
    drop_probs: tuple[Float, ...] | None = None

    @model_validator(mode="after")
    def _shape(self) -> GPTConfig:
        if self.width % self.heads:
            raise ValueError(
                f"width {self.width} is not a multiple of heads {self.heads}: each head takes "
                "width / heads features; choose e.g. heads dividing the width"
            )
        if self.layerdrop >= 1:
            raise ValueError(f"layerdrop must be in [0, 1), got {self.layerdrop}")
        _check_drop_probs(self.drop_probs)
        if self.drop_probs is not None:
            if self.layerdrop:
                raise ValueError("give model.layerdrop or model.drop_probs, not both")
            if len(self.drop_probs) != self.layers:
                raise ValueError(
                    f"model.drop_probs gives {len(self.drop_probs)} probabilities for "
                    f"{self.layers} blocks; give one per block"
                )
        return self


TEXT_DATASETS = ("moby-dick", "text")
"""The datasets read as byte-level token windows (:mod:`fathom.data.text`)."""


def _check_text_fields(cfg: Any) -> None:
    """A text dataset needs ``context`` and takes none of the image-only fields; an image
    dataset takes no ``context``."""
    if cfg.dataset not in TEXT_DATASETS:
        if cfg.context is not None:
            raise ValueError(
                f"data.context is the window length of a text dataset ({', '.join(TEXT_DATASETS)})"
                f", not of {cfg.dataset!r}; remove it"
            )
        return
    if cfg.context is None:
        raise ValueError(
            f"dataset {cfg.dataset!r} needs data.context, the tokens per window (e.g. 128)"
        )
    fixed = {
        "split": cfg.split != "fit-val",
        "val_size": cfg.val_size is not None,
        "test_size": cfg.test_size is not None,
        "augment": cfg.augment != "none",
    }
    given = [k for k, v in fixed.items() if v]
    if given:
        raise ValueError(
            f"data.{given[0]}: a text dataset's splits are fixed (contiguous 90/5/5 by "
            "position) and it is not augmented; remove it (use fit_subset / eval_subset for "
            "fewer windows)"
        )


class DataConfig(_Strict):
    """Where the examples come from and how they are split.

    ``dataset``: a registered dataset (``mnist``, ``fashion-mnist``; ``cifar10`` /
    ``cifar100`` from archives the user supplies in ``data_dir``), ``tensors`` (a user's
    ``.npz`` / ``.pt`` file at ``path``, see :mod:`fathom.data.user`) or ``python`` (a
    user's function ``factory = "package.module:function"`` called with ``kwargs`` that
    returns the same arrays). ``augment = "crop_flip"`` applies the standard CIFAR
    augmentation to fitting batches (pad 4, random crop, horizontal flip p = 1/2).

    Text (:data:`TEXT_DATASETS`, :mod:`fathom.data.text`): ``moby-dick`` (the registered
    corpus) or ``text`` (a user's UTF-8 file at ``path``), read as byte-level tokens and cut
    into windows of ``context`` tokens (required for text, refused otherwise) in fixed
    contiguous 90/5/5 splits by position; ``fit_subset`` / ``eval_subset`` keep the first
    windows.
    """

    dataset: Literal[
        "mnist", "fashion-mnist", "cifar10", "cifar100", "tensors", "python", "moby-dick", "text"
    ] = "mnist"
    context: Int | None = Field(default=None, gt=0, le=limits.MAX_EXAMPLES)
    data_dir: str | None = None
    path: str | None = None
    factory: str | None = None
    kwargs: dict[str, Any] = Field(default_factory=dict)
    split: Literal["fit-val", "fit-all"] = "fit-val"
    split_seed: Int = Field(default=0, ge=0, lt=limits.SEED_BOUND)
    val_size: Int | None = Field(default=None, gt=0, le=limits.MAX_EXAMPLES)
    test_size: Int | None = Field(default=None, gt=0, le=limits.MAX_EXAMPLES)
    fit_subset: Int | None = Field(default=None, gt=0, le=limits.MAX_EXAMPLES)
    eval_subset: Int | None = Field(default=None, gt=0, le=limits.MAX_EXAMPLES)
    augment: Literal["none", "crop_flip"] = "none"

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> Any:
        return omit_unset_additions(handler(self), self, ("context",), info)

    @model_validator(mode="after")
    def _source_fields(self) -> DataConfig:
        need = {"tensors": "path", "text": "path", "python": "factory"}.get(self.dataset)
        for key in ("path", "factory"):
            if key == need and getattr(self, key) is None:
                raise ValueError(f"dataset {self.dataset!r} needs data.{key}")
            if key != need and getattr(self, key) is not None:
                raise ValueError(
                    f"data.{key} is only used with dataset "
                    f"{'tensors or text' if key == 'path' else 'python'!r}; remove it"
                )
        _check_text_fields(self)
        if self.kwargs and self.dataset != "python":
            raise ValueError("data.kwargs is only used with dataset 'python'; remove it")
        if self.factory is not None:
            _check_factory_path(self.factory, "data.factory")
        return self
