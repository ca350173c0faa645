"""Rule 6 of :mod:`fathom.stats.scaling` in words: the range interval and the failure
evidence combined into one depth-scaling verdict and its sentence, and the factual notes
on where each arm trained. The rules themselves are stated in that module's docstring.
"""

from __future__ import annotations

from fathom.stats.intervals import Interval
from fathom.stats.scaling_table import DepthScalingTable, FailureEvidence
from fathom.stats.verdicts import Verdict, compare, interval_text, signed


def _range_text(
    table: DepthScalingTable, span: list[int], scaling: Interval | None
) -> tuple[str | None, str]:
    """The interval's direction over the range (``"for"``/``"against"``/None) and its clause."""
    if len(span) < 2:
        where = f"depth {span[0]} only" if span else "no depth"
        return None, (
            f"both arms trained together from the shallowest depth at {where}; an interval "
            "needs at least two depths"
        )
    head = f"from depth {span[0]} to {span[-1]}"
    if scaling is None:
        return None, f"{head}, no seed is common to both arms at depths {span[0]} and {span[-1]}"
    delta = f"accuracy change {table.candidate} minus {table.baseline} {signed(scaling.estimate)}"
    if not scaling.has_interval:
        return (
            None,
            f"{head}, {delta} from n={scaling.n} seed: at least 2 seeds are needed for an interval",
        )
    v = compare(scaling, higher_is_better=True, flags_a=[], flags_b=[])
    return {"better": "for", "worse": "against"}.get(
        v.verdict
    ), f"{head} ({delta}, {interval_text(scaling)})"


def _evidence_text(table: DepthScalingTable, ev: list[FailureEvidence]) -> str:
    """``depth 12 (Lyapunov failed on 3/3 seeds, vanilla trained on 3/3; Fisher exact p=0.1)``."""
    parts = []
    for e in ev:
        other = table.baseline if e.failing_arm == table.candidate else table.candidate
        parts.append(
            f"depth {e.depth} ({e.failing_arm} failed on {e.failed[0]}/{e.failed[1]} seeds, "
            f"{other} trained on {e.other[1]}/{e.other[1]}; Fisher exact p={e.p_value:.2g})"
        )
    return ", ".join(parts)


def _tail(
    table: DepthScalingTable,
    span: list[int],
    per_depth: dict[int, Verdict],
    excluded_depths: dict[int, str],
) -> str:
    """Per-depth consistency over the range, then the excluded depths and why."""
    parts = []
    words = {per_depth[d].verdict for d in span}
    if span and len(words) == 1 and words <= {"better", "worse"}:
        at = f"depth {span[0]}" if len(span) == 1 else f"every depth from {span[0]} to {span[-1]}"
        parts.append(
            f"{table.candidate} is {words.pop()} than {table.baseline} at {at} (paired intervals)"
        )
    if excluded_depths:
        listed = "; ".join(f"depth {d}: {why}" for d, why in excluded_depths.items())
        parts.append(f"excluded from the range: {listed}")
    return "".join(f"; {p}" for p in parts)


def combine(
    table: DepthScalingTable,
    span: list[int],
    scaling: Interval | None,
    per_depth: dict[int, Verdict],
    evidence: list[FailureEvidence],
    excluded_depths: dict[int, str],
) -> tuple[str, str]:
    """Rule 6: one verdict and its sentence from the range interval and the failure evidence."""
    cand, base = table.candidate, table.baseline
    ev = {k: [e for e in evidence if e.direction == k] for k in ("against", "for")}
    decisive = {k: [e for e in v if e.decisive] for k, v in ev.items()}
    direction, clause = _range_text(table, span, scaling)
    tail = _tail(table, span, per_depth, excluded_depths)
    if decisive["against"] and decisive["for"]:
        return "inconclusive", (
            f"inconclusive: conflicting failures at {_evidence_text(table, evidence)}; "
            f"{clause}{tail}"
        )
    for key, word, failing, other in (
        ("against", "worse", cand, base),
        ("for", "better", base, cand),
    ):
        if decisive[key]:
            return f"{word} scaling", (
                f"{word} scaling: the {failing} arm fails to train where {other} trains, at "
                f"{_evidence_text(table, decisive[key])}; {clause}{tail}"
            )
    for key, word, opposite, favoured in (
        ("for", "better", "against", cand),
        ("against", "worse", "for", base),
    ):
        if direction != key:
            continue
        if ev[opposite]:
            return "inconclusive", (
                f"inconclusive: the interval {clause} favours {favoured}, but failures point "
                f"the other way at {_evidence_text(table, ev[opposite])}{tail}"
            )
        return f"{word} scaling", (
            f"{word} scaling: the {cand} arm scales {word} than {base} {clause}{tail}"
        )
    note = "".join(
        f"; evidence {key} {cand}, not decisive: {_evidence_text(table, ev[key])}"
        for key in ("against", "for")
        if ev[key]
    )
    if scaling is None or not scaling.has_interval:
        return "inconclusive", f"inconclusive: {clause}{note}{tail}"
    return "not established", (f"not established: {clause}, the interval includes zero{note}{tail}")


def observations(
    cells: dict[int, dict[str, str]], depths: list[int], arms: tuple[str, str]
) -> list[str]:
    """Factual notes on where each arm trained (no comparison of quality)."""
    notes = []
    for arm in arms:
        failed = [d for d in depths if cells[d][arm] == "failed"]
        partial = [d for d in depths if cells[d][arm] == "partial"]
        if failed:
            notes.append(f"{arm} failed to train at depth(s) {failed}")
        if partial:
            notes.append(f"{arm} failed on some seeds at depth(s) {partial}")
    for arm, other in (arms, arms[::-1]):
        only = [d for d in depths if cells[d][arm] == "trained" and cells[d][other] == "failed"]
        if only:
            notes.append(f"only {arm} trained at depth(s) {only}")
    return notes
