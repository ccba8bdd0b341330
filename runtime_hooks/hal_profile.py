"""Per-dispatch events from IREE's HAL profiling, joined to dfit IDs.

Capture goes through the shipped ``iree-run-module`` (the Python runtime bindings cannot
capture a profile, RUNTIME-NOTES.md) with ``--device_profiling_mode=host-execution``,
and decoding through ``iree-profile dispatch --dispatch_events --format=jsonl``.

The join is positional: the runtime records dispatches in the order of the call sites
in host code, which the manifest lists in program order
(``partitions.dispatch_sites``). Export names alone cannot do it: after IREE
deduplicates executables one export serves many sites. Each event must land on a site
that runs its export; anything else is an error that shows the event and the sites that
could have produced it, never a silent drop.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from dfit_mlir import atomic
from dfit_mlir.errors import DfitError, UnresolvedRecordError
from dfit_mlir.toolchain import runtime_tool

#: ``command_index`` value when the driver does not number commands (local-sync).
NO_COMMAND_INDEX = 0xFFFFFFFF
DRIVERS = ("local-sync", "local-task")
#: HAL profiling families a ``full`` run records (all cheap on the CPU drivers,
#: RUNTIME-NOTES.md); ``dispatch-events`` is unimplemented on ``local-*``.
FULL_FAMILIES = ("host-execution", "queue-events", "memory-events")
#: Queue operations that move or manage memory or launch command buffers: runtime work
#: that belongs to no source op. IREE 3.13's host-execution ``op`` names.
NON_MODEL_OPERATIONS = frozenset({
    "alloca", "dealloca", "execute", "copy", "fill", "update", "read", "write", "barrier", "host_call",
    "transfer",
})


class ProfileError(DfitError):
    """Capturing or decoding a HAL profile failed."""

    exit_code = 1


class UnresolvedDispatchError(UnresolvedRecordError):
    """A runtime dispatch record that no manifest call site explains."""


@dataclass(frozen=True, slots=True)
class DispatchEvent:
    """One dispatch as HAL host-execution profiling saw it."""

    key: str
    """The export name (``main_dispatch_3_matmul_1x32x3136_f32``)."""
    submission_id: int
    command_buffer_id: int
    command_index: int | None
    start_ns: int
    end_ns: int
    workgroup_count: tuple[int, ...]
    tile_count: int | None

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass(frozen=True)
class Profile:
    """What one profiled run recorded, decoded."""

    #: ``iree-benchmark-module``'s real time per invocation (``None`` for one invocation).
    wall_ns_per_invocation: float | None
    dispatches: list[DispatchEvent]
    #: Non-dispatch host-execution records (``op`` in :data:`NON_MODEL_OPERATIONS`).
    host_operations: list[dict[str, Any]]
    queue_events: list[dict[str, Any]]
    memory_events: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class JoinedDispatch:
    event: DispatchEvent
    site_index: int
    root_id: str | None
    fused_ids: tuple[str, ...]


def capture(vmfb: Path, inputs: Sequence[str], *, driver: str = "local-sync",
            function: str | None = None, invocations: int = 1) -> list[DispatchEvent]:
    """The dispatch events of :func:`capture_profile` (host-execution only)."""
    return capture_profile(vmfb, inputs, driver=driver, function=function, invocations=invocations,
                           families=("host-execution",)).dispatches


def capture_profile(vmfb: Path, inputs: Sequence[str], *, driver: str = "local-sync",
                    function: str | None = None, invocations: int = 1,
                    families: Sequence[str] = FULL_FAMILIES) -> Profile:
    """Run ``vmfb`` under HAL profiling of ``families``; inputs in ``iree-run-module``
    form (``1x3xf32=0.5``, ``@x.npy``). One invocation runs ``iree-run-module``; several
    run ``iree-benchmark-module``, which records exactly its timed iterations (it needs
    ``function``)."""
    if driver not in DRIVERS:
        raise ProfileError(f"driver {driver!r} is not one of {', '.join(DRIVERS)}")
    with atomic.scratch_directory("dfit-profile-") as tmp:
        profile = Path(tmp) / "profile.bin"
        if invocations == 1:
            tool, extra = "iree-run-module", []
        else:
            if not function:
                raise ProfileError("profiling several invocations needs the function to run")
            tool, extra = "iree-benchmark-module", [f"--benchmark_min_time={invocations}x",
                                                    "--benchmark_format=json"]
        command = [
            runtime_tool(tool),
            f"--module={vmfb}",
            f"--device={driver}",
            f"--device_profiling_mode={','.join(families)}",
            f"--device_profiling_output={profile}",
            *(f"--input={value}" for value in inputs),
            *extra,
        ]
        if function:
            command.append(f"--function={function}")
        run = subprocess.run(command, capture_output=True, text=True)
        if run.returncode != 0:
            reason = run.stderr.strip().splitlines()
            raise ProfileError(f"{tool} failed on {vmfb}: {reason[-1] if reason else f'exit {run.returncode}'}")
        return Profile(
            wall_ns_per_invocation=_benchmark_real_time_ns(run.stdout) if tool == "iree-benchmark-module" else None,
            dispatches=decode(profile),
            host_operations=decode_host_operations(profile) if "queue-events" in families else [],
            queue_events=decode_records(profile, "queue", "queue_event") if "queue-events" in families else [],
            memory_events=decode_records(profile, "memory", "memory_event") if "memory-events" in families else [],
        )


def _benchmark_real_time_ns(stdout: str) -> float | None:
    """Real time per iteration from ``--benchmark_format=json`` output."""
    try:
        result = json.loads(stdout[stdout.index("{"):])["benchmarks"][0]
    except (ValueError, KeyError, IndexError):
        return None
    scale = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}.get(result.get("time_unit"), None)
    return None if scale is None else result["real_time"] * scale


def _profile_jsonl(profile: Path, *command: str) -> list[str]:
    run = subprocess.run([runtime_tool("iree-profile"), *command, "--format=jsonl", str(profile)],
                         capture_output=True, text=True)
    if run.returncode != 0:
        raise ProfileError(f"iree-profile {command[0]} could not decode {profile}: {run.stderr.strip()}")
    return run.stdout.splitlines()


def decode_records(profile: Path, command: str, record_type: str) -> list[dict[str, Any]]:
    """Records of one type (``queue_event``, ``memory_event``) as iree-profile prints them."""
    marker = f'"type":"{record_type}"'
    return [json.loads(line) for line in _profile_jsonl(profile, command) if marker in line]


def decode_host_operations(profile: Path) -> list[dict[str, Any]]:
    """Host-execution records of everything that is not a dispatch (see
    :func:`non_model_operations`)."""
    return non_model_operations(decode_records(profile, "queue", "host_execution_event"))


def non_model_operations(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The non-dispatch records (allocations, command-buffer executions, copies, fills
    ...). Each must be a known non-model operation: anything else is an error that shows
    the record, never a silent drop."""
    others = [r for r in records if r.get("op") != "dispatch"]
    for record in others:
        if record.get("op") not in NON_MODEL_OPERATIONS:
            raise UnresolvedDispatchError(
                f"host-execution record {record.get('event_id')} has operation {record.get('op')!r}, which is "
                f"neither a dispatch nor a known non-model operation ({', '.join(sorted(NON_MODEL_OPERATIONS))}): "
                f"{json.dumps(record, sort_keys=True)}")
    return others


def decode(profile: Path) -> list[DispatchEvent]:
    """The dispatch events of a raw HAL profile, in the order the runtime executed them."""
    lines = _profile_jsonl(profile, "dispatch", "--dispatch_events")
    events = [_event(json.loads(line)) for line in lines if '"host_dispatch_event"' in line]
    # local-task numbers commands (dispatches and barriers alternate: 0, 2, 4, ...);
    # local-sync does not, and records them in execution order.
    return sorted(events, key=lambda e: (e.submission_id, e.command_buffer_id, e.command_index or 0, e.start_ns))


def _event(record: dict[str, Any]) -> DispatchEvent:
    index = record.get("command_index")
    return DispatchEvent(
        key=record["key"],
        submission_id=record["submission_id"],
        command_buffer_id=record["command_buffer_id"],
        command_index=None if index in (None, NO_COMMAND_INDEX) else index,
        start_ns=record["start_host_time_ns"],
        end_ns=record["end_host_time_ns"],
        workgroup_count=tuple(record.get("workgroup_count") or ()),
        tile_count=record.get("tile_count"),
    )


def join(events: Sequence[DispatchEvent], manifest: dict[str, Any]) -> list[JoinedDispatch]:
    """Give every event the IDs of its call site: the k-th dispatch of an invocation is
    the k-th site in program order; its export must match."""
    sites = manifest["partitions"]["dispatch_sites"]
    if events and not sites:
        raise UnresolvedDispatchError(f"{len(events)} dispatch events but the manifest lists no call sites")
    joined = []
    for position, event in enumerate(events):
        site = sites[position % len(sites)]
        if site["export"] != event.key:
            candidates = [f"#{s['index']} {s['root_id']}" for s in sites if s["export"] == event.key]
            raise UnresolvedDispatchError(
                f"dispatch event {position} (export {event.key}, submission {event.submission_id}, "
                f"command {event.command_index}) does not match call site #{site['index']} "
                f"(export {site['export']}); sites running {event.key}: {', '.join(candidates) or 'none'}"
            )
        joined.append(JoinedDispatch(event, site["index"], site["root_id"], tuple(site["fused_ids"])))
    return joined
