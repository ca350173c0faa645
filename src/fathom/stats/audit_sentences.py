"""The audit's sentences. For the classifier audit, its digest sentences: one per (arm, checkpoint), from the judged paired-damage
comparisons of ``audit.json``'s aggregate (:mod:`fathom.audit.aggregate`); each comparison's
full sentence is its own ``sentence`` field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fathom.base.units import fmt_percent, fmt_value
from fathom.stats.results import Comparison


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


# The language model's layer-removal audit (:mod:`fathom.audit.lm`): one sentence per block
# from its judged single removal, and the greedy path's longest removable prefix.

VERDICT_WORDS = {"equivalent": "can go", "worse": "cannot go", "better": "helps when removed"}
"""A removal's judged damage (test nats/token against the full network) in the audit's words;
any other verdict is ``not established``."""


def removal_words(verdict: str) -> str:
    """A removal's verdict in the audit's words (:data:`VERDICT_WORDS`)."""
    return VERDICT_WORDS.get(verdict, "not established")


def _damage_text(c: Comparison) -> str:
    """``+0.0042 nats/token [-0.0011, +0.0095] (95.00% interval paired over 20 contiguous
    test chunks, Holm step 1 of 4)``."""
    if c.estimate is None:
        return c.reason
    est = fmt_value(c.estimate, "nats", signed=True, suffix=False)
    if c.low is None:
        return f"{est} nats/token (n={c.n} chunks: no interval)"
    lo, hi = (fmt_value(v, "nats", signed=True, suffix=False) for v in (c.low, c.high))
    level = fmt_percent(c.level) if c.level is not None else "?"
    frag = ", fragile" if c.fragile else ""
    return (
        f"{est} nats/token [{lo}, {hi}] ({level} interval paired over {c.n} contiguous test "
        f"chunks, Holm step {c.holm_step} of {c.family_size}{frag})"
    )


def _flops_note(flops: dict[str, int], label: str, full: str) -> str:
    saved = 1.0 - flops[label] / flops[full]
    return f"saves {fmt_percent(saved, digits=1)} of the FLOPs"


def single_sentences(
    singles: list[Comparison], flops: dict[str, int], full: str, delta: float
) -> list[str]:
    """One sentence per block from its judged single removal."""
    out = []
    for b, c in enumerate(singles):
        label = c.context["mask"]
        word = removal_words(c.verdict)
        out.append(
            f"block {b} {word}: removing it alone changes test nats/token by {_damage_text(c)}; "
            f"region of no interest ±{fmt_value(delta, 'nats')}; {_flops_note(flops, label, full)}."
        )
    return out


def path_sentence(
    path: list[dict[str, Any]], steps: list[Comparison], flops: dict[str, int], full: str
) -> str:
    """The most blocks that can go together along the greedy path (module docstring)."""
    can = 0
    for c in steps:
        if c.verdict != "equivalent":
            break
        can += 1
    if can == 0:
        first = path[0]
        return (
            f"no block can go along the greedy path: its first step (block {first['removed']}, "
            f"chosen on validation) is {steps[0].verdict} on test, {_damage_text(steps[0])}."
        )
    blocks = [p["removed"] for p in path[:can]]
    last = path[can - 1]["mask"]
    return (
        f"blocks {blocks} can go together (greedy order chosen on validation; each step "
        f"equivalent on test): test nats/token {_damage_text(steps[can - 1])}; "
        f"{_flops_note(flops, last, full)} (mask `{last}`)."
    )
