"""Time of the structural runtime join (``hal_profile.join_structural``) plus the ledger
(``dfit_mlir.ledger``: per-site time, per-op split, leaf-interval totals) per 1M dispatch
records. The join runs after the run (on the decoded profile), so it adds nothing to
the module's timing; this measures what it adds to ``dfit run``'s wall time, and the
ledger what every analysis tool pays once per bundle. The per-record join (the
fallback for ambiguous blocks) is timed on the same records in the same process, so
that its ratio to the columnar one does not depend on the machine's load.

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
from dfit_mlir import event_schema, ledger  # noqa: E402
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


def dispatch_batch(columns: hal_profile.JoinColumns) -> object:
    """The joined records as the event pipeline hands them on: an Arrow batch of
    ``dispatch`` events in the event schema."""
    import pyarrow as pa

    schema = event_schema.arrow_schema()
    count = len(columns.site)
    given = {"kind": pa.array(["dispatch"] * count).dictionary_encode(), "site": pa.array(columns.site),
             "invocation": pa.array(columns.invocation), "start_ns": pa.array(columns.start_ns),
             "duration_ns": pa.array(columns.duration_ns)}
    arrays = [given[f.name].cast(f.type) if f.name in given else pa.nulls(count, f.type) for f in schema]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def main() -> None:
    import resource

    from dfit_mlir.tools.model import SemanticModel

    with tempfile.TemporaryDirectory() as tmp:
        compiled = compile_instrumented(SOURCE, Path(tmp) / "loop.vmfb", mode="ids")
        real = hal_profile.capture(compiled.vmfb, ["16x16xf32=0.01", f"i32={TRIPS}"], driver="local-task")
    manifest = compiled.manifest
    rows = []
    for total in (1_000_000, 2_000_000):
        invocations = total // len(real)
        events = synthetic(real, invocations)
        cpu = time.process_time()
        result = hal_profile.join_structural(events, manifest, "main", invocations)
        join_cpu = time.process_time() - cpu
        assert len(result.columns.site) == len(events)
        batch = dispatch_batch(result.columns)
        cpu = time.process_time()
        book = ledger.Ledger(SemanticModel(manifest), [batch])
        assert book.entries.num_rows and book.totals.attributed_ns == int(result.columns.duration_ns.sum())
        ledger_cpu = time.process_time() - cpu
        cpu = time.process_time()
        slow = hal_profile._join_per_record(events, manifest, "main", invocations, ())
        per_record_cpu = time.process_time() - cpu
        assert (slow.columns.site == result.columns.site).all()
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        rows.append((len(events), invocations, join_cpu, ledger_cpu, per_record_cpu, rss))
        print(f"{len(events):,} records: join {join_cpu:.2f} s CPU + ledger {ledger_cpu:.2f} s CPU "
              f"(per-record join {per_record_cpu:.2f} s CPU), max RSS {rss:.0f} MiB", flush=True)
        del events, result, batch, book, slow
    load = os.getloadavg()[0]
    when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        BEGIN,
        "## Runtime join + ledger: dispatch records → call sites → per-op time (structural join)",
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
        "Max RSS is the process's peak so far (it holds the records as Python objects, as the decoder "
        "hands them over, plus the per-record join's own copies); the columnar join and the ledger keep "
        "O(records) int64 columns (≈ 60 B per record), no per-record Python objects.",
        "",
        "| records | invocations | join CPU (s) | ledger CPU (s) | join + ledger: records/s (CPU) "
        "| per-record join CPU (s) | speed-up | max RSS (MiB) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
        *(f"| {n:,} | {k:,} | {j:.2f} | {g:.2f} | {n / (j + g):,.0f} | {p:.2f} | {p / j:.1f}x | {r:.0f} |"
          for n, k, j, g, p, r in rows),
    ]
    publish(lines, begin=BEGIN, end=END)


if __name__ == "__main__":
    main()
