"""``fathom <command>``: thin subcommands over validated configs.

Each capability contributes ``add_parser(subparsers)`` from its own ``cli`` module; the
handler it registers (``set_defaults(func=...)``) receives the parsed namespace.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from fathom.errors import FathomError

COMMAND_MODULES: tuple[str, ...] = (
    "fathom.train.cli",
    "fathom.study.cli",
    "fathom.data.cli",
    "fathom.curvature.cli",
    "fathom.telemetry.cli",
    "fathom.audit.cli",
    "fathom.report.cli",
    "fathom.export.cli",
    "fathom.depthscale.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fathom", description="Fathom: train deep networks with the instruments on."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        rc = args.func(args)
    except FathomError as e:
        print(f"fathom {args.command}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a file-system failure no command turned into a FathomError
        from fathom.rundir.errors import os_error

        print(
            f"fathom {args.command}: error: {os_error(e, 'complete the command')}", file=sys.stderr
        )
        return 2
    except KeyboardInterrupt:
        print(
            f"fathom {args.command}: interrupted; completed epochs are kept and can be resumed",
            file=sys.stderr,
        )
        return 130
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
