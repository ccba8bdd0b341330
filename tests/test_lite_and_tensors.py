"""`lite` mode (function-boundary probes received by the in-process hook module), the
in-process API, and tensor statistics from ``flow.tensor.trace`` ops keyed by IDs."""

from __future__ import annotations

import json
import subprocess
import sys
from array import array
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TrackEvent

import dfit_mlir
from dfit_mlir.core.errors import UnresolvedRecordError
from dfit_mlir.core.toolchain import runtime_tool
from dfit_mlir.passes.instrumented_compile import compile_instrumented
from dfit_mlir.runtime_hooks import hal_profile
from dfit_mlir.runtime_hooks.inprocess import Runner
from dfit_mlir.runtime_hooks.probes import pair_spans
from dfit_mlir.runtime_hooks.tensors import TensorPolicy
from tests.conftest import CONVNET, read_pftrace

DFIT = [sys.executable, "-m", "dfit_mlir"]
TRACED = ("main/linalg.matmul#*", "linalg.softmax")
X = np.linspace(-1, 1, 32 * 32 * 3, dtype=np.float32).reshape(1, 32, 32, 3)


def dfit(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DFIT, *args], capture_output=True, text=True)


@pytest.fixture(scope="module")
def lite(tmp_path_factory: pytest.TempPathFactory):
    return compile_instrumented(CONVNET, tmp_path_factory.mktemp("lite") / "convnet.vmfb", mode="lite")


@pytest.fixture(scope="module")
def plain_ids(tmp_path_factory: pytest.TempPathFactory):
    return compile_instrumented(CONVNET, tmp_path_factory.mktemp("ids") / "convnet.vmfb", mode="ids")


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory):
    return compile_instrumented(CONVNET, tmp_path_factory.mktemp("traced") / "convnet.vmfb", mode="ids",
                                trace_tensors=TRACED)


def test_probes_keep_the_dispatches(lite, plain_ids) -> None:
    assert lite.manifest["probes"] == [{"site": 0, "function": "main", "edge": "begin"},
                                       {"site": 1, "function": "main", "edge": "end"}]
    assert plain_ids.manifest["probes"] == []
    exports = [[e["name"] for e in m.manifest["partitions"]["exports"]] for m in (lite, plain_ids)]
    assert exports[0] == exports[1]
    sites = [[(s["export"], s["root_id"]) for s in m.manifest["partitions"]["dispatch_sites"]]
             for m in (lite, plain_ids)]
    assert sites[0] == sites[1]


@pytest.mark.parametrize("driver", ["local-sync", "local-task"])
def test_instrument_api_records_program_and_function_events(lite, driver: str) -> None:
    with dfit_mlir.instrument(lite.vmfb, mode="lite", driver=driver) as module:
        outputs = [np.asarray(module.main(X)) for _ in range(3)]
        events = module.events().to_pylist()
        assert module.summary()["probe_calls"] == 6
    programs = [e for e in events if e["kind"] == "program"]
    functions = [e for e in events if e["kind"] == "function"]
    assert [e["invocation"] for e in programs] == [e["invocation"] for e in functions] == [0, 1, 2]
    for program, function in zip(programs, functions, strict=True):
        assert function["partition"] == program["partition"] == "main"
        # The function runs inside the program call.
        assert program["start_ns"] <= function["start_ns"]
        assert function["start_ns"] + function["duration_ns"] <= program["start_ns"] + program["duration_ns"]
        assert function["duration_ns"] > 0
    # Same numbers as the module run with no hook module at all (the probes fall back).
    with Runner(lite.vmfb, driver) as runner:
        bare = np.asarray(runner.function("main")(X))
    assert all(np.array_equal(output, bare) for output in outputs)
    assert np.isclose(bare.sum(), 1.0, atol=1e-5)


def test_lite_vmfb_runs_in_iree_run_module(lite) -> None:
    """The shipped tool has no `dfit` module: the optional import falls back."""
    run = subprocess.run([runtime_tool("iree-run-module"), f"--module={lite.vmfb}", "--device=local-sync",
                          "--function=main", "--input=1x32x32x3xf32=0.5"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1].startswith("1x10xf32=[")


def test_lite_bundle_nests_functions_in_programs(lite, tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    result = dfit("run", str(lite.vmfb), "--mode", "lite", "--repeat", "2", "--warmup", "1",
                  "--driver", "local-sync", "-o", str(out))
    assert result.returncode == 0, result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["mode"] == "lite" and summary["module_has_probes"] and summary["probe_calls"] == 6
    events_csv = (out / "events.csv").read_text()
    assert '"function","main",2,' in events_csv and '"program","main",2,' in events_csv
    # Queue events of the same invocations, from the profiled second pass.
    queue = [e for e in pq.read_table(out / "events.parquet").to_pylist() if e["kind"] == "queue"]
    assert {e["invocation"] for e in queue} == {0, 1}
    assert {"submit execute", "host execute"} <= {e["partition"] for e in queue}
    assert all(json.loads(e["attributes"])["pass"] == "queue-profile" for e in queue)
    assert summary["queue_pass"]["queue_events"] == len(queue)
    tracks, events = read_pftrace(out / "trace.pftrace")
    on_invocations = [event for event in events if tracks[event[0].track_event.track_uuid].startswith("invocation")]
    # The writer emits each slice's end right after its begin.
    spans = {(tracks[b.track_event.track_uuid], name): (b.timestamp, e.timestamp)
             for (b, name, _), (e, _, _) in zip(on_invocations[::2], on_invocations[1::2], strict=True)}
    assert sorted(spans) == [("invocation 0", "function main"), ("invocation 0", "program main"),
                             ("invocation 1", "function main"), ("invocation 1", "program main")]
    for invocation in ("invocation 0", "invocation 1"):
        program, function = spans[(invocation, "program main")], spans[(invocation, "function main")]
        assert program[0] <= function[0] < function[1] <= program[1]


def test_event_budget_counts_what_it_drops(lite, tmp_path: Path) -> None:
    out = tmp_path / "budget"
    result = dfit("run", str(lite.vmfb), "--mode", "lite", "--repeat", "3", "--max-events", "2", "-o", str(out))
    assert result.returncode == 0, result.stderr
    summary = json.loads((out / "summary.json").read_text())
    # 3 program + 3 function events + the queue pass's, 2 kept: the others are counted,
    # not lost silently.
    assert pq.read_table(out / "events.parquet").num_rows == 2
    dropped = 3 + 3 + summary["queue_pass"]["queue_events"] - 2
    assert summary["dropped_events"] == dropped and f"{dropped} dropped" in result.stdout


def test_none_mode_records_timing_only(lite, tmp_path: Path) -> None:
    out = tmp_path / "none"
    result = dfit("run", str(lite.vmfb), "--mode", "none", "--repeat", "3", "-o", str(out))
    assert result.returncode == 0, result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["counts"]["seen"] == 0 and pq.read_table(out / "events.parquet").num_rows == 0
    assert summary["invocation_ns"]["count"] == 3 and summary["invocation_ns"]["min"] > 0


def test_tensor_statistics_match_the_values(traced) -> None:
    keys = {t["id"] for t in traced.manifest["tensor_traces"]}
    assert keys == {"main/linalg.matmul#0", "main/linalg.matmul#1", "main/linalg.softmax#0"}
    with dfit_mlir.instrument(traced.vmfb, mode="ids", tensors=TensorPolicy(("*",), values=10)) as module:
        output = np.asarray(module.main(X))
        events = [e for e in module.events().to_pylist() if e["kind"] == "tensor"]
    by_id = {e["root_id"]: e for e in events}
    assert sorted(by_id) == sorted(keys)
    softmax = by_id["main/linalg.softmax#0"]
    # The traced softmax is the function's result: statistics and kept values agree.
    assert softmax["tensor_mean"] == pytest.approx(0.1, abs=1e-6)
    assert softmax["tensor_min"] == pytest.approx(float(output.min()))
    assert softmax["tensor_max"] == pytest.approx(float(output.max()))
    assert softmax["tensor_std"] == pytest.approx(float(output.astype(np.float64).std()), rel=1e-5)
    assert softmax["tensor_nans"] == softmax["tensor_infs"] == 0
    attributes = json.loads(softmax["attributes"])
    assert attributes["shape"] == [1, 10] and attributes["dtype"] == "float32"
    assert np.allclose(attributes["values"], output.ravel())
    assert by_id["main/linalg.matmul#0"]["bytes"] == 32 * 4


def test_tensor_filter_and_sampling(traced) -> None:
    policy = TensorPolicy(("main/linalg.matmul#1",), sample_every=2)
    with dfit_mlir.instrument(traced.vmfb, mode="ids", tensors=policy) as module:
        for _ in range(4):
            module.main(X)
        tensors = [e for e in module.events().to_pylist() if e["kind"] == "tensor"]
        counts = module.summary()["tensor_traces"]
    assert [(e["root_id"], e["invocation"]) for e in tensors] == [("main/linalg.matmul#1", 0),
                                                                ("main/linalg.matmul#1", 2)]
    assert counts["calls"] == 12 and counts["filtered"] == 8 and counts["sampled_out"] == 2


def test_traced_module_without_a_request_prints_nothing(traced, capfd: pytest.CaptureFixture[str]) -> None:
    """IREE prints traced tensors when no sink is installed; dfit always installs one."""
    with dfit_mlir.instrument(traced.vmfb, mode="ids") as module:
        module.main(X)
        assert not [e for e in module.events().to_pylist() if e["kind"] == "tensor"]
        assert module.summary()["tensor_traces"]["filtered"] == 3
    captured = capfd.readouterr()
    assert "dfit:" not in captured.out + captured.err


def test_run_with_tensors_writes_tensor_events(traced, tmp_path: Path) -> None:
    out = tmp_path / "tensors"
    result = dfit("run", str(traced.vmfb), "--mode", "ids", "--tensors", "*softmax*", "--repeat", "2",
                  "-o", str(out))
    assert result.returncode == 0, result.stderr
    tensors = [e for e in pq.read_table(out / "events.parquet").to_pylist() if e["kind"] == "tensor"]
    assert [(e["root_id"], e["invocation"]) for e in tensors] == [("main/linalg.softmax#0", 0),
                                                                ("main/linalg.softmax#0", 1)]
    _, events = read_pftrace(out / "trace.pftrace")
    instants = [name for packet, name, _ in events if packet.track_event.type == TrackEvent.TYPE_INSTANT]
    assert instants == ["softmax linalg.softmax"] * 2  # module path + op (the ID is an arg)


@pytest.mark.parametrize("args, message", [
    (["--mode", "full", "--tensors", "*"], "--tensors needs an in-process mode"),
    (["--mode", "ids", "--tensors", " , "], "--tensors needs at least one glob"),
])
def test_tensor_option_errors(traced, tmp_path: Path, args: list[str], message: str) -> None:
    result = dfit("run", str(traced.vmfb), *args, "-o", str(tmp_path / "b"))
    assert result.returncode == 2 and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "b").exists()


def test_tensors_on_an_untraced_module(lite, tmp_path: Path) -> None:
    result = dfit("run", str(lite.vmfb), "--mode", "lite", "--tensors", "*", "-o", str(tmp_path / "b"))
    assert result.returncode == 2 and "traces no tensors: compile it with `dfit compile --tensors" in result.stderr


def test_compile_tensors_needs_tagging(tmp_path: Path) -> None:
    result = dfit("compile", str(CONVNET), "--tensors", "*", "-o", str(tmp_path / "m.vmfb"))
    assert result.returncode == 2 and "--tensors needs --dfit-tag" in result.stderr


def test_in_process_full_mode_is_refused(lite) -> None:
    with pytest.raises(dfit_mlir.runtime_hooks.instrument.InvalidInputError, match="dfit run --mode full"):
        dfit_mlir.instrument(lite.vmfb, mode="full")


def test_unresolved_probe_records_are_errors() -> None:
    sites = [{"function": "main", "edge": "begin"}, {"function": "main", "edge": "end"}]
    with pytest.raises(UnresolvedRecordError, match="site 7, but the manifest lists 2 probe sites"):
        pair_spans(array("i", [0, 7]), array("q", [1, 2]), sites)
    with pytest.raises(UnresolvedRecordError, match="still open: main"):
        pair_spans(array("i", [0]), array("q", [1]), sites)


def test_unknown_host_operation_is_an_error() -> None:
    records = [{"event_id": 1, "op": "dispatch"}, {"event_id": 2, "op": "alloca"}]
    assert [r["op"] for r in hal_profile.non_model_operations(records)] == ["alloca"]
    with pytest.raises(UnresolvedRecordError, match="record 3 has operation 'teleport'"):
        hal_profile.non_model_operations([*records, {"event_id": 3, "op": "teleport"}])
