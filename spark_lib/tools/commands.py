"""The ``rollback``, ``inspect`` and ``compact`` subcommands: recover a failed job, look at a
table, snapshot its timeline.

``add_arguments`` registers the flags of either (told apart by the parser's name) and ``run``
runs it; user-facing help texts live in ``sparkguard.cli``. Every user error (a bad flag, a URL
sparkguard cannot open, a journal or table that is missing or is a file) is one line on stderr
and exit status 2; a storage failure is one line and exit status 1 (docs/writer.md, "CLI").
Storage options come from the environment: s3fs reads ``AWS_*`` itself, and
``SPARKGUARD_STORAGE_OPTIONS`` may hold a JSON object of fsspec options.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, TextIO

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import errors, paths
from sparkguard.spark_lib.spark import config
from sparkguard.spark_lib.storage import markers, reader, rollback, snapshots, timeline

STORAGE_ENV: Final = "SPARKGUARD_STORAGE_OPTIONS"


def storage_options_from_env(env: Mapping[str, str]) -> dict[str, Any]:
    """fsspec storage options from ``SPARKGUARD_STORAGE_OPTIONS`` (a purely computational
    function with no side-effects)."""
    raw = env.get(STORAGE_ENV, "").strip()
    return config.parse_storage_options(raw, key=STORAGE_ENV) if raw else {}


def _job_id(value: str) -> str:
    try:
        return timeline.validate_job_id(value, what="--job-id")
    except errors.ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _owner(value: str) -> str:
    try:
        return timeline.validate_owner(value, what="--owner")
    except errors.ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _app_ref(value: str) -> tuple[str, str]:
    namespace, _, name = value.partition("/")
    if not namespace or not name or "/" in name:
        raise argparse.ArgumentTypeError(
            f"--app {value!r} is not valid: give the SparkApplication as <namespace>/<name>"
        )
    return namespace, name


def _non_empty(flag: str) -> Any:
    def parse(value: str) -> str:
        if not value.strip():
            raise argparse.ArgumentTypeError(f"{flag} must not be empty; give a storage URL")
        return value.strip()

    return parse


def _retention_days(value: str) -> float:
    try:
        return config.parse_retention_days(value, key="--archive-retention-days")
    except errors.ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the flags of ``rollback`` or ``inspect`` (chosen by the parser's name)."""
    command = parser.prog.split()[-1]
    if command == "inspect":
        parser.add_argument("table", type=_non_empty("<table-url>"), help="table URL or path")
        parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
        parser.add_argument(
            "--archived",
            action="store_true",
            help="also list the instants the timeline archive holds (older, settled writes)",
        )
        parser.set_defaults(_command="inspect")
        return
    if command == "adopt":
        parser.add_argument("table", type=_non_empty("<table-url>"), help="table URL or path")
        parser.add_argument(
            "--dry-run", action="store_true", help="list the files it would adopt, record nothing"
        )
        parser.set_defaults(_command="adopt")
        return
    if command == "compact":
        parser.add_argument("table", type=_non_empty("<table-url>"), help="table URL or path")
        parser.add_argument(
            "--archive-retention-days",
            type=_retention_days,
            default=None,
            help="delete archive files of pruned snapshots older than this many days (default: "
            "keep the archive)",
        )
        parser.add_argument("--json", action="store_true", help="print the result as JSON")
        parser.set_defaults(_command="compact")
        return
    parser.add_argument(
        "--app",
        metavar="NAMESPACE/NAME",
        type=_app_ref,
        help="the SparkApplication to roll back as the operator would: its job id, journal and "
        "owner read from the app through the kubeconfig (replaces --job-id and --owner)",
    )
    parser.add_argument(
        "--kubeconfig",
        help="with --app: the kubeconfig (default: in-cluster, else $KUBECONFIG or "
        "~/.kube/config, as kubectl)",
    )
    parser.add_argument(
        "--job-id", type=_job_id, help="the job to roll back (required without --app)"
    )
    parser.add_argument(
        "--journal",
        type=_non_empty("--journal"),
        help="job journal URL (required without --app; with the operator: <journal "
        "root>/<namespace>)",
    )
    parser.add_argument(
        "--owner",
        type=_owner,
        default=None,
        help="roll back only instants of this owner (default: job:<job id>); others are "
        "reported and left alone",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="also roll back undecided instants of other owners (an orphaned instant)",
    )
    parser.add_argument("--dry-run", action="store_true", help="report, change nothing")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    parser.add_argument(
        "--allow-missing-journal",
        action="store_true",
        help="a journal location that does not exist yet means nothing to roll back (a job's "
        "first run; the operator's rollback initContainer passes it) instead of an error",
    )
    parser.set_defaults(_command="rollback")


def run(args: argparse.Namespace) -> int:
    """Run ``rollback``, ``inspect``, ``compact`` or ``adopt``; returns the exit code (2 for
    bad input, 1 on failure)."""
    try:
        options = storage_options_from_env(os.environ)
        out = sys.stdout
        table: str = getattr(args, "table", "")  # rollback has none
        by_command: dict[str, Callable[[], int]] = {
            "inspect": lambda: run_inspect(
                table, as_json=args.json, options=options, out=out, archived=args.archived
            ),
            "compact": lambda: run_compact(
                table,
                as_json=args.json,
                options=options,
                out=out,
                retention_days=args.archive_retention_days,
            ),
            "adopt": lambda: run_adopt(table, dry_run=args.dry_run, options=options, out=out),
            "rollback": lambda: run_rollback(args, options=options, out=out, err=sys.stderr),
        }
        return by_command[args._command]()
    except errors.ConfigError as exc:
        print(f"sparkguard {args._command}: error: {exc}", file=sys.stderr)
        return 2
    except errors.SparkguardError as exc:
        print(f"sparkguard {args._command}: failed: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        retry = f"run the {args._command} again"
        described = errors.describe_storage_error(exc, retry=retry)
        print(f"sparkguard {args._command}: failed: {described}", file=sys.stderr)
        return 1


def open_location(
    url: str, *, what: str, options: Mapping[str, Any]
) -> tuple[filemanager.FileManager, str]:
    """The file manager and path of a URL given on the command line.

    A URL sparkguard cannot open raises :class:`~sparkguard.spark_lib.base.errors.ConfigError`
    naming ``what`` (the flag or argument) and the fix, so the CLI exits 2.
    """
    url = filemanager.check_location(url, what=what)
    try:
        return filemanager.resolve(url, storage_options=options, options_source=STORAGE_ENV)
    except errors.ConfigError as exc:
        raise errors.ConfigError(f"{exc} (for {what} {url!r})") from None
    except (errors.UnsupportedStoreError, errors.InvalidPathError) as exc:
        raise errors.ConfigError(f"{what} {url!r}: {exc}") from None


def require_directory(
    manager: filemanager.FileManager, path: str, *, what: str, url: str, fix: str
) -> None:
    """Raise ConfigError unless ``path`` is an existing directory (a file or nothing is not)."""
    if not manager.exists(path):
        raise errors.ConfigError(f"{what} {url!r} does not exist; {fix}")
    if manager.fs.isfile(path):
        raise errors.ConfigError(f"{what} {url!r} is a file, not a directory; {fix}")


def open_table(url: str, *, options: Mapping[str, Any]) -> tuple[filemanager.FileManager, str]:
    """The file manager and path of the table at ``url``, which must be a directory."""
    manager, path = open_location(url, what="table", options=options)
    require_directory(
        manager,
        path,
        what="table",
        url=url,
        fix="give the table's directory (the URL it was saved to)",
    )
    return manager, path


def require_sparkguard_table(
    manager: filemanager.FileManager, path: str, *, url: str, streams: bool = False
) -> None:
    """Raise ConfigError, saying what that means, unless the table at ``path`` has a sparkguard
    timeline (``streams``: or a streaming sink's log) -- a directory plain Spark wrote has none."""
    if timeline.Timeline(manager, path).exists():
        return
    if streams and reader.stream_jobs(manager, path):
        return
    raise errors.ConfigError(
        f"table {url!r} has no sparkguard timeline (no {timeline.SPARKGUARD_DIR}/"
        f"{timeline.TIMELINE_DIR}/): sparkguard never wrote there, so it has no writes to "
        "show, and sparkguard's readers see none of its files; give a table written through "
        f"sparkguard, or record its files as committed with 'sparkguard adopt {url}'"
    )


#: how many folders beside or below a journal are searched for the job's record
NEAR_MISS_LIMIT: Final = 200


def require_job_recorded(
    manager: filemanager.FileManager, path: str, *, url: str, job_id: str, allow: bool
) -> None:
    """Raise ConfigError unless the journal at ``path`` has a folder for ``job_id``, saying
    where it looked and naming a near miss: the job's folder one level below (the chart's
    journal root given instead of its per-namespace folder) or beside it, or a table given
    as the journal. ``allow`` (``--allow-missing-journal``): no record means nothing to do."""
    if allow or manager.exists(paths.join(path, job_id)):
        return
    looked = f"--journal {url!r} has no record of job {job_id} (no {paths.join(url, job_id)}/)"
    if manager.exists(paths.join(path, timeline.SPARKGUARD_DIR)):
        raise errors.ConfigError(
            f"{looked}: it is a table, not a journal; give the journal the job wrote (its "
            "spark.sparkguard.journal)"
        )
    near = next(iter(_near_journals(manager, path, url=url, job_id=job_id)), None)
    if near is not None:
        raise errors.ConfigError(
            f"{looked}; found {paths.join(near, job_id)}: use --journal {near}"
        )
    raise errors.ConfigError(
        f"{looked}, nor do the folders beside or below it; give the journal the job wrote (its "
        "spark.sparkguard.journal; with the operator, <journal root>/<namespace>, or use --app "
        "<namespace>/<name>), or add --allow-missing-journal if the job never wrote"
    )


def _near_journals(
    manager: filemanager.FileManager, path: str, *, url: str, job_id: str
) -> Iterable[str]:
    """URLs of folders below, then beside, ``path`` that hold a folder ``job_id``."""
    base = url.rstrip("/")
    below = [(info.path, f"{base}/{info.name}") for info in manager.list(path) if info.is_dir]
    parent = paths.parent(path)
    beside = []
    if parent and parent != path and "/" in base:
        beside = [
            (info.path, f"{base.rsplit('/', 1)[0]}/{info.name}")
            for info in manager.list(parent)
            if info.is_dir and info.path.rstrip("/") != path.rstrip("/")
        ]
    for folder, folder_url in [*below, *beside][:NEAR_MISS_LIMIT]:
        if manager.exists(paths.join(folder, job_id)):
            yield folder_url


def run_rollback(
    args: argparse.Namespace, *, options: dict[str, Any], out: TextIO, err: TextIO
) -> int:
    """``sparkguard rollback``."""

    def progress(phase: str, done: int, total: int) -> None:
        if not args.quiet:
            print(f"rollback {args.job_id}: {phase} {done}/{total}", file=err, flush=True)

    if args.job_id is None or args.journal is None:  # the entry point checks this first
        raise errors.ConfigError("--job-id and --journal are required (or --app)")
    manager, path = open_location(args.journal, what="--journal", options=options)
    fix = "give the journal location the job wrote (its spark.sparkguard.journal)"
    if args.allow_missing_journal and not manager.exists(path):
        print(
            f"rollback {args.job_id}: journal {args.journal!r} does not exist yet: "
            "nothing to roll back",
            file=err,
        )
    else:
        require_directory(manager, path, what="--journal", url=args.journal, fix=fix)
        require_job_recorded(
            manager, path, url=args.journal, job_id=args.job_id, allow=args.allow_missing_journal
        )
    summary = rollback.rollback_job(
        args.job_id,
        args.journal,
        owner=args.owner,
        force=args.force,
        storage_options=options,
        dry_run=args.dry_run,
        progress=progress,
    )
    if args.json:
        json.dump(summary.to_json(), out, indent=2)
        out.write("\n")
        return 0
    if summary.details:
        _render(
            out,
            title=f"rollback of job {summary.job_id}" + (" (dry run)" if summary.dry_run else ""),
            columns=["table", "instant", "action", "deleted", "kept", "markers"],
            rows=[
                [
                    d.table,
                    d.instant,
                    d.action.value,
                    d.files_deleted,
                    d.files_kept,
                    d.markers_deleted,
                ]
                for d in summary.details
            ],
        )
    if not summary.tables:
        out.write(f"the journal names no table for job {summary.job_id}: nothing to roll back\n")
    out.write(
        f"tables: {len(summary.tables)}  rolled back: {len(summary.instants_rolled_back)}  "
        f"committed: {len(summary.instants_committed)}  files deleted: {summary.files_deleted}  "
        f"files kept: {summary.files_kept}  temp files removed: {summary.temp_files_removed}\n"
    )
    for table in summary.tables_missing:
        out.write(f"table missing (no timeline; nothing done there): {table}\n")
    removed = "would be removed" if summary.dry_run else "removed"
    for table in summary.tables_removed:
        out.write(
            f"table {removed}: {table} (the rolled-back write created its location and left "
            "nothing else; the journal keeps the record)\n"
        )
    for other in summary.instants_other_owner:
        out.write(
            f"left alone: {other.instant} on {other.table} is in flight for owner "
            f"{other.owner!r}; if its writer is dead, run again with --owner '{other.owner}' "
            "(or --force)\n"
        )
    for warning in summary.warnings:
        out.write(f"warning: {warning}\n")
    return 0


def inspect_table(
    url: str, *, options: Mapping[str, Any], archived: bool = False
) -> dict[str, Any]:
    """Everything ``inspect`` shows, as a JSON-serialisable dict (``archived``: also the
    instants of the timeline archive)."""
    manager, path = filemanager.resolve(url, storage_options=options, options_source=STORAGE_ENV)
    tl = timeline.Timeline(manager, path)
    view = snapshots.load_view(manager, path)
    instants = []
    for instant_id in tl.instant_ids():
        if instant_id in view.state.covered:
            continue  # covered by the snapshot, its archive step not finished yet
        # One damaged instant must not hide the others: its error is shown in its row.
        try:
            status = tl.status(instant_id)
        except errors.CorruptFileError as exc:
            instants.append(_damaged_instant(instant_id, str(exc)))
            continue
        info = status.info
        extra = status.extra
        operation = extra.get("operation") or (info.operation if info else None)
        mdir = markers.marker_dir(path, status.instant)
        error = None
        marked: int | None = 0
        warnings: list[str] = []
        if status.state is not timeline.State.COMMITTED or manager.exists(mdir):
            try:
                snapshot = markers.snapshot_marker_dir(manager, mdir)
                marked = len(snapshot.marked_files)
                warnings = [
                    *snapshot.warnings,
                    *(f"torn last line in {f}" for f, _ in snapshot.torn),
                ]
            except errors.CorruptFileError as exc:
                marked, error = None, str(exc)
        instants.append(
            {
                "instant": status.instant,
                "jobId": status.job_id,
                "owner": status.owner,
                "state": status.state.value,
                "operation": operation,
                # overwrite-partitions: the partition directories it replaced
                "partitions": extra.get("partitions")
                if operation == reader.Operation.OVERWRITE_PARTITIONS
                else None,
                "write": info.write if info else None,  # write identity (None: a stream's)
                "attempt": info.attempt if info else None,
                "files": len(status.files),
                "bytes": sum(f.size for f in status.files),
                **count_rows(status.files),
                "marked": marked,
                "warnings": warnings,
                "error": error,
            }
        )
    streams = []
    for job_id in reader.stream_jobs(manager, path):
        log = reader.StreamLog(manager, path, job_id)
        entries = log.committed()
        stream_files = [f for e in entries for f in e.files]
        streams.append(
            {
                "jobId": job_id,
                "batches": len(entries),
                "lastBatch": entries[-1].batch_id if entries else None,
                "files": len(stream_files),
                "bytes": sum(f.size for f in stream_files),
                **count_rows(stream_files),
                "pendingMarkerDirs": len(log.marker_dirs()),
            }
        )
    commits = view.commits()
    visible = reader.visible_files(commits)
    snap = view.snapshot
    report: dict[str, Any] = {
        "table": reader.table_url(url),
        "instants": instants,
        "streams": streams,
        "visible": {
            "files": len(visible),
            "bytes": sum(f.size for f in visible.values()),
            **count_rows(visible.values()),
        },
        "superseded": len(view.superseded()),
        "snapshot": None
        if snap is None
        else {
            "snapshot": snap.number,
            "created": snap.created,
            "instantsCovered": len(snap.instants),
            "damagedNewer": list(view.state.damaged),
            "latestPointer": snapshots.read_latest(manager, path),
        },
    }
    if archived:
        report["archived"] = [
            {
                "instant": s.instant,
                "jobId": s.job_id,
                "owner": s.owner,
                "state": s.state.value,
                "operation": s.extra.get("operation") or (s.info.operation if s.info else None),
                "write": s.info.write if s.info else None,
                "files": len(s.files),
                "bytes": sum(f.size for f in s.files),
                **count_rows(s.files),
            }
            for s in snapshots.read_archived(manager, path)
        ]
    return report


def count_rows(files: Iterable[timeline.DataFile]) -> dict[str, Any]:
    """The row totals of ``files``, never adding an unknown count (a file's ``rows`` is -1
    when its writer could not count them: ORC, JSON, CSV and streaming-sink files).

    ``rows`` is the exact total, or ``None`` when any file's count is unknown; ``rowsKnown``
    sums the known counts (a lower bound then) and ``filesRowsUnknown`` counts the others.
    A purely computational function with no side-effects.
    """
    known = unknown = 0
    for file in files:
        if file.rows >= 0:
            known += file.rows
        else:
            unknown += 1
    return {"rows": None if unknown else known, "rowsKnown": known, "filesRowsUnknown": unknown}


def describe_rows(totals: Mapping[str, Any], *, short: bool = False) -> str:
    """Totals of :func:`count_rows` for people: ``300 rows``, ``>= 42 rows (2 files
    unknown)`` or ``rows unknown`` (no count known); ``short`` (a table cell): ``300``,
    ``>=42`` or ``?``. A purely computational function with no side-effects."""
    if totals["rows"] is not None:
        return str(totals["rows"]) if short else f"{totals['rows']} rows"
    if totals["rowsKnown"] == 0:  # ">= 0" says nothing
        return "?" if short else "rows unknown"
    if short:
        return f">={totals['rowsKnown']}"
    unknown = totals["filesRowsUnknown"]
    return f">= {totals['rowsKnown']} rows ({unknown} file{'s' if unknown > 1 else ''} unknown)"


def _damaged_instant(instant: str, error: str) -> dict[str, Any]:
    return {
        "instant": instant,
        "jobId": timeline.job_of_instant(instant),
        "owner": None,
        "state": "damaged",
        "operation": None,
        "partitions": None,
        "write": None,
        "attempt": None,
        "files": 0,
        "bytes": 0,
        **count_rows(()),
        "marked": None,
        "warnings": [],
        "error": error,
    }


#: the job id of the instant that adopts a table's existing files
ADOPT_JOB: Final = "sparkguard.adopt"


def existing_data_files(manager: filemanager.FileManager, path: str) -> list[timeline.DataFile]:
    """The data files under the table at ``path`` as Spark's file listing sees them: every file
    no segment of whose relative path starts with ``_`` or ``.`` (Spark's hidden names, our
    ``_sparkguard/`` among them), temp files left out; rows unknown (-1)."""
    found = []
    for full, info in sorted(manager.fs.find(path, detail=True).items()):
        relative = full[len(path.rstrip("/")) + 1 :]
        hidden = any(segment.startswith(("_", ".")) for segment in relative.split("/"))
        if hidden or info.get("type") == "directory" or filemanager.is_temp_name(relative):
            continue
        found.append(timeline.DataFile(path=relative, size=int(info.get("size") or 0), rows=-1))
    return found


def run_adopt(url: str, *, dry_run: bool, options: Mapping[str, Any], out: TextIO) -> int:
    """``sparkguard adopt``: record a table's existing files, once, as a committed baseline
    (one committed instant of job ``sparkguard.adopt``), so sparkguard's readers see them and
    rollbacks and overwrites treat them as committed."""
    manager, path = open_table(url, options=options)
    tl = timeline.Timeline(manager, path)
    if tl.exists():
        adopted = any(s.job_id == ADOPT_JOB for s in tl.statuses(job_id=ADOPT_JOB))
        raise errors.ConfigError(
            f"table {url!r} "
            + ("was adopted already" if adopted else "already has a sparkguard timeline")
            + ": its files are recorded there; adopt only a table sparkguard never wrote"
        )
    files = existing_data_files(manager, path)
    if not files:
        raise errors.ConfigError(
            f"table {url!r} holds no data file (hidden '_' and '.' names aside): nothing to adopt"
        )
    if not dry_run:
        instant = tl.start(ADOPT_JOB, attempt=0, marker_type="DIRECT", extra={"adopted": True})
        tl.commit(instant, files, extra={"adopted": True})
    total = sum(f.size for f in files)
    verb = "would adopt" if dry_run else "adopted"
    out.write(f"{reader.table_url(url)}: {verb} {len(files)} files, {total} bytes\n")
    return 0


def run_compact(
    url: str,
    *,
    as_json: bool,
    options: Mapping[str, Any],
    out: TextIO,
    retention_days: float | None = None,
) -> int:
    """``sparkguard compact``."""
    manager, path = open_table(url, options=options)
    require_sparkguard_table(manager, path, url=url)
    result = snapshots.compact(manager, path, archive_retention_days=retention_days)
    report = {"table": reader.table_url(url), **result.to_json()}
    if as_json:
        json.dump(report, out, indent=2)
        out.write("\n")
        return 0
    if result.snapshot is None:
        out.write(f"{report['table']}: no snapshot written ({result.reason})")
    else:
        out.write(
            f"{report['table']}: snapshot {result.snapshot} written, covering "
            f"{result.covered} more instants"
        )
    out.write(
        f"; archived {result.archived}, deleted {result.deleted} instants from the timeline; "
        f"pruned {result.snapshots_deleted} snapshots, {result.archives_deleted} archives\n"
    )
    return 0


def run_inspect(
    url: str,
    *,
    as_json: bool,
    options: Mapping[str, Any],
    out: TextIO,
    archived: bool = False,
) -> int:
    """``sparkguard inspect``."""
    manager, path = open_table(url, options=options)  # refuses a missing table, naming the fix
    require_sparkguard_table(manager, path, url=url, streams=True)
    report = inspect_table(url, options=options, archived=archived)
    if as_json:
        json.dump(report, out, indent=2)
        out.write("\n")
        return 0
    _render(
        out,
        title=f"table {report['table']}",
        columns=[
            "instant",
            "job",
            "owner",
            "state",
            "operation",
            "write",
            "files",
            "bytes",
            "rows",
            "marked",
        ],
        rows=[
            [
                i["instant"],
                i["jobId"],
                "" if i["owner"] is None else i["owner"],
                i["state"],
                " ".join([i["operation"] or "", *(i["partitions"] or [])]).strip(),
                "" if i["write"] is None else i["write"],
                i["files"],
                i["bytes"],
                describe_rows(i, short=True),
                "?" if i["marked"] is None else i["marked"],
            ]
            for i in report["instants"]
        ],
    )
    for i in report["instants"]:
        if i["error"]:
            out.write(f"damaged: {i['instant']}: {i['error']}\n")
        for warning in i["warnings"]:
            out.write(f"warning: {i['instant']}: {warning}\n")
    for stream in report["streams"]:
        out.write(
            f"stream {stream['jobId']}: {stream['batches']} batches (last "
            f"{stream['lastBatch']}), {stream['files']} files, {describe_rows(stream)}, "
            f"{stream['pendingMarkerDirs']} pending marker dirs\n"
        )
    snap = report["snapshot"]
    if snap is not None:
        out.write(
            f"snapshot {snap['snapshot']} ({snap['created']}): covers "
            f"{snap['instantsCovered']} hot instants of its last compaction; older history "
            "is archived (inspect --archived lists it)\n"
        )
        for damaged in snap["damagedNewer"]:
            out.write(f"warning: snapshot {damaged} is damaged; read through its archive\n")
    if archived:
        _render(
            out,
            title="archived instants",
            columns=["instant", "job", "owner", "state", "operation", "write", "files", "rows"],
            rows=[
                [
                    a["instant"],
                    a["jobId"],
                    a["owner"],
                    a["state"],
                    a["operation"] or "",
                    "" if a["write"] is None else a["write"],
                    a["files"],
                    describe_rows(a, short=True),
                ]
                for a in report["archived"]
            ],
        )
    visible = report["visible"]
    out.write(
        f"visible: {visible['files']} files, {visible['bytes']} bytes, {describe_rows(visible)}; "
        f"superseded: {report['superseded']} files\n"
    )
    return 0


def _render(out: TextIO, *, title: str, columns: list[str], rows: list[list[Any]]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # rich is optional: plain columns then
        out.write(title + "\n" + "\t".join(columns) + "\n")
        for row in rows:
            out.write("\t".join(str(v) for v in row) + "\n")
        return
    table = Table(title=title)
    for column in columns:
        table.add_column(column)
    cells = [[str(v) for v in row] for row in rows]
    for row_cells in cells:
        table.add_row(*row_cells)
    # Wide enough that no cell wraps: an owner or instant is copied from here into a command.
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    Console(file=out, width=max(160, sum(widths) + 3 * len(widths) + 1)).print(table)
