"""Study definitions: recipes × seeds over one base run config, with an optional
learning-rate tuning phase. Declared in TOML, validated strictly (unknown keys refused).

```toml
[study]
name = "my-study"
reference = "residual"                 # the recipe every other one is compared against
recipes = ["plain", "residual", "sd_constant"]
seeds = [101, 102, 103]                # main-phase seeds
lr = 0.01                              # one rate for every recipe, without tuning
target_val_acc = 0.98                  # time-to-target threshold (optional)
scale_down = ["width_mult 0.1 ..."]    # what this study scales down (printed in the summary)
protocol = "ciresan-sd"                # the full protocol it scales down: compared key by key

[tuning]
enabled = true
seed = 1
lrs = [0.01, 0.03, 0.1]

[base]                                 # a run config (see fathom.config.RunConfig)
optim = { epochs = 100, batch_size = 64 }

[live]                                 # optional live tracking of every run (fathom.config.live)
backends = ["tensorboard"]
```

Where each recipe's learning rate comes from (its *source*, recorded in the summary):

* ``"tuning"``: ``[tuning] enabled = true`` -- selected from the grid at the tuning seed;
* ``"study.lr"``: tuning disabled, one rate ``study.lr`` for every recipe;
* ``"frozen"``: ``[tuning] mode = "frozen"`` with ``lr = {plain = 0.03, residual = 0.01, ...}``
  -- one fixed rate per recipe (every recipe listed, no other), no tuning run at all. This is
  how a protocol whose rates were selected once is repeated without re-tuning (re-tuning
  can flip the selection a published table rests on).

The study sets ``name``, ``study``, ``seed``, ``model.recipe`` and ``optim.lr`` of every
run itself, so ``[base]`` may not set them.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fathom.config import (
    RunConfig,
    load_toml,
    parse_toml,
    validate_run_config,
)
from fathom.config.inputs import require_base_model
from fathom.config.live import LiveConfig
from fathom.config.model_kinds import MODEL_KINDS, model_kind
from fathom.config.models import Bool, Float, Int, Name
from fathom.config.recipes import RECIPES
from fathom.errors import FathomError, validation_message, with_suggestion

STUDY_OWNED_KEYS: tuple[str, ...] = ("name", "study", "seed", "model.recipe", "optim.lr")
"""Run-config keys set per run by the study; ``[base]`` may not set them."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class StudySection(_Strict):
    name: Name
    description: str = ""
    reference: str
    recipes: tuple[str, ...]
    seeds: tuple[Int, ...] = (101, 102, 103)
    lr: Float | None = Field(default=None, gt=0)
    target_val_acc: Float | None = Field(default=None, gt=0, le=1)
    scale_down: tuple[str, ...] = ()
    protocol: str | None = None
    threads_per_run: Int | None = Field(default=None, gt=0)

    @field_validator("recipes")
    @classmethod
    def _recipes(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v:
            raise ValueError(f"the grid is empty: list at least one recipe of {list(RECIPES)}")
        unknown = [r for r in v if r not in RECIPES]
        if unknown:
            raise ValueError(f"unknown recipes {unknown}; valid recipes: {list(RECIPES)}")
        if len(set(v)) != len(v):
            raise ValueError(f"recipes {list(v)} repeat a recipe; list each once")
        return v

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if not v:
            raise ValueError("the grid is empty: list at least one seed (e.g. [101, 102, 103])")
        if len(set(v)) != len(v):
            raise ValueError(f"seeds {list(v)} repeat a seed; list each once")
        return v

    @field_validator("protocol")
    @classmethod
    def _protocol(cls, v: str | None) -> str | None:
        if v is not None and v not in preset_names():
            raise ValueError(
                f"protocol {v!r} is not a study preset; name the preset this study scales "
                f"down (one of {', '.join(preset_names())}) or remove protocol"
            )
        return v

    @model_validator(mode="after")
    def _reference_in_recipes(self) -> StudySection:
        if self.reference not in self.recipes:
            raise ValueError(
                f"reference recipe {self.reference!r} is not in recipes {list(self.recipes)}; "
                "add it to recipes or choose one of them as the reference"
            )
        return self


_LR_SOURCES: tuple[str, ...] = ("tuning", "study.lr", "frozen")
"""Where a recipe's learning rate came from (see the module docstring)."""


class TuningSection(_Strict):
    enabled: Bool = True
    mode: Literal["grid", "frozen"] = "grid"
    seed: Int = 1
    lrs: tuple[Float, ...] = (0.01, 0.03, 0.1)
    lr: dict[str, Float] = Field(default_factory=dict)

    @property
    def runs_grid(self) -> bool:
        """True when a tuning phase trains the grid (``mode = "grid"`` and enabled)."""
        return self.enabled and self.mode == "grid"

    @model_validator(mode="before")
    @classmethod
    def _frozen_is_disabled(cls, data: Any) -> Any:
        """``mode = "frozen"`` without ``enabled`` is ``enabled = false``: no grid runs, and
        the written definition (``enabled = false``) validates back to the same section."""
        if isinstance(data, dict) and data.get("mode") == "frozen" and "enabled" not in data:
            data = {**data, "enabled": False}
        return data

    @model_validator(mode="after")
    def _mode(self) -> TuningSection:
        if self.mode == "frozen":
            if self.enabled:
                raise ValueError(
                    'tuning.mode = "frozen" runs no tuning, but tuning.enabled = true asks for '
                    'a grid: drop tuning.enabled (or use mode = "grid")'
                )
            if not self.lr:
                raise ValueError(
                    'tuning.mode = "frozen" needs tuning.lr, one rate per recipe, e.g. '
                    "lr = {plain = 0.03, residual = 0.01}"
                )
            bad = {k: v for k, v in self.lr.items() if not v > 0}
            if bad:
                raise ValueError(f"frozen learning rates must be positive, got {bad}")
        elif self.lr:
            raise ValueError(
                'tuning.lr (per-recipe frozen rates) is used only with mode = "frozen"; add '
                'mode = "frozen" or remove tuning.lr'
            )
        return self

    @field_validator("lrs")
    @classmethod
    def _lrs(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        if not v:
            raise ValueError(
                "the learning-rate grid is empty: list at least one rate, e.g. [0.01, 0.03, 0.1]"
            )
        if any(x <= 0 for x in v):
            raise ValueError(f"learning rates must be positive, got {list(v)}")
        if len(set(v)) != len(v):
            raise ValueError(f"learning rates {list(v)} repeat a rate; list each once")
        return tuple(sorted(v))


class StudyConfig(_Strict):
    kind: Literal["study"] = "study"
    study: StudySection
    tuning: TuningSection = TuningSection(enabled=False)
    base: RunConfig = RunConfig()
    live: LiveConfig = Field(default_factory=LiveConfig, exclude=True)  # not in the definition

    @model_validator(mode="after")
    def _ciresan_base(self) -> StudyConfig:
        if not model_kind(self.base.model.kind).recipes:
            kinds = " or ".join(repr(k) for k, row in MODEL_KINDS.items() if row.recipes)
            raise ValueError(
                f"a study's recipes are Ciresan MLP recipes (model.recipe), but [base.model] has "
                f"kind {self.base.model.kind!r}: use kind {kinds} in a study, or train "
                "that model with `fathom train` (or `fathom depth-scaling` for staged conv nets)"
            )
        return self

    @model_validator(mode="after")
    def _lr_source(self) -> StudyConfig:
        if self.tuning.mode == "frozen":
            recipes = set(self.study.recipes)
            missing = sorted(recipes - set(self.tuning.lr))
            extra = sorted(set(self.tuning.lr) - recipes)
            if missing or extra:
                raise ValueError(
                    f"tuning.lr must give one frozen rate for each recipe of study.recipes: "
                    f"missing {missing}, not in study.recipes {extra}"
                )
            if self.study.lr is not None:
                raise ValueError(
                    'study.lr and tuning.mode = "frozen" both set the rates: remove study.lr '
                    "(the frozen rates are in tuning.lr)"
                )
        elif not self.tuning.enabled and self.study.lr is None:
            raise ValueError(
                "tuning is disabled and study.lr is not set: set study.lr or enable [tuning]"
            )
        return self

    def lr_source(self) -> str:
        """Where every recipe's rate comes from: one of :data:`_LR_SOURCES`."""
        if self.tuning.mode == "frozen":
            return "frozen"
        return "tuning" if self.tuning.enabled else "study.lr"

    def fixed_lrs(self) -> dict[str, float] | None:
        """Each recipe's rate when no tuning phase selects it (frozen or ``study.lr``), else ``None``."""
        if self.tuning.mode == "frozen":
            return {r: float(self.tuning.lr[r]) for r in self.study.recipes}
        if not self.tuning.enabled:
            return dict.fromkeys(self.study.recipes, float(self.study.lr))  # type: ignore[arg-type]  # required without tuning
        return None

    def to_data(self) -> dict[str, Any]:
        """JSON-able contents that :func:`validate_study_config` accepts back (owned keys dropped)."""
        data = self.model_dump(mode="json")
        for key in STUDY_OWNED_KEYS:
            *parents, last = key.split(".")
            node = data["base"]
            for p in parents:
                node = node[p]
            node.pop(last)
        return data

    def run_config(self, *, recipe: str, seed: int, lr: float, run_id: str) -> RunConfig:
        """The base config specialised to one run of this study."""
        return self.base.with_updates(
            {
                "name": run_id,
                "study": self.study.name,
                "seed": seed,
                "model.recipe": recipe,
                "optim.lr": lr,
            }
        )


def _owned_keys_set(base: dict[str, Any]) -> list[str]:
    out = []
    for key in STUDY_OWNED_KEYS:
        node: Any = base
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                break
            node = node[part]
        else:
            out.append(key)
    return out


def validate_study_config(data: dict[str, Any], origin: str = "study config") -> StudyConfig:
    """Validate a study TOML's contents; bad input raises :class:`FathomError` naming the key."""
    if "study" not in data or not isinstance(data["study"], dict):
        raise FathomError(
            f"invalid study ({origin}): no [study] table; a study needs [study] with name, "
            "reference, recipes and seeds"
        )
    base = data.get("base", {})
    if isinstance(base, dict) and "live" in base:
        raise FathomError(
            f"invalid study ({origin}): [base.live] is set; live tracking of a study's runs is "
            "the study's own top-level [live] section: move it there"
        )
    if isinstance(base, dict):
        owned = _owned_keys_set(base)
        if owned:
            raise FathomError(
                f"invalid study ({origin}): [base] sets {owned}, which the study sets per run "
                "(study.name, study.seeds, study.recipes, tuning.lrs / study.lr); remove them from [base]"
            )
        validate_run_config(base, origin=f"{origin} [base]")
    try:
        return StudyConfig.model_validate(data)
    except ValidationError as e:
        raise FathomError(validation_message(e, origin)) from None


def preset_names() -> list[str]:
    """Names of the study presets shipped in ``fathom/presets/*.toml``."""
    root = resources.files("fathom") / "presets"
    return sorted(p.name.removesuffix(".toml") for p in root.iterdir() if p.name.endswith(".toml"))


def _preset_of_another_command(name: str) -> str:
    """What to run instead when ``name`` is another command's preset (``""`` when none)."""
    from fathom.depthscale.config import PRESETS as DEPTH_PRESETS

    root = resources.files("fathom")
    pipelines = parse_toml(
        (root / "reproduce" / "pipelines.toml").read_text("utf-8"), "the shipped pipelines.toml"
    )
    commands = [
        (
            f"a run preset: train it with `fathom train {name}`",
            (root / "presets" / "runs" / f"{name}.toml").is_file(),
        ),
        (
            f"a depth-scaling preset: run it with `fathom depth-scaling --preset {name}`",
            name in DEPTH_PRESETS,
        ),
        (f"a reproduce pipeline: run it with `fathom reproduce {name}`", name in pipelines),
    ]
    return "; ".join(f"it is {what}" for what, hit in commands if hit)


def load_study(preset_or_path: str | Path) -> tuple[StudyConfig, str]:
    """A study from a TOML path or a preset name; returns ``(config, origin)``."""
    path = Path(preset_or_path)
    if path.suffix == ".toml" or path.exists():
        data = load_toml(path)
        require_base_model(data, str(path))
        return validate_study_config(data, origin=str(path)), str(path)
    name = str(preset_or_path)
    elsewhere = _preset_of_another_command(name)
    if name not in preset_names() and elsewhere:
        raise FathomError(f"{name!r} is not a study: {elsewhere}")
    if name not in preset_names():
        unknown = with_suggestion(f"unknown study preset {name!r}", name, preset_names())
        raise FathomError(
            f"{unknown}, and no such file; valid presets: {', '.join(preset_names())}, "
            "or pass a study TOML path"
        )
    text = (resources.files("fathom") / "presets" / f"{name}.toml").read_text(encoding="utf-8")
    data = parse_toml(text, f"preset {name}")
    return validate_study_config(data, origin=f"preset {name}"), f"preset {name}"
