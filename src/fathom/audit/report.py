"""``audit.md`` from the ``audit.json`` dict: tables and computed sentences, no new numbers.

Two layouts: the image audit's (:func:`to_markdown`: per-checkpoint tables, the across-seed
aggregate, speed) and the language model's (:func:`lm_markdown`, :mod:`fathom.audit.lm`: one
section per run and checkpoint, CE and damage in nats per token, perplexity ``exp(ce)``, FLOPs
per token and as a fraction of the full network (×)); each run is audited on its own there."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fathom.base.units import (
    fmt_estimate_interval,
    fmt_interval,
    fmt_percent,
    fmt_points,
    fmt_value,
    percent,
)
from fathom.stats.sentences_repro import SPEEDUP_RULE, speedup_sentence

# Units of audit.md: accuracy and error rates in percent (stored as fractions), their
# changes in percentage points, CE and damage (ΔCE against the full model) in nats, MAC
# and time fractions of the dense network as ratios (×), forward times in ms.


def _num(x: float | None, unit: str, signed: bool = False) -> str:
    return fmt_value(x, unit, signed=signed)


def _iv(
    iv: Mapping[str, Any] | None, unit: str, *, fraction: bool = False, signed: bool = False
) -> str:
    """``mean [low, high] (n=N)`` in ``unit`` (``fraction``: stored as a fraction, shown in
    percent or percentage points); ``—`` when undefined."""
    if iv is None:
        return "—"
    conv = percent if fraction else (lambda x: x)
    low, high = (None, None) if iv["low"] is None else (conv(iv["low"]), conv(iv["high"]))
    text = fmt_estimate_interval(conv(iv["estimate"]), low, high, unit, signed=signed)
    return f"{text} (n={iv['n']})"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


def _provenance(result: Mapping[str, Any]) -> list[str]:
    rows = []
    for run in result["runs"]:
        for which, rec in run["checkpoints"].items():
            if "missing" in rec:
                rows.append(
                    [run["run_id"], run["arm"], str(run["seed"]), which, "missing", rec["missing"]]
                )
            else:
                rows.append(
                    [
                        run["run_id"],
                        run["arm"],
                        str(run["seed"]),
                        which,
                        str(rec["epoch"]),
                        f"`{rec['params_sha256']}`",
                    ]
                )
    lines = ["## Runs and checkpoints", ""]
    lines += _table(["run", "arm", "seed", "checkpoint", "epoch", "params_sha256"], rows)
    for s in result["skipped"]:
        lines.append(f"- skipped `{s['run_id']}`: {s['reason']}")
    return lines


def _run_tables(run: Mapping[str, Any], which: str, rec: Mapping[str, Any]) -> list[str]:
    lines = [
        f"### `{run['run_id']}` ({run['arm']}, seed {run['seed']}), {which} checkpoint, epoch {rec['epoch']}",
        "",
    ]
    loss = rec.get("loss")  # a run's [loss] other than plain cross-entropy: damage is its
    unit = "nats" if loss is None or loss["name"] == "cross_entropy" else ""
    if loss is not None:
        lines += [
            f"Damage is the change of the run's loss, {loss['name']} ({loss['reduction']}, "
            f"target {loss['target']}), against the full network; CE is the logits' "
            "cross-entropy.",
            "",
        ]
    lines += _table(
        [
            "mask",
            "kept",
            "MACs/example",
            "MACs of dense (×)",
            "val acc (%)",
            f"val damage ({unit or 'loss'})",
            "test acc (%)",
            "test CE (nats)",
            _damage_label(unit),
        ],
        [
            [
                f"`{m['mask']}`",
                str(m["kept"]),
                str(m["macs"]),
                _num(m["macs_fraction"], "×"),
                fmt_percent(m["val"]["acc"]),
                _num(m["val"]["damage"], unit, True),
                fmt_percent(m["test"]["acc"]),
                _num(m["test"]["ce"], "nats"),
                _num(m["test"]["damage"], unit, True),
            ]
            for m in rec["masks"]
        ],
    )
    routing = rec["routing"]  # None: the router was off
    if routing:
        t = routing["test"]
        lines += [
            "",
            f"Router (tree depth {routing['tree']['depth']}, {routing['tree']['leaves']} leaves): "
            f"test accuracy {fmt_percent(t['accuracy'])}, test error increase "
            f"{fmt_points(t['error_increase'])} (tolerance {fmt_value(percent(t['tolerance']), 'pp')}: "
            f"{'held' if t['tolerance_held'] else 'not held'}), "
            f"cost {_num(t['cost_fraction'], '×')} of dense MACs; {routing['control']['verdict']}. "
            f"Static mask `{routing['static']['mask']}`: test accuracy {fmt_percent(routing['static']['test']['accuracy'])}, "
            f"tolerance {'held' if routing['static']['test']['tolerance_held'] else 'not held'}. "
            + _routed_timing(routing["timing"]),
        ]
    return [*lines, ""]


def _routed_timing(t: Mapping[str, Any]) -> str:
    """Grouped routed inference time over dense: median and IQR of per-repeat ratios."""
    q1, q3 = t["routed_over_dense_iqr"]
    return (
        f"Grouped routed inference {_num(t['routed_over_dense'], '×')} the dense time "
        f"(median of {t['repeats']} repeats' routed/dense ratios, IQR {_num(q1, '×')}–"
        f"{_num(q3, '×')}; {t['examples']} examples, batch {t['batch_size']}, {t['device']}); "
        + speedup_sentence("grouped routed inference", t["dense_over_routed"])
    )


def _aggregate(which: str, agg: Mapping[str, Any]) -> list[str]:
    """The across-seed section of one checkpoint (``aggregate[which]`` of ``audit.json``)."""
    lines = [f"## Across seeds: {which} checkpoint", ""]
    arms = agg["arms"]
    if not arms:
        return [*lines, "No run was audited at this checkpoint.", ""]
    loss = agg.get("damage_loss")  # the runs' [loss] (absent: plain cross-entropy)
    unit = "nats" if loss is None or loss["name"] == "cross_entropy" else ""
    what = (
        "test CE over the same model's full output, in nats"
        if loss is None
        else f"the runs' loss ({loss['name']}, {loss['reduction']}, target {loss['target']}) "
        f"on test over the same model's full output{', in nats' if unit else ''}"
    )
    lines += [
        "Means over seeds with 95% Student-t intervals (descriptive); each paired-damage verdict "
        "is Holm-corrected over the comparisons of this checkpoint (docs/statistics.md). Damage "
        f"is the increase of {what}.",
        "",
    ]
    lines += _by_size(arms, unit)
    lines += ["", "### Paired damage differences against the reference arm", ""]
    if agg.get("paired_damage_not_judged"):
        lines.append(f"- not judged: {agg['paired_damage_not_judged']}")
    else:
        lines += [f"- {p['sentence']}" for p in agg["paired_damage"]] or [
            "- no second arm to compare"
        ]
    lines += _branch_deletion(arms, unit)
    lines += _interactions(arms)
    lines += _resilience(arms)
    lines += _routing_summary(arms)
    return [*lines, ""]


def _damage_label(unit: str) -> str:
    """``test damage (nats)``, or ``(loss)`` in a loss other than cross-entropy."""
    return f"test damage ({unit or 'loss'})"


def _by_size(arms: Mapping[str, Any], unit: str = "nats") -> list[str]:
    rows = [
        [
            name,
            f"{size} of {arm['k']}",
            str(s["n_masks"]),
            _iv(s["test_acc"], "%", fraction=True),
            _iv(s["test_damage"], unit, signed=True),
        ]
        for name, arm in arms.items()
        for size, s in sorted(arm["by_size"].items(), key=lambda kv: int(kv[0]))
    ]
    lines = ["### By number of kept branches (mean over the masks of that size)", ""]
    return lines + _table(["arm", "kept", "masks", "test acc (%)", _damage_label(unit)], rows)


def _branch_deletion(arms: Mapping[str, Any], unit: str = "nats") -> list[str]:
    rows = [
        [
            name,
            str(b["branch"]),
            str(b["branch_macs"]),
            _num(b["branch_macs_fraction"], "×"),
            _iv(b["test_acc"], "%", fraction=True),
            _iv(b["test_damage"], unit, signed=True),
        ]
        for name, arm in arms.items()
        for b in arm["branches"]
    ]
    header = [
        "arm",
        "branch removed",
        "branch MACs",
        "branch MACs of dense (×)",
        "test acc (%)",
        _damage_label(unit),
    ]
    return ["", "### Single-branch deletion", "", *_table(header, rows)]


def _interactions(arms: Mapping[str, Any]) -> list[str]:
    lines = [
        "",
        "### Interactions",
        "",
        "Mean per-example fraction of nonconstant centered-logit mask-response energy (squared "
        "Möbius coefficients) in interactions of order >= 2.",
        "",
    ]
    return lines + _table(
        ["arm", "val", "test"],
        [
            [
                n,
                _iv(a["interactions"]["val_mean_fraction"], "%", fraction=True),
                _iv(a["interactions"]["test_mean_fraction"], "%", fraction=True),
            ]
            for n, a in arms.items()
        ],
    )


def _resilience(arms: Mapping[str, Any]) -> list[str]:
    lines = ["", "### Per-class resilience", ""]
    for name, arm in arms.items():
        r = arm["resilience"]
        lines.append(
            f"- {name} (masks keeping {r['keep']}): contrast on test, raw "
            f"{_iv(r['test_contrast_raw'], 'pp', fraction=True, signed=True)}, margin-standardized "
            f"{_iv(r['test_contrast_standardized'], 'pp', fraction=True, signed=True)} "
            f"(bins and weights fixed on validation)."
        )
    return lines


def _routing_summary(arms: Mapping[str, Any]) -> list[str]:
    lines = ["", "### Routing", ""]
    for name, arm in arms.items():
        r = arm["routing"]
        if r is None:
            lines.append(f"- {name}: routing not run.")
            continue
        lines.append(
            f"- {name}: tolerance held on test in {r['tolerance_held']} of {r['runs']} runs (static mask: "
            f"{r['static_tolerance_held']} of {r['runs']}); accuracy {_iv(r['test_accuracy'], '%', fraction=True)}, "
            f"cost {_iv(r['test_cost_fraction'], '×')} of dense MACs, control accuracy "
            f"{_iv(r['control_accuracy'], '%', fraction=True)}; routed/dense time {_iv(r['routed_over_dense_time'], '×')}; "
            f"{r['runs_beating_control']} of {r['runs']} runs beat their control (permutation test). {r['sentence']}"
        )
    return lines


def _speed(result: Mapping[str, Any]) -> list[str]:
    lines = ["## Reduced-network inference time", ""]
    for s in result["speed"]:
        for t in s["timings"]:
            lines.append(
                f"{s['architecture']} ({s['dtype']}, weights of `{s['run_id']}` {s['checkpoint']}), batch "
                f"{t['batch_size']}, {t['device']}, {t['threads']} threads, {t['repeats']} repeats: "
                f"{SPEEDUP_RULE}."
            )
            lines.append("")
            lines += _table(
                [
                    "mask",
                    "forward time (ms), median [IQR]",
                    "speed-up (×), median [IQR]",
                    "verdict",
                ],
                _speed_rows(t),
            )
            lines.append("")
    return lines


def _speed_rows(t: Mapping[str, Any]) -> list[list[str]]:
    rows = []
    for i, (m, sec, (q1, q3)) in enumerate(zip(t["masks"], t["median_seconds"], t["seconds_iqr"])):
        sp = t["speedup"][i]
        rows.append(
            [
                f"`{m}`",
                f"{_num(1e3 * sec, 'ms')} {fmt_interval(1e3 * q1, 1e3 * q3, 'ms', signed=False)}",
                f"{_num(sp['median'], '×')} {fmt_interval(sp['q1'], sp['q3'], '×', signed=False)}",
                speedup_sentence(f"mask {m}", sp),
            ]
        )
    return rows


def to_markdown(result: Mapping[str, Any]) -> str:
    """The full ``audit.md``."""
    lines = [
        f"# Layer-removal audit: `{result['target']}`",
        "",
        f"{len(result['runs'])} run(s) audited, {len(result['skipped'])} skipped; masks use gain one for "
        "kept branches and do not compute removed ones. Every number below is traceable to the run "
        "and checkpoint hash listed first; per-example arrays are in the `.npz` files next to this page.",
        "",
    ]
    lines += _provenance(result)
    lines.append("")
    for which, agg in result["aggregate"].items():
        lines += _aggregate(which, agg)
    lines += _speed(result)
    lines += ["## Per run", ""]
    for run in result["runs"]:
        for which, rec in run["checkpoints"].items():
            if "missing" not in rec:
                lines += _run_tables(run, which, rec)
    lines += [
        "## Settings",
        "",
        "```",
        *(f"{k} = {v}" for k, v in result["settings"].items()),
        "```",
        "",
    ]
    return "\n".join(lines)


# The language model's audit.md (:mod:`fathom.audit.lm`).


def _nats(x: float | None, signed: bool = False) -> str:
    return _num(x, "nats", signed)


def _lm_checkpoint_lines(run: Mapping[str, Any], which: str, rec: Mapping[str, Any]) -> list[str]:
    """One language-model checkpoint's section: coverage, sentences, masks, greedy path, interactions."""
    cov = rec["coverage"]
    lines = [
        f"### `{run['run_id']}` ({run['arm']}, seed {run['seed']}), {which} checkpoint, "
        f"epoch {rec['epoch']}",
        "",
        f"{rec['k']} blocks; masks evaluated: {cov['text']}. Test {rec['tokens']['test']} "
        f"tokens in {rec['chunks']['test']} contiguous chunks; context {rec['context']}; "
        f"`params_sha256` `{rec['params_sha256']}`.",
        "",
        *(f"- {s}" for s in rec["sentences"]),
        "",
    ]
    rows = [
        [
            f"`{m['mask']}`",
            str(m["kept"]),
            f"{m['flops_per_token']:.4g}",
            fmt_value(m["flops_fraction"], "×"),
            _nats(m["val"]["ce"]),
            fmt_value(m["val"]["ppl"], ""),
            _nats(m["test"]["ce"]),
            fmt_value(m["test"]["ppl"], ""),
            _nats(m["test"]["damage"], True),
        ]
        for m in rec["masks"]
    ]
    header = [
        "mask",
        "kept",
        "FLOPs/token",
        "FLOPs of full (×)",
        "val nats/token",
        "val ppl",
        "test nats/token",
        "test ppl",
        "test damage (nats/token)",
    ]
    lines += _table(header, rows)
    lines += ["", "Greedy ordered removal (each step chosen on validation, judged on test):", ""]
    lines += _table(
        ["step", "block removed", "mask", "test damage (nats/token)", "verdict"],
        [
            [
                str(p["step"]),
                str(p["removed"]),
                f"`{p['mask']}`",
                _nats(p["test_damage"], True),
                p["verdict"]["verdict"],
            ]
            for p in rec["greedy"]
        ],
    )
    inter = rec["interactions"]
    lines += [
        "",
        "Pair interactions around the full network, I(l, j) = damage(−l−j) − damage(−l) − "
        "damage(−j), test nats/token:",
        "",
    ]
    lines += _table(
        ["blocks", "interaction (nats/token)"],
        [[str(p["blocks"]), _nats(p["interaction"], True)] for p in inter["pairs_around_full"]],
    )
    lat = inter["lattice"]
    if lat is not None:
        lines += [
            "",
            "Möbius coefficients over the kept sets (test nats/token; Σ over non-empty sets = "
            "full − empty network): main effects "
            + ", ".join(f"block {b} {_nats(g, True)}" for b, g in enumerate(lat["main_effects"]))
            + "; Σ g by order "
            + ", ".join(f"{r}: {_nats(v, True)}" for r, v in enumerate(lat["sum_by_order"]))
            + "; Σ |g| by order "
            + ", ".join(f"{r}: {_nats(v)}" for r, v in enumerate(lat["abs_by_order"]))
            + ".",
        ]
    return [*lines, ""]


def lm_markdown(result: Mapping[str, Any]) -> str:
    """The full ``audit.md`` of language-model runs (one section per run and checkpoint)."""
    lines = [
        f"# Layer-removal audit of a language model: `{result['target']}`",
        "",
        f"{len(result['runs'])} run(s) audited, {len(result['skipped'])} skipped. A removed "
        "block is not computed; kept blocks run at gain one. Damage is the change of token "
        "cross-entropy (nats per token) against the same model's full network; perplexity is "
        "exp(nats/token). A block *can go* when its removal's damage interval lies inside the "
        "region of no interest, *cannot go* when above it (docs/statistics.md; paired over "
        "contiguous test chunks in place of seeds, Holm over the family). Each run is audited "
        "on its own: no across-seed aggregate is computed for language models.",
        "",
    ]
    for s in result["skipped"]:
        lines.append(f"- skipped `{s['run_id']}`: {s['reason']}")
    for run in result["runs"]:
        for which, rec in run["checkpoints"].items():
            if "missing" in rec:
                lines += [f"- `{run['run_id']}` {which}: missing ({rec['missing']})", ""]
            else:
                lines += _lm_checkpoint_lines(run, which, rec)
    lines += ["## Settings", "", "```", *(f"{k} = {v}" for k, v in result["settings"].items())]
    return "\n".join([*lines, "```", ""])
