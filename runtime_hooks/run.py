"""``dfit run``: run a compiled module and write a run bundle (``runtime_hooks/bundle.py``).

Modes:

* ``none`` — the module runs in this process with nothing recorded but the wall time
  of each invocation (in the summary): the baseline the others are compared with;
* ``ids`` — one ``program`` event per invocation, no hook in the module;
* ``lite`` — plus ``function`` events from the probe calls a lite compile inserts,
  received by the ``dfit`` hook module (``runtime_hooks/instrument.py``), and ``queue``
  events of the same invocations from a second pass under HAL profiling;
* ``full`` — under HAL profiling through the shipped ``iree-run-module`` /
  ``iree-benchmark-module``: one ``dispatch`` event per dispatch joined to its IDs,
  ``queue`` events (submissions and non-model host operations: allocations, command
  buffer executions, copies) and ``memory`` events (pool reservations, allocations).

``tensors`` (in-process modes): statistics of the values a ``--tensors`` compile traces.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from dfit_mlir import atomic
from dfit_mlir import manifest as manifest_io
from dfit_mlir.errors import InvalidInputError
from dfit_mlir.event_pipeline import EventPipeline, EventRow, Policy
from dfit_mlir.runtime_hooks import hal_profile
from dfit_mlir.runtime_hooks.bundle import write_bundle
from dfit_mlir.runtime_hooks.inputs import (
    check_inputs,
    entry_function,
    load_input,
    random_inputs,
    signature,
)
from dfit_mlir.runtime_hooks.instrument import InstrumentedModule, duration_stats
from dfit_mlir.runtime_hooks.tensors import TensorPolicy

MODES = ("none", "ids", "lite", "full")


@dataclass(frozen=True)
class RunResult:
    bundle: Path
    summary: dict[str, Any]


def run_bundle(vmfb: Path, manifest_path: Path, bundle: Path, *, mode: str = "full", inputs: Sequence[str] = (),
               repeat: int = 1, warmup: int = 0, driver: str = "local-task", function: str | None = None,
               policy: Policy | None = None, tensors: TensorPolicy | None = None) -> RunResult:
    """Run ``vmfb`` ``warmup + repeat`` times, record the last ``repeat``, write the bundle."""
    if mode not in MODES:
        raise InvalidInputError(f"mode {mode!r} is not one of {', '.join(MODES)}")
    if not vmfb.is_file():
        raise InvalidInputError(f"{vmfb}: no such file")
    if repeat < 1 or warmup < 0:
        raise InvalidInputError("--repeat must be at least 1 and --warmup at least 0")
    if tensors is not None and mode == "full":
        raise InvalidInputError("--tensors needs an in-process mode (ids or lite): full runs under iree-run-module, "
                                "which prints traced tensors instead of handing them to dfit")
    manifest = manifest_io.load(manifest_path)
    manifest_io.check_belongs(manifest, vmfb, str(manifest_path))
    policy = policy or Policy(mode=mode)
    function = entry_function(manifest, function)
    arguments = signature(manifest, function)
    with atomic.scratch_directory("dfit-run-") as scratch:
        if inputs:
            check_inputs(inputs, arguments)
        else:
            inputs = random_inputs(arguments, Path(scratch))
        summary = {
            "mode": mode, "driver": driver, "function": function, "repeat": repeat, "warmup": warmup,
            "inputs": [{"shape": a["shape"], "dtype": a["dtype"]} for a in arguments],
            "vmfb": {"path": str(vmfb), "sha256": manifest["compile"]["vmfb_sha256"]},
        }
        if mode == "full":
            profile = _profiled_run(vmfb, manifest, inputs, driver, function, repeat, warmup)
            write_bundle(bundle, manifest, lambda sink: profile.pipeline(manifest, policy, sink),
                         {**summary, **profile.summary()})
        else:
            arrays = [load_input(text) for text in inputs]
            with InstrumentedModule(vmfb, manifest, mode=mode, driver=driver, tensors=tensors,
                                    check_vmfb=False, max_events=policy.max_events) as module:
                for index in range(warmup + repeat):
                    module.call(function, *arrays, wait=True, record=index >= warmup)
                if mode == "lite":
                    summary["queue_pass"] = _queue_pass(module, vmfb, manifest, inputs, driver, function, repeat,
                                                        warmup)
                module.write_bundle(bundle, policy, **summary)
    return RunResult(bundle, json.loads((bundle / "summary.json").read_text()))


@dataclass
class ProfiledRun:
    """A ``full`` run's records: joined dispatches per recorded invocation, and the queue,
    host-operation and memory records assigned to invocations by time."""

    dispatches: list[list[hal_profile.JoinedDispatch]]
    queue_rows: list[EventRow]
    memory_rows: list[EventRow]
    warmup_records: int
    #: The benchmark tool's real time per invocation (several invocations only).
    wall_ns_per_invocation: float | None = None

    def pipeline(self, manifest: dict[str, Any], policy: Policy, sink: Any) -> EventPipeline:
        import uuid

        pipeline = EventPipeline(manifest, policy, sink, session=uuid.uuid4().hex[:12])
        for invocation, block in enumerate(self.dispatches):
            pipeline.add_joined(block, invocation)
        pipeline.add_rows("queue", self.queue_rows)
        pipeline.add_rows("memory", self.memory_rows)
        return pipeline

    def summary(self) -> dict[str, Any]:
        totals = [sum(j.event.duration_ns for j in block) for block in self.dispatches]
        spans = [block[-1].event.end_ns - block[0].event.start_ns for block in self.dispatches if block]
        wall = self.wall_ns_per_invocation
        return {
            "profiling_families": list(hal_profile.FULL_FAMILIES),
            "dispatch_ns_per_invocation": duration_stats(totals),
            # First dispatch start to last dispatch end: the device-side window.
            "dispatch_window_ns": duration_stats(spans),
            # Wall time per invocation as iree-benchmark-module measures it (a mean: the
            # tool reports no per-invocation times); in-process modes time each call.
            "invocation_ns": None if wall is None else {"count": len(self.dispatches), "min": wall, "median": wall,
                                                        "mean": wall, "max": wall},
            "timing_harness": "iree-benchmark-module" if wall is not None else "iree-run-module",
            "records": {"dispatch": sum(len(b) for b in self.dispatches), "queue": len(self.queue_rows),
                        "memory": len(self.memory_rows), "warmup_records_dropped": self.warmup_records},
        }


def _profiled_run(vmfb: Path, manifest: dict[str, Any], inputs: Sequence[str], driver: str, function: str,
                  repeat: int, warmup: int, families: Sequence[str] = hal_profile.FULL_FAMILIES) -> ProfiledRun:
    invocations = warmup + repeat
    profile = hal_profile.capture_profile(vmfb, inputs, driver=driver, function=function, invocations=invocations,
                                          families=families)
    joined = hal_profile.join(profile.dispatches, manifest)
    per_invocation = len(manifest["partitions"]["dispatch_sites"])
    if len(joined) != invocations * per_invocation:
        raise hal_profile.UnresolvedDispatchError(
            f"{len(joined)} dispatch events for {invocations} invocation(s) of {per_invocation} call sites")
    blocks = [joined[i * per_invocation:(i + 1) * per_invocation] for i in range(invocations)]
    # An invocation owns the records up to the end of its last dispatch (allocations come
    # before the dispatches, deallocations after the previous invocation's).
    ends = np.array([block[-1].event.end_ns if block else 0 for block in blocks], dtype=np.int64)

    def invocation_of(stamp: int) -> int:
        return min(int(np.searchsorted(ends, stamp, side="left")), invocations - 1) - warmup

    def submission(record: dict[str, Any], k: int) -> EventRow:
        return EventRow(k, f"submit {record['op']}", None, record["host_time_ns"],
                        record["ready_host_time_ns"] - record["host_time_ns"], bytes=record.get("payload_length") or None,
                        attributes=_pick(record, "submission_id", "dependency_strategy", "wait_count", "signal_count",
                                         "operation_count"))

    def host_operation(record: dict[str, Any], k: int) -> EventRow:
        return EventRow(k, f"host {record['op']}", None, record["start_host_time_ns"], record["duration_ns"],
                        bytes=record.get("payload_length") or None,
                        attributes=_pick(record, "submission_id", "command_buffer_id", "allocation_id"))

    def memory(record: dict[str, Any], k: int) -> EventRow:
        return EventRow(k, record["event_type"], None, record["host_time_ns"], 0, bytes=record.get("length"),
                        attributes=_pick(record, "allocation_id", "pool_id", "pool_bytes_reserved",
                                         "pool_bytes_committed", "submission_id"))

    queue_rows: list[EventRow] = []
    memory_rows: list[EventRow] = []
    warmup_records = 0
    for records, stamp, rows, row_of in (
        (profile.queue_events, "host_time_ns", queue_rows, submission),
        (profile.host_operations, "start_host_time_ns", queue_rows, host_operation),
        (profile.memory_events, "host_time_ns", memory_rows, memory),
    ):
        for record in records:
            k = invocation_of(record[stamp])
            if k < 0:
                warmup_records += 1
            else:
                rows.append(row_of(record, k))
    return ProfiledRun(blocks[warmup:], queue_rows, memory_rows, warmup_records, profile.wall_ns_per_invocation)


#: Queue events of a lite run come from a second pass under HAL profiling: Python cannot
#: capture a profile (RUNTIME-NOTES.md), and host-execution is needed to tell invocations
#: apart. Their timestamps are that pass's, on the same CLOCK_MONOTONIC.
LITE_QUEUE_FAMILIES = ("host-execution", "queue-events")


def _queue_pass(module: InstrumentedModule, vmfb: Path, manifest: dict[str, Any], inputs: Sequence[str],
                driver: str, function: str, repeat: int, warmup: int) -> dict[str, Any]:
    """Record the same invocations' queue submissions and host operations into ``module``."""
    profiled = _profiled_run(vmfb, manifest, inputs, driver, function, repeat, warmup, LITE_QUEUE_FAMILIES)
    rows = [replace(row, attributes={**(row.attributes or {}), "pass": "queue-profile"})
            for row in profiled.queue_rows]
    module.add_rows("queue", rows)
    return {"families": list(LITE_QUEUE_FAMILIES), "tool": "iree-benchmark-module" if warmup + repeat > 1
            else "iree-run-module", "queue_events": len(rows), "warmup_records_dropped": profiled.warmup_records}


def _pick(record: dict[str, Any], *names: str) -> dict[str, Any]:
    return {name: record[name] for name in names if name in record}

