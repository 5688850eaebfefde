"""Run the sparkguard operator: admission webhook and automatic recovery of SparkApplications.

Settings come from SPARKGUARD_* environment variables (see docs/operator.md); the flags
below override a few of them for local runs.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``sparkguard operator`` flags."""
    parser.add_argument(
        "--kubeconfig",
        help="kubeconfig to use outside a cluster (default: in-cluster, else ~/.kube/config)",
    )
    parser.add_argument(
        "--namespace",
        "-n",
        action="append",
        dest="namespaces",
        metavar="NAMESPACE",
        help="watch this namespace (repeatable; overrides SPARKGUARD_NAMESPACES; "
        "default: all namespaces)",
    )
    parser.add_argument(
        "--webhook-mode",
        choices=["managed", "external", "disabled"],
        help="overrides SPARKGUARD_WEBHOOK_MODE",
    )


def run(args: argparse.Namespace) -> int:
    """Run until interrupted; returns the exit code (2 for a configuration error)."""
    from sparkguard.operator import config, errors, kube, main
    from sparkguard.operator import runtime as runtime_

    try:
        settings = config.load_config(os.environ)
        overrides: dict[str, object] = {}
        if args.namespaces:
            overrides["namespaces"] = tuple(args.namespaces)
        if args.webhook_mode:
            overrides["webhook_mode"] = config.WebhookMode(args.webhook_mode)
        settings = dataclasses.replace(settings, **overrides)  # type: ignore[arg-type]
        config.check_config(settings)
    except errors.ConfigError as exc:
        print(f"sparkguard operator: {exc}", file=sys.stderr)
        return 2
    logging.getLogger("kopf").setLevel(logging.getLogger().level)
    api_client = kube.load_api_client(kubeconfig=args.kubeconfig)
    runtime = runtime_.Runtime(config=settings, kube=kube.KubeClient(api_client))
    asyncio.run(main.run(runtime))
    return 0
