"""Model code vs framework code (rules as data, on paths seen in real exports), module
trees and their pictures, call-site inheritance, and the Model Explorer module/phase
export. Real-model checks of the same code are in ``test_frontend_*.py``."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from dfit_mlir import frontends
from dfit_mlir.analysis.model import SemanticModel
from dfit_mlir.core import module_paths
from dfit_mlir.core.locations import is_source_line, model_frame
from dfit_mlir.exporters import flamegraph
from dfit_mlir.frontends import CodeRules, annotate
from dfit_mlir.views import model_explorer

SITE = "/work/main/.venv/lib/python3.11/site-packages"


# Paths as they appear in the call stacks of real exports on this machine (BERT and
# ConvNext through iree-turbine, a JAX training step, Flax), plus user files.
@pytest.mark.parametrize(("path", "model_code"), [
    (f"{SITE}/transformers/models/bert/modeling_bert.py", True),
    (f"{SITE}/transformers/models/convnext/modeling_convnext.py", True),
    (f"{SITE}/transformers/utils/generic.py", False),
    (f"{SITE}/transformers/utils/output_capturing.py", False),
    (f"{SITE}/transformers/masking_utils.py", False),
    (f"{SITE}/transformers/modeling_utils.py", False),
    (f"{SITE}/transformers/activations.py", False),
    (f"{SITE}/torch/nn/modules/linear.py", False),
    (f"{SITE}/torch/_dynamo/functional_export.py", False),
    (f"{SITE}/jax/_src/numpy/reductions.py", False),
    (f"{SITE}/flax/linen/normalization.py", False),
    (f"{SITE}/optax/_src/transform.py", False),
    (f"{SITE}/iree/turbine/aot/exporter.py", False),
    (f"{SITE}/torchvision/models/resnet.py", True),
    (f"{SITE}/timm/models/vision_transformer.py", True),
    (f"{SITE}/timm/layers/mlp.py", False),
    (f"{SITE}/keras/src/layers/core/dense.py", False),
    (f"{SITE}/keras/src/applications/mobilenet.py", True),
    (f"{SITE}/mycompany_models/detector.py", True),  # a user's model, installed
    ("/usr/lib/python3.11/functools.py", False),  # the standard library
    ("/home/me/train.py", True),
    # A user folder sharing a framework's name is not that framework.
    ("/home/me/proj/torch/model.py", True),
    ("/home/me/jax/train.py", True),
    ("/home/me/onnx/export.py", True),
    ("/srv/keras/layers.py", True),
    ("/work/main/dfit_mlir/frontends/torch.py", False),
    ("tests/frontend_models.py", True),
    ("cerebras/pytorch/optim/AdamW.py", False),
    ("<frozen runpy>", False),
    # Launchers pip writes: the outermost frames of `dfit compile model.py`.
    ("/home/me/.venv/bin/dfit", False),
    ("/opt/elsewhere/bin/dfit", False),  # a bundle made on another machine
    ("/home/me/proj/bin/train.py", True),  # a user's bin/ folder is no environment
    # What launched the model: `dfit compile model.py` runs it under click (a JAX trace
    # keeps click/decorators.py:34 in every op's stack), pytest, a notebook.
    (f"{SITE}/click/decorators.py", False),
    (f"{SITE}/click/core.py", False),
    (f"{SITE}/_pytest/python.py", False),
    (f"{SITE}/IPython/core/interactiveshell.py", False),
    (f"{SITE}/ipykernel/ipkernel.py", False),
])
def test_code_rules(path: str, model_code: bool) -> None:
    assert CodeRules.default().is_model_code(path) is model_code


def test_framework_rules_see_package_relative_paths_only(monkeypatch: pytest.MonkeyPatch) -> None:
    rules = CodeRules.default()
    assert rules.explain(f"{SITE}/torch/nn/modules/linear.py") == frontends.CodeDecision(
        False, "framework torch/* on torch/nn/modules/linear.py")
    assert rules.explain("/home/me/proj/torch/model.py") == frontends.CodeDecision(
        True, "model code (no rule: a file outside installed packages)")
    assert rules.explain(f"{SITE}/transformers/models/gpt2/modeling_gpt2.py").reason \
        == "model code transformers/models/* on transformers/models/gpt2/modeling_gpt2.py"
    assert rules.explain("/usr/lib/python3.11/functools.py").reason == "framework <stdlib>/* on <stdlib>/functools.py"
    # A framework installed from a source checkout (editable) is found where it is installed.
    monkeypatch.setattr(frontends, "installed_framework_roots", lambda: ("/opt/src/pytorch/torch/",))
    assert not CodeRules.default().is_model_code("/opt/src/pytorch/torch/nn/functional.py")
    assert CodeRules.default().is_model_code("/opt/src/pytorch/examples/torch/model.py")


def test_console_scripts_of_an_environment_are_not_model_code(tmp_path: Path) -> None:
    environment = tmp_path / "venv"
    (environment / "bin").mkdir(parents=True)
    (environment / "pyvenv.cfg").write_text("home = /usr/bin\n")
    assert CodeRules.default().explain(str(environment / "bin" / "pytest")) == frontends.CodeDecision(
        False, "framework (a Python environment's console script)")
    assert CodeRules.default().is_model_code(str(tmp_path / "bin" / "pytest"))  # no pyvenv.cfg


def test_user_rules_come_first() -> None:
    rules = CodeRules.default().extended(framework=["*/mylib/*"], model=["transformers/utils/generic.py"])
    assert not rules.is_model_code("/home/me/mylib/layers.py")
    assert rules.explain("/home/me/mylib/layers.py").reason == "user framework glob */mylib/*"
    # A user's glob names a folder anywhere, as documented (``--framework-code 'mylib/*'``).
    assert not CodeRules.default().extended(framework=["mylib/*"]).is_model_code("/home/me/mylib/layers.py")
    assert rules.is_model_code(f"{SITE}/transformers/utils/generic.py")
    assert frontends.parse_globs("a/*, b/*,") == ("a/*", "b/*")


def test_model_frame_skips_model_files_and_framework() -> None:
    """SYNTHETIC stack in the shapes of real ones: innermost first."""
    frames = [{"file": "model.tflite", "line": 0, "col": 0},
              {"file": f"{SITE}/torch/nn/modules/linear.py", "line": 125, "col": 0},
              {"file": f"{SITE}/transformers/models/bert/modeling_bert.py", "line": 177, "col": 0},
              {"file": "/home/me/export.py", "line": 32, "col": 0}]
    assert not is_source_line(frames[0])
    assert model_frame(frames, CodeRules.default().is_model_code) == frames[2]
    assert model_frame(frames[:2], CodeRules.default().is_model_code) is None


@pytest.mark.parametrize(("path", "chain"), [
    ("", [""]),
    ("encoder.layer.0", ["", "encoder", "encoder.layer", "encoder.layer.0"]),
    ("/model.22/cv3.0/conv", ["", "/model.22", "/model.22/cv3.0", "/model.22/cv3.0/conv"]),
    ("MLP/block1/fc1", ["", "MLP", "MLP/block1", "MLP/block1/fc1"]),
    ("dense1", ["", "dense1"]),
])
def test_ancestry(path: str, chain: list[str]) -> None:
    assert module_paths.ancestry(path) == chain


def _tree() -> dict[str, module_paths.ModuleNode]:
    """SYNTHETIC: three ops in a two-layer model."""
    def values(flops: int, ns: float) -> dict[str, float]:
        return {"ops": 1, "flops": flops, "bytes": 0, "time_ns": ns}

    classes = {"": "Net", "layer.0": "Block", "layer.1": "Block"}
    return module_paths.build_tree([
        ("layer.0.fc", "Linear", "forward", values(100, 10.0), classes),
        ("layer.1.fc", "Linear", "forward", values(100, 30.0), classes),
        ("", None, "forward", values(0, 0.0), classes),
    ])


def test_module_tree_inclusive_and_self() -> None:
    tree = _tree()
    assert list(tree) == ["", "layer", "layer.0", "layer.0.fc", "layer.1", "layer.1.fc"]
    assert tree[""].values == {"ops": 3, "flops": 200, "bytes": 0, "time_ns": 40.0, "executed_flops": None,
                               "executed_macs": None, "executed_transcendentals": None}  # no run counted them
    assert tree[""].self_values["ops"] == 1 and tree["layer"].self_values["ops"] == 0
    assert tree["layer.0"].module_class == "Block" and tree[""].module_class == "Net"
    assert tree["layer"].module_class is None  # a ModuleList holds no op and names no class
    assert flamegraph.weight_of(tree) == "time_ns"
    boxes = {box.path: box for box in flamegraph.layout(tree, "time_ns")}
    assert boxes["layer.0"].width == pytest.approx(0.25) and boxes["layer.1"].x == pytest.approx(0.25)


def test_module_tree_executed_figures() -> None:
    """SYNTHETIC: executed FLOPs sum like the others where a run counted them (a module
    whose ops did not run is 0, an ancestor holding no op of its own 0 too), and are
    ``None`` on every node where no item knows them — never 0 that looks counted."""
    def values(flops: int, executed: int | None) -> dict[str, float | None]:
        return {"ops": 1, "flops": flops, "bytes": 0, "time_ns": 0, "executed_flops": executed,
                "executed_macs": None if executed is None else executed // 2, "executed_transcendentals": executed}

    run = module_paths.build_tree([("rnn.cell", None, "forward", values(100, 600), {}),
                                   ("head", None, "forward", values(10, 0), {})])
    assert [run[p].values["executed_flops"] for p in ("", "rnn", "rnn.cell", "head")] == [600, 600, 600, 0]
    assert run["rnn"].self_values["executed_flops"] == 0 and run[""].values["flops"] == 110
    assert run[""].values["executed_macs"] == 300
    static = module_paths.build_tree([("rnn.cell", None, "forward", values(100, None), {})])
    assert all(node.values[key] is None and node.self_values[key] is None for node in static.values()
               for key in module_paths.EXECUTED_FIGURES)
    svg_tip = flamegraph.work_text(run["rnn.cell"], lambda executed: None if executed is None else executed / 3)
    assert svg_tip == "FLOPs per trip 100; executed FLOPs 600 over the run (200 per invocation)"
    assert flamegraph.work_text(static["rnn.cell"]).endswith("executed FLOPs unknown (no run counted executions)")


def test_pictures(tmp_path: Path) -> None:
    tree = _tree()
    svg = flamegraph.write_svg(tree, tmp_path / "f.svg", "synthetic")
    rects = list(ET.parse(svg).getroot().iter("{http://www.w3.org/2000/svg}rect"))
    assert len(rects) == 1 + len(tree)  # the background and one box per module
    document = flamegraph.speedscope(tree, "synthetic")
    profile = document["profiles"][0]
    assert profile["weights"] == [10.0, 30.0] and profile["endValue"] == 40.0
    names = [f["name"] for f in document["shared"]["frames"]]
    assert [names[i] for i in profile["samples"][0]] == ["(root) (Net)", "layer", "layer.0 (Block)", "layer.0.fc (Linear)"]
    pytest.importorskip("matplotlib")
    png = flamegraph.write_png(tree, tmp_path / "f.png", "synthetic")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _op(op_id: str, kind: str, parent: str | None, names: list[str]) -> dict[str, Any]:
    return {"id": op_id, "op": kind, "parent": parent, "name_path": names, "source": None, "call_stack": []}


def test_private_function_ops_inherit_from_call_sites() -> None:
    """SYNTHETIC, in the shape of a JAX lowering: ``main`` calls ``helper`` from two
    scopes of one phase; ``helper``'s ops carry bare primitive names."""
    ops = [_op("main", "func.func", None, ["jit(step)"]),
           _op("main/func.call#0", "func.call", "main", ["jit(step)/jvp(block1)/jit(helper)"]),
           _op("main/func.call#1", "func.call", "main", ["jit(step)/jvp(block2)/jit(helper)"]),
           _op("main/stablehlo.add#0", "stablehlo.add", "main", ["jit(step)/transpose(jvp(block1))/add"]),
           _op("helper", "func.func", None, ["jit:", "jit"]),
           _op("helper/stablehlo.max#0", "stablehlo.max", "helper", ["max"])]
    frontend = annotate(ops, {"main/func.call#0": "helper", "main/func.call#1": "helper"})
    assert frontend.name == "jax"
    helper_op = ops[-1]
    assert (helper_op["module_path"], helper_op["phase"], helper_op["source_op"]) == ("", "forward", "jax.max")
    assert (ops[3]["module_path"], ops[3]["phase"]) == ("block1", "backward")
    assert frontends.common_module(["MLP/block1", "MLP/block2"]) == "MLP"
    assert frontends.common_module(["a", None]) is None


def test_generic_mlir_keeps_location_names(iree_bundles: dict[str, Path]) -> None:
    """Hand-written MLIR (the convnet): its location names are the module paths."""
    manifest = json.loads(iree_bundles["manifest"].read_text())
    assert manifest["input"]["frontend"] == "mlir"
    conv = next(op for op in manifest["operators"] if op["id"] == "main/linalg.conv_2d_nhwc_hwcf#0")
    assert (conv["module_path"], conv["source_op"], conv["phase"]) == ("conv1", "linalg.conv_2d_nhwc_hwcf", None)


def test_model_explorer_module_and_phase(iree_bundles: dict[str, Path]) -> None:
    model = SemanticModel.open(iree_bundles["full"])
    document = model_explorer.node_data(model, "module")
    assert document["results"]["conv1"]["value"] == "conv1"
    assert len({entry["bgColor"] for entry in document["results"].values()}) > 1
    # The convnet says no phase: the phase file is empty, not wrong.
    assert model_explorer.node_data(model, "phase")["results"] == {}


def test_cli_framework_code_option(iree_bundles: dict[str, Path], tmp_path: Path) -> None:
    """``--framework-code`` puts the user's globs in front of the rules: with the
    convnet's own Python file counted as framework, its ops rank by their .mlir lines."""
    from click.testing import CliRunner

    from dfit_mlir.cli.app import main
    from tests.conftest import read_csv

    result = CliRunner().invoke(main, ["analyze", str(iree_bundles["manifest"]), "--tool", "semantic-attribution",
                                       "--framework-code", "*/convnet.py", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "modules" in result.output and "ops by phase" in result.output
    sites = read_csv(tmp_path / "semantic-attribution" / "sites.csv")
    assert sites and not [row for row in sites if "convnet.py:" in row["site"]]
    assert {row["site"].rsplit(":", 1)[0].rsplit("/", 1)[-1] for row in sites if row["site_kind"] == "source"} \
        == {"convnet.mlir"}


def test_reconstructed_training_step_rolls_up_by_module_and_phase(cerebras_bundle: Path, tmp_path: Path) -> None:
    """A closed backend's module paths and phases (Cerebras BERT-large training step,
    real run logs) give the same module tree and phase table as the open stack."""
    from dfit_mlir.analysis.tools.session import analyze
    from tests.conftest import read_csv

    analyze(cerebras_bundle, ["semantic-attribution"], tmp_path)
    out = tmp_path / "semantic-attribution"
    phases = {row["phase"] for row in read_csv(out / "phases.csv")}
    assert {"forward", "backward", "optimizer"} <= phases
    modules = {row["module_path"]: row for row in read_csv(out / "modules.csv")}
    assert modules["bert.encoder.layer.3"]["parent"] == "bert.encoder.layer"
    assert set(modules["bert.encoder.layer.3.attention.self.query"]["phases"].replace(":", ";").split(";")[::2]) \
        >= {"forward"}
