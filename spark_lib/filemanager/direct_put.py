"""The direct-put backend: object stores (S3 and the like).

The bytes go straight to the key; the object appears only when the upload completes;
``cancel()`` aborts the multipart upload; with ``overwrite=False`` the upload is conditional
(``If-None-Match: *``), or, where the user opted in, a racy check then put. Versioned rewrites
are ``If-Match: <ETag>`` puts; listings, existence checks and bulk deletes run concurrently.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import os
import uuid
from collections.abc import Awaitable, Iterable, Mapping
from typing import Any, Final

import fsspec
import fsspec.asyn
from fsspec.spec import AbstractFileSystem

from sparkguard.spark_lib.base import errors, paths
from sparkguard.spark_lib.filemanager.base import (
    CREATE_PROBE_PREFIX,
    LIST_THRESHOLD,
    AtomicStream,
    CreateMode,
    FileInfo,
    FileManager,
    Held,
    Kind,
    Leftover,
    _by_directory,
    _modified_of,
)

logger = logging.getLogger(__name__)

#: keys per S3 DeleteObjects request (the API's limit)
BULK_DELETE_KEYS: Final = 1000
#: independent requests a file manager keeps in flight at once (HEADs, listings, bulk deletes)
CONCURRENCY: Final = 32
#: the error codes a conditional delete (``ETag: *``) of an absent key gets back
_ABSENT_CODES: Final = frozenset({"NoSuchKey", "PreconditionFailed", "404", "412"})

#: the user-metadata key (``x-amz-meta-sparkguard-write``) of a conditional write's random token:
#: how a retried write that had landed is told from another writer's object
WRITE_ID: Final = "sparkguard-write"

#: Object stores known to honour ``If-None-Match: *`` on put (conditional create).
CONDITIONAL_PUT_PROTOCOLS: Final = frozenset({"s3", "s3a"})


class _DirectPutStream(AtomicStream):
    """Bytes go straight to the key: one PUT, or a multipart upload past ``block_size``.

    Nothing is visible until the PUT or the CompleteMultipartUpload succeeds. With
    ``overwrite=False`` both carry ``If-None-Match: *``, so the store itself refuses a second
    creator (412). A cancelled or refused multipart upload is aborted: no parts linger.
    """

    def __init__(
        self, fs: AbstractFileSystem, path: str, *, overwrite: bool, block_size: int
    ) -> None:
        super().__init__(path)
        self._fs = fs
        self._bucket, self._key, _ = fs.split_path(path)
        self._conditions: dict[str, str] = {} if overwrite else {"IfNoneMatch": "*"}
        #: a conditional create's own token, stored with the object (see :func:`_landed`)
        self._token = uuid.uuid4().hex
        self._metadata: dict[str, Any] = {} if overwrite else {"Metadata": {WRITE_ID: self._token}}
        self._block_size = block_size
        self._buffer = bytearray()
        self._upload_id: str | None = None
        self._parts: list[dict[str, Any]] = []

    def _call(self, method: str, **kwargs: Any) -> Any:
        return self._fs.call_s3(method, Bucket=self._bucket, Key=self._key, **kwargs)

    def _write(self, data: bytes | memoryview) -> None:
        self._buffer += data
        while len(self._buffer) >= self._block_size:
            self._upload_part(bytes(self._buffer[: self._block_size]))
            del self._buffer[: self._block_size]

    def _upload_part(self, chunk: bytes) -> None:
        if self._upload_id is None:
            self._upload_id = str(
                self._call("create_multipart_upload", **self._metadata)["UploadId"]
            )
        number = len(self._parts) + 1
        result = self._call("upload_part", UploadId=self._upload_id, PartNumber=number, Body=chunk)
        self._parts.append({"PartNumber": number, "ETag": result["ETag"]})

    def _publish(self) -> None:
        try:
            if self._upload_id is None:
                self._call(
                    "put_object", Body=bytes(self._buffer), **self._conditions, **self._metadata
                )
            else:
                if self._buffer:
                    self._upload_part(bytes(self._buffer))
                    self._buffer = bytearray()
                self._call(
                    "complete_multipart_upload",
                    UploadId=self._upload_id,
                    MultipartUpload={"Parts": self._parts},
                    **self._conditions,
                )
                self._upload_id = None
        except (FileExistsError, OSError) as exc:
            refused = isinstance(exc, FileExistsError) or _is_precondition_failed(exc)
            # A write whose answer was lost (a reset after the store applied it) is retried by
            # botocore; the retry of a conditional create then meets the object it created
            # (412), and the retry of a completion meets an upload that is gone (404). After a
            # retry, either is this stream's own write when the key carries its token.
            if (
                (refused or isinstance(exc, FileNotFoundError))
                and self._conditions
                and _landed(self._fs, self._bucket, self._key, self._token) is not None
            ):
                logger.info("%s: a retried write found its own earlier attempt stored", self.path)
                self._upload_id = None
                return
            if refused:
                raise errors.AlreadyExistsError(
                    f"{self.path} already exists; nothing was written (conditional put got 412)"
                ) from None
            if self._conditions and _is_not_implemented(exc):
                raise errors.UnsupportedStoreError(
                    f"the store rejected a conditional put (If-None-Match) for {self.path}; "
                    "set spark.sparkguard.createMode=check-then-put to accept a racy "
                    "create-if-absent, or use a store with conditional writes"
                ) from exc
            raise
        finally:
            self._buffer = bytearray()

    def _hold(self) -> Held:
        """Upload what is buffered as the last part (even a small file) and leave the upload
        open: S3 lists no object at the key until it is completed. A conditional create
        (``overwrite=False``) publishes instead: its completion must carry the condition."""
        if self._conditions:
            self._publish()
            return Held(self.path)
        try:
            if self._buffer or self._upload_id is None:  # an empty file: one empty part
                self._upload_part(bytes(self._buffer))
        finally:
            self._buffer = bytearray()
        assert self._upload_id is not None
        return Held(self.path, upload=self._upload_id)

    def _discard_held(self, held: Held) -> None:
        self._discard()

    def _discard(self) -> None:
        self._buffer = bytearray()
        if self._upload_id is not None:
            upload_id, self._upload_id = self._upload_id, None
            with contextlib.suppress(FileNotFoundError):
                self._call("abort_multipart_upload", UploadId=upload_id)


def _landed(fs: AbstractFileSystem, bucket: str, key: str, token: str) -> str | None:
    """The ETag of ``bucket``/``key`` when the write that carries ``token`` in its metadata
    (:data:`WRITE_ID`) made it, else None (one HEAD): recognises a write that landed although
    its answer was lost, and only that one (another writer's object, even with equal bytes,
    carries another token)."""
    try:
        head = fs.call_s3("head_object", Bucket=bucket, Key=key)
    except FileNotFoundError:
        return None
    if head.get("Metadata", {}).get(WRITE_ID) != token:
        return None
    return str(head["ETag"])


def _read_body(fs: AbstractFileSystem, body: Any) -> bytes:
    """Read an (async) streaming body of ``get_object`` on the filesystem's event loop."""

    async def read() -> bytes:
        async with body as stream:
            return bytes(await stream.read())

    return bytes(fsspec.asyn.sync(fs.loop, read))


def _error_code(exc: BaseException) -> str:
    cause = exc.__cause__ or exc.__context__
    response = getattr(cause, "response", None) or getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    return ""


def _is_precondition_failed(exc: BaseException) -> bool:
    return _error_code(exc) in ("PreconditionFailed", "412") or "PreconditionFailed" in str(exc)


def _is_not_implemented(exc: BaseException) -> bool:
    return _error_code(exc) in ("NotImplemented", "501") or "NotImplemented" in str(exc)


class _CheckThenPutStream(AtomicStream):
    """Racy create-if-absent for stores without conditional writes (explicit opt-in only)."""

    def __init__(self, fs: AbstractFileSystem, path: str, *, block_size: int) -> None:
        super().__init__(path)
        self._inner = _DirectPutStream(fs, path, overwrite=True, block_size=block_size)
        self._fs = fs

    def _write(self, data: bytes | memoryview) -> None:
        self._inner.write(data)

    def _publish(self) -> None:
        if self._fs.exists(self.path):
            self._inner.cancel()
            raise errors.AlreadyExistsError(f"{self.path} already exists; nothing was written")
        self._inner.close()

    def _discard(self) -> None:
        self._inner.cancel()


#: per store (filesystem class, endpoint) and bucket: whether conditional bulk deletes are
#: honoured (asked once per process)
_CONDITIONAL_BULK_DELETE: dict[tuple[str, str, str], bool] = {}


#: per store (filesystem class, endpoint) and bucket: whether ``If-None-Match: *`` on PUT is
#: honoured (probed once per process, :meth:`DirectPutFileManager.require_conditional_create`)
_CONDITIONAL_CREATE: dict[tuple[str, str, str], bool] = {}


class DirectPutFileManager(FileManager):
    """Publication by a single (possibly multipart) upload straight to the key."""

    kind = Kind.DIRECT_PUT
    #: whether the store honours ``ETag: *`` per key of a bulk delete; None: ask it once
    #: (:meth:`honours_conditional_bulk_delete`)
    conditional_bulk_delete: bool | None = None

    def __init__(
        self,
        fs: AbstractFileSystem,
        *,
        protocol: str,
        create_mode: CreateMode = CreateMode.CONDITIONAL,
        block_size: int = 16 * 1024 * 1024,
    ) -> None:
        super().__init__(fs, protocol=protocol)
        self.create_mode = create_mode
        self.block_size = block_size
        #: whether the store honours ``If-Match`` on PUT: unknown (None) until the first
        #: versioned write probes it
        self._if_match: bool | None = None

    @property
    def versioned_writes(self) -> bool:
        return (
            self.protocol in CONDITIONAL_PUT_PROTOCOLS
            and self.create_mode is CreateMode.CONDITIONAL
            and self._if_match is not False
        )

    def read_versioned(self, path: str) -> tuple[bytes, str | None]:
        if not self.versioned_writes:
            return super().read_versioned(path)
        bucket, key, _ = self.fs.split_path(path)
        response = self.fs.call_s3("get_object", Bucket=bucket, Key=key)
        return _read_body(self.fs, response["Body"]), str(response["ETag"])

    def write_versioned(self, path: str, data: bytes, expected: str | None) -> str:
        """S3: one PUT with ``If-Match: <expected ETag>`` (a rewrite; answered 404 when the key
        is gone, 412 when it is another version) or ``If-None-Match: *`` (a create). The first
        call of a manager first proves that the store honours ``If-Match`` (a PUT whose ETag
        no object has must be refused); a store that ignores it gets no versioned writes."""
        if not self.versioned_writes:
            return super().write_versioned(path, data, expected)
        self.require_conditional_create(path)
        bucket, key, _ = self.fs.split_path(path)
        if self._if_match is None:
            written = self._probe_if_match(bucket, key, data)
            if written is not None:
                return written
        conditions = {"IfNoneMatch": "*"} if expected is None else {"IfMatch": expected}
        token = uuid.uuid4().hex
        try:
            response = self.fs.call_s3(
                "put_object",
                Bucket=bucket,
                Key=key,
                Body=data,
                Metadata={WRITE_ID: token},
                **conditions,
            )
        except FileNotFoundError:
            raise errors.VersionConflictError(
                f"{path} is gone (deleted by a rollback or a cleanup); nothing was written"
            ) from None
        except OSError as exc:
            if isinstance(exc, FileExistsError) or _is_precondition_failed(exc):
                landed = _landed(self.fs, bucket, key, token)
                if landed is not None:
                    # this put's own earlier attempt: its answer was lost, and it was retried
                    return landed
                if expected is None:
                    raise errors.AlreadyExistsError(
                        f"{path} already exists; nothing was written (conditional put got 412)"
                    ) from None
                raise errors.VersionConflictError(
                    f"{path} is not version {expected} any more (rewritten by another writer); "
                    "nothing was written"
                ) from None
            if _is_not_implemented(exc):
                self._if_match = False
                raise errors.UnsupportedStoreError(
                    f"the store rejected a conditional put for {path}: {exc}"
                ) from exc
            raise
        return str(response["ETag"])

    def _probe_if_match(self, bucket: str, key: str, data: bytes) -> str | None:
        """PUT ``data`` with an ``If-Match`` no object satisfies. A store that honours it
        refuses (404 or 412): returns ``None``. One that ignores it stores ``data``: versioned
        writes are off from now on, and the new ETag is returned (the write happened,
        unconditionally, as the caller's fallback would have done it)."""
        try:
            response = self.fs.call_s3(
                "put_object", Bucket=bucket, Key=key, Body=data, IfMatch='"sparkguard-probe"'
            )
        except FileNotFoundError:
            self._if_match = True
            return None
        except OSError as exc:
            if isinstance(exc, FileExistsError) or _is_precondition_failed(exc):
                self._if_match = True
                return None
            if _is_not_implemented(exc):
                self._if_match = False
                raise errors.UnsupportedStoreError(
                    f"the store rejected a conditional put (If-Match) for {bucket}/{key}: {exc}"
                ) from exc
            raise
        self._if_match = False
        logger.warning(
            "the store ignored If-Match on PUT %s/%s: conditional rewrites are off, the marker "
            "sidecar reads the instant's outcome around every flush instead",
            bucket,
            key,
        )
        return str(response["ETag"])

    def _open_atomic(self, path: str, *, overwrite: bool) -> AtomicStream:
        if overwrite:
            return _DirectPutStream(self.fs, path, overwrite=True, block_size=self.block_size)
        if self.create_mode is CreateMode.CHECK_THEN_PUT:
            return _CheckThenPutStream(self.fs, path, block_size=self.block_size)
        if self.protocol not in CONDITIONAL_PUT_PROTOCOLS:
            raise errors.UnsupportedStoreError(
                f"sparkguard knows no conditional put for protocol {self.protocol!r}, so "
                "create-if-absent cannot be atomic there; set spark.sparkguard.createMode="
                "check-then-put to accept a racy check (single writer per path only)"
            )
        self.require_conditional_create(path)
        return _DirectPutStream(self.fs, path, overwrite=False, block_size=self.block_size)

    def _store_key(self, bucket: str) -> tuple[str, str, str]:
        endpoint = getattr(self.fs, "endpoint_url", None) or (
            getattr(self.fs, "client_kwargs", None) or {}
        ).get("endpoint_url", "")
        return (type(self.fs).__name__, str(endpoint or ""), bucket)

    def require_conditional_create(self, sample: str) -> None:
        """Refuse a store that ignores ``If-None-Match: *`` on PUT, before the first
        create-if-absent in its bucket: on such a store a second create silently replaces the
        first, so put-if-absent, and with it exactly-once, would not hold.

        Asked once per process, store (filesystem class and endpoint) and bucket: a probe key
        beside ``sample`` (a hidden name) is created twice with ``If-None-Match: *``; the
        second must be refused (412). Then the probe is deleted. A store is called one that
        ignores the condition only when a second probe, with a fresh key, says so too (a
        rollback may delete a probe key it listed between the two puts). Raises
        :class:`~sparkguard.spark_lib.base.errors.UnsupportedStoreError` naming the store, the
        bucket and the choices; the Spark JVM layer asks the same way
        (``ConditionalCreateProbe``)."""
        bucket, _, _ = self.fs.split_path(sample)
        store = self._store_key(bucket)
        if store not in _CONDITIONAL_CREATE:
            # Twice, each with a fresh key, before calling the store one that ignores the
            # condition: a rollback that listed the probe key deletes it with the markers
            # (R7), and a second put after that delete succeeds on any store.
            honoured = any(self._probe_once(bucket, sample) for _ in range(2))
            _CONDITIONAL_CREATE[store] = honoured
            logger.info(
                "bucket %s %s If-None-Match on PUT", bucket, "honours" if honoured else "ignores"
            )
        if not _CONDITIONAL_CREATE[store]:
            endpoint = store[1] or "the default S3 endpoint"
            raise errors.UnsupportedStoreError(
                f"the store at {endpoint} ignores If-None-Match: * on PUT in bucket {bucket!r} "
                "(a second create of a probe key replaced the first), so sparkguard's "
                "create-if-absent would silently overwrite; use a store release that honours "
                "conditional writes, or set spark.sparkguard.createMode=check-then-put (commands "
                "and the sidecar: SPARKGUARD_CREATE_MODE=check-then-put; a racy check: one "
                "writer per path only)"
            )

    def _probe_once(self, bucket: str, sample: str) -> bool:
        """Put a fresh probe key beside ``sample`` twice with ``If-None-Match: *``, then
        delete it; whether the second put was refused."""
        probe = paths.join(paths.parent(sample), f"{CREATE_PROBE_PREFIX}{uuid.uuid4().hex}")
        _, key, _ = self.fs.split_path(probe)
        try:
            for _ in range(2):
                self.fs.call_s3("put_object", Bucket=bucket, Key=key, Body=b"", IfNoneMatch="*")
        except OSError as exc:
            if not (isinstance(exc, FileExistsError) or _is_precondition_failed(exc)):
                raise
            return True
        finally:
            with contextlib.suppress(OSError):
                self.fs.call_s3("delete_object", Bucket=bucket, Key=key)
        return False

    def _delete_files(self, file_paths: builtins.list[str]) -> None:
        # One bulk request per 1,000 keys on S3; missing keys are not an error there.
        self.fs.rm(file_paths)

    def read_bytes(self, path: str) -> bytes:
        """The whole content of ``path``: one GET (s3fs would HEAD first, and list the key
        as a directory when it is missing); :class:`FileNotFoundError` when it is missing."""
        bucket, key, _ = self.fs.split_path(path)
        response = self.fs.call_s3("get_object", Bucket=bucket, Key=key)
        return _read_body(self.fs, response["Body"])

    def exists(self, path: str) -> bool:
        """Whether a key ``path`` or keys under ``path/`` exist: one listing by the prefix
        (s3fs would HEAD the key, then list the directory)."""
        bucket, key, _ = self.fs.split_path(path)
        key = key.rstrip("/")
        if not key:
            return bool(self.fs.exists(path))  # a bucket
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": key, "Delimiter": "/"}
        while True:
            response = self.fs.call_s3("list_objects_v2", **kwargs)
            if any(entry["Key"] == key for entry in response.get("Contents", [])) or any(
                common["Prefix"] == key + "/" for common in response.get("CommonPrefixes", [])
            ):
                return True
            token = response.get("NextContinuationToken")
            if not response.get("IsTruncated") or not token:
                return False
            kwargs["ContinuationToken"] = token

    def list(self, path: str) -> builtins.list[FileInfo]:
        """The entries directly under ``path`` (empty when there is none): one request per
        1,000 entries, also for a missing directory (s3fs would list its parent as well)."""
        bucket, key, _ = self.fs.split_path(path.rstrip("/") + "/")
        prefix = key.rstrip("/") + "/" if key.strip("/") else ""
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix, "Delimiter": "/"}
        result: builtins.list[FileInfo] = []
        while True:
            response = self.fs.call_s3("list_objects_v2", **kwargs)
            for entry in response.get("Contents", []):
                if entry["Key"] == prefix:
                    continue  # the directory's own marker key
                result.append(
                    FileInfo(
                        path=f"{bucket}/{entry['Key']}".rstrip("/"),
                        size=int(entry.get("Size") or 0),
                        is_dir=False,
                        modified=_modified_of(entry),
                    )
                )
            result.extend(
                FileInfo(path=f"{bucket}/{common['Prefix']}".rstrip("/"), size=0, is_dir=True)
                for common in response.get("CommonPrefixes", [])
            )
            token = response.get("NextContinuationToken")
            if not response.get("IsTruncated") or not token:
                return sorted(result, key=lambda info: info.path)
            kwargs["ContinuationToken"] = token

    def _gather(self, coros: Iterable[Awaitable[Any]]) -> builtins.list[Any]:
        """Run independent requests concurrently on the filesystem's event loop, at most
        :data:`CONCURRENCY` in flight; their results in order."""
        pending = builtins.list(coros)
        if not pending:
            return []

        async def run() -> builtins.list[Any]:
            gate = asyncio.Semaphore(CONCURRENCY)

            async def one(coro: Awaitable[Any]) -> Any:
                async with gate:
                    return await coro

            return builtins.list(await asyncio.gather(*(one(c) for c in pending)))

        return builtins.list(fsspec.asyn.sync(self.fs.loop, run))

    async def _is_key(self, path: str) -> bool:
        bucket, key, _ = self.fs.split_path(path)
        try:
            await self.fs._call_s3("head_object", Bucket=bucket, Key=key)
        except FileNotFoundError:
            return False
        return True

    async def _names_in(self, directory: str) -> set[str]:
        """Paths of the keys directly under ``directory`` (one request per 1,000 keys)."""
        bucket, key, _ = self.fs.split_path(directory.rstrip("/") + "/")
        prefix = key.rstrip("/") + "/"
        found: set[str] = set()
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix, "Delimiter": "/"}
        while True:
            response = await self.fs._call_s3("list_objects_v2", **kwargs)
            found.update(f"{bucket}/{o['Key']}" for o in response.get("Contents", []))
            token = response.get("NextContinuationToken")
            if not response.get("IsTruncated") or not token:
                return found
            kwargs["ContinuationToken"] = token

    def existing_files(self, file_paths: Iterable[str]) -> set[str]:
        """Which of ``file_paths`` exist now: one listing per directory holding at least
        :data:`LIST_THRESHOLD` of them, else one HEAD per name; all of them concurrently."""
        groups = _by_directory(file_paths)
        listed = [(d, w) for d, w in groups.items() if len(w) >= LIST_THRESHOLD]
        probed = sorted(p for d, w in groups.items() if len(w) < LIST_THRESHOLD for p in w)
        answers = self._gather(
            [self._names_in(d) for d, _ in listed] + [self._is_key(p) for p in probed]
        )
        found: set[str] = set()
        for (_, wanted), names in zip(listed, answers[: len(listed)], strict=True):
            found |= wanted & names
        found.update(p for p, there in zip(probed, answers[len(listed) :], strict=True) if there)
        return found

    def honours_conditional_bulk_delete(self, sample: str) -> bool:
        """Whether the store deletes a key of a bulk delete only if it exists when asked to
        (S3's ``DeleteObjects`` with ``ETag: *`` per key: AWS S3 since 2025) and reports the
        absent ones as errors. Then one request per 1,000 names both deletes and tells which
        existed. Asked once per filesystem and bucket: a bulk delete of one absent key (a
        random hidden name beside ``sample``) with that condition; a store that reports it
        deleted (ignores the condition) or refuses the request does not honour it.
        :attr:`conditional_bulk_delete` (True/False) skips the question."""
        if self.conditional_bulk_delete is not None:
            return self.conditional_bulk_delete
        bucket, _, _ = self.fs.split_path(sample)
        store = self._store_key(bucket)
        if store not in _CONDITIONAL_BULK_DELETE:
            probe = paths.join(paths.parent(sample), f".sg-absent-probe-{uuid.uuid4().hex}")
            try:
                deleted, absent = self._delete_if_present([probe])
            except OSError as exc:
                logger.info("bucket %s refused a conditional bulk delete: %s", bucket, exc)
                deleted, absent = {probe}, set()
            _CONDITIONAL_BULK_DELETE[store] = probe in absent and not deleted
            logger.info(
                "bucket %s %s conditional bulk deletes",
                bucket,
                "honours" if _CONDITIONAL_BULK_DELETE[store] else "ignores",
            )
        return _CONDITIONAL_BULK_DELETE[store]

    def _delete_if_present(self, file_paths: Iterable[str]) -> tuple[set[str], set[str]]:
        """Bulk-delete ``file_paths`` on the condition that each exists (``ETag: *``), 1,000
        keys a request, the requests concurrently: (deleted, absent) as the store reports.
        Any other per-key error is raised (:class:`OSError` naming the key and the code)."""
        by_bucket: dict[str, builtins.list[str]] = {}
        for path in sorted(set(file_paths)):
            by_bucket.setdefault(self.fs.split_path(path)[0], []).append(path)
        requests = [
            (bucket, chunk[start : start + BULK_DELETE_KEYS])
            for bucket, chunk in by_bucket.items()
            for start in range(0, len(chunk), BULK_DELETE_KEYS)
        ]

        async def delete(bucket: str, chunk: builtins.list[str]) -> Any:
            keys = [{"Key": self.fs.split_path(p)[1], "ETag": "*"} for p in chunk]
            for path in chunk:
                self.fs.invalidate_cache(paths.parent(path))
            return await self.fs._call_s3(
                "delete_objects", Bucket=bucket, Delete={"Objects": keys, "Quiet": False}
            )

        answers = self._gather(delete(bucket, chunk) for bucket, chunk in requests)
        deleted: set[str] = set()
        absent: set[str] = set()
        for (bucket, _), answer in zip(requests, answers, strict=True):
            deleted.update(f"{bucket}/{d['Key']}" for d in answer.get("Deleted", []))
            for error in answer.get("Errors", []):
                code = str(error.get("Code", ""))
                if code not in _ABSENT_CODES:
                    raise OSError(
                        f"could not delete s3://{bucket}/{error.get('Key')}: {code} "
                        f"({error.get('Message', '')}); fix the store's permissions, then run "
                        "the rollback again"
                    )
                absent.add(f"{bucket}/{error['Key']}")
        return deleted, absent

    def delete_existing(self, file_paths: Iterable[str]) -> set[str]:
        """Delete the files that exist; returns those (a name with no file is not counted).

        Where the store honours a conditional bulk delete, the delete itself tells which
        existed (one request per 1,000 names); elsewhere existence is read first
        (:meth:`existing_files`: a plain bulk delete cannot tell), then one bulk delete."""
        wanted = sorted({paths.validate_base(p) for p in file_paths})
        if not wanted:
            return set()
        if self.honours_conditional_bulk_delete(wanted[0]):
            return self._delete_if_present(wanted)[0]
        existing = self.existing_files(wanted)
        if existing:
            self._delete_files(sorted(existing))
        return existing

    def find_leftovers(self, file_paths: Iterable[str]) -> builtins.list[Leftover]:
        """Incomplete multipart uploads of exactly these keys: one listing of the uploads
        under the directory all of them share (a request per 1,000 pending uploads there,
        whatever the number of directories or of files)."""
        by_bucket: dict[str, set[str]] = {}
        for path in file_paths:
            by_bucket.setdefault(self.fs.split_path(path)[0], set()).add(path)
        result = []
        for bucket, wanted in sorted(by_bucket.items()):
            shared = os.path.commonpath([paths.parent(p) for p in wanted])
            for upload in self.list_pending_uploads(shared.rstrip("/") + "/"):
                path = f"{bucket}/{upload['Key']}"
                if path in wanted:
                    result.append(Leftover(path, path, upload["UploadId"]))
        return sorted(result, key=lambda leftover: (leftover.path, leftover.upload_id or ""))

    def complete_uploads(self, uploads: Mapping[str, str]) -> set[str]:
        """Per upload, concurrently: ListParts (every page), then CompleteMultipartUpload with
        those parts in order; not completed when the store answers that the upload does not
        exist (``NoSuchUpload``)."""
        ordered = sorted(uploads.items())
        answers = self._gather(self._complete(path, upload_id) for path, upload_id in ordered)
        return {path for (path, _), done in zip(ordered, answers, strict=True) if done}

    async def _complete(self, path: str, upload_id: str) -> bool:
        """One upload of :meth:`complete_uploads`; False when the store does not know it."""
        bucket, key, _ = self.fs.split_path(paths.validate_base(path))
        upload: dict[str, Any] = {"Bucket": bucket, "Key": key, "UploadId": upload_id}
        parts: builtins.list[dict[str, Any]] = []
        page_from: dict[str, Any] = {}
        try:
            while True:
                page = await self.fs._call_s3("list_parts", **upload, **page_from)
                parts += [
                    {"PartNumber": part["PartNumber"], "ETag": part["ETag"]}
                    for part in page.get("Parts", [])
                ]
                if not page.get("IsTruncated"):
                    break
                page_from = {"PartNumberMarker": page["NextPartNumberMarker"]}
            if not parts:
                raise OSError(f"upload {upload_id} of s3://{path} has no part to complete")
            await self.fs._call_s3(
                "complete_multipart_upload",
                **upload,
                MultipartUpload={"Parts": sorted(parts, key=lambda p: p["PartNumber"])},
            )
        except FileNotFoundError:  # s3fs's translation of NoSuchUpload (a 404)
            return False
        return True

    def remove_leftovers(self, leftovers: Iterable[Leftover]) -> int:
        """Abort the incomplete uploads (concurrently); returns how many were aborted."""

        async def abort(leftover: Leftover) -> bool:
            bucket, key, _ = self.fs.split_path(leftover.path)
            try:
                await self.fs._call_s3(
                    "abort_multipart_upload", Bucket=bucket, Key=key, UploadId=leftover.upload_id
                )
            except FileNotFoundError:
                return False
            return True

        return sum(1 for done in self._gather(abort(left) for left in leftovers) if done)

    def _delete_if_same(self, path: str, expected: bytes) -> bytes | None:
        """Exact on S3: the delete carries ``If-Match`` with the ETag of the content compared
        (a store that refuses conditional deletes gets a plain delete after the compare)."""
        bucket, key, _ = self.fs.split_path(path)
        for _ in range(100):
            try:
                response = self.fs.call_s3("get_object", Bucket=bucket, Key=key)
            except FileNotFoundError:
                return None
            current = _read_body(self.fs, response["Body"])
            if current != expected:
                return current
            try:
                self.fs.call_s3("delete_object", Bucket=bucket, Key=key, IfMatch=response["ETag"])
            except FileNotFoundError:
                return None
            except OSError as exc:
                if _is_precondition_failed(exc):
                    continue  # rewritten between the read and the delete: compare again
                if _is_not_implemented(exc):
                    self.delete(path)
                    return None
                raise
            return None
        raise errors.SparkguardError(f"{path} keeps changing; could not delete it")

    def mkdirs(self, path: str) -> None:
        """Object stores have no directories: nothing to do."""

    def _keys(self, path: str) -> builtins.list[tuple[str, int]]:
        """(key, size) of every key under ``path/``, directory markers included."""
        bucket, key, _ = self.fs.split_path(path.rstrip("/") + "/")
        prefix = key.rstrip("/") + "/"
        found: builtins.list[tuple[str, int]] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
            if token:
                kwargs["ContinuationToken"] = token
            response = self.fs.call_s3("list_objects_v2", **kwargs)
            contents = response.get("Contents", [])
            found.extend((str(o["Key"]), int(o.get("Size") or 0)) for o in contents)
            token = response.get("NextContinuationToken")
            if not response.get("IsTruncated") or not token:
                return found

    def list_tree(self, path: str) -> builtins.list[FileInfo]:
        """Every key under ``path``; a zero-byte key ending in ``/`` (a directory marker, as
        S3A's ``mkdirs`` writes) is listed as a directory, the only kind an object store has."""
        bucket, _, _ = self.fs.split_path(path.rstrip("/") + "/")
        result = [
            FileInfo(path=f"{bucket}/{key}".rstrip("/"), size=size, is_dir=key.endswith("/"))
            for key, size in self._keys(path)
        ]
        root = path.rstrip("/")
        return sorted((i for i in result if i.path != root), key=lambda info: info.path)

    def remove_empty_directory(self, path: str) -> bool:
        """Object stores have no directories: ``path`` is gone when no key is under it but
        its own directory marker (``path/``, deleted then)."""
        bucket, key, _ = self.fs.split_path(path.rstrip("/") + "/")
        marker = key.rstrip("/") + "/"
        keys = [k for k, _ in self._keys(path)]
        if any(k != marker for k in keys):
            return False
        if keys:
            with contextlib.suppress(FileNotFoundError):
                self.fs.call_s3("delete_object", Bucket=bucket, Key=marker)
        return True

    def list_pending_uploads(self, prefix: str) -> builtins.list[dict[str, str]]:
        """Multipart uploads under ``prefix`` that were never completed (a killed writer's,
        or a live writer's): a request per 1,000 of them."""
        bucket, key, _ = self.fs.split_path(prefix)
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": key}
        found: builtins.list[dict[str, str]] = []
        while True:
            response = self.fs.call_s3("list_multipart_uploads", **kwargs)
            found.extend(
                {"Key": str(u["Key"]), "UploadId": str(u["UploadId"])}
                for u in response.get("Uploads", [])
            )
            marker = response.get("NextKeyMarker")
            if not response.get("IsTruncated") or not marker:
                return found
            kwargs["KeyMarker"] = marker
            kwargs["UploadIdMarker"] = response.get("NextUploadIdMarker", "")

    def abort_pending_uploads(self, prefix: str) -> int:
        """Abort every pending multipart upload under ``prefix``; returns how many."""
        bucket, _, _ = self.fs.split_path(prefix)
        pending = self.list_pending_uploads(prefix)
        for upload in pending:
            with contextlib.suppress(FileNotFoundError):  # a retried abort that had landed
                self.fs.call_s3(
                    "abort_multipart_upload",
                    Bucket=bucket,
                    Key=upload["Key"],
                    UploadId=upload["UploadId"],
                )
        return len(pending)
