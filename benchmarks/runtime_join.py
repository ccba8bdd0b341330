"""Time of the structural runtime join (``hal_profile.join_structural``) per 1M dispatch
records. The join runs after the run (on the decoded profile), so it adds nothing to
the module's timing; this measures what it adds to ``dfit run``'s wall time.

Records: a real profile of ``tests/inputs/shapes/loop.mlir`` (trip count from the input)
captured on local-task, and SYNTHETIC records shaped like it (same recordings, export
names, command indices and workgroup counts; fresh submission ids), replicated to 1M and
2M records in invocations of ``TRIPS`` loop trips. The result replaces this benchmark's
section of ``benchmarks/RESULTS.md``.

    python benchmarks/runtime_join.py
"""

from __future__ import annotations

import datetime as dt
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.compile_overhead import publish  # noqa: E402
from dfit_mlir.passes.instrumented_compile import compile_instrumented  # noqa: E402
from dfit_mlir.runtime_hooks import hal_profile  # noqa: E402
from dfit_mlir.runtime_hooks.hal_profile import DispatchEvent  # noqa: E402

BEGIN = "<!-- runtime_join:begin -->"
END = "<!-- runtime_join:end -->"
SOURCE = REPO / "tests" / "inputs" / "shapes" / "loop.mlir"
TRIPS = 98  # dispatch records per invocation: 1 + TRIPS + 1 = 100


def synthetic(real: list[DispatchEvent], invocations: int) -> list[DispatchEvent]:
    """``real`` (one invocation) repeated: each command-buffer execution gets a fresh
    submission id, as a longer run would give it (SYNTHETIC)."""
    per_invocation = max(e.submission_id for e in real) - min(e.submission_id for e in real) + 1
    first = min(e.submission_id for e in real)
    events = []
    for k in range(invocations):
        shift = k * per_invocation
        events.extend(DispatchEvent(e.key, e.submission_id + shift, e.command_buffer_id, e.command_index,
                                    e.start_ns + shift, e.end_ns + shift, e.workgroup_count, e.tile_count)
                      for e in real)
    assert events[0].submission_id == first
    return events


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        compiled = compile_instrumented(SOURCE, Path(tmp) / "loop.vmfb", mode="ids")
        real = hal_profile.capture(compiled.vmfb, ["16x16xf32=0.01", f"i32={TRIPS}"], driver="local-task")
    manifest = compiled.manifest
    rows = []
    for total in (1_000_000, 2_000_000):
        invocations = total // len(real)
        events = synthetic(real, invocations)
        start, cpu = time.perf_counter(), time.process_time()
        result = hal_profile.join_structural(events, manifest, "main", invocations)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        assert sum(len(block) for block in result.invocations) == len(events)
        rows.append((len(events), invocations, seconds, cpu))
        print(f"{len(events):,} records, {invocations:,} invocations: {seconds:.2f} s ({cpu:.2f} s CPU)", flush=True)
    load = os.getloadavg()[0]
    when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        BEGIN,
        "## Runtime join: dispatch records → call sites (structural join)",
        "",
        f"Measured {when}; {len(real)} real local-task records of `tests/inputs/shapes/loop.mlir` "
        f"(trip count {TRIPS}) replicated with fresh submission ids (SYNTHETIC beyond the first invocation). "
        "The join runs after the run, on the decoded profile: it adds to `dfit run`'s wall time, not to the "
        f"module's. CPU time is this process's (the machine is shared: load average {load:.1f} on "
        f"{os.cpu_count()} cores at the end). Command:",
        "",
        "```",
        f"python benchmarks/{Path(__file__).name}" + (" " + shlex.join(sys.argv[1:]) if sys.argv[1:] else ""),
        "```",
        "",
        "| records | invocations | join wall (s) | join CPU (s) | CPU s per 1M records |",
        "|---:|---:|---:|---:|---:|",
        *(f"| {n:,} | {k:,} | {s:.2f} | {c:.2f} | {c / n * 1e6:.2f} |" for n, k, s, c in rows),
    ]
    publish(lines, begin=BEGIN, end=END)


if __name__ == "__main__":
    main()
