"""Deprecated alias of :mod:`sparkguard.spark_lib.spark.marker_http`: import that module instead."""

from typing import TYPE_CHECKING

from sparkguard.spark_lib import _deprecated_alias

if TYPE_CHECKING:
    from sparkguard.spark_lib.spark.marker_http import *  # noqa: F403

_deprecated_alias(__name__, "sparkguard.spark_lib.spark.marker_http")
