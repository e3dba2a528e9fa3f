"""Engines that compute a statistic's partials over a dataset's rows (issue #30).

Embedded: ``mechanisms.statistics.compute`` over batches in the worker's own process.
Spark (``spark``): the same ``Statistic.update`` and ``Partial.merge`` run in Spark's Python
workers over Parquet row groups (``row_groups``), through a Spark Connect session
(``spark_session``), so the worker stays a thin client. Both give the same partial bit
for bit (exact integers that merge associatively); noise and accounting stay with the
mechanisms, on the driver.
"""
