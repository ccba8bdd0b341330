"""`dfit run --mode full` on programs of every shape (``tests/inputs/shapes``): each
runtime dispatch lands on the call site that issued it — checked against what the test
knows independently of the join: the export the runtime recorded, its workgroup count,
and the source op the program text puts in each branch, loop and function — on
``local-task`` and ``local-sync``; every queue and memory record sits in the invocation
of its submission; what cannot be joined is an error that shows the record."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from dfit_mlir.passes.instrumented_compile import CompileResult, compile_instrumented
from dfit_mlir.runtime_hooks import hal_profile
from dfit_mlir.runtime_hooks.run import run_bundle
from tests.conftest import REPO

SHAPES = REPO / "tests" / "inputs" / "shapes"
DRIVERS = hal_profile.DRIVERS
#: Each program's compile flags (the initializer must survive compile-time evaluation).
FLAGS = {"initializer": ("--iree-opt-const-eval=false",), "async": ("--iree-execution-model=async-external",)}
SOURCES = {"loop": "loop.mlir", "branch": "branch.mlir", "two": "two_functions.mlir",
           "initializer": "initializer.mlir", "async": "two_functions.mlir", "fault": "gather_fault.mlir",
           "shared": "loop_shared_export.mlir"}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, CompileResult]:
    root = tmp_path_factory.mktemp("shapes")
    return {name: compile_instrumented(SHAPES / source, root / f"{name}.vmfb", mode="ids", flags=FLAGS.get(name, ()))
            for name, source in SOURCES.items()}


def dispatches(bundle: Path) -> list[dict]:
    return [e for e in pq.read_table(bundle / "events.parquet").to_pylist() if e["kind"] == "dispatch"]


def run(result: CompileResult, out: Path, *inputs: str, **options) -> Path:
    return run_bundle(result.vmfb, result.manifest_path, out, inputs=inputs, **options).bundle


def by_invocation(events: list[dict]) -> dict[int, list[dict]]:
    grouped: dict[int, list[dict]] = {}
    for event in sorted(events, key=lambda e: e["start_ns"]):
        grouped.setdefault(event["invocation"], []).append(event)
    return grouped


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("trips", [0, 1, 3])
def test_loop_trip_count_from_an_input(compiled, tmp_path: Path, driver: str, trips: int) -> None:
    bundle = run(compiled["loop"], tmp_path / "b", "16x16xf32=0.1", f"i32={trips}", driver=driver, repeat=2,
                 warmup=1)
    grouped = by_invocation(dispatches(bundle))
    assert sorted(grouped) == [0, 1]
    for events in grouped.values():
        # Runtime order of exports (what the profiler recorded) is the program's: x+x,
        # the matmul once per trip, exp.
        kinds = ["matmul" if "matmul" in e["partition"] else "elementwise" for e in events]
        assert kinds == ["elementwise", *["matmul"] * trips, "elementwise"]
        assert [e["root_id"] for e in events] == ["main/linalg.generic#0", *["main/scf.for#0/linalg.matmul#0"] * trips,
                                                   "main/linalg.generic#1"]
        # 16x16x16 matmul: 2 workgroups; the 256-element elementwise ops: 1.
        assert [e["workgroups"] for e in events] == [1, *[2] * trips, 1]


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("trips", [0, 2])
def test_one_export_in_two_command_buffers(compiled, tmp_path: Path, driver: str, trips: int) -> None:
    recordings = compiled["shared"].manifest["partitions"]["recordings"]
    exports = [c["export"] for r in recordings for c in r["commands"] if "export" in c]
    assert exports[0] == exports[-1] and len(set(exports)) == 2  # exp before and after: one export
    bundle = run(compiled["shared"], tmp_path / "b", "16x16xf32=0.1", f"i32={trips}", driver=driver, repeat=2)
    for events in by_invocation(dispatches(bundle)).values():
        assert [e["root_id"] for e in events] == ["main/linalg.generic#0", *["main/scf.for#0/linalg.matmul#0"] * trips,
                                                   "main/linalg.generic#1"]
        assert [e["workgroups"] for e in events] == [1, *[2] * trips, 1]


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("taken", [True, False])
def test_branch_runs_one_side(compiled, tmp_path: Path, driver: str, taken: bool) -> None:
    bundle = run(compiled["branch"], tmp_path / "b", "16x16xf32=0.1", f"i32={int(taken)}", driver=driver, repeat=2)
    events = dispatches(bundle)
    assert len(events) == 2 and {e["invocation"] for e in events} == {0, 1}
    for event in events:
        if taken:
            assert "matmul" in event["partition"] and event["root_id"] == "main/scf.if#0/linalg.matmul#0"
            assert event["workgroups"] == 2
        else:
            assert "elementwise" in event["partition"] and event["root_id"] == "main/scf.if#0/linalg.generic#0"


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("function", ["first", "second"])
def test_two_public_functions_run_one_at_a_time(compiled, tmp_path: Path, driver: str, function: str) -> None:
    bundle = run(compiled["two"], tmp_path / "b", "16x16xf32=1" if function == "first" else "32x32xf32=1",
                 driver=driver, function=function, repeat=3)
    events = dispatches(bundle)
    assert events and all(e["root_id"].startswith(f"{function}/") for e in events)
    assert all(e["partition"].startswith(f"{function}_dispatch") for e in events)
    assert Counter(e["invocation"] for e in events) == {k: len(events) // 3 for k in range(3)}
    if function == "second":  # 32x32x32 matmul: 4 workgroups
        assert [e["workgroups"] for e in events if "matmul" in e["partition"]] == [4, 4, 4]


def test_entry_points_come_from_the_export_table(compiled, tmp_path: Path) -> None:
    from dfit_mlir.core.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match=r"exports 2 functions \(first, second\); choose one with --function"):
        run(compiled["two"], tmp_path / "b")
    with pytest.raises(InvalidInputError, match=r"exports no function 'helper' \(it exports first, second\)"):
        run(compiled["two"], tmp_path / "b", function="helper")
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("driver", DRIVERS)
def test_async_variant(compiled, tmp_path: Path, driver: str) -> None:
    bundle = run(compiled["async"], tmp_path / "b", "32x32xf32=1", driver=driver, function="second", repeat=2)
    events = dispatches(bundle)
    assert [e["workgroups"] for e in events if "matmul" in e["partition"]] == [4, 4]
    assert all(e["root_id"].startswith("second/") for e in events)


@pytest.mark.parametrize("driver", DRIVERS)
def test_initializer_dispatch_is_load_time(compiled, tmp_path: Path, driver: str) -> None:
    sites = compiled["initializer"].manifest["partitions"]["dispatch_sites"]
    load = [s for s in sites if s["phase"] == "load"]
    assert [s["root_id"] for s in load] == ["module/util.initializer#0/linalg.generic#0"]
    assert load[0]["export"].startswith("_initializer_0_dispatch")
    bundle = run(compiled["initializer"], tmp_path / "b", "8x64xf32=1", driver=driver, repeat=2, warmup=1)
    events = dispatches(bundle)
    # The pinned tools start profiling after the module is loaded: the initializer's
    # dispatch is not recorded, and no invocation counts it.
    assert [e["root_id"] for e in events] == ["main/linalg.matmul#0"] * 2
    summary = json.loads((bundle / "summary.json").read_text())
    assert summary["load_time"]["dispatches"] == 0 and summary["records"]["dispatch"] == 2


def test_queue_and_memory_records_sit_in_their_invocation(compiled, tmp_path: Path) -> None:
    """local-task numbers allocations: each transient is allocated and freed in the same
    invocation (the dealloca of invocation k is not invocation k+1's), and every
    invocation of the same inputs issues the same records."""
    bundle = run(compiled["loop"], tmp_path / "b", "16x16xf32=0.1", "i32=2", driver="local-task", repeat=3, warmup=1)
    rows = [e for e in pq.read_table(bundle / "events.parquet").to_pylist() if e["kind"] in ("queue", "memory")]
    assert rows and all(e["invocation"] in (0, 1, 2) for e in rows)
    owner: dict[int, set[int]] = {}
    for event in rows:
        allocation = json.loads(event["attributes"] or "{}").get("allocation_id")
        if allocation:
            owner.setdefault(allocation, set()).add(event["invocation"])
    assert owner and all(len(invocations) == 1 for invocations in owner.values())
    per_invocation = [Counter(e["partition"] for e in rows if e["invocation"] == k) for k in range(3)]
    assert per_invocation[0] == per_invocation[1] == per_invocation[2]
    assert per_invocation[0]["host dealloca"] == per_invocation[0]["submit dealloca"] > 0


def test_unexplained_and_ambiguous_records_are_errors(compiled) -> None:
    result = compiled["loop"]
    events = hal_profile.capture(result.vmfb, ["16x16xf32=0.1", "i32=1"], driver="local-task")
    wrong = copy.deepcopy(result.manifest)
    for recording in wrong["partitions"]["recordings"]:
        for command in recording["commands"]:
            if "matmul" in command.get("export", ""):
                command["export"] = "other_export"
    with pytest.raises(hal_profile.UnresolvedDispatchError,
                       match=r"\(export main_dispatch_1_matmul\w*, submission \d+, command buffer \d+, command 2, "
                             r"workgroups 2x1x1\)\) is explained by no command-buffer recording .* candidates: #0"):
        hal_profile.join_structural(events, wrong, "main", 1)
    twin = copy.deepcopy(result.manifest)
    recordings = twin["partitions"]["recordings"]
    # A twin recorded where it runs (no memoized buffer, so no creation order to go by).
    recordings.append({**copy.deepcopy(recordings[1]), "index": len(recordings), "global_name": None})
    with pytest.raises(hal_profile.UnresolvedDispatchError, match=r"explained equally by recordings #1 .*, #3 "):
        hal_profile.join_structural(events, twin, "main", 1)


def test_plain_vmfb_runs_without_a_manifest(tmp_path: Path) -> None:
    from dfit_mlir.passes.plain_compile import plain_compile

    vmfb = tmp_path / "plain.vmfb"
    plain_compile(SHAPES / "two_functions.mlir", vmfb, [])
    for mode in ("none", "ids"):
        result = run_bundle(vmfb, None, tmp_path / mode, mode=mode, function="second", repeat=2)
        assert result.summary["invocations"] == 2 and result.summary["manifest"] is None
        assert result.summary["inputs"] == [{"shape": [32, 32], "dtype": "f32", "made": "random-normal"}]
    cli = subprocess.run([sys.executable, "-m", "dfit_mlir", "run", str(vmfb), "--function", "first", "-o",
                          str(tmp_path / "full")], capture_output=True, text=True)
    assert cli.returncode == 2 and not (tmp_path / "full").exists()
    assert cli.stderr.strip() == (f"dfit: {tmp_path / 'plain.manifest.json'}: no such file; --mode full needs the "
                                  "manifest of a `dfit compile --dfit-tag` (--mode none and ids run any vmfb)")


@pytest.mark.parametrize("mode", ["full", "ids"])
def test_a_module_fault_is_one_line_exit_3_and_no_bundle(compiled, tmp_path: Path, mode: str) -> None:
    result = compiled["fault"]
    out = tmp_path / "bundle"
    cli = subprocess.run([sys.executable, "-m", "dfit_mlir", "run", str(result.vmfb), "--mode", mode,
                          "--input", "8xf32=1", "--input", "4xi64=1000000000000000", "-o", str(out)],
                         capture_output=True, text=True)
    assert cli.returncode == 3
    tool = "iree-run-module" if mode == "full" else "the in-process runtime"
    assert cli.stderr.startswith(f"dfit: {result.vmfb}: main faulted with SIGSEGV in {tool}")
    assert "invocation 1 of 1" in cli.stderr and "4xi64=1000000000000000" in cli.stderr
    assert len(cli.stderr.strip().splitlines()) == 1 and "Traceback" not in cli.stderr
    assert list(tmp_path.iterdir()) == []  # no bundle, no temporary directory beside it
    # Default inputs of the same module: the index defaults to 0, which the model can take.
    ok = run_bundle(result.vmfb, result.manifest_path, tmp_path / "ok", mode=mode)
    assert [i["made"] for i in ok.summary["inputs"]] == ["random-normal", "zeros"]


@pytest.mark.frontends
def test_jax_program_with_private_helpers_and_a_one_hot(tmp_path: Path) -> None:
    """A JAX program (one public main; private _one_hot and log_softmax helpers) runs
    with default inputs: main is the entry point, and the labels are below the one-hot
    depth."""
    import jax
    import jax.numpy as jnp

    def loss(x, labels):
        logits = x @ jnp.ones((8, 4))
        return -(jax.nn.log_softmax(logits) * jax.nn.one_hot(labels, 4)).sum()

    source = tmp_path / "loss.mlir"
    source.write_text(jax.jit(loss).lower(jnp.ones((2, 8)), jnp.zeros((2,), jnp.int32)).as_text(debug_info=True))
    assert "func.func private @log_softmax" in source.read_text()
    compiled = compile_instrumented(source, tmp_path / "loss.vmfb", mode="ids")
    result = run_bundle(compiled.vmfb, compiled.manifest_path, tmp_path / "b", repeat=2)
    assert result.summary["function"] == "main"
    assert [(i["made"], i.get("bound")) for i in result.summary["inputs"]] == [("random-normal", None),
                                                                               ("integers-below", 4)]
    events = dispatches(result.bundle)
    assert events and all(e["site"] is not None and e["root_id"] for e in events)


def test_every_site_has_its_root_among_its_fused_ids(compiled) -> None:
    for name, result in compiled.items():
        sites = result.manifest["partitions"]["dispatch_sites"]
        assert sites, name
        for site in sites:
            assert site["root_id"] in site["fused_ids"], (name, site)
            assert site["recording"] is not None and site["command_index"] is not None, (name, site)
