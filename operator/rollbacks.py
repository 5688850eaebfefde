"""The bridge to the library's rollback, and storage credentials from a Secret.

``sparkguard.spark_lib.storage.rollback.rollback_job`` is imported lazily, on first use, so the
operator starts (and its tests run) with any rollback function injected instead.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any, Protocol

from sparkguard.operator import appmeta, errors, kube


class RollbackSummary(Protocol):
    """What the library's ``RollbackSummary`` offers the operator."""

    @property
    def instants_rolled_back(self) -> tuple[str, ...]: ...

    @property
    def instants_committed(self) -> tuple[str, ...]: ...

    @property
    def files_deleted(self) -> int: ...

    @property
    def files_kept(self) -> int: ...

    def to_json(self) -> dict[str, Any]: ...


class RollbackFn(Protocol):
    """The signature of ``sparkguard.spark_lib.storage.rollback.rollback_job`` (blocking I/O)."""

    def __call__(
        self,
        job_id: str,
        journal: str,
        *,
        owner: str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        dry_run: bool = False,
    ) -> RollbackSummary: ...


def rollback_job(
    job_id: str,
    journal: str,
    *,
    owner: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    dry_run: bool = False,
) -> RollbackSummary:
    """Roll back the uncommitted instants of ``job_id`` with the library (blocking).

    Only instants of ``owner`` (the app's ``sparkguard.io/owner``; ``None``: the default owner
    ``job:<jobId>``) are touched, so the recovery of a deleted app never rolls back what an
    app recreated under the same name (a new owner) is writing.

    Raises :class:`errors.RollbackUnavailableError` when the library's rollback cannot be
    imported (an operator image built without it).
    """
    try:
        from sparkguard.spark_lib.storage import rollback
    except ImportError as exc:
        raise errors.RollbackUnavailableError(
            f"cannot import sparkguard.spark_lib.storage.rollback ({exc}); install a sparkguard "
            "build that includes the library's rollback"
        ) from exc
    # owner=None is the library's default owner: passed only when the app has one.
    by_owner: dict[str, Any] = {"owner": owner} if owner is not None else {}
    summary: RollbackSummary = rollback.rollback_job(
        job_id, journal, storage_options=storage_options, dry_run=dry_run, **by_owner
    )
    return summary


#: Secret key -> s3fs storage option
_S3_KEYS = {
    "AWS_ACCESS_KEY_ID": "key",
    "AWS_SECRET_ACCESS_KEY": "secret",
    "AWS_SESSION_TOKEN": "token",
    "AWS_ENDPOINT_URL": "endpoint_url",
}


def decode_secret_data(data: Mapping[str, str] | None) -> dict[str, str]:
    """The ``data`` of a Secret, base64-decoded to text.

    A purely computational function with no side-effects. Raises :class:`errors.OperatorError`
    naming the key that is not valid base64/UTF-8.
    """
    decoded: dict[str, str] = {}
    for key, value in (data or {}).items():
        try:
            decoded[key] = base64.b64decode(value, validate=True).decode()
        except (binascii.Error, UnicodeDecodeError) as exc:
            raise errors.OperatorError(
                f"Secret key {key!r} is not base64-encoded UTF-8 text ({exc}); store it with "
                "kubectl create secret generic ... --from-literal"
            ) from exc
    return decoded


def storage_options_from_secret(values: Mapping[str, str]) -> dict[str, Any]:
    """s3fs storage options from a Secret's (decoded) environment-style keys.

    A purely computational function with no side-effects. ``AWS_ACCESS_KEY_ID``,
    ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_ENDPOINT_URL`` and
    ``AWS_REGION``/``AWS_DEFAULT_REGION`` are understood; other keys are ignored.
    """
    options: dict[str, Any] = {
        option: values[key] for key, option in _S3_KEYS.items() if values.get(key)
    }
    region = values.get("AWS_REGION") or values.get("AWS_DEFAULT_REGION")
    if region:
        options["client_kwargs"] = {"region_name": region}
    return options


async def read_storage_options(
    client: kube.KubeClient, namespace: str, options: appmeta.Options
) -> dict[str, Any] | None:
    """The storage options of the Secret ``sparkguard.io/storage-secret`` names (``None``: none).

    Raises :class:`errors.OperatorError` when that Secret does not exist in ``namespace``.
    """
    if not options.storage_secret:
        return None
    data = await client.read_secret(namespace, options.storage_secret)
    if data is None:
        raise errors.OperatorError(
            f"Secret {namespace}/{options.storage_secret} named by "
            f"{appmeta.STORAGE_SECRET} does not exist; create it or fix the annotation"
        )
    return storage_options_from_secret(decode_secret_data(data))
