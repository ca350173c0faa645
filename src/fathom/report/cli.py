"""``fathom report DIR``: the self-contained HTML explorer, figures and summary.md."""

from __future__ import annotations

import argparse


def _cmd_report(args: argparse.Namespace) -> int:
    from fathom.base.preflight import check_exists, check_output_dir

    check_exists(args.dir, "a run directory or a study directory")  # before torch
    check_output_dir(args.out)
    from fathom.report.build import build_report

    result = build_report(args.dir, args.out, with_figures=not args.no_figures)
    waiting = f", a snapshot: {len(result.unfinished)} not finished" if result.unfinished else ""
    size = result.html.stat().st_size / 1e6
    print(f"report: {result.html} ({result.runs} runs, {size:.2f} MB{waiting})")
    for line in result.unfinished:  # the report is a snapshot of these runs
        print(f"not finished: {line}")
    print(f"summary: {result.summary_md}")
    for fig in result.figures:
        print(f"figure: {fig}")
    for line in [*result.flagged, *result.notes]:
        print(f"flagged: {line}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report", help="write report.html (self-contained explorer), figures, summary.md"
    )
    p.add_argument("dir", help="a study directory or one run directory")
    p.add_argument("--out", help="output directory (default: DIR/report)")
    p.add_argument("--no-figures", action="store_true", help="skip the matplotlib PNG figures")
    p.set_defaults(func=_cmd_report)
