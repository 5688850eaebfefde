"""Spark glue: how Spark jobs use the storage contract.

The PySpark data source (:mod:`writer`, :mod:`streaming`), the ``spark.sparkguard.*`` settings
(:mod:`config`), the Spark conf of the JVM layer (:mod:`sparkconf`), the HTTP marker client
executors use (:mod:`marker_http`) and the test-only fault points of the writer
(:mod:`faults`). Builds on :mod:`sparkguard.spark_lib.storage`, never the other way round.
"""
