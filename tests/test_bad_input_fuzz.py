"""Property tests of the loaders where input enters dfit: whatever the bytes, the
manifest and bundle loaders and the .tflite reader either read the input or raise one
:class:`InvalidInputError` (a clear, one-line user error) — never another exception."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dfit_mlir.core import manifest as manifest_io
from dfit_mlir.core.errors import InvalidInputError
from tests.conftest import CONVNET, vendor_fixture

FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from dfit_mlir.passes.instrumented_compile import compile_instrumented
    from dfit_mlir.runtime_hooks.run import run_bundle

    root = tmp_path_factory.mktemp("fuzz")
    compiled = compile_instrumented(CONVNET, root / "m.vmfb", mode="ids")
    bundle = run_bundle(compiled.vmfb, compiled.manifest_path, root / "run", mode="ids", repeat=2).bundle
    return {"manifest": compiled.manifest_path, "bundle": bundle,
            "tflite": vendor_fixture("edgetpu/franco_fc_v15/model_edgetpu.tflite")}


def mutate(data: bytes, edits: list[tuple[float, int]], cut: float | None) -> bytes:
    """``data`` with bytes replaced at relative positions, then cut at a relative length."""
    out = bytearray(data)
    for where, value in edits:
        if out:
            out[min(int(where * len(out)), len(out) - 1)] = value
    return bytes(out if cut is None else out[: int(cut * len(out))])


EDITS = st.lists(st.tuples(st.floats(0, 1), st.integers(0, 255)), max_size=6)
CUTS = st.none() | st.floats(0, 1)
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                                 max_size=4), max_leaves=30)


def _load_manifest(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "m.manifest.json"
        path.write_bytes(data)
        try:
            document = manifest_io.load(path)
        except InvalidInputError as error:
            assert str(error).startswith(str(path)) and "\n" not in str(error)
        else:
            assert document["schema"] == manifest_io.SCHEMA_NAME


@FUZZ
@given(data=st.binary(max_size=2000))
def test_manifest_loader_on_any_bytes(data: bytes) -> None:
    _load_manifest(data)


@FUZZ
@given(document=JSON)
def test_manifest_loader_on_any_json(document: object) -> None:
    _load_manifest(json.dumps(document).encode())


@FUZZ
@given(edits=EDITS, cut=CUTS)
def test_manifest_loader_on_a_damaged_real_manifest(real: dict[str, Path], edits: list[tuple[float, int]],
                                                    cut: float | None) -> None:
    _load_manifest(mutate(real["manifest"].read_bytes(), edits, cut))


@FUZZ
@given(name=st.sampled_from(["summary.json", "events.parquet", "sites.parquet", "manifest.json"]), edits=EDITS,
       cut=CUTS)
def test_bundle_loader_on_a_damaged_real_bundle(real: dict[str, Path], name: str, edits: list[tuple[float, int]],
                                                cut: float | None) -> None:
    from dfit_mlir.analysis.model import SemanticModel

    with tempfile.TemporaryDirectory() as folder:
        bundle = Path(folder) / "run"
        shutil.copytree(real["bundle"], bundle)
        target = bundle / name
        target.write_bytes(mutate(target.read_bytes(), edits, cut))
        try:
            model = SemanticModel.open(bundle)
            events = model.events()  # every batch read and conformed
        except InvalidInputError as error:
            assert "\n" not in str(error) and str(bundle) in str(error)
        else:
            assert events.num_rows == model.summary["counts"]["kept"]


@FUZZ
@given(edits=EDITS, cut=CUTS)
def test_tflite_reader_on_a_damaged_real_model(real: dict[str, Path], edits: list[tuple[float, int]],
                                               cut: float | None) -> None:
    from dfit_mlir.adapters.edgetpu.tflite_model import TFLiteModelReader, to_recovery

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model_edgetpu.tflite"
        path.write_bytes(mutate(real["tflite"].read_bytes(), edits, cut))
        try:
            model = TFLiteModelReader(path).model()
            recovery = to_recovery(model)
        except InvalidInputError as error:
            assert str(error).startswith(str(path))
        else:
            ids = [op.id for op in recovery.operators]
            assert len(ids) == len(set(ids))
