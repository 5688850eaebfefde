"""The library bundled into Spark jobs, in layers (each imports only the layers below it):

* :mod:`~sparkguard.spark_lib.tools`: the command-line tools (``rollback``, ``inspect``,
  ``compact``, ``bundle``, the demo);
* :mod:`~sparkguard.spark_lib.spark`: Spark glue (the PySpark writer and streaming sink, the
  ``spark.sparkguard.*`` settings, the JVM layer's Spark conf, the HTTP marker client);
* :mod:`~sparkguard.spark_lib.storage`: the storage contract (timeline, markers, journal,
  owners, lifecycle, snapshots, metadata log, what a table holds, rollback);
* :mod:`~sparkguard.spark_lib.filemanager`: the atomic file manager, one module per backend;
* :mod:`~sparkguard.spark_lib.base`: errors, path rules, versioned documents.

It depends on fsspec (plus pyarrow/pyspark only in the Spark glue) and never imports kopf or
aiohttp server code. ``.importlinter`` enforces the layers.
"""

from __future__ import annotations

import importlib
import sys
import warnings


def _deprecated_alias(old: str, new: str) -> None:
    """Make module ``old`` (a flat path of an earlier release) the module ``new``, with a
    :class:`DeprecationWarning` naming ``new``, attributed to the line that imported ``old``."""
    warnings.warn(
        f"{old} is deprecated; import {new} instead (spark_lib's modules moved into subpackages)",
        DeprecationWarning,
        stacklevel=3,  # the importer's line: warnings skips importlib's own frames
    )
    sys.modules[old] = importlib.import_module(new)
