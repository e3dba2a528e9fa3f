"""Spark workers must run the driver's code (issue #30): each task reports the digest of
the source it imported, and an answer with another digest is refused."""

from __future__ import annotations

import pytest

from service.engines import code_stamp, spark
from service.engines.spark import SparkEngineError


def test_the_stamp_is_the_source_s_digest_and_stable() -> None:
    first = code_stamp.stamp()
    assert len(first) == 64 and int(first, 16) >= 0
    code_stamp.stamp.cache_clear()
    assert code_stamp.stamp() == first  # the same files, the same digest


def test_an_answer_of_other_code_is_refused() -> None:
    code_stamp.check(code_stamp.stamp())  # its own: accepted
    for theirs in ("0" * 64, None):
        with pytest.raises(SparkEngineError, match="runs other code than this worker"):
            code_stamp.check(theirs)


def test_every_task_row_carries_the_stamp() -> None:
    row = spark._row('{"rows": 0}', None, None, None)
    assert row.column("code").to_pylist() == [code_stamp.stamp()]
