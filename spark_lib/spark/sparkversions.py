"""The Spark versions sparkguard supports, and what differs between them (docs/compatibility.md).

One JVM jar serves every supported line (Spark 4.0 to 4.3, Scala 2.13). What differs is the
conf: on Spark 4.0 the streaming classes of the jar cannot load (Spark 4.1 moved the classes
they extend), so the streaming file sink and the checkpoint files stay Spark's own there, and
``s3a://`` is refused (Spark 4.0's Hadoop 3.4.1 has no S3A conditional create). Spark 3.5
(Scala 2.12) and anything newer than the newest tested line are refused, with the same words
as the jar's refusal. Purely computational functions with no side-effects, besides
:func:`installed_pyspark`.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import re
from typing import Final

from sparkguard.spark_lib.base import errors

#: The supported lines (major.minor), oldest first: the jar's ``SparkVersions.SUPPORTED``.
SUPPORTED_LINES: Final = ("4.0", "4.1", "4.2", "4.3")
#: The lines whose Hadoop has no S3A conditional create (Hadoop 3.4.2+).
NO_S3A_CONDITIONAL_CREATE: Final = frozenset({"4.0"})
#: The lines on which the jar's streaming sink protocol and checkpoint manager cannot load.
NO_JVM_STREAMING: Final = frozenset({"4.0"})

_VERSION = re.compile(r"(?P<line>\d+\.\d+)(?:\.\d+)?(?:[-.+][0-9A-Za-z.-]*)?")


class UnsupportedSparkError(errors.ConfigError):
    """The job's Spark is not one sparkguard supports."""


@dataclasses.dataclass(frozen=True)
class SparkLine:
    """A supported Spark version and what sparkguard does on it."""

    version: str
    line: str

    @property
    def jvm_streaming(self) -> bool:
        """Whether the jar's streaming sink protocol and checkpoint manager run on it."""
        return self.line not in NO_JVM_STREAMING

    @property
    def s3a(self) -> bool:
        """Whether the JVM layer can write ``s3a://`` on it (S3A's conditional create)."""
        return self.line not in NO_S3A_CONDITIONAL_CREATE


def refusal(version: str, *, what: str) -> str:
    """The one-line refusal of an unsupported ``version`` (set by ``what``): the jar's words."""
    return (
        f"Spark {version} ({what}) is not supported (supported: Spark "
        f"{', '.join(SUPPORTED_LINES)}): run the job on a supported Spark, or remove sparkguard's "
        "conf (spark.sql.sources.commitProtocolClass and the jar in spark.jars) from this job"
    )


def check(version: str, *, what: str) -> SparkLine:
    """The supported line of ``version`` (``"4.0.5"``, ``"4.1"``, ``"v4.2.1"``), or
    :class:`UnsupportedSparkError` with the one-line refusal naming ``what`` set it."""
    text = str(version).strip().removeprefix("v")
    match = _VERSION.fullmatch(text)
    if match is None:
        raise UnsupportedSparkError(
            f"{what} {version!r} is not a Spark version: give major.minor[.patch], e.g. 4.1.4"
        )
    if match.group("line") not in SUPPORTED_LINES:
        raise UnsupportedSparkError(refusal(text, what=what))
    return SparkLine(version=text, line=match.group("line"))


def refuse_s3a(line: SparkLine, url: str, *, what: str) -> None:
    """A one-line :class:`~sparkguard.spark_lib.base.errors.ConfigError` when ``url`` (set by
    ``what``) is on S3A and ``line``'s Hadoop has no S3A conditional create."""
    if not line.s3a and url.startswith("s3a://"):
        raise errors.ConfigError(
            f"{what} {url!r} is on S3A, which needs Spark 4.1 or newer (S3A's conditional create, "
            f"Hadoop 3.4.2+); this is Spark {line.version}: run the job on Spark 4.1+, or write "
            "this table with the Python writer (sparkguard.spark_lib) where it fits"
        )


def installed_pyspark() -> str | None:
    """The version of the PySpark installed beside sparkguard, or None when there is none."""
    try:
        return importlib.metadata.version("pyspark")
    except importlib.metadata.PackageNotFoundError:
        return None
