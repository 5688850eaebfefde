"""The Spark conf that puts sparkguard's JVM layer under an unchanged job (`sparkguard spark-conf`).

Spark's own file writes (``df.write.parquet``, ``insertInto``, ...) go through the class named by
``spark.sql.sources.commitProtocolClass``, the streaming file sink's through
``spark.sql.streaming.commitProtocolClass``, and a streaming query's checkpoint files through
``spark.sql.streaming.checkpointFileManagerClass``; sparkguard's classes are in the jar this
package ships (``spark_lib/jars/sparkguard-spark.jar``, built by ``scripts/build-jvm.sh``). One
function, :func:`build_spark_conf`, produces every key that enables them: the protocol classes,
the checkpoint file manager class, the jar in ``spark.jars`` and the ``spark.sparkguard.*``
settings the protocols read (the same keys the
Python writer reads, see :mod:`sparkguard.spark_lib.spark.config`). The operator injects its result;
the CLI prints it for users without the operator. It is a purely computational function with no
side-effects besides locating the packaged jar when none is given.
"""

from __future__ import annotations

import argparse
import enum
import json
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from sparkguard.spark_lib import filemanager
from sparkguard.spark_lib.base import errors
from sparkguard.spark_lib.spark import config, sparkversions
from sparkguard.spark_lib.storage import markers as marker_files
from sparkguard.spark_lib.storage import timeline

#: The FileCommitProtocol implementation in the jar.
PROTOCOL_CLASS: Final = "io.sparkguard.spark.SparkguardCommitProtocol"
COMMIT_PROTOCOL_KEY: Final = "spark.sql.sources.commitProtocolClass"
#: The streaming file sink's protocol (a ManifestFileCommitProtocol) in the jar.
STREAMING_PROTOCOL_CLASS: Final = "io.sparkguard.spark.SparkguardStreamingCommitProtocol"
STREAMING_COMMIT_PROTOCOL_KEY: Final = "spark.sql.streaming.commitProtocolClass"
#: The CheckpointFileManager implementation in the jar: atomic streaming checkpoint files.
CHECKPOINT_MANAGER_CLASS: Final = "io.sparkguard.spark.SparkguardCheckpointFileManager"
CHECKPOINT_MANAGER_KEY: Final = "spark.sql.streaming.checkpointFileManagerClass"
JARS_KEY: Final = "spark.jars"
#: The filesystems the protocol's tasks open their data files through (``sg-s3a://``: S3A's
#: per-file create without the existence probes; all three: the written length and rows recorded).
OWNED_FS: Final = {
    "spark.hadoop.fs.sg-s3a.impl": "io.sparkguard.spark.OwnedFileSystem",
    "spark.hadoop.fs.sg-file.impl": "io.sparkguard.spark.OwnedLocalFileSystem",
    "spark.hadoop.fs.sg-hdfs.impl": "io.sparkguard.spark.OwnedHdfsFileSystem",
}
#: The jar's file name inside the package (``sparkguard/spark_lib/jars/``).
JAR_NAME: Final = "sparkguard-spark.jar"
JARS_DIR: Final = Path(__file__).resolve().parents[1] / "jars"  # spark_lib/jars
#: Where the jar lands, relative to the root of a bundle (``sparkguard bundle --dest``).
JAR_IN_BUNDLE: Final = f"sparkguard/spark_lib/jars/{JAR_NAME}"
#: Where the operator's initContainer writes the bundle in every guarded pod (driver and
#: executors mount it there).
POD_LIB_DIR: Final = "/opt/sparkguard/lib"
#: The jar as Spark finds it in such a pod: ``local://`` = "already on this node, don't upload
#: or fetch". The operator injects this location; ``sparkguard spark-conf --for-pod`` prints it.
POD_JAR_URI: Final = f"local://{POD_LIB_DIR}/{JAR_IN_BUNDLE}"


class MarkerMode(enum.StrEnum):
    """Where the protocol's markers go: straight to storage, or batched by the driver's sidecar."""

    DIRECT = "direct"
    SIDECAR = "sidecar"

    @property
    def marker_type(self) -> marker_files.MarkerType:
        """The ``spark.sparkguard.markers.type`` value of this mode."""
        if self is MarkerMode.SIDECAR:
            return marker_files.MarkerType.TIMELINE_SERVER_BASED
        return marker_files.MarkerType.DIRECT


class OutputFormat(enum.StrEnum):
    """How ``sparkguard spark-conf`` prints the conf."""

    ARGS = "args"  # --conf k=v lines for spark-submit
    JSON = "json"  # one JSON object (sparkConf of a SparkApplication)
    PROPERTIES = "properties"  # a Java properties file (spark-submit --properties-file)


class JarNotBuiltError(errors.SparkguardError):
    """The package carries no JVM jar: it was installed from a checkout that never built it."""


def jar_path() -> Path:
    """The path of the JVM layer's jar in this installation.

    Raises :class:`JarNotBuiltError` (saying how to build it) when the package has no jar.
    """
    path = JARS_DIR / JAR_NAME
    if not path.is_file():
        raise JarNotBuiltError(
            f"the JVM layer's jar is missing from this installation ({path}): run "
            "scripts/build-jvm.sh in the sparkguard checkout before installing it"
        )
    return path


#: How each parameter is called in error messages: by the function, and by the CLI.
PARAMETER_NAMES: Final[Mapping[str, str]] = {
    name: name
    for name in (
        "job_id",
        "owner",
        "markers",
        "endpoint",
        "token_file",
        "journal",
        "jar",
        "extra_jars",
        "spark_version",
    )
}
FLAG_NAMES: Final[Mapping[str, str]] = {
    name: "--" + name.replace("_", "-") for name in PARAMETER_NAMES
}


def build_spark_conf(
    job_id: str,
    *,
    owner: str | None = None,
    markers: MarkerMode | str = MarkerMode.DIRECT,
    endpoint: str | None = None,
    token_file: str | None = None,
    journal: str | None = None,
    jar: str | Path | None = None,
    extra_jars: str | None = None,
    streaming_sink: bool = True,
    spark_version: str | None = None,
    names: Mapping[str, str] = PARAMETER_NAMES,
) -> dict[str, str]:
    """The Spark conf that makes every file write of a job go through sparkguard's protocol,
    and every streaming checkpoint file through sparkguard's checkpoint file manager (one
    conditional PUT per file on S3A, fsynced rename on local disk and HDFS).

    Batch writes get ``SparkguardCommitProtocol``; with ``streaming_sink`` (the default) the
    streaming file sink (``writeStream`` to a file format) gets
    ``SparkguardStreamingCommitProtocol`` (deterministic names per batch, markers, no orphan
    after a rollback; local, HDFS and object-store sinks with conditional create).
    ``streaming_sink=False`` leaves the streaming sink to Spark's own protocol.

    ``markers`` is ``"direct"`` (markers written to storage by each task) or ``"sidecar"`` (sent
    to the marker sidecar at ``endpoint``, with the bearer token in ``token_file``; ``endpoint``
    may contain ``{driverHost}``). ``owner=None`` leaves the owner to the default
    ``job:<jobId>``. ``jar`` is where the driver finds the jar (e.g. ``local:///...`` inside a
    pod); by default the one packaged here. ``extra_jars`` is the job's own ``spark.jars``
    (comma-separated, e.g. hadoop-aws and the AWS SDK for S3A): ``spark.jars`` is then those,
    then sparkguard's, so neither list replaces the other. ``spark_version`` is the job's Spark
    (e.g. ``"4.0.5"``; None: the conf for Spark 4.1 and newer, unchecked): an unsupported one
    is refused in one line (:mod:`sparkversions`); on Spark 4.0 the streaming sink and the
    checkpoint files stay Spark's own (the jar's streaming classes need 4.1) and an ``s3a://``
    journal is refused. ``names`` says how errors call each parameter.

    Raises :class:`~sparkguard.spark_lib.base.errors.ConfigError` naming the parameter and the fix.
    """
    timeline.validate_job_id(job_id, what=names["job_id"])
    line = (
        None
        if spark_version is None
        else sparkversions.check(spark_version, what=names["spark_version"])
    )
    jvm_streaming = line is None or line.jvm_streaming
    try:
        marker_type = marker_files.parse_marker_type(str(markers), key=names["markers"])
    except errors.ConfigError:
        raise errors.ConfigError(
            f"{names['markers']} {markers!r} is not valid: use 'direct' (markers on storage) or "
            "'sidecar' (batched by the driver's marker sidecar)"
        ) from None
    timeline_server = marker_type is marker_files.MarkerType.TIMELINE_SERVER_BASED
    mode = MarkerMode.SIDECAR if timeline_server else MarkerMode.DIRECT
    conf: dict[str, str] = {COMMIT_PROTOCOL_KEY: PROTOCOL_CLASS}
    if jvm_streaming:
        conf[CHECKPOINT_MANAGER_KEY] = CHECKPOINT_MANAGER_CLASS
        if streaming_sink:
            conf[STREAMING_COMMIT_PROTOCOL_KEY] = STREAMING_PROTOCOL_CLASS
    conf[JARS_KEY] = append_jar(
        _extra_jars(extra_jars, what=names["extra_jars"]), _jar_location(jar, what=names["jar"])
    )
    conf[config.KEYS["job_id"][0]] = job_id
    conf.update(OWNED_FS)
    if owner is not None:
        conf[config.KEYS["owner"][0]] = timeline.validate_owner(owner, what=names["owner"])
    conf[config.KEYS["marker_type"][0]] = mode.marker_type.value
    if mode is MarkerMode.SIDECAR:
        if not endpoint:
            raise errors.ConfigError(
                f"{names['markers']} sidecar needs the sidecar's address: give "
                f"{names['endpoint']} (e.g. http://{{driverHost}}:8765)"
            )
        if not endpoint.startswith(("http://", "https://")):
            raise errors.ConfigError(
                f"{names['endpoint']} {endpoint!r} is not an http(s) URL: give e.g. "
                "http://{driverHost}:8765"
            )
        conf[config.KEYS["marker_endpoint"][0]] = endpoint
        if token_file is not None:
            conf[config.KEYS["token_file"][0]] = _non_empty(token_file, what=names["token_file"])
    else:
        for name, value in (("endpoint", endpoint), ("token_file", token_file)):
            if value is not None:
                raise errors.ConfigError(
                    f"{names[name]} applies only to {names['markers']} sidecar: drop it, or "
                    f"add {names['markers']} sidecar"
                )
    if journal is not None:
        conf[config.KEYS["journal"][0]] = _journal(journal, line, what=names["journal"])
    return conf


def _journal(journal: str, line: sparkversions.SparkLine | None, *, what: str) -> str:
    if line is not None:
        sparkversions.refuse_s3a(line, journal, what=what)
    return _non_empty(journal, what=what)


def _jar_location(jar: str | Path | None, *, what: str) -> str:
    if jar is None:
        return str(jar_path())
    location = _non_empty(str(jar), what=what)
    if "," in location:
        # spark.jars is a comma-separated list: a comma would split our entry in two.
        raise errors.ConfigError(f"{what} {location!r} contains a comma: give one jar location")
    return location


def append_jar(current: str | None, jar: str) -> str:
    """``spark.jars`` with ``jar`` appended (the user's jars first, their spelling kept; ``jar``
    once). A purely computational function with no side-effects."""
    if current is None or not current.strip(" ,"):
        return jar
    if jar in (e.strip() for e in current.split(",")):
        return current
    return f"{current.rstrip(' ,')},{jar}"


def _extra_jars(value: str | None, *, what: str) -> str | None:
    if value is None:
        return None
    entries = [e.strip() for e in value.split(",")]
    if not all(entries):
        raise errors.ConfigError(
            f"{what} {value!r} has an empty entry: give jar locations separated by single commas"
        )
    for entry in entries:
        _non_empty(entry, what=what)
    return ",".join(entries)


def _non_empty(value: str, *, what: str) -> str:
    if not value.strip() or not value.isprintable():
        raise errors.ConfigError(
            f"{what} {value!r} is not valid: give a non-empty value without control characters"
        )
    return value


def format_conf(conf: Mapping[str, str], output: OutputFormat | str) -> str:
    """``conf`` as text: ``--conf k=v`` lines (shell-quoted where needed), JSON, or a Java
    properties file; each ends with a newline."""
    output = OutputFormat(output)
    if output is OutputFormat.JSON:
        return json.dumps(dict(conf), indent=2) + "\n"
    if output is OutputFormat.PROPERTIES:
        return "".join(f"{key}={_properties_value(value)}\n" for key, value in conf.items())
    return "".join(f"--conf {shlex.quote(f'{key}={value}')}\n" for key, value in conf.items())


def _properties_value(value: str) -> str:
    # java.util.Properties.load: backslash escapes; a leading space would be dropped.
    escaped = value.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
    escaped = escaped.replace("\t", "\\t")
    return "\\" + escaped if escaped.startswith(" ") else escaped


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``spark-conf`` command's flags."""
    parser.add_argument("--job-id", required=True, help="the job's id ([a-z0-9.-], 1-100)")
    parser.add_argument("--owner", help="owner of the job's instants (default: job:<jobId>)")
    parser.add_argument(
        "--markers",
        default=MarkerMode.DIRECT.value,
        help="direct (markers on storage, the default) or sidecar (batched by the marker "
        "sidecar); timeline-server and TIMELINE_SERVER_BASED are accepted for sidecar",
    )
    parser.add_argument("--endpoint", help="the sidecar's URL, with --markers sidecar")
    parser.add_argument("--token-file", help="the sidecar's bearer token file")
    parser.add_argument(
        "--journal",
        help="the job journal's location, where each write records its table: 'sparkguard "
        "rollback --journal' needs it to find what a failed run left (give one)",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--jar", help="where Spark finds sparkguard's jar (default: the one installed here)"
    )
    where.add_argument(
        "--for-pod",
        action="store_true",
        help=f"for a Spark pod (a SparkApplication's sparkConf): the jar at {POD_JAR_URI}, "
        f"where the operator puts it; without the operator, run 'sparkguard bundle --dest "
        f"{POD_LIB_DIR}' in an initContainer sharing that directory with the driver and the "
        "executors",
    )
    parser.add_argument(
        "--extra-jars",
        metavar="JARS",
        help="the job's other jars, comma-separated (e.g. hadoop-aws and the AWS SDK for S3A): "
        "spark.jars lists them, then sparkguard's; spark-submit's --jars would replace it",
    )
    parser.add_argument(
        "--streaming-sink",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="route the streaming file sink through sparkguard (default); --no-streaming-sink "
        "leaves it to Spark's own protocol",
    )
    parser.add_argument(
        "--spark-version",
        metavar="VERSION",
        help="the job's Spark (e.g. 4.0.5; default: the PySpark installed here): the conf for it, "
        f"or a refusal when it is not one of Spark {', '.join(sparkversions.SUPPORTED_LINES)}",
    )
    parser.add_argument(
        "--format",
        default=OutputFormat.ARGS.value,
        choices=[f.value for f in OutputFormat],
        help="args: --conf k=v lines for spark-submit (default); json (with --for-pod: a "
        "SparkApplication's sparkConf); properties",
    )


def run(args: argparse.Namespace) -> int:
    """Print the conf; exit 2 on bad input or an unsupported Spark, 1 when the jar is missing."""
    spark_version, names = args.spark_version, FLAG_NAMES
    if spark_version is None:
        spark_version = sparkversions.installed_pyspark()
        names = {**FLAG_NAMES, "spark_version": "the installed PySpark; give --spark-version"}
    try:
        # the same check as every command that takes a journal (rollback, inspect, ...)
        journal = args.journal
        if journal is not None:
            journal = filemanager.check_location(journal, what="--journal")
        conf = build_spark_conf(
            args.job_id,
            owner=args.owner,
            markers=args.markers,
            endpoint=args.endpoint,
            token_file=args.token_file,
            journal=journal,
            jar=POD_JAR_URI if args.for_pod else args.jar,
            extra_jars=args.extra_jars,
            streaming_sink=args.streaming_sink,
            spark_version=spark_version,
            names=names,
        )
    except errors.ConfigError as exc:
        print(
            f"sparkguard spark-conf: error: {exc}; run 'sparkguard spark-conf --help' for the "
            "options",
            file=sys.stderr,
        )
        return 2
    except JarNotBuiltError as exc:
        print(f"sparkguard spark-conf: {exc}, or pass --jar PATH", file=sys.stderr)
        return 1
    if args.journal is None:
        # stderr: the conf on stdout still goes into spark-submit's command line unchanged
        print(
            "sparkguard spark-conf: note: no --journal, so 'sparkguard rollback' cannot find "
            "what a failed run of this job left; give --journal URL (e.g. "
            "s3a://bucket/sparkguard/journal)",
            file=sys.stderr,
        )
    if spark_version is None:
        print(
            "sparkguard spark-conf: note: no --spark-version and no PySpark here: the conf is "
            f"for Spark {sparkversions.SUPPORTED_LINES[1]} and newer",
            file=sys.stderr,
        )
    elif CHECKPOINT_MANAGER_KEY not in conf:
        print(
            f"sparkguard spark-conf: note: on Spark {spark_version} streaming queries keep "
            "Spark's own sink protocol and checkpoint files (sparkguard's need Spark 4.1+)",
            file=sys.stderr,
        )
    if args.format == OutputFormat.JSON and not (args.for_pod or args.jar):
        print(
            f"sparkguard spark-conf: note: spark.jars names this machine's jar; for a "
            f"SparkApplication's sparkConf add --for-pod (the jar at {POD_JAR_URI})",
            file=sys.stderr,
        )
    sys.stdout.write(format_conf(conf, args.format))
    return 0
