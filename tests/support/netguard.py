"""The network guard: the test bench never sends a packet off this machine.

Every test run (``scripts/test.sh``) runs inside a network namespace of its own, the *bench
namespace*, made by this file:

* The bench namespace has loopback (``127.0.0.1``, ``::1``) and one veth link, ``sg-bench``,
  that carries only link-local addresses (``169.254.77.1/30``, ``fe80::1``). Its default routes
  (IPv4 and IPv6) point through that link into a second namespace the guard makes, the *sink*.
  The machine's own interfaces are not in the bench namespace: no route of it reaches them.
* The sink accepts every destination address as its own (a ``local`` route for ``0.0.0.0/0``
  and ``::/0``) and listens on nothing, so any connection the bench dials to an address outside
  loopback reaches the sink's kernel, is refused at once (TCP RST, ICMP port unreachable for
  UDP) and goes nowhere else. A raw packet socket in the sink records each such packet
  (``offbench.jsonl``): destination, port, protocol.
* In the bench namespace a packet socket on ``lo`` (a classic BPF filter keeps only TCP SYNs and
  UDP datagrams) counts the connections made to each loopback destination, for the run's report.

So the rule holds by construction (there is no route to anything but loopback and the sink),
and it is checked (every packet that tried to leave is recorded, and the pytest session fails
on it: ``tests/conftest.py``). Tests that prove the guard can fire announce the destinations
they dial on purpose (:func:`expect`); those are reported as expected and not counted against
the run. Components' own logs are scanned as well (``kube-apiserver.log`` for ``dial tcp``:
:func:`record_log_dials`).

Command line (stdlib only: it runs before and outside the venv's imports)::

    python tests/support/netguard.py run [--dir DIR] -- COMMAND...

runs COMMAND in a new bench namespace (root, or a user namespace where root is not had) and
prints the report when it ends; its exit status is COMMAND's, or 3 when COMMAND succeeded but a
packet tried to leave.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Set in the bench namespace: the directory holding the guard's records.
ENV_DIR = "SPARKGUARD_NETGUARD_DIR"
#: Set in the bench namespace: the inode of the bench's network namespace (``/proc/self/ns/net``),
#: so a process can tell that it is inside the guard and not merely handed the variable.
ENV_NETNS = "SPARKGUARD_NETGUARD_NETNS"

BENCH_IF, SINK_IF = "sg-bench", "sg-sink"
BENCH_V4, SINK_V4 = "169.254.77.1", "169.254.77.2"
BENCH_V6, SINK_V6 = "fe80::5347:1", "fe80::5347:2"

OFFBENCH = "offbench.jsonl"
LOGSCAN = "logscan.jsonl"
EXPECTED = "expected.jsonl"
LOOPBACK = "loopback.json"
SINK_READY = "sink.ready"

ETH_P_ALL = 0x0003
ETH_P_IP, ETH_P_ARP, ETH_P_IPV6 = 0x0800, 0x0806, 0x86DD
PACKET_OUTGOING = 4
SO_ATTACH_FILTER = 26
PROTOCOLS = {1: "icmp", 6: "tcp", 17: "udp", 58: "icmpv6"}
#: ICMPv6 neighbour discovery and multicast listener messages a link sends by itself.
_ICMPV6_LINK_TYPES = frozenset({130, 131, 132, 133, 134, 135, 136, 143})


class NetGuardError(RuntimeError):
    """The guard could not be set up; the message says why and what to do."""


@dataclass(frozen=True)
class Packet:
    """One IP packet seen by the guard: where it went. A purely computational value."""

    proto: str
    dst: str
    port: int | None

    def key(self) -> str:
        port = f":{self.port}" if self.port is not None else ""
        host = f"[{self.dst}]" if ":" in self.dst else self.dst
        return f"{self.proto} {host}{port}"


def parse_ethernet(frame: bytes) -> Packet | None:
    """The destination of an Ethernet frame carrying IPv4 or IPv6, or ``None`` for anything a
    link sends by itself (ARP, IPv6 neighbour discovery, link-local multicast). Pure."""
    if len(frame) < 14:
        return None
    (ethertype,) = struct.unpack_from("!H", frame, 12)
    return parse_ip(frame[14:], ethertype)


def parse_ip(packet: bytes, ethertype: int) -> Packet | None:
    """The destination of an IP packet (``ethertype`` 0x0800 or 0x86dd). Pure."""
    if ethertype == ETH_P_IP and len(packet) >= 20:
        ihl = (packet[0] & 0x0F) * 4
        proto = packet[9]
        dst = str(ipaddress.IPv4Address(packet[16:20]))
        port = _port(packet, ihl, proto)
        return Packet(PROTOCOLS.get(proto, str(proto)), dst, port)
    if ethertype == ETH_P_IPV6 and len(packet) >= 40:
        proto = packet[6]
        address = ipaddress.IPv6Address(packet[24:40])
        if address.is_multicast or address.is_link_local:
            return None
        if proto == 58 and len(packet) > 40 and packet[40] in _ICMPV6_LINK_TYPES:
            return None
        return Packet(PROTOCOLS.get(proto, str(proto)), str(address), _port(packet, 40, proto))
    return None


def _port(packet: bytes, offset: int, proto: int) -> int | None:
    if proto in (6, 17) and len(packet) >= offset + 4:
        return int(struct.unpack_from("!H", packet, offset + 2)[0])
    return None


def is_loopback(address: str) -> bool:
    """True for 127.0.0.0/8 and ::1."""
    return ipaddress.ip_address(address).is_loopback


# -- what a session reads and writes ---------------------------------------------------------


def guard_dir() -> Path | None:
    """The guard's record directory when this process runs inside the bench namespace."""
    where = os.environ.get(ENV_DIR)
    if not where or os.environ.get(ENV_NETNS) != _netns_id():
        return None
    return Path(where)


def require_guard(what: str) -> Path:
    """The record directory; raises :class:`NetGuardError` naming ``what`` outside the guard."""
    found = guard_dir()
    if found is None:
        raise NetGuardError(
            f"{what} runs only inside the network guard, so that nothing it starts can reach an "
            "address off this machine: run the tests through scripts/test.sh (e.g. "
            "`scripts/test.sh tests/chart`), or wrap pytest yourself: "
            "`python tests/support/netguard.py run -- python -m pytest ...`"
        )
    return found


def reexec_inside() -> None:
    """Re-run this process's own command inside a new bench namespace, unless it already runs
    inside one (a benchmark started by hand that starts the kube bench). Does not return when it
    re-runs: the process becomes the guard, and its exit status is the command's."""
    if guard_dir() is not None:
        return
    command = [sys.executable, *sys.orig_argv[1:]]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, __file__, "run", "--", *command])  # noqa: S606


def expect(destination: str, port: int | None, *, why: str) -> None:
    """Announce a dial off loopback that a test makes on purpose (to prove the guard fires)."""
    where = require_guard("a test that dials off loopback on purpose")
    _append(where / EXPECTED, {"dst": destination, "port": port, "why": why})


def offbench_packets(where: Path) -> list[Packet]:
    """Every packet the sink recorded, and every dial found in components' logs, in order."""
    return [
        Packet(entry["proto"], entry["dst"], entry.get("port"))
        for name in (OFFBENCH, LOGSCAN)
        for entry in _read_jsonl(where / name)
    ]


def unexpected(where: Path) -> list[Packet]:
    """The recorded destinations that no test announced with :func:`expect`."""
    announced = {(e["dst"], e.get("port")) for e in _read_jsonl(where / EXPECTED)}
    return [p for p in offbench_packets(where) if (p.dst, p.port) not in announced]


def report(where: Path) -> list[str]:
    """The run's report of outbound destinations, a line each."""
    loopback = _read_json(where / LOOPBACK) or {}
    packets = offbench_packets(where)
    announced = {(e["dst"], e.get("port")) for e in _read_jsonl(where / EXPECTED)}
    lines = ["network guard: outbound destinations of this run (bench namespace)"]
    if loopback:
        for key, count in sorted(loopback.items()):
            lines.append(f"  loopback      {key}: {count} connection(s)/datagram(s)")
    else:
        lines.append("  loopback      none")
    lines.append(
        f"  test-made     the sink namespace at {SINK_V4} / {SINK_V6} (nothing else was made)"
    )
    expected = Counter(p.key() for p in packets if (p.dst, p.port) in announced)
    for key, count in sorted(expected.items()):
        lines.append(f"  expected      {key}: {count} packet(s), dialled on purpose by a test")
    bad = Counter(p.key() for p in packets if (p.dst, p.port) not in announced)
    if bad:
        for key, count in sorted(bad.items()):
            lines.append(f"  OFF LOOPBACK  {key}: {count} packet(s), stopped in the sink")
    else:
        lines.append("  off loopback  none")
    return lines


def record_log_dials(log_text: str, *, source: str) -> list[Packet]:
    """Record every dial to a non-loopback address found in a component's log
    (:func:`find_log_dials`), inside the guard; outside it nothing is recorded. Returns them."""
    found = find_log_dials(log_text)
    where = guard_dir()
    if where is not None:
        for packet in found:
            _append(where / LOGSCAN, {**packet.__dict__, "source": source})
    return found


def find_log_dials(log_text: str) -> list[Packet]:
    """Every ``dial tcp <address>:<port>`` to a non-loopback address in a log. Pure."""
    found = []
    for token in log_text.split("dial tcp ")[1:]:
        target = token.split(":", 1)[0] if not token.startswith("[") else token[1:].split("]")[0]
        rest = token[len(target) + (2 if token.startswith("[") else 0) :]
        if not rest.startswith(":"):
            continue
        digits = "".join(c for c in rest[1:6] if c.isdigit())
        try:
            if is_loopback(target):
                continue
        except ValueError:
            continue  # a name, not an address: resolution already failed or succeeded locally
        found.append(Packet("tcp", target, int(digits) if digits else None))
    return found


# -- the namespaces -----------------------------------------------------------------------------


def _netns_id() -> str:
    try:
        return str(os.stat("/proc/self/ns/net").st_ino)
    except OSError:
        return ""


def _has_link(name: str) -> bool:
    """Whether this network namespace has the link (``/sys/class/net`` shows the namespace
    that mounted sysfs, not this one)."""
    try:
        socket.if_nametoindex(name)
    except OSError:
        return False
    return True


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise NetGuardError(f"`ip {' '.join(args)}` failed: {result.stderr.strip()}")


def run(command: Sequence[str], *, where: Path | None) -> int:
    """Run ``command`` in a new bench namespace; the report is printed when it ends."""
    if guard_dir() is not None:
        return subprocess.call(list(command))  # already inside: one guard per run
    for tool in ("unshare", "ip"):
        if shutil.which(tool) is None:
            raise NetGuardError(
                f"the network guard needs `{tool}` (util-linux / iproute2): install it "
                "(e.g. apt-get install util-linux iproute2)"
            )
    made = where is None
    where = Path(tempfile.mkdtemp(prefix="sg-netguard-")) if where is None else where
    where.mkdir(parents=True, exist_ok=True)
    unshare = ["unshare", "--net", "--mount", "--propagation", "private"]
    if os.geteuid() != 0:
        unshare[1:1] = ["--user", "--map-root-user"]
    argv = [*unshare, "--", sys.executable, __file__, "inside", "--dir", str(where), "--"]
    status = _run_forwarding_signals([*argv, *command], env=None)
    if made:  # the report above is the evidence; nothing of the run stays in the temp dir
        shutil.rmtree(where, ignore_errors=True)
    return status


def inside(command: Sequence[str], *, where: Path) -> int:
    """In the fresh namespaces: wire the bench to the sink, count loopback, run ``command``."""
    _ip("link", "set", "lo", "up")
    (where / SINK_READY).unlink(missing_ok=True)
    _resolve_on_loopback(where)
    _ip("link", "add", BENCH_IF, "type", "veth", "peer", "name", SINK_IF)
    sink = subprocess.Popen(
        ["unshare", "--net", "--", sys.executable, __file__, "sink", "--dir", str(where)],
        stdin=subprocess.DEVNULL,
        preexec_fn=_terminate_with_parent,  # noqa: PLW1509 - a plain prctl, no locks taken
    )
    try:
        _wire_bench(sink.pid, where)
        counter = _LoopbackCounter(where / LOOPBACK)
        counter.start()
        env = dict(os.environ)
        env[ENV_DIR] = str(where)
        env[ENV_NETNS] = _netns_id()
        # Builds run before the guard (scripts/test.sh); inside it, a module download must fail
        # at once rather than dial the proxy.
        env["GOPROXY"] = "off"
        env["GOTOOLCHAIN"] = "local"
        status = _run_forwarding_signals(command, env=env)
        counter.stop()
    finally:
        sink.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            sink.wait(timeout=10)
    for line in report(where):
        print(line, file=sys.stderr)
    if status == 0 and unexpected(where):
        print(
            "network guard: a packet tried to leave the bench namespace (above): the run fails",
            file=sys.stderr,
        )
        return 3
    return status


def _run_forwarding_signals(command: Sequence[str], *, env: dict[str, str] | None) -> int:
    """Run ``command`` to its end; SIGINT and SIGTERM are passed on to it, and it is sent
    SIGTERM if this process dies without passing anything on (``PR_SET_PDEATHSIG``), so a
    stopped run never leaves its tests running in a namespace nobody watches."""
    child = subprocess.Popen(list(command), env=env, preexec_fn=_terminate_with_parent)  # noqa: PLW1509
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, _frame: child.send_signal(signum))
    return child.wait()


def _terminate_with_parent() -> None:
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)


def _resolve_on_loopback(where: Path) -> None:
    """Name look-ups ask a resolver on loopback only (nothing answers there: a name that is not
    in /etc/hosts fails at once). The machine's resolver is an address off loopback, and a look-up
    is traffic like any other. The bind mount lives in the bench's private mount namespace."""
    resolv = where / "resolv.conf"
    resolv.write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n", encoding="utf-8")
    result = subprocess.run(
        ["mount", "--bind", str(resolv), "/etc/resolv.conf"],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        why = result.stderr.strip()
        raise NetGuardError(f"could not point /etc/resolv.conf at loopback: {why}")


def _wire_bench(sink_pid: int, where: Path) -> None:
    deadline = time.monotonic() + 20
    # The sink process exists before `unshare` has made its namespace: moving the link earlier
    # would move it into this namespace, where it already is.
    while os.stat(f"/proc/{sink_pid}/ns/net").st_ino == os.stat("/proc/self/ns/net").st_ino:
        if time.monotonic() > deadline:
            raise NetGuardError("the guard's sink namespace was not made within 20 s")
        time.sleep(0.01)
    _ip("link", "set", SINK_IF, "netns", str(sink_pid))
    _ip("addr", "add", f"{BENCH_V4}/30", "dev", BENCH_IF)
    _ip("-6", "addr", "add", f"{BENCH_V6}/64", "dev", BENCH_IF, "nodad")
    _ip("link", "set", BENCH_IF, "up")
    while not (where / SINK_READY).exists():
        if time.monotonic() > deadline:
            raise NetGuardError("the guard's sink namespace did not come up within 20 s")
        time.sleep(0.05)
    _ip("route", "add", "default", "via", SINK_V4, "dev", BENCH_IF)
    _ip("-6", "route", "add", "default", "via", SINK_V6, "dev", BENCH_IF)


def sink(where: Path) -> int:
    """The sink namespace: take every address, answer nothing, record every packet."""
    deadline = time.monotonic() + 20
    while not _has_link(SINK_IF):
        if time.monotonic() > deadline:
            print(f"netguard sink: {SINK_IF} never arrived", file=sys.stderr)
            return 2
        time.sleep(0.02)
    _ip("link", "set", "lo", "up")
    _ip("addr", "add", f"{SINK_V4}/30", "dev", SINK_IF)
    _ip("-6", "addr", "add", f"{SINK_V6}/64", "dev", SINK_IF, "nodad")
    _ip("link", "set", SINK_IF, "up")
    # Every address is this namespace's own: a dial is refused here at once, never forwarded.
    _ip("route", "add", "local", "0.0.0.0/0", "dev", "lo", "table", "local")
    _ip("-6", "route", "add", "local", "::/0", "dev", "lo", "table", "local")
    capture = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    capture.bind((SINK_IF, 0))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    (where / SINK_READY).write_text(str(os.getpid()))
    with open(where / OFFBENCH, "a", encoding="utf-8") as out:
        while True:
            frame, address = capture.recvfrom(65535)
            if address[2] == PACKET_OUTGOING:
                continue  # the sink's own answers (RST, unreachable)
            packet = parse_ethernet(frame)
            if packet is None or packet.dst in (SINK_V4, SINK_V6):
                continue
            out.write(json.dumps({**packet.__dict__, "at": time.time()}) + "\n")
            out.flush()


class _LoopbackCounter:
    """Counts TCP connections (SYNs) and UDP datagrams sent on ``lo``, per destination."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._counts: Counter[str] = Counter()
        self._stop = threading.Event()
        self._socket = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        self._program = _syn_or_udp_filter()
        fprog = struct.pack("HL", len(self._program) // 8, ctypes.addressof(self._program))
        self._socket.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
        self._socket.bind(("lo", 0))
        self._socket.settimeout(0.5)
        self._thread = threading.Thread(target=self._loop, name="netguard-lo", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._flush()

    def _loop(self) -> None:
        flushed = time.monotonic()
        while not self._stop.is_set():
            try:
                frame, address = self._socket.recvfrom(128)
            except TimeoutError:
                frame = b""
            if frame and address[2] == PACKET_OUTGOING:
                packet = parse_ethernet(frame)
                if packet is not None:
                    self._counts[f"{packet.proto} {packet.dst}"] += 1
            if time.monotonic() - flushed > 5:
                self._flush()
                flushed = time.monotonic()

    def _flush(self) -> None:
        temp = self._path.with_suffix(".tmp")
        temp.write_text(json.dumps(dict(self._counts)))
        temp.replace(self._path)


def _syn_or_udp_filter() -> ctypes.Array[ctypes.c_char]:
    """A classic BPF program for ``lo``'s Ethernet-framed packets: keep IPv4/IPv6 TCP segments
    with SYN set and ACK clear (a new connection) and UDP datagrams; drop everything else in the
    kernel, so the counter sees a packet per connection, not the test traffic itself."""
    ld_h, ld_b, ldx_msh, ld_ind_b = 0x28, 0x30, 0xB1, 0x50
    jeq, jset, and_k, ret = 0x15, 0x45, 0x54, 0x06
    # (opcode, jump-if-true label, jump-if-false label, constant); None: the next instruction.
    program: list[tuple[int, str | None, str | None, int]] = [
        (ld_h, None, None, 12),  # ethertype
        (jeq, None, "ipv6", ETH_P_IP),
        (ld_b, None, None, 23),  # IPv4 protocol
        (jeq, "accept", None, 17),  # UDP
        (jeq, None, "drop", 6),  # TCP
        (ld_h, None, None, 20),  # flags and fragment offset
        (jset, "drop", None, 0x1FFF),  # a later fragment: no TCP header
        (ldx_msh, None, None, 14),  # X = IPv4 header length
        (ld_ind_b, None, None, 27),  # TCP flags (Ethernet 14 + 13)
        (and_k, None, None, 0x12),  # SYN | ACK
        (jeq, "accept", "drop", 0x02),  # SYN alone: a new connection
        (jeq, None, "drop", ETH_P_IPV6),  # label ipv6 (A still holds the ethertype)
        (ld_b, None, None, 20),  # IPv6 next header
        (jeq, "accept", None, 17),  # UDP
        (jeq, None, "drop", 6),  # TCP
        (ld_b, None, None, 67),  # TCP flags (14 + 40 + 13)
        (and_k, None, None, 0x12),
        (jeq, "accept", "drop", 0x02),
        (ret, None, None, 128),  # label accept: the headers are enough
        (ret, None, None, 0),  # label drop
    ]
    labels = {"ipv6": 11, "accept": 18, "drop": 19}
    raw = b""
    for index, (code, true, false, constant) in enumerate(program):
        jt = labels[true] - index - 1 if true else 0
        jf = labels[false] - index - 1 if false else 0
        raw += struct.pack("HBBI", code, jt, jf, constant)
    return ctypes.create_string_buffer(raw, len(raw))


# -- small helpers --------------------------------------------------------------------------


def _append(path: Path, entry: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps(entry) + "\n")


def _read_jsonl(path: Path) -> Iterable[dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return None


def main(argv: Sequence[str]) -> int:  # noqa: PLR0911 - one return per verb and usage error
    args = list(argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args else 2
    verb, rest = args[0], args[1:]
    where: Path | None = None
    if rest[:1] == ["--dir"]:
        where, rest = Path(rest[1]), rest[2:]
    if verb == "sink" and where is not None:
        return sink(where)
    if rest[:1] != ["--"] or len(rest) < 2:
        print("netguard: usage: netguard.py run [--dir DIR] -- COMMAND...", file=sys.stderr)
        return 2
    try:
        if verb == "run":
            return run(rest[1:], where=where)
        if verb == "inside" and where is not None:
            return inside(rest[1:], where=where)
    except NetGuardError as exc:
        print(f"netguard: {exc}", file=sys.stderr)
        return 2
    print(f"netguard: unknown verb {verb!r}; use run", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
