"""``dfit compile``: tag, run IREE phase by phase with lineage snapshots, write the vmfb
and the manifest.

The instrumented compile is observational. IDs travel in locations only: the
``dfit.id``/``dfit.hash`` attributes are stripped right after the operator table is
read, because discardable attributes take part in op equivalence — CSE and IREE's
executable deduplication compare them — so keeping them would change what IREE
generates (64 unique executables instead of 1 in RUNTIME-NOTES.md). Locations do not.
"""

from __future__ import annotations

import hashlib
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from iree.compiler import ir

from dfit_mlir import frontends
from dfit_mlir.core import (
    atomic,
    costs,
    filters,
    lineage,
    manifest,
    reading,
    site_costs,
    toolchain,
    vmfb,
)
from dfit_mlir.core.errors import InvalidInputError
from dfit_mlir.core.ids import ID_SCHEME_VERSION
from dfit_mlir.core.lineage import DispatchRegion, DispatchSite, StageFigures
from dfit_mlir.passes import (
    materialisation,
    mlir_engine,
    operators,
    pass_history,
    phases,
    recordings,
    snapshot,
    stage_ir,
    tensor_traces,
)
from dfit_mlir.passes import probes as function_probes
from dfit_mlir.passes.region_costs import RegionCost

MODES = ("ids", "lite", "full")
#: ``phases``: a lineage class per ID and phase; ``passes``: also the pass that changed it.
LINEAGE_DETAILS = ("phases", "passes")
#: Phases whose snapshot each mode takes, in pipeline order. ``ids`` keeps what the
#: runtime join needs: dispatch regions (per-site fused IDs), exports with their bodies,
#: final call sites. ``phase_s`` in the manifest times each run up to a snapshot phase
#: (from the previous one), and ``serialize`` the rest through the vmfb.
SNAPSHOT_PHASES = {
    "ids": ("dispatch-creation", "executable-sources", "hal"),
    "lite": ("input", "global-optimization", "dispatch-creation", "flow", "stream", "executable-sources", "hal"),
    "full": toolchain.IREE_PHASES,
}
SOURCE_STAGE = "source"
#: Modes that keep each phase's printed IR of every ID's carriers (``passes/stage_ir.py``).
STAGE_IR_MODES = ("full",)
#: Modes whose module gets function-boundary probes (``passes/probes.py``) unless told
#: otherwise. Only ``lite``: probes are what a lite run reads, and they are not free of
#: side effects on code generation — on mobilenet_v1 the constant pool's layout and some
#: executable code differ from the plain compile (same sizes, same exports, same
#: outputs), whereas ``ids``/``full`` modules keep the plain compile's executables
#: byte for byte. A ``full`` run reads HAL profiling instead.
PROBE_MODES = ("lite",)
#: Runtime hooks (tensor traces, probes) go in once the input dialects are lowered.
INSERT_AFTER_PHASE = "input"
#: The phase whose host code gives the command-buffer recordings the runtime join
#: matches (``passes/recordings.py``): every mode snapshots it.
HOST_PROGRAM_PHASE = "hal"


def capabilities() -> dict[str, Any]:
    """What an IREE compile records and an IREE run exposes (the manifest's
    ``capabilities``; :mod:`dfit_mlir.adapters.iree` hands the same descriptor out)."""
    return {
        "backend": "iree",
        "path": "compiler-visible",
        "exposes": {
            "compiler_ir": "full (every IREE phase)",
            "lineage": "per-op, every phase",
            "source_locations": "file:line:col, name and call-site locations",
            "tensor_shapes": "full",
            "partitions": "dispatches (exports and call sites)",
            "static_cost": "MACs / FLOPs / bytes derived from op types",
            "per_op_timing": "per dispatch (HAL host-execution profiling)",
            "per_partition_timing": "per dispatch",
            "per_program_timing": "per invocation and per function (probes)",
            "memory": "tensor sizes (static); allocations (HAL memory events)",
        },
    }


@dataclass(frozen=True)
class CompileResult:
    vmfb: Path
    manifest_path: Path
    manifest: dict[str, Any]


def compile_instrumented(
    source: Path,
    output: Path,
    *,
    mode: str = "full",
    flags: Sequence[str] = (),
    manifest_path: Path | None = None,
    driver_name: str | None = None,
    trace_tensors: tuple[str, ...] = (),
    probes: bool | None = None,
    lineage_detail: str = "phases",
) -> CompileResult:
    """``trace_tensors``: globs selecting source ops whose values the module traces
    (``passes/tensor_traces.py``); empty: no tracing, the module computes exactly what
    the plain compile does. ``probes``: insert function-boundary probes (default: in
    :data:`PROBE_MODES`). ``lineage_detail="passes"`` also records which pass changed each
    ID's class (:mod:`dfit_mlir.passes.pass_history`; ``full`` mode only: the history is
    checked against the snapshot of every phase)."""
    _check_options(mode, lineage_detail)
    request = _Request(
        source=source,
        output=output,
        manifest_path=manifest_path or manifest.default_path(output),
        mode=mode,
        trace_tensors=trace_tensors,
        with_probes=mode in PROBE_MODES if probes is None else probes,
        observing=lineage_detail == "passes",
    )
    started = time.perf_counter()
    if request.observing:
        driver = pass_history.observing_driver(flags)
    else:
        driver = phases.open_driver(flags, driver_name)
    try:
        tagged = _tag_source(driver, request)
        lowered = _run_phases(driver, request, tagged)
        document = _write_outputs(driver, request, tagged, lowered, started)
    finally:
        driver.close()
    return CompileResult(output, request.manifest_path, document)


def _check_options(mode: str, lineage_detail: str) -> None:
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {', '.join(MODES)}")
    if lineage_detail not in LINEAGE_DETAILS:
        raise ValueError(f"unknown lineage detail {lineage_detail!r}; expected one of {', '.join(LINEAGE_DETAILS)}")
    if lineage_detail == "passes" and mode != "full":
        raise InvalidInputError(f"--lineage passes needs --mode full (got --mode {mode}): the pass history is "
                                "checked against the lineage snapshot of every phase")


@dataclass(frozen=True)
class _Request:
    """What one instrumented compile is asked for, options checked."""

    source: Path
    output: Path
    manifest_path: Path
    mode: str
    trace_tensors: tuple[str, ...]
    with_probes: bool
    #: Record which pass changed each ID's class (``--lineage passes``).
    observing: bool


@dataclass(frozen=True)
class _TaggedSource:
    """The parsed source with its IDs read into the operator table, before any phase."""

    module: ir.Operation
    ops: list[dict]
    tensors: list[dict]
    cache: snapshot.LocationCache
    #: The printed IR of each ID's carriers per phase, for `dfit view` (full mode only).
    carrier_texts: stage_ir.StageIR | None
    figures: StageFigures


def _tag_source(driver: phases.PhaseDriver, request: _Request) -> _TaggedSource:
    module = driver.parse(request.source)
    phases.require_functions(module, request.source)
    cache = snapshot.LocationCache()
    t0 = time.perf_counter()
    tagged = mlir_engine.tag_module(module)
    ops, tensors = operators.operator_table(tagged, cache)
    mlir_engine.strip_dfit_attributes(module)
    tag_s = time.perf_counter() - t0
    carrier_texts = stage_ir.StageIR() if request.mode in STAGE_IR_MODES else None
    figures = snapshot.take_snapshot(module, SOURCE_STAGE, cache, carrier_texts)
    figures.time_s += tag_s
    return _TaggedSource(module, ops, tensors, cache, carrier_texts, figures)


@dataclass(frozen=True)
class _Lowered:
    """What running IREE phase by phase gave: the module after the last phase run, the
    figures of each snapshot taken on the way, and the runtime hooks inserted."""

    module: ir.Operation
    #: The last phase run: the vmfb is written from there.
    last_phase: str | None
    stages: list[StageFigures]
    phase_s: dict[str, float]
    trace_plan: tensor_traces.TracePlan
    probe_sites: list[function_probes.ProbeSite]
    host_program: dict[str, Any]
    #: What carries each ID per dispatch region.
    dispatch_regions: materialisation.RegionLog


def _run_phases(driver: phases.PhaseDriver, request: _Request, tagged: _TaggedSource) -> _Lowered:
    mode, module = request.mode, tagged.module
    stages: list[StageFigures] = [tagged.figures]
    phase_s: dict[str, float] = {}
    after: str | None = None
    trace_plan = tensor_traces.TracePlan((), ())
    probe_sites: list[function_probes.ProbeSite] = []
    host_program: dict[str, Any] = {"recordings": [], "functions": {}}
    dispatch_regions = materialisation.RegionLog()
    for phase in _stops(request):
        t0 = time.perf_counter()
        module = driver.run(module, after, phase)
        phase_s[phase] = time.perf_counter() - t0
        if phase in SNAPSHOT_PHASES[mode]:
            stages.append(snapshot.take_snapshot(module, phase, tagged.cache, tagged.carrier_texts))
            dispatch_regions.observe(module, phase, tagged.cache)
        if phase == HOST_PROGRAM_PHASE:
            host_program = recordings.host_program(module)
        if phase == INSERT_AFTER_PHASE:
            # After the snapshot: the stage figures describe the module IREE would
            # build without dfit's runtime hooks.
            trace_plan, probe_sites = _insert_runtime_hooks(driver, request, module, tagged.ops)
        after = phase
    return _Lowered(module, after, stages, phase_s, trace_plan, probe_sites, host_program, dispatch_regions)


def _stops(request: _Request) -> list[str]:
    """The phases to stop after: only where a snapshot is taken or runtime hooks go in,
    since each stop costs a pipeline set-up."""
    inserting = request.trace_tensors or request.with_probes
    return [p for p in toolchain.IREE_PHASES
            if p in SNAPSHOT_PHASES[request.mode] or (inserting and p == INSERT_AFTER_PHASE)]


def _insert_runtime_hooks(
    driver: phases.PhaseDriver, request: _Request, module: ir.Operation, ops: list[dict]
) -> tuple[tensor_traces.TracePlan, list[function_probes.ProbeSite]]:
    """Tensor traces and function probes, as asked for."""
    trace_plan = tensor_traces.TracePlan((), ())
    probe_sites: list[function_probes.ProbeSite] = []
    if request.trace_tensors:
        trace_plan = tensor_traces.insert_tensor_traces(
            module, request.trace_tensors, filters.names_by_id(ops), str(request.source))
    if request.with_probes:
        probe_sites = function_probes.insert_function_probes(module)
    if request.trace_tensors or request.with_probes:
        driver.mark_changed(module)
    return trace_plan, probe_sites


def _write_outputs(driver: phases.PhaseDriver, request: _Request, tagged: _TaggedSource,
                   lowered: _Lowered, started: float) -> dict[str, Any]:
    """The vmfb and the manifest, each written whole or not at all; returns the manifest."""
    ops = tagged.ops
    with atomic.atomic_path(request.output, kind="vmfb") as tmp_vmfb:
        t0 = time.perf_counter()
        driver.write_vmfb(lowered.module, lowered.last_phase, tmp_vmfb)
        phase_s = {**lowered.phase_s, "serialize": time.perf_counter() - t0}
        document = build_manifest(
            source=request.source,
            mode=request.mode,
            flags=driver.flags,
            driver=driver.name,
            operators=ops,
            tensors=tagged.tensors,
            stages=lowered.stages,
            phase_s=phase_s,
            total_s=time.perf_counter() - started,
            vmfb_bytes=tmp_vmfb.stat().st_size,
            vmfb_sha256=hashlib.sha256(tmp_vmfb.read_bytes()).hexdigest(),
            output=request.output,
            probe_sites=lowered.probe_sites,
            trace_plan=lowered.trace_plan,
            host_program=lowered.host_program,
        )
        if tagged.carrier_texts is not None:
            document["stage_ir"] = tagged.carrier_texts.table(op["id"] for op in ops)
        if request.observing:
            document["pass_history"] = _pass_history_table(driver.history, lowered.stages, ops)
        document["partitions"] = materialisation.separate_shared(
            document["partitions"], lowered.dispatch_regions.regions, ops)
        site_costs.settle_manifest_costs(document)
        document["compile"]["codegen"] = vmfb.codegen_facts(tmp_vmfb, driver.flags)  # for `dfit diff`
        # The source files this compile read, by content: what `dfit view` may show.
        document["sources"] = reading.source_digests(
            frame["file"] for op in ops for frame in (op.get("source"), *(op.get("call_stack") or ()))
            if isinstance(frame, dict) and isinstance(frame.get("file"), str))
        manifest.save(document, request.manifest_path, kind="manifest")
    return document


def _pass_history_table(history: pass_history.PassHistory, stages: list[StageFigures],
                        ops: list[dict]) -> dict[str, Any]:
    table = pass_history.to_table(history.changes, threads="parallel (ordered per IR unit)")
    table["pass_runs"] = history.pass_runs
    table["unresolved_units"] = history.unresolved  # dumps of IR units the replay did not hold
    # Dumps of the scratch modules IREE's const-eval compiles and erases: not replayed.
    table["scratch_units"] = dict(history.scratch)
    # The replay runs beside the compile: how long it took, and how much of it the compile
    # waited for at the end (the rest hid under the compile of later phases).
    table["replay_s"] = {"busy": round(history.replay_s, 3), "waited": round(history.waited_s, 3)}
    table["disagreements"] = pass_history.check_against_stages(
        history.changes, stages, [op["id"] for op in ops], toolchain.IREE_PHASES)
    return table


def build_manifest(*, source: Path, mode: str, flags: Sequence[str], driver: str, operators: list[dict],
                   tensors: list[dict], stages: list[StageFigures], phase_s: dict[str, float],
                   total_s: float, vmfb_bytes: int, vmfb_sha256: str, output: Path,
                   probe_sites: Sequence[function_probes.ProbeSite] = (),
                   trace_plan: tensor_traces.TracePlan | None = None,
                   host_program: dict[str, Any] | None = None) -> dict[str, Any]:
    source_ids = [op["id"] for op in operators]
    by_name = {figures.stage: figures for figures in stages}
    partitions = dispatch_table(by_name, host_program, tensors)
    return {
        "schema": manifest.SCHEMA_NAME,
        "version": manifest.MANIFEST_VERSION,
        "id_scheme": ID_SCHEME_VERSION,
        "producer": {"tool": "dfit compile", "toolchain": toolchain.versions(), "python": sys.version.split()[0]},
        "input": {"path": str(source), "sha256": hashlib.sha256(source.read_bytes()).hexdigest(),
                  "frontend": frontends.detect(operators).name},
        "compile": {
            "mode": mode,
            "driver": driver,
            "flags": list(flags),
            "output": str(output),
            "vmfb_bytes": vmfb_bytes,
            "vmfb_sha256": vmfb_sha256,
            "phase_s": {name: round(value, 6) for name, value in phase_s.items()},
            "total_s": round(total_s, 6),
        },
        "operators": operators,
        "tensors": tensors,
        "stages": [_stage_row(figures, source_ids, phase_s.get(figures.stage)) for figures in stages],
        "lineage": {
            "stages": [figures.stage for figures in stages],
            "legend": lineage.CLASS_LETTERS,
            "classes": {
                source_id: "".join(lineage.CLASS_LETTERS[figures.classify(source_id)] for figures in stages)
                for source_id in source_ids
            },
        },
        "partitions": partitions,
        "probes": [asdict(site) for site in probe_sites],
        "tensor_traces": [asdict(trace) for trace in trace_plan.traces] if trace_plan else [],
        "tensor_traces_skipped": [{"id": i, "reason": r} for i, r in trace_plan.skipped] if trace_plan else [],
        "capabilities": capabilities(),
    }


def _stage_row(figures: StageFigures, source_ids: list[str], phase_s: float | None) -> dict[str, Any]:
    return {
        "name": figures.stage,
        "ops": figures.ops,
        "tagged_ops": figures.tagged_ops,
        "non_constant_ops": figures.non_constant_ops,
        "non_constant_tagged": figures.non_constant_tagged,
        "coverage": round(figures.coverage, 6),
        "attributed": round(figures.attributed, 6),
        "materialised_by_kind": figures.materialised_by_kind(),
        "lineage": figures.class_counts(source_ids),
        "phase_s": None if phase_s is None else round(phase_s, 6),
        "snapshot_s": round(figures.time_s, 6),
    }


def dispatch_table(by_stage: dict[str, StageFigures], host_program: dict[str, Any] | None = None,
                   tensors: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """Exports and dispatch call sites in program order, each with its root and fused IDs,
    and the host program the runtime join matches (``passes/recordings.py``).

    Sites come from the last snapshot that has them (``hal``: the order the runtime
    records). A site's fused IDs come from its own dispatch region before outlining
    (:func:`site_regions`), never from the export body: after deduplication one export
    body serves many sites and only carries the first site's IDs.
    """
    sites_stage = next((s for s in reversed(list(by_stage.values())) if s.sites), None)
    exports_stage = next((s for s in reversed(list(by_stage.values())) if s.exports), None)
    regions = list(by_stage["dispatch-creation"].regions) if "dispatch-creation" in by_stage else []
    exports = exports_stage.exports if exports_stage else []
    sites = list(sites_stage.sites) if sites_stage else []
    host_program = host_program or {"recordings": [], "functions": {}}
    placement = site_placement(host_program)
    positions = site_region_positions(sites, regions)
    fused_of = site_regions(sites, regions, positions)
    site_rows = [site_row(index, site, fused_of[index], placement.get(index), tensors,
                          cost=regions[positions[index]].cost if positions[index] is not None else None)
                 for index, site in enumerate(sites)]
    export_rows = [
        {
            "executable": export.executable,
            "name": export.name,
            "ordinal": export.ordinal,
            "root_id": export.ids[0] if export.ids else None,
            "ids": list(export.ids),
            "fused_ids": list(export.body_ids),
        }
        for export in exports
    ]
    return {
        "sites_stage": sites_stage.stage if sites_stage else None,
        "exports_stage": exports_stage.stage if exports_stage else None,
        "exports": export_rows,
        "dispatch_sites": site_rows,
        "recordings": host_program["recordings"],
        "host_functions": host_program["functions"],
        "unattributed_exports": [row["name"] for row in export_rows if not row["ids"] and not row["fused_ids"]],
        "unattributed_sites": [row["index"] for row in site_rows if not row["ids"] and not row["fused_ids"]],
    }


#: Export names of the dispatches IREE adds to change a tensor's layout under data
#: tiling (``--iree-opt-data-tiling``): they move the tensor their site's IDs name.
ENCODING_MARKERS = ("set_encoding", "unset_encoding", "encoding")


def site_row(index: int, site: DispatchSite, fused: tuple[str, ...],
             placement: tuple[int, int, bool] | None, tensors: Sequence[dict[str, Any]] = (),
             cost: RegionCost | None = None) -> dict[str, Any]:
    """One manifest call-site row. ``placement``: (recording, command index, load time).
    An encoding site's IDs are its consumer op (its location's root) and the tensors it
    encodes (``encodes``: the source tensors of that shape the root consumes).
    ``cost``: what its dispatch region computes and moves (``passes/region_costs.py``):
    ``region_macs``/``region_flops`` per source ID are the weights
    :mod:`dfit_mlir.core.site_costs` places op costs by; an encoding moves the tensor its
    name gives and computes nothing."""
    recording, command_index, load_time = placement if placement else (None, None, False)
    encoding = is_encoding(site.export)
    encodes: list[str] = []
    if encoding and site.ids:
        encodes = encoded_tensors(site.export, site.ids[0], tensors)
        producers = {t["id"]: t.get("producer") for t in tensors if t["id"] in encodes}
        fused = (site.ids[0], *dict.fromkeys(p for p in producers.values() if p and "/" in p and p != site.ids[0]))
    return {
        "index": index,
        "function": site.function,
        "executable": site.executable,
        "export": site.export,
        "root_id": site.ids[0] if site.ids else None,
        "ids": list(site.ids),
        "fused_ids": list(fused),
        "recording": recording,
        "command_index": command_index,
        # load: run once by an initializer when the module is loaded; invocation: by a
        # call of a function.
        "phase": "load" if load_time else "invocation",
        # encoding: a data-tiling layout change of the tensors its IDs name.
        "kind": "encoding" if encoding else "compute",
        **({"encodes": encodes} if encoding else {}),
        **_region_fields(site.export, encoding, cost),
    }


def _region_fields(export: str, encoding: bool, cost: RegionCost | None) -> dict[str, Any]:
    if encoding:
        moved = _encoded_bytes(export)
        return {"region_macs": {}, "region_flops": {}, "bytes_read": moved, "bytes_written": moved}
    if cost is None:
        return {}
    return {"region_macs": dict(cost.op_macs), "region_flops": dict(cost.op_flops),
            "region_transcendentals": dict(cost.op_transcendentals),
            "bytes_read": cost.bytes_read, "bytes_written": cost.bytes_written,
            **({"dtype": cost.dtype} if cost.dtype is not None else {})}


def _encoded_bytes(export: str) -> int | None:
    """Size of the tensor an encoding export (``…encode_128x784xf32_to_…``) lays out."""
    match = _ENCODE_RE.search(export)
    if match is None or "D" in match["shape"]:
        return None
    return costs.type_bytes(f"tensor<{match['shape']}{match['dtype']}>")


_ENCODE_RE = re.compile(r"encode_(?P<shape>(?:[0-9D]+x)*)(?P<dtype>[a-z]+\d+)_to_")


def is_encoding(export: str) -> bool:
    return any(marker in export for marker in ENCODING_MARKERS)


def encoded_tensors(export: str, root: str, tensors: Sequence[dict[str, Any]]) -> list[str]:
    """Source tensors an encoding dispatch (``_encoding_0_encode_128x784xi8_to_…``) lays
    out: those ``root`` consumes with the export's shape (unit dims aside; ``D``: any) and
    element type, followed back through reshapes and casts to the constant or argument
    they come from (TFLite's weights reach a conv2d through a reshape)."""
    match = _ENCODE_RE.search(export)
    if match is None:
        return []
    wanted = [None if d == "D" else int(d) for d in match["shape"].split("x") if d and d != "1"]
    dtype = match["dtype"].lstrip("su")
    feeding: dict[str, list[dict[str, Any]]] = {}
    for tensor in tensors:
        for consumer in tensor.get("consumers", ()):
            feeding.setdefault(consumer, []).append(tensor)
    found = []
    matching = []
    for tensor in feeding.get(root, ()):
        dims = [d for d in tensor.get("shape") or [] if d != 1]
        if len(dims) != len(wanted) or str(tensor.get("dtype", "")).lstrip("su") != dtype \
                or any(w is not None and w != d for w, d in zip(wanted, dims, strict=True)):
            continue
        # A dynamic dim (D) is one the tensor leaves dynamic too, where one does.
        exact = all((w is None) == (d is None) for w, d in zip(wanted, dims, strict=True))
        matching.append((exact, tensor))
    if any(exact for exact, _ in matching):
        matching = [(exact, tensor) for exact, tensor in matching if exact]
    for _, tensor in matching:
        for _ in range(4):  # back through layout-only ops to the stored tensor
            producer = tensor.get("producer") or ""
            op_name = producer.rsplit("/", 1)[-1].split("#")[0]
            upstream = feeding.get(producer, [])
            if not any(part in op_name for part in _LAYOUT_OPS) or len(upstream) < 1:
                break
            tensor = max(upstream, key=lambda t: t.get("bytes") or 0)
        found.append(tensor["id"])
    return found


#: Ops that change only a tensor's layout or type, between a weight and its consumer.
_LAYOUT_OPS = ("reshape", "transpose", "cast", "convert", "expand_shape", "collapse_shape")


def site_placement(host_program: dict[str, Any]) -> dict[int, tuple[int, int, bool]]:
    """Site index -> (recording, command index in it, load time)."""
    placement = {}
    for recording in host_program["recordings"]:
        for position, command in enumerate(recording["commands"]):
            if command.get("site") is not None:
                placement[command["site"]] = (recording["index"], position, recording["load_time"])
    return placement


def site_region_positions(sites: Sequence[DispatchSite], regions: Sequence[DispatchRegion]) -> list[int | None]:
    """The dispatch region each site was outlined from (its position in ``regions``), or
    None: a site and its region share their root (the first ID of their locations);
    regions are taken in program order, each once, so that sites of one deduplicated
    export each get their own region. Encodings have no region of their own."""
    used = [False] * len(regions)
    by_root: dict[str, list[int]] = {}
    for position, region in enumerate(regions):
        if region.root_ids:
            by_root.setdefault(region.root_ids[0], []).append(position)
    found: list[int | None] = []
    for site in sites:
        root = site.ids[0] if site.ids else None
        first = None
        if root is not None and not is_encoding(site.export):
            first = next((p for p in by_root.get(root, ()) if not used[p]), None)
            if first is not None:
                used[first] = True
        found.append(first)
    return found


def site_regions(sites: Sequence[DispatchSite], regions: Sequence[DispatchRegion],
                 positions: Sequence[int | None] | None = None) -> list[tuple[str, ...]]:
    """Fused IDs of each site from the dispatch region it was outlined from
    (:func:`site_region_positions`). A site whose root starts no region (data tiling
    outlines encodings and moves ops around) takes the region that holds its root;
    failing that, its own location's IDs. Either way its root is among its fused IDs."""
    positions = site_region_positions(sites, regions) if positions is None else positions
    holding: dict[str, list[int]] = {}
    for position, region in enumerate(regions):
        for source_id in region.ids:
            holding.setdefault(source_id, []).append(position)
    fused_of = []
    for site, position in zip(sites, positions, strict=True):
        root = site.ids[0] if site.ids else None
        fused: tuple[str, ...] = tuple(site.ids)
        if position is not None:
            fused = regions[position].ids
        elif root is not None and not is_encoding(site.export) and root in holding:
            # Prefer a region that also holds the site's other IDs.
            best = max(holding[root], key=lambda p: (len(set(site.ids) & set(regions[p].ids)), -p))
            fused = (root, *(i for i in regions[best].ids if i != root))
        fused_of.append(fused)
    return fused_of
