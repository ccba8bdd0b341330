"""Instrumented compiles of real models (ONNX from the onnx wheel, TFLite from
../shared/fixtures/edgetpu): every dispatch attributed, IDs on (nearly) every op up to
executable-sources, and source names carried into the manifest's operator table.

Each model is compiled once per module with ``compile_instrumented(mode="full")``; see
``tests/realmodels.py`` for the models, why they were chosen and how they are built.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

import dfit_mlir
from dfit_mlir.core import lineage, manifest, toolchain
from dfit_mlir.core.vmfb import read_module
from dfit_mlir.passes.compile_report import attribution_summary
from dfit_mlir.passes.instrumented_compile import SOURCE_STAGE, compile_instrumented
from dfit_mlir.passes.plain_compile import plain_compile
from dfit_mlir.runtime_hooks import hal_profile, inputs
from dfit_mlir.runtime_hooks.inprocess import Runner
from dfit_mlir.runtime_hooks.run import run_bundle
from tests import realmodels

pytestmark = pytest.mark.slow

#: The issue's bar: share of non-constant ops carrying a source ID at every stage up to
#: and including executable-sources. "Carrying" is the manifest's ``attributed`` figure:
#: the op's own location names a source ID, or the op sits in the region of an op whose
#: location does. The second half covers the hidden bodies of named linalg ops
#: (``linalg.conv_2d_nchw_fchw``'s mulf/addf/yield), which IREE's input conversion builds
#: with ``loc(unknown)`` and no printer shows; the strict own-location figure
#: (``coverage``, 72-91% on these models) is reported beside it.
COVERAGE_BAR = 0.999
COVERAGE_STAGES = (SOURCE_STAGE, *toolchain.IREE_PHASES[: toolchain.IREE_PHASES.index("executable-sources") + 1])

MODELS = [pytest.param(("onnx", name), id=f"onnx-{name}") for name in realmodels.ONNX_MODELS] + [
    pytest.param(("tflite", path), id=f"tflite-{label}") for label, path in realmodels.TFLITE_MODELS.items()
]


@dataclass(frozen=True)
class Compiled:
    kind: str
    name: str
    model: Path  # the .onnx or .tflite
    source: Path  # the MLIR given to dfit
    vmfb: Path
    manifest: dict[str, Any]


@pytest.fixture(scope="session")
def real_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("real-models")


@pytest.fixture(scope="module", params=MODELS)
def compiled(request: pytest.FixtureRequest, real_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Compiled:
    kind, name = request.param
    if kind == "tflite":
        model = realmodels.skip_unavailable(name)
        source = realmodels.tflite_model(model, real_model_dir)
    else:
        model = realmodels.onnx_light_path(name)
        source = realmodels.onnx_model(name, real_model_dir)
    out = tmp_path_factory.mktemp(f"{kind}-{source.stem}") / f"{source.stem}.vmfb"
    result = compile_instrumented(source, out, mode="full")
    return Compiled(kind, name, model, source, result.vmfb, result.manifest)


def test_vmfb_written(compiled: Compiled) -> None:
    assert compiled.vmfb.is_file()
    size = compiled.vmfb.stat().st_size
    assert size > 0
    assert compiled.manifest["compile"]["vmfb_bytes"] == size


def test_every_dispatch_attributed(compiled: Compiled) -> None:
    partitions = compiled.manifest["partitions"]
    sites, exports = partitions["dispatch_sites"], partitions["exports"]
    assert sites and exports, "a real model compiles to at least one dispatch"
    bare_sites = [site["index"] for site in sites if not (site["ids"] or site["fused_ids"])]
    bare_exports = [export["name"] for export in exports if not (export["ids"] or export["fused_ids"])]
    assert not bare_sites, f"dispatch call sites without a source ID: {bare_sites}"
    assert not bare_exports, f"exports without a source ID: {bare_exports}"
    assert partitions["unattributed_sites"] == []
    assert partitions["unattributed_exports"] == []
    known = {op["id"] for op in compiled.manifest["operators"]}
    for site in sites:
        assert set(site["ids"]) | set(site["fused_ids"]) <= known, f"site #{site['index']} names unknown IDs"


def _coverage_table(manifest: dict[str, Any]) -> list[str]:
    rows = []
    for stage in manifest["stages"]:
        untagged = {kind: n for kind, n in stage["materialised_by_kind"].items() if not lineage.is_constant(kind)}
        attributed = stage.get("attributed")
        rows.append(
            f"{stage['name']:<26} coverage {100 * stage['coverage']:7.3f}% "
            f"({stage['non_constant_tagged']}/{stage['non_constant_ops']} non-constant ops)"
            + (f", attributed incl. nested {100 * attributed:7.3f}%" if attributed is not None else "")
            + f"; untagged non-constant by kind: {untagged}"
        )
    return rows


def test_coverage_through_executable_sources(compiled: Compiled) -> None:
    """>= 99.9% of non-constant ops carry an ID at every phase up to executable-sources
    (see COVERAGE_BAR); the failure message lists each stage's figures and untagged kinds."""
    manifest = compiled.manifest
    by_name = {stage["name"]: stage for stage in manifest["stages"]}
    assert set(COVERAGE_STAGES) <= set(by_name), "a full-mode manifest snapshots every phase"
    print(f"\n{compiled.kind} {compiled.name}:\n" + attribution_summary(manifest))
    low = [name for name in COVERAGE_STAGES if by_name[name]["attributed"] < COVERAGE_BAR]
    assert not low, (
        f"{compiled.kind} {compiled.name}: coverage below {100 * COVERAGE_BAR}% at {low}\n"
        + "\n".join(_coverage_table(manifest))
    )


def test_operators_carry_source_names(compiled: Compiled) -> None:
    operators = compiled.manifest["operators"]
    by_id = {op["id"]: op for op in operators}
    if compiled.kind == "tflite":
        # Every name is a TFLite tensor name: it occurs verbatim in the flatbuffer.
        blob = compiled.model.read_bytes()
        compute = [op for op in operators if op["op"].startswith("tosa.") and not lineage.is_constant(op["op"])]
        assert compute
        unnamed = [op["id"] for op in compute if not op["name_path"]]
        assert not unnamed, f"TOSA ops without a TFLite tensor name: {unnamed}"
        for op in operators:
            if op["op"] == "func.func":
                continue
            for name in op["name_path"]:
                assert name.encode() in blob, f"{op['id']}: {name!r} is not a tensor name of {compiled.model.name}"
            if op["name_path"]:
                assert op["source"] and op["source"]["file"].endswith(compiled.model.name)
    else:
        # Node names as the importer's locations: every name is an ONNX node/initializer/
        # input name, and every compute node of the graph shows up.
        names = realmodels.onnx_source_names(compiled.name)
        # ``torch.operator "onnx.Conv"`` shows as ``onnx.Conv`` in the table.
        imported = [op for op in operators if op["op"].startswith("onnx.") or op["op"] == "torch.operator"]
        assert imported
        unnamed = [op["id"] for op in imported if not op["name_path"]]
        assert not unnamed, f"ONNX ops without a node name: {unnamed}"
        seen = set()
        for op in imported:
            for name in op["name_path"]:
                assert name in names, f"{op['id']}: {name!r} is not a name in the ONNX graph"
                seen.add(name)
        graph = realmodels.prepare_onnx(compiled.model).graph
        compute_nodes = {node.name for node in graph.node if node.op_type not in ("Constant", "ConstantOfShape")}
        assert compute_nodes <= seen, f"ONNX nodes missing from the operator table: {sorted(compute_nodes - seen)[:10]}"
    # The runtime join ends at a name: every dispatch site's root op has one.
    for site in compiled.manifest["partitions"]["dispatch_sites"]:
        root = by_id.get(site["root_id"]) if site["root_id"] else None
        named = root is not None and root["name_path"]
        if not named:
            named = any(by_id[i]["name_path"] for i in site["fused_ids"] if i in by_id)
        assert named, f"dispatch site #{site['index']} ({site['export']}) leads to no source name"


def _inputs(manifest: dict[str, Any]) -> list[str]:
    """One splat input per argument of the module's function (dynamic dims as 1)."""
    return inputs.splat_inputs(inputs.signature(manifest, inputs.entry_function(manifest, None)))


@pytest.mark.parametrize("driver", hal_profile.DRIVERS)
def test_runtime_dispatches_join_to_ids(compiled: Compiled, driver: str) -> None:
    """Every dispatch the runtime records lands on its manifest call site, in order."""
    sites = compiled.manifest["partitions"]["dispatch_sites"]
    events = hal_profile.capture(compiled.vmfb, _inputs(compiled.manifest), driver=driver)
    joined = hal_profile.join(events, compiled.manifest)
    assert len(joined) == len(sites)
    assert [j.site_index for j in joined] == [site["index"] for site in sites]
    assert all(j.root_id for j in joined)


def test_run_bundle_on_real_model(compiled: Compiled, tmp_path: Path) -> None:
    """`dfit run --mode full` (random inputs from the signature, 1 warm-up and 2 recorded
    invocations): every dispatch event in events.parquet carries its call site's root
    ID; the queue and memory records of the same run sit beside them."""
    result = run_bundle(compiled.vmfb, manifest.default_path(compiled.vmfb), tmp_path / "bundle", repeat=2, warmup=1)
    sites = compiled.manifest["partitions"]["dispatch_sites"]
    events = pq.read_table(tmp_path / "bundle" / "events.parquet").to_pylist()
    dispatches = [e for e in events if e["kind"] == "dispatch"]
    assert len(dispatches) == 2 * len(sites) == result.summary["records"]["dispatch"]
    assert [e["root_id"] for e in dispatches] == [s["root_id"] for s in sites] * 2
    assert len(events) == result.summary["counts"]["kept"]
    assert {e["kind"] for e in events} == {"dispatch", "queue", "memory"}


def test_lite_run_on_real_model(compiled: Compiled, tmp_path: Path) -> None:
    """`lite` in process on a module with function probes: one function span per call,
    inside its program span, and the same outputs as the module run without dfit's hook
    module (the probes fall back) and as the full-mode module (no probes)."""
    lite = compile_instrumented(compiled.source, tmp_path / "lite.vmfb", mode="ids", probes=True)
    function = inputs.entry_function(compiled.manifest, None)
    probed = {site["function"] for site in lite.manifest["probes"]}
    # ONNX imports arrive ABI-wrapped: the exported function and its `$async` body.
    assert function in probed and probed <= {function, f"{function}$async"}
    arguments = [inputs.load_input(text) for text in _inputs(compiled.manifest)]
    with dfit_mlir.instrument(lite.vmfb, mode="lite", driver="local-sync") as module:
        outputs = [module.call(function, *arguments) for _ in range(2)]
        events = module.events().to_pylist()
        first = [np.asarray(value) for value in (outputs[0] if isinstance(outputs[0], tuple) else (outputs[0],))]
    programs = [e for e in events if e["kind"] == "program"]
    functions = [e for e in events if e["kind"] == "function"]
    assert len(functions) == 2 * len(probed)
    outer = [e for e in functions if e["attributes"] is None]  # depth 0: called from the host
    assert [(e["partition"], e["invocation"]) for e in outer] == [(function, 0), (function, 1)]
    for span in functions:
        program = programs[span["invocation"]]
        assert program["start_ns"] <= span["start_ns"]
        assert span["start_ns"] + span["duration_ns"] <= program["start_ns"] + program["duration_ns"]
    for vmfb in (lite.vmfb, compiled.vmfb):
        with Runner(vmfb, "local-sync") as runner:
            bare = runner.function(function)(*arguments)
            expected = [np.asarray(value) for value in (bare if isinstance(bare, tuple) else (bare,))]
        assert all(np.array_equal(a, b) for a, b in zip(first, expected, strict=True))


def test_tensor_statistics_on_a_real_tflite_model(tmp_path: Path) -> None:
    """Every traced op of the int8 franco_fc MLP (dynamic batch: the trace carries the
    batch size) yields one statistics event per call, with the value count of its
    shape and integer stats within the int8/int32 ranges of the ops."""
    source = realmodels.tflite_model(realmodels.skip_unavailable(realmodels.TFLITE_MODELS["franco_fc"]), tmp_path)
    result = compile_instrumented(source, tmp_path / "traced.vmfb", mode="ids", trace_tensors=("*",))
    traced = {t["id"]: t for t in result.manifest["tensor_traces"]}
    assert traced and not result.manifest["tensor_traces_skipped"]
    assert any("?" in t["type"] for t in traced.values()), "franco_fc has a dynamic batch"
    function = inputs.entry_function(result.manifest, None)
    arguments = [inputs.load_input(text) for text in _inputs(result.manifest)]
    with dfit_mlir.instrument(result.vmfb, mode="ids", tensors=["*"]) as module:
        module.call(function, *arguments)
        module.call(function, *arguments)
        events = [e for e in module.events().to_pylist() if e["kind"] == "tensor"]
    assert sorted({e["root_id"] for e in events}) == sorted(traced)
    assert len(events) == 2 * len(traced)
    for event in events:
        shape = json.loads(event["attributes"])["shape"]
        element = traced[event["root_id"]]["type"].rsplit("x", 1)[-1].rstrip(">")
        assert event["bytes"] == int(np.prod(shape)) * {"i8": 1, "i32": 4, "f32": 4}[element]
        assert event["tensor_nans"] == event["tensor_infs"] == 0
        low, high = {"i8": (-128, 127), "i32": (-2**31, 2**31 - 1), "f32": (-np.inf, np.inf)}[element]
        assert low <= event["tensor_min"] <= event["tensor_mean"] <= event["tensor_max"] <= high


def test_executables_match_a_plain_compile(compiled: Compiled, tmp_path: Path) -> None:
    """The instrumented compile is observational on real models too: same dispatch names,
    VM functions and constants, and executables whose code, read-only data and debug
    info are byte-identical.

    What may differ, measured: for ONNX imports, whose op locations are bare node names
    with no file:line, IREE fills one 4-byte field per export of the executable library's
    export table (``.data.rel.ro``) from the location, so the dfit NameLoc changes it
    (29 fields in squeezenet). TFLite locations carry file:line and match byte for byte.
    (Function probes would change this: they are a ``lite`` compile's, not ``full``'s.)
    """
    plain = tmp_path / "plain.vmfb"
    plain_compile(compiled.source, plain, [])
    expected, got = read_module(plain), read_module(compiled.vmfb)
    assert compiled.manifest["probes"] == []
    assert got.embedded_strings == expected.embedded_strings
    assert got.function_bytecode == expected.function_bytecode
    assert got.executable_sizes == expected.executable_sizes
    segments = zip(got.executable_sections, expected.executable_sections, got.executables, expected.executables,
                   strict=True)
    for ours, theirs, our_sha, their_sha in segments:
        if not theirs:  # constants: byte-identical
            assert our_sha == their_sha
            continue
        differing = {name for name in theirs if ours.get(name) != theirs[name]}
        assert differing <= {".data.rel.ro"}, differing
    if compiled.kind == "tflite":
        assert got.executables == expected.executables
