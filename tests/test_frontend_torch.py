"""PyTorch through iree-turbine: a transformers BERT (3 layers, hidden 64) and a ConvNext
CNN, built from configs with random weights, compiled with
``dfit_mlir.frontends.torch.compile``; BERT also run, so that its module tree carries
measured time.

Checked on the real exports: every non-constant op has its nn.Module path, class and
phase; BERT's ranking puts ``modeling_bert.py`` lines on top; the module tree has
``encoder.layer.0 … encoder.layer.2`` split into attention and MLP; the module names in
the locations change neither IDs nor generated code.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from dfit_mlir.analysis.tools.session import analyze
from dfit_mlir.core.lineage import is_constant
from dfit_mlir.frontends import CodeRules
from tests import frontend_models
from tests.conftest import REPO, read_csv, tag_text

pytestmark = [
    pytest.mark.frontends,
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:While compiling, we found certain side effects:UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]
STRUCTURAL = {"func.func", "func.return"}


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from dfit_mlir.frontends import torch as torch_frontend
    from dfit_mlir.runtime_hooks.run import run_bundle

    root = tmp_path_factory.mktemp("bert")
    model, args = frontend_models.bert()
    compiled = torch_frontend.compile(model, args, output=root / "bert.vmfb", mode="ids")
    # Token ids within the vocabulary (random int64 inputs would index out of it).
    ids = f"1x{frontend_models.BERT_SEQ}xi64=" + ",".join(str(int(v)) for v in args[0].flatten())
    bundle = run_bundle(compiled.vmfb, compiled.manifest_path, root / "run", mode="full", inputs=(ids,),
                        repeat=2, warmup=1).bundle
    _, _, _ = analyze(bundle, ["semantic-attribution"], root / "analysis")
    return {"compiled": compiled, "bundle": bundle, "out": root / "analysis" / "semantic-attribution",
            "model": model, "args": args, "root": root}


@pytest.fixture(scope="module")
def convnext(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from dfit_mlir.frontends import torch as torch_frontend

    root = tmp_path_factory.mktemp("convnext")
    model, args = frontend_models.convnext()
    compiled = torch_frontend.compile(model, args, output=root / "convnext.vmfb", mode="ids")
    analyze(compiled.manifest_path, ["semantic-attribution"], root / "analysis")
    return {"compiled": compiled, "out": root / "analysis" / "semantic-attribution"}


def non_constant(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    return [op for op in manifest["operators"] if not is_constant(op["op"]) and op["op"] not in STRUCTURAL]


def test_bert_every_op_has_module_class_and_phase(bert: dict[str, Any]) -> None:
    manifest = bert["compiled"].manifest
    assert manifest["input"]["frontend"] == "torch"
    ops = non_constant(manifest)
    assert len(ops) > 150
    missing_phase = Counter(op["op"] for op in ops if op["phase"] is None)
    missing_module = Counter(op["op"] for op in ops if op["module_path"] is None)
    assert sum(missing_phase.values()) <= 0.001 * len(ops), missing_phase
    assert sum(missing_module.values()) <= 0.001 * len(ops), missing_module
    assert {op["phase"] for op in ops} == {"forward"}
    # Parameters are initial values; the root module is the model class.
    globals_ = [op for op in manifest["operators"] if op["op"] == "util.global"]
    assert globals_ and {op["phase"] for op in globals_} == {"initializer"}
    classes = {(op["module_path"], op["module_class"]) for op in ops}
    assert ("", "BertModel") in classes
    for layer in range(frontend_models.BERT_LAYERS):
        assert (f"encoder.layer.{layer}.attention.self", "BertSelfAttention") in classes
        assert (f"encoder.layer.{layer}.attention.self.query", "Linear") in classes
        assert (f"encoder.layer.{layer}.intermediate.dense", "Linear") in classes
    linears = [op for op in ops if op["source_op"] == "torch.aten.linear"]
    # 4 attention + 2 MLP linears per layer, and the pooler's.
    assert len(linears) == 6 * frontend_models.BERT_LAYERS + 1
    assert all(op["module_class"] == "Linear" for op in linears)


PARAMETER_OPS = {"torch.vtensor.literal", "util.global.load", "torch_c.from_builtin_tensor", "util.global"}


def test_bert_weights_belong_to_the_module_that_uses_them(bert: dict[str, Any]) -> None:
    """iree-turbine hoists every weight to the location of the graph's first op
    (``embeddings``); dfit moves each to its user's module, scaffolding to the root."""
    manifest = bert["compiled"].manifest
    params = [op for op in manifest["operators"] if op["op"] in PARAMETER_OPS]
    assert params
    query = "encoder.layer.0.attention.self.query"
    weight = 4 * frontend_models.BERT_HIDDEN * frontend_models.BERT_HIDDEN
    query_params = [op for op in params if op["module_path"] == query]
    # The 64x64 weight (global, its load, its conversion) and the bias, nothing else.
    assert {tuple(op["results"][0]["shape"]) for op in query_params if op["results"]} == \
        {(frontend_models.BERT_HIDDEN, frontend_models.BERT_HIDDEN), (frontend_models.BERT_HIDDEN,)}
    assert {op["op"] for op in query_params} >= {"util.global.load", "torch_c.from_builtin_tensor"}
    # Only the embedding tables (vocab x hidden, positions x hidden, 2 x hidden) and the
    # position/token-type id buffers sit in ``embeddings`` — no layer's weights.
    embedding_shapes = {tuple(op["results"][0]["shape"]) for op in params
                        if op["module_path"] == "embeddings" and op["results"]}
    assert (frontend_models.BERT_HIDDEN, frontend_models.BERT_HIDDEN) not in embedding_shapes
    assert embedding_shapes and all(shape[-1] in (frontend_models.BERT_HIDDEN, 32) for shape in embedding_shapes), \
        embedding_shapes
    # Every layer's linears own their weights.
    for layer in range(frontend_models.BERT_LAYERS):
        for name in ("attention.self.query", "attention.self.key", "attention.self.value", "intermediate.dense"):
            assert any(op["module_path"] == f"encoder.layer.{layer}.{name}" for op in params), (layer, name)
    scaffolding = [op for op in manifest["operators"] if op["op"] in STRUCTURAL]
    assert scaffolding and {(op["module_path"], op["module_class"]) for op in scaffolding} == {("", "BertModel")}
    # In the module tree: the query's self-bytes include its weight; ``embeddings`` holds
    # its own tables (100x64 words, 32x64 positions, 2x64 types) and not the layers' weights.
    rows = {row["module_path"]: row for row in read_csv(bert["out"] / "modules.csv")}
    assert int(float(rows[query]["self_bytes"])) >= weight
    all_param_bytes = sum(op["bytes"] or 0 for op in params)
    embedding_param_bytes = sum(op["bytes"] or 0 for op in params if op["module_path"] == "embeddings")
    assert embedding_param_bytes < all_param_bytes / 2
    assert int(float(rows["embeddings"]["self_bytes"])) < all_param_bytes / 2


def test_bert_top_sites_are_modeling_bert_lines(bert: dict[str, Any]) -> None:
    sites = read_csv(bert["out"] / "sites.csv")
    summary = json.loads((bert["out"] / "summary.json").read_text())
    assert summary["attributed_time_pct"] > 0
    top = sites[:5]
    assert all(row["site"].split(":")[0].endswith("transformers/models/bert/modeling_bert.py") for row in top), top
    assert all(row["site_kind"] == "source" for row in top)
    # No op lands on framework code or on the export call; only the function and its
    # return (no line of model code) sit in the root module.
    assert [(row["site"], row["site_kind"], row["operators"]) for row in sites if row["site_kind"] != "source"] \
        == [("(root)", "module", "2")]
    assert not [row for row in sites if "frontends/torch.py" in row["site"] or "test_frontend" in row["site"]]
    # The query projection line is shared by every layer's query, and only theirs.
    query = [row for row in sites if row["module_paths"] and all(p.endswith("attention.self.query") or
                                                                  p.endswith("attention.self")
                                                                  for p in row["module_paths"].split(";"))]
    assert query


def test_bert_module_tree_has_every_layer_split_into_attention_and_mlp(bert: dict[str, Any]) -> None:
    rows = {row["module_path"]: row for row in read_csv(bert["out"] / "modules.csv")}
    layers = [path for path in rows if path.startswith("encoder.layer.") and path.count(".") == 2]
    assert layers == [f"encoder.layer.{i}" for i in range(frontend_models.BERT_LAYERS)]
    for layer in layers:
        assert rows[layer]["module_class"] == "BertLayer" and rows[layer]["parent"] == "encoder.layer"
        children = {path for path, row in rows.items() if row["parent"] == layer}
        assert children == {f"{layer}.attention", f"{layer}.intermediate", f"{layer}.output"}
        # Hand count: q, k, v, attention output: 4 x (8x64 @ 64x64); MLP: 8x64 @ 64x128 and back.
        linear = 2 * frontend_models.BERT_SEQ * frontend_models.BERT_HIDDEN * frontend_models.BERT_HIDDEN
        attention_linears = sum(int(rows[f"{layer}.attention.self.{p}"]["flops"]) for p in ("query", "key", "value"))
        assert attention_linears == 3 * linear
        assert int(rows[f"{layer}.intermediate.dense"]["flops"]) == 2 * linear
    # Inclusive = self + children, on every row; the root holds every op with a module.
    for path, row in rows.items():
        children = [r for r in rows.values() if r["parent"] == path and r["module_path"] != path]
        for measure in ("ops", "flops", "bytes"):
            assert int(row[measure]) == int(row[f"self_{measure}"]) + sum(int(c[measure]) for c in children)
        assert float(row["time_ns"]) == pytest.approx(float(row["self_time_ns"]) + sum(float(c["time_ns"])
                                                                                    for c in children), rel=1e-6)
    manifest = bert["compiled"].manifest
    assert int(rows[""]["ops"]) == sum(1 for op in manifest["operators"] if op["module_path"] is not None)
    assert rows[""]["module_class"] == "BertModel"
    # Measured time reaches the layers.
    assert all(float(rows[layer]["time_ns"]) > 0 for layer in layers)
    phases = read_csv(bert["out"] / "phases.csv")
    assert {row["phase"] for row in phases} == {"forward", "initializer"}


def test_bert_flame_graph_and_speedscope(bert: dict[str, Any]) -> None:
    out = bert["out"]
    modules = read_csv(out / "modules.csv")
    svg = ET.parse(out / "flamegraph.svg").getroot()
    titles = [t.text for t in svg.iter("{http://www.w3.org/2000/svg}title")]
    assert len(titles) == len(modules)
    assert any(t.startswith("encoder.layer.2.attention : BertAttention") for t in titles)
    document = json.loads((out / "speedscope.json").read_text())
    assert document["$schema"] == "https://www.speedscope.app/file-format-schema.json"
    profile = document["profiles"][0]
    root = next(row for row in modules if row["module_path"] == "")
    assert profile["unit"] == "nanoseconds"
    assert sum(profile["weights"]) == pytest.approx(float(root["time_ns"]), rel=1e-6)
    frames = [frame["name"] for frame in document["shared"]["frames"]]
    assert "encoder.layer.0 (BertLayer)" in frames
    # Weights are initial values (util.global) in the module that uses them.
    assert [p["name"] for p in document["profiles"][1:]] == ["phase: forward", "phase: initializer"]


def test_module_names_change_neither_ids_nor_code(bert: dict[str, Any]) -> None:
    """The NameLocs carrying nn.Module paths are debug info: the same export without them
    tags to the same IDs and hashes, and compiles to the same executables."""
    from dfit_mlir.core.vmfb import read_module
    from dfit_mlir.frontends import torch as torch_frontend
    from dfit_mlir.passes.plain_compile import plain_compile

    root = bert["root"]
    with_names = bert["compiled"].vmfb.with_suffix(".mlir").read_text()
    original = torch_frontend.module_locations
    try:
        torch_frontend.module_locations = _no_names  # the plain iree-turbine export
        without_names = torch_frontend.export_mlir(bert["model"], bert["args"])
    finally:
        torch_frontend.module_locations = original
    assert "nn.Module:" in with_names and "nn.Module:" not in without_names
    assert tag_text(with_names) == tag_text(without_names)
    # Code: the same locations less the names. (dfit also moves hoisted weights to their
    # users' file:line, which IREE keeps as the executables' debug line info; so the
    # comparison is with the names stripped from dfit's export, not with turbine's.)
    stripped = re.sub(r'loc\("nn\.Module:[^"]*"\((#loc\d+|[^()]*)\)\)', r"loc(\1)", with_names)
    stripped = re.sub(r'loc\("nn\.Module:[^"]*"\)', "loc(unknown)", stripped)
    assert "nn.Module:" not in stripped
    (root / "plain.mlir").write_text(stripped)
    plain_compile(root / "plain.mlir", root / "plain.vmfb", list(torch_frontend.DEFAULT_FLAGS))
    plain, tagged = read_module(root / "plain.vmfb"), read_module(bert["compiled"].vmfb)
    assert tagged.executables == plain.executables and plain.executables
    assert tagged.function_bytecode == plain.function_bytecode


def _no_names() -> Any:
    import contextlib

    return contextlib.nullcontext()


def test_code_rules_on_the_real_stacks(bert: dict[str, Any]) -> None:
    """Every file in BERT's call stacks, classified by what it is."""
    files = {frame["file"] for op in bert["compiled"].manifest["operators"] for frame in op["call_stack"]}
    rules = CodeRules.default()
    model = {f for f in files if rules.is_model_code(f)}
    assert model and all(f.endswith("transformers/models/bert/modeling_bert.py") for f in model)
    framework = files - model
    assert any("/torch/nn/" in f for f in framework)
    assert any(f.endswith("/transformers/activations.py") for f in framework)
    # A user's rule in front: BERT's own file counted as framework moves the sites
    # outwards (no model-code frame is left: the ops fall back to their module paths).
    strict = rules.extended(framework=["transformers/models/bert/*"])
    assert not any(strict.is_model_code(f) for f in files)


def test_user_rules_through_the_tool_option(bert: dict[str, Any], tmp_path: Path) -> None:
    analyze(bert["compiled"].manifest_path, ["semantic-attribution"], tmp_path,
            {"semantic-attribution": {"framework_code": "transformers/models/bert/*"}})
    sites = read_csv(tmp_path / "semantic-attribution" / "sites.csv")
    assert {row["site_kind"] for row in sites} == {"module"}
    assert {"encoder.layer.0.attention.self.query", "pooler.dense"} <= {row["site"] for row in sites}


def test_convnext_module_tree(convnext: dict[str, Any]) -> None:
    manifest = convnext["compiled"].manifest
    ops = non_constant(manifest)
    assert sum(1 for op in ops if op["module_path"] is None or op["phase"] is None) <= 0.001 * len(ops)
    convs = [op for op in ops if op["source_op"] == "torch.aten.conv2d"]
    assert {op["module_path"] for op in convs} == {"embeddings.patch_embeddings", "encoder.stages.0.layers.0.dwconv",
                                                   "encoder.stages.1.downsampling_layer.1",
                                                   "encoder.stages.1.layers.0.dwconv"}
    assert {op["module_class"] for op in convs} == {"Conv2d"}
    rows = {row["module_path"]: row for row in read_csv(convnext["out"] / "modules.csv")}
    assert rows["encoder.stages.0.layers.0"]["module_class"] == "ConvNextLayer"
    children = {p for p, r in rows.items() if r["parent"] == "encoder.stages.0.layers.0"}
    assert {"encoder.stages.0.layers.0.dwconv", "encoder.stages.0.layers.0.pwconv1",
            "encoder.stages.0.layers.0.pwconv2", "encoder.stages.0.layers.0.layernorm"} <= children
    sites = read_csv(convnext["out"] / "sites.csv")
    assert sites[0]["site"].split(":")[0].endswith("transformers/models/convnext/modeling_convnext.py")


def test_cli_compiles_a_pytorch_module_file(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from dfit_mlir.cli.app import main
    from dfit_mlir.core.manifest import load

    source = tmp_path / "tiny.py"
    source.write_text(
        "import torch\n\n"
        "class Tiny(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.fc = torch.nn.Linear(8, 4)\n\n"
        "    def forward(self, x):\n"
        "        return torch.relu(self.fc(x))\n\n"
        "def make_model():\n"
        "    return Tiny(), (torch.ones(2, 8),)\n")
    result = CliRunner().invoke(main, ["compile", str(source), "--dfit-tag", "--mode", "ids",
                                       "-o", str(tmp_path / "tiny.vmfb")])
    assert result.exit_code == 0, result.output
    manifest = load(tmp_path / "tiny.manifest.json")
    linear = next(op for op in manifest["operators"] if op["op"] == "torch.aten.linear")
    assert (linear["module_path"], linear["module_class"], linear["phase"]) == ("fc", "Linear", "forward")
    # The innermost frame is torch's Linear; the model's own line is in the stack.
    assert linear["source"]["file"].endswith("torch/nn/modules/linear.py")
    assert {"file": str(source), "line": 9, "col": 0} in linear["call_stack"]
    bad = tmp_path / "bad.py"
    bad.write_text("x = 1\n")
    result = CliRunner().invoke(main, ["compile", str(bad), "--dfit-tag", "-o", str(tmp_path / "bad.vmfb")])
    assert result.exit_code == 2 and "defines no make_model()" in result.output


@pytest.mark.parametrize(("text", "expected"), [
    ("def make_model():\n    raise ValueError('weights missing')\n",
     "model.py:2: make_model() raised ValueError: weights missing"),
    ("import a_package_nobody_installed\n",
     "model.py:1: running the file raised ModuleNotFoundError: No module named 'a_package_nobody_installed'"),
])
def test_cli_model_file_that_raises_is_a_model_failure_not_a_dfit_bug(tmp_path: Path, text: str,
                                                                      expected: str) -> None:
    """The user's code failing is exit 3 with the file and line, not "internal error" (70)."""
    from click.testing import CliRunner

    from dfit_mlir.cli.app import main

    source = tmp_path / "model.py"
    source.write_text(text)
    result = CliRunner().invoke(main, ["compile", str(source), "--dfit-tag", "-o", str(tmp_path / "m.vmfb")])
    assert result.exit_code == 3, result.output
    assert expected in result.output and "internal error" not in result.output
    assert not (tmp_path / "m.vmfb").exists()


def test_failing_export_prints_one_dfit_line(tmp_path: Path) -> None:
    """torch prints the partial FX graph of a failed export to stderr, logs multi-line
    records and warns about its own internals; the user sees only dfit's line."""
    import subprocess
    import sys

    source = tmp_path / "model.py"
    source.write_text(
        "import torch\n\n"
        "class DataDependent(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return torch.ones(int(x.sum().item()))\n\n"
        "def make_model():\n"
        "    return DataDependent(), (torch.ones(2, 3),)\n")
    dfit = Path(sys.executable).parent / "dfit"
    result = subprocess.run([str(dfit), "compile", str(source), "--dfit-tag", "-o", str(tmp_path / "m.vmfb")],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 3
    assert result.stderr.strip().splitlines() == [result.stderr.strip()], result.stderr
    assert result.stderr.startswith("dfit: torch.export failed on DataDependent: GuardOnDataDependentSymNode")
    assert "FutureWarning" not in result.stderr + result.stdout and "def forward" not in result.stdout
    assert not (tmp_path / "m.vmfb").exists()


def test_model_explorer_keys_each_torch_op_by_its_id(bert: dict[str, Any]) -> None:
    """A PyTorch export's location names are nn.Module stacks, shared by every op of a
    module: keyed by them, ops would fold into module totals matching no graph node."""
    from dfit_mlir.analysis import ledger
    from dfit_mlir.analysis.model import SemanticModel
    from dfit_mlir.views import model_explorer

    model = SemanticModel.open(bert["bundle"])
    flops = model_explorer.node_data(model, "flops")["results"]
    # The ledger's FLOPs of each op that runs in a dispatch (ops IREE folded at compile
    # time, a `select` of a constant, run nowhere and carry none).
    with_flops = {op_id: row["flops"] for op_id, row in ledger.of(model).op_figures().items() if row["flops"]}
    # One key per op: every linear of every layer is its own node.
    assert sum("torch.aten.linear" in op_id for op_id in with_flops) == 6 * frontend_models.BERT_LAYERS + 1
    assert {key: entry["value"] for key, entry in flops.items()} == with_flops
    modules = model_explorer.node_data(model, "module")["results"]
    query = next(op["id"] for op in bert["compiled"].manifest["operators"]
                 if op["op"] == "torch.aten.linear" and op["module_path"] == "encoder.layer.0.attention.self.query")
    assert modules[query]["value"] == "encoder.layer.0.attention.self.query"
    assert not [key for key in (*flops, *modules) if key.startswith("nn.Module:")]
    # Nothing lost or counted twice.
    assert sum(entry["value"] for entry in flops.values()) == sum(with_flops.values())


def test_a_user_model_in_a_folder_named_torch_ranks_by_its_own_lines(tmp_path: Path) -> None:
    """``*/torch/*`` once matched ``…/torch/model.py`` of the user: framework rules see
    package-relative paths only, so the user's own lines are the sites, and
    ``site_rule`` says which rule decided each."""
    from dfit_mlir.frontends import torch as torch_frontend

    folder = tmp_path / "torch"
    folder.mkdir()
    source = folder / "model.py"
    source.write_text(
        "import torch\n\n"
        "class Block(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.up = torch.nn.Linear(16, 64)\n"
        "        self.down = torch.nn.Linear(64, 16)\n\n"
        "    def forward(self, x):\n"
        "        h = torch.nn.functional.gelu(self.up(x))\n"
        "        return x + self.down(h)\n\n"
        "def make_model():\n"
        "    return Block(), (torch.ones(4, 16),)\n")
    model, args = torch_frontend.load_module_file(source)
    compiled = torch_frontend.compile(model, args, output=tmp_path / "block.vmfb", mode="ids")
    analyze(compiled.manifest_path, ["semantic-attribution"], tmp_path / "analysis")
    sites = read_csv(tmp_path / "analysis" / "semantic-attribution" / "sites.csv")
    own = [row for row in sites if row["site"].startswith(f"{source}:")]
    # Lines 10 (up, gelu) and 11 (down, the residual add) carry every computing op.
    assert {row["site"].rsplit(":", 1)[1] for row in own} == {"10", "11"}
    assert all(row["site_kind"] == "source" and row["site_rule"].startswith("model code (no rule") for row in own)
    assert sites[0] in own and not [row for row in sites if row["site_kind"] == "framework"]
    linear = next(op for op in compiled.manifest["operators"] if op["op"] == "torch.aten.linear")
    installed = linear["source"]["file"]  # the real torch/nn/modules/linear.py
    assert CodeRules.default().explain(installed).reason == "framework torch/* on torch/nn/modules/linear.py"
    # A user's own glob still matches the folder, as documented.
    assert CodeRules.default().extended(framework=["torch/*"]).explain(str(source)).reason == \
        "user framework glob torch/*"
    # dfit analyze --explain-site: each frame of the site's ops and the rule that decided it.
    from click.testing import CliRunner

    from dfit_mlir.cli.app import main

    top = sites[0]["site"]
    result = CliRunner().invoke(main, ["analyze", str(compiled.manifest_path), "--tool", "semantic-attribution",
                                       "--out", str(tmp_path / "explained"), "--explain-site", top])
    assert result.exit_code == 0, result.output
    explained = result.output[result.output.index(f"site {top} (source)"):]
    assert f"{top}  model code: model code (no rule: a file outside installed packages)" in explained
    from dfit_mlir.analysis.model import SemanticModel
    from dfit_mlir.analysis.tools.builtin.semantic_attribution import explain_site

    every_op = explain_site(SemanticModel.open(compiled.manifest_path), top, limit=1000)
    assert "torch/nn/modules/linear.py" in every_op and "framework: framework torch/* on torch/nn/modules/linear.py" \
        in every_op
    result = CliRunner().invoke(main, ["analyze", str(compiled.manifest_path), "--tool", "semantic-attribution",
                                       "--out", str(tmp_path / "explained"), "--force", "--explain-site", "nowhere:1"])
    assert result.exit_code == 2 and "dfit: --explain-site nowhere:1: no op has this site" in result.output

def test_batchnorm_cnn_compiles_to_the_executables_of_a_plain_turbine_export(tmp_path: Path) -> None:
    """A transformers ResNet (BatchNorm after every conv) through ``dfit compile
    model.py``: the BatchNorms are decomposed as iree-turbine's own ``aot.export``
    decomposes them, so the executables are those of a plain ``aot.export(model, x)`` +
    ``iree-compile`` byte for byte (both without DWARF: dfit's locations move hoisted
    weights to their users' lines, which only the debug line tables record), and every
    BatchNorm module keeps its ops, path and class."""
    import torch
    from click.testing import CliRunner
    from iree.turbine import aot

    from dfit_mlir.cli.app import main
    from dfit_mlir.core.manifest import load
    from dfit_mlir.core.vmfb import read_module
    from dfit_mlir.frontends import torch as torch_frontend
    from dfit_mlir.frontends.model_file import default_factory
    from dfit_mlir.passes.plain_compile import plain_compile

    source = REPO / "examples" / "zoo" / "resnet.py"
    no_dwarf = "--iree-llvmcpu-debug-symbols=false"
    result = CliRunner().invoke(main, ["compile", str(source), "--dfit-tag", "-o", str(tmp_path / "dfit.vmfb"),
                                       no_dwarf])
    assert result.exit_code == 0, result.output
    model, args = torch_frontend.load_module_file(source, default_factory(source))
    with torch_frontend.quiet_export():
        exported = aot.export(model, args=args)
    (tmp_path / "plain.mlir").write_text(exported.mlir_module.operation.get_asm(enable_debug_info=True))
    plain_compile(tmp_path / "plain.mlir", tmp_path / "plain.vmfb", [*torch_frontend.DEFAULT_FLAGS, no_dwarf])
    plain, tagged = read_module(tmp_path / "plain.vmfb"), read_module(tmp_path / "dfit.vmfb")
    assert tagged.executables == plain.executables and plain.executables
    assert tagged.embedded_strings == plain.embedded_strings  # export names, so dispatch count too
    assert sum("_dispatch_" in s for s in plain.embedded_strings) > 5
    manifest = load(tmp_path / "dfit.manifest.json")
    assert not any("batch_norm" in op["op"] for op in manifest["operators"])
    norms = {path for path, module in model.named_modules() if isinstance(module, torch.nn.BatchNorm2d)}
    placed = {op["module_path"] for op in manifest["operators"] if op["module_class"] == "BatchNorm2d"}
    assert len(norms) > 3 and placed == norms


def test_an_op_iree_cannot_lower_stops_the_export_with_its_module(tmp_path: Path) -> None:
    """An op torch-mlir does not know (``torch.operator``) is refused before compiling,
    in one line naming it, the module it is in and a workaround (exit 3)."""
    import subprocess
    import sys

    source = tmp_path / "odd.py"
    source.write_text(
        "import torch\n\n"
        "class Odd(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return torch.special.bessel_j0(x)\n\n"
        "class Net(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.odd = Odd()\n\n"
        "    def forward(self, x):\n"
        "        return self.odd(x) + 1\n\n"
        "def make_model():\n"
        "    return Net(), (torch.ones(2, 4),)\n")
    dfit = Path(sys.executable).parent / "dfit"
    result = subprocess.run([str(dfit), "compile", str(source), "--dfit-tag", "-o", str(tmp_path / "odd.vmfb")],
                            capture_output=True, text=True)
    assert result.returncode == 3, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert "torch.aten.special_bessel_j0" in lines[0] and "in odd: Odd of Net" in lines[0]
    assert "extend_aot_decompositions" in lines[0]
    assert not (tmp_path / "odd.vmfb").exists()


def test_gpt2_with_left_and_right_padded_masks_compiles_to_torch_logits(tmp_path: Path) -> None:
    """transformers 5.x GPT-2 called with token ids and a 2-D padding mask, batch 2: one
    row padded on the left (its first 3 queries see no key at all), one on the right.
    The ``dense<true> : tensor<i1>`` literal and boolean ``__and__`` IREE 3.13 rejects are
    rewritten away, and each masked SDPA is guarded against fully masked rows (IREE 3.13
    gives NaN there, PyTorch zeros, and the NaN spreads through the next layer's P·V to
    every logit): IREE's logits are finite and equal eager PyTorch's at every position,
    padded ones included (atol 1e-4; measured 9e-8)."""
    import importlib.util

    import numpy as np
    import torch
    from iree import runtime

    from dfit_mlir.frontends import torch as torch_frontend

    spec = importlib.util.spec_from_file_location("zoo_gpt2", REPO / "examples" / "zoo" / "gpt2.py")
    assert spec is not None and spec.loader is not None
    gpt2 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpt2)
    model, (ids,) = gpt2.make_model()
    ids = torch.cat([ids, ids.flip(1)])
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding: fully masked query rows
    mask[1, -2:] = 0  # right padding
    compiled = torch_frontend.compile(model, (ids,), kwargs={"attention_mask": mask}, output=tmp_path / "m.vmfb",
                                      mode="ids")
    operators = compiled.manifest["operators"]
    assert not any(op["op"] == "torch.vtensor.literal" and op["results"] and op["results"][0]["dtype"] == "i1"
                   for op in operators)
    guards = [op["module_path"] for op in operators if op["op"] == "torch.aten.any.dim"]
    assert sorted(guards) == ["transformer.h.0.attn", "transformer.h.1.attn"]  # one per attention
    with torch.no_grad():
        expected = model(ids, attention_mask=mask).logits.numpy()
    module = runtime.load_vm_flatbuffer_file(str(compiled.vmfb), driver="local-sync")
    got = np.asarray(module.main(ids.numpy(), mask.numpy()))
    assert np.isfinite(got).all()
    assert np.allclose(got, expected, atol=1e-4), float(np.abs(got - expected).max())


def test_python_api_prints_the_compile_summary_unless_quiet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``torch.compile`` prints what ``dfit compile`` prints (the same code as
    ``jax.compile``: ``dfit_mlir.frontends.compiling.compile_text``); ``quiet=True`` nothing."""
    import torch

    from dfit_mlir.frontends import torch as torch_frontend
    from dfit_mlir.passes.compile_report import compile_report

    model, args = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()).eval(), (torch.ones(2, 8),)
    capsys.readouterr()
    result = torch_frontend.compile(model, args, output=tmp_path / "loud" / "m.vmfb", mode="ids")
    printed = capsys.readouterr().out
    assert printed == compile_report(result) + "\n"
    assert printed.startswith(f"wrote {result.vmfb}\nwrote {result.manifest_path}\nper-stage attribution (")
    torch_frontend.compile(model, args, output=tmp_path / "quiet" / "m.vmfb", mode="ids", quiet=True)
    assert capsys.readouterr().out == ""
