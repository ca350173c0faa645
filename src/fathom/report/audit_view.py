"""The audit in the report: headline sentences and tables.

Headline: the computed paired-damage sentences of ``audit.json``'s aggregate (per checkpoint),
a table per arm, checkpoint and number of kept branches (test accuracy in %, damage ΔCE in
nats, both with their 95% t intervals over seeds; verdicts Holm-corrected per checkpoint),
and the single-branch deletions. The
mask and example explorer's data are :mod:`fathom.report.examples`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fathom.base.units import fmt_estimate_interval, fmt_value, percent
from fathom.report.tables import esc, headline_table
from fathom.stats.audit_sentences import damage_sentences


def _iv(iv: Mapping[str, Any] | None, unit: str) -> str:
    """``estimate [low, high]`` of an audit interval in ``unit`` (``%``: stored as a fraction;
    the unit in the column header), or ``estimate (n=N)`` without an interval."""
    if not iv:
        return "—"
    conv = percent if unit == "%" else float
    low, high = (None, None) if iv.get("low") is None else (conv(iv["low"]), conv(iv["high"]))
    text = fmt_estimate_interval(
        conv(iv["estimate"]), low, high, unit, signed=unit != "%", suffix=False
    )
    return f"{text} (n={iv['n']})" if low is None else text


def _sentences_html(agg: Mapping[str, Any]) -> list[str]:
    full = [
        f"{w} checkpoint: {p['sentence']}"
        for w, a in agg.items()
        for p in a.get("paired_damage") or []
    ]
    return [
        "<ul class='verdicts' id='audit-verdicts'>"
        + "".join(f"<li>{esc(s)}</li>" for s in damage_sentences(agg))
        + "</ul>",
        "<details><summary>every damage comparison as a full sentence</summary><ul>"
        + "".join(f"<li>{esc(s)}</li>" for s in full)
        + "</ul></details>",
    ]


_SIZE_TABLES = (
    # (key, table id, caption, unit)
    ("test_damage", "audit-table",
     "Damage ΔCE (nats) [95% CI], mean over the masks keeping that many branches", "nats"),
    ("test_acc", "audit-acc-table",
     "Test accuracy (%) [95% CI], mean over the masks keeping that many branches", "%"),
)  # fmt: skip


def _damage_loss(agg: Mapping[str, Any]) -> str | None:
    """The name of the loss the audit's damage is in when it is not cross-entropy
    (``damage_loss`` of the aggregate: the runs' ``[loss]``), else ``None`` (ΔCE in nats)."""
    for a in agg.values():
        loss = a.get("damage_loss")
        if loss and loss.get("name") != "cross_entropy":
            return str(loss["name"])
    return None


def _size_tables(agg: Mapping[str, Any]) -> list[str]:
    """Per arm and checkpoint, damage and accuracy by the number of kept branches."""
    other = _damage_loss(agg)
    sizes = sorted(
        {
            int(k)
            for a in agg.values()
            for s in (a.get("arms") or {}).values()
            for k in s.get("by_size") or {}
        },
        reverse=True,
    )
    out = []
    for key, tid, caption, unit in _SIZE_TABLES:
        if other is not None and key == "test_damage":  # in the runs' loss, its own units
            caption, unit = caption.replace("ΔCE (nats)", f"Δ{other} (loss units)"), ""
        rows = []
        for which, a in agg.items():
            for arm, s in (a.get("arms") or {}).items():
                by = s.get("by_size") or {}
                cells = [_iv(by[str(k)][key], unit) if str(k) in by else "—" for k in sizes]
                rows.append([arm, which, *cells])
        if rows:
            head = ["arm", "checkpoint", *(f"{k} kept" for k in sizes)]
            out.append(headline_table(tid, caption, head, rows, 2))
    return out


def _branch_table(agg: Mapping[str, Any]) -> list[str]:
    """The single-branch deletions, collapsed."""
    other = _damage_loss(agg)
    rows = []
    for which, a in agg.items():
        for arm, s in (a.get("arms") or {}).items():
            for br in s.get("branches") or []:
                rows.append(
                    [arm, which, str(br["branch"]),
                     fmt_value(br["branch_macs_fraction"], "×", suffix=False),
                     _iv(br["test_acc"], "%"), _iv(br["test_damage"], "" if other else "nats")]
                )  # fmt: skip
    if not rows:
        return []
    head = ["arm", "checkpoint", "branch removed", "MACs of dense (×)",
            "test acc (%) [95% CI]",
            f"damage Δ{other} [95% CI]" if other else "damage ΔCE (nats) [95% CI]"]  # fmt: skip
    return [
        "<details><summary>single-branch deletions (one row per arm, checkpoint and branch)"
        "</summary>"
        + headline_table("branch-table", "Removing one branch", head, rows, 2)
        + "</details>"
    ]


def audit_headline(audit: Mapping[str, Any]) -> str:
    """Damage sentences, the by-size tables and the single-branch deletions of an audit."""
    agg = audit.get("aggregate") or {}
    out = [*_sentences_html(agg), *_size_tables(agg), *_branch_table(agg)]
    other = _damage_loss(agg)
    what = "test CE over the same model's full output (nats)"
    if other is not None:
        what = (
            f"the runs' loss, {other}, on test over the same model's full output (its own "
            "units; no smallest effect of interest is defined for it, so no verdict)"
        )
    out.append(
        f"<p class='note'>Damage is the increase of {what}; "
        "table intervals are 95% Student-t over seeds (descriptive); each verdict's interval is "
        "Holm-corrected over the comparisons of its checkpoint (docs/statistics.md). Kept branches "
        "run at gain one; removed branches are not computed.</p>"
    )
    return "\n".join(out)
