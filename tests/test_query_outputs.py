"""Output ownership of the store commands, in the bad-input suite's terms: ``dfit query
-o`` / ``--trace``, ``dfit collect -o STORE`` and ``dfit merge -o`` given every hostile
output path of tests/badinput_cases.py (the input itself, a path inside or around it, a
symlink to it, a user's file or folder, another dfit output) exit 2 with one line naming
the path and leave every file as it was; dfit's own earlier outputs are replaced.

The store is collected from real bundles: a run of the convnet (IREE, full mode) and the
reconstructed SambaFlow BertLarge compile + 8-task run logs."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from tests.badinput_cases import OUTPUT_SCENARIOS, user_folder
from tests.test_bad_input import invoke, tree


@dataclass(frozen=True)
class StoreArt:
    store: Path
    run: Path
    reconstruction: Path


@pytest.fixture(scope="module")
def store_art(tmp_path_factory: pytest.TempPathFactory, iree_bundles: dict[str, Path],
              sambanova_bundle: Path) -> StoreArt:
    from dfit_mlir.fleet.store import Placement, collect

    store = tmp_path_factory.mktemp("query-outputs") / "store"
    collect([iree_bundles["full"], sambanova_bundle], store, Placement(label="base"))
    return StoreArt(store, iree_bundles["full"], sambanova_bundle)


def put(source: Path, work: Path, name: str) -> str:
    shutil.copytree(source, work / name, symlinks=True)
    return name


SQL = "SELECT kind, count(*) AS n FROM events GROUP BY kind ORDER BY kind NULLS LAST"
EVENTS = "SELECT * FROM events WHERE kind = 'dispatch'"

#: command → (argv with {IN} for the input and {OUT} for the output, set-up of the input).
WRITERS: dict[str, tuple[list[str], Callable[[Path, StoreArt], str]]] = {
    "query-o": (["query", "{IN}", SQL, "-o", "{OUT}", "--rows", "0"], lambda w, a: put(a.store, w, "store")),
    "query-trace": (["query", "{IN}", EVENTS, "--trace", "{OUT}", "--rows", "0"],
                    lambda w, a: put(a.store, w, "store")),
    "collect": (["collect", "{IN}", "-o", "{OUT}"], lambda w, a: put(a.run, w, "run")),
    "merge": (["merge", "{IN}", "other", "-o", "{OUT}", "--allow-mixed"],
              lambda w, a: put(a.reconstruction, w, "other") and put(a.run, w, "run")),
}


def hostile_cases() -> list[pytest.param]:
    cases = []
    for command in WRITERS:
        for scenario, (output, names) in OUTPUT_SCENARIOS.items():
            if scenario.endswith("-forced") and command == "collect":
                continue  # collect has no --force: it never replaces anything
            cases.append(pytest.param(command, scenario, output, names("{IN}"), id=f"{scenario}-{command}"))
    return cases


@pytest.mark.parametrize(("command", "scenario", "output", "names"), hostile_cases())
def test_a_hostile_output_path_is_refused_and_nothing_changes(command: str, scenario: str,
                                                              output: Callable[[Path, str], str], names: str,
                                                              store_art: StoreArt, tmp_path: Path) -> None:
    argv, setup = WRITERS[command]
    work = tmp_path / "work"
    work.mkdir()
    source = setup(work, store_art)
    out = output(work, source)
    line = [part.replace("{IN}", source).replace("{OUT}", out) for part in argv]
    line += ["--force"] if scenario.endswith("-forced") else []
    before = tree(tmp_path)
    status, stdout, stderr, escaped = invoke(line, work)
    shown = f"dfit {' '.join(line)}\nexit {status}\nstdout: {stdout[-1500:]}\nstderr: {stderr[-2000:]}"
    assert escaped is None and status == 2, shown
    assert "Traceback" not in stdout + stderr, shown
    [message] = stderr.strip().splitlines()
    # The path at fault, as the user spelled it (or the input it would clash with).
    assert message.startswith("dfit") and names in message and out.split("/")[0] in message, shown
    assert tree(tmp_path) == before, shown


def test_the_suite_covers_every_scenario_for_every_store_writer() -> None:
    assert len(hostile_cases()) == len(WRITERS) * len(OUTPUT_SCENARIOS) - 1 >= 40


# --- what must work ------------------------------------------------------------------------------

def test_query_replaces_its_own_outputs_and_records_them(store_art: StoreArt, tmp_path: Path) -> None:
    """Run twice in a row: the second -o / --trace replaces the first (other rows this
    time); a file dfit wrote and someone then edited is no longer dfit's."""
    from tests.conftest import read_pftrace

    store = put(store_art.store, tmp_path, "store")
    for table in ("rows.csv", "rows.parquet"):
        for limit in (3, 1):
            status, _, stderr, _ = invoke(["query", store, f"{SQL} LIMIT {limit}", "-o", table, "--rows", "0"],
                                          tmp_path)
            assert status == 0, stderr
            read = pacsv.read_csv if table.endswith(".csv") else pq.read_table
            assert read(tmp_path / table).num_rows == limit
    traced = []
    for kind in ("dispatch", "metric"):
        status, _, stderr, _ = invoke(["query", store, f"SELECT * FROM events WHERE kind = '{kind}'",
                                       "--trace", "t.pftrace", "--rows", "0"], tmp_path)
        assert status == 0, stderr
        traced.append(len(read_pftrace(tmp_path / "t.pftrace")[1]))
    assert traced[0] != traced[1]
    # Edited after dfit wrote it: the user's now.
    with open(tmp_path / "rows.csv", "a") as handle:
        handle.write("my,row\n")
    status, _, stderr, _ = invoke(["query", store, SQL, "-o", "rows.csv"], tmp_path)
    assert status == 2 and "rows.csv: refusing to overwrite: it exists and dfit did not write it" in stderr
    assert (tmp_path / "rows.csv").read_text().endswith("my,row\n")
    status, _, stderr, _ = invoke(["query", store, SQL, "-o", "rows.csv", "--force", "--rows", "0"], tmp_path)
    assert status == 0 and "my,row" not in (tmp_path / "rows.csv").read_text(), stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.csv", "rows.parquet", "store", "t.pftrace"]


@pytest.mark.parametrize(("options", "message"), [
    (["-o", "same.csv", "--trace", "./same.csv"], "same.csv: -o and --trace name the same file"),
    (["-o", "rows.txt"], "rows.txt: -o writes .csv or .parquet"),
    (["-o", "store/bundles/rows.csv"], "store/bundles/rows.csv: refusing to write an output inside the input store"),
    (["--trace", "store/t.pftrace"], "store/t.pftrace: refusing to write an output inside the input store"),
    (["-o", "ok.csv", "--trace", "store/dfit-store.json"], "store/dfit-store.json: refusing to write an output "
                                                           "inside the input store"),
])
def test_query_output_errors_come_before_the_query(options: list[str], message: str, store_art: StoreArt,
                                                   tmp_path: Path) -> None:
    """Refused before any SQL runs (a syntax error in it is not what is reported), and
    neither output is written, not even the one that was fine."""
    put(store_art.store, tmp_path, "store")
    before = tree(tmp_path)
    status, _, stderr, escaped = invoke(["query", "store", "SELEC nothing", *options], tmp_path)
    assert escaped is None and status == 2, stderr
    [line] = stderr.strip().splitlines()
    assert line.startswith("dfit") and message in line
    assert tree(tmp_path) == before


def test_collect_and_merge_rewrite_their_own_outputs(store_art: StoreArt, tmp_path: Path) -> None:
    put(store_art.run, tmp_path, "run")
    put(store_art.reconstruction, tmp_path, "other")
    for _ in range(2):
        status, stdout, stderr, _ = invoke(["collect", "run", "other", "-o", "s"], tmp_path)
        assert status == 0 and stdout.count("already in the store") in (0, 2), stderr
        status, stdout, stderr, _ = invoke(["merge", "run", "other", "-o", "m", "--allow-mixed"], tmp_path)
        assert status == 0 and stdout.startswith("wrote m:"), stderr
    # A merged bundle with a user's note in it is not dfit's to replace.
    (tmp_path / "m" / "notes.txt").write_text("mine\n")
    status, _, stderr, _ = invoke(["merge", "run", "other", "-o", "m", "--allow-mixed"], tmp_path)
    assert status == 2 and "'notes.txt', which dfit did not write" in stderr
    user_folder(tmp_path, "u")
    status, _, stderr, _ = invoke(["merge", "run", "other", "-o", "u", "--allow-mixed", "--force"], tmp_path)
    assert status == 0 and not (tmp_path / "u" / "notes.txt").exists(), stderr


def test_a_store_url_is_the_cluster_s_and_not_checked_as_a_local_path(tmp_path: Path) -> None:
    """``s3a://bucket/store`` names no local folder: only the local output's own rules apply."""
    from dfit_mlir.core.errors import OutputRefusedError
    from dfit_mlir.fleet.store.output import check_paths

    check_paths("s3a://bucket/store", tmp_path / "rows.csv", tmp_path / "t.pftrace")
    (tmp_path / "rows.csv").write_text("mine\n")
    with pytest.raises(OutputRefusedError, match="rows.csv: refusing to overwrite"):
        check_paths("s3a://bucket/store", tmp_path / "rows.csv", None)
    with pytest.raises(OutputRefusedError, match="inside the input"):
        check_paths(str(tmp_path), tmp_path / "t.pftrace", None)
