"""Fixtures of the operator's tests."""

from __future__ import annotations

import kmock as kmock_
import pytest

from sparkguard.operator import config as config_
from tests.operator import kmocking


@pytest.fixture
def config() -> config_.OperatorConfig:
    """Operator settings with a journal root and a fixed image, webhook served by kopf."""
    return config_.OperatorConfig(
        webhook_mode=config_.WebhookMode.MANAGED,
        image="registry.example/sparkguard:test",
        journal_root="s3://warehouse/_journal",
        metrics_port=0,
        liveness_port=0,
    )


@pytest.fixture
def k8s(kmock: kmock_.KubernetesEmulator) -> kmock_.KubernetesEmulator:
    """kmock's Kubernetes emulator serving the resources the operator uses."""
    kmocking.declare_resources(kmock)
    return kmock
