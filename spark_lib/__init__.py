"""The library bundled into Spark jobs.

Atomic file manager, metadata log, timeline and job journal, markers (clients and readers),
rollback and the PySpark writer. It depends on fsspec (plus pyarrow/pyspark only where the writer
needs them) and never imports kopf or aiohttp server code.
"""
