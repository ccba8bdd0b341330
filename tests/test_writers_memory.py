"""The trace writers read ``events.parquet`` in bounded memory however many row groups it
has (issue 29). Synthetic events (labelled so: a real run's columns, made-up values),
written in many small row groups as a streamed run writes windows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dfit_mlir.core import event_schema as es
from dfit_mlir.exporters import traces

ROW_GROUPS = 300
ROWS_PER_GROUP = 2_000


def synthetic_events(path: Path) -> None:
    """Dispatch-like events with per-event attributes text, ROW_GROUPS row groups."""
    schema = es.arrow_schema()
    with pq.ParquetWriter(path, schema) as writer:
        for group in range(ROW_GROUPS):
            rows = np.arange(group * ROWS_PER_GROUP, (group + 1) * ROWS_PER_GROUP)
            given = {es.KIND: ["dispatch"] * len(rows), es.SESSION: ["s"] * len(rows),
                     es.BACKEND: ["iree"] * len(rows), es.STAGE: ["runtime"] * len(rows),
                     es.INVOCATION: (rows // 20).astype(np.int32), es.SITE: (rows % 20).astype(np.int32),
                     es.START_NS: rows * 1000, es.DURATION_NS: np.full(len(rows), 500),
                     es.ATTRIBUTES: [f'{{"submission": {row}, "padding": "{"x" * 60}"}}' for row in rows.tolist()]}
            arrays = [pa.array(given[f.name]).cast(f.type) if f.name in given else pa.nulls(len(rows), f.type)
                      for f in schema]
            writer.write_table(pa.Table.from_arrays(arrays, schema=schema))


def peak_allocated(batches: object) -> int:
    """The most Arrow held while the batches were read (each dropped before the next)."""
    peak = 0
    for batch in batches:  # type: ignore[attr-defined]
        del batch
        peak = max(peak, pa.total_allocated_bytes())
    return peak


def test_row_group_readers_hold_no_memory_per_row_group_passed(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(es, "ROW_GROUPS_PER_READER", 16)  # the file's 300 stand for a long run's thousands
    path = tmp_path / "events.parquet"
    synthetic_events(path)
    handle = es.open_parquet(path)
    columns = traces.trace_columns(handle)
    assert handle.metadata.num_row_groups == ROW_GROUPS
    baseline = pa.total_allocated_bytes()
    one_reader = peak_allocated(handle.iter_batches(batch_size=traces.BATCH_ROWS, columns=columns)) - baseline
    chunked = peak_allocated(es.row_group_batches(handle, batch_size=traces.BATCH_ROWS, columns=columns)) - baseline
    # One reader over the file grows with the row groups passed (pyarrow 26: ~0.1 MiB
    # each here); readers of ROW_GROUPS_PER_READER at a time stay at a batch's worth.
    assert chunked < one_reader / 2, (chunked, one_reader)
    rows = sum(batch.num_rows for batch in es.row_group_batches(handle, batch_size=traces.BATCH_ROWS, columns=columns))
    assert rows == ROW_GROUPS * ROWS_PER_GROUP


@pytest.mark.parametrize("count", [1, 2, 7, 10])
def test_partition_time_spread_is_min_median_max_of_the_runs(count: int) -> None:
    """The view's min/median/max per partition, taken on the ledger's array, are what
    ``min``, ``statistics.median`` and ``max`` give on its list (int for an odd count,
    the exact mean of the two middle ones for an even one)."""
    import statistics

    from dfit_mlir.analysis import ledger

    times = np.random.default_rng(count).integers(1, 2**55, count)  # sums past 2^53: exact halves matter
    book = ledger.Ledger.__new__(ledger.Ledger)
    book._timing = ledger._Timing()
    book._timing.partition_instance_ns["p"] = (np.arange(count), times)
    values = times.tolist()
    assert book.partition_time_spread("p") == (min(values), statistics.median(values), max(values))
    assert book.partition_time_spread("absent") is None


def test_site_sums_folded_a_few_batches_at_a_time_equal_one_sum() -> None:
    """A long run's per-(site, instance) sums, folded every few batches, equal the sums
    of all its pairs at once (instances of a batch overlapping the next's included)."""
    from dfit_mlir.analysis import ledger

    rng = np.random.default_rng(0)
    sums = ledger._SiteSums()
    keys, totals = [], []
    for batch in range(3 * ledger._SiteSums.FOLD_BATCHES + 1):
        batch_keys = np.unique(rng.integers(batch * 50, batch * 50 + 80, 40))
        batch_totals = rng.integers(0, 2**40, len(batch_keys))
        sums.add(np, batch_keys, batch_totals)
        keys.append(batch_keys)
        totals.append(batch_totals)
    found_keys, found_totals = sums.folded(np)
    expected = {}
    for key, total in zip(np.concatenate(keys).tolist(), np.concatenate(totals).tolist(), strict=True):
        expected[key] = expected.get(key, 0) + total
    assert found_keys.tolist() == sorted(expected)
    assert found_totals.tolist() == [expected[key] for key in sorted(expected)]
