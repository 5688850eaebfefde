"""The network guard (tests/support/netguard.py) fires, and the bench keeps to loopback.

A guard that can never fire is a defect: these tests make packets try to leave, on purpose, and
check that the guard stops them at once and records where they went.
"""

from __future__ import annotations

import ipaddress
import json
import os
import struct
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.e2e.podstatus import wait_for
from tests.kubebench.bench import KubeBench
from tests.support import netguard

GUARD = Path(netguard.__file__)


def _ipv4_tcp_frame(dst: str, port: int, *, flags: int = 0x02) -> bytes:
    ethernet = b"\0" * 12 + struct.pack("!H", netguard.ETH_P_IP)
    ip = bytes([0x45, 0, 0, 40, 0, 0, 0, 0, 64, 6, 0, 0]) + bytes(4)
    ip += ipaddress.IPv4Address(dst).packed
    tcp = struct.pack("!HHIIBBHHH", 40000, port, 0, 0, 0x50, flags, 0, 0, 0)
    return ethernet + ip + tcp


def _ipv6_frame(dst: str, *, next_header: int, payload: bytes) -> bytes:
    ethernet = b"\0" * 12 + struct.pack("!H", netguard.ETH_P_IPV6)
    ip = struct.pack("!IHBB", 6 << 28, len(payload), next_header, 64) + bytes(16)
    return ethernet + ip + ipaddress.IPv6Address(dst).packed + payload


def test_a_frame_is_read_for_its_destination() -> None:
    packet = netguard.parse_ethernet(_ipv4_tcp_frame("10.0.0.1", 443))
    assert packet == netguard.Packet("tcp", "10.0.0.1", 443)
    assert packet.key() == "tcp 10.0.0.1:443"
    udp6 = _ipv6_frame("2001:db8::7", next_header=17, payload=struct.pack("!HH", 5353, 53))
    assert netguard.parse_ethernet(udp6) == netguard.Packet("udp", "2001:db8::7", 53)
    assert netguard.Packet("udp", "2001:db8::7", 53).key() == "udp [2001:db8::7]:53"


def test_what_a_link_sends_by_itself_is_not_traffic() -> None:
    arp = b"\0" * 12 + struct.pack("!H", netguard.ETH_P_ARP) + bytes(28)
    assert netguard.parse_ethernet(arp) is None
    solicitation = _ipv6_frame("ff02::2", next_header=58, payload=bytes([133]) + bytes(7))
    assert netguard.parse_ethernet(solicitation) is None
    neighbour = _ipv6_frame("2001:db8::1", next_header=58, payload=bytes([135]) + bytes(23))
    assert netguard.parse_ethernet(neighbour) is None
    assert netguard.parse_ethernet(b"short") is None


def test_dials_in_a_components_log_are_found() -> None:
    log = textwrap.dedent(
        """\
        E1206 failed calling webhook: Post "https://10.0.0.98:443/v": dial tcp 10.0.0.98:443: x
        W1206 dial tcp 127.0.0.1:2379: connect: connection refused
        W1206 dial tcp [2001:db8::5]:6443: i/o timeout
        W1206 dial tcp: lookup example.invalid: no such host
        """
    )
    found = netguard.find_log_dials(log)
    assert found == [
        netguard.Packet("tcp", "10.0.0.98", 443),
        netguard.Packet("tcp", "2001:db8::5", 6443),
    ]


def test_expected_dials_are_reported_apart(tmp_path: Path) -> None:
    records = [
        {"proto": "tcp", "dst": "10.0.0.97", "port": 443},
        {"proto": "udp", "dst": "10.255.255.53", "port": 53},
    ]
    (tmp_path / netguard.OFFBENCH).write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / netguard.EXPECTED).write_text(
        json.dumps({"dst": "10.0.0.97", "port": 443, "why": "self-test"}) + "\n"
    )
    assert netguard.unexpected(tmp_path) == [netguard.Packet("udp", "10.255.255.53", 53)]
    report = "\n".join(netguard.report(tmp_path))
    assert "expected      tcp 10.0.0.97:443" in report
    assert "OFF LOOPBACK  udp 10.255.255.53:53" in report


_PROBE = """
import socket, sys
listener = socket.create_server(("127.0.0.1", 0))
socket.create_connection(listener.getsockname(), timeout=5).close()
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()
        print("connected", target)
    except ConnectionRefusedError:
        print("refused", target)
    except OSError as exc:
        print("failed", target, exc)
"""


def _guarded(tmp_path: Path, source: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``source`` run as a script in a guard of its own (nested in the run's guard when there is
    one), with ``args``."""
    env = {k: v for k, v in os.environ.items() if k not in (netguard.ENV_DIR, netguard.ENV_NETNS)}
    script = tmp_path / "probe.py"
    script.write_text(source)
    guard = [sys.executable, str(GUARD), "run", "--dir", str(tmp_path / "guard"), "--"]
    return subprocess.run(
        [*guard, sys.executable, str(script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_dial_off_loopback_is_refused_at_once_recorded_and_fails_the_run(
    tmp_path: Path,
) -> None:
    result = _guarded(tmp_path, _PROBE, "10.0.0.99:443", "192.168.1.1:80", "[2001:db8::1]:80")
    # Refused by the sink at once (not a timeout: nothing beyond it was ever reached).
    for target in ("10.0.0.99:443", "192.168.1.1:80", "[2001:db8::1]:80"):
        assert f"refused {target}" in result.stdout, result.stdout + result.stderr
    assert result.returncode == 3, result.stderr
    assert "OFF LOOPBACK  tcp 10.0.0.99:443" in result.stderr
    assert "OFF LOOPBACK  tcp 192.168.1.1:80" in result.stderr
    assert "OFF LOOPBACK  tcp [2001:db8::1]:80" in result.stderr
    assert "loopback      tcp 127.0.0.1: 1 connection(s)" in result.stderr
    recorded = netguard.unexpected(tmp_path / "guard")
    assert {(p.dst, p.port) for p in recorded} >= {("10.0.0.99", 443), ("2001:db8::1", 80)}


def test_loopback_only_passes_and_names_its_destinations(tmp_path: Path) -> None:
    result = _guarded(tmp_path, _PROBE)
    assert result.returncode == 0, result.stderr
    assert "loopback      tcp 127.0.0.1: 1 connection(s)" in result.stderr
    assert "off loopback  none" in result.stderr


def test_name_lookups_never_leave_loopback(tmp_path: Path) -> None:
    """The resolver inside the guard is on loopback: a name not in /etc/hosts fails at once and
    the machine's own resolver (an address off loopback) is never asked."""
    lookup = (
        "import socket\n"
        "print(open('/etc/resolv.conf').read().split())\n"
        "try:\n    socket.getaddrinfo('sparkguard-test.invalid', 80)\n"
        "except OSError as exc:\n    print('unresolved', exc)\n"
    )
    result = _guarded(tmp_path, lookup)
    assert result.returncode == 0, result.stderr
    assert "'nameserver', '127.0.0.1'" in result.stdout
    assert "unresolved" in result.stdout
    assert "off loopback  none" in result.stderr


def test_this_run_is_inside_the_guard() -> None:
    """scripts/test.sh runs every test inside the guard; a run outside it is said so at its end,
    and the kube bench refuses to start there."""
    if netguard.guard_dir() is None:
        with pytest.raises(netguard.NetGuardError, match=r"scripts/test\.sh"):
            netguard.require_guard("the kube bench")
    else:
        assert netguard.require_guard("the kube bench").is_dir()
        assert Path("/etc/resolv.conf").read_text().split()[:2] == ["nameserver", "127.0.0.1"]


@pytest.mark.kube
def test_a_webhook_at_a_private_address_is_stopped_before_any_packet_leaves(
    kube_bench: KubeBench,
) -> None:
    """The API server dials a webhook URL at 10.x (what a Service's cluster IP was before the
    bench resolved Services to endpoints): the dial reaches only the guard's sink, which refuses
    it at once; the create is refused, and the guard recorded the destination."""
    target, port = "10.0.0.98", 443
    netguard.expect(target, port, why="the guard's self-test: a webhook URL off loopback")
    suffix = uuid.uuid4().hex[:6]
    namespace = f"netguard-{suffix}"
    kube_bench.ensure_namespace(namespace)
    name = f"netguard-selftest-{suffix}"
    kube_bench.apply_manifest(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [
                {
                    "name": "selftest.netguard.sparkguard.io",
                    "clientConfig": {"url": f"https://{target}:{port}/validate"},
                    "rules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["configmaps"],
                        }
                    ],
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": namespace}
                    },
                    "failurePolicy": "Fail",
                    "sideEffects": "None",
                    "admissionReviewVersions": ["v1"],
                    "timeoutSeconds": 10,
                }
            ],
        }
    )
    api = kube_bench.api_client()
    try:
        core = client.CoreV1Api(api)
        refusal = ""
        deadline = time.monotonic() + 60
        while not refusal and time.monotonic() < deadline:
            body = {"metadata": {"name": f"probe-{uuid.uuid4().hex[:6]}"}}
            try:
                core.create_namespaced_config_map(namespace, body)
            except ApiException as exc:
                refusal = str(exc.body)
            else:
                time.sleep(0.2)  # the API server's webhook cache has not seen it yet
        assert f"dial tcp {target}:{port}: connect: connection refused" in refusal, refusal
        where = netguard.require_guard("this test")
        # the sink refuses first and writes its record after: under load the record can
        # trail the API server's answer by a moment
        wait_for(
            f"the guard's record of {target}:{port}",
            lambda: (target, port) in {(p.dst, p.port) for p in netguard.offbench_packets(where)},
            timeout=30,
        )
    finally:
        client.AdmissionregistrationV1Api(api).delete_validating_webhook_configuration(name)
        api.close()
