"""``audit.md`` of language-model runs (:mod:`fathom.audit.lm`): tables and the computed
sentences from ``audit.json``, no new numbers. CE and damage in nats per token, perplexity
``exp(ce)``, FLOPs per token and as a fraction of the full network (×)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fathom.base.units import fmt_value


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(r) + " |" for r in rows]


def _nats(x: float | None, signed: bool = False) -> str:
    return fmt_value(x, "nats", signed=signed)


def _checkpoint_lines(run: Mapping[str, Any], which: str, rec: Mapping[str, Any]) -> list[str]:
    """One checkpoint's section: coverage, sentences, masks, greedy path, interactions."""
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
                lines += _checkpoint_lines(run, which, rec)
    lines += ["## Settings", "", "```", *(f"{k} = {v}" for k, v in result["settings"].items())]
    return "\n".join([*lines, "```", ""])
