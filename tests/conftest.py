"""Shared helpers for the tests: tagging text with the MLIR engine, paths."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from iree.compiler import ir

from dfit_mlir.passes import mlir_engine

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "models"
CONVNET = EXAMPLES / "convnet.mlir"


def tag_text(text: str) -> dict[str, str]:
    """{id: structural hash} of every op of ``text``, tagged by the MLIR engine in a
    fresh context that is gone when this returns."""
    context = ir.Context()
    context.allow_unregistered_dialects = True
    with context:
        module = ir.Module.parse(text)
        tagged = {item.id: item.hash for item in mlir_engine.tag_module(module.operation)}
    del module
    return tagged


@pytest.fixture(scope="session")
def convnet_text() -> str:
    return CONVNET.read_text()


#: Real vendor artifacts (``../shared/fixtures/<backend>/...``, listed in its SOURCES.md).
#: ``DFIT_VENDOR_FIXTURES`` points elsewhere (a worktree beside the checkout that holds ``shared``).
VENDOR_FIXTURES = Path(os.environ.get("DFIT_VENDOR_FIXTURES") or REPO.parent / "shared" / "fixtures")


def vendor_fixture(relative: str) -> Path:
    """``../shared/fixtures/<relative>``; skips the test, saying why, when ``../shared``
    (present in CI, absent in a user's own checkout) or the file is not there."""
    if not VENDOR_FIXTURES.is_dir():
        pytest.skip(f"{VENDOR_FIXTURES} is absent (the repository's ../shared holds the real vendor artifacts)")
    path = VENDOR_FIXTURES / relative
    if not path.exists():
        pytest.skip(f"vendor fixture {path} is missing")
    return path


# --- bundles for tool tests: one per backend, built once per test session -------------

@pytest.fixture(scope="session")
def iree_bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The convnet compiled (``full`` and ``lite``) and run: ``{"full": bundle,
    "lite": bundle, "ids": bundle, "none": bundle, "manifest": full manifest path}``."""
    from dfit_mlir.passes.instrumented_compile import compile_instrumented
    from dfit_mlir.runtime_hooks.run import run_bundle

    root = tmp_path_factory.mktemp("iree-bundles")
    full = compile_instrumented(CONVNET, root / "full.vmfb", mode="full")
    lite = compile_instrumented(CONVNET, root / "lite.vmfb", mode="lite")
    bundles: dict[str, Path] = {"manifest": full.manifest_path}
    for mode, compiled in (("full", full), ("ids", full), ("none", full), ("lite", lite)):
        bundles[mode] = run_bundle(compiled.vmfb, compiled.manifest_path, root / f"run-{mode}", mode=mode,
                                   repeat=3, warmup=1).bundle
    return bundles


def _reconstructed(tmp_path_factory: pytest.TempPathFactory, name: str, *relative: str) -> Path:
    from dfit_mlir.adapters.reconstruct import reconstruct_bundle

    out = tmp_path_factory.mktemp(f"{name}-bundle") / "bundle"
    reconstruct_bundle([vendor_fixture(r) for r in relative], out)
    return out


@pytest.fixture(scope="session")
def edgetpu_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """yolov8n: original + compiled model + operation log (1 custom op, 23 CPU ops)."""
    return _reconstructed(tmp_path_factory, "edgetpu", "edgetpu/goalbuddy_yolov8_v16")


@pytest.fixture(scope="session")
def sambanova_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """BertLarge SambaFlow 1.17.7 compile log + its 8-task run log."""
    return _reconstructed(tmp_path_factory, "sambanova", "sambanova/bertlarge_compile_sf1.17.7_sn30",
                          "sambanova/bertlarge_run_dp8_sf1.17.7_sn30")


@pytest.fixture(scope="session")
def cerebras_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The CS-2 BERT-large run log plus the synthetic CIRH samples of tests/inputs/cerebras."""
    from dfit_mlir.adapters.reconstruct import reconstruct_bundle

    out = tmp_path_factory.mktemp("cerebras-bundle") / "bundle"
    reconstruct_bundle([vendor_fixture("cerebras/alcf_bert_large_bs512_r2x"), REPO / "tests" / "inputs" / "cerebras"],
                       out, "cerebras")
    return out


@pytest.fixture(autouse=True, scope="session")
def _private_calibration_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Tools that calibrate the local CPU cache the result; tests keep it out of ~/.cache."""
    import os

    os.environ.setdefault("DFIT_CACHE_DIR", str(tmp_path_factory.mktemp("dfit-cache")))


def read_pftrace(path: Path) -> tuple[dict[int, str], list[tuple[Any, str, dict[str, Any]]]]:
    """A trace.pftrace parsed with Perfetto's own protos: ``(track names by uuid,
    [(packet, event name, args)])`` for every track event, interned strings resolved
    the way the trace processor does (incremental state of the packet sequence)."""
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace

    trace = Trace.FromString(path.read_bytes())
    tracks = {p.track_descriptor.uuid: p.track_descriptor.name for p in trace.packet if p.HasField("track_descriptor")}
    names: dict[int, str] = {}
    arg_names: dict[int, str] = {}
    values: dict[int, str] = {}
    events = []
    for packet in trace.packet:
        if packet.HasField("interned_data"):
            names.update((e.iid, e.name) for e in packet.interned_data.event_names)
            arg_names.update((e.iid, e.name) for e in packet.interned_data.debug_annotation_names)
            values.update((e.iid, e.str.decode()) for e in packet.interned_data.debug_annotation_string_values)
        if not packet.HasField("track_event"):
            continue
        event = packet.track_event
        args = {}
        for annotation in event.debug_annotations:
            key = arg_names[annotation.name_iid] if annotation.name_iid else annotation.name
            kind = annotation.WhichOneof("value")
            args[key] = values[annotation.string_value_iid] if kind == "string_value_iid" else getattr(annotation, kind)
        events.append((packet, names.get(event.name_iid, event.name), args))
    return tracks, events


def bundle_path(request: pytest.FixtureRequest, name: str) -> Path:
    """``iree-full`` → the ``iree_bundles`` fixture's full run; ``edgetpu`` → ``edgetpu_bundle``."""
    backend, _, mode = name.partition("-")
    if backend == "iree":
        return request.getfixturevalue("iree_bundles")[mode]
    return request.getfixturevalue(f"{backend}_bundle")


def read_csv(path: Path) -> list[dict[str, str]]:
    import csv

    with path.open() as handle:
        return list(csv.DictReader(handle))


def write_calibration(path: Path, peak_macs_per_s: float, bandwidth_bytes_per_s: float, method: str) -> Path:
    """A calibration file written by hand (``method`` names it in every field that says
    how a figure was measured): f32 peak and bandwidth only, no caches, no int8 peak."""
    import json

    from dfit_mlir.analysis import calibration

    path.write_text(json.dumps({
        "schema": calibration.SCHEMA, "version": calibration.VERSION, "host": method, "threads": 1,
        "peak_macs_per_s": peak_macs_per_s, "memory_bandwidth_bytes_per_s": bandwidth_bytes_per_s,
        "cache_roofs": [], "last_level_cache_bytes": None, "compute_method": method, "bandwidth_method": method,
        "cache_method": method, "measured_at": "2026-01-01T00:00:00+00:00"}))
    return path


def by_family(table: Any) -> dict[str, Any]:
    """A full run's events (an Arrow table) split by family, each family's events in
    the order written: ``dispatch``, ``memory``, and the queue events by their names'
    prefix (``submit``, ``host``, ``device``). The routes that read a profile write each
    family's events in the same order, interleaved differently (``run.WindowedRun``
    writes them window by window, the whole-run route family by family)."""
    import numpy as np
    import pyarrow as pa

    kinds = table.column("kind").cast(pa.string()).to_pylist()
    partitions = table.column("partition").cast(pa.string()).to_pylist()
    families = np.array([kind if kind != "queue" else (partition or "").split(" ")[0]
                         for kind, partition in zip(kinds, partitions, strict=True)])
    # Dictionary columns as their values: a family's rows taken from batches of their own
    # keep each batch's dictionary, which two routes cut differently.
    plain = pa.table({name: column.cast(column.type.value_type) if pa.types.is_dictionary(column.type) else column
                      for name, column in zip(table.column_names, table.columns, strict=True)})
    return {str(family): plain.take(pa.array(np.flatnonzero(families == family)))
            for family in sorted(set(families))}


def same_by_family(table: Any, other: Any) -> bool:
    """Whether two runs' events are the same, family by family (:func:`by_family`)."""
    mine, theirs = by_family(table), by_family(other)
    return mine.keys() == theirs.keys() and all(mine[family].equals(theirs[family]) for family in mine)


def chrome_trace_slices(path: Path) -> list[str]:
    """The slices of a Chrome trace JSON, each with its process and thread named (not
    numbered: the numbers follow the order the tracks were first used), sorted: what a
    trace shows, whatever order its events were written in."""
    import json

    events = json.loads(path.read_text())["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e.get("ph") == "M" and e["name"] == "thread_name"}
    named = []
    for event in events:
        if event.get("ph") == "M":
            continue
        event = dict(event)
        pid, tid = event.pop("pid", None), event.pop("tid", None)
        named.append(json.dumps({**event, "process": processes.get(pid), "thread": threads.get((pid, tid))},
                                sort_keys=True))
    return sorted(named)
