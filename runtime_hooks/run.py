"""``dfit run``: run a compiled module — in this process for per-invocation timing
(``ids``), or under HAL profiling with every dispatch joined to its IDs (``full``) — and
write a run bundle.

The bundle is a directory written atomically (a temporary sibling renamed into place;
an existing bundle is replaced only once the new one is complete):

* ``manifest.json`` — the compile's manifest;
* ``events.parquet`` — one normalized row per dispatch (``dfit_mlir.event_schema``);
* ``sites.parquet`` — the interned IDs: every call site with its root and fused IDs;
* ``dispatches.csv`` — per call site: count and min/mean/max/total duration;
* ``trace.pftrace`` (Perfetto native) and ``trace.json`` (Chrome trace JSON);
* ``summary.json`` — mode, policy, counts (incl. dropped), driver, inputs, versions.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from dfit_mlir import atomic, toolchain, traces
from dfit_mlir import manifest as manifest_io
from dfit_mlir.errors import InvalidInputError
from dfit_mlir.event_pipeline import EventPipeline, ParquetSink, Policy, site_table
from dfit_mlir.runtime_hooks import hal_profile
from dfit_mlir.runtime_hooks.inprocess import Runner
from dfit_mlir.runtime_hooks.inputs import (
    check_inputs,
    entry_function,
    load_input,
    random_inputs,
    signature,
)


@dataclass(frozen=True)
class RunResult:
    bundle: Path
    summary: dict[str, Any]


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


MODES = ("ids", "full")


def run_bundle(vmfb: Path, manifest_path: Path, bundle: Path, *, mode: str = "full", inputs: Sequence[str] = (),
               repeat: int = 1, warmup: int = 0, driver: str = "local-task", function: str | None = None,
               policy: Policy | None = None) -> RunResult:
    """Run ``vmfb`` ``warmup + repeat`` times, record the last ``repeat`` and write the
    bundle. ``ids``: per-invocation timing in this process, no hook in the module;
    ``full``: one event per dispatch from HAL profiling, joined to IDs."""
    if mode not in MODES:
        raise InvalidInputError(f"mode {mode!r} is not one of {', '.join(MODES)}")
    if not vmfb.is_file():
        raise InvalidInputError(f"{vmfb}: no such file")
    manifest = manifest_io.load(manifest_path)
    recorded = manifest.get("compile", {}).get("vmfb_sha256")
    if recorded is None or recorded != sha256_of(vmfb):
        raise InvalidInputError(f"{manifest_path} was not written for {vmfb} (the vmfb's sha256 differs)")
    if repeat < 1 or warmup < 0:
        raise InvalidInputError("--repeat must be at least 1 and --warmup at least 0")
    policy = policy or Policy(mode=mode)
    function = entry_function(manifest, function)
    arguments = signature(manifest, function)
    session = uuid.uuid4().hex[:12]
    with tempfile.TemporaryDirectory(prefix="dfit-run-") as scratch:
        if inputs:
            check_inputs(inputs, arguments)
        else:
            inputs = random_inputs(arguments, Path(scratch))
        if mode == "full":
            recorded_events = _profiled_dispatches(vmfb, manifest, inputs, driver, function, repeat, warmup)
        else:
            with Runner(vmfb, driver) as runner:
                spans = runner.time(function, [load_input(text) for text in inputs], repeat, warmup)

    with atomic.atomic_directory(bundle) as tmp:
        pipeline = EventPipeline(manifest, policy, ParquetSink(tmp / "events.parquet"), session=session)
        if mode == "full":
            for invocation, block in enumerate(recorded_events):
                pipeline.add_joined(block, invocation)
        else:
            pipeline.add_programs(function, spans)
        counts = pipeline.close()
        manifest_io.save(manifest, tmp / "manifest.json")
        import pyarrow.parquet as pq

        pq.write_table(site_table(manifest), tmp / "sites.parquet")
        table = pq.read_table(tmp / "events.parquet")
        _dispatch_csv(table, tmp / "dispatches.csv")
        slices = traces.write_perfetto(table, manifest, tmp / "trace.pftrace")
        traces.write_chrome_json(table, manifest, tmp / "trace.json")
        summary = {
            "schema": "dfit.run-summary",
            "version": "1.0",
            "session": session,
            "mode": mode,
            "driver": driver,
            "function": function,
            "repeat": repeat,
            "warmup": warmup,
            "inputs": [{"shape": a["shape"], "dtype": a["dtype"]} for a in arguments],
            "policy": asdict(policy),
            "counts": asdict(counts),
            "dropped_events": counts.dropped,
            "trace_slices": slices,
            "vmfb": {"path": str(vmfb), "sha256": recorded},
            "toolchain": toolchain.versions(),
        }
        (tmp / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return RunResult(bundle, summary)


def _profiled_dispatches(vmfb: Path, manifest: dict[str, Any], inputs: Sequence[str], driver: str,
                         function: str, repeat: int, warmup: int) -> list[list[hal_profile.JoinedDispatch]]:
    """Joined dispatches of each recorded invocation (warm-up invocations dropped)."""
    invocations = warmup + repeat
    events = hal_profile.capture(vmfb, inputs, driver=driver, function=function, invocations=invocations)
    joined = hal_profile.join(events, manifest)
    per_invocation = len(manifest["partitions"]["dispatch_sites"])
    if len(joined) != invocations * per_invocation:
        raise hal_profile.UnresolvedDispatchError(
            f"{len(joined)} dispatch events for {invocations} invocation(s) of {per_invocation} call sites")
    return [joined[i * per_invocation:(i + 1) * per_invocation] for i in range(warmup, invocations)]


def _dispatch_csv(table: Any, path: Path) -> None:
    """Per call site: dispatches recorded and their durations."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    plain = pa.table({
        "site": table.column("site"),
        "partition": table.column("partition").cast(pa.string()),
        "root_id": table.column("root_id").cast(pa.string()),
        "duration_ns": table.column("duration_ns"),
    })
    grouped = plain.group_by(["site", "partition", "root_id"]).aggregate(
        [("duration_ns", "count"), ("duration_ns", "min"), ("duration_ns", "mean"), ("duration_ns", "max"),
         ("duration_ns", "sum")]
    ).sort_by("site")
    pacsv.write_csv(grouped, path)
