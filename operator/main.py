"""Running the operator: kopf settings from our config, the webhook server, the kopf loop."""

from __future__ import annotations

import logging
from typing import Any

import kopf
from kopf._cogs.structs import references as kopf_references

from sparkguard.operator import certificates, handlers
from sparkguard.operator import config as config_
from sparkguard.operator import runtime as runtime_


def build_webhook_server(config: config_.OperatorConfig) -> Any:
    """kopf's HTTPS webhook server as the config says (mounted cert, or a self-signed one)."""
    certfile, keyfile = config.webhook_cert_file, config.webhook_key_file
    if not certfile or not keyfile:
        hosts = [h for h in (config.webhook_host, config.webhook_addr) if h and h != "0.0.0.0"]  # noqa: S104
        certfile, keyfile = certificates.write_self_signed(hosts or ["127.0.0.1", "localhost"])
    return kopf.WebhookServer(
        addr=config.webhook_addr,
        port=config.webhook_port,
        host=config.webhook_host,
        certfile=certfile,
        pkeyfile=keyfile,
        cafile=config.webhook_ca_file,
    )


def build_settings(
    runtime: runtime_.Runtime, *, settings: kopf.OperatorSettings | None = None
) -> kopf.OperatorSettings:
    """kopf's settings for ``runtime`` (on top of ``settings`` when given, e.g. by tests)."""
    config = runtime.config
    settings = settings if settings is not None else kopf.OperatorSettings()
    # Our Events are explicit (kopf.event); keep kopf's own log lines out of the app's Events.
    settings.posting.level = logging.ERROR
    # Fixed CRDs, in namespaces given by name (or cluster-wide): kopf need not observe CRDs
    # or namespaces, so the chart's least-privilege RBAC (no cluster-scoped lists) suffices in
    # both modes. (Found by tests/chart/test_rbac.py: 403s on CRD/namespace lists.) A kind whose
    # CRD is installed after the start is found by name and served: :mod:`crdwatch`.
    settings.scanning.disabled = True
    if config.webhook_mode is not config_.WebhookMode.DISABLED:
        settings.admission.server = runtime.webhook_server or build_webhook_server(config)
        if config.webhook_mode is config_.WebhookMode.MANAGED:
            settings.admission.managed = config.webhook_config_name
    return settings


async def run(
    runtime: runtime_.Runtime,
    *,
    stop_flag: Any = None,
    ready_flag: Any = None,
    settings: kopf.OperatorSettings | None = None,
) -> None:
    """Run the operator until ``stop_flag`` is set (or a signal arrives, in the main thread)."""
    config = runtime.config
    liveness = f"http://0.0.0.0:{config.liveness_port}/healthz" if config.liveness_port else None
    runtime.insights = kopf_references.Insights()
    await kopf.operator(
        insights=runtime.insights,
        registry=handlers.build_registry(runtime),
        settings=build_settings(runtime, settings=settings),
        standalone=True,
        clusterwide=config.clusterwide,
        namespaces=list(config.namespaces),
        liveness_endpoint=liveness,
        stop_flag=stop_flag,
        ready_flag=ready_flag,
    )
