"""Bundles and a store built from them, shared by the store tests (DuckDB and Spark):
real IREE runs of the convnet (full and lite, plus reruns collected as ranks and labels)
and of squeezenet from the onnx wheel (full and ids), its compile manifest, and
reconstructed Edge TPU, Cerebras and SambaNova bundles from ``../shared/fixtures``
(the SambaFlow compile + 8-task run, and the 2021 data-parallel MNIST log).

Regression labels: ``base`` is two real convnet runs; ``slow`` is the same two runs
with one ID's dispatch times tripled and ``same`` the same two runs unchanged
(SYNTHETIC edits of real bundles, under new session IDs), so the expected report is
exact."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest

__all__ = ["compacted_store", "convnet_runs", "sambanova_mnist_bundle", "squeezenet_bundles", "store", "store_bundles"]

from tests.conftest import vendor_fixture

#: The ID whose dispatch times the ``slow`` copies triple.
SLOWED_ID = "main/linalg.conv_2d_nhwc_hwcf#1"


def copy_bundle(source: Path, target: Path, *, scale: dict[str, float] | None = None,
                shift_ns: int = 0) -> Path:
    """A copy of ``source`` under a new session ID; ``scale``: root ID → factor applied to
    its events' durations; ``shift_ns``: added to every start time (another clock)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    shutil.copytree(source, target)
    table = pq.read_table(source / "events.parquet")
    session = uuid.uuid4().hex[:12]
    table = table.set_column(0, "session", pa.array([session] * table.num_rows, pa.string()).dictionary_encode()
                             .cast(table.schema.field("session").type))
    if scale:
        roots = table.column("root_id").to_pylist()
        durations = table.column("duration_ns").to_pylist()
        scaled = [round(d * scale[r]) if d is not None and r in scale else d for d, r in zip(durations, roots, strict=True)]
        table = table.set_column(table.column_names.index("duration_ns"), "duration_ns", pa.array(scaled, pa.int64()))
    if shift_ns:
        table = table.set_column(table.column_names.index("start_ns"), "start_ns",
                                 pc.add(table.column("start_ns"), shift_ns))
    pq.write_table(table, target / "events.parquet")
    return target


def _root_time(bundle: Path, root_id: str) -> float:
    """Total duration of ``root_id``'s events in ``bundle``."""
    import pyarrow.parquet as pq

    table = pq.read_table(bundle / "events.parquet", columns=["root_id", "duration_ns"]).to_pylist()
    return float(sum(row["duration_ns"] or 0 for row in table if row["root_id"] == root_id))


@pytest.fixture(scope="session")
def convnet_runs(tmp_path_factory: pytest.TempPathFactory, iree_bundles: dict[str, Path]) -> dict[str, Path]:
    """Two more real runs of the convnet's full compile (``rerun0``, ``rerun1``), and the
    SYNTHETIC label copies of the regression tests."""
    from dfit_mlir.runtime_hooks.run import run_bundle

    root = tmp_path_factory.mktemp("convnet-runs")
    vmfb = iree_bundles["manifest"].parent / "full.vmfb"
    runs = {f"rerun{k}": run_bundle(vmfb, iree_bundles["manifest"], root / f"rerun{k}", mode="full", repeat=3,
                                    warmup=1).bundle for k in range(2)}
    # The slowed op's time per run in the two baseline runs (real: they differ, more so on
    # a loaded machine); each SYNTHETIC slow copy is scaled to 3x their mean, so the
    # candidate runs agree and the regression stands clear of the baselines' spread
    # however far apart the two real runs are (up to 5x).
    sources = {"full": iree_bundles["full"], "rerun0": runs["rerun0"]}
    slowed = {name: _root_time(path, SLOWED_ID) for name, path in sources.items()}
    mean = sum(slowed.values()) / len(slowed)
    for k, (name, source) in enumerate(sources.items()):
        runs[f"slow{k}"] = copy_bundle(source, root / f"slow{k}", scale={SLOWED_ID: 3.0 * mean / slowed[name]})
        runs[f"same{k}"] = copy_bundle(source, root / f"same{k}")
    return runs


@pytest.fixture(scope="session")
def squeezenet_bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """squeezenet (onnx wheel) compiled in full mode, run in full and ids modes."""
    from dfit_mlir.passes.instrumented_compile import compile_instrumented
    from dfit_mlir.runtime_hooks.run import run_bundle
    from tests import realmodels

    root = tmp_path_factory.mktemp("squeezenet")
    try:
        source = realmodels.onnx_model("squeezenet", root)
    except realmodels.FixtureUnavailable as error:
        pytest.skip(str(error))
    compiled = compile_instrumented(source, root / "squeezenet.vmfb", mode="full")
    bundles = {"manifest": compiled.manifest_path}
    for mode in ("full", "ids"):
        bundles[mode] = run_bundle(compiled.vmfb, compiled.manifest_path, root / f"run-{mode}", mode=mode,
                                   repeat=2).bundle
    return bundles


@pytest.fixture(scope="session")
def sambanova_mnist_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from dfit_mlir.adapters.reconstruct import reconstruct_bundle

    out = tmp_path_factory.mktemp("sambanova-mnist") / "bundle"
    reconstruct_bundle([vendor_fixture("sambanova/ffn_mnist_dataparallel_2021")], out)
    return out


@pytest.fixture(scope="session")
def store_bundles(iree_bundles: dict[str, Path], convnet_runs: dict[str, Path],
                  squeezenet_bundles: dict[str, Path], edgetpu_bundle: Path, cerebras_bundle: Path,
                  sambanova_bundle: Path, sambanova_mnist_bundle: Path) -> dict[str, Any]:
    return {"iree": iree_bundles, "convnet": convnet_runs, "squeezenet": squeezenet_bundles,
            "edgetpu": edgetpu_bundle, "cerebras": cerebras_bundle, "sambanova": sambanova_bundle,
            "sambanova_mnist": sambanova_mnist_bundle}


@pytest.fixture(scope="session")
def store(tmp_path_factory: pytest.TempPathFactory, store_bundles: dict[str, Any]) -> Path:
    """The store every report test reads (built once per test session)."""
    from dfit_mlir.fleet.store import Placement, collect

    path = tmp_path_factory.mktemp("store") / "store"
    iree, convnet, squeezenet = store_bundles["iree"], store_bundles["convnet"], store_bundles["squeezenet"]
    collect([iree["full"], convnet["rerun0"]], path, Placement(label="base"))
    collect([convnet["slow0"], convnet["slow1"]], path, Placement(label="slow"))
    collect([convnet["same0"], convnet["same1"]], path, Placement(label="same"))
    collect([iree["lite"], iree["manifest"]], path, Placement(label="lite"))
    # One data-parallel job of two ranks on two hosts: real reruns of the same module.
    collect([convnet["rerun1"]], path, Placement(label="job", host="node-a", rank=0, model="convnet-dp"))
    collect([iree["ids"]], path, Placement(label="job", host="node-b", rank=1, model="convnet-dp"))
    collect([squeezenet["full"], squeezenet["ids"], squeezenet["manifest"]], path, Placement(label="base"))
    collect([store_bundles[name] for name in ("edgetpu", "cerebras", "sambanova", "sambanova_mnist")], path,
            Placement(label="vendor"))
    return path


@pytest.fixture(scope="session")
def compacted_store(tmp_path_factory: pytest.TempPathFactory, store: Path) -> Path:
    """A copy of ``store`` compacted by ``dfit store compact`` (every bundle of the suite is
    small: its events are merged too)."""
    from dfit_mlir.fleet.store.compact import compact

    path = tmp_path_factory.mktemp("compacted") / "store"
    shutil.copytree(store, path)
    done = compact(path)
    assert done.runs == 17 and done.compacted_runs == 17
    return path
