"""What a study scaled down, computed by comparing its config with the full protocol.

A study names the protocol it scales down (``study.protocol``, a study preset); a study
that names none (a user's own study) is compared with nothing, and its summary says so
instead of inventing departures from a protocol it never claimed. The shipped presets name
``ciresan-sd`` (:data:`FULL_PROTOCOL`): full widths, the
whole 50,000 / 10,000 fitting / validation split, 100 epochs, batch 64, evaluation at epoch
1 and every 5, three seeds, five recipes, tuning over {0.01, 0.03, 0.1}. Every protocol key
whose value differs is reported, as a *reduction* (smaller network, fewer examples, epochs,
seeds, recipes or tuning rates) or a *change* (anything else that can change the numbers:
dataset, split, batch size, optimizer, evaluation cadence, precision, stopping rule, ...).

Keys that cannot change the trained numbers or the comparisons are not compared: names,
descriptions, the user's own ``scale_down`` notes, threads, device, checkpoint and
telemetry schedules (instruments are read-only), the execution path and the evaluation batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from fathom.config.model_kinds import model_kind
from fathom.data.registry import dataset_spec
from fathom.data.splits import DEFAULT_VAL_SIZE
from fathom.models import kind_function
from fathom.study.config import StudyConfig, load_study

FULL_PROTOCOL = "ciresan-sd"
"""The preset every study is compared against."""

_NOT_COMPARED: tuple[str, ...] = (
    "study.name",
    "study.description",
    "study.scale_down",
    "study.protocol",
    "study.threads_per_run",
    "base.name",
    "base.study",
    "base.device",
    "base.data.data_dir",
    "base.checkpoints",
    "base.telemetry",
    "base.execution.path",
    "base.execution.max_graph_branches",
    "base.eval.batch_size",
    "base.optim.impl",
)
"""Dotted key prefixes that do not change the trained numbers or the comparisons."""


@dataclass(frozen=True)
class ScaleDown:
    """One departure from the full protocol: ``kind`` is ``"reduced"`` or ``"changed"``."""

    key: str
    kind: str
    study: Any
    full: Any
    text: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return asdict(self)


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _n(x: int) -> str:
    return f"{x:,}"


def _fit_size(cfg: StudyConfig) -> int:
    train = dataset_spec(cfg.base.data.dataset).train_size
    return train - DEFAULT_VAL_SIZE if cfg.base.data.split == "fit-val" else train


def _widths(cfg: StudyConfig) -> str:
    """``784-250-...-10``: input size, the hidden widths the model kind's row states
    (:attr:`fathom.config.model_kinds.ModelKind.widths`, after ``width_mult``), classes."""
    m, spec = cfg.base.model, dataset_spec(cfg.base.data.dataset)
    widths = model_kind(m.kind).widths
    assert widths is not None  # a study's recipe kinds state their widths (StudyConfig)
    d_in = math.prod(spec.image_shape)
    return "-".join(str(w) for w in (d_in, *kind_function(widths)(m), spec.classes))


def _cadence(cfg: StudyConfig) -> str:
    first = ", ".join(str(e) for e in cfg.base.eval.first)
    return f"epoch(s) {first} and every {cfg.base.eval.every}"


def _width_item(s: StudyConfig, f: StudyConfig) -> tuple[bool, str]:
    smaller = s.base.model.width_mult < f.base.model.width_mult
    return smaller, (
        f"widths x {s.base.model.width_mult:g}: {_widths(s)} instead of {_widths(f)}"
        if s.base.model.widths == f.base.model.widths
        else f"widths {_widths(s)} instead of {_widths(f)}"
    )


def _fit_item(s: StudyConfig, f: StudyConfig) -> tuple[bool, str]:
    n, full = s.base.data.fit_subset, f.base.data.fit_subset or _fit_size(f)
    if n is None:
        return False, f"fitting set: all {_n(_fit_size(s))} fitting examples instead of {_n(full)}"
    return n < full, f"fitting set: the first {_n(n)} of the {_n(_fit_size(s))} fitting examples"


def _eval_item(s: StudyConfig, f: StudyConfig) -> tuple[bool, str]:
    n = s.base.data.eval_subset
    full = f.base.data.eval_subset or DEFAULT_VAL_SIZE
    if n is None:
        return False, "validation and test sets: all examples instead of a subset"
    return n < full, f"validation and test sets: the first {_n(n)} of {_n(full)} each"


def _seeds_item(s: StudyConfig, f: StudyConfig) -> tuple[bool, str]:
    a, b = s.study.seeds, f.study.seeds
    return len(a) < len(b), (
        f"{len(a)} seed(s) ({', '.join(map(str, a))}) instead of {len(b)} "
        f"({', '.join(map(str, b))})"
    )


def _recipes_item(s: StudyConfig, f: StudyConfig) -> tuple[bool, str]:
    a, b = s.study.recipes, f.study.recipes
    missing = [r for r in b if r not in a]
    return set(a) < set(b), (
        f"recipes {', '.join(a)} (without {', '.join(missing)})"
        if missing
        else f"recipes {', '.join(a)} instead of {', '.join(b)}"
    )


def _tuning_item(s: StudyConfig, f: StudyConfig) -> tuple[bool, str]:
    a, b = s.tuning, f.tuning
    full = f"tuning at seed {b.seed} over LR {{{', '.join(f'{x:g}' for x in b.lrs)}}}"
    if a.mode == "frozen":
        rates = ", ".join(f"{r} {lr:g}" for r, lr in (s.fixed_lrs() or {}).items())
        return False, f"frozen learning rates ({rates}; no tuning phase) instead of {full}"
    if not a.enabled:
        return b.enabled, f"no tuning phase (fixed LR {s.study.lr:g}) instead of {full}"
    mine = f"tuning at seed {a.seed} over LR {{{', '.join(f'{x:g}' for x in a.lrs)}}}"
    return set(a.lrs) < set(b.lrs), f"{mine} instead of {full}"


# key (or key prefix) -> (the keys it covers, a describer returning (is_reduction, text))
_DESCRIBED: dict[
    str, tuple[tuple[str, ...], Callable[[StudyConfig, StudyConfig], tuple[bool, str]]]
] = {
    "widths": (("base.model.widths", "base.model.width_mult"), _width_item),
    "fit_subset": (("base.data.fit_subset",), _fit_item),
    "eval_subset": (("base.data.eval_subset",), _eval_item),
    "epochs": (
        ("base.optim.epochs",),
        lambda s, f: (
            s.base.optim.epochs < f.base.optim.epochs,
            f"{s.base.optim.epochs} epochs instead of {f.base.optim.epochs}",
        ),
    ),
    "batch": (
        ("base.optim.batch_size",),
        lambda s, f: (
            False,
            f"batch size {s.base.optim.batch_size} instead of {f.base.optim.batch_size}",
        ),
    ),
    "eval": (
        ("base.eval.first", "base.eval.every"),
        lambda s, f: (False, f"evaluation at {_cadence(s)} instead of {_cadence(f)}"),
    ),
    "seeds": (("study.seeds",), _seeds_item),
    "recipes": (("study.recipes",), _recipes_item),
    "tuning": (
        ("tuning.mode", "tuning.enabled", "tuning.lr", "tuning.lrs", "tuning.seed", "study.lr"),
        _tuning_item,
    ),
}


def _fmt(v: Any) -> str:
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    return "none" if v is None else f"{v:g}" if isinstance(v, float) else str(v)


def scaled_down(study: StudyConfig, full: StudyConfig | None = None) -> list[ScaleDown]:
    """Every protocol key where ``study`` differs from ``full`` (default: the preset named by
    ``study.protocol``; none named: nothing is compared, an empty list).

    Reductions come first, in protocol order (network, data, epochs, seeds, recipes,
    tuning), then changes. An empty list with a protocol means the study runs it in full.
    """
    if full is None:
        if study.study.protocol is None:
            return []
        full = load_study(study.study.protocol)[0]
    a, b = _flatten(study.model_dump(mode="json")), _flatten(full.model_dump(mode="json"))
    keys = [
        k
        for k in dict.fromkeys([*b, *a])
        if a.get(k) != b.get(k) and not any(k == p or k.startswith(p + ".") for p in _NOT_COMPARED)
    ]
    out: list[ScaleDown] = []
    covered: set[str] = set()
    for covers, describe in _DESCRIBED.values():
        hit = [k for c in covers for k in keys if k == c or k.startswith(c + ".")]
        if not hit:
            continue
        covered.update(covers)
        reduced, text = describe(study, full)
        out.append(
            ScaleDown(
                hit[0], "reduced" if reduced else "changed", a.get(hit[0]), b.get(hit[0]), text
            )
        )
    for k in keys:
        if not any(k == c or k.startswith(c + ".") for c in covered):
            text = f"{k.removeprefix('base.')} {_fmt(a.get(k))} instead of {_fmt(b.get(k))}"
            out.append(ScaleDown(k, "changed", a.get(k), b.get(k), text))
    return sorted(out, key=lambda d: d.kind != "reduced")


NO_PROTOCOL = (
    "Not compared with a full protocol: the study names none (set study.protocol to the "
    'study preset it scales down, e.g. "ciresan-sd", to have every departure listed).'
)


def scale_down_sentence(items: list[ScaleDown], protocol: str | None = FULL_PROTOCOL) -> str:
    """The summary's line: what was scaled down and what else differs from ``protocol``.

    ``"Scaled down from the full protocol (preset ciresan-sd): 2 epochs instead of 100.
    Also differs: batch size 128 instead of 64."``, ``"Not scaled down: ..."``, or
    :data:`NO_PROTOCOL` when the study names no protocol (``protocol=None``).
    """
    if protocol is None:
        return NO_PROTOCOL
    reduced = [d.text for d in items if d.kind == "reduced"]
    changed = [d.text for d in items if d.kind == "changed"]
    if not items:
        return f"Not scaled down: the full protocol (preset {protocol})."
    parts = []
    if reduced:
        parts.append(
            f"Scaled down from the full protocol (preset {protocol}): " + "; ".join(reduced) + "."
        )
    if changed:
        lead = "Also differs" if reduced else f"Differs from the full protocol (preset {protocol})"
        parts.append(f"{lead}: " + "; ".join(changed) + ".")
    return " ".join(parts)
