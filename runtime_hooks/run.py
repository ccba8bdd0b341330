"""``dfit run``: run a compiled module and write a run bundle (``dfit_mlir/exporters/bundle.py``).

Modes:

* ``none`` — the module runs in this process with nothing recorded but the wall time
  of each invocation (in the summary): the baseline the others are compared with;
* ``ids`` — one ``program`` event per invocation, no hook in the module;
* ``lite`` — plus ``function`` events from the probe calls a lite compile inserts,
  received by the ``dfit`` hook module (``runtime_hooks/instrument.py``), and ``queue``
  events of the same invocations from a second pass under HAL profiling;
* ``full`` — under HAL profiling through the shipped ``iree-run-module`` /
  ``iree-benchmark-module``: one ``dispatch`` event per dispatch joined to the call site
  that issued it (``hal_profile.join_structural``), ``queue`` events (submissions,
  non-model host operations: allocations, command buffer executions, copies, and on a
  GPU the device's spans of them) and ``memory`` events (pool reservations,
  allocations), each in the invocation of its submission.

Which profiling families a run asks for, and which clock its times come from, is the
driver's row in ``drivers.CAPABILITIES`` (the summary records both); every time in the
bundle is on the host's clock.

``none`` and ``ids`` run any vmfb (no manifest needed); the function comes from the
vmfb's export table; inputs not given are made so the model can take them
(``inputs.default_inputs``). The module always runs in a child process, so a fault in
it is a :class:`ModuleFaultError`, not a dead ``dfit``.

``tensors`` (in-process modes): statistics of the values a ``--tensors`` compile traces.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from dfit_mlir.core import atomic, children
from dfit_mlir.core import manifest as manifest_io
from dfit_mlir.core.errors import DfitError, InvalidInputError, ModuleFaultError
from dfit_mlir.core.event_pipeline import EventPipeline, EventRow, Policy
from dfit_mlir.core.paged import PagedArrays
from dfit_mlir.core.perf import add_counts, release_freed_memory
from dfit_mlir.core.vmfb import exported_functions
from dfit_mlir.exporters.bundle import BUNDLE_KIND, withdraw_streamed_traces, write_bundle
from dfit_mlir.exporters.trace_plan import TraceLimit
from dfit_mlir.runtime_hooks import drivers, hal_profile, profile_file
from dfit_mlir.runtime_hooks.inputs import (
    check_indices,
    check_inputs,
    default_inputs,
    load_input,
    signature,
)
from dfit_mlir.runtime_hooks.instrument import InstrumentedModule, piecewise_duration_stats
from dfit_mlir.runtime_hooks.join_records import Executions
from dfit_mlir.runtime_hooks.tensors import TensorPolicy

MODES = ("none", "ids", "lite", "full")
#: Modes that read the compile's manifest (IDs, probes, call sites); the others run any vmfb.
MANIFEST_MODES = ("lite", "full")


@dataclass(frozen=True)
class RunResult:
    bundle: Path
    summary: dict[str, Any]


def run_bundle(vmfb: Path, manifest_path: Path | None, bundle: Path, *, mode: str = "full",
               inputs: Sequence[str] = (), repeat: int = 1, warmup: int = 0, driver: str = "local-task",
               function: str | None = None, policy: Policy | None = None,
               tensors: TensorPolicy | None = None, placement: dict[str, Any] | None = None,
               max_input_bytes: int | None = None) -> RunResult:
    """Run ``vmfb`` ``warmup + repeat`` times, record the last ``repeat``, write the bundle.

    ``placement``: where the run ran, for multi-host jobs (``host``, ``rank``,
    ``clock_offset_ns``: what to add to its times to get the job's clock), kept in
    summary.json where ``dfit merge`` and ``dfit collect`` read it.

    The module runs in a child process (the IREE tools for ``full``, a spawned Python
    for the in-process modes): a fault in it (SIGSEGV, SIGABRT) becomes a
    :class:`ModuleFaultError` naming the module, function, invocation, signal and saved
    inputs, and no bundle is written.

    Its inputs and profile are kept in a scratch folder, ``$TMPDIR/dfit-run-<pid>-*``,
    removed when it ends; the folders that runs killed before it left are removed first
    (:func:`atomic.remove_stale_scratch`)."""
    if mode not in MODES:
        raise InvalidInputError(f"mode {mode!r} is not one of {', '.join(MODES)}")
    if not vmfb.is_file():
        raise InvalidInputError(f"{vmfb}: no such file")
    if is_mlir_source(vmfb):
        raise InvalidInputError(f"{vmfb}: this is MLIR source, not a compiled module; compile it first with "
                                f"`dfit compile {vmfb} -o {vmfb.with_suffix('.vmfb').name} --dfit-tag`, "
                                f"then run the .vmfb")
    if repeat < 1 or warmup < 0:
        raise InvalidInputError("--repeat must be at least 1 and --warmup at least 0")
    if tensors is not None and mode == "full":
        raise InvalidInputError("--tensors needs an in-process mode (ids or lite): full runs under iree-run-module, "
                                "which prints traced tensors instead of handing them to dfit")
    manifest_path = manifest_path or manifest_io.default_path(vmfb)
    manifest: dict[str, Any] | None = None
    if manifest_path.is_file():
        manifest = manifest_io.load(manifest_path)
        manifest_io.check_belongs(manifest, vmfb, str(manifest_path))
    elif mode in MANIFEST_MODES:
        raise InvalidInputError(
            f"{manifest_path}: no such file; --mode {mode} needs the manifest of a `dfit compile --dfit-tag` "
            f"(--mode none and ids run any vmfb)")
    policy = policy or Policy(mode=mode)
    function, arguments, abi_model = entry_point(vmfb, manifest, function)
    device = drivers.choose_device(vmfb, driver)  # after entry_point: the vmfb is readable
    caps = drivers.capabilities(device.driver)
    driver = device.runtime_uri
    if abi_model == "coarse-fences" and mode != "full":
        raise InvalidInputError(f"{vmfb}: {function} is an async (coarse-fences) function, which the in-process "
                                f"modes cannot call; run it with --mode full (the IREE tools pass its fences)")
    atomic.remove_stale_scratch()  # what runs killed before this one left (a profile can take GBs)
    with atomic.scratch_directory("dfit-run-") as scratch:
        if inputs:
            inputs = check_inputs(inputs, arguments, max_input_bytes)
            check_indices(inputs, manifest, function)
            made = [{**_argument_entry(a), "made": "given", "value": text}
                    for a, text in zip(arguments, inputs, strict=True)]
        else:
            inputs, plans = default_inputs(arguments, Path(scratch), manifest=manifest, function=function)
            made = [plan.summary_entry(a, text) for a, plan, text in zip(arguments, plans, inputs, strict=True)]
        vmfb_sha256 = manifest["compile"]["vmfb_sha256"] if manifest else _sha256(vmfb)
        summary = {
            "mode": mode, "driver": device.driver, "device": device.summary(), "function": function,
            "repeat": repeat, "warmup": warmup,
            "inputs": made,
            "vmfb": {"path": str(vmfb), "sha256": vmfb_sha256},
            "manifest": str(manifest_path) if manifest else None,
            **{key: value for key, value in (placement or {}).items() if value is not None},
        }
        fault = FaultContext(vmfb, function, inputs, bundle, warmup + repeat)
        if mode == "full":
            assert manifest is not None
            granted = drivers.ask(vmfb, driver, function, len(arguments)) if caps.source == "asked" else None
            families = drivers.run_families(caps, "full", granted)
            # The arrays that grow with the run, in files beside its profile (PagedArrays).
            (paged_folder := Path(scratch) / "paged").mkdir()
            paged = PagedArrays(paged_folder)
            started = StartedRun.start(vmfb, inputs, driver, function, repeat, warmup, families, Path(scratch),
                                       paged)
            try:
                _write_full_bundle(bundle, manifest, policy, summary, lambda early: started.finish(fault, early),
                                   paged, function, repeat, warmup, families, driver)
            finally:
                started.stop()
        else:
            _in_child(InProcessRun(vmfb, manifest or plain_manifest(vmfb, vmfb_sha256), mode, driver,
                                   function, tuple(inputs), repeat, warmup, policy, tensors, summary,
                                   Path(scratch) / "bundle"), fault)
            with atomic.atomic_directory(bundle, kind=BUNDLE_KIND) as tmp:
                for entry in (Path(scratch) / "bundle").iterdir():
                    shutil.move(str(entry), tmp / entry.name)
    return RunResult(bundle, json.loads((bundle / "summary.json").read_text()))


def _argument_entry(argument: dict[str, Any]) -> dict[str, Any]:
    """An argument's shape and dtype (and scalar flag) as the summary's ``inputs`` list them."""
    return {"shape": argument["shape"], "dtype": argument["dtype"],
            **({"scalar": True} if argument.get("scalar") else {})}


def entry_point(vmfb: Path, manifest: dict[str, Any] | None,
                requested: str | None) -> tuple[str, list[dict[str, Any]], str | None]:
    """The function to run and its argument tensors. Candidates are the vmfb's exported
    functions (``__init`` and private helpers are not); ``$async`` twins of a sync
    function are not chosen by default (the tools cannot pass their fences)."""
    exports = {f.name: f for f in exported_functions(vmfb)}
    names = list(exports)
    if requested is not None:
        if requested not in exports:
            raise InvalidInputError(f"{vmfb} exports no function {requested!r} (it exports {', '.join(names) or 'none'})")
        function = requested
    else:
        offered = [n for n in names if not (n.endswith("$async") and n[:-6] in exports)]
        if len(offered) != 1:
            raise InvalidInputError(f"{vmfb} exports {len(offered)} functions ({', '.join(offered) or 'none'}); "
                                    f"choose one with --function")
        function = offered[0]
    manifest_arguments = {a["id"]: a for a in signature(manifest, function)} if manifest else {}
    declared = exports[function].arguments
    if declared is None:
        if not manifest_arguments:
            raise InvalidInputError(f"{vmfb}: cannot read the arguments of {function} from its export table "
                                    f"({exports[function].declaration or 'no declaration'}); give --input")
        return function, list(manifest_arguments.values()), exports[function].abi_model
    if manifest_arguments and not any(a.get("scalar") for a in declared):
        return function, sorted(manifest_arguments.values(), key=lambda a: int(a["id"].rsplit("arg", 1)[1])), \
            exports[function].abi_model
    # The export table is what the runtime takes (scalars included: the manifest lists
    # tensors only); the manifest's entry for a tensor argument keeps its ID and
    # consumers (integer_bounds reads them) and its frontend dtype.
    arguments = []
    for index, argument in enumerate(declared):
        tensor_id = f"{function}/arg{index}"
        known = manifest_arguments.get(tensor_id) if not argument.get("scalar") else None
        arguments.append(known if known is not None else {"id": tensor_id, **argument})
    return function, arguments, exports[function].abi_model


#: MLIR bytecode starts with "ML\xefR"; a vmfb is a FlatBuffer with "IREE" at byte 4,
#: usually inside a zip wrapper (so it starts with "PK\x03\x04").
MLIR_BYTECODE_MAGIC = b"ML\xefR"
VMFB_ZIP_MAGIC = b"PK\x03\x04"


def is_mlir_source(path: Path) -> bool:
    """``path`` holds MLIR (text or bytecode) rather than a compiled module."""
    with open(path, "rb") as handle:
        head = handle.read(4096)
    if head.startswith(MLIR_BYTECODE_MAGIC):
        return True
    if head[4:8] == b"IREE" or head.startswith(VMFB_ZIP_MAGIC) or b"\0" in head:
        return False
    if path.suffix in (".mlir", ".mlirbc"):
        return True
    try:
        text = head.decode()
    except UnicodeDecodeError:
        return False
    return any(word in text for word in ("module", "func.func", "util.func", "#map", "stablehlo.", "torch."))


def plain_manifest(vmfb: Path, vmfb_sha256: str | None = None) -> dict[str, Any]:
    """Stand-in for a vmfb compiled without ``--dfit-tag`` (``none``/``ids`` runs): no
    operators, no call sites — the bundle's events carry no IDs. ``vmfb_sha256``: the
    vmfb's digest where the caller has it already (else it is read here)."""
    return {"schema": manifest_io.SCHEMA_NAME, "version": manifest_io.MANIFEST_VERSION, "plain_vmfb": True,
            "compile": {"output": str(vmfb), "vmfb_sha256": vmfb_sha256 or _sha256(vmfb)},
            "operators": [], "tensors": [],
            "partitions": {"exports": [], "dispatch_sites": []}, "probes": [], "tensor_traces": []}


def _sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass(frozen=True)
class FaultContext:
    """What a fault message names: the module, function, invocation count, inputs."""

    vmfb: Path
    function: str
    inputs: Sequence[str]
    bundle: Path
    invocations: int

    def raise_for(self, signal_number: int, tool: str, detail: str = "", invocation: int | None = None) -> None:
        import signal as signals

        try:
            name = signals.Signals(signal_number).name
        except ValueError:
            name = f"signal {signal_number}"
        saved = self.save_inputs()
        when = (f"in invocation {invocation} of {self.invocations}" if invocation is not None
                else f"during invocations 1..{self.invocations}" if self.invocations > 1 else "in invocation 1 of 1")
        if signal_number == signals.SIGKILL and not detail:
            detail = OUT_OF_MEMORY_HINT
        raise ModuleFaultError(
            f"{self.vmfb}: {self.function} faulted with {name} in {tool} {when} "
            f"(no bundle written); inputs used: {saved}{f' ({detail})' if detail else ''}")

    def save_inputs(self) -> str:
        """Copy generated ``@file.npy`` inputs beside the bundle (they live in a scratch
        directory that is about to go); given inputs are named as given."""
        files = [Path(text[1:]) for text in self.inputs if text.startswith("@")]
        scratch = [f for f in files if f.name.startswith("input") and "dfit-run-" in str(f.parent)]
        if not scratch:
            return " ".join(self.inputs)
        target = self.bundle.with_name(self.bundle.name + ".fault-inputs")
        with atomic.atomic_directory(target, kind="fault-inputs") as tmp:
            for path in scratch:
                shutil.copy2(path, tmp / path.name)
        return str(target)


#: Signals a crashing module dies of (and tools that catch them exit with 128+n or 256-n).
FAULT_SIGNALS = (4, 6, 7, 8, 11)
#: Said of a child killed by SIGKILL, which nothing in a module raises: the kernel's
#: out-of-memory killer sends it (a loop of 2^31 trips under profiling: 13 GB in 2 minutes).
OUT_OF_MEMORY_HINT = ("SIGKILL is how the kernel ends a process when memory runs out: the profiler holds each "
                      "invocation's records until it ends, so a loop of very many trips can exhaust it; "
                      "check the inputs that set trip counts")


def fault_signal(returncode: int) -> int | None:
    """The signal a child process died of (or reported), or ``None``."""
    if returncode < 0:
        return -returncode
    for offset in (128, 256):
        if returncode > offset - 64 and abs(returncode - offset) in FAULT_SIGNALS:
            return abs(returncode - offset)
    return None


@dataclass(frozen=True)
class InProcessRun:
    vmfb: Path
    manifest: dict[str, Any]
    mode: str
    driver: str
    function: str
    inputs: tuple[str, ...]
    repeat: int
    warmup: int
    policy: Policy
    tensors: TensorPolicy | None
    summary: dict[str, Any]
    bundle: Path


#: Seconds an interrupted run's child has to end on SIGTERM before it is killed.
CHILD_END_SECONDS = 5


def _in_child(run: InProcessRun, fault: FaultContext) -> None:
    """Run ``run`` in a spawned Python: the module's faults kill that process, not dfit."""
    import multiprocessing
    import pickle

    context = multiprocessing.get_context("spawn")
    error_file = run.bundle.with_name("error.pickle")
    progress_file = run.bundle.with_name("progress")
    child = context.Process(target=_child_main, args=(run, error_file, progress_file, os.getpid()), daemon=True)
    try:
        # An interrupt while the child is being spawned is raised once it is known (and
        # then ended below): raised inside the spawn, it left a child nobody ended.
        with atomic.signals_held():
            child.start()
        while child.is_alive():
            child.join(atomic.LOST_SIGNAL_CHECK_SECONDS)
            atomic.check_not_interrupted()
    except BaseException:
        if child.pid is not None:
            child.terminate()
            child.join(CHILD_END_SECONDS)
            if child.is_alive():  # SIGTERM not taken (a runtime stuck in a native call): SIGKILL
                child.kill()
                child.join()
        raise
    if error_file.is_file():
        raise pickle.loads(error_file.read_bytes())
    if child.exitcode:
        signal_number = fault_signal(child.exitcode)
        if signal_number is not None:
            reached = progress_file.read_text().strip() if progress_file.is_file() else ""
            fault.raise_for(signal_number, "the in-process runtime (a child Python)",
                            invocation=int(reached) if reached else None)
        raise ModuleFaultError(f"{run.vmfb}: the child process running {run.function} exited with {child.exitcode}")


def _child_main(run: InProcessRun, error_file: Path, progress_file: Path, parent_pid: int) -> None:
    import pickle

    children.die_with_parent(parent_pid)  # a SIGKILLed dfit leaves no run going on

    try:
        _run_in_process(run, progress_file)
    except DfitError as error:
        error_file.write_bytes(pickle.dumps(error))
    except Exception as error:  # the runtime refused the call: the model failed, not dfit
        message = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
        error_file.write_bytes(pickle.dumps(ModuleFaultError(f"{run.vmfb}: {run.function} failed: {message}")))


#: Host memory a device may import in place: IREE's Vulkan driver imports the arrays it
#: is called with and refuses a pointer that is not ``minImportedHostPointerAlignment``
#: (4096 on lavapipe) aligned; page-aligned inputs satisfy every driver.
HOST_IMPORT_ALIGNMENT = 4096


def page_aligned(value: Any) -> Any:
    """``value`` (an input) in page-aligned memory, copied once before any call; scalars
    and arrays already aligned as they are."""

    if not isinstance(value, np.ndarray) or value.ctypes.data % HOST_IMPORT_ALIGNMENT == 0:
        return value
    size = -(-max(value.nbytes, 1) // HOST_IMPORT_ALIGNMENT) * HOST_IMPORT_ALIGNMENT
    block = np.empty(size + HOST_IMPORT_ALIGNMENT, np.uint8)
    start = -block.ctypes.data % HOST_IMPORT_ALIGNMENT
    aligned = block[start:start + value.nbytes].view(value.dtype).reshape(value.shape)
    aligned[...] = value
    return aligned


def _run_in_process(run: InProcessRun, progress_file: Path | None = None) -> None:
    arrays = [page_aligned(load_input(text)) for text in run.inputs]
    summary = dict(run.summary)
    with InstrumentedModule(run.vmfb, run.manifest, mode=run.mode, driver=run.driver, tensors=run.tensors,
                            check_vmfb=False, max_events=run.policy.max_events) as module:
        for index in range(run.warmup + run.repeat):
            if progress_file is not None:  # outside the timed span: which call a fault hit
                progress_file.write_text(str(index + 1))
            module.call(run.function, *arrays, wait=True, record=index >= run.warmup)
        if run.mode == "lite":
            summary["queue_pass"] = _queue_pass(module, run.vmfb, run.manifest, run.inputs, run.driver, run.function,
                                                run.repeat, run.warmup)
            summary["function_spans"] = function_span_coverage(run.manifest)
        module.write_bundle(run.bundle, run.policy, **summary)


@dataclass
class ProfiledRun:
    """A ``full`` run's records: the joined dispatches as columns (recorded invocations
    numbered from 0, load-time dispatches of initializers at :data:`LOAD_INVOCATION`),
    and the queue, host-operation and memory records, each in the invocation its
    submission belongs to (:meth:`hal_profile.Join.invocation_of_submission`)."""

    dispatches: hal_profile.JoinColumns
    invocations: int
    #: Queue events (submissions, host operations, device spans) and memory events.
    queue: tuple[RowColumns, ...]
    memory: tuple[RowColumns, ...]
    warmup_records: int
    #: The benchmark tool's real time per invocation (several invocations only).
    wall_ns_per_invocation: float | None = None
    #: Records of load time (initializers) and of no submission, counted.
    load_records: int = 0
    unsubmitted_records: int = 0
    #: The profiling families recorded, the driver's row, and the clock fits used.
    families: tuple[str, ...] = hal_profile.FULL_FAMILIES
    capabilities: drivers.DriverCapabilities | None = None
    clocks: tuple[hal_profile.ClockFit, ...] = ()

    def pipeline(self, manifest: dict[str, Any], policy: Policy, sink: Any) -> EventPipeline:
        pipeline = new_pipeline(manifest, policy, sink)
        # Load-time dispatches (initializers, run once when the module is loaded) carry
        # invocation -1: they are no invocation's work. Their sites say phase "load".
        if len(self.dispatches.site):
            _add_dispatches(pipeline, self.dispatches)
        for part in self.queue:
            part.add_to(pipeline, "queue")
        for part in self.memory:
            part.add_to(pipeline, "memory")
        return pipeline

    @property
    def queue_rows(self) -> list[EventRow]:
        """The queue events as objects (lite's queue pass, tests)."""
        return [row for part in self.queue for row in part.rows()]

    @property
    def memory_rows(self) -> list[EventRow]:
        return [row for part in self.memory for row in part.rows()]

    def summary(self) -> dict[str, Any]:
        totals = RunTotals(self.invocations)
        totals.add_dispatches(self.dispatches)
        totals.queue, totals.memory = sum(map(len, self.queue)), sum(map(len, self.memory))
        totals.warmup, totals.load, totals.unsubmitted = self.warmup_records, self.load_records, \
            self.unsubmitted_records
        return run_summary(totals, self.families, self.capabilities, self.wall_ns_per_invocation,
                           self.clock_summary())

    def clock_summary(self) -> dict[str, Any]:
        return clock_summary(self.capabilities, self.families, self.clocks)


def clock_summary(capabilities: drivers.DriverCapabilities | None, families: Sequence[str],
                  clocks: Sequence[hal_profile.ClockFit]) -> dict[str, Any]:
    """Which clock each table's times came from: all are on the host's
    (``iree_host_time_ns``); device ticks got there by the fits listed."""
    dispatch = capabilities.dispatch_clock if capabilities else drivers.HOST_CLOCK
    fitted = "device_tick fitted to iree_host_time_ns"
    return {"dispatch": fitted if dispatch == drivers.DEVICE_CLOCK else drivers.HOST_CLOCK,
            "queue": drivers.HOST_CLOCK, "memory": drivers.HOST_CLOCK,
            **({"queue device spans (device ...)": fitted} if "device-queue-events" in families else {}),
            "fits": [fit.summary() for fit in clocks]}


class RunTotals:
    """What a ``full`` run's summary says of its records, added up block by block (the
    whole run at once, or a window at a time): per invocation (a few numbers each) and
    per run, never per event."""

    def __init__(self, invocations: int, paged: PagedArrays | None = None):
        """``paged``: where the per-invocation arrays are kept (default: in memory)."""
        arrays = self.paged = PagedArrays(None) if paged is None else paged
        self.invocations = invocations
        self.dispatch_ns = arrays.full("dispatch_ns", invocations, 0, np.int64)
        self.dispatches = arrays.full("dispatches", invocations, 0, np.int64)
        self.first = arrays.full("first", invocations, np.iinfo(np.int64).max, np.int64)
        self.last = arrays.full("last", invocations, np.iinfo(np.int64).min, np.int64)
        self.load_dispatches = self.load_dispatch_ns = 0
        self.queue = self.memory = self.warmup = self.load = self.unsubmitted = 0

    def add_dispatches(self, found: hal_profile.JoinColumns) -> None:
        """Joined dispatches past the warmup (load time at :data:`LOAD_INVOCATION`)."""
        recorded = found.invocation >= 0
        k = found.invocation[recorded]
        np.add.at(self.dispatch_ns, k, found.duration_ns[recorded])
        add_counts(self.dispatches, k)
        np.minimum.at(self.first, k, found.start_ns[recorded])
        np.maximum.at(self.last, k, (found.start_ns + found.duration_ns)[recorded])
        load = ~recorded
        self.load_dispatches += int(load.sum())
        self.load_dispatch_ns += int(found.duration_ns[load].sum())

    def dispatch_ns_pieces(self) -> Iterator[np.ndarray]:
        """Each invocation's dispatch time, a piece at a time (the arrays may be in files)."""
        for (dispatch_ns,) in self.paged.pieces(self.dispatch_ns):
            yield dispatch_ns

    def window_pieces(self) -> Iterator[np.ndarray]:
        """First dispatch start to last dispatch end of each invocation with dispatches
        (the device-side window), a piece at a time."""
        for first, last, dispatches in self.paged.pieces(self.first, self.last, self.dispatches):
            yield (last - first)[dispatches > 0]

    def dispatch_records(self) -> int:
        return sum(int(dispatches.sum()) for (dispatches,) in self.paged.pieces(self.dispatches))


def run_summary(totals: RunTotals, families: Sequence[str], capabilities: drivers.DriverCapabilities | None,
                wall: float | None, clocks: dict[str, Any]) -> dict[str, Any]:
    """A ``full`` run's part of summary.json, from its :class:`RunTotals`."""
    return {
        "profiling_families": list(families),
        "driver_capabilities": None if capabilities is None else asdict(capabilities),
        "clocks": clocks,
        "join": "structural: command-buffer recordings of the hal-phase host code; invocations by submission",
        # Of the run as profiled: every dispatch record, also those whose events were not
        # kept (--sample, --max-events, --ids), so these need not match events.parquet.
        "per_invocation_from": "every profiled dispatch record (events dropped or filtered out included)",
        "dispatch_ns_per_invocation": piecewise_duration_stats(totals.dispatch_ns_pieces),
        # First dispatch start to last dispatch end: the device-side window.
        "dispatch_window_ns": piecewise_duration_stats(totals.window_pieces),
        # Wall time per invocation as iree-benchmark-module measures it: a mean and
        # nothing else, as the tool reports no per-invocation times (a min, median and
        # max equal to the mean would claim a spread it never measured). The in-process
        # modes time each call and give all five.
        "invocation_ns": None if wall is None else {"count": totals.invocations, "mean": wall},
        "timing_harness": "iree-benchmark-module" if wall is not None else "iree-run-module",
        "load_time": {"dispatches": totals.load_dispatches, "dispatch_ns": totals.load_dispatch_ns,
                      "invocation": LOAD_INVOCATION},
        "records": {"dispatch": totals.dispatch_records(), "load_dispatch": totals.load_dispatches,
                    "queue": totals.queue, "memory": totals.memory, "warmup_records_dropped": totals.warmup,
                    "load_records": totals.load, "unsubmitted_records": totals.unsubmitted},
    }


#: ``invocation`` of the events of load-time work (initializers).
LOAD_INVOCATION = -1


#: Where the windowed route reads (tests force small windows to exercise several).
WINDOW_RECORDS = 65_536
#: A profiled run of this many invocations shows on a terminal that it is running: a bar
#: of the invocations flushed so far, counted by the index's walk as the profile grows,
#: or a line where the profile is not followed (seconds at this size).
ANNOUNCED_INVOCATIONS = 1_000
#: The families a windowed run writes as queue and memory events, with their row kind
#: and, for host operations, the record types that are not (dispatches).
_WINDOW_ROWS = (("queue-events", "submit", "queue"), ("host-execution-events", "host", "queue"),
                ("queue-device-events", "device", "queue"), ("memory-events", "memory", "memory"))


def new_pipeline(manifest: dict[str, Any], policy: Policy, sink: Any) -> EventPipeline:
    """The pipeline a ``full`` run's events go through (a session id of its own)."""
    import uuid

    return EventPipeline(manifest, policy, sink, session=uuid.uuid4().hex[:12])


def _add_dispatches(pipeline: EventPipeline, found: hal_profile.JoinColumns) -> None:
    pipeline.add_dispatches(found.site, found.start_ns, found.duration_ns, found.workgroups, found.tiles,
                            found.invocation, attributes=found.shape_attributes())


def _learned(records: Any, manifest: dict[str, Any], function: str, known: dict[int, int],
             numbered: bool) -> dict[int, int] | None:
    """``known`` (command buffer -> recording) with the buffers of one window's dispatch
    ``records`` it does not hold yet matched to their recordings; ``None`` where a block
    is ambiguous or unexplained."""
    from dfit_mlir.runtime_hooks.columnar_join import match_blocks

    # Only a window with a buffer not yet matched has anything to teach.
    if not len(records) or set(np.unique(records.command_buffer_id).tolist()) <= known.keys():
        return known
    matched = match_blocks(records, manifest, function, known, numbered)
    return None if matched is None else matched.recording_of_buffer


def _add_joined(pipeline: EventPipeline, records: Any, manifest: dict[str, Any], function: str,
                known: dict[int, int], numbered: bool, invocations: int, starts: np.ndarray, warmup: int,
                totals: RunTotals) -> bool:
    """Join one window's dispatch ``records`` (every buffer in ``known``; ``starts``: the
    first submission of each invocation, at least up to the window's last) and add them
    past the warmup to ``pipeline`` and ``totals``; ``False`` where they cannot be joined
    as the run's others were (nothing added)."""
    from dfit_mlir.runtime_hooks.columnar_join import match_blocks, place_blocks

    matched = match_blocks(records, manifest, function, known, numbered)
    columns = None if matched is None else place_blocks(matched, manifest, function, invocations, starts)
    if columns is None:
        return False
    found = _recorded(columns, warmup, totals)
    totals.add_dispatches(found)
    _add_dispatches(pipeline, found)
    return True


def _add_window(pipeline: EventPipeline, records: Any, rows: WindowRows, manifest: dict[str, Any], function: str,
                known: dict[int, int], numbered: bool, invocations: int, starts: np.ndarray, warmup: int,
                totals: RunTotals, labels: dict[str, tuple[str, ...]]) -> bool:
    """One window's events added to ``pipeline``: its dispatch ``records`` joined
    (:func:`_add_joined`), then its other records (``rows``), each family in file order;
    ``False`` where the dispatches cannot be joined as the run's others were (nothing added)."""
    if len(records) and not _add_joined(pipeline, records, manifest, function, known, numbered, invocations, starts,
                                        warmup, totals):
        return False
    rows.add_to(pipeline, labels, starts, warmup, totals)
    return True


@dataclass(frozen=True)
class WindowRows:
    """One window's queue, host-operation, device and memory records, read in file order
    and not yet placed: (family, row kind, event kind, records) for each family that
    has some, and how many records were read (a host-execution family's dispatch
    records among them, passed over: they are joined)."""

    parts: tuple[tuple[str, str, str, hal_profile.Records], ...]
    read: int

    @classmethod
    def of(cls, index: Any, window: int, reads: Any = None) -> WindowRows:
        """The rows of window ``window`` of ``index``, read from ``reads``
        (``profile_stream.WindowReads``, of :func:`window_families`) where given."""
        from dfit_mlir.runtime_hooks import profile_file as pf
        from dfit_mlir.runtime_hooks import profile_stream

        builders = {"submit": pf.queue_records, "memory": pf.memory_records,
                    "host": lambda tables, only: pf.host_execution_records(tables, only=only),
                    # Device ticks placed with the whole profile's clock fit (the index's).
                    "device": lambda tables, only: hal_profile._place_device_columns(pf.queue_device_records(tables),
                                                                                     index.clocks)}
        parts, read = [], 0
        for family, kind, category in _WINDOW_ROWS:
            if not index.counts.get(family):
                continue
            found = index.family_window(family, window) if reads is None else reads(window, family)
            read += len(found)
            # Only the fields a run writes are converted (_ROW_FIELDS).
            records = builders[kind](profile_stream.tables_of(index, family, found), _ROW_FIELDS[kind])
            if records:
                parts.append((family, kind, category, records))
        return cls(tuple(parts), read)

    def last_submission(self) -> int:
        """The last submission the records were made in (their invocations' starts must
        be known up to it to place them)."""
        return max((int(records.column("submission_id").max()) for _, _, _, records in self.parts), default=0)

    def add_to(self, pipeline: EventPipeline, labels: dict[str, tuple[str, ...]], starts: np.ndarray, warmup: int,
               totals: RunTotals) -> None:
        """Each family's records as rows, placed in their invocations (``starts``) past the
        warmup, coded into the run's ``labels`` (family -> event names) and added."""
        for family, kind, category, records in self.parts:
            part = _placed_rows(kind, records, starts, warmup, totals, labels[family])
            part.add_to(pipeline, category)
            if category == "queue":
                totals.queue += len(part)
            else:
                totals.memory += len(part)


def window_families(index: Any) -> Any:
    """What reads each window's records once for both the join and the rows
    (``profile_stream.WindowReads``): the dispatch family (a window ahead, for the
    join's look-ahead), then every other family of the rows there is (when they are placed)."""
    from dfit_mlir.runtime_hooks import profile_stream

    dispatches = index.dispatch_family
    return profile_stream.WindowReads(index, [(dispatches,), [
        family for family, _, _ in _WINDOW_ROWS if index.counts.get(family) and family != dispatches]])


def row_labels(index: Any) -> dict[str, tuple[str, ...]]:
    """family -> the event names its rows get over the run (so far, for an index so far):
    every window's rows are coded into one table."""
    from dfit_mlir.runtime_hooks import profile_file as pf
    from dfit_mlir.runtime_hooks import profile_stream

    return {family: profile_stream.row_labels(index, family, _ROW_KINDS[kind][0],
                                              exclude=(pf.DISPATCH_TYPE,) if kind == "host" else ())
            for family, kind, _ in _WINDOW_ROWS if index.counts.get(family)}


class EarlyJoinUnusable(Exception):
    """What an :class:`EarlyJoin` joined is not what the finished profile's route joins:
    the bundle is written again without it."""


class EarlyJoin:
    """A ``full`` run's events written window by window while its tool still writes
    the profile (issue 29): on the core the tool leaves idle, in the thread that follows
    the profile (``profile_stream.follow_profile``'s ``walked``), each window's dispatch
    records joined and its queue, host-operation and memory records placed
    (:func:`_add_window`, :class:`WindowedRun`'s order), so that the join, the events
    and the traces drawn from them get under way before the tool ends instead of after
    it. At 660k events the time from the tool's end to dfit's went from 1.74–1.93 s
    (everything after the tool) to 1.07–1.25 s with the dispatches alone joined early,
    and to about 0.7 s with every family's events written early.

    Each step takes the index of what the walk has read so far
    (``profile_stream.index_so_far``: the windows before its last are the finished
    file's) and adds the windows whose next window is whole (a window's dispatch records
    are taken from its neighbours too), each with the command buffers matched so far,
    the invocation starts found so far (``join_records.invocation_starts_so_far``) and
    the rows' event names so far (:func:`row_labels`), up to the last start seen. It
    stops at anything out of the ordinary — a profile the windowed route would refuse, a
    block it cannot match, a run whose events would pass the traces' limit (whose traces
    are planned over the whole run, not drawn as the events are exported) — and the
    finished profile's route goes on from the first window it did not add, once
    :meth:`check` has found what it added to be what that route adds: the same window
    cuts, buffers, numbering, starts and event names. Else :class:`EarlyJoinUnusable`,
    and the bundle is written again without it. Only the CPU drivers' records: a GPU
    driver's device ticks are placed with the whole profile's clock fit."""

    def __init__(self, manifest: dict[str, Any], function: str, repeat: int, warmup: int, trace_limit: TraceLimit,
                 paged: PagedArrays):
        #: Where the windows joined go: the bundle's, once it is made.
        self.pipeline: EventPipeline | None = None
        self.manifest, self.function = manifest, function
        self.invocations, self.warmup, self.trace_limit = warmup + repeat, warmup, trace_limit
        self.paged = paged
        self.totals = RunTotals(repeat, paged)
        #: Windows added (the first ones), the records read for them (the progress
        #: bar's), their dispatch records, and the window cuts and first owned
        #: submissions of the index (so far) the last was added by: up to them, what
        #: :meth:`check` holds the finished profile's to.
        self.windows = self.records = self.dispatches = 0
        self.cuts = self.owned = np.zeros(0, np.int64)
        #: The event names the rows were coded into (:func:`row_labels`), once a window is added.
        self.labels: dict[str, tuple[str, ...]] | None = None
        self.known: dict[int, int] = {}
        self.numbered: bool | None = None
        self.family = ""  # the family the dispatch records were read from
        self.starts = np.zeros(0, np.int64)
        #: Why it stopped joining (``None``: it goes on), and what made it unusable.
        self.stopped: str | None = None
        self.unusable: str | None = None

    def __call__(self, walk: Any, finished: threading.Event) -> None:
        """One step, after the walk's (``walk``: ``profile_stream._Walk``), until the
        tool has ``finished`` (the route of the finished profile goes on from there)."""
        if self.stopped is not None:
            return
        try:
            self._step(walk, finished)
        except Exception as error:  # noqa: BLE001 — the finished profile's route says what is wrong
            self._stop(f"{type(error).__name__}: {error}", unusable=True)

    def _stop(self, why: str, *, unusable: bool = False) -> None:
        self.stopped = why
        if unusable:
            self.unusable = why

    def _step(self, walk: Any, finished: threading.Event) -> None:
        from dfit_mlir.runtime_hooks import profile_stream
        from dfit_mlir.runtime_hooks.join_records import invocation_starts_so_far

        assert self.pipeline is not None
        index = profile_stream.index_so_far(walk, WINDOW_RECORDS)
        if index is None:
            return self._stop("the profile so far is one the windowed route leaves, or needs whole")
        events = sum(index.counts.get(family, 0) for family, _, _ in _WINDOW_ROWS)  # WindowedRun.events_at_most's
        if not self.trace_limit.keeps_all(events * self.invocations // max(1, len(index.flush_starts))):
            return self._stop("the run's events would pass the traces' limit")
        if index.counts.get("queue-device-events"):  # device ticks: placed with the whole profile's clock fit
            return self._stop("the profile has device-tick queue records")
        labels = row_labels(index)
        if self.labels is not None and labels != self.labels:
            return self._stop("an event name the rows added so far were not coded with", unusable=True)
        ready = index.windows - 2  # the windows before it have their next window whole
        if ready <= self.windows:
            return None
        if self.numbered is not None and (index.numbered, index.dispatch_family) != (self.numbered, self.family):
            return self._stop("the command numbering or the dispatch records' family changed", unusable=True)
        self.numbered, self.family = index.numbered, index.dispatch_family
        starts, starts_of = None, None  # the starts this index gives, and the buffers they were found with
        reads = window_families(index)
        for window, records in profile_stream.dispatch_windows(index, range(self.windows, ready), reads):
            if finished.is_set():
                return None
            known = _learned(records, self.manifest, self.function, self.known, index.numbered)
            if known is None:
                return self._stop("a command buffer's records are ambiguous or unexplained")
            if known is not starts_of:  # (a new buffer may be the anchor's)
                starts, starts_of = invocation_starts_so_far(self.manifest, self.function, self.invocations, known,
                                                             index.executions, index.flush_starts), known
            if starts is None or not len(starts) or index.owned(window)[1] > int(starts[-1]):
                return None  # the invocations this window reaches are not all started yet
            rows = WindowRows.of(index, window, reads)
            if rows.last_submission() > int(starts[-1]):
                return None  # nor those its other records were made in
            if not np.array_equal(starts[:len(self.starts)], self.starts):
                return self._stop("the invocation starts changed", unusable=True)
            if not _add_window(self.pipeline, records, rows, self.manifest, self.function, known, index.numbered,
                               self.invocations, starts, self.warmup, self.totals, labels):
                return self._stop("a window's records are not what the run's were", unusable=True)
            self.known, self.starts, self.labels = known, starts, labels
            self.cuts, self.owned = index.window_chunks, index.window_submissions
            self.windows, self.dispatches = window + 1, self.dispatches + len(records)
            self.records += len(records) + rows.read
            self.paged.release()
        return None

    def check(self, run: WindowedRun) -> None:
        """:class:`EarlyJoinUnusable` unless what was joined is what ``run`` (the
        finished profile's route) joins for the same windows."""
        if self.unusable is not None:
            raise EarlyJoinUnusable(self.unusable)
        if not self.windows:
            return
        index, cut = run.index, slice(0, self.windows + 1)
        same = (np.array_equal(index.window_chunks[cut], self.cuts[cut])
                and np.array_equal(index.window_submissions[cut], self.owned[cut])
                and (index.numbered, index.dispatch_family) == (self.numbered, self.family)
                and all(run.recording_of_buffer.get(buffer) == recording for buffer, recording in self.known.items())
                and np.array_equal(run.starts[:len(self.starts)], self.starts)
                and run.labels == self.labels)
        if not same:
            raise EarlyJoinUnusable("the windows joined while the tool ran are not the finished profile's")


@dataclass(frozen=True)
class WindowedRun:
    """A ``full`` run's records read a window at a time (:mod:`profile_stream`), and its
    events written window by window: the window's dispatch records joined, then its
    queue, host-operation, device and memory records, each family in file order. The
    events and values of the whole-run route (:class:`ProfiledRun`), each family's in
    the same order; only how the families interleave differs (that route writes each
    family whole, one after the other), so that a window's events can be written as
    soon as its records are (:class:`EarlyJoin`). :meth:`summary` is complete once
    :meth:`pipeline` has run."""

    index: Any  # profile_stream.ProfileIndex
    manifest: dict[str, Any]
    function: str
    repeat: int
    warmup: int
    families: tuple[str, ...]
    capabilities: drivers.DriverCapabilities | None
    wall_ns_per_invocation: float | None
    recording_of_buffer: dict[int, int]
    starts: np.ndarray
    #: family -> the event names its rows are coded into (:func:`row_labels`).
    labels: dict[str, tuple[str, ...]]
    #: Added up by :meth:`pipeline` (which runs once), read by :meth:`summary`.
    totals: RunTotals
    #: Where the per-invocation and per-chunk arrays above are kept, handed back window by window.
    paged: PagedArrays

    @classmethod
    def open(cls, recorded: RecordedProfile, manifest: dict[str, Any], function: str, repeat: int, warmup: int,
             families: Sequence[str], driver: str, totals: RunTotals | None = None) -> WindowedRun:
        """Index the profile and place the invocations (:class:`WindowedRouteUnavailable`
        where the whole-run route must decide). The arrays that grow with the run are
        kept where ``recorded.paged`` keeps them; ``totals``: where its figures are added
        up (an :class:`EarlyJoin`'s, holding the windows it joined; default: new)."""
        from dfit_mlir.runtime_hooks import profile_file, profile_stream
        from dfit_mlir.runtime_hooks.join_records import (
            UnresolvedDispatchError,
            invocation_start_array,
        )

        unavailable = profile_stream.WindowedRouteUnavailable
        invocations = warmup + repeat
        paged = PagedArrays(None) if recorded.paged is None else recorded.paged
        if not windowed_may_read(families, invocations):
            raise unavailable("one invocation, or no queue events to split the flushes by")
        if "recordings" not in manifest["partitions"]:
            raise unavailable("the manifest has no command-buffer recordings")
        try:
            if not profile_file.supported(recorded.path):
                raise unavailable("the profile's format or the runtime is not the one the direct reader knows")
            index = profile_stream.index_profile(recorded.path, WINDOW_RECORDS, recorded.followed, paged)
        except profile_file.ProfileFormatError as error:
            raise damaged_recording(recorded.path, error) from None
        if not len(index.executions):
            raise unavailable("no command-buffer execution records")
        known: dict[int, int] | None = {}
        for _, records in profile_stream.dispatch_windows(index, index.first_buffer_windows):
            if (known := _learned(records, manifest, function, known, index.numbered)) is None:
                raise unavailable("a command buffer's records are ambiguous or unexplained")
        try:
            starts = invocation_start_array(manifest, function, invocations, known, index.executions,
                                            index.flush_starts)
        except UnresolvedDispatchError as error:
            raise unavailable(f"the invocations cannot be placed ({error})") from None
        index = index.for_join(paged)
        starts = paged.copied("starts", starts)
        # The windows read to match the buffers and the facts that placed the invocations
        # (dropped just above): the join starts without them. Handed back after they are
        # dropped, not before: freed after, they stayed resident in glibc's heap.
        release_freed_memory(now=True)
        return cls(index, manifest, function, repeat, warmup, tuple(families), drivers.capabilities(driver),
                   recorded.wall_ns_per_invocation, known, starts, row_labels(index), totals or RunTotals(repeat, paged),
                   paged)

    @property
    def records(self) -> int:
        """The profile records the pipeline reads (the host family's dispatch records
        twice: joined, then passed over among the host operations)."""
        index = self.index
        return index.dispatch_records + sum(index.counts.get(family, 0) for family, _, _ in _WINDOW_ROWS)

    @property
    def events_at_most(self) -> int:
        """The events the pipeline can write: one at most per dispatch record and per
        other record (a host-execution dispatch record is an event once, joined)."""
        twice = self.index.dispatch_records if self.index.dispatch_family == "host-execution-events" else 0
        return self.records - twice

    def pipeline(self, manifest: dict[str, Any], policy: Policy, sink: Any) -> EventPipeline:
        pipeline = new_pipeline(manifest, policy, sink)
        self.fill(pipeline)
        return pipeline

    def fill(self, pipeline: EventPipeline, early: EarlyJoin | None = None) -> None:
        """Add the run's events to ``pipeline`` (which holds those ``early`` joined, if
        given: checked to be what this route joins, :meth:`EarlyJoin.check`)."""
        from dfit_mlir.runtime_hooks.progress import Progress, announce

        with Progress("dfit: writing events", self.records, threshold=WINDOW_RECORDS) as progress:
            if early is not None:
                progress.update(early.records)
            self._write_windows(pipeline, progress, early)
        if progress.shown:  # the traces, CSVs and summary that follow take seconds of a long run too
            announce("dfit: finishing the traces, CSVs and summary")

    def _write_windows(self, pipeline: EventPipeline, progress: Any, early: EarlyJoin | None = None) -> None:
        """Window by window, in runtime order, from the first window ``early`` did not
        add: its dispatch records joined, then its other records (:func:`_add_window`)."""
        from dfit_mlir.runtime_hooks import profile_stream

        index, invocations = self.index, self.warmup + self.repeat
        first, taken = (0, 0) if early is None else (early.windows, early.dispatches)
        reads = window_families(index)
        for window, records in profile_stream.dispatch_windows(index, range(first, index.windows), reads):
            rows = WindowRows.of(index, window, reads)
            if not _add_window(pipeline, records, rows, self.manifest, self.function, self.recording_of_buffer,
                               index.numbered, invocations, self.starts, self.warmup, self.totals, self.labels):
                raise profile_stream.WindowedRouteUnavailable("a window's records are not what the run's were")
            taken += len(records)
            self.paged.release()
            progress.update(len(records) + rows.read)
        if taken != index.dispatch_records:  # each record in exactly one window: checked, not assumed
            raise profile_stream.WindowedRouteUnavailable(
                f"the windows took {taken} of the profile's {index.dispatch_records} dispatch records")

    def summary(self, early: EarlyJoin | None = None) -> dict[str, Any]:
        """The run's figures (after :meth:`pipeline`) and how the profile was read
        (``early``: the windows joined while the tool ran)."""
        summary = run_summary(self.totals, self.families, self.capabilities, self.wall_ns_per_invocation,
                              clock_summary(self.capabilities, self.families,
                                            tuple((self.index.clocks or {}).values())))
        summary["profile_read"] = {"route": "windowed", "windows": self.index.windows,
                                   "window_records": WINDOW_RECORDS,
                                   "joined_while_profiling": 0 if early is None else early.windows}
        return summary


#: What a full run's events come from, as an error about one the schema refuses names
#: it (a damaged profile: a record ending before it begins gives a negative duration).
PROFILE_SOURCE = "the HAL profile this run recorded (damaged)"


def damaged_recording(profile: Path, error: Exception) -> hal_profile.DamagedProfileError:
    """The error for a damaged profile that this run recorded: named as such (with the
    reader's path and byte offset), and saying that the path is the run's scratch copy,
    gone by the time the message is read."""
    text = str(error).removeprefix("cannot read the HAL profile: ")
    where = " (a file of the run's scratch folder, removed as dfit exits)" if profile.parent.name.startswith((
        "dfit-run-", "dfit-profile-")) else ""
    return hal_profile.DamagedProfileError(f"the HAL profile this run recorded is damaged: {text}{where}")


@dataclass(frozen=True)
class RecordedProfile:
    """A profiled run's raw profile (in a scratch folder) and the benchmark tool's time."""

    path: Path
    wall_ns_per_invocation: float | None
    #: The profile's index walk, done while the tool wrote it (``profile_stream.follow_profile``).
    followed: Any = None
    #: Where the index and the join keep the arrays that grow with the run (in files of
    #: the run's scratch folder, only a window's pages resident; ``None``: in memory).
    paged: PagedArrays | None = None


def _record_run(vmfb: Path, inputs: Sequence[str], driver: str, function: str, repeat: int, warmup: int,
                families: Sequence[str], folder: Path, fault: FaultContext | None = None,
                paged: PagedArrays | None = None) -> RecordedProfile:
    """Run ``vmfb`` ``warmup + repeat`` times under HAL profiling, the profile kept in
    ``folder`` (a fault in the module: :class:`ModuleFaultError`); ``paged``: where its
    reading keeps the arrays that grow with the run (:attr:`RecordedProfile.paged`)."""
    started = StartedRun.start(vmfb, inputs, driver, function, repeat, warmup, families, folder, paged)
    try:
        return started.finish(fault)
    finally:
        started.stop()


class StartedRun:
    """A ``full`` run's profiled tool, started (:meth:`start`) and finished
    (:meth:`finish`) apart, so that what a run needs ready once the tool ends — the
    modules its reading imports, the bundle's pipeline and writers — is made while the
    tool runs, not before (a tool started first runs beside it, on the other core) nor
    after. On a terminal a long run shows the invocations profiled so far."""

    def __init__(self, path: Path, invocations: int, function: str, families: Sequence[str],
                 paged: PagedArrays | None):
        from dfit_mlir.runtime_hooks.progress import Progress, announce

        self.path, self.invocations, self.paged = path, invocations, paged
        # Where the windowed route may read the profile, its index is walked while the tool
        # writes it; the walk counts the flushes (one queue-events chunk an invocation),
        # which the bar shows on a terminal.
        self.follow = windowed_may_read(families, invocations)
        doing = f"dfit: profiling {invocations} invocations of {function}"
        self.bar = Progress(doing, invocations if self.follow else 0, threshold=ANNOUNCED_INVOCATIONS)
        if invocations >= ANNOUNCED_INVOCATIONS and not self.bar.shown:  # a run long enough to wait for
            announce(f"{doing} (iree-benchmark-module)")
        self.running: hal_profile.ProfilingRun | None = None
        self._shown = False

    @classmethod
    def start(cls, vmfb: Path, inputs: Sequence[str], driver: str, function: str, repeat: int, warmup: int,
              families: Sequence[str], folder: Path, paged: PagedArrays | None = None) -> StartedRun:
        """Start the tool (:meth:`finish` or :meth:`stop` it), then import here what the
        run's reading needs (:data:`AFTER_THE_RUN`: on this thread, while the tool runs,
        so that no other of dfit's threads imports at the same time: two threads
        importing modules that import each other can deadlock)."""
        import importlib

        started = cls(folder / "profile.ireeprof", warmup + repeat, function, families, paged)
        started.bar.__enter__()
        started._shown = True
        try:
            started.running = hal_profile.start_profiling(vmfb, inputs, started.path, driver=driver,
                                                          function=function, invocations=started.invocations,
                                                          families=families)
            for name in AFTER_THE_RUN:
                importlib.import_module(name)
        except BaseException:
            started.stop()
            raise
        return started

    def finish(self, fault: FaultContext | None = None, walked: EarlyJoin | None = None) -> RecordedProfile:
        """Wait for the tool (a fault in the module: :class:`ModuleFaultError`), the
        profile followed meanwhile in a thread of its own (``walked``: handed the walk as it
        goes, an :class:`EarlyJoin`)."""
        assert self.running is not None
        finished, followed = threading.Event(), [None]
        bar, invocations = self.bar, self.invocations

        def flushed(count: int) -> None:
            bar.update(min(count, invocations) - bar.done)

        # A daemon: should anything leave it waiting for ``finished``, an interrupted dfit
        # still exits (the interpreter joins its other threads at exit, for ever).
        follower = threading.Thread(target=_follow, args=(self.path, finished, followed, self.paged, flushed, walked),
                                    name="dfit-follow", daemon=True) if self.follow else None
        try:
            try:
                # Started with the signals held: a SIGINT/SIGTERM raised inside ``start``
                # (it waits for the thread to run, which a loaded machine can take a while
                # to do) left the thread started and ``finished`` never set, and the
                # interrupted dfit hung at exit (1 of 40 SIGTERMs on two busy cores).
                with atomic.signals_held():
                    if follower is not None:
                        follower.start()
                tool, stdout = self.running.wait()
            finally:
                finished.set()
                if follower is not None and follower.ident is not None:  # (started): its last count
                    follower.join()  # is in before the bar is finished
            bar.update(invocations - bar.done)  # the tool ran them all
        except hal_profile.ToolFault as error:
            signal_number = fault_signal(error.returncode)
            if fault is not None and signal_number is not None:
                fault.raise_for(signal_number, error.tool, (error.stderr.strip().splitlines() or [""])[-1])
            raise
        finally:
            self._end_bar()
        return RecordedProfile(self.path, hal_profile._benchmark_real_time_ns(stdout)
                               if tool == "iree-benchmark-module" else None, followed[0], self.paged)

    def stop(self) -> None:
        """Kill the tool if it still runs (what the run was for failed first)."""
        if self.running is not None:
            self.running.stop()
        self._end_bar()

    def _end_bar(self) -> None:
        if self._shown:
            self._shown = False
            self.bar.__exit__(None, None, None)


def windowed_may_read(families: Sequence[str], invocations: int) -> bool:
    """Whether the windowed route may take on a run's profile (its flushes are split by
    the queue events, one per invocation); the profile itself may still send it whole."""
    return invocations >= 2 and "queue-events" in families


def _follow(path: Path, finished: threading.Event, followed: list[Any], paged: PagedArrays | None,
            flushed: Callable[[int], None] | None = None, walked: EarlyJoin | None = None) -> None:
    from dfit_mlir.runtime_hooks import profile_stream

    followed[0] = profile_stream.follow_profile(path, finished, paged, flushed, walked)


#: What a full run imports once its profile is recorded (the profile's readers, the join,
#: Arrow's Parquet and CSV writers, the traces' encoders and Perfetto's protobuf classes):
#: imported while the tool runs, on the core it leaves idle, instead of after it (the
#: time from the tool's exit to dfit's at 660k events: median 2.58 -> 2.27 s).
AFTER_THE_RUN = ("pyarrow.parquet", "pyarrow.compute", "pyarrow.csv", "pyarrow.acero", "pyarrow.dataset",
                 "dfit_mlir.passes.host_calls", "dfit_mlir.runtime_hooks.profile_stream",
                 "dfit_mlir.runtime_hooks.columnar_join", "dfit_mlir.runtime_hooks.progress",
                 "dfit_mlir.exporters.traces", "dfit_mlir.exporters.chrome", "dfit_mlir.exporters.perfetto",
                 "perfetto.protos.perfetto.trace.perfetto_trace_pb2")


def _profiled_run(vmfb: Path, manifest: dict[str, Any], inputs: Sequence[str], driver: str, function: str,
                  repeat: int, warmup: int, families: Sequence[str] = hal_profile.FULL_FAMILIES,
                  fault: FaultContext | None = None) -> ProfiledRun:
    """Record and decode a profiled run as a whole (lite's queue pass, tests)."""
    with atomic.scratch_directory("dfit-profile-") as folder:
        recorded = _record_run(vmfb, inputs, driver, function, repeat, warmup, families, folder, fault)
        return _whole_run(recorded, manifest, function, repeat, warmup, families, driver)


def _whole_run(recorded: RecordedProfile, manifest: dict[str, Any], function: str, repeat: int, warmup: int,
               families: Sequence[str], driver: str) -> ProfiledRun:
    """The whole-run route: every record decoded at once (:func:`hal_profile.decode_profile`)
    and joined at once, each family's events written whole, one family after the other;
    what the windowed route (:class:`WindowedRun`) must equal, family by family."""
    invocations = warmup + repeat
    profile = hal_profile.decode_profile(recorded.path, families, invocations, recorded.wall_ns_per_invocation)
    # Command-buffer executions from the host-execution records (CPU drivers) or the
    # queue records (every driver records queue-events): the same (submission, buffer).
    executions = _executions(profile.host_operations, profile.queue_events)
    joined = hal_profile.join_structural(profile.dispatch_records, manifest, function, invocations, executions,
                                         profile.flush_starts)
    starts = np.array(joined.starts, dtype=np.int64)
    counts = RunTotals(repeat)
    queue: list[RowColumns] = []
    memory: list[RowColumns] = []
    for records, found, kind in (
        (profile.queue_events, queue, "submit"),
        (profile.host_operations, queue, "host"),
        (profile.device_queue_events, queue, "device"),
        (profile.memory_events, memory, "memory"),
    ):
        if records:
            found.append(_placed_rows(kind, records, starts, warmup, counts))
    dispatches = _recorded(joined.columns, warmup, counts)  # before counts.warmup is read below
    return ProfiledRun(dispatches, repeat, tuple(queue), tuple(memory), counts.warmup,
                       profile.wall_ns_per_invocation, counts.load, counts.unsubmitted, tuple(families),
                       drivers.capabilities(driver), tuple((profile.clocks or {}).values()))


def _placed_rows(kind: str, records: hal_profile.Records, starts: np.ndarray, warmup: int, counts: RunTotals,
                 labels: tuple[str, ...] | None = None) -> RowColumns:
    """``records`` (queue, host-operation or memory records) as rows, each in the
    invocation of its submission, those of the warmup dropped and counted."""
    submission = records.column("submission_id")
    k = np.searchsorted(starts, submission, side="right") - 1
    # Released outside any submission (pool trims at teardown): no invocation's,
    # kept with a null invocation and counted; load time at LOAD_INVOCATION.
    unsubmitted, load = submission == 0, (submission != 0) & (k < 0)
    warm = (submission != 0) & (k >= 0) & (k < warmup)
    counts.unsubmitted += int(unsubmitted.sum())
    counts.load += int(load.sum())
    counts.warmup += int(warm.sum())
    k = np.where(unsubmitted, NULL_INVOCATION, np.where(load, LOAD_INVOCATION, k - warmup)).astype(np.int32)
    if not warm.any():
        return RowColumns.of(kind, records, k, labels)
    # Only the columns the rows are made of are copied past the warmup.
    kept = hal_profile.Records({name: values for name, values in records.columns.items()
                                if name in _ROW_FIELDS[kind]})
    return RowColumns.of(kind, kept.where(~warm), k[~warm], labels)


def _write_full_bundle(bundle: Path, manifest: dict[str, Any], policy: Policy, summary: dict[str, Any],
                       record: Callable[[EarlyJoin | None], RecordedProfile], paged: PagedArrays, function: str,
                       repeat: int, warmup: int, families: Sequence[str], driver: str) -> None:
    """The bundle of a ``full`` run, ``record(walked)`` running it (``paged``: where the
    arrays that grow with it are kept): by the windowed route where it takes the profile
    on (:mod:`profile_stream`: memory bounded by a window, whatever the run's length),
    its windows written while the tool runs where they can be (:class:`EarlyJoin`),
    else by the whole-run route; the summary says which, and why not."""
    from dfit_mlir.runtime_hooks.profile_stream import WindowedRouteUnavailable

    recorded: list[RecordedProfile] = []  # the run, once recorded (as the bundle is written, or before)
    early = None
    if windowed_may_read(families, warmup + repeat) and "recordings" in manifest["partitions"]:
        early = EarlyJoin(manifest, function, repeat, warmup, TraceLimit.of(policy), paged)
    try:
        try:
            _write_windowed(bundle, manifest, policy, summary, record, early, recorded, function, repeat, warmup,
                            families, driver)
            return
        except EarlyJoinUnusable as why:  # nothing was written: written again without it, in arrays of its own
            again = None if paged.folder is None else paged.folder / "again"
            if again is not None:
                again.mkdir()
            recorded[0] = replace(recorded[0], followed=None, paged=PagedArrays(again))
            _write_windowed(bundle, manifest, policy, summary, record, None, recorded, function, repeat, warmup,
                            families, driver, discarded=str(why))
            return
    except WindowedRouteUnavailable as why:  # nothing was written: the bundle is still as it was
        reason = str(why)
    except profile_file.ProfileFormatError as error:  # found reading a window: no bundle either
        raise damaged_recording(recorded[0].path, error) from None
    try:
        whole = _whole_run(recorded[0], manifest, function, repeat, warmup, families, driver)
    except hal_profile.DamagedProfileError as error:
        raise damaged_recording(recorded[0].path, error) from None
    write_bundle(bundle, manifest, lambda sink: whole.pipeline(manifest, policy, sink),
                 {**summary, **whole.summary(), "profile_read": {"route": "whole run", "why": reason}},
                 source=PROFILE_SOURCE)


def _write_windowed(bundle: Path, manifest: dict[str, Any], policy: Policy, summary: dict[str, Any],
                    record: Callable[[EarlyJoin | None], RecordedProfile], early: EarlyJoin | None,
                    recorded: list[RecordedProfile], function: str, repeat: int, warmup: int,
                    families: Sequence[str], driver: str, discarded: str | None = None) -> None:
    """The bundle by the windowed route, or :class:`WindowedRouteUnavailable` with nothing
    written. The run is recorded here (``record(early)``, put in ``recorded``) unless it
    is in ``recorded`` already: once the bundle's pipeline is made, so that ``early``
    fills it while the tool runs. The traces are drawn as the events are exported unless
    the run's events pass their limit (then planned over the whole run, from
    ``events.parquet``). ``discarded``: why the windows joined while the tool ran were
    not used (the summary says)."""
    trace_limit = TraceLimit.of(policy)
    # The summary's run figures are added up while the pipeline is filled: the dict
    # handed to write_bundle is completed in place before write_bundle writes it.
    written = dict(summary)

    def fill(sink: Any) -> EventPipeline:
        pipeline = new_pipeline(manifest, policy, sink)
        if early is not None:
            early.pipeline = pipeline
        if not recorded:
            recorded.append(record(early))
        # Held here only until the pipeline is filled: the traces are written after it,
        # without the index and the run's per-invocation arrays.
        windowed = WindowedRun.open(recorded[0], manifest, function, repeat, warmup, families, driver,
                                    None if early is None else early.totals)
        if early is not None:
            early.check(windowed)
        if not trace_limit.keeps_all(windowed.events_at_most):
            withdraw_streamed_traces(sink)
        windowed.fill(pipeline, early)
        written.update(windowed.summary(early))
        if discarded is not None:
            written["profile_read"]["joined_while_profiling_discarded"] = discarded
        del windowed
        release_freed_memory(now=True)
        return pipeline

    write_bundle(bundle, manifest, fill, written, source=PROFILE_SOURCE, trace_limit=trace_limit,
                 stream_traces=True)


def _executions(*families: Any) -> Executions:
    """(submission, command buffer) of every ``execute`` record of ``families``, distinct, sorted."""
    pairs = [np.stack([r.column("submission_id"), r.column("command_buffer_id")], axis=1)[r.column("op") == "execute"]
             for r in families if r]
    found = np.unique(np.concatenate(pairs).astype(np.int64), axis=0) if pairs else np.zeros((0, 2), np.int64)
    return Executions(found[:, 0], found[:, 1])


#: ``invocation`` of :class:`RowColumns` rows that belong to no invocation (null).
NULL_INVOCATION = -2
#: Per kind of row: the event name's prefix (``None``: the record's ``event_type``), the
#: attributes kept, and whether ``bytes`` is ``payload_length`` (``0``: none) or ``length``.
_ROW_KINDS: dict[str, tuple[str | None, tuple[str, ...], str]] = {
    "submit": ("submit", ("submission_id", "command_buffer_id", "dependency_strategy", "wait_count", "signal_count",
                          "operation_count"), "payload_length"),
    "host": ("host", ("submission_id", "command_buffer_id", "allocation_id"), "payload_length"),
    "device": ("device", ("submission_id", "command_buffer_id", "allocation_id", "start_tick", "end_tick"),
               "payload_length"),
    "memory": (None, ("allocation_id", "pool_id", "pool_bytes_reserved", "pool_bytes_committed", "submission_id"),
               "length"),
}

#: The record fields each kind of row is made of (:meth:`RowColumns.of` reads no other).
_ROW_FIELDS = {kind: frozenset({"op" if prefix else "event_type", profile_file.TYPE_VALUE, size, *kept,
                                "submission_id", "host_time_ns",
                                "ready_host_time_ns", "start_host_time_ns", "end_host_time_ns", "duration_ns"})
               for kind, (prefix, kept, size) in _ROW_KINDS.items()}


@dataclass(frozen=True)
class RowColumns:
    """Queue or memory events of a ``full`` run as columns (no object per event):
    what the pipeline writes (:meth:`EventPipeline.add_columns`)."""

    kind: str
    partition: tuple[Any, tuple[str, ...]]
    start_ns: Any
    duration_ns: Any
    invocation: Any
    bytes: Any
    attributes: dict[str, Any]

    def __len__(self) -> int:
        return len(self.start_ns)

    @classmethod
    def of(cls, kind: str, records: hal_profile.Records, invocation: Any,
           labels: tuple[str, ...] | None = None) -> RowColumns:
        """``labels``: the event names of the whole run (a window's rows are coded into
        them, so that every window writes one table); default: those of ``records``."""
        prefix, kept, size = _ROW_KINDS[kind]
        names = records.column("op" if prefix else "event_type", "")
        types = records.columns.get(profile_file.TYPE_VALUE)
        values, first, code = np.unique(types if types is not None else np.zeros(0, np.int64), return_index=True,
                                        return_inverse=True)
        if types is not None and len(set(names[first].tolist())) == len(values):
            # The direct reader's records: the names coded from their few type values.
            by_name = np.argsort(names[first].astype(str), kind="stable")
            rank = np.empty(len(values), np.int64)
            rank[by_name] = np.arange(len(values))
            distinct, code = names[first][by_name].astype(str), rank[code.ravel()]
        else:
            distinct, code = np.unique(names.astype(str), return_inverse=True)
        found = tuple(f"{prefix} {name}" if prefix else str(name) for name in distinct.tolist())
        if labels is None:
            labels = found
        else:
            code = np.array([labels.index(name) for name in found], np.int64)[code.ravel()]
        if kind == "submit":
            start = records.column("host_time_ns")
            duration = records.column("ready_host_time_ns") - start
        elif kind == "host":
            start, duration = records.column("start_host_time_ns"), records.column("duration_ns")
        elif kind == "device":
            start = records.column("start_host_time_ns")
            duration = records.column("end_host_time_ns") - start
        else:
            start, duration = records.column("host_time_ns"), np.zeros(len(records), np.int64)
        raw = records.column(size, 0).astype(np.int64)
        attributes = {name: records.columns[name] for name in kept if name in records.columns}
        if kind == "device":
            attributes["clock"] = np.full(len(records), "device_tick", dtype=object)
        return cls(kind, (code.ravel().astype(np.int32), labels), start.astype(np.int64),
                   duration.astype(np.int64), invocation, np.where(raw == 0, -1, raw) if size == "payload_length"
                   else raw, attributes)

    def add_to(self, pipeline: EventPipeline, kind: str) -> None:
        pipeline.add_columns(kind, self.partition, self.start_ns, self.duration_ns, invocation=self.invocation,
                             bytes_=self.bytes, attributes=self.attributes)

    def rows(self) -> list[EventRow]:
        """The events as :class:`EventRow` objects (lite's queue pass, tests)."""
        codes, labels = self.partition
        names = sorted(self.attributes)
        found = []
        for row in range(len(self)):
            k = int(self.invocation[row])
            size = int(self.bytes[row])
            found.append(EventRow(None if k == NULL_INVOCATION else k, labels[int(codes[row])], None,
                                  int(self.start_ns[row]), int(self.duration_ns[row]),
                                  bytes=None if size < 0 else size,
                                  attributes={name: _plain(self.attributes[name][row]) for name in names}))
        return found


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value


def _recorded(columns: hal_profile.JoinColumns, warmup: int, counts: RunTotals) -> hal_profile.JoinColumns:
    """The joined dispatches without the warmup invocations, renumbered from 0 (load time
    stays at :data:`LOAD_INVOCATION`); those dropped counted in ``counts.warmup`` with the
    warmup's queue and memory records (:func:`_placed_rows`)."""
    import numpy as np

    recorded = (columns.invocation < 0) | (columns.invocation >= warmup)
    counts.warmup += len(recorded) - int(recorded.sum())
    kept = columns.where(recorded)
    invocation = kept.invocation
    return replace(kept, invocation=np.where(invocation < 0, LOAD_INVOCATION, invocation - warmup).astype(np.int32))


#: Queue events of a lite run come from a second pass under HAL profiling: Python cannot
#: capture a profile (RUNTIME-NOTES.md), and the dispatch family is needed to tell
#: invocations apart. Their timestamps are that pass's, on the same CLOCK_MONOTONIC.
#: (The CPU drivers' row; each driver's is ``drivers.CAPABILITIES[...].lite``.)
LITE_QUEUE_FAMILIES = ("host-execution", "queue-events")


def _queue_pass(module: InstrumentedModule, vmfb: Path, manifest: dict[str, Any], inputs: Sequence[str],
                driver: str, function: str, repeat: int, warmup: int) -> dict[str, Any]:
    """Record the same invocations' queue submissions and host operations into ``module``."""
    families = drivers.capabilities(driver).lite
    profiled = _profiled_run(vmfb, manifest, inputs, driver, function, repeat, warmup, families)
    rows = [replace(row, attributes={**(row.attributes or {}), "pass": "queue-profile"})
            for row in profiled.queue_rows]
    module.add_rows("queue", rows)
    return {"families": list(families), "tool": "iree-benchmark-module" if warmup + repeat > 1
            else "iree-run-module", "queue_events": len(rows), "warmup_records_dropped": profiled.warmup_records}


def function_span_coverage(manifest: dict[str, Any]) -> str:
    """What a lite ``function`` event spans. Probes sit at the function's boundaries in
    host code: where a public function has an ``$async`` twin, the sync function awaits
    its work before returning, so the span covers it; otherwise the span closes when
    the work is issued, not when it completes."""
    public = [n for n, f in (manifest.get("partitions", {}).get("host_functions") or {}).items() if f["public"]]
    if any(name.endswith("$async") for name in public):
        return "covers the work issued (the sync wrapper awaits its $async function)"
    return ("issue only: the module has no $async wrappers, so function events close when their work is issued, "
            "not when it completes; program events time each call to completion")
