"""Filters by the names users know (``dfit_mlir/core/filters.py``), on the squeezenet ONNX
import: its softmax is ``torch.operator "onnx.Softmax"`` in the source (ID
``squeezenet_old/onnx.Softmax#0``) and ``linalg.softmax`` after IREE's input phase, so
``*softmax*`` must find it by its ONNX name, ignoring case, and a typo must fail with the
closest names instead of tracing nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from dfit_mlir.cli.app import main
from dfit_mlir.core import filters
from dfit_mlir.core.errors import EXIT_INVALID_INPUT
from dfit_mlir.core.event_pipeline import Policy
from tests import realmodels

SOFTMAX = "squeezenet_old/onnx.Softmax#0"


@pytest.fixture(scope="module")
def traced_squeezenet(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("filters")
    try:
        source = realmodels.onnx_model("squeezenet", root)
    except realmodels.FixtureUnavailable as reason:
        pytest.skip(str(reason))
    vmfb = root / "traced.vmfb"
    result = CliRunner().invoke(main, ["compile", str(source), "--dfit-tag", "--mode", "ids", "--tensors", "*softmax*",
                                       "-o", str(vmfb), *realmodels.IREE_CPU_FLAGS])
    assert result.exit_code == 0, result.output
    return {"source": source, "vmfb": vmfb, "manifest": vmfb.with_suffix(".manifest.json"), "root": root,
            "output": result.output}


@pytest.mark.slow
def test_a_lowercase_glob_traces_the_onnx_softmax(traced_squeezenet: dict[str, Path]) -> None:
    from dfit_mlir.core import manifest

    traces = manifest.load(traced_squeezenet["manifest"])["tensor_traces"]
    # The softmax (lowered to a linalg.generic by then), and the final Reshape, whose
    # ONNX node carries the graph output's name, softmaxout_1.
    assert [(t["id"], t["op"]) for t in traces] == [(SOFTMAX, "linalg.generic"),
                                                    ("squeezenet_old/onnx.Reshape#0", "tensor.expand_shape")]
    assert "tensor traces: 2 ops" in traced_squeezenet["output"]


@pytest.mark.slow
def test_a_misspelt_compile_filter_fails_naming_the_closest_names(traced_squeezenet: dict[str, Path]) -> None:
    result = CliRunner().invoke(main, ["compile", str(traced_squeezenet["source"]), "--dfit-tag", "--mode", "ids",
                                       "--tensors", "*sofmax*", "-o", str(traced_squeezenet["root"] / "typo.vmfb"),
                                       *realmodels.IREE_CPU_FLAGS])
    assert result.exit_code == EXIT_INVALID_INPUT
    message = result.output.strip()
    assert message.startswith("dfit: --tensors '*sofmax*' matches no op of ") and str(traced_squeezenet["source"]) in message
    assert "closest names: Softmax, onnx.Softmax" in message and "\n" not in message
    assert not (traced_squeezenet["root"] / "typo.vmfb").exists()


@pytest.mark.slow
def test_run_tensor_and_id_filters_match_onnx_names(traced_squeezenet: dict[str, Path], tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    bundle = tmp_path / "run"
    result = CliRunner().invoke(main, ["run", str(traced_squeezenet["vmfb"]), "--mode", "ids", "--tensors", "ONNX.SOFTMAX",
                                       "--ids", "onnx.softmax", "-o", str(bundle)])
    assert result.exit_code == 0, result.output
    events = pq.read_table(bundle / "events.parquet").to_pylist()
    assert {(e["kind"], e["root_id"]) for e in events if e["kind"] == "tensor"} == {("tensor", SOFTMAX)}

    typo = CliRunner().invoke(main, ["run", str(traced_squeezenet["vmfb"]), "--mode", "ids", "--ids", "Relux",
                                     "-o", str(tmp_path / "typo")])
    assert typo.exit_code == EXIT_INVALID_INPUT
    assert "--ids 'Relux' matches no op of" in typo.output and "closest names: Relu, onnx.Relu" in typo.output
    assert not (tmp_path / "typo").exists()

    untraced = CliRunner().invoke(main, ["run", str(traced_squeezenet["vmfb"]), "--mode", "ids", "--tensors", "*conv*",
                                         "-o", str(tmp_path / "untraced")])
    assert untraced.exit_code == EXIT_INVALID_INPUT
    assert "--tensors '*conv*' matches no op of the traced ops of this module" in untraced.output


@pytest.mark.slow
def test_id_policy_selects_dispatches_by_module_path_and_op_name(traced_squeezenet: dict[str, Path]) -> None:
    from dfit_mlir.core import manifest
    from dfit_mlir.core.event_pipeline import EventPipeline, MemorySink

    document = manifest.load(traced_squeezenet["manifest"])
    # Conv node n5 (squeezenet's first 1x1 expand conv) by its node name, the pool by op name.
    pipeline = EventPipeline(document, Policy(ids=("N5", "onnx.maxpool")), MemorySink(), session="t")
    selected = [int(i) for i in pipeline._sites.selected.nonzero()[0]]
    # Conv#2 is fused in its own dispatch only (sites 5, 7 and 9 name it through its
    # merged zero fill: shared, not selected); each pool in its own dispatch and the next
    # conv's, which reads it.
    assert selected == [1, 2, 3, 10, 11, 19, 20]


# --- SYNTHETIC: the matching rules ----------------------------------------------------------

OPS = [
    {"id": "main/torch.aten.softmax#0", "op": "torch.aten.softmax", "module_path": "encoder.layer.3.attention.self",
     "module_class": "BertSelfAttention"},
    {"id": "main/tosa.conv2d#0", "op": "tosa.conv2d", "name_path": ["model_1/model/conv2d/Conv2D"]},
    {"id": "main_graph/onnx.Conv#4", "op": "onnx.Conv", "source_op": "onnx.Conv", "name_path": ["/model.22/cv3.0/conv/Conv"]},
]


@pytest.mark.parametrize(("glob", "expected"), [
    ("*softmax*", ["main/torch.aten.softmax#0"]),
    ("TOSA.CONV2D", ["main/tosa.conv2d#0"]),
    ("conv*", ["main/tosa.conv2d#0", "main_graph/onnx.Conv#4"]),
    ("encoder.layer.3.*", ["main/torch.aten.softmax#0"]),
    ("bertselfattention", ["main/torch.aten.softmax#0"]),
    ("/model.22/*", ["main_graph/onnx.Conv#4"]),
    ("main_graph/*", ["main_graph/onnx.Conv#4"]),
])
def test_globs_match_every_name_ignoring_case(glob: str, expected: list[str]) -> None:
    assert filters.NameFilter((glob,), "--ids").select(filters.names_by_id(OPS), "model") == expected


def test_each_glob_must_match_and_the_error_lists_every_miss() -> None:
    with pytest.raises(filters.FilterMatchesNothing) as error:
        filters.NameFilter.parse("*softmax*,tosa.conv3d,zzzz", "--tensors").select(filters.names_by_id(OPS), "m.mlir")
    lines = str(error.value).splitlines()
    assert len(lines) == 2 and "'tosa.conv3d' matches no op of m.mlir; closest names: tosa.conv2d" in lines[0]
    assert "'zzzz' matches no op of m.mlir; no name is close" in lines[1]
    assert error.value.exit_code == EXIT_INVALID_INPUT


def test_an_empty_filter_is_refused() -> None:
    with pytest.raises(filters.FilterMatchesNothing, match="needs at least one glob"):
        filters.NameFilter.parse(" , ", "--tensors")
