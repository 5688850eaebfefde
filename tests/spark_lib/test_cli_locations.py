"""What a user types by hand on day one, run as the installed ``sparkguard`` command: a recovery
command given the wrong location never does nothing silently, a command on a directory sparkguard
never wrote says so, and every command checks a journal location the same way.
"""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkguard import cli
from tests.spark_lib.test_rollback import PARTS, _start, _task

SCRIPT = Path(sys.executable).with_name("sparkguard")


def sparkguard(*argv: str, env: Mapping[str, str] = {}) -> subprocess.CompletedProcess[str]:
    """The installed command, as a user runs it (``env`` added to the environment)."""
    return subprocess.run(
        [str(SCRIPT), *argv],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONSAFEPATH": "1", **env},
        timeout=120,
        check=False,
    )


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture(scope="module")
def chart_journal(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(journal root, table): job ``etl.nightly`` of namespace ``etl`` failed after one task,
    its journal in ``<root>/etl`` as the operator lays it out (``<journal root>/<namespace>``)."""
    base = tmp_path_factory.mktemp("dayone")
    root, table = base / "journal", base / "table"
    (root / "other-ns").mkdir(parents=True)
    _task(_start(str(table), str(root / "etl"), {}, "etl.nightly"), 0, PARTS[0])
    assert (root / "etl" / "etl.nightly").is_dir()
    return root, table


def test_rollback_given_the_journal_root_names_the_namespace_folder(
    chart_journal: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    root, _ = chart_journal
    done = sparkguard("rollback", "--job-id", "etl.nightly", "--journal", str(root))
    assert done.returncode == 2
    line = one_line(done.stderr)
    assert f"no {root}/etl.nightly/" in line  # where it looked
    assert f"found {root}/etl/etl.nightly: use --journal {root}/etl" in line
    assert done.stdout == ""
    # Another namespace's folder: the job's folder beside it is named.
    code = cli.main(["rollback", "--job-id", "etl.nightly", "--journal", str(root / "other-ns")])
    assert code == 2
    assert f"use --journal {root}/etl" in one_line(capsys.readouterr().err)


def test_rollback_given_a_table_as_journal_says_so(chart_journal: tuple[Path, Path]) -> None:
    _, table = chart_journal
    done = sparkguard("rollback", "--job-id", "etl.nightly", "--journal", str(table))
    assert done.returncode == 2
    line = one_line(done.stderr)
    assert "is a table, not a journal" in line
    assert str(table) in line


def test_rollback_of_a_job_the_journal_never_saw(chart_journal: tuple[Path, Path]) -> None:
    root, _ = chart_journal
    done = sparkguard("rollback", "--job-id", "never.ran", "--journal", str(root / "etl"))
    assert done.returncode == 2
    line = one_line(done.stderr)
    assert "has no record of job never.ran" in line
    assert "--allow-missing-journal" in line
    # The operator's rollback initContainer runs before a job's first write: that is no error.
    done = sparkguard(
        "rollback",
        "--job-id",
        "never.ran",
        "--journal",
        str(root / "etl"),
        "--allow-missing-journal",
    )
    assert done.returncode == 0, done.stderr
    assert "tables: 0" in done.stdout


def test_inspect_on_plain_parquet_says_it_is_no_sparkguard_table(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    pq.write_table(pa.table({"id": [1, 2, 3]}), plain / "part-00000.parquet")
    done = sparkguard("inspect", str(plain))
    assert done.returncode == 2
    line = one_line(done.stderr)
    assert "no sparkguard timeline" in line
    assert "readers see none of its files" in line  # what that means
    assert "visible" not in done.stdout


@pytest.mark.parametrize(
    ("journal", "needle"),
    [
        ("ftp://h/j", "cannot open ftp:// locations"),
        ("s3:/bucket", "write s3://bucket"),
        ("memory://x", "inside one process"),
    ],
)
def test_spark_conf_checks_the_journal_as_rollback_does(
    journal: str, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    done = sparkguard("spark-conf", "--job-id", "j-1", "--for-pod", "--journal", journal)
    assert done.returncode == 2
    line = one_line(done.stderr)
    assert f"--journal {journal!r}" in line
    assert needle in line
    assert done.stdout == ""
    # rollback (in-process: the same entry point) says the same
    assert cli.main(["rollback", "--job-id", "j-1", "--journal", journal]) == 2
    said = one_line(capsys.readouterr().err).split(": error: ", 1)[1]
    assert said in line


def test_spark_conf_for_a_pod_names_the_bundle_as_the_operator_injects_it() -> None:
    from sparkguard.operator import mutation

    done = sparkguard(
        "spark-conf",
        "--job-id",
        "etl.nightly",
        "--journal",
        "s3a://bucket/sparkguard/journal/etl",
        "--for-pod",
        "--format",
        "json",
    )
    assert done.returncode == 0, done.stderr
    conf = json.loads(done.stdout)
    assert conf["spark.jars"] == mutation.JAR_URI
    assert (
        conf["spark.jars"]
        == "local:///opt/sparkguard/lib/sparkguard/spark_lib/jars/sparkguard-spark.jar"
    )
    assert done.stderr == ""


OWNER = "k8s:etl/nightly/5b0e2c1d"


class _ApiServer(http.server.ThreadingHTTPServer):
    """The one read ``rollback --app`` makes, as the API server answers it: the app's object,
    404 for anything else (so the Apache kind's path is tried after Kubeflow's)."""

    def __init__(self, apps: dict[str, dict[str, object]]) -> None:
        self.apps = apps
        self.paths: list[str] = []
        super().__init__(("127.0.0.1", 0), _ApiHandler)


class _ApiHandler(http.server.BaseHTTPRequestHandler):
    server: _ApiServer

    def do_GET(self) -> None:
        self.server.paths.append(self.path)
        app = self.server.apps.get(self.path)
        body = json.dumps(app or {"kind": "Status", "code": 404, "reason": "NotFound"}).encode()
        self.send_response(200 if app else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def api_server(tmp_path: Path) -> Iterator[tuple[_ApiServer, Path]]:
    """A loopback API server and a kubeconfig pointing at it."""
    server = _ApiServer({})
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "c", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}
                ],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    yield server, kubeconfig
    server.shutdown()
    server.server_close()


def test_rollback_app_reads_job_journal_and_owner_from_the_app(
    tmp_path: Path, api_server: tuple[_ApiServer, Path]
) -> None:
    server, kubeconfig = api_server
    root, table = tmp_path / "journal", tmp_path / "table"
    # Admission's doing: the owner annotation, and the journal <journal root>/<namespace>.
    _task(_start(str(table), str(root / "etl"), {}, "etl.nightly", owner=OWNER), 0, PARTS[0])
    server.apps["/apis/sparkoperator.k8s.io/v1beta2/namespaces/etl/sparkapplications/nightly"] = {
        "apiVersion": "sparkoperator.k8s.io/v1beta2",
        "kind": "SparkApplication",
        "metadata": {
            "namespace": "etl",
            "name": "nightly",
            "labels": {"sparkguard.io/enabled": "true"},
            "annotations": {"sparkguard.io/job-id": "etl.nightly", "sparkguard.io/owner": OWNER},
        },
        "spec": {"sparkConf": {"spark.sparkguard.journal": f"{root}/etl"}},
    }
    # The bare flags without --owner skip the operator's writes (the owner is not job:<id>) ...
    done = sparkguard("rollback", "--job-id", "etl.nightly", "--journal", f"{root}/etl")
    assert done.returncode == 0, done.stderr
    assert "left alone: " in done.stdout
    assert f"--owner '{OWNER}'" in done.stdout
    # ... --app cannot get it wrong.
    done = sparkguard("rollback", "--app", "etl/nightly", "--kubeconfig", str(kubeconfig))
    assert done.returncode == 0, done.stderr
    assert f"--job-id etl.nightly --journal {root}/etl --owner {OWNER}" in done.stderr
    assert "rolled back: 1" in done.stdout
    assert "left alone" not in done.stdout
    # An app the cluster does not have: one line, exit 2; both kinds were asked.
    done = sparkguard("rollback", "--app", "etl/gone", "--kubeconfig", str(kubeconfig))
    assert done.returncode == 2
    assert "no SparkApplication etl/gone" in one_line(done.stderr)
    assert any("spark.apache.org" in p for p in server.paths)


def test_spark_conf_takes_every_spelling_of_the_marker_mode(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """One spelling (``sidecar``) for users; the annotation's and Hudi's stay accepted."""
    printed = set()
    for mode in ("sidecar", "timeline-server", "TIMELINE_SERVER_BASED"):
        argv = ["spark-conf", "--job-id", "j-1", "--for-pod", "--markers", mode]
        assert cli.main([*argv, "--endpoint", "http://{driverHost}:7070", "--format", "json"]) == 0
        printed.add(json.loads(capsys.readouterr().out)["spark.sparkguard.markers.type"])
    assert printed == {"TIMELINE_SERVER_BASED"}
