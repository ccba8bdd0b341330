"""What ``dfit run --mode full`` does with a profile's dispatch records, per 1M records:
decode them to columns (``hal_profile.decode_columns``: ``iree-profile``'s JSONL through
Arrow, no Python object per record), join them to call sites (``hal_profile.join_structural``
on the columns) and build the ledger over them (``dfit_mlir.analysis.ledger``: per-site time, per-op
split, leaf-interval totals). The join runs after the run, so it adds to ``dfit run``'s
wall time, not to the module's; the ledger is what every analysis tool pays once per
bundle. The decode is reported on its own: ``iree-profile``'s CPU (a child process) and
the parse in this process. The per-record join (the reference, and the fallback for
ambiguous blocks) is timed on the same records in the same process, so its ratio to the
columnar route does not depend on the machine's load.

Records: REAL. ``tests/inputs/shapes/loop.mlir`` (trip count ``TRIPS``: 100 dispatch
records per call) is profiled on local-task by ``iree-benchmark-module`` for as many
calls as the size needs, as ``dfit run --repeat`` would. Each size is measured in a
fresh process, so its max RSS is its own: it is read after the ledger, before the
per-record join builds its objects. The result replaces this benchmark's section of
``benchmarks/RESULTS.md``.

    python benchmarks/runtime_join.py
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.compile_overhead import publish  # noqa: E402
from dfit_mlir.analysis import ledger  # noqa: E402
from dfit_mlir.core import event_schema  # noqa: E402
from dfit_mlir.runtime_hooks import hal_profile  # noqa: E402

BEGIN = "<!-- runtime_join:begin -->"
END = "<!-- runtime_join:end -->"
SOURCE = REPO / "tests" / "inputs" / "shapes" / "loop.mlir"
TRIPS = 98  # dispatch records per invocation: 1 + TRIPS + 1 = 100
PER_INVOCATION = TRIPS + 2
SIZES = (1_000_000, 2_000_000)


def dispatch_batch(columns: hal_profile.JoinColumns) -> Any:
    """The joined records as the event pipeline hands them on: an Arrow batch of
    ``dispatch`` events in the event schema."""
    import pyarrow as pa

    schema = event_schema.arrow_schema()
    count = len(columns.site)
    given = {"kind": pa.DictionaryArray.from_arrays(pa.array([0] * count, pa.int32()), ["dispatch"]),
             "site": pa.array(columns.site), "invocation": pa.array(columns.invocation),
             "start_ns": pa.array(columns.start_ns), "duration_ns": pa.array(columns.duration_ns)}
    arrays = [given[f.name].cast(f.type) if f.name in given else pa.nulls(count, f.type) for f in schema]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def cpu_of_children() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(profile: Path, manifest_path: Path, invocations: int) -> dict[str, Any]:
    """One size, in this (fresh) process: decode → join → ledger, then the reference."""
    import resource

    import numpy as np

    from dfit_mlir.analysis.model import SemanticModel

    manifest = json.loads(manifest_path.read_text())
    model = SemanticModel(manifest)  # loaded once per bundle by any tool: not per record
    ledger.Ledger(model, [])  # imports and the time model, outside the timed spans
    cpu, child = time.process_time(), cpu_of_children()
    records = hal_profile.decode_columns(profile)
    decode_cpu, profile_cpu = time.process_time() - cpu, cpu_of_children() - child
    cpu = time.process_time()
    joined = hal_profile.join_structural(records, manifest, "main", invocations)
    join_cpu = time.process_time() - cpu
    assert len(joined.columns.site) == len(records) == invocations * PER_INVOCATION
    batch = dispatch_batch(joined.columns)
    cpu = time.process_time()
    book = ledger.Ledger(model, [batch])
    entries = book.entries.num_rows
    ledger_cpu = time.process_time() - cpu
    assert entries and book.totals.attributed_ns == int(joined.columns.duration_ns.sum())
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    profile_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    events = records.events()  # the reference reads objects (built untimed)
    cpu = time.process_time()
    slow = hal_profile._join_per_record(events, manifest, "main", invocations, ())
    per_record_cpu = time.process_time() - cpu
    for field in ("event", "site", "invocation", "start_ns", "duration_ns", "workgroups", "tiles"):
        assert np.array_equal(getattr(slow.columns, field), getattr(joined.columns, field)), field
    return {"records": len(records), "invocations": invocations, "decode_cpu": decode_cpu,
            "profile_cpu": profile_cpu, "join_cpu": join_cpu, "ledger_cpu": ledger_cpu,
            "per_record_cpu": per_record_cpu, "rss": rss, "profile_rss": profile_rss,
            "profile_bytes": profile.stat().st_size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, nargs="+", default=list(SIZES), help="sizes (default 1M 2M)")
    parser.add_argument("--measure", nargs=3, metavar=("PROFILE", "MANIFEST", "INVOCATIONS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(Path(args.measure[0]), Path(args.measure[1]), int(args.measure[2]))))
        return
    from dfit_mlir.passes.instrumented_compile import compile_instrumented

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        compiled = compile_instrumented(SOURCE, Path(tmp) / "loop.vmfb", mode="ids")
        for total in args.records:
            invocations = total // PER_INVOCATION
            profile = Path(tmp) / "profile.bin"
            hal_profile.record_profile(compiled.vmfb, ["16x16xf32=0.01", f"i32={TRIPS}"], profile,
                                       driver="local-task", function="main", invocations=invocations,
                                       families=("host-execution",))
            child = subprocess.run([sys.executable, __file__, "--measure", str(profile),
                                    str(compiled.manifest_path), str(invocations)],
                                   capture_output=True, text=True)
            if child.returncode != 0:
                raise SystemExit(f"runtime_join: measuring {total:,} records failed:\n{child.stderr[-3000:]}")
            row = json.loads(child.stdout.splitlines()[-1])
            profile.unlink()
            rows.append(row)
            print(f"{row['records']:,} records: decode {row['decode_cpu']:.2f} s CPU (+ iree-profile "
                  f"{row['profile_cpu']:.2f} s), join {row['join_cpu']:.2f} s + ledger {row['ledger_cpu']:.2f} s CPU "
                  f"(per-record join {row['per_record_cpu']:.2f} s), max RSS {row['rss']:.0f} MiB "
                  f"(iree-profile {row['profile_rss']:.0f} MiB)", flush=True)
    publish(section(rows), begin=BEGIN, end=END)


def section(rows: list[dict[str, Any]]) -> list[str]:
    load = os.getloadavg()
    when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    rate = [r["records"] / (r["join_cpu"] + r["ledger_cpu"]) for r in rows]
    return [
        BEGIN,
        "## Runtime join + ledger: dispatch records → call sites → per-op time (structural join)",
        "",
        f"Measured {when}, under load (other helpers running: load average {load[0]:.1f} / {load[1]:.1f} / "
        f"{load[2]:.1f} over 1 / 5 / 15 min at the end, on {os.cpu_count()} cores). REAL records: "
        f"`tests/inputs/shapes/loop.mlir` (trip count {TRIPS}, {PER_INVOCATION} dispatch records per call) profiled "
        "on local-task by `iree-benchmark-module` (host-execution) for as many calls as each size needs. What "
        "`dfit run --mode full` does with them: `decode_columns` (iree-profile's JSONL through Arrow's JSON reader, "
        "no Python object per record) → `join_structural` on the columns → the ledger over the joined batch. "
        "CPU time is the measuring process's (iree-profile's, a child process, on its own); the join + ledger "
        "rate leaves the decode out. The ledger column excludes loading the bundle's model (once per bundle, "
        "whatever the record count). Command:",
        "",
        "```",
        f"python benchmarks/{Path(__file__).name}" + (" " + shlex.join(sys.argv[1:]) if sys.argv[1:] else ""),
        "```",
        "",
        "Each size runs in a fresh process; max RSS is that process's peak after decode, join and ledger "
        "(before the per-record reference builds its objects). It grows with the records although no Python "
        "object is made per record: the decoded columns, the join's output columns and its temporaries, and the "
        "ledger's event batch (every column of the event schema) are numpy / Arrow arrays of one entry per "
        "record. `iree-profile` reads the whole profile file into memory (its RSS is the file's size). The "
        "per-record join is timed on the same records in the same process; both joins give every record the "
        "same site, invocation, times, workgroups and tiles (checked).",
        "",
        "| records | invocations | decode: parse CPU (s) | decode: iree-profile CPU (s) | join CPU (s) "
        "| ledger CPU (s) | join + ledger: records/s (CPU) | per-record join CPU (s) | speed-up "
        "| max RSS (MiB) | iree-profile max RSS (MiB) | profile file (MiB) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *(f"| {r['records']:,} | {r['invocations']:,} | {r['decode_cpu']:.2f} | {r['profile_cpu']:.2f} "
          f"| {r['join_cpu']:.2f} | {r['ledger_cpu']:.2f} | {k:,.0f} | {r['per_record_cpu']:.2f} "
          f"| {r['per_record_cpu'] / r['join_cpu']:.1f}x | {r['rss']:.0f} | {r['profile_rss']:.0f} "
          f"| {r['profile_bytes'] / 2**20:.0f} |" for r, k in zip(rows, rate, strict=True)),
    ]


if __name__ == "__main__":
    main()
