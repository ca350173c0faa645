"""``fathom telemetry docs`` and ``fathom telemetry qualify``."""

from __future__ import annotations

import argparse
from pathlib import Path

from fathom.errors import FathomError

GATE_HELP = "0.10"
"""The default of ``--gate`` shown in its help: :data:`fathom.train.qualify.DEFAULT_GATE`
(importing that module costs torch; ``tests/test_cli.py`` checks the two agree)."""


def _cmd_docs(args: argparse.Namespace) -> int:
    from fathom.telemetry import docs

    argv = ["--out", str(args.out or docs.DEFAULT_PATH)] + (["--check"] if args.check else [])
    return docs.main(argv)


def _cmd_qualify(args: argparse.Namespace) -> int:
    from fathom.base.preflight import check_device, check_output_dir
    from fathom.base.units import fmt_percent
    from fathom.train.cli import config_from_args

    if args.gate is not None and not args.gate > 0:  # before the config: no torch, no defaults
        raise FathomError(f"--gate must be a positive fraction (0.10 = 10%), got {args.gate}")
    check_device(args.device)
    check_output_dir(args.out)
    cfg = config_from_args(args)
    check_device(cfg.device)
    from fathom.train.qualify import DEFAULT_GATE, qualify  # torch: once the input is valid

    if args.gate is None:
        args.gate = DEFAULT_GATE
    out = Path(args.out) if args.out else Path(args.runs_dir) / cfg.study / f"{cfg.name}-qualify"
    if out.exists() and any(out.iterdir()):
        raise FathomError(f"{str(out)!r} is not empty; choose another --out or remove it")
    q = qualify(cfg, out, gate=args.gate, exclude_cold=args.exclude_cold)
    print(f"final params   off {q.final_params_off}")
    print(f"               on  {q.final_params_on}")
    print(f"byte-identical {'yes' if q.params_identical else 'NO'}")
    print(
        f"history        {'identical' if not q.history_mismatches else f'{len(q.history_mismatches)} differences'}"
    )
    for line in q.history_mismatches[:20]:
        print(f"  {line}")
    print(
        f"training clock {q.training_s:.3f} s; telemetry clock {q.telemetry_s:.3f} s (cold first call {q.telemetry_cold_s or 0.0:.3f} s)"
    )
    print(
        f"overhead       {fmt_percent(q.overhead)} including cold start, {fmt_percent(q.overhead_without_cold)} without"
    )
    print(f"gate           {fmt_percent(q.gate)} {q.gated_on}: {'PASS' if q.passed else 'FAIL'}")
    print(f"written        {out / 'qualification.json'}")
    return 0 if q.passed else 1


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("telemetry", help="telemetry field docs and on/off qualification")
    tsub = p.add_subparsers(dest="telemetry_command", required=True, metavar="SUBCOMMAND")

    d = tsub.add_parser("docs", help="write docs/metrics.md from the field registry")
    d.add_argument("--out", type=Path, default=None, help="output path (default docs/metrics.md)")
    d.add_argument("--check", action="store_true", help="exit 1 if the file is not current")
    d.set_defaults(func=_cmd_docs)

    q = tsub.add_parser(
        "qualify",
        help="run a config with telemetry off and on: byte-identical params, identical history, overhead gate",
    )
    q.add_argument("config", nargs="?", help="run config TOML (defaults apply when omitted)")
    q.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key")
    q.add_argument("--device", choices=["auto", "cpu", "cuda"])
    q.add_argument("--name", help="run name")
    q.add_argument("--runs-dir", default="runs", help="parent directory (default: runs)")
    q.add_argument("--out", help="output directory (default: runs/<study>/<name>-qualify)")
    q.add_argument(
        "--gate",
        type=float,
        default=None,
        help=f"overhead gate as a fraction (default {GATE_HELP})",
    )
    q.add_argument(
        "--exclude-cold",
        action="store_true",
        help="gate the overhead without the cold first observation",
    )
    q.set_defaults(func=_cmd_qualify)
