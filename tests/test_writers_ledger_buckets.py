"""The ledger's measured time a time bucket at a time (issue 29: a long run's bundle opens
in bounded memory): the same figures as with every event held at once, on real bundles
(an IREE run's dispatch, queue and memory events; a reconstruction's groups), with the
buckets made tiny so that every bucket boundary and the earliest-end carry are used."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dfit_mlir.analysis import ledger
from dfit_mlir.analysis.model import SemanticModel
from dfit_mlir.core.errors import InvalidInputError
from tests.conftest import bundle_path


def figures(timing: Any) -> dict[str, Any]:
    return {"partition_ns": timing.partition_ns, "partition_calls": timing.partition_calls,
            "root_ns": timing.root_ns, "root_calls": timing.root_calls, "rest": timing.rest,
            "totals": timing.totals, "root_instance_ns": timing.root_instance_ns,
            "partition_instance_ns": {key: (list(keys), list(values))
                                      for key, (keys, values) in timing.partition_instance_ns.items()}}


@pytest.mark.parametrize("name", ["iree-full", "iree-lite", "cerebras", "sambanova"])
@pytest.mark.parametrize(("bucket", "bins"), [(7, 1 << 16), (50, 16)])
@pytest.mark.parametrize("routed", ["every bucket", "a few", "none"])
def test_buckets_give_the_figures_of_one_pass(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
                                             name: str, bucket: int, bins: int, routed: str) -> None:
    """Whether the routed pass gives every bucket, stops part way (the rest read a pass
    each) or stops at once, the figures are those of every event held at once."""
    model = SemanticModel.open(bundle_path(request, name))
    whole = figures(ledger._timing(model, list(model.event_batches(columns=list(ledger._TIMING_COLUMNS)))))
    monkeypatch.setattr(ledger, "BUCKET_EVENTS", bucket)
    monkeypatch.setattr(ledger, "START_BINS", bins)
    monkeypatch.setattr(ledger, "ROUTED_EVENTS", {"every bucket": 1 << 30, "a few": 2 * bucket, "none": 0}[routed])
    bucketed = figures(ledger._timing(model, lambda: model.event_batches(columns=list(ledger._TIMING_COLUMNS))))
    assert bucketed == whole
    assert whole["totals"].measured_ns > 0


def test_a_run_in_start_order_is_read_three_times_whatever_its_buckets(iree_bundles: dict[str, Path],
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The sums, the count per bin, and one pass that hands every event to its bucket:
    not a pass per bucket (a 5M-event run's bundle was read 21 times)."""
    model = SemanticModel.open(iree_bundles["full"])
    passes = 0

    def batches() -> Any:
        nonlocal passes
        passes += 1
        return model.event_batches(columns=list(ledger._TIMING_COLUMNS))

    events = sum(batch.num_rows for batch in batches())
    monkeypatch.setattr(ledger, "BUCKET_EVENTS", max(2, events // 20))
    buckets = 0
    cut = ledger._buckets

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal buckets
        for bucket in cut(*args, **kwargs):
            buckets += 1
            yield bucket

    monkeypatch.setattr(ledger, "_buckets", counted)
    passes = 0
    ledger._timing(model, batches)
    assert buckets >= 10 and passes == 3


def test_events_that_change_between_two_reads_are_named(iree_bundles: dict[str, Path]) -> None:
    """The routed pass finds fewer events than the count: a clear error, not wrong figures."""
    model = SemanticModel.open(iree_bundles["full"])
    every = list(model.event_batches(columns=list(ledger._TIMING_COLUMNS)))
    reads = iter([every, every, every[:-1]])  # the sums, the count, then a read that lost its last batch
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ledger, "BUCKET_EVENTS", 3)
        with pytest.raises(InvalidInputError, match=r"events\.parquet: the events changed while they were read"):
            ledger._timing(model, lambda: next(reads))


def test_pair_sums_are_exact_past_float_precision() -> None:
    """Per-(site, instance) sums add int64s (a bincount's float weights round past 2^53)."""
    big = np.array([2**53 + 1, 1, 3], dtype=np.int64)
    first, second, totals = ledger._pair_sums(np, np.array([0, 0, 1]), np.array([5, 5, 5]), big)
    assert first.tolist() == [0, 1] and second.tolist() == [5, 5] and totals.tolist() == [2**53 + 2, 3]


def test_bucketed_ledger_of_a_long_synthetic_run_is_the_one_pass_ledger(tmp_path: Path, iree_bundles: dict[str, Path],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A model reads its events again when the run is long: Ledger(model) then buckets."""
    model = SemanticModel.open(iree_bundles["full"])
    one_pass = ledger.Ledger(model).totals
    monkeypatch.setattr(ledger, "BUCKET_EVENTS", 5)
    assert ledger.Ledger(SemanticModel.open(iree_bundles["full"])).totals == one_pass


@pytest.mark.parametrize("order", ["reversed", "shuffled"])
def test_a_file_far_from_start_order_gives_the_figures_of_one_pass(tmp_path: Path, iree_bundles: dict[str, Path],
                                                                    monkeypatch: pytest.MonkeyPatch,
                                                                    order: str) -> None:
    """A real run's events written back in another order (a bundle a tool rewrote): the
    routed pass, holding too many waiting, stops and the buckets left are read a pass
    each; the figures stay those of every event held at once."""
    import shutil

    import pyarrow.parquet as pq

    bundle = tmp_path / "bundle"
    shutil.copytree(iree_bundles["full"], bundle)
    events = pq.read_table(bundle / "events.parquet")
    rows = np.arange(events.num_rows)[::-1] if order == "reversed" else np.random.default_rng(0).permutation(
        events.num_rows)
    pq.write_table(events.take(rows), bundle / "events.parquet", row_group_size=16)
    model = SemanticModel.open(bundle)
    columns = list(ledger._TIMING_COLUMNS)
    whole = figures(ledger._timing(model, list(model.event_batches(columns=columns))))
    monkeypatch.setattr(ledger, "BUCKET_EVENTS", 4)
    monkeypatch.setattr(ledger, "ROUTED_EVENTS", 8)
    given = []
    routed = ledger._routed_buckets

    def counted(*args: Any, **kwargs: Any) -> Any:
        for bucket, rows in routed(*args, **kwargs):
            given.append(bucket)
            yield bucket, rows

    monkeypatch.setattr(ledger, "_routed_buckets", counted)
    assert figures(ledger._timing(model, lambda: model.event_batches(columns=columns, batch_size=16))) == whole
    assert whole["totals"].measured_ns > 0
    assert len(given) < 3  # the routed pass stopped: the rest was read a pass per bucket
