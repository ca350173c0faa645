"""One validated config family chosen by ``kind``: ``run``, ``study``, ``depth_scaling``.

:func:`validate_config` picks the member by ``kind`` (a file without ``kind`` is a study when
it has a ``[study]`` table, else a run) and applies that member's own checks, so every command reports bad input
the same way. :func:`load_config` accepts a TOML path or the name of any shipped preset.

Start-up: a run config does not import the study models, so ``fathom validate <run preset>``
and a mistyped ``--set`` key pay only for the run models.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fathom.config import RunConfig, load_toml, parse_toml, validate_run_config
from fathom.config.inputs import require_base_model, what_defaults_train
from fathom.depthscale.config import PRESETS as DEPTH_PRESETS
from fathom.depthscale.config import DepthScaleConfig, make_config, validate_depth_scaling
from fathom.errors import FathomError, with_suggestion

if TYPE_CHECKING:
    from fathom.study.config import StudyConfig

_CONFIG_KINDS: tuple[str, ...] = ("run", "study", "depth_scaling")


def _infer_kind(data: dict[str, Any]) -> str:
    """``data["kind"]``; without it, ``study`` for a ``[study]`` table, else ``run``."""
    kind = data.get("kind")
    if kind is None:
        return "study" if isinstance(data.get("study"), dict) else "run"
    if kind not in _CONFIG_KINDS:
        raise FathomError(f"unknown config kind {kind!r}; use one of {', '.join(_CONFIG_KINDS)}")
    return str(kind)


def validate_config(
    data: dict[str, Any], origin: str = "config"
) -> RunConfig | StudyConfig | DepthScaleConfig:
    """The family member named by ``kind``, validated with that member's own rules."""
    kind = _infer_kind(data)
    if kind == "run":
        return validate_run_config(data, origin)
    if kind == "study":
        from fathom.study.config import validate_study_config

        return validate_study_config(data, origin)
    return validate_depth_scaling(dict(data), origin)


def require_model(data: dict[str, Any] | None, origin: str) -> None:
    """Refuse a run config that names no model: no config at all (``data`` None), an empty
    file, or one without a ``[model]`` table (or with an empty one) would train the defaults
    (the full-width Ciresan MLP for the default epochs on all of the default dataset) without
    the user having chosen them."""
    if data and data.get("model"):
        return
    what = (
        "no config is given"
        if data is None
        else f"{origin} is empty"
        if not data
        else f"{origin} names no model (no [model] table, or an empty one)"
    )
    presets = ", ".join(sorted(_run_presets()))
    raise FathomError(
        f"{what}: it would train the defaults, {what_defaults_train()}. Name the model, e.g.\n"
        f"{MINIMAL_RUN}or name a run preset ({presets})"
        + (" or set model keys with --set" if data is None else "")
    )


MINIMAL_RUN = """    [model]
    widths = [256, 128]
    [optim]
    epochs = 5
    [data]
    fit_subset = 10000
"""
"""A small run config, shown where a config names no model."""


def _run_presets() -> dict[str, str]:
    root = resources.files("fathom") / "presets" / "runs"
    return {
        p.name.removesuffix(".toml"): p.read_text()
        for p in root.iterdir()
        if p.name.endswith(".toml")
    }


def _study_presets() -> dict[str, str]:
    root = resources.files("fathom") / "presets"
    return {
        p.name.removesuffix(".toml"): p.read_text()
        for p in root.iterdir()
        if p.name.endswith(".toml")
    }


def preset_names() -> dict[str, list[str]]:
    """Shipped presets by kind."""
    return {
        "run": sorted(_run_presets()),
        "study": sorted(_study_presets()),
        "depth_scaling": sorted(DEPTH_PRESETS),
    }


def load_config(name: str) -> tuple[RunConfig | StudyConfig | DepthScaleConfig, str]:
    """``(config, origin)`` from a TOML path or a preset name of any kind."""
    path = Path(name)
    if path.suffix == ".toml" or path.exists():
        data = load_toml(path)
        cfg = validate_config(data, str(path))
        if cfg.kind == "run":  # a file the user wrote must choose its model
            require_model(data, str(path))
        elif cfg.kind == "study":
            require_base_model(data, str(path))
        return cfg, str(path)
    hits = [
        (kind, text)
        for kind, texts in (("run", _run_presets()), ("study", _study_presets()))
        for preset, text in texts.items()
        if preset == name
    ]
    if name in DEPTH_PRESETS:
        hits.append(("depth_scaling", ""))
    if len(hits) > 1:
        raise FathomError(f"preset name {name!r} is ambiguous ({[k for k, _ in hits]})")
    if not hits:
        known = preset_names()
        names = "; ".join(f"{k}: {', '.join(v)}" for k, v in known.items())
        unknown = with_suggestion(
            f"{name!r} is neither a config file nor a preset",
            name,
            [n for v in known.values() for n in v],
        )
        raise FathomError(f"{unknown}; presets: {names}")
    kind, text = hits[0]
    if kind == "depth_scaling":
        return make_config(name), f"depth-scaling preset {name}"
    return validate_config(parse_toml(text, f"preset {name}"), f"preset {name}"), f"preset {name}"


def load_run_config_or_preset(name: str) -> RunConfig:
    """A run config from a TOML path or a run preset; another kind gets a pointer to its command."""
    cfg, origin = load_config(name)
    if not isinstance(cfg, RunConfig):
        command = {"study": "fathom study run", "depth_scaling": "fathom depth-scaling"}[cfg.kind]
        raise FathomError(
            f"{origin} is a {cfg.kind} config, not a single run; run it with `{command} {name}`"
        )
    return cfg
