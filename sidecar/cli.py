"""Run the marker-batching sidecar (Hudi-style timeline-server markers over HTTP).

Settings come from SPARKGUARD_SIDECAR_* environment variables; flags override them.
See docs/sidecar.md for every setting, the routes and the failure behaviour.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from sparkguard.sidecar import config, errors

logger = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the sidecar's flags (each overrides its SPARKGUARD_SIDECAR_* variable)."""
    for setting, (env, flag) in config.SETTINGS.items():
        if flag.startswith("("):
            continue  # secrets and JSON blobs come from the environment only
        if setting == "auth_disabled":
            parser.add_argument(
                flag,
                dest=setting,
                action="store_const",
                const="true",
                default=None,
                help=f"{config.MEANINGS[setting]} (default: off; env {env}=true)",
            )
            continue
        parser.add_argument(
            flag,
            dest=setting,
            default=None,
            help=f"{config.MEANINGS[setting]} (default: {config.default_of(setting)}; env {env})",
        )


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT, then drain; returns the process exit code."""
    import asyncio

    from sparkguard.sidecar import server

    flags = {setting: getattr(args, setting, None) for setting in config.SETTINGS}
    try:
        settings = config.config_from_environ(flags)
    except errors.ConfigError as exc:
        print(f"sparkguard sidecar: {exc}", file=sys.stderr)
        return 2
    logger.info(
        "sidecar on %s:%s, flush mode %s, roots %s",
        settings.host,
        settings.port,
        settings.flush_mode.value,
        ",".join(settings.allowed_roots),
    )
    try:
        asyncio.run(server.serve(settings))
    except errors.ConfigError as exc:
        print(f"sparkguard sidecar: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the port is taken, the host cannot be bound
        print(
            f"sparkguard sidecar: cannot listen on {settings.host}:{settings.port} ({exc}); "
            "choose another SPARKGUARD_SIDECAR_PORT / --port or host",
            file=sys.stderr,
        )
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m sparkguard.sidecar``: the same flags as ``sparkguard sidecar``."""
    parser = argparse.ArgumentParser(prog="python -m sparkguard.sidecar", description=__doc__)
    parser.add_argument(
        "--log-level",
        default=os.environ.get("SPARKGUARD_SIDECAR_LOG_LEVEL", "INFO"),
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="logging level (env SPARKGUARD_SIDECAR_LOG_LEVEL, default INFO)",
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return run(args)
