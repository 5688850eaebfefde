"""The ``sparkguard`` command: one entry point, a subcommand per part.

Subcommands import their part lazily, so ``sparkguard rollback`` in a Spark image never needs
kopf or aiohttp installed. The help a user sees (``sparkguard <command> --help``) is written
here, for users; module docstrings stay developer documentation.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import logging
import re
import sys
from collections.abc import Sequence
from typing import Any, Final, NoReturn

from sparkguard import __version__

logger = logging.getLogger(__name__)

EXIT_STATUS: Final = """\
exit status: 0 done, 1 a storage or runtime failure, 2 bad input (the message names it)"""
STORAGE_ENV: Final = """\
Storage credentials come from the environment: AWS_* for S3 (s3fs reads them), or
SPARKGUARD_STORAGE_OPTIONS holding a JSON object of fsspec storage options."""


@dataclasses.dataclass(frozen=True)
class Subcommand:
    """A subcommand: the module that defines ``add_arguments(parser)`` and ``run(args) -> int``,
    its one-line summary and the description ``--help`` shows."""

    module: str
    summary: str
    description: str
    epilog: str = EXIT_STATUS


SUBCOMMANDS: Final[dict[str, Subcommand]] = {
    "demo": Subcommand(
        "sparkguard.spark_lib.tools.demo",
        "run the local exactly-once demonstration",
        """\
A failing Spark job, recovered exactly once, on your machine.

An unchanged PySpark job (a plain df.write.parquet, no sparkguard import) runs
under the Spark conf that 'sparkguard spark-conf' prints, so sparkguard's JVM
commit protocol writes its table, with its markers batched by the marker
sidecar. Its first attempt is killed (SIGKILL of the whole driver) once half of
its data files are on storage. The demo shows what it left behind, rolls it
back with 'sparkguard rollback', reruns the job with the same job id, and checks
that every row is in the table exactly once and that no uncommitted or
temporary file remains. --writer fsspec uses sparkguard's Python writer instead
(df.write.format("sparkguard")), as the demo does by itself where the JVM path
cannot write (e.g. an s3:// --storage). Needs Java 17 for Spark and the JVM
layer's jar (scripts/demo.sh builds it); takes about a minute on 2 cores.""",
        "exit status: 0 every check passed, 1 a check failed, 2 bad input",
    ),
    "rollback": Subcommand(
        "sparkguard.spark_lib.tools.commands",
        "roll back what a job left uncommitted, on every table its journal names",
        f"""\
Roll back what a failed job left uncommitted, on every table its journal names.

Each undecided write of the job is first marked rolled back (so a late commit of
a driver that is still alive fails), then its data files are deleted. Files that
a committed write lists are never deleted. Safe to run again at any time: a
second run resumes an interrupted one and removes files written late.

With --app NAMESPACE/NAME it rolls back what the operator would for that
SparkApplication: its job id, journal and owner read from the app through the
kubeconfig. Without cluster access give --job-id, --journal and, for an app the
operator admitted, --owner (its sparkguard.io/owner annotation).

{STORAGE_ENV}""",
    ),
    "inspect": Subcommand(
        "sparkguard.spark_lib.tools.commands",
        "show a table's writes, their states and files",
        f"""\
Show a table's writes (instants): job, state, operation, files, bytes, rows and
marked files; its streams; its latest timeline snapshot; and the files, bytes
and rows a reader sees. --archived also lists the writes the archive holds.

{STORAGE_ENV}""",
    ),
    "adopt": Subcommand(
        "sparkguard.spark_lib.tools.commands",
        "record a table's existing files as its committed baseline",
        f"""\
Record the files a table holds now, written before sparkguard (by plain Spark or
anything else), as one committed write: its baseline. Run it once, before the
table's first protected write. Afterwards sparkguard's committed-only readers
see those files like any reader does, a rollback never touches them, and an
overwrite through sparkguard replaces them as it replaces any committed file.
Files are those Spark's listing sees (names starting with '_' or '.' are left
out). Refused on a table that already has a sparkguard timeline. Run it while
nothing writes the table: a file written meanwhile may be left out.

{STORAGE_ENV}""",
    ),
    "compact": Subcommand(
        "sparkguard.spark_lib.tools.commands",
        "snapshot a table's timeline and archive its settled instants",
        f"""\
Write a snapshot of a table's timeline (the committed state its settled writes
produced), archive those writes' timeline files into one archive file and delete
them from the timeline, so readers, writers and rollbacks read a short timeline.
Writers do this on their own every spark.sparkguard.timeline.snapshotEvery
decided writes (default 10). Safe to run at any time, next to running writers
and rollbacks, and again after an interruption.

{STORAGE_ENV}""",
    ),
    "sidecar": Subcommand(
        "sparkguard.sidecar.cli",
        "run the marker-batching sidecar",
        """\
Run the marker-batching sidecar next to a Spark driver.

Executors send it the name of each data file before they write it; it appends
the names in batches to marker files beside the table, so a rollback can find
every file of a failed write. Settings come from SPARKGUARD_SIDECAR_*
environment variables; the flags override them. Two come from the environment
only: SPARKGUARD_SIDECAR_TOKEN (the bearer token executors send, unless
--token-file) and SPARKGUARD_STORAGE_OPTIONS (a JSON object of fsspec storage
options). docs/sidecar.md describes every setting and route.""",
    ),
    "bundle": Subcommand(
        "sparkguard.spark_lib.tools.bundle",
        "copy the library into a directory for Spark",
        """\
Copy sparkguard's Spark library (pure Python: sparkguard and fsspec) into a
directory, for Spark images that do not have sparkguard installed: add the
directory to PYTHONPATH of the driver and the executors.

The Spark image still needs Python 3.11 or newer, pyarrow, and the fsspec
backend of your store (s3fs for S3). The operator runs this command in an
initContainer of every guarded application.""",
    ),
    "spark-conf": Subcommand(
        "sparkguard.spark_lib.spark.sparkconf",
        "print the Spark conf that guards an unchanged job (JVM commit protocol)",
        """\
Print the Spark conf that routes every file write of a job (df.write.parquet,
insertInto, ...) through sparkguard's commit protocol, with no code change: the
protocol class, sparkguard's jar in spark.jars and the spark.sparkguard.*
settings. The operator injects the same conf; use this without the operator:

  eval "spark-submit $(sparkguard spark-conf --job-id nightly-1 \\
      --journal s3a://bucket/sparkguard/journal | tr '\\n' ' ') job.py"

and after a failed run, before rerunning it:

  sparkguard rollback --job-id nightly-1 --journal s3a://bucket/sparkguard/journal

Give the job's other jars with --extra-jars (not spark-submit's --jars, which
would replace spark.jars and drop sparkguard's jar).

--format json prints a JSON object (e.g. for a SparkApplication's sparkConf),
--format properties a file for spark-submit --properties-file.""",
    ),
    "operator": Subcommand(
        "sparkguard.operator.cli",
        "run the Kubernetes operator (admission webhook + failure recovery)",
        """\
Run the sparkguard operator: the admission webhook that prepares opted-in
SparkApplications, and the automatic rollback and resubmission of failed ones.

Settings come from SPARKGUARD_* environment variables (docs/operator.md); the
flags override a few of them for local runs.""",
    ),
}


_ARGUMENT_ERROR = re.compile(r"argument (?P<names>[^:]+): (?P<problem>.*)", re.DOTALL)
_REQUIRED_ERROR = re.compile(r"the following arguments are required: (?P<names>.+)", re.DOTALL)


def describe_argument_error(message: str) -> str:
    """argparse's error ``message`` said once and plainly: ``--job-id 'X' is not valid: ...``
    (not ``argument --job-id: --job-id 'X' ...``), ``--journal is required``.

    A purely computational function with no side-effects; a message it does not know is
    returned unchanged.
    """
    message = " ".join(message.split())  # one line, whatever the message held
    required = _REQUIRED_ERROR.fullmatch(message)
    if required:
        names = required.group("names")
        return f"{names} {'are' if ',' in names else 'is'} required"
    argument = _ARGUMENT_ERROR.fullmatch(message)
    if argument:
        names = argument.group("names").split("/")  # "--namespace/-n": say the long one
        name = next((n for n in names if n.startswith("--")), names[-1])
        problem = argument.group("problem")
        return problem if problem.startswith(name) else f"{name}: {problem}"
    return message


class CommandLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line naming the input, with a pointer to
    ``--help`` instead of the usage block (docs/writer.md, "CLI"); exit status 2. Subcommand
    parsers are of the same class (argparse creates them with the parent's class)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: the parsers of the subcommands, by name (:func:`build_parser` registers them)
        self.subcommands: dict[str, argparse.ArgumentParser] = {}

    def error(self, message: str) -> NoReturn:
        """Print ``<prog>: error: <what was wrong>; run '<prog> --help' ...`` and exit 2."""
        self.exit(
            2,
            f"{self.prog}: error: {describe_argument_error(message)}; run "
            f"'{self.prog} --help' for the options\n",
        )

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        """As argparse's, but an unknown flag of a subcommand is reported by that subcommand
        (``sparkguard sidecar: error: unrecognized arguments: ...``), not by ``sparkguard``."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            command = self.subcommands.get(getattr(parsed, "command", None) or "", self)
            command.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed


def build_parser() -> CommandLineParser:
    """The argument parser with every subcommand registered."""
    parser = CommandLineParser(
        prog="sparkguard",
        description="Exactly-once output for Spark on Kubernetes.",
        epilog="Run 'sparkguard COMMAND --help' for the options of a command.",
    )
    parser.add_argument("--version", action="version", version=f"sparkguard {__version__}")
    parser.add_argument(
        "--log-level",
        default="WARNING",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="logging level for sparkguard's own messages (default: WARNING)",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, command in SUBCOMMANDS.items():
        module = importlib.import_module(command.module)
        sub = commands.add_parser(
            name,
            help=command.summary,
            description=command.description,
            epilog=command.epilog,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(sub)
        sub.set_defaults(_module=command.module)
        parser.subcommands[name] = sub
    return parser


def check_rollback_target(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Fill ``rollback``'s job id, journal and owner from ``--app`` (the SparkApplication, read
    through the kubeconfig; the operator's own reading of its annotations), or require
    ``--job-id`` and ``--journal``. Returns 0, or the exit code after one line on stderr."""
    if args.app is None:
        missing = [
            flag
            for flag in ("--job-id", "--journal")
            if not getattr(args, flag[2:].replace("-", "_"))
        ]
        if missing:
            parser.error(f"the following arguments are required: {', '.join(missing)}")
        return 0
    if args.job_id or args.owner:
        parser.error(
            "argument --app: --app reads the job id and owner from the app; drop --job-id and "
            "--owner"
        )
    import urllib3.exceptions
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config import ConfigException

    from sparkguard.operator import errors, kube, mutation

    namespace, name = args.app
    where = f"--app {namespace}/{name}"
    try:
        app = kube.read_application(namespace, name, kubeconfig=args.kubeconfig)
        target = mutation.rollback_target(app, journal=args.journal)
    except (LookupError, errors.InvalidApplicationError, ConfigException) as exc:
        print(f"sparkguard rollback: error: {where}: {exc}", file=sys.stderr)
        return 2
    except urllib3.exceptions.HTTPError as exc:
        print(
            f"sparkguard rollback: failed: {where}: cannot reach the API server ({exc}); check "
            "the kubeconfig, or give --job-id, --journal and --owner instead",
            file=sys.stderr,
        )
        return 1
    except ApiException as exc:
        print(
            f"sparkguard rollback: failed: {where}: the API server refused the read "
            f"({exc.status}: {kube.api_message(exc)}); the kubeconfig's user needs get on "
            f"sparkapplications in namespace {namespace}",
            file=sys.stderr,
        )
        return 1
    args.job_id, args.journal, args.owner = target.job_id, target.journal, target.owner
    print(
        f"rollback {args.app[0]}/{args.app[1]}: --job-id {target.job_id} --journal "
        f"{target.journal}" + (f" --owner {target.owner}" if target.owner else ""),
        file=sys.stderr,
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    module = importlib.import_module(args._module)
    try:
        code: int = 0
        if args.command == "rollback":
            code = check_rollback_target(args, parser.subcommands["rollback"])
        if not code:
            code = module.run(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except OSError as exc:  # storage: where, why and what to do, whatever the command
        from sparkguard.spark_lib.base import errors

        retry = f"run 'sparkguard {args.command}' again"
        print(
            f"sparkguard {args.command}: failed: {errors.describe_storage_error(exc, retry=retry)}",
            file=sys.stderr,
        )
        return 1
    except Exception as exc:  # a bug or an unforeseen failure: one line, traceback on request
        logger.debug("sparkguard %s failed", args.command, exc_info=True)
        print(
            f"sparkguard {args.command}: unexpected error: {type(exc).__name__}: {exc} (run "
            "'sparkguard --log-level DEBUG ...' for the traceback, and report it)",
            file=sys.stderr,
        )
        return 1
    return code
