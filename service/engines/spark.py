"""Apache Spark as the engine of a statistic's passes, through Spark Connect (issue #30).

Each pass is one Spark job: a DataFrame of task numbers (one partition per task, a few
consecutive Parquet row groups of at most ``task_rows`` rows: ``row_groups.plan`` and
``pack``) mapped with ``mapInArrow``; a Python worker reads its row groups' columns one
row group at a time through the given ``pyarrow.fs`` filesystem, runs
``statistic.update(statistic.empty(), batch)`` and emits the partial as JSON; the driver
reads the partials as they come (one in memory at a time), merges them
(``Partial.merge``: exact integers, so the order of the row groups does not matter) and
runs the next pass (``then``), exactly as ``statistics.compute`` does. The statistic and
the filesystem travel in the function's closure (pyspark pickles it with cloudpickle; a
``pyarrow.fs`` filesystem pickles as its options, so an ``S3FileSystem`` reaches the
workers with its endpoint and credentials and Spark needs no Hadoop S3 jars). The
workers need ``mechanisms`` and ``service`` importable (the project installed in their
Python), the same code as the driver's: every task reports the digest of the code it ran
(``code_stamp``) and the driver refuses an answer of other code.

The statistic's own refusals (ValueError, TypeError: public names only) come back to the
driver as the same exception type and message, the first in the files' order (as the
embedded pass over the row groups in order meets it, whichever task ends first); any
other failure of the job is a ``SparkEngineError``.

Why ``mapInArrow`` and not Spark SQL aggregations: the update is the mechanisms' own exact
code (clipping, undeclared codes, exact float sums, the selection's digits), so Spark's
partial is the embedded one by construction; a SQL rewrite would be a second
implementation of every statistic to keep equal bit for bit (``tests/bench`` times both
on a cross-tab).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.fs as pafs

from mechanisms.statistics import Partial, Statistic
from service.engines import code_stamp, row_groups
from service.engines.row_groups import RowGroup

if TYPE_CHECKING:
    from pyspark.sql.connect.session import SparkSession

#: rows a Spark task reads at most (unless one row group has more): a task costs tens of
#: milliseconds of Spark's time, so a few million rows make it small next to the reading
TASK_ROWS = 1 << 22
#: the row a partition emits: its partial (JSON), or the statistic's refusal and the task
#: it met it in
_OUTPUT = pa.schema([("partial", pa.string()), ("refused", pa.string()),
                     ("message", pa.string()), ("task", pa.int64()), ("code", pa.string())])
_SCHEMA = "partial string, refused string, message string, task long, code string"
#: refusals carried back as themselves (the statistics raise only these, public messages)
_REFUSALS: dict[str, type[Exception]] = {"ValueError": ValueError, "TypeError": TypeError}


class SparkEngineError(RuntimeError):
    """A Spark job failed for a reason other than the statistic's refusal."""


def compute_on_spark(session: SparkSession, statistic: Statistic, files: Sequence[str],
                     columns: Mapping[str, str], filesystem: pafs.FileSystem | None = None,
                     task_rows: int = TASK_ROWS) -> tuple[Statistic, Partial]:
    """The last pass and its partial over the Parquet ``files`` (paths in ``filesystem``,
    local by default), as ``statistics.compute`` returns them. ``columns`` maps each
    statistic column name to its Parquet column name; a name it lacks, or a column a
    file lacks, is a ValueError before any job runs. A Spark task reads row groups of
    at most ``task_rows`` rows in all (or one larger row group)."""
    fs = filesystem if filesystem is not None else pafs.LocalFileSystem()
    footers = row_groups.footers(files, fs)
    while True:
        missing = [name for name in statistic.columns if name not in columns]
        if missing:
            raise ValueError(f"no Parquet column is given for column {missing[0]!r}")
        needed = {name: columns[name] for name in statistic.columns}
        tasks = row_groups.pack(row_groups.plan(footers, needed.values()), task_rows)
        partial = _pass(session, statistic, tasks, needed, fs)
        following = statistic.then(partial)
        if following is None:
            return statistic, partial
        statistic = following


def _pass(session: SparkSession, statistic: Statistic, tasks: list[tuple[RowGroup, ...]],
          columns: Mapping[str, str], fs: pafs.FileSystem) -> Partial:
    """One pass: a Spark task per task of row groups, the partials merged on the driver."""
    from pyspark.errors import PySparkException

    partial = statistic.empty()
    if not tasks:
        return partial
    numbers = session.range(0, len(tasks), 1, len(tasks))
    update = functools.partial(_update, statistic, tasks, columns, fs)
    refused: tuple[int, Exception] | None = None
    try:  # streamed, merged as they come: the driver holds one partial at a time
        for row in numbers.mapInArrow(update, _SCHEMA).toLocalIterator():
            code_stamp.check(row.code)  # computed by this worker's code, or refused
            if row.refused is not None:
                if refused is None or row.task < refused[0]:
                    refused = (row.task, _REFUSALS[row.refused](row.message))
            elif refused is None:
                partial = statistic.merge(partial, Partial.from_json(row.partial))
    except PySparkException as exc:
        groups = sum(len(task) for task in tasks)
        raise SparkEngineError(f"the Spark job over {groups} row groups failed") from exc
    if refused is not None:  # the first in the files' order, as the embedded pass meets it
        raise refused[1]
    return partial


def _update(statistic: Statistic, tasks: Sequence[tuple[RowGroup, ...]],
            columns: Mapping[str, str], fs: pafs.FileSystem,
            numbers: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A partition's work (in a Spark Python worker): the partial of its tasks' row
    groups, read one at a time."""
    partial = statistic.empty()
    for batch_of_numbers in numbers:
        for number in batch_of_numbers.column(0).to_pylist():
            for group in tasks[number]:
                batch = row_groups.read(group, columns, fs)
                try:
                    partial = statistic.update(partial, batch)
                except (ValueError, TypeError) as exc:
                    kind = "TypeError" if isinstance(exc, TypeError) else "ValueError"
                    yield _row(None, kind, str(exc), number)
                    return
    yield _row(partial.to_json(), None, None, None)


def _row(partial: str | None, refused: str | None, message: str | None,
         task: int | None) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"partial": [partial], "refused": [refused],
                                       "message": [message], "task": [task],
                                       "code": [code_stamp.stamp()]}, schema=_OUTPUT)

