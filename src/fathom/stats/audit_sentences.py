"""The audit's digest sentences: one per (arm, checkpoint), from the judged paired-damage
comparisons of ``audit.json``'s aggregate (:mod:`fathom.audit.aggregate`); each comparison's
full sentence is its own ``sentence`` field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fathom.units import fmt_value


def damage_sentences(agg: Mapping[str, Any]) -> list[str]:
    """One sentence per (arm, checkpoint) from the audit's computed paired-damage verdicts:
    ``sd_constant vs residual, selected checkpoint, damage ΔCE by kept branches: 0 of 4
    better (−0.4527 nats [−0.5229, −0.3824]), ...``."""
    groups: dict[tuple[str, str, str], list[Mapping[str, Any]]] = {}
    for which, a in agg.items():
        for p in a.get("paired_damage") or []:
            groups.setdefault((p["arm"], p["reference"], which), []).append(p)
    out = []
    for (arm, ref, which), ps in sorted(groups.items()):
        k = next((a["k"] for a in [(agg[which].get("arms") or {}).get(arm) or {}] if "k" in a), "?")
        parts = []
        for p in sorted(ps, key=lambda p: int(p["kept"])):
            v = p.get("verdict") or {}
            d = v.get("diff") or {}
            if d.get("estimate") is None:
                parts.append(f"{p['kept']} of {k} kept: {v.get('verdict', 'no comparison')}")
                continue
            iv = ""
            if d.get("low") is not None:
                iv = f" [{fmt_value(d['low'], 'nats', signed=True)}, {fmt_value(d['high'], 'nats', signed=True)}]"
            word = f"{v['verdict']}, fragile" if v.get("fragile") else v["verdict"]
            parts.append(
                f"{p['kept']} of {k} kept {word} ({fmt_value(d['estimate'], 'nats', signed=True)}{iv})"
            )
        out.append(
            f"{arm} vs {ref}, {which} checkpoint, test damage ΔCE: " + "; ".join(parts) + "."
        )
    return out
