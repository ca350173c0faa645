"""Field names as the explorer shows them: split-generic keys and their definitions.

A field recorded per split (``val/acc``, ``split/test/class_acc/3``) is listed once under
its generic key (``{split}/acc``, ``split/{split}/class_acc/3``); the split selector picks
the concrete name. Every definition comes from the telemetry registry
(:func:`fathom.telemetry.registry.field_for`, the trainer's own fields included); a name the
registry does not declare is shown as ``undeclared``.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from fathom.config.models import SPLITS
from fathom.errors import FathomError


def is_trainer_field(key: str) -> bool:
    """Whether a (generic) key is one of the trainer's own fields (registry group ``trainer``)."""
    from fathom.telemetry.trainer_fields import TRAINER_FIELDS

    return any(f.pattern == key and f.family == "trainer" for f in TRAINER_FIELDS)


def split_key(name: str) -> tuple[str, str | None]:
    """``(generic key, split)``: ``val/acc -> ({split}/acc, val)``; others keep their name."""
    parts = name.split("/")
    if len(parts) >= 2 and parts[0] in SPLITS:
        return "/".join(["{split}", *parts[1:]]), parts[0]
    if len(parts) >= 3 and parts[0] == "split" and parts[1] in SPLITS:
        return "/".join(["split", "{split}", *parts[2:]]), parts[1]
    return name, None


def concrete(key: str, split: str | None) -> str:
    return key if split is None else key.replace("{split}", split, 1)


def describe(example: str) -> dict[str, Any]:
    """Formula, units, scope, caveats and family of a concrete field name, from the registry."""
    try:
        from fathom.telemetry.registry import field_for

        f = field_for(example)
    except (ImportError, FathomError):
        return {"source": "undeclared", "formula": "not declared in the telemetry registry"}
    return {
        "source": "telemetry registry",
        "formula": f.formula,
        "units": f.units,
        "scope": f.scope,
        "caveats": f.caveats,
        "family": f.family,
    }


_ACCURACY = re.compile(r"(^|/)(acc|class_acc/\d+)$")


def is_accuracy(name: str) -> bool:
    """Accuracy fields (fractions in the history, percent in every rendering)."""
    return bool(_ACCURACY.search(name))


def facet_key(key: str, example: str) -> tuple[str, str | None, str | None]:
    """``(generic key, facet kind, facet)`` of a per-layer or per-class field.

    A registry field whose pattern's last segment holds a placeholder (``{layer}``,
    ``{input}`` (qualified module names), ``{block}`` (a residual block's), ``{cls}``) is
    faceted by that segment:
    ``grad/pex/diversity/head -> (grad/pex/diversity/{layer}, layer, head)``,
    ``grad/block/mean_norm/blocks.0 -> (grad/block/mean_norm/{block}, block, blocks.0)``.
    Others: no facet.
    """
    try:
        from fathom.telemetry.registry import field_for

        pattern = field_for(example).pattern
    except (ImportError, FathomError):
        return key, None, None
    last = pattern.rsplit("/", 1)[-1]
    if "{" not in last or "/" not in key:
        return key, None, None
    kind = "class" if "{cls}" in last else "block" if "{block}" in last else "layer"
    prefix, facet = key.rsplit("/", 1)
    return f"{prefix}/{{{kind}}}", kind, facet


def recorded_layers(run: Any) -> list[str]:
    """The layer names (facets of kind ``layer``) a run's history records: the longest
    per-field layer list first (a field recorded for every layer gives the model order),
    then names only other fields hold, in first-seen order."""
    per: dict[str, list[str]] = {}
    for name in dict.fromkeys(k for row in run.rows for k in row):
        generic, kind, facet = facet_cached(split_key(name)[0], name)
        if kind == "layer" and facet is not None and facet not in per.setdefault(generic, []):
            per[generic].append(facet)
    out: dict[str, None] = {}
    for names in sorted(per.values(), key=len, reverse=True):
        out.update(dict.fromkeys(names))
    return list(out)


@functools.lru_cache(maxsize=65536)
def facet_cached(key: str, example: str) -> tuple[str, str | None, str | None]:
    """:func:`facet_key`, memoized (a registry look-up per distinct name)."""
    return facet_key(key, example)
