"""`dfit run --repeat N` on functions whose every command-buffer execution sits under
control flow (``tests/inputs/shapes/control_flow_first.mlir``: a loop first, a
data-dependent ``scf.while`` first, an ``scf.if`` at the top; several entry points) and
on a JAX greedy-decode ``lax.while_loop``: invocations are the benchmark tool's
iterations (one profile flush each, ``runtime_hooks/profile_flushes.py``), so each one
gets exactly its own dispatches and queue records. Checked against what the test
computes from the inputs alone: host-side call counters make the trip count and the
branch differ from call to call, so a split that was off by one call, or that assumed
equal calls, would show. A shape that cannot be split (some calls issue no device work)
is an error that names it, and ``--repeat 1`` stays correct.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from dfit_mlir.passes.instrumented_compile import CompileResult, compile_instrumented
from dfit_mlir.runtime_hooks import hal_profile
from dfit_mlir.runtime_hooks.run import run_bundle
from tests.conftest import REPO

SOURCE = REPO / "tests" / "inputs" / "shapes" / "control_flow_first.mlir"
DRIVERS = hal_profile.DRIVERS
REPEAT, WARMUP = 5, 1
#: Inputs of each entry point (iree-run-module form).
INPUTS = {
    "loop_first": ["2", "16x16xf32=0.01"],
    "while_first": ["16xf32=0.5", "0.0", "300.0"],
    "if_first": ["1", "16x16xf32=0.01"],
}


def loop_first(call: int) -> Counter:
    """Invocation ``call`` (warm-up included) runs the matmul n + call times, then exp."""
    trips = int(INPUTS["loop_first"][0]) + call
    return Counter({"loop_first/scf.for#0/linalg.matmul#0": trips, "loop_first/linalg.generic#0": 1})


def while_first(call: int) -> Counter:
    """Double x while s < limit, s = sum(x) after each doubling (float32, as the module)."""
    x = np.full(16, 0.5, np.float32)
    s, limit = np.float32(0.0), np.float32(300.0)
    trips = 0
    while s < limit:
        x = x + x
        s = x.sum(dtype=np.float32)
        trips += 1
    return Counter({"while_first/scf.while#0/linalg.generic#0": trips, "while_first/scf.while#0/linalg.generic#1": trips,
                    "while_first/linalg.generic#0": 1})


def if_first(call: int) -> Counter:
    """Two matmuls when p + call is odd, one exp when it is even."""
    if (int(INPUTS["if_first"][0]) + call) % 2:
        return Counter({"if_first/scf.if#0/linalg.matmul#0": 1, "if_first/scf.if#0/linalg.matmul#1": 1})
    return Counter({"if_first/scf.if#0/linalg.generic#0": 1})


EXPECTED = {"loop_first": loop_first, "while_first": while_first, "if_first": if_first}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, CompileResult]:
    root = tmp_path_factory.mktemp("control-flow-first")
    return {mode: compile_instrumented(SOURCE, root / f"{mode}.vmfb", mode=mode) for mode in ("full", "lite")}


def events(bundle: Path) -> list[dict]:
    return pq.read_table(bundle / "events.parquet").to_pylist()


def per_invocation(rows: list[dict], kind: str, key: str) -> dict[int, Counter]:
    grouped: dict[int, Counter] = {}
    for row in rows:
        if row["kind"] == kind:
            grouped.setdefault(row["invocation"], Counter())[row[key]] += 1
    return grouped


def test_no_entry_point_has_an_anchor(compiled) -> None:
    """The premise: nothing runs on the device in these functions' entry blocks."""
    from dfit_mlir.passes.host_calls import anchor

    functions = compiled["full"].manifest["partitions"]["host_functions"]
    for name in [*INPUTS, "loop_only"]:
        assert functions[name]["public"] and anchor(functions, name) is None, name


def expected_executions(manifest: dict, function: str, dispatches: Counter) -> Counter:
    """Recording index -> how often an invocation with ``dispatches`` executes it: each
    of the function's recordings runs as often as its call sites fire (they run together)."""
    sites = manifest["partitions"]["dispatch_sites"]
    runs = Counter()
    for recording in manifest["partitions"]["recordings"]:
        if function not in recording["executors"]:
            continue
        counts = {dispatches[sites[c["site"]]["root_id"]] for c in recording["commands"] if c.get("site") is not None}
        assert len(counts) == 1, (recording["index"], counts)
        runs[recording["index"]] = counts.pop()
    return runs


def executed_recordings(rows: list[dict], manifest: dict, function: str) -> dict[int, Counter]:
    """Recording index -> executions, per invocation, from the queue records alone: the
    function's memoized command buffers are created at load in recording order, so
    their ids sort as the recordings do (README "Run modes")."""
    executes = [r for r in rows if r["kind"] == "queue" and r["partition"] == "submit execute"]
    buffers = sorted({json.loads(r["attributes"])["command_buffer_id"] for r in executes})
    recordings = sorted(r["index"] for r in manifest["partitions"]["recordings"] if function in r["executors"])
    assert len(buffers) == len(recordings)  # every recording ran in some invocation
    recording_of = dict(zip(buffers, recordings, strict=True))
    grouped: dict[int, Counter] = {}
    for row in executes:
        grouped.setdefault(row["invocation"], Counter())[recording_of[json.loads(row["attributes"])["command_buffer_id"]]] += 1
    return grouped


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("function", list(INPUTS))
def test_full_and_lite_split_invocations_by_flush(compiled, tmp_path: Path, function: str, driver: str) -> None:
    expected = [EXPECTED[function](WARMUP + k) for k in range(REPEAT)]
    full = run_bundle(compiled["full"].vmfb, compiled["full"].manifest_path, tmp_path / "full", mode="full",
                      inputs=INPUTS[function], function=function, driver=driver, repeat=REPEAT, warmup=WARMUP)
    rows = events(full.bundle)
    dispatched = [r for r in rows if r["kind"] == "dispatch"]
    assert dispatched and all(r["site"] is not None and r["root_id"] for r in dispatched)  # every one resolved
    by_invocation = per_invocation(rows, "dispatch", "root_id")
    assert [by_invocation.get(k, Counter()) for k in range(REPEAT)] == expected
    assert full.summary["records"]["dispatch"] == sum(sum(c.values()) for c in expected)
    # Queue records sit in their invocation: each invocation executes the command
    # buffers its dispatches imply, and (local-task numbers allocations) each
    # allocation is made and freed within one.
    manifest = compiled["full"].manifest
    assert executed_recordings(rows, manifest, function) == \
        {k: expected_executions(manifest, function, c) for k, c in enumerate(expected)}
    owner: dict[int, set[int]] = {}
    for row in rows:
        allocation = json.loads(row["attributes"] or "{}").get("allocation_id") if row["kind"] == "queue" else None
        if allocation:
            owner.setdefault(allocation, set()).add(row["invocation"])
    if driver == "local-task":
        assert owner and all(len(invocations) == 1 for invocations in owner.values())

    lite = run_bundle(compiled["lite"].vmfb, compiled["lite"].manifest_path, tmp_path / "lite", mode="lite",
                      inputs=INPUTS[function], function=function, driver=driver, repeat=REPEAT, warmup=WARMUP)
    lite_rows = events(lite.bundle)
    assert per_invocation(lite_rows, "program", "partition") == {k: Counter({function: 1}) for k in range(REPEAT)}
    assert per_invocation(lite_rows, "function", "partition") == {k: Counter({function: 1}) for k in range(REPEAT)}
    # The lite queue pass is split the same way: each invocation executes the command
    # buffers its inputs imply (lite has no dispatch events).
    manifest = compiled["lite"].manifest
    assert executed_recordings(lite_rows, manifest, function) == \
        {k: expected_executions(manifest, function, c) for k, c in enumerate(expected)}
    assert lite.summary["queue_pass"]["warmup_records_dropped"] > 0


def test_async_function_without_anchor_repeats(tmp_path: Path) -> None:
    """Compiled async (coarse-fences), @loop_first runs under the benchmark tool's async
    loop, which flushes once per batch of one invocation: the same split."""
    compiled = compile_instrumented(SOURCE, tmp_path / "async.vmfb", mode="full",
                                    flags=("--iree-execution-model=async-external",))
    result = run_bundle(compiled.vmfb, compiled.manifest_path, tmp_path / "b", inputs=INPUTS["loop_first"],
                        function="loop_first", repeat=REPEAT, warmup=WARMUP)
    rows = events(result.bundle)
    assert all(r["root_id"] for r in rows if r["kind"] == "dispatch")
    assert per_invocation(rows, "dispatch", "root_id") == {k: loop_first(WARMUP + k) for k in range(REPEAT)}


@pytest.mark.parametrize("function", list(INPUTS))
def test_ids_mode_repeats(compiled, tmp_path: Path, function: str) -> None:
    result = run_bundle(compiled["full"].vmfb, compiled["full"].manifest_path, tmp_path / "b", mode="ids",
                        inputs=INPUTS[function], function=function, repeat=REPEAT)
    assert result.summary["invocations"] == REPEAT
    assert per_invocation(events(result.bundle), "program", "partition") == \
        {k: Counter({function: 1}) for k in range(REPEAT)}


def test_calls_without_device_work_cannot_be_split_and_say_why(compiled, tmp_path: Path) -> None:
    """@loop_only runs its matmul n * call times: the first call issues nothing, so it
    writes no flush and the other four cannot be told apart from it."""
    vmfb = compiled["full"].vmfb
    out = tmp_path / "b"
    cli = subprocess.run([sys.executable, "-m", "dfit_mlir", "run", str(vmfb), "--function", "loop_only",
                          "--input", "2", "--input", "16x16xf32=0.01", "--repeat", "5", "-o", str(out)],
                         capture_output=True, text=True)
    assert cli.returncode == 2 and not out.exists() and "Traceback" not in cli.stderr
    assert cli.stderr.strip() == (
        "dfit: cannot split 5 invocations of loop_only: its entry block executes no command buffer (every execution "
        "sits under control flow), and only 4 of the 5 calls issued a queue operation (a loop that ran no trip or a "
        "branch with no device work issues none), so which calls did the work cannot be told; run it with --repeat 1")
    # --repeat 1 stays correct: the one call runs no trip (n * 0).
    one = run_bundle(vmfb, compiled["full"].manifest_path, tmp_path / "one", inputs=["2", "16x16xf32=0.01"],
                     function="loop_only")
    assert one.summary["records"]["dispatch"] == 0
    # Calls that all issue nothing are all empty: that split is exact.
    none = run_bundle(vmfb, compiled["full"].manifest_path, tmp_path / "none", inputs=["0", "16x16xf32=0.01"],
                      function="loop_only", repeat=3)
    assert none.summary["records"]["dispatch"] == none.summary["records"]["queue"] == 0
    # One warm-up call (n * 0 trips) then n * 1, n * 2: with the warm-up issuing nothing
    # the recorded calls are still not placed — the flushes cannot say which call was empty.
    with pytest.raises(hal_profile.UnresolvedDispatchError, match=r"only 2 of the 3 calls issued a queue operation"):
        run_bundle(vmfb, compiled["full"].manifest_path, tmp_path / "w", inputs=["2", "16x16xf32=0.01"],
                   function="loop_only", repeat=2, warmup=1)


# --- a decode loop -------------------------------------------------------------------

VOCAB, MAX_LEN, EOS = 16, 12, 0


def greedy_decode(emb, w, first):
    """Greedy decoding until EOS or MAX_LEN tokens: ``lax.while_loop`` whose condition
    reads the last token the loop produced (a data-dependent trip count)."""
    import jax.numpy as jnp
    from jax import lax

    def cond(state):
        _, pos, last = state
        return (pos < MAX_LEN) & (last != EOS)

    def body(state):
        tokens, pos, last = state
        token = jnp.argmax(jnp.tanh(emb[last]) @ w).astype(jnp.int32)
        return tokens.at[pos].set(token), pos + 1, token

    tokens, length, _ = lax.while_loop(cond, body, (jnp.full((MAX_LEN,), -1, jnp.int32), jnp.int32(0), first))
    return tokens, length


def decode_weights() -> tuple[np.ndarray, np.ndarray]:
    """One-hot embeddings and a projection whose largest logit for token t is t - 1,
    over small random ones: decoding from t reaches EOS after t steps."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((VOCAB, VOCAB)) * 0.1).astype(np.float32)
    for token in range(VOCAB):
        w[token, token - 1] = 2.0
    return np.eye(VOCAB, dtype=np.float32), w


def decode_steps(emb: np.ndarray, w: np.ndarray, first: int) -> int:
    """The loop's trip count, decoded in numpy."""
    last, steps = first, 0
    while steps < MAX_LEN and last != EOS:
        last = int(np.argmax(np.tanh(emb[last]) @ w))
        steps += 1
    return steps


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory) -> tuple[CompileResult, list[str]]:
    from dfit_mlir.frontends import jax as jax_frontend

    root = tmp_path_factory.mktemp("decode")
    emb, w = decode_weights()
    np.save(root / "emb.npy", emb)
    np.save(root / "w.npy", w)
    compiled = jax_frontend.compile(greedy_decode, emb, w, np.int32(1), output=root / "decode.vmfb", mode="full")
    return compiled, [f"@{root / 'emb.npy'}", f"@{root / 'w.npy'}"]


@pytest.mark.frontends
@pytest.mark.parametrize(("first", "driver"), [(5, "local-task"), (9, "local-sync")])
def test_greedy_decode_loop_repeats(decoder, tmp_path: Path, first: int, driver: str) -> None:
    compiled, weights = decoder
    steps = decode_steps(*decode_weights(), first)
    assert 0 < steps < MAX_LEN  # EOS ends it, not the length limit
    result = run_bundle(compiled.vmfb, compiled.manifest_path, tmp_path / "b", inputs=[*weights, f"i32={first}"],
                        driver=driver, repeat=REPEAT)
    rows = events(result.bundle)
    dispatched = [r for r in rows if r["kind"] == "dispatch"]
    assert dispatched and all(r["site"] is not None and r["root_id"] for r in dispatched)
    sites = compiled.manifest["partitions"]["dispatch_sites"]
    # The condition (its `and`) is checked steps + 1 times; every other op of the loop
    # runs once per step, the argmax's reduction included.
    condition = {s["root_id"] for s in sites if s["root_id"].endswith("stablehlo.and#0")}
    assert len(condition) == 1
    expected = Counter({s["root_id"]: steps + 1 if s["root_id"] in condition else steps for s in sites})
    assert per_invocation(rows, "dispatch", "root_id") == {k: expected for k in range(REPEAT)}


def starts_both_ways(vmfb: Path, manifest: dict, inputs: list[str], invocations: int) -> tuple[list[int], list[int]]:
    """(starts from the flushes, starts from the entry-block anchor) of one profile."""
    profile = hal_profile.capture_profile(vmfb, inputs, function="main", invocations=invocations, driver="local-task")
    executions = [(r["submission_id"], r["command_buffer_id"]) for r in profile.host_operations if r["op"] == "execute"]
    by_anchor = hal_profile.join_structural(profile.dispatches, manifest, "main", invocations, executions)
    assert profile.flush_starts is not None
    return list(profile.flush_starts), by_anchor.starts


def test_flushes_agree_with_the_entry_block_anchor(iree_bundles) -> None:
    """Where a function has an anchor (the convnet's first command buffer runs in its
    entry block), both ways of splitting give the same invocation starts."""
    from dfit_mlir.core import manifest as manifest_io

    manifest_path = iree_bundles["manifest"]
    vmfb = manifest_path.with_name("full.vmfb")
    by_flush, by_anchor = starts_both_ways(vmfb, manifest_io.load(manifest_path), ["1x32x32x3xf32=0.5"], 4)
    assert len(by_flush) == 4 and by_flush == by_anchor


@pytest.mark.frontends
def test_decoder_flushes_agree_with_its_anchor(decoder) -> None:
    """The decoder's first condition check runs in its entry block (IREE peels it): an
    anchor, and the same starts as the flushes give."""
    compiled, weights = decoder
    by_flush, by_anchor = starts_both_ways(compiled.vmfb, compiled.manifest, [*weights, "i32=4"], 4)
    assert len(by_flush) == 4 and by_flush == by_anchor


def test_a_profile_that_dropped_records_is_an_error(compiled, tmp_path: Path) -> None:
    """1100 trips issue 4 queue operations each: more events than the local devices
    keep between two flushes. The run stops (exit 3, one line, no bundle) rather than
    writing a bundle that lacks dispatches."""
    out = tmp_path / "b"
    cli = subprocess.run([sys.executable, "-m", "dfit_mlir", "run", str(compiled["full"].vmfb), "--function",
                          "loop_first", "--input", "1100", "--input", "16x16xf32=0.0001", "--repeat", "2", "-o",
                          str(out)], capture_output=True, text=True)
    assert cli.returncode == 3 and not out.exists() and len(cli.stderr.strip().splitlines()) == 1
    assert re.match(r"dfit: the HAL profiler dropped records \(\d+ host-execution-events, \d+ memory-events, "
                    r"\d+ queue-events\): ", cli.stderr)
    assert "at most 4096 events of a family between two flushes" in cli.stderr


def test_flush_split_checks_what_it_reads() -> None:
    """SYNTHETIC chunks: the queue events read from the chunks must be iree-profile's,
    and each flush's submissions must follow the previous flush's."""
    from dfit_mlir.runtime_hooks.profile_flushes import (
        QUEUE_EVENTS,
        EventChunk,
        FlushLayoutError,
        flush_split,
    )

    def chunk(*events: tuple[int, int]) -> EventChunk:
        return EventChunk(QUEUE_EVENTS, False, 0, tuple(events))

    def decoded(*events: tuple[int, int]) -> list[dict]:
        return [{"event_id": e, "submission_id": s} for e, s in events]

    chunks = [chunk((1, 1), (2, 2)), chunk(), chunk((3, 3), (4, 4), (5, 5))]
    assert flush_split(chunks, decoded((1, 1), (2, 2), (3, 3), (4, 4), (5, 5))) == (1, 3)
    with pytest.raises(FlushLayoutError, match=r"not iree-profile's .*\(2, 2\), \(2, 7\)"):
        flush_split(chunks, decoded((1, 1), (2, 7), (3, 3), (4, 4), (5, 5)))
    with pytest.raises(FlushLayoutError, match=r"flush 1 holds submission 2, not after the previous flush's last \(3\)"):
        flush_split([chunk((1, 1), (2, 3)), chunk((3, 2))], decoded((1, 1), (2, 3), (3, 2)))
    with pytest.raises(FlushLayoutError, match=r"queue events of 2 streams"):
        flush_split([chunk((1, 1)), EventChunk(QUEUE_EVENTS, False, 1, ((2, 2),))], decoded((1, 1), (2, 2)))
