"""``rank-skew`` on the real multi-task and multi-run vendor logs, and the per-task
timing the SambaFlow run-log reader recovers for it.

What the fixtures record per rank/task (read off the files by hand):

* SambaFlow 1.17 BertLarge dp8 run (``sambanova/bertlarge_run_dp8_sf1.17.7_sn30``): eight
  tasks ("Process ID" 3613047..3613054, no rank); only task 0 (pid 3613047) logs steps,
  the tqdm step rate and the final throughput dictionary; every task logs the app's
  milestones ``NLP app started.`` / ``transformers_hook app running in run mode`` / ``NLP
  app finished`` (task 0 never finishes: its throughput assertion fails), so each task's
  setup and whole-app times are the per-task figures there are.
* SambaFlow 2021 MNIST (``sambanova/ffn_mnist_dataparallel_2021``): eight ``Test Accuracy``
  lines that name no task, and PEF loads stamped to the second: no per-task timing.
* Cerebras logs: every one a single-CSX run (``Preparing to execute using 1 CSX``); the two
  BERT-large runs (batch 512 and 2048) are collected here as two ranks of one job, as the
  store tests do with two IREE runs.

Expected values are the fixtures' (timestamps, line numbers), not the code's."""

from __future__ import annotations

import shutil
import statistics
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from dfit_mlir.adapters.sambanova import SambaFlowRunLogReader
from dfit_mlir.fleet import store as bundle_store
from tests.conftest import vendor_fixture
from tests.store_fixtures import sambanova_mnist_bundle  # noqa: F401  (fixture)

RUN_DP8 = "sambanova/bertlarge_run_dp8_sf1.17.7_sn30/BertLarge.out"

#: pid → ("NLP app started." line, stamp), ("... running in run mode" line, stamp),
#: ("NLP app finished" line, stamp) or None — grep -n of the fixture.
DP8_TASKS: dict[int, tuple[tuple[int, str], tuple[int, str], tuple[int, str] | None]] = {
    3613052: ((327, "09:57:54,992"), (390, "09:57:55,603"), (979, "10:05:24,267")),
    3613054: ((332, "09:57:54,993"), (396, "09:57:55,617"), (978, "10:05:24,267")),
    3613050: ((337, "09:57:54,994"), (408, "09:57:55,775"), (975, "10:05:24,262")),
    3613048: ((342, "09:57:54,994"), (405, "09:57:55,726"), (981, "10:05:24,267")),
    3613053: ((346, "09:57:54,994"), (402, "09:57:55,644"), (977, "10:05:24,266")),
    3613047: ((351, "09:57:54,995"), (399, "09:57:55,642"), None),  # task 0: AssertionError, no finish
    3613049: ((355, "09:57:54,995"), (393, "09:57:55,615"), (976, "10:05:24,265")),
    3613051: ((359, "09:57:54,995"), (411, "09:57:55,883"), (980, "10:05:24,267")),
}


def seconds(stamp: str) -> float:
    return datetime.strptime(f"2024-04-07 {stamp}", "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=UTC).timestamp()


def expected_phases() -> dict[tuple[int, str], tuple[float, float, int, int]]:
    """(pid, phase) → (start s, duration s, first line, last line)."""
    found = {}
    for pid, (started, setup, finished) in DP8_TASKS.items():
        for phase, end in (("setup", setup), ("app", finished)):
            if end is not None:
                found[(pid, phase)] = (seconds(started[1]), round(seconds(end[1]) - seconds(started[1]), 6),
                                       started[0], end[0])
    return found


# --- the reader --------------------------------------------------------------------------

def test_sambaflow_run_log_times_every_task_between_the_app_milestones() -> None:
    recovery = SambaFlowRunLogReader(vendor_fixture(RUN_DP8)).read()
    path = vendor_fixture(RUN_DP8)
    phases = [m for m in recovery.measurements if m.name == "run.phase"]
    got = {(m.attributes["pid"], m.attributes["phase"]): (m.start_s, m.duration_s, int(m.origin.rsplit(":", 1)[1]),
                                                          m.attributes["end_line"]) for m in phases}
    expected = expected_phases()
    assert got.keys() == expected.keys() and len(got) == 15  # 8 setups, 7 whole apps
    for key, (start, duration, first, last) in expected.items():
        assert got[key][0] == pytest.approx(start, abs=1e-6) and got[key][1] == pytest.approx(duration, abs=1e-9)
        assert got[key][2:] == (first, last), key
    for m in phases:
        assert (m.kind, m.unit, m.value) == ("program", "s", m.duration_s)
        assert m.origin.startswith(f"{path}:") and m.attributes["run_scope"] == "run0"
        assert "rank" not in m.attributes  # 1.17 names no rank
    assert recovery.attributes["tasks_unfinished"] == [3613047]


def test_milestones_out_of_order_or_unpaired_give_no_phase(tmp_path: Path) -> None:
    # SYNTHETIC: milestone lines as the 1.17 log prints them, pasted out of order and cut.
    prefix = "2024-04-07 {} - apps.nlp.transformers_on_rdu.transformers_hook - {} - info     - {}\n"
    log = tmp_path / "synthetic_tasks.out"
    log.write_text("".join([
        prefix.format("09:57:55,000", "Process ID 11", "NLP app started."),
        prefix.format("09:57:54,000", "Process ID 11", "transformers_hook app running in run mode"),  # earlier
        prefix.format("09:57:55,100", "Process ID 12", "NLP app finished"),  # never started
        prefix.format("09:57:55,200", "Rank 3, PID 13", "NLP app started."),
        prefix.format("09:57:56,700", "Rank 3, PID 13", "transformers_hook app running in run mode"),
        prefix.format("09:57:57,000", "Process ID 14", "NLP app started."),  # cut: no end
    ]))
    recovery = SambaFlowRunLogReader(log).read()
    [phase] = [m for m in recovery.measurements if m.name == "run.phase"]
    assert (phase.attributes["pid"], phase.attributes["rank"], phase.attributes["phase"]) == (13, 3, "setup")
    assert phase.duration_s == pytest.approx(1.5)
    assert recovery.attributes["tasks_unfinished"] == [11, 13, 14]


# --- the report --------------------------------------------------------------------------

def copy_with(source: Path, target: Path, edit: dict[str, float]) -> Path:
    """``source`` under a new session ID, the metrics named in ``edit`` scaled (SYNTHETIC)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    shutil.copytree(source, target)
    table = pq.read_table(source / "events.parquet")
    session = pa.array([uuid.uuid4().hex[:12]] * table.num_rows, pa.string()).dictionary_encode()
    table = table.set_column(0, "session", session.cast(table.schema.field("session").type))
    names, values = table.column("name").to_pylist(), table.column("value").to_pylist()
    scaled = [v * edit[n] if n in edit and v is not None else v for n, v in zip(names, values, strict=True)]
    table = table.set_column(table.column_names.index("value"), "value", pa.array(scaled, pa.float64()))
    pq.write_table(table, target / "events.parquet")
    return target


@pytest.fixture(scope="module")
def skew_store(tmp_path_factory: pytest.TempPathFactory, sambanova_bundle: Path,
               sambanova_mnist_bundle: Path) -> Path:  # noqa: F811
    from dfit_mlir.adapters.reconstruct import reconstruct_bundle
    from dfit_mlir.fleet.store import Placement, collect

    root = tmp_path_factory.mktemp("rank-skew")
    path = root / "store"
    collect([sambanova_bundle, sambanova_mnist_bundle], path, Placement(label="vendor"))
    for rank, batch in enumerate((512, 2048)):
        bundle = root / f"cerebras-{batch}"
        reconstruct_bundle([vendor_fixture(f"cerebras/alcf_bert_large_bs{batch}_r2x")], bundle, "cerebras")
        collect([bundle], path, Placement(label="pair", rank=rank, model="bert-cs"))
        # The single-CSX run on its own: not a multi-rank job, no rows.
        collect([bundle], root / f"alone-{batch}", Placement(label="alone"))
    # SYNTHETIC: the dp8 bundle twice as two ranks, the second's throughput halved.
    for rank, factor in enumerate((1.0, 0.5)):
        copy = copy_with(sambanova_bundle, root / f"rate{rank}", {"training_samples_per_second": factor})
        collect([copy], path, Placement(label="rates", rank=rank, model="dp8-twice"))
    return path


def report(store_path: Path, engine: str = "duckdb") -> list[dict[str, Any]]:
    return bundle_store.query(store_path, report="rank-skew", engine=engine).to_pylist()


def by_measure(rows: list[dict[str, Any]], label: str) -> dict[tuple[str, Any], dict[str, Any]]:
    return {(r["measure"], r["step"]): r for r in rows if r["label"] == label}


def test_dp8_tasks_are_compared_on_their_phases_and_the_lone_step_logger_is_said(skew_store: Path) -> None:
    rows = by_measure(report(skew_store), "vendor")
    phases = expected_phases()
    for phase, reporting in (("setup", 8), ("app", 7)):
        times = {pid: duration * 1e9 for (pid, name), (_, duration, _, _) in phases.items() if name == phase}
        row = rows[(f"program:run.phase:{phase}", None)]
        slowest = max(times, key=lambda pid: (times[pid], -pid))
        median = statistics.median(times.values())
        assert (row["unit"], row["ranks"], row["job_ranks"], row["slowest_rank"], row["note"]) == \
            ("ns", reporting, 8, None, None)
        assert row["slowest_pid"] == slowest
        assert row["slowest"] == pytest.approx(times[slowest], abs=1)
        assert row["median"] == pytest.approx(median, abs=1)
        assert row["fastest"] == pytest.approx(min(times.values()), abs=1)
        assert row["skew"] == pytest.approx(times[slowest] / median)  # unrounded: the engines round differently
    # By hand: setup 0.888 s (pid 3613051) against the median 0.6485 s; the apps end together.
    assert (rows[("program:run.phase:setup", None)]["slowest_pid"], round(rows[("program:run.phase:setup", None)]["skew"], 3)) \
        == (3613051, 1.369)
    assert (rows[("program:run.phase:app", None)]["slowest_pid"], round(rows[("program:run.phase:app", None)]["skew"], 3)) == \
        (3613052, 1.0)
    # Steps and the throughput dictionary: task 0 alone — one explicit row each, not silence.
    alone = {key[0]: row for key, row in rows.items() if row["ranks"] == 1}
    assert set(alone) == {"step_time", "metric:e2e_train_time", "metric:training_samples_per_second",
                          "metric:training_sequences_per_second"}
    assert alone["step_time"]["note"] == \
        "only pid 3613047 reports it (504 steps) of the 8 ranks/tasks in the job: nothing to compare"
    assert alone["metric:training_samples_per_second"]["unit"] == "samples/s"
    for row in alone.values():
        assert (row["slowest_pid"], row["step"], row["slowest"], row["skew"]) == (3613047, None, None, None)
    assert set(rows) == {(m, None) for m in alone} | {("program:run.phase:setup", None),
                                                      ("program:run.phase:app", None)}
    # The 2021 MNIST tasks' figures name no task, and a lone Cerebras run is no multi-rank job.
    assert {r["model"] for r in report(skew_store)} == {"bertlarge_compile_sf1.17.7_sn30", "bert-cs", "dp8-twice"}
    for alone_store in skew_store.parent.glob("alone-*"):
        assert report(alone_store) == []


def test_two_cerebras_runs_as_ranks_are_compared_per_step_and_per_phase(skew_store: Path) -> None:
    rows = by_measure(report(skew_store), "pair")
    # Per 100-step window: "Beginning appliance run" .. "Step=100" (rank 0: 04:31:18,020 ..
    # 04:32:54,298; rank 1: 05:19:00,345 .. 05:19:43,281).
    window = rows[("step_span", 100)]
    assert (window["ranks"], window["slowest_rank"], window["slowest"], window["fastest"]) == (2, 0, 96.278e9, 42.936e9)
    assert window["skew"] == pytest.approx(96.278 / ((96.278 + 42.936) / 2))
    assert {step for measure, step in rows if measure == "step_span"} == {0, *range(100, 1001, 100)}
    # "Waiting for device programming" .. "Device programming is complete": 44.414 s and 6.996 s.
    programming = rows[("program:execute.phase:Device programming", None)]
    assert (programming["slowest_rank"], programming["slowest"], programming["fastest"]) == (0, 44.414e9, 6.996e9)
    processed = rows[("program:processed_samples", None)]  # "Processed N sample(s) in T seconds"
    assert (processed["slowest"], processed["fastest"]) == (426819169997.0, 359967711699.0)
    assert all(r["ranks"] == 2 and r["job_ranks"] == 2 and r["note"] is None for r in rows.values())


def test_a_rate_s_slowest_rank_is_the_one_with_the_lowest(skew_store: Path) -> None:
    """SYNTHETIC throughput (the dp8 figure, halved on rank 1): lower is slower."""
    row = by_measure(report(skew_store), "rates")[("metric:training_samples_per_second", None)]
    real = 2348.5311359310485  # the log's 'training_samples_per_second'
    assert (row["unit"], row["ranks"], row["slowest_rank"]) == ("samples/s", 2, 1)
    assert (row["slowest"], row["fastest"]) == (pytest.approx(real / 2), pytest.approx(real))
    assert row["skew"] == pytest.approx(1.5)


@pytest.mark.spark
def test_spark_gives_the_same_rank_skew(skew_store: Path) -> None:
    def rounded(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: round(v, 6) if isinstance(v, float) else v for k, v in row.items()} for row in rows]

    duckdb = report(skew_store)
    assert len(duckdb) > 20 and rounded(report(skew_store, "spark")) == rounded(duckdb)


def test_a_query_trace_gives_each_task_its_track_group(skew_store: Path, tmp_path: Path) -> None:
    """``--trace`` of the dp8 run's task phases: one group per task pid (the log names no
    rank), the Cerebras pair's events one per rank."""
    from click.testing import CliRunner

    from dfit_mlir.cli.app import main
    from tests.conftest import read_pftrace

    out = tmp_path / "tasks.pftrace"
    sql = ("SELECT * FROM events WHERE kind = 'program' "
           "AND model IN ('bertlarge_compile_sf1.17.7_sn30', 'bert-cs')")
    result = CliRunner().invoke(main, ["query", str(skew_store), sql, "--trace", str(out), "--rows", "0"])
    assert result.exit_code == 0, result.output
    tracks, traced = read_pftrace(out)
    # Group names: "MODEL · run RUN" then the rank or task.
    groups = {name.split(" · run ", 1)[1].split(" ", 1)[1] for name in tracks.values() if " · run " in name}
    assert groups == {f"task pid {pid}" for pid in DP8_TASKS} | {"rank 0", "rank 1"}
    # 15 task phases; per Cerebras run 2 checkpoint saves, 4 execute phases, 1 processed, 10 windows.
    assert sum(p.track_event.type == p.track_event.TYPE_SLICE_BEGIN for p, _, _ in traced) == 15 + 2 * 17
