"""The exception hierarchy of the operator: one base, one class per kind of failure.

Every message says what was wrong and what to do about it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sparkguard.operator import appmeta


class OperatorError(Exception):
    """Base of every error raised by sparkguard's operator."""


class ConfigError(OperatorError, ValueError):
    """An operator setting (a ``SPARKGUARD_*`` environment variable) is unusable."""


class InvalidApplicationError(OperatorError, ValueError):
    """A SparkApplication cannot be protected as it is: bad annotations or conflicting fields.

    ``problems`` lists each offending annotation or field with the fix; the message joins them.
    """

    def __init__(self, problems: Iterable[appmeta.Problem]) -> None:
        self.problems = tuple(problems)
        super().__init__("; ".join(str(p) for p in self.problems))


class RollbackUnavailableError(OperatorError):
    """The rollback of sparkguard's library cannot be imported in this process."""


class KubeConflictError(OperatorError):
    """The object changed between our read and our write (HTTP 409); read it again."""
