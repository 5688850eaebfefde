"""The storage contract: what sparkguard writes beside a table and how it is read and undone.

The timeline (:mod:`timeline`), markers (:mod:`markers`), the job journal (:mod:`journal`),
owner claims (:mod:`owners`), location lifecycle (:mod:`lifecycle`), timeline snapshots
(:mod:`snapshots`), the metadata log (:mod:`metadatalog`), what a table holds (:mod:`reader`),
Spark's file-sink manifest (:mod:`sinklog`) and :mod:`rollback`, all written through the atomic
file manager (:mod:`sparkguard.spark_lib.filemanager`). No Spark here: the sidecar and the
operator use these modules too (``reader.read_table`` takes a SparkSession but imports nothing
of PySpark until it is called).
"""
