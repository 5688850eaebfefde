"""Deprecated alias of :mod:`sparkguard.spark_lib.storage.rollback`: import that module instead."""

from typing import TYPE_CHECKING

from sparkguard.spark_lib import _deprecated_alias

if TYPE_CHECKING:
    from sparkguard.spark_lib.storage.rollback import *  # noqa: F403

_deprecated_alias(__name__, "sparkguard.spark_lib.storage.rollback")
