"""The normalized event pipeline on dispatch records: schema as data and as constants
agree, the policy filters/samples/budgets with every discarded event counted, and what
the Parquet sink writes reads back with pyarrow. Dispatch records come from a real run
(HAL profiling of the convnet) and from synthetic arrays written for these tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dfit_mlir.core import event_schema as es
from dfit_mlir.core.event_pipeline import EventPipeline, MemorySink, ParquetSink, Policy, site_table
from dfit_mlir.passes.instrumented_compile import compile_instrumented
from dfit_mlir.runtime_hooks import hal_profile
from tests.conftest import CONVNET


@pytest.fixture(scope="module")
def convnet(tmp_path_factory: pytest.TempPathFactory):
    return compile_instrumented(CONVNET, tmp_path_factory.mktemp("convnet") / "convnet.vmfb", mode="ids")


def synthetic(count: int, sites: int) -> tuple[np.ndarray, ...]:
    index = np.arange(count)
    return ((index % sites).astype(np.int32), index * 1000, np.full(count, 500, np.int64),
            np.full(count, 4, np.int64), np.full(count, 4, np.int64), (index // sites).astype(np.int32))


def test_schema_file_and_constants_agree() -> None:
    document = es.schema_document()
    assert document["version"] == es.SCHEMA_VERSION
    assert document["min_reader_version"] == es.MIN_READER_VERSION
    assert tuple(field["name"] for field in document["fields"]) == es.FIELDS
    schema = es.arrow_schema()
    assert schema.names == list(es.FIELDS)
    assert schema.metadata[b"dfit.version"] == es.SCHEMA_VERSION.encode()
    assert es.readable("1.0") and es.readable("1.3") and not es.readable("2.0") and not es.readable("x")


def test_real_run_normalized_and_read_back(convnet, tmp_path: Path) -> None:
    manifest = convnet.manifest
    sink = ParquetSink(tmp_path / "events.parquet")
    pipeline = EventPipeline(manifest, Policy(), sink, session="test")
    for invocation in range(2):
        events = hal_profile.capture(convnet.vmfb, ["1x32x32x3xf32=0.5"])
        pipeline.add_joined(hal_profile.join(events, manifest), invocation)
    counts = pipeline.close()
    sites = manifest["partitions"]["dispatch_sites"]
    assert counts.seen == counts.kept == 2 * len(sites)

    table = pq.read_table(tmp_path / "events.parquet")
    assert table.num_rows == 2 * len(sites)
    assert table.schema.metadata[b"dfit.schema"] == b"dfit.events"
    rows = table.to_pylist()
    assert [row["root_id"] for row in rows[: len(sites)]] == [site["root_id"] for site in sites]
    assert [row["partition"] for row in rows[: len(sites)]] == [site["export"] for site in sites]
    assert {row["invocation"] for row in rows} == {0, 1}
    assert all(row["kind"] == "dispatch" and row["duration_ns"] > 0 and row["tiles"] >= 1 for row in rows)
    conv = rows[0]
    assert conv["macs"] == 194_400  # conv1 (relu and fill fused in add no MACs)
    interned = site_table(manifest).to_pylist()
    assert "main/linalg.generic#0" in interned[conv["site"]]["ids"]


def test_policy_filters_samples_and_budgets(convnet) -> None:
    manifest = convnet.manifest
    n_sites = len(manifest["partitions"]["dispatch_sites"])
    sink = MemorySink()
    policy = Policy(ids=("main/linalg.matmul#*",), sample_every=2, max_events=5, batch_size=3)
    pipeline = EventPipeline(manifest, policy, sink, session="test")
    pipeline.add_dispatches(*synthetic(60, n_sites))
    counts = pipeline.close()
    table = sink.table()
    matmul_sites = [s["index"] for s in manifest["partitions"]["dispatch_sites"] if s["root_id"].startswith("main/linalg.matmul#")]
    assert len(matmul_sites) == 2
    assert counts.seen == 60
    assert counts.filtered == 60 - 20  # 2 of 6 sites match
    assert counts.kept == 5 and table.num_rows == 5
    assert counts.filtered + counts.sampled_out + counts.dropped + counts.kept == counts.seen
    assert set(table.column("site").to_pylist()) <= set(matmul_sites)
    assert all(start % 2000 == 0 for start in table.column("start_ns").to_pylist())  # even event indices


def test_batches_are_bounded(convnet) -> None:
    sink = MemorySink()
    pipeline = EventPipeline(convnet.manifest, Policy(batch_size=1000), sink, session="test")
    for _ in range(5):
        pipeline.add_dispatches(*synthetic(777, 6))
    pipeline.close()
    assert [batch.num_rows for batch in sink.batches] == [1000, 1000, 1000, 885]
    assert isinstance(sink.table(), pa.Table)


def test_policy_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="sample_every"):
        Policy(sample_every=0)


def test_column_streams_fed_in_turn_are_written_in_whole_batches_each(convnet) -> None:
    """Synthetic columns (labelled): three families fed a piece at a time in turn, with
    dispatches between (a long run's windows), are written in whole batches of one
    family each, as each fills, beside the dispatches' (cut at every change of family,
    a 5M-event bundle's readers took a quarter longer); what is left of each is written
    before rows added as objects (their order kept) or at close, in the order the
    families were first fed; each family's events keep their order."""
    from dfit_mlir.core.event_pipeline import EventRow

    sink = MemorySink()
    pipeline = EventPipeline(convnet.manifest, Policy(batch_size=4), sink, session="s")
    fed: dict[str, list[int]] = {"submit a": [], "submit b": [], "submit c": []}
    start = 0
    for piece, (family, count) in enumerate([("a", 3), ("b", 2), ("c", 1)] * 3 + [("a", 2)]):
        starts = np.arange(start, start + count, dtype=np.int64)
        start += count
        fed[f"submit {family}"] += starts.tolist()
        pipeline.add_columns("queue", (np.zeros(count, np.int32), [f"submit {family}"]), starts,
                             np.ones(count, np.int64), invocation=np.full(count, piece, np.int32))
        if piece == 4:
            pipeline.add_dispatches(*synthetic(5, len(convnet.manifest["partitions"]["dispatch_sites"])))
    pipeline.add_rows("program", [EventRow(0, "main", None, 0, 10)])
    counts = pipeline.close()

    def family(batch: pa.RecordBatch) -> str:
        kind = batch.column("kind")[0].as_py()
        return batch.column("partition")[0].as_py() if kind == "queue" else kind

    assert [(family(batch), batch.num_rows) for batch in sink.batches] == [
        ("submit a", 4), ("submit b", 4), ("dispatch", 4), ("submit a", 4),  # whole, as each filled
        ("submit a", 3), ("submit b", 2), ("submit c", 3),  # what was left, before the row objects
        ("program", 1), ("dispatch", 1)]  # the dispatches' rest at close
    for name, starts in fed.items():
        assert [value for batch in sink.batches if family(batch) == name
                for value in batch.column("start_ns").to_pylist()] == starts
    assert counts.kept == counts.seen == start + 5 + 1
    # A whole batch's null columns are one array per type, shared by every whole batch.
    whole = [batch for batch in sink.batches if batch.num_rows == 4]
    assert whole[0].column("tensor_nans").buffers()[1].address == whole[-1].column("tensor_nans").buffers()[1].address
