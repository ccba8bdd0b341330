"""Per-dispatch events from IREE's HAL profiling, joined to dfit IDs.

Capture goes through the shipped ``iree-run-module`` (the Python runtime bindings cannot
capture a profile, RUNTIME-NOTES.md) with the families the driver records
(``drivers.CAPABILITIES``: ``host-execution`` on the CPU drivers, ``dispatch-events``
with device timestamps on the GPU drivers), and decoding through ``iree-profile dispatch
--dispatch_events --format=jsonl``. Both families give the same keys per dispatch
(submission, command buffer, command index, export, workgroups); device ticks are put on
the host's clock with the profile's clock-correlation samples (:class:`ClockFit`), so
the join, the event pipeline and the traces see one kind of record whatever the driver. A run
decodes the dispatch records straight to columns (:func:`decode_columns`, Arrow's JSON
reader over the tool's output, a block at a time) and joins those, with no Python
object per record; :func:`decode` gives the same records as objects (the reference).

The join is structural (:func:`join_structural`): each runtime command buffer's
records are matched to the one command-buffer recording of the ``hal``-phase host code
that explains them (``partitions.recordings``, ``passes/recordings.py``), and each
record to the command of that recording — hence to the call site that issued it,
however often the recording runs (loops), whether it runs at all (branches), and
whichever call site of a deduplicated export it is. Submissions are split into
invocations by the host code's structure too (``join_records.invocation_starts``) or, for a
function with no command-buffer execution in its entry block, by the benchmark tool's
per-invocation profile flushes (:mod:`profile_flushes`) — never by time. A record
nothing explains, or that two recordings explain equally, is an error that shows the
record and the candidates — never a guess, never a silent drop.
"""

from __future__ import annotations

import bisect
import errno
import json
import os
import subprocess
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Sequence

from dfit_mlir.core import atomic, children
from dfit_mlir.core.errors import EXIT_TOOLCHAIN_FAILED, DfitError
from dfit_mlir.core.perf import paused_gc
from dfit_mlir.core.toolchain import runtime_tool
from dfit_mlir.runtime_hooks.columnar_join import join_columns
from dfit_mlir.runtime_hooks.join_records import (
    NO_COMMAND_INDEX,
    DispatchColumns,
    DispatchEvent,
    JoinColumns,
    UnresolvedDispatchError,
    candidate_recordings,
    explains,
    invocation_starts,
)
from dfit_mlir.runtime_hooks.profile_file import Records

#: The CPU drivers (the tests run each); every driver's families are in ``drivers.CAPABILITIES``.
DRIVERS = ("local-sync", "local-task")
#: HAL profiling families a ``full`` run records on the CPU drivers (all cheap there,
#: RUNTIME-NOTES.md); ``dispatch-events`` is unimplemented on ``local-*``.
FULL_FAMILIES = ("host-execution", "queue-events", "memory-events")
#: Families whose records carry device ticks (fitted to the host clock on decoding).
DEVICE_TICK_FAMILIES = frozenset({"dispatch-events", "device-queue-events"})
#: ``type`` of a dispatch record in ``iree-profile dispatch --dispatch_events``, per family.
DISPATCH_RECORD_TYPES = ("host_dispatch_event", "dispatch_event")
#: Queue operations that move or manage memory or launch command buffers: runtime work
#: that belongs to no source op. IREE 3.13's host-execution ``op`` names.
NON_MODEL_OPERATIONS = frozenset({
    "alloca", "dealloca", "execute", "copy", "fill", "update", "read", "write", "barrier", "host_call",
    "transfer",
})


class ProfileError(DfitError):
    """Capturing or decoding a HAL profile failed."""

    exit_code = EXIT_TOOLCHAIN_FAILED


class ToolFault(ProfileError):
    """An IREE tool died of a signal (or reported one) while running the module."""

    def __init__(self, message: str, tool: str, returncode: int, stderr: str):
        super().__init__(message)
        self.tool, self.returncode, self.stderr = tool, returncode, stderr


@dataclass(frozen=True)
class Profile:
    """What one profiled run recorded, decoded."""

    #: ``iree-benchmark-module``'s real time per invocation (``None`` for one invocation).
    wall_ns_per_invocation: float | None
    #: The dispatch records as columns, in runtime order (:func:`decode_columns`).
    dispatch_records: DispatchColumns
    #: Non-dispatch host-execution records (``op`` in :data:`NON_MODEL_OPERATIONS`).
    #: These families are columns (:class:`profile_file.Records`: named as
    #: ``iree-profile``'s JSON fields; a row is the dict it prints).
    host_operations: Records
    queue_events: Records
    memory_events: Records
    #: Device-timestamped queue operations (``device-queue-events``), their
    #: ``start_host_time_ns`` / ``end_host_time_ns`` placed with :attr:`clocks`.
    device_queue_events: Records = Records({})
    #: The device-tick → host fit of each physical device (device-tick families only).
    clocks: dict[int, ClockFit] | None = None
    #: The families recorded.
    families: tuple[str, ...] = ()
    #: First submission of each invocation that issued any, from the benchmark tool's
    #: per-invocation flushes (:mod:`profile_flushes`); ``None`` when not read (one
    #: invocation, or no queue-events family).
    flush_starts: tuple[int, ...] | None = None

    @cached_property
    def dispatches(self) -> list[DispatchEvent]:
        """The dispatch records as objects (tests, the per-record join); the run's route
        reads :attr:`dispatch_records`."""
        return self.dispatch_records.events()


@dataclass(frozen=True)
class ClockFit:
    """Device ticks of one physical device on the host's clock (``iree_host_time_ns``,
    CLOCK_MONOTONIC): IREE's clock fit (first and last clock-correlation sample of the
    profile, ``iree-profile export``'s ``clock_fit.basis``), taken to the midpoint of the
    host interval each sample was read in; ``uncertainty_ns``: the widest interval."""

    device: int
    first_tick: int
    first_host_ns: int
    last_tick: int
    last_host_ns: int
    samples: int
    uncertainty_ns: int

    @property
    def ns_per_tick(self) -> float:
        return (self.last_host_ns - self.first_host_ns) / (self.last_tick - self.first_tick)

    def to_host(self, ticks: Any) -> Any:
        """Host ns of ``ticks`` (an int or a numpy array of them), rounded to the ns."""
        import numpy as np

        offset = np.rint((np.asarray(ticks, dtype=np.int64) - self.first_tick) * self.ns_per_tick).astype(np.int64)
        return self.first_host_ns + offset if offset.ndim else int(self.first_host_ns + offset)

    def summary(self) -> dict[str, Any]:
        return {"device": self.device, "basis": "first_last_clock_correlation", "to": "iree_host_time_ns",
                "samples": self.samples, "ns_per_tick": round(self.ns_per_tick, 9),
                "uncertainty_ns": self.uncertainty_ns}


def clock_fits(profile: Path) -> dict[int, ClockFit]:
    """Each physical device's :class:`ClockFit`, from the ``clock_correlation`` records
    of ``iree-profile export`` (streamed, only those lines parsed). A device with fewer
    than two usable samples has no fit: its ticks cannot be placed, which is an error
    where they are read, not a guess."""
    command = [runtime_tool("iree-profile"), "export", "--format=ireeperf-jsonl", str(profile)]
    samples: dict[int, list[tuple[int, int, int]]] = {}
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          preexec_fn=children.tied_to_dfit()) as child:
        assert child.stdout is not None
        for line in child.stdout:
            if '"record_type":"clock_correlation"' not in line:
                continue
            record = json.loads(line)
            if "device_tick" not in record or "host_time_begin_ns" not in record:
                continue
            begin, end = record["host_time_begin_ns"], record["host_time_end_ns"]
            samples.setdefault(record.get("physical_device_ordinal", 0), []).append(
                (record["device_tick"], (begin + end) // 2, end - begin))
        stderr = child.stderr.read() if child.stderr else ""
    if child.returncode != 0:
        raise ProfileError(f"iree-profile export could not decode {profile}: {stderr.strip()}")
    return _fits(samples)


def _fit(clocks: dict[int, ClockFit] | None, device: int, what: str) -> ClockFit:
    if not clocks or device not in clocks:
        raise ProfileError(f"{what} of physical device {device} carries device ticks, but the profile has no clock "
                           f"fit for that device (fewer than two clock-correlation samples), so its times cannot be "
                           f"placed on the host's clock")
    return clocks[device]


def place_device_events(records: list[dict[str, Any]], clocks: dict[int, ClockFit] | None) -> list[dict[str, Any]]:
    """``queue_device_event`` records with ``start_host_time_ns`` / ``end_host_time_ns``
    from their ticks (:class:`ClockFit`); a record without valid ticks is an error."""
    placed = []
    for record in records:
        if not record.get("valid", True):
            raise ProfileError(f"device queue record without valid timestamps: {json.dumps(record, sort_keys=True)}")
        fit = _fit(clocks, record.get("physical_device_ordinal", 0), "a device queue record")
        placed.append({**record, "start_host_time_ns": fit.to_host(record["start_tick"]),
                       "end_host_time_ns": fit.to_host(record["end_tick"])})
    return placed


@dataclass(frozen=True, slots=True)
class JoinedDispatch:
    event: DispatchEvent
    site_index: int
    root_id: str | None
    fused_ids: tuple[str, ...]
    #: ``load`` (an initializer's work when the module is loaded) or ``invocation``.
    phase: str = "invocation"


def capture(vmfb: Path, inputs: Sequence[str], *, driver: str = "local-sync",
            function: str | None = None, invocations: int = 1) -> list[DispatchEvent]:
    """The dispatch events of :func:`capture_profile` (host-execution only)."""
    return capture_profile(vmfb, inputs, driver=driver, function=function, invocations=invocations,
                           families=("host-execution",)).dispatches


def capture_profile(vmfb: Path, inputs: Sequence[str], *, driver: str = "local-sync",
                    function: str | None = None, invocations: int = 1,
                    families: Sequence[str] = FULL_FAMILIES) -> Profile:
    """Run ``vmfb`` under HAL profiling of ``families`` (:func:`record_profile`) and
    decode what it recorded (:func:`decode_profile`)."""
    with atomic.scratch_directory("dfit-profile-") as tmp:
        profile = Path(tmp) / "profile.bin"
        tool, stdout = record_profile(vmfb, inputs, profile, driver=driver, function=function,
                                      invocations=invocations, families=families)
        wall = _benchmark_real_time_ns(stdout) if tool == "iree-benchmark-module" else None
        return decode_profile(profile, families, invocations, wall)


def decode_profile(profile: Path, families: Sequence[str], invocations: int,
                   wall_ns_per_invocation: float | None = None, *, direct: bool | None = None) -> Profile:
    """The :class:`Profile` of the raw profile ``profile``. ``direct`` (default: when
    :func:`profile_file.supported`): read the file itself (:mod:`profile_file`, one pass,
    columns); otherwise decode it with ``iree-profile`` (the reference, and the route for
    a format version the reader does not know)."""
    from dfit_mlir.runtime_hooks import profile_file

    try:
        if direct if direct is not None else profile_file.supported(profile):
            return _decode_direct(profile, families, invocations, wall_ns_per_invocation)
    except profile_file.ProfileFormatError as error:
        raise DamagedProfileError(f"cannot read the HAL profile: {error}") from None
    queue_events = decode_records(profile, "queue", "queue_event") if "queue-events" in families else []
    clocks = clock_fits(profile) if DEVICE_TICK_FAMILIES.intersection(families) else None
    device_queue = place_device_events(decode_records(profile, "queue", "queue_device_event"), clocks) \
        if "device-queue-events" in families else []
    records = profile_file.Records.from_dicts
    return Profile(
        wall_ns_per_invocation=wall_ns_per_invocation,
        dispatch_records=decode_columns(profile, clocks),
        host_operations=records(decode_host_operations(profile) if "queue-events" in families else []),
        queue_events=records(queue_events),
        memory_events=records(decode_records(profile, "memory", "memory_event") if "memory-events" in families
                              else []),
        flush_starts=_flush_starts(profile, queue_events, invocations, "queue-events" in families),
        device_queue_events=records(device_queue), clocks=clocks, families=tuple(families),
    )


class DamagedProfileError(DfitError):
    """The raw profile is damaged or truncated (exit 2: the message names the file and
    the byte offset)."""


def _decode_direct(profile: Path, families: Sequence[str], invocations: int,
                   wall_ns_per_invocation: float | None) -> Profile:
    """:func:`decode_profile` by :mod:`profile_file`: no subprocess, no object per record."""
    import numpy as np

    from dfit_mlir.runtime_hooks import profile_file as pf

    tables = pf.read_profile(profile)
    if tables.dropped:
        _dropped_error({family.removesuffix("-events") + "-events": n for family, n in tables.dropped.items()})
    clocks = _fits(pf.clock_samples(tables)) if DEVICE_TICK_FAMILIES.intersection(families) else None
    queue = pf.queue_records(tables) if "queue-events" in families else pf.Records({})
    host_operations = pf.host_execution_records(tables) if "queue-events" in families else pf.Records({})
    if host_operations:
        ops = host_operations.columns["op"]
        unknown = np.flatnonzero(~np.isin(ops, np.array(sorted(NON_MODEL_OPERATIONS), dtype=object)))
        if len(unknown):
            non_model_operations([host_operations[int(unknown[0])]])  # raises, the record shown
    device_queue = pf.Records({})
    if "device-queue-events" in families:
        device_queue = _place_device_columns(pf.queue_device_records(tables), clocks)
    flush_starts = None
    if "queue-events" in families and invocations > 1:
        flush_starts = _chunk_starts(tables, profile)
    return Profile(
        wall_ns_per_invocation=wall_ns_per_invocation, dispatch_records=_dispatch_columns(tables, clocks),
        host_operations=host_operations, queue_events=queue,
        memory_events=pf.memory_records(tables) if "memory-events" in families else pf.Records({}),
        flush_starts=flush_starts, device_queue_events=device_queue, clocks=clocks, families=tuple(families))


def _chunk_starts(tables: Any, profile: Path) -> tuple[int, ...]:
    """:func:`profile_flushes.flush_split` over the reader's queue-event chunks: the
    first submission of each flush that holds queue events."""
    import numpy as np

    records = tables.family("queue-events")
    starts = tables.chunk_starts.get("queue-events", np.zeros(0, np.int64))
    streams = tables.chunk_streams.get("queue-events", np.zeros(0, np.int64))
    if len(np.unique(streams)) > 1:
        raise ProfileError(f"cannot read the flushes of {profile.name}: queue events of {len(np.unique(streams))} "
                           f"streams: one flush may write several queue-event chunks, so chunks are not invocations")
    if not len(records):
        return ()
    submissions = records["submission_id"].astype(np.int64)
    firsts = np.minimum.reduceat(submissions, starts)
    lasts = np.maximum.reduceat(submissions, starts)
    late = np.flatnonzero(firsts[1:] <= lasts[:-1])
    if len(late):
        k = int(late[0]) + 1
        raise ProfileError(f"cannot read the flushes of {profile.name}: flush {k} holds submission "
                           f"{int(firsts[k])}, not after the previous flush's last ({int(lasts[k - 1])})")
    return tuple(firsts.tolist())


def _fits(samples: dict[int, list[tuple[int, int, int]]]) -> dict[int, ClockFit]:
    """Per device, the fit through its first and last clock-correlation samples
    ``(device tick, host ns, host uncertainty)`` (two distinct ticks at least)."""
    fits = {}
    for device, found in samples.items():
        found.sort()
        if len(found) >= 2 and found[-1][0] > found[0][0]:
            fits[device] = ClockFit(device, found[0][0], found[0][1], found[-1][0], found[-1][1], len(found),
                                    max(sample[2] for sample in found))
    return fits


def _place_device_columns(records: Any, clocks: dict[int, ClockFit] | None) -> Any:
    """:func:`place_device_events` over columns."""
    import numpy as np

    from dfit_mlir.runtime_hooks.profile_file import Records

    if not records:
        return records
    valid = records.columns["valid"]
    if not valid.all():
        raise ProfileError(f"device queue record without valid timestamps: {records[int(np.flatnonzero(~valid)[0])]}")
    ordinal = records.columns["physical_device_ordinal"]
    start = np.zeros(len(records), np.int64)
    end = np.zeros(len(records), np.int64)
    for number in np.unique(ordinal).tolist():
        fit = _fit(clocks, number, "a device queue record")
        rows = ordinal == number
        start[rows] = fit.to_host(records.columns["start_tick"][rows])
        end[rows] = fit.to_host(records.columns["end_tick"][rows])
    return Records({**records.columns, "start_host_time_ns": start, "end_host_time_ns": end})


def _dispatch_columns(tables: Any, clocks: dict[int, ClockFit] | None) -> DispatchColumns:
    """What :func:`decode_columns` gives, from the reader's tables: the host-execution
    dispatch records and the dispatch-events records, in runtime order."""
    import numpy as np

    host = tables.family("host-execution-events")
    host = host[host["type"] == 2]
    device = tables.family("dispatch-events")
    if len(device):
        valid = (device["start_tick"] != 0) & (device["end_tick"] != 0) & (device["end_tick"] >= device["start_tick"])
        if not valid.all():
            row = device[int(np.flatnonzero(~valid)[0])]
            raise ProfileError(f"dispatch record without valid device timestamps: event {int(row['event_id'])}, "
                               f"submission {int(row['submission_id'])}")
        ordinal = tables.devices("dispatch-events")
        device_start = np.zeros(len(device), np.int64)
        device_end = np.zeros(len(device), np.int64)
        for number in np.unique(ordinal).tolist():
            fit = _fit(clocks, number, "a dispatch record")
            rows = ordinal == number
            device_start[rows] = fit.to_host(device["start_tick"][rows])
            device_end[rows] = fit.to_host(device["end_tick"][rows])
    else:
        device_start = device_end = np.zeros(0, np.int64)

    def both(name: str) -> np.ndarray:
        return np.concatenate([host[name].astype(np.int64), device[name].astype(np.int64)])

    key, keys = tables.keys(both("executable_id"), both("function_ordinal"))
    index = both("command_index")
    distinct, inverse = _distinct_triples(both("wg_x"), both("wg_y"), both("wg_z"))
    sizes, size = _distinct_triples(both("ws_x"), both("ws_y"), both("ws_z"))
    return DispatchColumns(
        key=key, keys=keys, submission_id=both("submission_id"), command_buffer_id=both("command_buffer_id"),
        command_index=np.where(index == NO_COMMAND_INDEX, -1, index),
        start_ns=np.concatenate([host["start_host_time_ns"].astype(np.int64), device_start]),
        end_ns=np.concatenate([host["end_host_time_ns"].astype(np.int64), device_end]),
        workgroup=inverse.ravel().astype(np.int32), workgroup_counts=tuple(tuple(map(int, g)) for g in distinct),
        tile_count=np.concatenate([host["tile_count"].astype(np.int64), np.full(len(device), -1, np.int64)]),
        workgroup_size=size.ravel().astype(np.int32), workgroup_sizes=tuple(tuple(map(int, g)) for g in sizes),
    ).in_runtime_order()


def _distinct_triples(x: Any, y: Any, z: Any) -> tuple[Any, Any]:
    """(the distinct (x, y, z) rows, sorted, and each row's index into them): what
    ``np.unique(..., axis=0)`` gives, without its row-wise sort (seconds on millions of
    rows): each triple is packed into one integer where the values allow."""
    import numpy as np

    grid = np.stack([x, y, z], axis=1)
    if not len(grid) or grid.max() >= 1 << 21:
        distinct, inverse = np.unique(grid, axis=0, return_inverse=True)
        return distinct, inverse.ravel()
    packed = (grid[:, 0] << 42) | (grid[:, 1] << 21) | grid[:, 2]
    values, inverse = np.unique(packed, return_inverse=True)
    distinct = np.stack([values >> 42, (values >> 21) & 0x1FFFFF, values & 0x1FFFFF], axis=1)
    return distinct, inverse.ravel()


def record_profile(vmfb: Path, inputs: Sequence[str], profile: Path, *, driver: str = "local-sync",
                   function: str | None = None, invocations: int = 1,
                   families: Sequence[str] = FULL_FAMILIES) -> tuple[str, str]:
    """Run ``vmfb`` under HAL profiling of ``families``, the raw profile written to
    ``profile``; inputs in ``iree-run-module`` form (``1x3xf32=0.5``, ``@x.npy``). One
    invocation runs ``iree-run-module``; several run ``iree-benchmark-module``, which
    records exactly its timed iterations (it needs ``function``). ``driver``: a driver or
    device URI (``vulkan://0``), checked by ``drivers.choose_device``. (The tool, its stdout.)"""
    running = ProfilingRun.of(vmfb, inputs, profile, driver, function, invocations, families)
    return running.checked(atomic.run_process(running.command))


def start_profiling(vmfb: Path, inputs: Sequence[str], profile: Path, *, driver: str = "local-sync",
                    function: str | None = None, invocations: int = 1,
                    families: Sequence[str] = FULL_FAMILIES) -> ProfilingRun:
    """:func:`record_profile`'s tool started, not waited for (:meth:`ProfilingRun.wait`):
    what the caller does meanwhile runs beside it."""
    running = ProfilingRun.of(vmfb, inputs, profile, driver, function, invocations, families)
    running.child = atomic.start_process(running.command)
    return running


@dataclass
class ProfilingRun:
    """A profiling tool's run (:func:`start_profiling`), and what its errors name."""

    vmfb: Path
    profile: Path
    driver: str
    families: tuple[str, ...]
    invocations: int
    tool: str
    command: list[str]
    child: Any = None  # subprocess.Popen, once started

    @classmethod
    def of(cls, vmfb: Path, inputs: Sequence[str], profile: Path, driver: str, function: str | None,
           invocations: int, families: Sequence[str]) -> ProfilingRun:
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
        return cls(vmfb, profile, driver, tuple(families), invocations, tool, command)

    def wait(self) -> tuple[str, str]:
        """Wait for the tool (interrupted: killed and reaped): (the tool, its stdout)."""
        return self.checked(atomic.finish_process(self.child, self.command))

    def stop(self) -> None:
        """Kill the tool if it still runs (what its run was for failed first), and reap it."""
        if self.child is not None:
            atomic.kill_process(self.child)

    def checked(self, run: subprocess.CompletedProcess[str]) -> tuple[str, str]:
        """(the tool, its stdout) of its finished ``run``, or the error its exit says."""
        tool, profile = self.tool, self.profile
        if run.returncode != 0:
            reason = run.stderr.strip().splitlines()
            if "UNIMPLEMENTED" in run.stderr and "beginning device profiling" in run.stderr:
                raise ProfileError(f"driver {self.driver} does not record one of the profiling families "
                                   f"{', '.join(self.families)} ({reason[-1] if reason else 'UNIMPLEMENTED'})")
            if "out of disk space" in run.stderr:  # IREE's stdio stream: "write failed, possibly out of disk space"
                written = profile.stat().st_size if profile.exists() else 0
                raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} for the HAL profile of {self.invocations} "
                                            f"invocation(s) ({tool} stopped at {written / 1e6:.0f} MB; it is written "
                                            f"under TMPDIR: set it to a folder with room)", str(profile))
            message = f"{tool} failed on {self.vmfb}: {reason[-1] if reason else f'exit {run.returncode}'}"
            raise ToolFault(message, tool, run.returncode, run.stderr)
        return tool, run.stdout


def _flush_starts(profile: Path, queue_events: list[dict[str, Any]], invocations: int,
                  has_queue_events: bool) -> tuple[int, ...] | None:
    """Each invocation's first submission from the profile's flushes (``None`` for one
    invocation or without queue events); a profile whose producer dropped records is an
    error: the dropped dispatches or submissions would be missing from the bundle."""
    from dfit_mlir.runtime_hooks import profile_flushes

    try:
        chunks = profile_flushes.event_chunks(profile)
        split = profile_flushes.flush_split(chunks, queue_events) if has_queue_events else None
    except profile_flushes.FlushLayoutError as error:
        raise ProfileError(f"cannot read the flushes of {profile.name}: {error}") from None
    dropped: dict[str, int] = {}
    for chunk in chunks:
        if chunk.truncated:
            dropped[chunk.family] = dropped.get(chunk.family, 0) + chunk.dropped
    if dropped:
        _dropped_error(dropped)
    return split if split is not None and invocations > 1 else None


def _dropped_error(dropped: dict[str, int]) -> None:
    if dropped:
        raise ProfileError(
            f"the HAL profiler dropped records ({', '.join(f'{n} {family}' for family, n in sorted(dropped.items()))}): "
            f"IREE 3.13's local devices keep at most 4096 events of a family between two flushes (the benchmark "
            f"tool flushes once per invocation), so the run's events would be incomplete; profile fewer loop trips "
            f"or a smaller model per call")


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
                         capture_output=True, text=True, preexec_fn=children.tied_to_dfit())
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


def decode(profile: Path, clocks: dict[int, ClockFit] | None = None) -> list[DispatchEvent]:
    """The dispatch events of a raw HAL profile, in the order the runtime executed them,
    one object per record (the reference for :func:`decode_columns`, which a run uses);
    device ticks placed with ``clocks`` (read from the profile when not given)."""
    lines = _profile_jsonl(profile, "dispatch", "--dispatch_events")
    records = [json.loads(line) for line in lines if 'dispatch_event"' in line]
    if clocks is None and any(r["type"] == "dispatch_event" for r in records):
        clocks = clock_fits(profile)
    events = [_event(r, clocks) for r in records if r["type"] in DISPATCH_RECORD_TYPES]
    # local-task numbers commands (dispatches and barriers alternate: 0, 2, 4, ...);
    # local-sync does not, and records them in execution order.
    return sorted(events, key=lambda e: (e.submission_id, e.command_buffer_id, e.command_index or 0, e.start_ns))


def _event(record: dict[str, Any], clocks: dict[int, ClockFit] | None = None) -> DispatchEvent:
    index = record.get("command_index")
    if record["type"] == "dispatch_event":  # device ticks: on the host clock by the fit
        if not record.get("valid", True):
            raise ProfileError(f"dispatch record without valid timestamps: {json.dumps(record, sort_keys=True)}")
        fit = _fit(clocks, record.get("physical_device_ordinal", 0), "a dispatch record")
        start, end = fit.to_host(record["start_tick"]), fit.to_host(record["end_tick"])
    else:
        start, end = record["start_host_time_ns"], record["end_host_time_ns"]
    return DispatchEvent(
        key=record["key"],
        submission_id=record["submission_id"],
        command_buffer_id=record["command_buffer_id"],
        command_index=None if index in (None, NO_COMMAND_INDEX) else index,
        start_ns=start,
        end_ns=end,
        workgroup_count=tuple(record.get("workgroup_count") or ()),
        tile_count=record.get("tile_count"),
        workgroup_size=tuple(record.get("workgroup_size") or ()),
    )


#: Bytes of iree-profile's JSONL per Arrow block: the decode holds one block at a time.
DECODE_BLOCK_BYTES = 4 << 20
#: The fields of a dispatch line (either :data:`DISPATCH_RECORD_TYPES`) the join reads:
#: host times (host-execution) or device ticks (dispatch-events).
_DISPATCH_FIELDS = (("type", "string"), ("key", "string"), ("submission_id", "int64"),
                    ("command_buffer_id", "int64"), ("command_index", "int64"), ("start_host_time_ns", "int64"),
                    ("end_host_time_ns", "int64"), ("workgroup_count", "list<int64>"), ("tile_count", "int64"),
                    ("workgroup_size", "list<int64>"),
                    ("physical_device_ordinal", "int64"), ("start_tick", "int64"), ("end_tick", "int64"),
                    ("valid", "bool"))


def decode_columns(profile: Path, clocks: dict[int, ClockFit] | None = None) -> DispatchColumns:
    """What :func:`decode` gives, as columns: ``iree-profile``'s JSONL is streamed through
    Arrow's JSON reader a block at a time (:data:`DECODE_BLOCK_BYTES`), so neither the
    text nor a Python object per record is ever held; rows in runtime order. Device
    ticks are placed with ``clocks`` (:func:`clock_fits`)."""
    import tempfile

    import pyarrow as pa
    import pyarrow.json as pj

    types = {"string": pa.string(), "int64": pa.int64(), "list<int64>": pa.list_(pa.int64()), "bool": pa.bool_()}
    schema = pa.schema([(name, types[kind]) for name, kind in _DISPATCH_FIELDS])
    command = [runtime_tool("iree-profile"), "dispatch", "--dispatch_events", "--format=jsonl", str(profile)]
    found = _DispatchBatches(clocks)
    with tempfile.TemporaryFile() as stderr:
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, preexec_fn=children.tied_to_dfit())
        try:
            reader = pj.open_json(child.stdout, read_options=pj.ReadOptions(block_size=DECODE_BLOCK_BYTES),
                                  parse_options=pj.ParseOptions(explicit_schema=schema,
                                                                unexpected_field_behavior="ignore"))
            for batch in reader:
                found.add(batch)
        except pa.ArrowInvalid as error:
            failed: str | None = str(error).splitlines()[0]
        else:
            failed = None
        finally:
            child.stdout.close()  # type: ignore[union-attr]
            returncode = child.wait()
        if returncode != 0:
            stderr.seek(0)
            raise ProfileError(f"iree-profile dispatch could not decode {profile}: "
                               f"{stderr.read().decode(errors='replace').strip()}")
    if failed is not None:
        raise ProfileError(f"iree-profile dispatch printed records of {profile} this reader cannot read: {failed}")
    return found.columns().in_runtime_order()


class _DispatchBatches:
    """The dispatch rows of Arrow batches, gathered as numpy columns (device ticks
    placed on the host clock); export names and workgroup counts coded over all batches."""

    def __init__(self, clocks: dict[int, ClockFit] | None = None) -> None:
        self.clocks = clocks
        self.parts: dict[str, list[Any]] = {name: [] for name in (
            "key", "submission_id", "command_buffer_id", "command_index", "start_ns", "end_ns", "workgroup",
            "tile_count", "workgroup_size")}
        self.keys: dict[str, int] = {}
        self.groups: dict[tuple[int, ...], int] = {}
        self.sizes: dict[tuple[int, ...], int] = {}

    def add(self, batch: Any) -> None:
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        batch = batch.filter(pc.is_in(batch.column("type"), value_set=pa.array(DISPATCH_RECORD_TYPES)))
        if not batch.num_rows:
            return
        if batch.column("key").null_count or batch.column("submission_id").null_count:
            raise ProfileError("iree-profile printed a dispatch record without its export key or submission")

        def integers(name: str, missing: int = -1) -> np.ndarray:
            return pc.fill_null(batch.column(name), missing).to_numpy()

        keys = pc.dictionary_encode(batch.column("key"))
        lookup = np.array([self.keys.setdefault(k, len(self.keys)) for k in keys.dictionary.to_pylist()],
                          dtype=np.int32)
        index = integers("command_index")
        parts = self.parts
        parts["key"].append(lookup[keys.indices.to_numpy()])
        parts["submission_id"].append(integers("submission_id"))
        parts["command_buffer_id"].append(integers("command_buffer_id"))
        parts["command_index"].append(np.where(index == NO_COMMAND_INDEX, -1, index))
        start, end = integers("start_host_time_ns"), integers("end_host_time_ns")
        device = pc.equal(batch.column("type"), "dispatch_event").to_numpy(zero_copy_only=False)
        if device.any():  # the columns may be Arrow's read-only buffers: placed in copies
            start, end = self._place(batch, device, start.copy(), end.copy())
        parts["start_ns"].append(start)
        parts["end_ns"].append(end)
        parts["workgroup"].append(self._workgroups(batch.column("workgroup_count")))
        parts["workgroup_size"].append(self._workgroups(batch.column("workgroup_size"), self.sizes))
        parts["tile_count"].append(integers("tile_count"))

    def _place(self, batch: Any, device: Any, start: Any, end: Any) -> tuple[Any, Any]:
        """``start`` and ``end`` with the device-tick rows (``device``) set to their host
        times, per physical device."""
        import numpy as np
        import pyarrow.compute as pc

        valid = pc.fill_null(batch.column("valid"), True).to_numpy(zero_copy_only=False)
        ticks = [pc.fill_null(batch.column(name), -1).to_numpy() for name in ("start_tick", "end_tick")]
        if (device & (~valid | (ticks[0] < 0) | (ticks[1] < 0))).any():
            row = int(np.flatnonzero(device & ~valid)[0]) if (device & ~valid).any() else 0
            raise ProfileError(f"dispatch record without valid device timestamps: {batch.slice(row, 1).to_pylist()}")
        ordinal = pc.fill_null(batch.column("physical_device_ordinal"), 0).to_numpy()
        for number in np.unique(ordinal[device]).tolist():
            fit = _fit(self.clocks, number, "a dispatch record")
            rows = device & (ordinal == number)
            start[rows] = fit.to_host(ticks[0][rows])
            end[rows] = fit.to_host(ticks[1][rows])
        return start, end

    def _workgroups(self, counts: Any, table: dict[tuple[int, ...], int] | None = None) -> Any:
        """Each row's workgroup count (or size) as a code of its distinct tuple in
        ``table`` (the counts' by default; ``()``: none)."""
        import numpy as np
        import pyarrow.compute as pc

        lengths = pc.fill_null(pc.list_value_length(counts), 0).to_numpy()
        values = pc.list_flatten(counts).to_numpy()
        if len(values) and (lengths == 3).all() and values.min() >= 0 and values.max() < 1 << 21:
            # The usual x, y, z: one int64 each, so numpy finds the distinct ones.
            grid = values.reshape(-1, 3)
            packed = (grid[:, 0] << 42) | (grid[:, 1] << 21) | grid[:, 2]
            distinct, inverse = np.unique(packed, return_inverse=True)
            triples = [(int(v >> 42), int((v >> 21) & 0x1FFFFF), int(v & 0x1FFFFF)) for v in distinct.tolist()]
        else:
            rows = [tuple(v) if v else () for v in counts.to_pylist()]
            code = {row: k for k, row in enumerate(dict.fromkeys(rows))}
            triples = list(code)
            inverse = np.fromiter(map(code.__getitem__, rows), np.int64, len(rows))
        table = self.groups if table is None else table
        lookup = np.array([table.setdefault(g, len(table)) for g in triples], dtype=np.int32)
        return lookup[inverse.ravel()] if len(lookup) else np.zeros(0, np.int32)

    def columns(self) -> DispatchColumns:
        import numpy as np

        def joined(name: str, dtype: Any) -> np.ndarray:
            return np.concatenate(self.parts[name]).astype(dtype, copy=False) if self.parts[name] \
                else np.zeros(0, dtype)

        return DispatchColumns(
            key=joined("key", np.int32), keys=tuple(self.keys), submission_id=joined("submission_id", np.int64),
            command_buffer_id=joined("command_buffer_id", np.int64),
            command_index=joined("command_index", np.int64), start_ns=joined("start_ns", np.int64),
            end_ns=joined("end_ns", np.int64), workgroup=joined("workgroup", np.int32),
            workgroup_counts=tuple(self.groups), tile_count=joined("tile_count", np.int64),
            workgroup_size=joined("workgroup_size", np.int32), workgroup_sizes=tuple(self.sizes))


@dataclass(frozen=True)
class Join:
    """Where each invocation starts (its first submission id), the buffers' recordings,
    and every record's call site and invocation as columns (``columns``, what the event
    pipeline reads); ``invocations`` / ``load_time`` give them as records, built on use."""

    starts: list[int]
    #: command_buffer_id -> recording index, as matched.
    recording_of_buffer: dict[int, int]
    columns: JoinColumns
    #: The records joined (``columns.event`` indexes them): objects, or columns as decoded.
    events: Sequence[DispatchEvent] | DispatchColumns
    sites: Sequence[dict[str, Any]]
    count: int

    @cached_property
    def invocations(self) -> list[list[JoinedDispatch]]:
        """Dispatches per recorded invocation, in runtime order."""
        found: list[list[JoinedDispatch]] = [[] for _ in range(self.count)]
        for event, site, invocation in self._rows():
            if invocation >= 0:
                found[invocation].append(self._record(event, site, "invocation"))
        return found

    @cached_property
    def load_time(self) -> list[JoinedDispatch]:
        return [self._record(event, site, "load") for event, site, invocation in self._rows() if invocation < 0]

    def _rows(self) -> Any:
        columns = self.columns
        return zip(columns.event.tolist(), columns.site.tolist(), columns.invocation.tolist(), strict=True)

    @cached_property
    def _site_by_index(self) -> dict[int, dict[str, Any]]:
        return {site["index"]: site for site in self.sites}

    def _record(self, event: int, site: int, phase: str) -> JoinedDispatch:
        found = self._site_by_index[site]
        records = self.events
        record = records.event(event) if isinstance(records, DispatchColumns) else records[event]
        return JoinedDispatch(record, found["index"], found["root_id"], tuple(found["fused_ids"]), phase)

    def invocation_of_submission(self, submission_id: int) -> int:
        """Index of the invocation a submission belongs to; -1 for load time."""
        return bisect.bisect_right(self.starts, submission_id) - 1


@paused_gc()
def join_structural(events: Sequence[DispatchEvent] | DispatchColumns, manifest: dict[str, Any], function: str,
                    invocations: int, execute_submissions: Sequence[tuple[int, int]] = (),
                    flush_starts: Sequence[int] | None = None) -> Join:
    """Give every dispatch record the call site that issued it (see the module doc).

    ``events``: the dispatch records of a run of ``invocations`` calls of ``function``,
    as columns (:func:`decode_columns`: the run's route) or objects (:func:`decode`);
    ``execute_submissions``: (submission_id, command_buffer_id) of every command-buffer
    execution (host-execution ``execute`` records), which places the invocations of a
    function whose anchor recording issued no dispatch record; ``flush_starts``: each
    invocation's first submission from the profile's flushes (:attr:`Profile.flush_starts`),
    which places those of a function without an anchor."""
    partitions = manifest["partitions"]
    if "recordings" not in partitions:
        raise UnresolvedDispatchError(
            "the manifest has no command-buffer recordings (it predates the structural join): recompile with "
            "`dfit compile --dfit-tag`")
    records = events if isinstance(events, DispatchColumns) else DispatchColumns.from_events(events)
    fast = join_columns(records, manifest, function, invocations, execute_submissions, flush_starts)
    if fast is not None:
        columns, starts, recording_of_buffer = fast
        return Join(starts, recording_of_buffer, columns, events, partitions["dispatch_sites"], invocations)
    # The fallback reads records as objects: the columns' rows keep their indices.
    objects = events.events() if isinstance(events, DispatchColumns) else events
    return _join_per_record(objects, manifest, function, invocations, execute_submissions, flush_starts)


def _join_per_record(events: Sequence[DispatchEvent], manifest: dict[str, Any], function: str, invocations: int,
                     execute_submissions: Sequence[tuple[int, int]],
                     flush_starts: Sequence[int] | None = None) -> Join:
    """The join record by record: what :mod:`columnar_join` falls back on where blocks
    are ambiguous (decided by creation order) or unexplained (the error, record shown)."""
    import numpy as np

    partitions = manifest["partitions"]
    recordings = partitions["recordings"]
    sites = partitions["dispatch_sites"]
    invocation_ids, load_ids = candidate_recordings(manifest, function)
    numbered = any(e.command_index is not None for e in events)
    # Records of one command-buffer execution: same submission and command buffer.
    blocks: dict[tuple[int, int], list[DispatchEvent]] = {}
    for event in events:
        blocks.setdefault((event.submission_id, event.command_buffer_id), []).append(event)
    recording_of_buffer: dict[int, int] = {}
    placed: dict[tuple[int, int], tuple[int, list[int]]] = {}
    # A command buffer replays the same commands: a block already explained (same
    # buffer, same exports, indices and workgroups) needs no second match.
    explained: dict[tuple[Any, ...], tuple[int, list[int]]] = {}
    # Blocks of memoized buffers that several recordings explain equally, per buffer.
    pending: dict[int, list[tuple[tuple[int, int], list[tuple[int, list[int]]], list[int]]]] = {}
    keys = sorted(blocks)
    for key in keys:
        block = blocks[key]
        if len(block) > 1:
            # local-task: command order; local-sync (unnumbered): execution order.
            block.sort(key=(lambda e: (e.command_index if e.command_index is not None else -1, e.start_ns))
                       if numbered else (lambda e: e.start_ns))
        buffer = key[1]
        if len(block) == 1:
            only = block[0]
            signature: tuple[Any, ...] = (buffer, only.command_index, only.key, only.workgroup_count)
        else:
            signature = (buffer, *((e.command_index, e.key, e.workgroup_count) for e in block))
        fit = explained.get(signature)
        if fit is None:
            known = recording_of_buffer.get(buffer)
            pool = [known] if known is not None else load_ids + invocation_ids
            fits = [(index, positions) for index in pool
                    if (positions := explains(recordings[index], block, numbered)) is not None]
            if len(fits) > 1 and all(recordings[index].get("global_name") for index, _ in fits):
                pending.setdefault(buffer, []).append((key, fits, pool))  # decided by creation order
                continue
            if len(fits) != 1:
                raise UnresolvedDispatchError(_unresolved(block, fits, pool, recordings, function))
            fit = explained[signature] = fits[0]
            recording_of_buffer[buffer] = fit[0]
        placed[key] = fit
    if pending:
        _by_creation_order(pending, recording_of_buffer, recordings, placed, blocks, function)
    starts = invocation_starts(manifest, function, invocations, recording_of_buffer, execute_submissions or keys,
                               flush_starts)
    load = set(load_ids)
    # Site index of each recording's commands, built once.
    site_of: dict[tuple[int, int], int] = {}
    for recording in recordings:
        for position, command in enumerate(recording["commands"]):
            if command.get("site") is not None:
                site_of[recording["index"], position] = sites[command["site"]]["index"]
    index_of = {id(event): i for i, event in enumerate(events)}
    rows: list[tuple[int, int, int]] = []  # (record, site, invocation: -1 at load)
    first = starts[0] if starts else None
    locate = bisect.bisect_right
    for key in keys:
        index, positions = placed[key]
        invocation = locate(starts, key[0]) - 1
        phase = "load" if index in load else "invocation"
        if index in load and invocation >= 0 or index not in load and invocation < 0:
            recording = recordings[index]
            where = f"invocation {invocation}" if invocation >= 0 else f"load time (before submission {first})"
            raise UnresolvedDispatchError(
                f"dispatch record {_describe(blocks[key][0])} of {phase}-phase recording #{index} "
                f"({recording['function']}) was submitted in {where} of {function}")
        for event, position in zip(blocks[key], positions, strict=True):
            rows.append((index_of[id(event)], site_of[index, position], -1 if phase == "load" else invocation))
    # Blocks went in submission order, each in command order: runtime order already.
    order = np.array([row[0] for row in rows], dtype=np.int64)
    start = np.array([events[i].start_ns for i in order.tolist()], dtype=np.int64)
    columns = JoinColumns(
        event=order, site=np.array([row[1] for row in rows], dtype=np.int32),
        invocation=np.array([row[2] for row in rows], dtype=np.int32), start_ns=start,
        duration_ns=np.array([events[i].end_ns for i in order.tolist()], dtype=np.int64) - start,
        workgroups=np.array([int(np.prod(events[i].workgroup_count)) if events[i].workgroup_count else -1
                             for i in order.tolist()], dtype=np.int64),
        tiles=np.array([-1 if events[i].tile_count is None else events[i].tile_count for i in order.tolist()],
                       dtype=np.int64))
    pairs = {pair: code for code, pair in enumerate(dict.fromkeys(
        (events[i].workgroup_count, events[i].workgroup_size) for i in order.tolist()))}
    columns = replace(columns, shape=np.array([pairs[events[i].workgroup_count, events[i].workgroup_size]
                                               for i in order.tolist()], dtype=np.int32), shapes=tuple(pairs))
    return Join(starts, recording_of_buffer, columns, events, sites, invocations)


def _by_creation_order(pending: dict[int, list[tuple[tuple[int, int], list[tuple[int, list[int]]], list[int]]]],
                       recording_of_buffer: dict[int, int], recordings: list[dict[str, Any]],
                       placed: dict[tuple[int, int], tuple[int, list[int]]],
                       blocks: dict[tuple[int, int], list[DispatchEvent]], function: str) -> None:
    """Decide between recordings with the same commands (a deduplicated export at two
    places, on local-sync where commands are not numbered) by when their buffers were
    created: memoized command buffers are recorded once at load, by the initializers in
    module order, so their ``command_buffer_id`` grows with the recording's index. A
    buffer takes the one candidate between its neighbours' recordings, and no recording
    another buffer has; anything still open is the ambiguity error."""
    memoized = {r["index"] for r in recordings if r.get("global_name")}
    known = {buffer: index for buffer, index in recording_of_buffer.items() if index in memoized}
    candidates = {buffer: set.intersection(*({index for index, _ in fits} for _, fits, _ in entries))
                  for buffer, entries in pending.items()}
    # Every assignment of recordings to these buffers that grows with the buffer id and
    # gives no recording two buffers; exactly one must remain.
    order = sorted({*known, *candidates})
    options = [[known[b]] if b in known else sorted(candidates[b]) for b in order]
    solutions: list[list[int]] = []

    def extend(position: int, chosen: list[int]) -> None:
        if len(solutions) > 1:
            return
        if position == len(order):
            solutions.append(list(chosen))
            return
        for index in options[position]:
            if not chosen or index > chosen[-1]:
                extend(position + 1, [*chosen, index])

    extend(0, [])
    if len(solutions) == 1:
        for buffer, index in zip(order, solutions[0], strict=True):
            known[buffer] = recording_of_buffer[buffer] = index
    for buffer, entries in pending.items():
        for key, fits, pool in entries:
            chosen = [fit for fit in fits if fit[0] == known.get(buffer)]
            if len(chosen) != 1:
                raise UnresolvedDispatchError(_unresolved(blocks[key], fits, pool, recordings, function))
            placed[key] = chosen[0]


def _describe(event: DispatchEvent) -> str:
    index = "unnumbered" if event.command_index is None else event.command_index
    return (f"(export {event.key}, submission {event.submission_id}, command buffer {event.command_buffer_id}, "
            f"command {index}, workgroups {'x'.join(map(str, event.workgroup_count)) or '?'})")


def _unresolved(block: Sequence[DispatchEvent], fits: list[tuple[int, list[int]]], pool: list[int],
                recordings: list[dict[str, Any]], function: str) -> str:
    shown = "; ".join(_describe(e) for e in block[:4]) + ("; …" if len(block) > 4 else "")
    records = f"({len(block)} dispatch record{'s' if len(block) != 1 else ''}: {shown})"

    def show(index: int) -> str:
        r = recordings[index]
        dispatches = [f"{c.get('export')}@{position}" for position, c in enumerate(r["commands"])
                      if c["op"].startswith("dispatch")]
        return f"#{index} {r['function']} [{', '.join(dispatches)}]"

    if fits:
        return (f"command buffer {block[0].command_buffer_id} of submission {block[0].submission_id} {records} is "
                f"explained equally by recordings {', '.join(show(i) for i, _ in fits)}")
    return (f"command buffer {block[0].command_buffer_id} of submission {block[0].submission_id} {records} is "
            f"explained by no command-buffer recording that {function} or an initializer executes; candidates: "
            f"{', '.join(show(i) for i in pool) or 'none'}")


def join(events: Sequence[DispatchEvent], manifest: dict[str, Any], function: str | None = None,
         invocations: int = 1) -> list[JoinedDispatch]:
    """The invocation-time dispatches of :func:`join_structural`, in runtime order (the
    function defaults to the module's only public one)."""
    if function is None:
        from dfit_mlir.runtime_hooks.inputs import entry_function

        function = entry_function(manifest, None)
    result = join_structural(events, manifest, function, invocations)
    return [j for block in result.invocations for j in block]
