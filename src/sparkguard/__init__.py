"""sparkguard: exactly-once output for Spark on Kubernetes.

The distribution is made of three subpackages built from the repository's fixed folders:
``sparkguard.spark_lib`` (``spark_lib/``), ``sparkguard.sidecar`` (``sidecar/``) and
``sparkguard.operator`` (``operator/``). This top-level package holds only the version and the
command-line entry point that dispatches to them.
"""

__version__ = "0.1.0"
