"""The run's columnar route against the per-record reference, on real profiles: the
records ``hal_profile.decode_columns`` decodes straight to columns are the records
``decode`` gives as objects, and the structural join over those columns gives every
record the site, invocation and phase the per-record join gives it — on the loop,
branch, shared-export and initializer programs of ``tests/inputs/shapes`` on both
drivers, and inside ``dfit run`` (full and lite) of the convnet (``iree_bundles``)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from dfit_mlir.core import manifest as manifest_io
from dfit_mlir.passes.instrumented_compile import CompileResult, compile_instrumented
from dfit_mlir.runtime_hooks import hal_profile
from dfit_mlir.runtime_hooks.columnar_join import join_columns
from dfit_mlir.runtime_hooks.join_records import DispatchColumns
from dfit_mlir.runtime_hooks.run import run_bundle
from tests.conftest import REPO

SHAPES = REPO / "tests" / "inputs" / "shapes"
FIELDS = ("event", "site", "invocation", "start_ns", "duration_ns", "workgroups", "tiles")
#: (program, compile flags, inputs, invocations): loops of several trips, both sides of
#: a branch, an export shared by two call sites, an initializer's load-time dispatch.
CASES = {
    "loop": ("loop.mlir", (), ("16x16xf32=0.01", "i32=5"), 3),
    "loop_no_trip": ("loop.mlir", (), ("16x16xf32=0.01", "i32=0"), 2),
    "branch_taken": ("branch.mlir", (), ("16x16xf32=0.1", "i32=1"), 3),
    "branch_not_taken": ("branch.mlir", (), ("16x16xf32=0.1", "i32=0"), 3),
    "shared_export": ("loop_shared_export.mlir", (), ("16x16xf32=0.01", "i32=4"), 3),
    "initializer": ("initializer.mlir", ("--iree-opt-const-eval=false",), ("8x64xf32=1",), 2),
}


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, CompileResult]:
    root = tmp_path_factory.mktemp("columnar-shapes")
    compiled: dict[str, CompileResult] = {}
    for source, flags in sorted({(source, flags) for source, flags, _, _ in CASES.values()}):
        compiled[source] = compile_instrumented(SHAPES / source, root / f"{Path(source).stem}.vmfb", mode="ids",
                                                flags=flags)
    return compiled


def assert_same_join(fast: hal_profile.Join, slow: hal_profile.Join) -> None:
    for field in FIELDS:
        assert np.array_equal(getattr(fast.columns, field), getattr(slow.columns, field)), field
    assert fast.starts == slow.starts and fast.recording_of_buffer == slow.recording_of_buffer
    assert fast.invocations == slow.invocations and fast.load_time == slow.load_time


@pytest.mark.parametrize("driver", hal_profile.DRIVERS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_join_on_decoded_columns_is_the_per_record_join(programs: dict[str, CompileResult], case: str, driver: str,
                                                        tmp_path: Path) -> None:
    source, _, inputs, invocations = CASES[case]
    compiled = programs[source]
    profile = tmp_path / "profile.bin"
    hal_profile.record_profile(compiled.vmfb, inputs, profile, driver=driver, function="main",
                               invocations=invocations)
    columns, objects = hal_profile.decode_columns(profile), hal_profile.decode(profile)
    assert isinstance(columns, DispatchColumns) and columns.events() == objects
    # What a run passes on besides the records: command-buffer executions and flushes.
    executions = [(r["submission_id"], r["command_buffer_id"]) for r in hal_profile.decode_host_operations(profile)
                  if r["op"] == "execute"]
    queue = hal_profile.decode_records(profile, "queue", "queue_event")
    flushes = hal_profile._flush_starts(profile, queue, invocations, True)
    manifest = compiled.manifest
    fast = hal_profile.join_structural(columns, manifest, "main", invocations, executions, flushes)
    slow = hal_profile._join_per_record(objects, manifest, "main", invocations, executions, flushes)
    assert_same_join(fast, slow)
    columnar = join_columns(columns, manifest, "main", invocations, executions, flushes)
    # Only a deduplicated export on local-sync (unnumbered commands) needs the creation
    # order, which the per-record join decides.
    assert (columnar is None) == (case == "shared_export" and driver == "local-sync")
    # Every call has the same inputs, so issues the same records: a loop's 1 + trips + 1.
    per_call = Counter(fast.columns.invocation.tolist())
    expected = {"loop": 1 + 5 + 1, "loop_no_trip": 1 + 0 + 1, "shared_export": 1 + 4 + 1}.get(case)
    if case != "initializer":  # (its dispatch runs at load, before profiling starts)
        assert set(per_call) == set(range(invocations)) and len(set(per_call.values())) == 1, per_call
        assert expected is None or per_call[0] == expected, per_call


def test_decode_columns_keeps_every_field(programs: dict[str, CompileResult], tmp_path: Path) -> None:
    """The columns hold what iree-profile printed for each record (read here from its
    JSONL with ``json``, independently of both decoders)."""
    import subprocess

    from dfit_mlir.core.toolchain import runtime_tool

    compiled = programs["loop.mlir"]
    profile = tmp_path / "profile.bin"
    hal_profile.record_profile(compiled.vmfb, ["16x16xf32=0.01", "i32=3"], profile, driver="local-task",
                               function="main", invocations=2)
    text = subprocess.run([runtime_tool("iree-profile"), "dispatch", "--dispatch_events", "--format=jsonl",
                           str(profile)], capture_output=True, text=True, check=True).stdout
    printed = [json.loads(line) for line in text.splitlines() if '"host_dispatch_event"' in line]
    columns = hal_profile.decode_columns(profile)
    assert len(columns) == len(printed) == 2 * (3 + 2)
    by_event = {(r["submission_id"], r["command_buffer_id"], r["start_host_time_ns"]): r for r in printed}
    for row in range(len(columns)):
        record = by_event[int(columns.submission_id[row]), int(columns.command_buffer_id[row]),
                          int(columns.start_ns[row])]
        assert columns.keys[columns.key[row]] == record["key"]
        assert int(columns.command_index[row]) == record["command_index"]
        assert int(columns.end_ns[row]) == record["end_host_time_ns"]
        assert columns.workgroup_counts[columns.workgroup[row]] == tuple(record["workgroup_count"])
        assert int(columns.tile_count[row]) == record["tile_count"]
    order = list(zip(columns.submission_id.tolist(), columns.command_buffer_id.tolist(),
                     columns.command_index.tolist(), strict=True))
    assert order == sorted(order)  # runtime order


@pytest.mark.parametrize("mode", ["full", "lite"])
def test_dfit_run_joins_decoded_columns(iree_bundles: dict[str, Path], mode: str, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """``dfit run --mode full`` of the convnet, and the profiled pass of a lite run (it
    runs in the module's child process there, so it is called here as the lite run calls
    it), hand the join the decoded columns, and the join they get is the per-record join
    of the same records."""
    from dfit_mlir.runtime_hooks import run

    seen: list[tuple[Any, tuple[Any, ...], hal_profile.Join]] = []
    original = hal_profile.join_structural

    def spy(events: Any, *args: Any) -> hal_profile.Join:
        result = original(events, *args)
        seen.append((events, args, result))
        return result

    monkeypatch.setattr(hal_profile, "join_structural", spy)
    vmfb = iree_bundles["manifest"].parent / f"{mode}.vmfb"
    if mode == "full":  # the whole-run route (the windowed one joins per window: tests/test_stream_windows.py)
        monkeypatch.setattr(run.WindowedRun, "open", _no_windows)
        bundle = run_bundle(vmfb, manifest_io.default_path(vmfb), tmp_path / "run", mode=mode, repeat=2,
                            warmup=1).bundle
    else:
        lite_manifest = json.loads(manifest_io.default_path(vmfb).read_text())
        profiled = run._profiled_run(vmfb, lite_manifest, ["1x32x32x3xf32=0.1"], "local-task", "main", 2, 1,
                                     run.LITE_QUEUE_FAMILIES)
        assert profiled.queue_rows and {row.invocation for row in profiled.queue_rows} >= {0, 1}
    assert len(seen) == 1
    records, (manifest, function, invocations, executions, flushes), joined = seen[0]
    assert isinstance(records, DispatchColumns) and invocations == 3 and len(records) > 0
    assert_same_join(joined, hal_profile._join_per_record(records.events(), manifest, function, invocations,
                                                          executions, flushes))
    if mode == "full":  # the bundle's dispatch events are the joined records past the warmup
        events = pq.read_table(bundle / "events.parquet", columns=["kind", "site", "invocation"]).to_pylist()
        written = Counter((e["site"], e["invocation"]) for e in events if e["kind"] == "dispatch")
        kept = joined.columns.invocation >= 1
        expected = Counter(zip(joined.columns.site[kept].tolist(), (joined.columns.invocation[kept] - 1).tolist(),
                               strict=True))
        assert written == expected and sum(written.values()) > 0


def test_a_file_that_is_no_profile_is_one_error_line(tmp_path: Path) -> None:
    """Both decoders say the same about a damaged profile: the file and iree-profile's reason."""
    damaged = tmp_path / "profile.bin"
    damaged.write_bytes(b"IRPF not a profile")
    messages = []
    for decoder in (hal_profile.decode_columns, hal_profile.decode):
        with pytest.raises(hal_profile.ProfileError) as raised:
            decoder(damaged)
        assert raised.value.exit_code == 3
        messages.append(str(raised.value))
    assert messages[0] == messages[1] and "\n" not in messages[0]
    assert messages[0].startswith(f"iree-profile dispatch could not decode {damaged}: ")


def test_columnar_join_imports_nothing_of_hal_profile() -> None:
    """The join's shared records and rules live in ``join_records``: no import cycle."""
    import subprocess
    import sys

    code = ("import sys, dfit_mlir.runtime_hooks.columnar_join; "
            "print(sorted(m for m in sys.modules if m.startswith('dfit_mlir.runtime_hooks.')))")
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert shown.strip() == "['dfit_mlir.runtime_hooks.columnar_join', 'dfit_mlir.runtime_hooks.join_records']"


def _no_windows(*args: Any, **kwargs: Any) -> Any:
    from dfit_mlir.runtime_hooks.profile_stream import WindowedRouteUnavailable

    raise WindowedRouteUnavailable("the whole-run route under test")
