"""``fathom runs list|show``: the run registry of a runs directory, in 80 columns."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from fathom.errors import FathomError

_NOT_REGISTERED = (
    "not in the registry (`fathom train` and `fathom study run` index their runs as they "
    "train; a run trained by an older fathom, or copied here, is not indexed)"
)


def _unregistered(args: argparse.Namespace, run_id: str | None = None) -> str:
    """Where the run directories of ``fathom train`` under ``--runs-dir`` are (named
    ``run_id``, when given) and how to read them, for an error that the registry lacks them."""
    name = run_id or "*"
    study = getattr(args, "study", None) or "*"
    found = sorted(p.parent for p in Path(args.runs_dir).glob(f"{study}/{name}/manifest.json"))
    if not found:
        return ""
    shown = ", ".join(repr(str(p)) for p in found[:3]) + (" ..." if len(found) > 3 else "")
    return (
        f"; {_NOT_REGISTERED}: its directory {shown} is read directly, e.g. `fathom report "
        f"{found[0]}` or, in Python, `fathom.load_run({str(found[0])!r})`"
    )


def _registry(args: argparse.Namespace, run_id: str | None = None):
    from fathom.study.registry import Registry, registry_path

    path = registry_path(args.runs_dir)
    if not path.exists():
        raise FathomError(
            f"no run registry at {str(path)!r}; run a study with --runs-dir {args.runs_dir} "
            f"first{_unregistered(args, run_id)}"
        )
    return Registry(path)


def _with_state(reg: Any, row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with ``status`` as its run directory says it now (:func:`fathom.rundir.run_state`:
    ``running`` only while a live process holds the run's lock, ``interrupted`` when its
    writer died without recording it), the stored one kept as ``registry_status`` where they
    differ, and ``state``, the sentence every output says. A row whose directory is gone or
    unreadable keeps its stored status (``state`` says why)."""
    from fathom.rundir import RunDir, run_state

    try:
        state = run_state(RunDir(reg.run_dir(row)))
    except FathomError as e:
        return {**row, "state": f"{row['status']} in the registry; its directory: {e}"}
    out = {**row, "status": state.status, "state": state.sentence()}
    if state.status != row["status"]:
        out["registry_status"] = row["status"]
    return out


def runs_tables(rows: list[dict[str, Any]], wide: bool = False) -> list:
    """One table per study: run, status, test accuracy (%) and CE, final-parameter hash.

    The run id names phase, recipe, LR and seed; ``wide`` adds them as columns with the
    full hash.
    """
    from fathom.base.terminal import short_hash, table
    from fathom.base.units import fmt_value, percent

    def f(x: float | None, spec: str) -> str:
        return "—" if x is None else format(x, spec)

    columns = [
        "Run",
        "Status",
        "Sel.\nacc\n(%)",
        "Final\nacc\n(%)",
        "Final\nCE\n(nats)",
        "Final params",
    ]
    if wide:
        columns[1:1] = ["Phase", "Recipe", "Seed", "LR"]
    out = []
    for study in dict.fromkeys(r["study"] for r in rows):
        body = []
        for r in (r for r in rows if r["study"] == study):
            extra = [r["phase"], r["recipe"], r["seed"], f(r["lr"], "g")]
            body.append(
                [
                    r["run_id"],
                    *(extra if wide else []),
                    r["status"],
                    fmt_value(percent(r["selected_test_acc"]), "%", suffix=False),
                    fmt_value(percent(r["final_test_acc"]), "%", suffix=False),
                    fmt_value(r["final_test_ce"], "nats", suffix=False),
                    short_hash(r["final_params"], wide),
                ]
            )
        out.append(
            table(
                f"Study {study}: {len(body)} runs",
                columns,
                body,
                right=columns[-4:-1],
            )
        )
    return out


_ACCURACY_KEYS = ("selected_test_acc", "final_test_acc")


def row_json(row: dict[str, Any]) -> dict[str, Any]:
    """A registry row as ``runs list --json`` / ``runs show`` print it: each accuracy (a
    fraction in the registry) as ``<name>_fraction`` with ``<name>_pct`` (percent,
    :func:`fathom.base.units.percent`) beside it; every other field as stored."""
    from fathom.base.units import percent

    out: dict[str, Any] = {}
    for key, value in row.items():
        if key in _ACCURACY_KEYS:
            out[f"{key}_fraction"] = value
            out[f"{key}_pct"] = percent(value)
        else:
            out[key] = value
    return out


def _cmd_runs_list(args: argparse.Namespace) -> int:
    from fathom.base.terminal import console

    reg = _registry(args)
    rows = reg.query(study=args.study, phase=args.phase, recipe=args.recipe, seed=args.seed)
    rows = [_with_state(reg, r) for r in rows]  # the directory's state, not a stale index
    rows = [r for r in rows if args.status is None or r["status"] == args.status]
    if args.json:
        print(json.dumps([row_json(r) for r in rows], indent=2))
        return 0
    out = console(args.wide)
    if not rows:
        out.print("0 runs match")
    for t in runs_tables(rows, args.wide):
        out.print(t)
    for r in rows:  # an unfinished run: how far, who trains it, or how to continue it
        if r["status"] in ("running", "interrupted"):
            out.print(f"{r['run_id']}: {r['state']}", soft_wrap=True, highlight=False)
    registered = {reg.run_dir(r).resolve() for r in reg.query()}
    lone = [
        p.parent
        for p in sorted(Path(args.runs_dir).glob(f"{args.study or '*'}/*/manifest.json"))
        if p.parent.resolve() not in registered
    ]
    if lone:  # runs of `fathom train`: said, so that a missing run is not a mystery
        names = ", ".join(str(p) for p in lone[:3]) + (" ..." if len(lone) > 3 else "")
        print(f"note: {len(lone)} run directories not listed ({names}): {_NOT_REGISTERED}")
    return 0


def _cmd_runs_show(args: argparse.Namespace) -> int:
    rows = _registry(args, args.run_id).get(args.run_id, args.study)
    if not rows:
        raise FathomError(
            f"no run {args.run_id!r} in the registry; list runs with `fathom runs list`"
            f"{_unregistered(args, args.run_id)}"
        )
    if len(rows) > 1:
        raise FathomError(
            f"run id {args.run_id!r} exists in studies {[r['study'] for r in rows]}; pass --study"
        )
    reg = _registry(args)
    path = reg.run_dir(rows[0])
    row = _with_state(reg, rows[0])
    print(json.dumps({**row_json(row), "path": str(path), **run_directory_state(path)}, indent=2))
    return 0


def run_directory_state(path: Any) -> dict[str, Any]:
    """What the run directory itself says beside its registry row: ``recovery`` (what
    writers found and repaired, as sentences) and ``problems`` (integrity problems now,
    every weights file checked against its recorded file SHA-256: no torch needed)."""
    from fathom.rundir import RunDir
    from fathom.rundir.filecheck import weight_file_problems

    try:
        rd = RunDir(path)
    except FathomError as e:
        return {"recovery": None, "problems": [str(e)]}
    problems = rd.problems() + weight_file_problems(rd.path, rd.header)
    return {"recovery": rd.recovery_notes(), "problems": problems}


def add_parser(sub: argparse._SubParsersAction) -> None:
    runs = sub.add_parser("runs", help="query the run registry")
    rsub = runs.add_subparsers(dest="runs_command", required=True, metavar="SUBCOMMAND")
    ls = rsub.add_parser("list", help="runs in the registry, filtered")
    ls.add_argument("--runs-dir", default="runs")
    ls.add_argument("--study")
    ls.add_argument("--phase", choices=["tuning", "main", "diagnostic", "train"])
    ls.add_argument("--recipe")
    ls.add_argument("--seed", type=int)
    ls.add_argument(
        "--status",
        choices=["complete", "diverged", "failed", "running", "interrupted", "absent"],
        help="the state each run directory says now (running: a live process holds its lock)",
    )
    ls.add_argument("--wide", action="store_true", help="all columns and full hashes")
    ls.add_argument("--json", action="store_true", help="print the rows as JSON")
    ls.set_defaults(func=_cmd_runs_list)
    show = rsub.add_parser("show", help="one run's registry row as JSON")
    show.add_argument("run_id")
    show.add_argument("--runs-dir", default="runs")
    show.add_argument("--study")
    show.set_defaults(func=_cmd_runs_show)
