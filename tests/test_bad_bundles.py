"""Issue 17 beyond the query: what the bad-input suite's one-command cases
(tests/badinput_bundles.py) cannot show — the first bad row found across row groups,
a store that keeps its count with foreign files beside its own, compaction interrupted
(SIGINT: 130) or killed (SIGKILL: the next one cleans up), a merge whose ranks' clocks
would put times below zero, Ctrl-C while ``dfit`` is still importing."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dfit_mlir.core import event_schema as es
from dfit_mlir.core.errors import InvalidInputError
from tests.conftest import REPO

ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def _events_copy(bundle: Path, target: Path) -> Any:
    """The bundle's events as a table (its schema metadata kept), and a copy folder."""
    import pyarrow.parquet as pq

    shutil.copytree(bundle, target)
    return pq.read_table(target / "events.parquet")


def test_the_first_bad_row_is_found_across_row_groups(iree_bundles: dict[str, Path], tmp_path: Path) -> None:
    """A real run's events repeated into 60 row groups, read in batches of 100 rows; one
    negative duration at row 4321: the error names that row, not the batch's."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = _events_copy(iree_bundles["full"], tmp_path / "b")
    big = pa.concat_tables([table] * (6000 // table.num_rows + 1))
    durations = big.column("duration_ns").to_pylist()
    durations[4321] = -7
    big = big.set_column(big.column_names.index("duration_ns"), big.schema.field("duration_ns"),
                         pa.array(durations, pa.int64()))
    path = tmp_path / "b" / "events.parquet"
    pq.write_table(big, path, row_group_size=100)
    assert pq.ParquetFile(path).num_row_groups >= 60
    with pytest.raises(InvalidInputError, match=r"column 'duration_ns', row 4321: -7 is negative"):
        for _ in es.checked_batches(path, batch_size=100):
            pass
    durations[4321] = 5
    pq.write_table(big.set_column(big.column_names.index("duration_ns"), big.schema.field("duration_ns"),
                                  pa.array(durations, pa.int64())), path, row_group_size=100)
    # The same file with the value fixed is read whole.
    assert sum(batch.num_rows for batch in es.checked_batches(path, batch_size=100)) == big.num_rows


def test_every_bundle_dfit_writes_passes_the_check(iree_bundles: dict[str, Path], cerebras_bundle: Path,
                                                   edgetpu_bundle: Path, sambanova_bundle: Path) -> None:
    """Runs of every mode and the reconstructions of the three closed backends: the check
    refuses nothing dfit itself writes."""
    for bundle in [*(iree_bundles[mode] for mode in ("full", "lite", "ids", "none")), cerebras_bundle,
                   edgetpu_bundle, sambanova_bundle]:
        assert sum(b.num_rows for b in es.checked_batches(bundle / "events.parquet")) == _events_of(bundle)


def test_an_older_minor_without_the_fields_added_since_is_read(iree_bundles: dict[str, Path],
                                                               tmp_path: Path) -> None:
    """Event schema 1.0 had no name/value/step: such a file is accepted (read as nulls),
    a 1.1 file without them is not."""
    import pyarrow.parquet as pq

    table = _events_copy(iree_bundles["ids"], tmp_path / "b").drop([es.NAME, es.VALUE, es.STEP])
    path = tmp_path / "b" / "events.parquet"
    pq.write_table(table.replace_schema_metadata({**table.schema.metadata, b"dfit.version": b"1.0"}), path)
    assert es.NAME not in es.check_events(path)
    pq.write_table(table, path)
    with pytest.raises(InvalidInputError, match="column 'name' is missing"):
        es.check_events(path)


def _dfit(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dfit_mlir", *argv], cwd=cwd, env=ENV, capture_output=True,
                          text=True, timeout=300)


def _count(store: Path) -> int:
    from dfit_mlir.fleet.store import query

    return query(store, "SELECT count(*) AS n FROM events").column("n")[0].as_py()


def test_files_the_store_does_not_read_do_not_change_its_answers(iree_bundles: dict[str, Path],
                                                                 tmp_path: Path) -> None:
    """Beside a stored bundle's own files: a Parquet copy under another name, a note, a
    collect's leftover temporary folder: the count stays the bundle's events."""
    from dfit_mlir.fleet.store import collect

    store = tmp_path / "store"
    collect([iree_bundles["full"]], store)
    expected = _count(store)
    run = next((store / "bundles").glob("backend=*/model=*/run=*"))
    shutil.copyfile(run / "events.parquet", run / "events-copy.parquet")
    (run / "notes.txt").write_text("mine\n")
    leftover = run.parent / f".{run.name}.abcd.tmp"
    shutil.copytree(run, leftover)
    assert _count(store) == expected == _events_of(iree_bundles["full"])


def _events_of(bundle: Path) -> int:
    import pyarrow.parquet as pq

    return pq.ParquetFile(bundle / "events.parquet").metadata.num_rows


@pytest.fixture(scope="module")
def many_bundle_store(tmp_path_factory: pytest.TempPathFactory, iree_bundles: dict[str, Path]) -> Path:
    """40 copies of a real run (each its own session) collected into one store: a
    compaction of it takes long enough to be interrupted while it writes parts."""
    from dfit_mlir.fleet.store import collect
    from tests.store_fixtures import copy_bundle

    root = tmp_path_factory.mktemp("many")
    copies = [copy_bundle(iree_bundles["full"], root / f"copy{k}") for k in range(40)]
    collect(copies, root / "store")
    return root / "store"


def test_sigint_while_compacting_exits_130_and_the_store_answers_as_before(many_bundle_store: Path,
                                                                          tmp_path: Path) -> None:
    store = tmp_path / "store"
    shutil.copytree(many_bundle_store, store)
    expected = _count(store)
    child = subprocess.Popen([sys.executable, "-m", "dfit_mlir", "store", "compact", str(store)], env=ENV,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while child.poll() is None and not (store / "compacted" / ".lock").exists() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert child.poll() is None, child.communicate()
    child.send_signal(signal.SIGINT)
    _, stderr = child.communicate(timeout=120)
    assert child.returncode == 130, stderr
    assert "Traceback" not in stderr and "interrupted" in stderr
    # Interrupted before its commit or after: either way no temporary, every run read once.
    assert not [p for p in store.rglob("*") if p.name.endswith(".tmp")]
    assert _count(store) == expected


KILL_AFTER_FIRST_PART = """
import os, signal, sys
import pyarrow.parquet as pq
from dfit_mlir.fleet.store import compact

real = pq.ParquetWriter.write_table
def write_then_die(self, *args, **kwargs):
    real(self, *args, **kwargs)
    os.kill(os.getpid(), signal.SIGKILL)  # mid-part: its temporary is on disk
pq.ParquetWriter.write_table = write_then_die
compact.compact(compact.Path(sys.argv[1]))
"""


def test_a_compaction_killed_leaves_temporaries_the_next_one_removes(many_bundle_store: Path,
                                                                      tmp_path: Path) -> None:
    """SIGKILL while a part is written: its ``.tmp`` is left; readers ignore it (the same
    count), and the next compaction removes it and compacts everything."""
    from dfit_mlir.fleet.store import layout

    store = tmp_path / "store"
    shutil.copytree(many_bundle_store, store)
    expected = _count(store)
    killed = subprocess.run([sys.executable, "-c", KILL_AFTER_FIRST_PART, str(store)], env=ENV,
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    left = [p for p in (store / "compacted").rglob("*") if p.name.endswith(".tmp")]
    assert left, "the kill left no temporary: the test did not kill mid-part"
    assert _count(store) == expected
    done = _dfit("store", "compact", str(store), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert not [p for p in store.rglob("*") if p.name.endswith(".tmp")]
    assert len(layout.read_index(store)["runs"]) == 40
    assert _count(store) == expected


def test_merged_ranks_whose_clocks_start_late_keep_times_non_negative(iree_bundles: dict[str, Path],
                                                                      tmp_path: Path) -> None:
    """Recorded offsets that would put rank 1's events before zero: the merged timeline is
    moved as a whole (every start ≥ 0, the merged bundle passes the events check) and the
    two ranks stay exactly as far apart as their offsets say."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from dfit_mlir.fleet.merge import merge_bundles
    from tests.store_fixtures import copy_bundle

    ranks = [copy_bundle(iree_bundles["ids"], tmp_path / f"rank{k}") for k in range(2)]
    first_start = pc.min(pq.read_table(ranks[0] / "events.parquet").column("start_ns")).as_py()
    offsets = [0, -(first_start + 10**9)]
    for rank, (bundle, offset) in enumerate(zip(ranks, offsets, strict=True)):
        summary = json.loads((bundle / "summary.json").read_text())
        (bundle / "summary.json").write_text(json.dumps({**summary, "rank": rank, "clock_offset_ns": offset}))
    summary = merge_bundles(ranks, tmp_path / "merged")
    merged = pq.read_table(tmp_path / "merged" / "events.parquet")
    assert pc.min(merged.column("start_ns")).as_py() >= 0
    assert sum(b.num_rows for b in es.checked_batches(tmp_path / "merged" / "events.parquet")) == merged.num_rows
    shifts = [rank["offset_ns"] for rank in summary["ranks"]]
    assert shifts[0] - shifts[1] == offsets[0] - offsets[1]


INTERRUPT_DURING_IMPORT = """
import builtins, sys
real = builtins.__import__
def interrupted(name, *args, **kwargs):
    if name == "dfit_mlir.cli.app":
        raise KeyboardInterrupt
    return real(name, *args, **kwargs)
builtins.__import__ = interrupted
sys.argv = ["dfit", "store", "compact", "nowhere"]
from dfit_mlir.__main__ import main
main()
"""


def test_ctrl_c_while_dfit_imports_exits_130() -> None:
    """The console script imports the command line inside the exit-status contract."""
    done = subprocess.run([sys.executable, "-c", INTERRUPT_DURING_IMPORT], env=ENV, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip() == "dfit: interrupted"


def test_the_console_script_is_the_guarded_entry() -> None:
    import tomllib

    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["dfit"] == "dfit_mlir.__main__:main"
