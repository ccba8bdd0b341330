"""``dfit compile model.onnx``: the ONNX route that keeps node names (the
``iree-import-onnx`` CLI drops them), on the onnx wheel's real SqueezeNet (opset 9, so
upgraded to 17 on the way), compiled from the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.realmodels import onnx_light_path


@pytest.fixture(scope="module")
def squeezenet(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from click.testing import CliRunner

    from dfit_mlir.cli.app import main

    root = tmp_path_factory.mktemp("onnx_cli")
    source = onnx_light_path("squeezenet")
    # n65 is the Softmax node's name (the version converter names the wheel's unnamed nodes).
    result = CliRunner().invoke(main, ["compile", str(source), "--dfit-tag", "--mode", "ids", "--tensors", "N65",
                                       "-o", str(root / "squeezenet.vmfb")])
    return {"result": result, "root": root}


@pytest.mark.slow
def test_cli_compiles_an_onnx_model_with_node_names(squeezenet: dict[str, Any]) -> None:
    result, root = squeezenet["result"], squeezenet["root"]
    assert result.exit_code == 0, result.output
    assert f"wrote {root / 'squeezenet.mlir'}" in result.output
    text = (root / "squeezenet.mlir").read_text()
    assert 'loc("n65")' in text and "onnx.Softmax" in text
    manifest = json.loads((root / "squeezenet.manifest.json").read_text())
    assert manifest["input"]["frontend"] == "onnx"
    onnx_ops = [op for op in manifest["operators"] if op["op"].startswith("onnx.")]
    assert onnx_ops and all(op["module_path"] is not None for op in onnx_ops)
    softmax = next(op for op in onnx_ops if op["op"] == "onnx.Softmax")
    assert (softmax["module_path"], softmax["phase"]) == ("n65", "forward")
    # The weight fills are named after their tensors: ``fire2/squeeze1x1_w_0`` is in ``fire2``.
    assert any(op["module_path"] == "fire2" for op in onnx_ops)
    # --tensors with the node name (any case) traces exactly that node's op.
    assert [trace["id"] for trace in manifest["tensor_traces"]] == [softmax["id"]]
    assert "tensor traces: 1 ops" in result.output


def test_import_model_errors_name_the_file(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from dfit_mlir.cli.app import main
    from dfit_mlir.core.errors import InvalidInputError
    from dfit_mlir.frontends import onnx as onnx_frontend

    with pytest.raises(InvalidInputError, match="missing.onnx: no such file"):
        onnx_frontend.import_model(tmp_path / "missing.onnx")
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\xff\xff\xff not protobuf")
    with pytest.raises(InvalidInputError, match="garbage.onnx: not"):
        onnx_frontend.import_model(garbage)
    # The exported .mlir is an output: a file dfit did not write there is not overwritten.
    foreign = tmp_path / "model.mlir"
    foreign.write_text("// mine\n")
    result = CliRunner().invoke(main, ["compile", str(onnx_light_path("squeezenet")), "--dfit-tag",
                                       "-o", str(tmp_path / "model.vmfb")])
    assert result.exit_code == 2, result.output
    assert foreign.read_text() == "// mine\n" and not (tmp_path / "model.vmfb").exists()
