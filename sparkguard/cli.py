"""The ``sparkguard`` command: one entry point, a subcommand per part.

Subcommands import their part lazily, so ``sparkguard rollback`` in a Spark image never needs
kopf or aiohttp installed.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from sparkguard import __version__

#: subcommand -> (module that defines ``add_arguments(parser)`` and ``run(args) -> int``, help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("sparkguard.spark_lib.demo", "run the local exactly-once demonstration"),
    "rollback": (
        "sparkguard.spark_lib.commands",
        "roll back what a job left uncommitted, on every table its journal names",
    ),
    "inspect": ("sparkguard.spark_lib.commands", "show a table's instants, states and files"),
    "sidecar": ("sparkguard.sidecar.cli", "run the marker-batching sidecar"),
    "bundle": ("sparkguard.spark_lib.bundle", "copy the library into a directory for Spark"),
    "spark-conf": (
        "sparkguard.spark_lib.sparkconf",
        "print the Spark conf that guards an unchanged job (JVM commit protocol)",
    ),
    "operator": (
        "sparkguard.operator.cli",
        "run the Kubernetes operator (admission webhook + failure recovery)",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="sparkguard",
        description="Exactly-once output for Spark on Kubernetes.",
    )
    parser.add_argument("--version", action="version", version=f"sparkguard {__version__}")
    parser.add_argument(
        "--log-level",
        default="WARNING",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="logging level for sparkguard's own messages (default: WARNING)",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        sub = commands.add_parser(name, help=help_text, description=module.__doc__)
        module.add_arguments(sub)
        sub.set_defaults(_module=module_name)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    module = importlib.import_module(args._module)
    try:
        code: int = module.run(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return code
