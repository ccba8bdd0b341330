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
import re
import tempfile
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from dfit_mlir import atomic, toolchain, traces
from dfit_mlir import manifest as manifest_io
from dfit_mlir.errors import InvalidInputError
from dfit_mlir.event_pipeline import EventPipeline, ParquetSink, Policy, site_table
from dfit_mlir.runtime_hooks import hal_profile
from dfit_mlir.runtime_hooks.inprocess import Runner, load_input

#: numpy dtype and ``iree-run-module`` element type of each manifest dtype.
DTYPES = {
    "f32": ("float32", "f32"), "f16": ("float16", "f16"), "f64": ("float64", "f64"),
    "i8": ("int8", "i8"), "si8": ("int8", "i8"), "ui8": ("uint8", "ui8"),
    "i32": ("int32", "i32"), "si32": ("int32", "i32"), "i64": ("int64", "i64"), "si64": ("int64", "i64"),
}
_INPUT_RE = re.compile(r"^(?P<shape>(?:\d+x)*)(?P<dtype>[a-z]+\d+)=")


@dataclass(frozen=True)
class RunResult:
    bundle: Path
    summary: dict[str, Any]


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def entry_function(manifest: dict[str, Any], requested: str | None) -> str:
    functions = [op["id"] for op in manifest["operators"]
                 if op["parent"] is None and op["op"] in ("func.func", "util.func")]
    if requested:
        if requested not in functions:
            raise InvalidInputError(f"function {requested!r} is not in the manifest (it has {', '.join(functions)})")
        return requested
    if len(functions) != 1:
        raise InvalidInputError(f"the module has several functions ({', '.join(functions)}); choose one with --function")
    return functions[0]


def signature(manifest: dict[str, Any], function: str) -> list[dict[str, Any]]:
    """The argument tensors of ``function`` (shape, dtype), in order."""
    arguments = [t for t in manifest["tensors"] if t["id"].startswith(f"{function}/arg")]
    return sorted(arguments, key=lambda t: int(t["id"].rsplit("arg", 1)[1]))


def check_inputs(inputs: Sequence[str], arguments: list[dict[str, Any]]) -> None:
    """Inputs written as ``SHAPExDTYPE=...`` must match the signature (one line if not)."""
    if len(inputs) != len(arguments):
        raise InvalidInputError(f"the function takes {len(arguments)} input(s), {len(inputs)} given")
    for index, (text, argument) in enumerate(zip(inputs, arguments, strict=True)):
        match = _INPUT_RE.match(text)
        if match is None:
            continue  # @file.npy and other forms are checked by the runtime
        shape = [int(dim) for dim in match["shape"].split("x") if dim]
        wanted = [dim if dim is not None else shape[i] if i < len(shape) else None
                  for i, dim in enumerate(argument["shape"])]
        dtype = DTYPES.get(argument["dtype"], (None, argument["dtype"]))[1]
        if shape != wanted or match["dtype"] != dtype:
            expected = "x".join("?" if d is None else str(d) for d in argument["shape"]) + f"x{dtype}"
            raise InvalidInputError(f"input {index} is {match['shape']}{match['dtype']}, the function takes {expected}")


def random_inputs(arguments: list[dict[str, Any]], workdir: Path, seed: int = 0) -> list[str]:
    """``@file.npy`` inputs with random values for the signature (dynamic dims as 1)."""
    generator = np.random.default_rng(seed)
    inputs = []
    for index, argument in enumerate(arguments):
        if argument["dtype"] not in DTYPES:
            raise InvalidInputError(f"cannot make a random input of dtype {argument['dtype']}; give --input")
        dtype = np.dtype(DTYPES[argument["dtype"]][0])
        shape = [dim or 1 for dim in argument["shape"]]
        if dtype.kind == "f":
            values = generator.standard_normal(shape).astype(dtype)
        else:
            info = np.iinfo(dtype)
            values = generator.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
        path = workdir / f"input{index}.npy"
        np.save(path, values)
        inputs.append(f"@{path}")
    return inputs


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


def inputs_from(directory: Path) -> list[str]:
    """Every ``*.npy`` in ``directory``, in name order, as ``@file`` inputs."""
    if not directory.is_dir():
        raise InvalidInputError(f"{directory}: no such directory")
    files = sorted(directory.glob("*.npy"))
    if not files:
        raise InvalidInputError(f"{directory}: no .npy inputs in it")
    return [f"@{path}" for path in files]


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
