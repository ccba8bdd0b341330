"""`dfit run --mode full`: a run bundle whose every dispatch event carries its IDs, with
the run's queue and memory records beside them, that reads back with pyarrow and whose
trace parses against Perfetto's own protobuf schema; bad input gets one line, exit 2
and no bundle."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TrackEvent

from dfit_mlir.core import outputs
from dfit_mlir.passes.instrumented_compile import compile_instrumented
from tests.conftest import CONVNET, REPO, read_pftrace

DFIT = [sys.executable, "-m", "dfit_mlir"]
REPEAT = 3


def dfit(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DFIT, *args], capture_output=True, text=True)


@pytest.fixture(scope="module")
def convnet(tmp_path_factory: pytest.TempPathFactory):
    return compile_instrumented(CONVNET, tmp_path_factory.mktemp("convnet") / "convnet.vmfb", mode="ids")


@pytest.fixture(scope="module", params=["local-sync", "local-task"])
def bundle(request: pytest.FixtureRequest, convnet, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp(request.param) / "bundle"
    result = dfit("run", str(convnet.vmfb), "--repeat", str(REPEAT), "--driver", request.param, "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert "0 dropped" in result.stdout
    return out


def dispatch_events(bundle: Path) -> list[dict]:
    return [e for e in pq.read_table(bundle / "events.parquet").to_pylist() if e["kind"] == "dispatch"]


def test_bundle_contents(bundle: Path, convnet) -> None:
    assert sorted(p.name for p in bundle.iterdir()) == [
        ".dfit-output.json", "dispatches.csv", "events.csv", "events.parquet", "manifest.json", "sites.parquet", "summary.json",
        "trace.json", "trace.pftrace"]
    sites = convnet.manifest["partitions"]["dispatch_sites"]
    everything = pq.read_table(bundle / "events.parquet").to_pylist()
    events = dispatch_events(bundle)
    assert len(events) == REPEAT * len(sites)
    for invocation in range(REPEAT):
        rows = [e for e in events if e["invocation"] == invocation]
        assert [e["root_id"] for e in rows] == [s["root_id"] for s in sites]
        assert [e["partition"] for e in rows] == [s["export"] for s in sites]
    summary = json.loads((bundle / "summary.json").read_text())
    assert summary["counts"]["seen"] == summary["counts"]["kept"] == len(everything)
    assert summary["records"]["dispatch"] == REPEAT * len(sites)
    assert summary["dropped_events"] == 0 and summary["inputs"] == [{"shape": [1, 32, 32, 3], "dtype": "f32", "made": "random-normal"}]
    # Non-model runtime records: each invocation submits and executes its command
    # buffer and allocates its transients; every one is kept, with its invocation.
    by_kind: dict[str, set[str]] = {}
    for event in everything:
        by_kind.setdefault(event["kind"], set()).add(event["partition"])
        assert event["invocation"] in range(REPEAT)
    assert {"submit execute", "host execute", "submit alloca", "host alloca"} <= by_kind["queue"]
    assert "queue_alloca" in by_kind["memory"]
    executes = [e for e in everything if e["partition"] == "host execute"]
    assert sorted({e["invocation"] for e in executes}) == list(range(REPEAT))
    memory = [e for e in everything if e["kind"] == "memory"]
    assert all(e["bytes"] is not None and e["bytes"] >= 0 for e in memory)
    assert summary["records"]["queue"] + summary["records"]["memory"] == len(everything) - len(events)
    csv_rows = (bundle / "dispatches.csv").read_text().splitlines()
    assert len(csv_rows) == 1 + len(sites) and all(f",{REPEAT}," in row for row in csv_rows[1:])
    interned = pq.read_table(bundle / "sites.parquet").to_pylist()
    assert "main/linalg.generic#0" in interned[0]["ids"]


def test_perfetto_trace_parses(bundle: Path, convnet) -> None:
    tracks, named = read_pftrace(bundle / "trace.pftrace")
    assert {"invocation 0", "invocation 1", "invocation 2", "stage: runtime", "queue: host execute",
            "memory: queue_alloca"} <= set(tracks.values())
    events = [packet for packet, _, _ in named]
    begins = [p for p in events if p.track_event.type == TrackEvent.TYPE_SLICE_BEGIN]
    ends = [p for p in events if p.track_event.type == TrackEvent.TYPE_SLICE_END]
    instants = [p for p in events if p.track_event.type == TrackEvent.TYPE_INSTANT]
    summary = json.loads((bundle / "summary.json").read_text())
    assert len(begins) == len(ends) and len(begins) + len(instants) == summary["trace_slices"]
    invocation_tracks = {uuid for uuid, name in tracks.items() if name.startswith("invocation ")}
    dispatches = [(name, args) for packet, name, args in named
                  if packet.track_event.type == TrackEvent.TYPE_SLICE_BEGIN
                  and packet.track_event.track_uuid in invocation_tracks]
    assert len(dispatches) == REPEAT * 6
    name, args = dispatches[0]
    # Module path + op in the name (what a person tells slices apart by); the stable ID
    # in an arg a browser view links back by.
    assert name == "conv1 linalg.conv_2d_nhwc_hwcf"
    assert (args["op_id"], args["module_path"], args["op"]) == (
        "main/linalg.conv_2d_nhwc_hwcf#0", "conv1", "linalg.conv_2d_nhwc_hwcf")
    assert args["fused_modules"] == "conv1, relu1"
    assert args["site"] == 0 and args["macs"] > 0
    assert args["source"] == "convnet.py:21:16" and args["stage"] == "runtime"
    assert "main/linalg.generic#0" in args["fused_ids"]
    # Slices on one track nest: each end closes the most recent open begin of its track.
    open_slices: dict[int, list[int]] = {}
    for packet in events:
        stack = open_slices.setdefault(packet.track_event.track_uuid, [])
        if packet.track_event.type == TrackEvent.TYPE_SLICE_BEGIN:
            stack.append(packet.timestamp)
        elif packet.track_event.type == TrackEvent.TYPE_SLICE_END:
            assert packet.timestamp >= stack.pop()
    assert not any(open_slices.values())


def test_chrome_trace_json(bundle: Path) -> None:
    document = json.loads((bundle / "trace.json").read_text())
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in document["traceEvents"] if e["name"] == "thread_name"}
    slices = [e for e in document["traceEvents"] if e["ph"] == "X" and e["args"]["kind"] == "dispatch"]
    assert len(slices) == REPEAT * 6
    assert {threads[(e["pid"], e["tid"])] for e in slices} == {"invocation 0", "invocation 1", "invocation 2"}
    assert slices[0]["args"]["root_id"] == "main/linalg.conv_2d_nhwc_hwcf#0"


def test_foreign_manifest_is_refused(convnet, tmp_path: Path) -> None:
    other = compile_instrumented(REPO / "tests" / "inputs" / "repeated_blocks.mlir", tmp_path / "other.vmfb", mode="ids")
    result = dfit("run", str(convnet.vmfb), "--manifest", str(other.manifest_path), "-o", str(tmp_path / "b"))
    assert result.returncode == 2
    assert "was not written for" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("inputs, message", [
    (["1x32x32x4xf32=1"], "input 0 is 1x32x32x4xf32, the function takes 1x32x32x3xf32"),
    (["1x32x32x3xi8=1"], "input 0 is 1x32x32x3xi8, the function takes 1x32x32x3xf32"),
    (["1x32x32x3xf32=1", "2xf32=1"], "the function takes 1 input(s) (1x32x32x3xf32), 2 given"),
])
def test_bad_inputs_leave_the_old_bundle(convnet, tmp_path: Path, inputs: list[str], message: str) -> None:
    bundle = tmp_path / "b"
    bundle.mkdir()
    (bundle / "previous.txt").write_text("kept")
    outputs.write_marker(bundle, "bundle")  # a previous dfit bundle: replaceable, so only the bad input stops it
    result = dfit("run", str(convnet.vmfb), *(f"--input={value}" for value in inputs), "-o", str(bundle))
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr
    assert sorted(p.name for p in bundle.iterdir()) == [".dfit-output.json", "previous.txt"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".b.")]


def test_missing_vmfb(tmp_path: Path) -> None:
    result = dfit("run", str(tmp_path / "none.vmfb"), "-o", str(tmp_path / "b"))
    assert result.returncode == 2 and "none.vmfb: no such file" in result.stderr


def test_ids_mode_times_invocations_in_process(convnet, tmp_path: Path) -> None:
    out = tmp_path / "ids"
    result = dfit("run", str(convnet.vmfb), "--mode", "ids", "--repeat", "4", "--warmup", "2",
                  "--input=1x32x32x3xf32=0.25", "-o", str(out))
    assert result.returncode == 0, result.stderr
    events = pq.read_table(out / "events.parquet").to_pylist()
    assert [e["kind"] for e in events] == ["program"] * 4
    assert [e["invocation"] for e in events] == [0, 1, 2, 3]
    assert all(e["partition"] == "main" and e["root_id"] is None and e["site"] is None and e["duration_ns"] > 0
               for e in events)
    assert all(b["start_ns"] >= a["start_ns"] + a["duration_ns"] for a, b in zip(events, events[1:], strict=False))
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["mode"], summary["repeat"], summary["warmup"]) == ("ids", 4, 2)
    _, events = read_pftrace(out / "trace.pftrace")
    assert {name for _, name, _ in events if name} == {"program main"}


def test_full_mode_warmup_sampling_and_inputs_dir(convnet, tmp_path: Path) -> None:
    import numpy as np

    inputs = tmp_path / "inputs"
    inputs.mkdir()
    np.save(inputs / "0.npy", np.ones((1, 32, 32, 3), np.float32))
    out = tmp_path / "full"
    result = dfit("run", str(convnet.vmfb), "--repeat", "4", "--warmup", "1", "--sample", "0.5",
                  "--inputs-from", str(inputs), "--driver", "local-sync", "-o", str(out))
    assert result.returncode == 0, result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["records"]["dispatch"] == 4 * 6  # the warm-up invocation is not recorded
    # The warm-up invocation's records, every family's (its dispatches too): this program
    # makes the same records in each invocation, so as many as a recorded one's.
    records = summary["records"]
    assert records["warmup_records_dropped"] == (records["dispatch"] + records["queue"] + records["memory"]) // 4 > 6
    assert summary["counts"]["sampled_out"] == 12  # sampling applies to dispatches
    # The per-invocation figures are the run's, every dispatch record's, sampled out or not.
    assert summary["dispatch_ns_per_invocation"]["count"] == 4 and "dropped" in summary["per_invocation_from"]
    events = dispatch_events(out)
    assert [e["site"] for e in events] == [0, 2, 4] * 4
    assert [e["invocation"] for e in events] == [0] * 3 + [1] * 3 + [2] * 3 + [3] * 3


def test_id_filter(convnet, tmp_path: Path) -> None:
    out = tmp_path / "filtered"
    result = dfit("run", str(convnet.vmfb), "--ids", "main/linalg.matmul#*", "-o", str(out))
    assert result.returncode == 0, result.stderr
    events = dispatch_events(out)
    assert [e["root_id"] for e in events] == ["main/linalg.matmul#0", "main/linalg.matmul#1"]
    assert json.loads((out / "summary.json").read_text())["counts"]["filtered"] == 4


def test_a_full_run_does_not_load_the_compiler_bindings(convnet, tmp_path: Path) -> None:
    """`dfit run --mode full` reads only the manifest: importing IREE's MLIR bindings
    (``iree.compiler.ir``) would add about 110 MiB to every run's peak memory (issue 29)."""
    code = ("import sys\nfrom dfit_mlir.__main__ import main\n"
            f"sys.argv = ['dfit', 'run', {str(convnet.vmfb)!r}, '--mode', 'full', '--repeat', '3', '-o', "
            f"{str(tmp_path / 'run')!r}]\n"
            "try:\n    main()\nexcept SystemExit as done:\n    assert not done.code, done.code\n"
            "print(sorted(name for name in sys.modules if name.startswith('iree.compiler')))")
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert found.stdout.strip().splitlines()[-1] == "[]", found.stdout + found.stderr
    assert (tmp_path / "run" / "events.parquet").is_file()


@pytest.mark.parametrize("route", ["windowed", "whole run"])
def test_a_profile_event_ending_before_it_begins_writes_no_bundle(convnet, tmp_path: Path, route: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A damaged profile whose last queue event is ready 15 ms before it was submitted
    (one flipped byte does that) would give an event of negative duration, which every
    reader of the bundle refuses: the run refuses it instead (exit 2 saying so), by
    either route, and writes nothing."""
    import numpy as np

    from dfit_mlir.cli.app import main
    from dfit_mlir.runtime_hooks import profile_file as pf
    from dfit_mlir.runtime_hooks import profile_stream, run
    from dfit_mlir.runtime_hooks.profile_stream import WindowedRouteUnavailable

    finish = run.StartedRun.finish

    def damaged(started, *args, **kwargs):
        recorded = finish(started, *args, **kwargs)
        index = profile_stream.index_profile(recorded.path)
        queue = np.flatnonzero(index.chunk_family == profile_stream.QUEUE)[-1]
        dtype = pf.FAMILY_DTYPES["queue-events"]
        at = int(index.chunk_payload_at[queue]) + (int(index.chunk_records[queue]) - 1) * dtype.itemsize
        with open(recorded.path, "r+b") as handle:
            handle.seek(at)
            event = np.frombuffer(handle.read(dtype.itemsize), dtype).copy()
            event["ready_host_time_ns"] = event["host_time_ns"] - 15_000_000
            handle.seek(at)
            handle.write(event.tobytes())
        return recorded

    monkeypatch.setattr(run.StartedRun, "finish", damaged)
    if route == "whole run":
        def unavailable(*args, **kwargs):
            raise WindowedRouteUnavailable("the test takes the whole-run route")

        monkeypatch.setattr(run.WindowedRun, "open", unavailable)
    from click.testing import CliRunner

    result = CliRunner().invoke(main, ["run", str(convnet.vmfb), "--mode", "full", "--repeat", "3", "-o",
                                       str(tmp_path / "run")], prog_name="dfit")
    assert result.exit_code == 2, (result.output, result.exception)
    assert run.PROFILE_SOURCE in result.stderr and "'duration_ns'" in result.stderr and "is negative" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "run").exists() and not list(tmp_path.iterdir())
