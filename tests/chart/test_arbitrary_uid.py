"""The image's entry points run as an arbitrary non-root UID in group 0 with a read-only root.

OpenShift's ``restricted-v2`` runs a container as a UID it picks, in group 0, and platforms set
``readOnlyRootFilesystem``; sparkguard's injected containers (docs/operator.md, "Hardened
namespaces") get an emptyDir at /tmp and nothing else writable. No container engine runs here,
so each command runs the installed package (this venv) the way such a pod does: in a mount
namespace of its own where the checkout, the venv and Python's own files are read-only bind
mounts, /var/tmp and /dev/shm are read-only, and /tmp is the pod's emptyDir (a directory of the
test, mode 0777); then ``setpriv`` switches to UID 123456789, GID 0, no supplementary groups and
no new privileges, with HOME unset. Shown: ``sparkguard bundle`` writes the library into the
volume, ``sparkguard rollback`` rolls back a failed write on the S3 test server, and
``sparkguard sidecar`` serves markers and flushes them to S3.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.spark.marker_http import HttpMarkerClient
from sparkguard.spark_lib.storage import markers
from tests.sidecar.conftest import free_port, marker_dir_under
from tests.spark_lib.test_rollback import PARTS, _start, _task
from tests.support import s3server

#: a UID no passwd entry names, far from any system range
UID = 123456789
ROOT = Path(__file__).resolve().parents[2]
TOKEN = "arbitrary-uid-token"


def _cannot_switch_uid() -> str | None:
    """Why this process cannot run a command as :data:`UID` (``None`` when it can)."""
    if os.geteuid() != 0:
        return "switching to an arbitrary UID needs root"
    for tool in ("unshare", "setpriv", "mount"):
        if shutil.which(tool) is None:
            return f"`{tool}` (util-linux) is missing"
    with open("/proc/self/uid_map", encoding="ascii") as lines:
        for line in lines:
            inside, _, count = (int(n) for n in line.split())
            if inside <= UID < inside + count:
                return None
    return f"UID {UID} is not mapped in this user namespace"


pytestmark = pytest.mark.skipif(_cannot_switch_uid() is not None, reason=str(_cannot_switch_uid()))


def _read_only_paths() -> list[Path]:
    """The installed package's files: the checkout (its venv and sources), the venv, Python."""
    paths: list[Path] = []
    for raw in (ROOT, sys.prefix, sys.base_prefix):
        path = Path(os.path.realpath(raw))
        if not any(path == p or p in path.parents for p in paths):
            paths.append(path)
    return paths


def _blocked_ancestors(paths: Sequence[Path]) -> list[Path]:
    """Directories on the way to ``paths`` that others cannot enter (e.g. /root, 0700, holding
    pyenv's Python): each gets a 0755 tmpfs in the namespace, with only ``paths`` in it."""
    blocked = []
    for path in paths:
        for ancestor in reversed(path.parents):
            if not ancestor.stat().st_mode & 0o001:
                if ancestor not in blocked:
                    blocked.append(ancestor)
                break
    return blocked


def _namespace_script(volume: Path, stage: Path) -> str:
    """Set up the mount namespace (as root), then exec ``"$@"`` as :data:`UID`."""
    paths = _read_only_paths()
    q = shlex.quote
    lines = ["set -eu"]
    for index, path in enumerate(paths):
        lines += [f"mkdir -p {q(str(stage / str(index)))}"]
        lines += [f"mount --bind {q(str(path))} {q(str(stage / str(index)))}"]
    for ancestor in _blocked_ancestors(paths):
        lines += [f"mount -t tmpfs -o mode=0755 sparkguard-test {q(str(ancestor))}"]
    for index, path in enumerate(paths):
        lines += [
            f"mkdir -p {q(str(path))}",
            f"mount --move {q(str(stage / str(index)))} {q(str(path))}",
            f"mount -o remount,bind,ro {q(str(path))}",
        ]
    for shared in ("/var/tmp", "/dev/shm"):
        if Path(shared).is_dir():
            lines += [f"mount --bind {shared} {shared}", f"mount -o remount,bind,ro {shared}"]
    lines += [
        f"mount --bind {q(str(volume))} /tmp",  # the pod's emptyDir
        "cd /",
        f'exec setpriv --reuid={UID} --regid=0 --clear-groups --no-new-privs -- "$@"',
    ]
    return "\n".join(lines)


def _argv(volume: Path, stage: Path, command: Sequence[str], env: dict[str, str]) -> list[str]:
    clean = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "TMPDIR": "/tmp",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONSAFEPATH": "1",
        "LANG": "C.UTF-8",
        **env,
    }
    script = _namespace_script(volume, stage)
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--",
        "bash",
        "-c",
        script,
        "arbitrary-uid",
        "env",
        "-i",
        *(f"{k}={v}" for k, v in clean.items()),
        str(Path(sys.executable).parent / "sparkguard"),
        *command,
    ]


@pytest.fixture
def volume(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(the emptyDir, mode 0777 like the kubelet's, a staging directory for the namespace)"""
    empty_dir = tmp_path / "volume"
    empty_dir.mkdir()
    empty_dir.chmod(0o777)
    stage = tmp_path / "stage"
    stage.mkdir()
    yield empty_dir, stage
    # what the UID wrote is owned by it: make it removable for pytest's clean-up
    subprocess.run(["chmod", "-R", "u+rwX", str(empty_dir)], check=False)


def run_as_uid(
    volume: tuple[Path, Path],
    command: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """Run ``sparkguard <command>`` as :data:`UID` in group 0 over a read-only root."""
    return subprocess.run(
        _argv(*volume, command, env or {}),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_the_namespace_is_read_only_but_for_the_volume(volume: tuple[Path, Path]) -> None:
    """The control: the UID, group and HOME are as a restricted-v2 pod has them, and writes
    outside the volume fail (so the commands below could fail)."""
    probe = (
        "import os, pathlib, sys\n"
        "print(os.getuid(), os.getgid(), os.getgroups(), 'HOME' in os.environ)\n"
        "for target in sys.argv[1:]:\n"
        "    try:\n"
        "        pathlib.Path(target).write_text('x')\n"
        "        print('wrote', target)\n"
        "    except OSError as exc:\n"
        "        print('refused', target, exc.errno)\n"
    )
    venv_file = Path(sys.prefix) / "sparkguard-uid-probe"
    targets = [
        str(venv_file),
        str(ROOT / "sparkguard-uid-probe"),
        "/var/tmp/sg-uid-probe",
        "/tmp/ok",
    ]
    argv = _argv(*volume, [], {})
    argv[-1:] = [sys.executable, "-c", probe, *targets]  # the same Python, not sparkguard
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"{UID} 0 [] False"
    assert [line.split()[:2] for line in lines[1:]] == [
        ["refused", targets[0]],
        ["refused", targets[1]],
        ["refused", targets[2]],
        ["wrote", "/tmp/ok"],
    ]
    assert (volume[0] / "ok").stat().st_uid == UID
    assert not venv_file.exists()


def test_bundle_writes_the_library_into_the_volume(volume: tuple[Path, Path]) -> None:
    done = run_as_uid(volume, ["bundle", "--dest", "/tmp/lib"])
    assert done.returncode == 0, done.stderr
    lib = volume[0] / "lib"
    manifest = lib / "SPARKGUARD_BUNDLE.json"
    assert manifest.is_file()
    assert (lib / "sparkguard" / "spark_lib" / "jars" / "sparkguard-spark.jar").is_file()
    assert (manifest.stat().st_uid, manifest.stat().st_gid) == (UID, 0)
    # nothing else in the volume: no temp directory, no bytecode
    assert sorted(p.name for p in volume[0].iterdir()) == ["lib"]
    assert not list(lib.rglob("__pycache__"))


def test_rollback_on_s3(volume: tuple[Path, Path], s3_server: s3server.S3Server) -> None:
    bucket = f"s3://{s3_server.create_bucket()}"
    journal = f"{bucket}/journal"
    writer = _start(f"{bucket}/t", journal, s3_server.storage_options, "uid-1")
    for partition, ids in PARTS.items():
        _task(writer, partition, ids)
    done = run_as_uid(
        volume,
        ["rollback", "--job-id", "uid-1", "--journal", journal, "--allow-missing-journal"],
        env=s3_server.env(),
    )
    assert done.returncode == 0, done.stderr
    assert "files deleted: 3" in done.stdout
    assert list(volume[0].iterdir()) == []  # it wrote nothing locally


@contextlib.contextmanager
def _sidecar(
    volume: tuple[Path, Path], *, port: int, root: str, env: dict[str, str]
) -> Iterator[subprocess.Popen[str]]:
    token = volume[0] / "token"
    token.write_text(TOKEN)
    token.chmod(0o644)
    command = [
        "sidecar",
        "--host", "127.0.0.1",
        "--port", str(port),
        "--batch-interval-ms", "10",
        "--token-file", "/tmp/token",
        "--allowed-roots", root,
    ]  # fmt: skip
    process = subprocess.Popen(
        _argv(*volume, command, env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError):
                ready = f"http://127.0.0.1:{port}/readyz"
                with urllib.request.urlopen(ready, timeout=2) as answer:
                    if answer.status == 200:
                        break
            if process.poll() is not None or time.monotonic() > deadline:
                _, err = process.communicate(timeout=10)
                raise AssertionError(f"the sidecar did not get ready: {err[-3000:]}")
            time.sleep(0.2)
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate(timeout=30)


def test_sidecar_serves_markers_and_flushes_them_to_s3(
    volume: tuple[Path, Path], s3_server: s3server.S3Server
) -> None:
    root = f"s3://{s3_server.create_bucket()}"
    directory = marker_dir_under(root, storage_options=s3_server.storage_options)
    names = [f"part-{i:05d}-uid-c000.parquet" for i in range(5)]
    port = free_port()
    with _sidecar(volume, port=port, root=root, env=s3_server.env()) as process:
        client = HttpMarkerClient(f"http://127.0.0.1:{port}", token=TOKEN, deadline_s=60)
        try:
            for name in names:
                client.create(directory, name)  # answered once durable
        finally:
            client.close()
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
        assert process.returncode == 0, err[-3000:]
    manager, path = filemanager.resolve(directory, storage_options=s3_server.storage_options)
    assert markers.read_marked_files(manager, path) == set(names)
    assert sorted(p.name for p in volume[0].iterdir()) == ["token"]  # nothing written locally
