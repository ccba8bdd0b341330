"""The measured time model: what each op of a fused dispatch costs *on this device*,
beside the ledger (:mod:`dfit_mlir.analysis.ledger` reads it; nothing here reads the
ledger).

A roofline weighs an op by its arithmetic and the bytes it moves, and a transcendental
weighs nothing: an erf-GELU fused into a Linear's dispatch got ~1 % of the dispatch
where the GELU alone takes a third of the Linear's time (issue 28). So, on request
(``dfit analyze BUNDLE --time-model measured``), the dispatches that matter are taken
apart and their ops timed on the device the run used:

**measured-standalone.** Each compute op of a dispatch
(:meth:`~dfit_mlir.analysis.model.SemanticModel.compute_ops`) is cut out of the
compiled input (the manifest's ``input.path``, checked against its ``sha256``, tagged
again with the same ID algorithm) into a module of one function: the op's tensor operands
become the function's arguments (weights too, so nothing constant-folds), the non-tensor
operands it takes from constants (``torch.constant.*``, ``arith.constant``, lists of
them) and the inits it writes into (``tensor.empty``, ``linalg.fill`` of a constant) are
copied with it, and values a region body captures likewise; its results are returned.
That module's printed text (no locations) with the compile flags is the op's
**signature**: two ops with the same text are the same work, in any model. It is compiled
with the manifest's flags and run with ``dfit run --mode full`` on the run's driver, :data:`ROUNDS` times; its
time is the least over those runs of the median over invocations of the summed
durations of its dispatch events (dispatch events, like the fused time it is compared
with: no host overhead). A
dispatch's time is then split in proportion to its ops' standalone times. An op that
compiles to no dispatch (a fill that becomes a splat) weighs 0.

**calibrated-elementwise.** Where an op cannot be cut out (its operand comes from a
computation, the input file moved, the compile failed), an elementwise or normalisation
op weighs its output elements × a per-element cost of its kind measured on this device
(:data:`CALIBRATION_KINDS`: each kind timed alone on ``CALIBRATION_SHAPE`` minus the time
of a negation of the same shape — the memory traffic a fused consumer does not pay — and
at least :data:`MIN_NS_PER_ELEMENT`), a ``linalg.generic`` the sum over its body's ops;
ops of other kinds weigh their standalone time if measured, else their roofline weight
over the device's matmul rate (``torch.aten.mm`` of ``CALIBRATION_MM`` timed alike). A
partition whose ops are not all measured and where no op has a per-element cost keeps
the roofline.

Both live in one JSON cache per device (host and HAL driver: where the fused time was
measured), like the roofline calibration (:mod:`dfit_mlir.analysis.calibration`)::

    ${DFIT_CACHE_DIR:-${XDG_CACHE_HOME:-~/.cache}/dfit-mlir}/op-timings-<host>-<driver>.json

holding ``ops`` (signature → median ns, runs, op name), ``models`` (a compiled input's
key → op ID → signature, or the reason it has none) and ``calibration`` (kind → ns per
element, MACs per ns). The ledger only reads it: without a cache for the bundle's device
and model the split is the roofline's, exactly as before.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import statistics
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from dfit_mlir.analysis.model import Partition, SemanticModel
from dfit_mlir.core import atomic
from dfit_mlir.core.paths import CACHE_DIR_ENV

SCHEMA = "dfit.op-timings"
VERSION = 1
MEASURED = "measured-standalone"
CALIBRATED = "calibrated-elementwise"
#: Invocations timed per standalone op (after :data:`WARMUP`), medians over them.
REPEAT = 100
WARMUP = 10
#: Separate runs (processes) per op; its time is the least of their medians. A run of a
#: few-microsecond op lasts a few milliseconds, so one stretch of interference (another
#: process, the hypervisor) or one unlucky process (code placement) can move its whole
#: median: a 16x128 GELU measured 2.86 us in one process where it takes 1.2-1.7 us.
#: Interference only adds time, so the least median of separate runs is the op's cost.
ROUNDS = 3
#: Dispatches taken apart by default: the longest by measured time.
TOP = 5
#: Per-element calibration: a [64, 1024] f32 tensor (256 KiB: resident in L2 on a
#: current CPU, as a fused epilogue's tile is), timed per kind minus a negation.
CALIBRATION_SHAPE = (64, 1024)
CALIBRATION_MM = (256, 256, 256)
#: Floor of a per-element cost (ns): a cheap op (add, mul) measures within noise of the
#: negation; it still costs about one vector slot per element (~1/8 ns on a 3 GHz core
#: at 8 lanes, rounded down).
MIN_NS_PER_ELEMENT = 0.02
#: Base kinds of elementwise/normalisation ops, by the last part of the op name in any
#: dialect (``torch.aten.add.Tensor`` → ``add``, ``stablehlo.exponential`` → ``exp``,
#: ``math.erf`` → ``erf``, ``arith.addf`` → ``add``).
KIND_ALIASES: Mapping[str, str] = {
    "add": "add", "addf": "add", "addi": "add", "sub": "sub", "subf": "sub", "subtract": "sub", "rsub": "sub",
    "mul": "mul", "mulf": "mul", "muli": "mul", "multiply": "mul", "div": "div", "divf": "div", "divide": "div",
    "neg": "neg", "negf": "neg", "negate": "neg", "relu": "relu", "maximumf": "relu", "maximum": "relu",
    "maxnumf": "relu", "minimumf": "relu", "minimum": "relu", "clamp": "relu", "abs": "neg", "absf": "neg",
    "exp": "exp", "exponential": "exp", "tanh": "tanh", "erf": "erf", "sigmoid": "sigmoid", "logistic": "sigmoid",
    "gelu": "gelu", "silu": "silu", "rsqrt": "rsqrt", "sqrt": "sqrt", "log": "log",
    "softmax": "softmax", "_softmax": "softmax", "layer_norm": "layer_norm", "native_layer_norm": "layer_norm",
    "layer_normalization": "layer_norm", "gelu_tanh": "gelu",
    "select": "add", "where": "add", "cmpf": "add", "compare": "add", "pow": "exp", "powf": "exp",
}
#: Kinds calibrated: name → the torch-dialect body computing ``%r`` from ``%x`` (and
#: ``%y`` of the same shape for binary ops, ``%w``/``%b`` of the last dimension for a norm).
CALIBRATION_KINDS: Mapping[str, str] = {
    "neg": "%r = torch.aten.neg %x : {T} -> {T}",
    "add": "%one = torch.constant.int 1\n%r = torch.aten.add.Tensor %x, %y, %one : {T}, {T}, !torch.int -> {T}",
    "sub": "%one = torch.constant.int 1\n%r = torch.aten.sub.Tensor %x, %y, %one : {T}, {T}, !torch.int -> {T}",
    "mul": "%r = torch.aten.mul.Tensor %x, %y : {T}, {T} -> {T}",
    "div": "%r = torch.aten.div.Tensor %x, %y : {T}, {T} -> {T}",
    "relu": "%r = torch.aten.relu %x : {T} -> {T}",
    "exp": "%r = torch.aten.exp %x : {T} -> {T}",
    "tanh": "%r = torch.aten.tanh %x : {T} -> {T}",
    "erf": "%r = torch.aten.erf %x : {T} -> {T}",
    "sigmoid": "%r = torch.aten.sigmoid %x : {T} -> {T}",
    "rsqrt": "%r = torch.aten.rsqrt %x : {T} -> {T}",
    "sqrt": "%r = torch.aten.sqrt %x : {T} -> {T}",
    "log": "%r = torch.aten.log %x : {T} -> {T}",
    "gelu": "%s = torch.constant.str \"none\"\n%r = torch.aten.gelu %x, %s : {T}, !torch.str -> {T}",
    "silu": "%r = torch.aten.silu %x : {T} -> {T}",
    "softmax": "%d = torch.constant.int -1\n%n = torch.constant.none\n"
               "%r = torch.aten.softmax.int %x, %d, %n : {T}, !torch.int, !torch.none -> {T}",
    "layer_norm": "%c = torch.constant.int {L}\n%l = torch.prim.ListConstruct %c : (!torch.int) -> !torch.list<int>\n"
                  "%e = torch.constant.float 1.0e-05\n%f = torch.constant.bool false\n"
                  "%r = torch.aten.layer_norm %x, %l, %w, %b, %e, %f : {T}, !torch.list<int>, {V}, {V}, "
                  "!torch.float, !torch.bool -> {T}",
}
#: Operands an op may take from these producers by copying them into its module.
CLONED_PRODUCERS = ("torch.constant.", "arith.constant", "torch.prim.ListConstruct", "tensor.empty",
                    "linalg.fill", "torch.prim.NumToTensor")
TENSOR_TYPE = re.compile(r"^(tensor<|!torch\.vtensor<|!torch\.tensor)")


# --- the cache ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Device:
    """Where a fused time was measured: a host and a HAL driver (``local-task``)."""

    host: str
    driver: str

    @property
    def key(self) -> str:
        return "-".join(re.sub(r"[^A-Za-z0-9._]", "_", part) or "unknown" for part in (self.host, self.driver))


def device_of(model: SemanticModel) -> Device | None:
    """The device of a run bundle (its summary's host and driver); None without a run."""
    summary = model.summary
    if not summary.get("driver"):
        return None
    host = summary.get("host") or _host()
    return Device(str(host), str(summary["driver"]))


def cache_path(device: Device) -> Path:
    folder = os.environ.get(CACHE_DIR_ENV)
    base = Path(folder) if folder else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dfit-mlir"
    return base / f"op-timings-{device.key}.json"


def model_key(model: SemanticModel) -> str | None:
    """A compiled input's identity: its source's sha256 and the compile flags (None where
    the manifest records no input digest)."""
    source = model.manifest.get("input", {}).get("sha256")
    if not source:
        return None
    flags = model.manifest.get("compile", {}).get("flags") or []
    return hashlib.sha256(json.dumps([source, flags]).encode()).hexdigest()[:24]


@dataclass
class Cache:
    """The op-timings file of one device (see the module doc)."""

    device: Device
    ops: dict[str, dict[str, Any]] = field(default_factory=dict)
    models: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    calibration: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, device: Device) -> Cache:
        path = cache_path(device)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return cls(device)
        if not isinstance(data, dict) or data.get("schema") != SCHEMA or data.get("version") != VERSION:
            return cls(device)
        return cls(device, dict(data.get("ops") or {}), dict(data.get("models") or {}),
                   dict(data.get("calibration") or {}))

    def save(self) -> Path:
        path = cache_path(self.device)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_text(path, json.dumps({"schema": SCHEMA, "version": VERSION, "host": self.device.host,
                                            "driver": self.device.driver, "ops": self.ops, "models": self.models,
                                            "calibration": self.calibration}, indent=1, sort_keys=True) + "\n")
        return path


@dataclass(frozen=True)
class Lookup:
    """What the ledger weighs ops by, for one model on its device."""

    device: Device
    #: Op ID → its standalone median ns.
    standalone: Mapping[str, float]
    #: Base kind → ns per output element (calibrated-elementwise).
    per_element: Mapping[str, float]
    #: The device's MACs per ns (a standalone matmul), to put roofline weights in ns.
    macs_per_ns: float | None
    source: str

    def elementwise_ns(self, model: SemanticModel, op_id: str) -> float | None:
        """Output elements × per-element cost of the op's kind (a ``linalg.generic``:
        the sum over its body's ops); None where the kind has no calibrated cost."""
        op = model.operators[op_id]
        elements = _elements(op.results)
        if elements is None:
            return None
        if op.kind == "generic":
            body = [kind for child in model.operators.values() if child.raw.get("parent") == op_id
                    if (kind := base_kind(child.op)) is not None]
            costs = [self.per_element.get(kind) for kind in body]
            if not costs or any(cost is None for cost in costs):
                return None
            return elements * sum(cost for cost in costs if cost is not None)
        kind = base_kind(op.op)
        cost = self.per_element.get(kind) if kind else None
        return None if cost is None else elements * cost


def base_kind(op_name: str) -> str | None:
    """``torch.aten.add.Tensor`` → ``add``; ``stablehlo.exponential`` → ``exp``; None
    for an op no per-element cost describes."""
    parts = op_name.split(".")
    if parts[:2] == ["torch", "aten"] and len(parts) > 2:
        name = parts[2]
    elif parts[0] == "onnx" and len(parts) > 1:
        name = re.sub(r"(?<!^)(?=[A-Z])", "_", parts[1]).lower()
    else:
        name = parts[-1]
    return KIND_ALIASES.get(name.rstrip("_"))


def lookup(model: SemanticModel) -> Lookup | None:
    """The cached measurements for this model on the device its run used, or None
    (no run, no cache, nothing measured for this compiled input and no calibration)."""
    device = device_of(model)
    key = model_key(model)
    if device is None or key is None or not cache_path(device).is_file():
        return None
    cache = Cache.load(device)
    standalone = {op_id: float(cache.ops[entry["signature"]]["ns"])
                  for op_id, entry in cache.models.get(key, {}).items()
                  if entry.get("signature") in cache.ops}
    per_element = {k: float(v) for k, v in (cache.calibration.get("ns_per_element") or {}).items()}
    if not standalone and not per_element:
        return None
    rate = cache.calibration.get("macs_per_ns")
    return Lookup(device, standalone, per_element, float(rate) if rate else None, str(cache_path(device)))


# --- cutting an op out ----------------------------------------------------------------------

@dataclass(frozen=True)
class Standalone:
    """An op's module of one function, or why there is none."""

    op_id: str
    text: str | None
    reason: str | None = None


def standalone_modules(model: SemanticModel, op_ids: Iterable[str]) -> dict[str, Standalone]:
    """Op ID → its standalone module (see the module doc), from the manifest's input."""
    wanted = list(dict.fromkeys(op_ids))
    source = model.manifest.get("input", {})
    path = Path(source.get("path") or "")
    if not source.get("path") or not path.is_file():
        return {i: Standalone(i, None, f"the compiled input {path} is not here") for i in wanted}
    if source.get("sha256") and hashlib.sha256(path.read_bytes()).hexdigest() != source["sha256"]:
        return {i: Standalone(i, None, f"{path} changed since it was compiled") for i in wanted}
    from dfit_mlir.passes import mlir_engine
    from dfit_mlir.passes.phases import compiler_context, parse_file

    session, context = compiler_context()
    try:
        module = parse_file(context, path)
        tagged = {item.id: item.op for item in mlir_engine.tag_module(module)}
        found = {}
        for op_id in wanted:
            op = tagged.get(op_id)
            expected = model.operators[op_id].op if op_id in model.operators else None
            if op is None or mlir_engine.display_name(op) != expected:
                found[op_id] = Standalone(op_id, None, f"{op_id} is not a {expected} of {path}")
                continue
            try:
                found[op_id] = Standalone(op_id, _cut(context, op))
            except _Uncut as error:
                found[op_id] = Standalone(op_id, None, str(error))
        del module, tagged
        return found
    finally:
        session.close()


class _Uncut(Exception):
    """An op that cannot be compiled alone (the message says why)."""


def _is_tensor(value_type: Any) -> bool:
    return bool(TENSOR_TYPE.match(str(value_type)))


def _clonable(owner: Any) -> bool:
    return any(str(owner.name).startswith(prefix) for prefix in CLONED_PRODUCERS)


def _inside(op: Any, root: Any) -> bool:
    """Whether ``op`` is ``root`` or nested in it."""
    current = op
    for _ in range(64):
        if current is None:
            return False
        if current == root:
            return True
        try:
            current = current.parent
        except (ValueError, AttributeError):
            return False
    return False


def _cut(context: Any, op: Any) -> str:
    """The text of a module computing ``op`` alone (raises :class:`_Uncut`)."""
    from iree.compiler import ir

    from dfit_mlir.passes import mlir_engine

    root = op.operation
    arguments: list[str] = []
    plan: list[tuple[str, Any]] = []
    for value in root.operands:
        owner = value.owner
        producer = owner if isinstance(owner, ir.OpView) else None
        if _is_tensor(value.type) and not (producer is not None and _clonable(producer)
                                           and str(producer.name) in ("tensor.empty", "linalg.fill")):
            plan.append(("arg", len(arguments)))
            arguments.append(str(value.type))
        else:
            plan.append(("clone", value))
    captured = _captured(root)
    results = [str(result.type) for result in root.results]
    if not results:
        raise _Uncut(f"{root.name} returns nothing")
    names = ", ".join(f"%a{i}: {t}" for i, t in enumerate(arguments))
    placeholder = (f'%p:{len(results)} = "dfit.placeholder"() : () -> ({", ".join(results)})' if len(results) > 1
                   else f'%p = "dfit.placeholder"() : () -> {results[0]}')
    returned = ", ".join(f"%p#{i}" for i in range(len(results))) if len(results) > 1 else "%p"
    skeleton = (f"module @standalone {{\n  func.func @main({names}) -> ({', '.join(results)}) {{\n"
                f"    {placeholder}\n    return {returned} : {', '.join(results)}\n  }}\n}}\n")
    allowed = context.allow_unregistered_dialects
    context.allow_unregistered_dialects = True
    try:
        with context, ir.Location.unknown():
            module = ir.Module.parse(skeleton)
            block = module.body.operations[0].regions[0].blocks[0]
            marker = block.operations[0]
            point = ir.InsertionPoint(marker)
            copies: dict[Any, Any] = {}

            def copied(value: Any, depth: int = 0) -> Any:
                owner = value.owner
                if not isinstance(owner, ir.OpView) or depth > 4 or not _clonable(owner):
                    where = owner.name if isinstance(owner, ir.OpView) else "a block argument"
                    raise _Uncut(f"{root.name} takes a {value.type} from {where}, not from a constant")
                if owner not in copies:
                    inner = [copied(operand, depth + 1) for operand in owner.operands]
                    clone = owner.operation.clone(ip=point)
                    for index, operand in enumerate(inner):
                        clone.operands[index] = operand
                    copies[owner] = clone
                return copies[owner].results[value.result_number]

            values = [block.arguments[item] if kind == "arg" else copied(item) for kind, item in plan]
            outer = {key: copied(value) for key, value in captured.items()}
            clone = root.clone(ip=point)
            for index, value in enumerate(values):
                clone.operands[index] = value
            if outer:
                for position, nested in enumerate(_nested(clone)):
                    for index in range(len(nested.operands)):
                        if (position, index) in outer:
                            nested.operands[index] = outer[(position, index)]
            for index, result in enumerate(marker.results):
                result.replace_all_uses_with(clone.results[index])
            marker.erase()
            mlir_engine.strip_dfit_attributes(module.operation)
            try:
                module.operation.verify()
            except ir.MLIRError as error:
                raise _Uncut(f"{root.name} alone does not verify: {str(error).splitlines()[0][:200]}") from None
            return str(module)
    finally:
        context.allow_unregistered_dialects = allowed


def _nested(root: Any) -> list[Any]:
    found: list[Any] = []
    for region in root.regions:
        for block in region.blocks:
            for op in block.operations:
                found.append(op.operation)
                found.extend(_nested(op.operation))
    return found


def _captured(root: Any) -> dict[tuple[int, int], Any]:
    """(nested op position, operand index) → a value from outside ``root`` that a
    region body uses (a constant a ``linalg.generic`` body compares with)."""
    from iree.compiler import ir

    found = {}
    for position, nested in enumerate(_nested(root)):
        for index, value in enumerate(nested.operands):
            owner = value.owner
            inside = _inside(owner.operation, root) if isinstance(owner, ir.OpView) else \
                _inside(owner.owner.operation if hasattr(owner, "owner") else None, root)
            if not inside:
                found[(position, index)] = value
    return found


def signature(text: str, flags: Iterable[str]) -> str:
    return hashlib.sha256(json.dumps([text, list(flags)]).encode()).hexdigest()[:24]


# --- timing ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Timing:
    ns: float
    runs: int
    dispatches: int
    #: Each run's median, where there were several (``ns`` is the least).
    round_ns: tuple[float, ...] = ()


def time_module(text: str, flags: list[str], driver: str, *, repeat: int = REPEAT, warmup: int = WARMUP,
                rounds: int = ROUNDS, inputs: tuple[str, ...] = ()) -> Timing:
    """Compile ``text`` with ``flags`` and run it ``rounds`` times, ``repeat`` invocations
    each, on ``driver`` with HAL profiling: the least over runs of the median over
    invocations of its dispatches' summed durations (see :data:`ROUNDS`)."""
    from dfit_mlir.passes.instrumented_compile import compile_instrumented
    from dfit_mlir.runtime_hooks.run import run_bundle

    timings = []
    with tempfile.TemporaryDirectory(prefix="dfit-op-") as scratch:
        folder = Path(scratch)
        source = folder / "op.mlir"
        source.write_text(text, encoding="utf-8")
        compiled = compile_instrumented(source, folder / "op.vmfb", mode="ids", flags=flags)
        for round_index in range(max(1, rounds)):
            bundle = run_bundle(compiled.vmfb, compiled.manifest_path, folder / f"run{round_index}", mode="full",
                                inputs=inputs, repeat=repeat, warmup=warmup, driver=driver).bundle
            timings.append(bundle_timing(bundle, repeat))
    best = min(timings, key=lambda timing: timing.ns)
    return Timing(best.ns, best.runs, best.dispatches, tuple(timing.ns for timing in timings))


def bundle_timing(bundle: Path, repeat: int) -> Timing:
    """One run's timing: the median over its ``repeat`` invocations of their dispatches'
    summed durations (an invocation that ran no dispatch counts 0)."""
    import pyarrow.parquet as pq

    table = pq.read_table(bundle / "events.parquet", columns=["kind", "invocation", "duration_ns"]).to_pylist()
    per_run: dict[int, int] = {}
    dispatches = 0
    for event in table:
        if event["kind"] == "dispatch" and event["duration_ns"]:
            per_run[event["invocation"] or 0] = per_run.get(event["invocation"] or 0, 0) + event["duration_ns"]
            dispatches += 1
    if not per_run:
        return Timing(0.0, repeat, 0)
    runs = [per_run.get(i, 0) for i in sorted(set(per_run) | set(range(min(per_run), min(per_run) + repeat)))]
    return Timing(float(statistics.median(runs)), len(runs), dispatches // max(1, len(per_run)))


@dataclass
class Report:
    """What :func:`measure` did: per op, its signature and time or the reason it has none."""

    device: Device
    path: Path | None = None
    measured: dict[str, float] = field(default_factory=dict)
    reused: dict[str, float] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    partitions: list[str] = field(default_factory=list)
    calibrated: bool = False

    def lines(self) -> list[str]:
        out = [f"time model measured on {self.device.host} ({self.device.driver}); cache {self.path}",
               f"  dispatches taken apart: {len(self.partitions)}; ops timed now {len(self.measured)}, "
               f"from the cache {len(self.reused)}, not compiled alone {len(self.failed)}"]
        out += [f"  {op_id}: {reason}" for op_id, reason in sorted(self.failed.items())[:20]]
        if self.calibrated:
            out.append("  per-element costs calibrated (calibrated-elementwise)")
        return out


def measure(model: SemanticModel, partitions: Iterable[Partition], *, repeat: int = REPEAT,
            warmup: int = WARMUP, refresh: bool = False, calibrate_elements: bool = True,
            progress: Callable[[str], None] | None = None) -> Report:
    """Time each compute op of ``partitions`` compiled alone on the model's device and
    cache the results (and, once per device, the per-element calibration)."""
    from dfit_mlir.core.errors import InvalidInputError

    device = device_of(model)
    key = model_key(model)
    if device is None or key is None:
        raise InvalidInputError(f"{model.source}: measuring op costs needs a run bundle of a dfit compile "
                                "(its device and compiled input)")
    if device.host != _host():
        raise InvalidInputError(f"{model.source} ran on {device.host}; op costs must be measured on that host "
                                f"(this is {_host()})")
    flags = list(model.manifest.get("compile", {}).get("flags") or [])
    cache = Cache.load(device)
    report = Report(device)
    parts = list(partitions)
    report.partitions = [p.id for p in parts]
    ops = [op_id for part in parts for op_id in model.compute_ops(part)]
    cuts = standalone_modules(model, ops)
    entries = cache.models.setdefault(key, {})
    for op_id, cut in cuts.items():
        if cut.text is None:
            entries[op_id] = {"reason": cut.reason}
            report.failed[op_id] = str(cut.reason)
            continue
        sig = signature(cut.text, flags)
        entries[op_id] = {"signature": sig}
        if sig in cache.ops and not refresh:
            report.reused[op_id] = cache.ops[sig]["ns"]
            continue
        if progress:
            progress(f"timing {op_id} alone")
        try:
            timing = time_module(cut.text, flags, device.driver, repeat=repeat, warmup=warmup)
        except Exception as error:  # a compile or run failure: this op falls back, the rest go on
            entries[op_id] = {"reason": f"compiled alone, it failed: {' '.join(str(error).split())[:300]}"}
            report.failed[op_id] = entries[op_id]["reason"]
            continue
        cache.ops[sig] = {"ns": timing.ns, "runs": timing.runs, "dispatches": timing.dispatches,
                          "round_ns": list(timing.round_ns), "op": model.operators[op_id].op,
                          "measured_at": _now()}
        report.measured[op_id] = timing.ns
    if calibrate_elements and (refresh or not cache.calibration):
        if progress:
            progress("calibrating per-element costs")
        cache.calibration = calibrate(flags, device.driver, repeat=repeat, warmup=warmup)
        report.calibrated = True
    report.path = cache.save()
    return report


def calibration_module(kind: str, shape: tuple[int, int] = CALIBRATION_SHAPE) -> str:
    """The torch-dialect module timing one per-element kind on ``shape``."""
    rows, cols = shape
    tensor = f"!torch.vtensor<[{rows},{cols}],f32>"
    vector = f"!torch.vtensor<[{cols}],f32>"
    body = CALIBRATION_KINDS[kind].replace("{T}", tensor).replace("{V}", vector).replace("{L}", str(cols))
    arguments = [f"%x: {tensor}"]
    if "%y" in body:
        arguments.append(f"%y: {tensor}")
    if "%w" in body:
        arguments += [f"%w: {vector}", f"%b: {vector}"]
    lines = "\n    ".join(body.splitlines())
    return (f"module @calibrate_{kind} {{\n  func.func @main({', '.join(arguments)}) -> {tensor} {{\n"
            f"    {lines}\n    return %r : {tensor}\n  }}\n}}\n")


def matmul_module(m: int, k: int, n: int) -> str:
    a, b, c = (f"!torch.vtensor<[{m},{k}],f32>", f"!torch.vtensor<[{k},{n}],f32>", f"!torch.vtensor<[{m},{n}],f32>")
    return (f"module @calibrate_mm {{\n  func.func @main(%a: {a}, %b: {b}) -> {c} {{\n"
            f"    %r = torch.aten.mm %a, %b : {a}, {b} -> {c}\n    return %r : {c}\n  }}\n}}\n")


def calibrate(flags: list[str], driver: str, *, repeat: int = REPEAT, warmup: int = WARMUP) -> dict[str, Any]:
    """Per-element costs (ns) of :data:`CALIBRATION_KINDS` and the matmul rate on this
    device (see the module doc)."""
    elements = CALIBRATION_SHAPE[0] * CALIBRATION_SHAPE[1]
    times = {kind: time_module(calibration_module(kind), flags, driver, repeat=repeat, warmup=warmup).ns
             for kind in CALIBRATION_KINDS}
    baseline = times["neg"]
    per_element = {kind: round(max(MIN_NS_PER_ELEMENT, (ns - baseline) / elements), 5)
                   for kind, ns in times.items()}
    m, k, n = CALIBRATION_MM
    mm = time_module(matmul_module(m, k, n), flags, driver, repeat=max(10, repeat // 4), warmup=warmup).ns
    return {"ns_per_element": per_element, "standalone_ns": times, "shape": list(CALIBRATION_SHAPE),
            "macs_per_ns": (m * k * n / mm) if mm else None, "matmul": list(CALIBRATION_MM),
            "method": f"each kind compiled alone on a {CALIBRATION_SHAPE[0]}x{CALIBRATION_SHAPE[1]} f32 tensor, "
                      f"least of {ROUNDS} runs' median dispatch times over {repeat} invocations on {driver}, "
                      f"minus a negation's; "
                      f"matmul {m}x{k}x{n}",
            "measured_at": _now()}


def _elements(values: Iterable[Mapping[str, Any]]) -> int | None:
    for value in values:
        shape = value.get("shape")
        if isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape):
            count = 1
            for d in shape:
                count *= d
            return count
    return None


def _host() -> str:
    import socket

    return socket.gethostname() or "localhost"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
