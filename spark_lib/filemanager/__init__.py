"""The atomic file manager: SPARK-23966's CheckpointFileManager, in Python, over fsspec.

One interface, :meth:`FileManager.create_atomic`, returns a stream that publishes the whole file
on ``close()`` (or a clean ``with`` exit) and leaves nothing visible on ``cancel()`` (or an
exception). The rest (open, list, exists, delete, mkdirs) is shared. Like fsspec's
``spec.py`` and ``implementations/``, a small contract sits under a rich base, and each backend
is one module implementing only the primitives of publication:

* :mod:`.base`: :class:`FileManager` and :class:`AtomicStream` (the contract and everything
  shared), temp-file names and leftovers;
* :mod:`.rename`: :class:`RenameFileManager` (local disk, and HDFS-like stores whose rename is
  atomic): temp file in the target directory, fsync, rename (no-replace for create-if-absent),
  fsync of the directory;
* :mod:`.direct_put`: :class:`DirectPutFileManager` (object stores): straight to the key,
  visible when the upload completes, conditional (``If-None-Match: *``) for create-if-absent;
* :mod:`.memory`: :class:`MemoryFileManager` (fsspec's in-memory filesystem) for fast tests;
* :mod:`.registry`: :func:`resolve` picks the backend by the URL's protocol, overridable by
  configuration (``spark.sparkguard.fileManager``).

Callers import this package and call through it (``filemanager.resolve(url)``); the names below
are its public surface. The backends never import each other, only :mod:`.base`.
"""

from sparkguard.spark_lib.filemanager.base import (
    CREATE_PROBE_PREFIX,
    LIST_THRESHOLD,
    TEMP_MARKER,
    AtomicStream,
    CreateMode,
    FileInfo,
    FileManager,
    Held,
    Kind,
    Leftover,
    checksum_of,
    checksum_owner,
    is_create_probe,
    is_temp_name,
    make_temp_name,
    temp_target,
)
from sparkguard.spark_lib.filemanager.direct_put import (
    BULK_DELETE_KEYS,
    CONCURRENCY,
    CONDITIONAL_PUT_PROTOCOLS,
    DirectPutFileManager,
)
from sparkguard.spark_lib.filemanager.memory import MemoryFileManager
from sparkguard.spark_lib.filemanager.registry import (
    DEFAULT_KINDS,
    atomic_writer,
    check_location,
    check_storage_options,
    parse_create_mode,
    parse_kind,
    protocol_of,
    resolve,
    storage_option_names,
)
from sparkguard.spark_lib.filemanager.rename import (
    RenameFileManager,
    fsync_directory,
    rename_exchange,
    rename_noreplace,
)

__all__ = [
    "BULK_DELETE_KEYS",
    "CONCURRENCY",
    "CONDITIONAL_PUT_PROTOCOLS",
    "CREATE_PROBE_PREFIX",
    "DEFAULT_KINDS",
    "LIST_THRESHOLD",
    "TEMP_MARKER",
    "AtomicStream",
    "CreateMode",
    "DirectPutFileManager",
    "FileInfo",
    "FileManager",
    "Held",
    "Kind",
    "Leftover",
    "MemoryFileManager",
    "RenameFileManager",
    "atomic_writer",
    "check_location",
    "check_storage_options",
    "checksum_of",
    "checksum_owner",
    "fsync_directory",
    "is_create_probe",
    "is_temp_name",
    "make_temp_name",
    "parse_create_mode",
    "parse_kind",
    "protocol_of",
    "rename_exchange",
    "rename_noreplace",
    "resolve",
    "storage_option_names",
    "temp_target",
]
