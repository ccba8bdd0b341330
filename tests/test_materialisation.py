"""Shared materialisation (``passes/materialisation.py``) on a real ONNX CNN.

Expected values come from the squeezenet import's ``dispatch-creation`` IR, read by hand:
in the dispatch of the second half of the first fire module's 3x3 expand conv (site 5,
root ``onnx.Conv#3``) the only op carrying ``onnx.MaxPool#0`` is a ``tensor.empty`` of
64x55x55 (merged with the pool's own) and the only one carrying ``onnx.Conv#2`` is the
zero ``linalg.fill`` of its sibling 1x1 expand conv; the softmax dispatch (site 38) names
``onnx.GlobalAveragePool#0`` through a ``tensor.empty`` only. In site 2 (root
``onnx.Conv#1``) ``onnx.MaxPool#0`` is carried by a ``linalg.generic`` — real work,
fused — and every conv dispatch's ReLU is ``arith.cmpf``/``select`` in its body.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from dfit_mlir.core import manifest as manifest_io
from dfit_mlir.passes import materialisation
from tests import realmodels

PREFIX = "squeezenet_old/"
#: site index -> the IDs its region names only through empties, fills and constants.
EXPECTED_SHARED = {
    5: {"onnx.Conv#2", "onnx.MaxPool#0"},
    9: {"onnx.Conv#2", "onnx.Conv#3", "onnx.MaxPool#0"},
    10: {"onnx.MaxPool#0"},
    19: {"onnx.MaxPool#0"},
    38: {"onnx.GlobalAveragePool#0"},
}


def short(ids: list[str]) -> set[str]:
    return {i.removeprefix(PREFIX) for i in ids}


@pytest.fixture(scope="module")
def squeezenet(tmp_path_factory: pytest.TempPathFactory) -> dict:
    from dfit_mlir.passes.instrumented_compile import compile_instrumented

    root = tmp_path_factory.mktemp("squeezenet")
    try:
        source = realmodels.onnx_model("squeezenet", root)
    except realmodels.FixtureUnavailable as reason:
        pytest.skip(str(reason))
    compiled = compile_instrumented(source, root / "squeezenet.vmfb", mode="ids", flags=list(realmodels.IREE_CPU_FLAGS))
    return {"manifest": compiled.manifest, "path": compiled.manifest_path}


@pytest.mark.slow
def test_merged_empties_and_fills_leave_the_fused_lists(squeezenet: dict) -> None:
    sites = squeezenet["manifest"]["partitions"]["dispatch_sites"]
    for index, expected in EXPECTED_SHARED.items():
        site = sites[index]
        assert short(site["shared_ids"]) == expected, index
        assert not expected & short(site["fused_ids"]), index
    # Softmax reads the pooled vector; the pool's merged empty is not fusion.
    assert short(sites[38]["fused_ids"]) == {"onnx.Softmax#0"}


@pytest.mark.slow
def test_real_fusion_stays_fused(squeezenet: dict) -> None:
    sites = squeezenet["manifest"]["partitions"]["dispatch_sites"]
    assert short(sites[2]["fused_ids"]) == {"onnx.Conv#1", "onnx.MaxPool#0", "onnx.Relu#1"}
    assert short(sites[5]["fused_ids"]) == {"onnx.Conv#3", "onnx.Relu#2"}
    assert short(sites[37]["fused_ids"]) == {"onnx.GlobalAveragePool#0", "onnx.Relu#25"}
    for site in sites:
        assert site["root_id"] in site["fused_ids"], site["index"]
        assert site["root_id"] not in site["shared_ids"], site["index"]
        assert not set(site["fused_ids"]) & set(site["shared_ids"]), site["index"]
    # Every conv dispatch with more than its conv keeps a ReLU: 25 of 26 convs (the
    # last conv's ReLU went into the average pool's dispatch, site 37).
    computing = [s for s in sites if "Conv" in s["root_id"] and len(s["fused_ids"]) > 1]
    assert len(computing) == 25 and all(any("Relu" in i for i in s["fused_ids"]) for s in computing)


@pytest.mark.slow
def test_shared_materialisation_is_listed_apart_and_gets_no_time(squeezenet: dict) -> None:
    from dfit_mlir.analysis.model import SemanticModel

    document = squeezenet["manifest"]
    manifest_io.validate(document, "squeezenet")
    listing = materialisation.shared_ids_of(document)
    assert listing[PREFIX + "onnx.MaxPool#0"] == [5, 9, 10, 19]
    assert document["partitions"]["shared_materialisation"][0]["id"] == PREFIX + "onnx.MaxPool#0"
    model = SemanticModel(document)
    for partition in model.partitions:
        shared = set(partition.attributes["shared_ids"])
        assert not shared & set(model.compute_ops(partition)), partition.id
    # The export serving sites 5 and 9 (one conv kernel) shares what both sites share.
    exports = {e["name"]: e for e in document["partitions"]["exports"]}
    assert PREFIX + "onnx.MaxPool#0" in exports[document["partitions"]["dispatch_sites"][5]["export"]]["shared_ids"]


@pytest.mark.slow
def test_dfit_show_lists_shared_ids_apart(squeezenet: dict) -> None:
    from dfit_mlir.cli.app import main

    result = CliRunner().invoke(main, ["show", str(squeezenet["path"])])
    assert result.exit_code == 0, result.output
    assert "shared materialisation (merged empties/fills/constants, not fused): 16 IDs in 19 call sites" in result.output
    line = next(line for line in result.output.splitlines() if line.strip().startswith("#38 "))
    assert line.endswith(f"fused: -; shared: {PREFIX}onnx.GlobalAveragePool#0")


def test_convnet_keeps_each_dispatch_its_own_fill_and_shares_the_zero(iree_bundles: dict[str, Path]) -> None:
    """examples/models/convnet.mlir: one ``%zero`` (line 13) feeds every fill and ReLU,
    and the last matmul's 1x10 ``tensor.empty`` (line 65) is reused by the softmax;
    conv1's accumulator fill (line 19) is used by conv1 alone."""
    document = manifest_io.load(iree_bundles["manifest"])
    assert materialisation.shared_ids_of(document) == {"main/arith.constant#2": [0, 1, 3, 4],
                                                       "main/tensor.empty#4": [4, 5]}
    site0 = document["partitions"]["dispatch_sites"][0]
    assert "main/linalg.fill#2" in site0["fused_ids"]
    assert "main/linalg.conv_2d_nhwc_hwcf#0/linalg.yield#0" in site0["fused_ids"]  # in the conv's body


# --- SYNTHETIC: the manifest-level rules, without a compile ---------------------------------

def _site(index: int, export: str, root: str, fused: list[str]) -> dict:
    return {"index": index, "function": "main", "executable": "e", "export": export, "root_id": root, "ids": [root],
            "fused_ids": fused}


def test_region_evidence_decides_and_roots_are_never_shared() -> None:
    regions = [materialisation.RegionEvidence(frozenset({"a", "b", "z"}), frozenset({"z", "a"})),
               materialisation.RegionEvidence(frozenset({"c", "z"}), frozenset({"z"}))]
    partitions = {"exports": [{"executable": "e", "name": "k0", "root_id": "a", "ids": ["a"], "fused_ids": ["a", "b", "z"]},
                              {"executable": "e", "name": "k1", "root_id": "c", "ids": ["c"], "fused_ids": ["c", "z"]}],
                  "dispatch_sites": [_site(0, "k0", "a", ["a", "b", "z"]), _site(1, "k1", "c", ["c", "z"])]}
    split = materialisation.separate_shared(partitions, regions, [{"id": "z", "op": "onnx.MaxPool"}])
    assert [(s["fused_ids"], s["shared_ids"]) for s in split["dispatch_sites"]] == [(["a", "b"], ["z"]), (["c"], ["z"])]
    assert [e["shared_ids"] for e in split["exports"]] == [["z"], ["z"]]
    assert split["shared_materialisation"] == [{"id": "z", "op": "onnx.MaxPool", "sites": [0, 1]}]


def test_a_data_making_source_op_is_shared_only_when_several_sites_name_it() -> None:
    regions = [materialisation.RegionEvidence(frozenset({"m", "own", "zero", "m/y"}), frozenset({"own", "zero", "m/y"})),
               materialisation.RegionEvidence(frozenset({"n", "zero"}), frozenset({"zero"}))]
    operators = [{"id": "m", "op": "linalg.matmul"}, {"id": "n", "op": "linalg.matmul"},
                 {"id": "own", "op": "linalg.fill"}, {"id": "zero", "op": "arith.constant"},
                 {"id": "m/y", "op": "linalg.yield", "parent": "m"}]
    partitions = {"exports": [], "dispatch_sites": [_site(0, "x", "m", ["m", "own", "zero", "m/y"]),
                                                    _site(1, "y", "n", ["n", "zero"])]}
    split = materialisation.separate_shared(partitions, regions, operators)
    assert [(s["fused_ids"], s["shared_ids"]) for s in split["dispatch_sites"]] == [
        (["m", "own", "m/y"], ["zero"]), (["n"], ["zero"])]


def test_without_region_evidence_only_data_making_ops_named_by_several_sites_are_shared() -> None:
    operators = [{"id": "e", "op": "tensor.empty"}, {"id": "k", "op": "torch.aten.zeros"},
                 {"id": "m", "op": "linalg.matmul"}, {"id": "n", "op": "linalg.matmul"}]
    partitions = {"exports": [], "dispatch_sites": [_site(0, "x", "m", ["m", "e", "k"]), _site(1, "y", "n", ["n", "e"])]}
    split = materialisation.separate_shared(partitions, [], operators)
    assert [s["shared_ids"] for s in split["dispatch_sites"]] == [["e"], ["e"]]  # k: one site only
    assert materialisation.makes_data("onnx.ConstantOfShape") and not materialisation.makes_data("onnx.Conv")


def test_a_manifest_from_before_has_no_listing(tmp_path: Path) -> None:
    assert materialisation.shared_ids_of({"partitions": {"dispatch_sites": []}}) == {}


# --- a transformer through iree-turbine --------------------------------------------------------

@pytest.fixture(scope="module")
def bert_manifest(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A 2-layer BERT (random weights, from a config) exported by iree-turbine and
    compiled: the shape of model the issue saw one embedding in 57 of 99 dispatches."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    aot = pytest.importorskip("iree.turbine.aot")
    from dfit_mlir.passes.instrumented_compile import compile_instrumented

    root = tmp_path_factory.mktemp("bert")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=500, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=128, max_position_embeddings=64)
    model = transformers.BertModel(config).eval()
    exported = aot.export(model, args=(torch.randint(0, 500, (1, 16)),))
    source = root / "bert.mlir"
    with open(source, "w") as handle:
        exported.mlir_module.operation.print(file=handle, enable_debug_info=True)
    return compile_instrumented(source, root / "bert.vmfb", mode="ids").manifest


@pytest.mark.slow
@pytest.mark.frontends
# Exporting with torch 2.13: transformers' output capturing is a side effect TorchDynamo
# warns about, and torch's own pytree pickling uses a LeafSpec check it deprecates.
@pytest.mark.filterwarnings("ignore:While compiling, we found certain side effects:UserWarning")
@pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated:FutureWarning")
def test_a_transformers_merged_layer_norm_and_embedding_are_not_fused_everywhere(bert_manifest: dict) -> None:
    sites = bert_manifest["partitions"]["dispatch_sites"]
    listing = materialisation.shared_ids_of(bert_manifest)
    fused_in = {op_id: [s["index"] for s in sites if op_id in s["fused_ids"]] for op_id in listing}
    # The first layer norm and the word embedding: named by most dispatches through
    # merged empties and fills, fused only where they compute.
    layer_norm, embedding = "main/torch.aten.layer_norm#0", "main/torch.aten.embedding#2"
    assert len(listing[layer_norm]) > len(sites) / 2 and len(listing[embedding]) > len(sites) / 2
    assert len(fused_in[layer_norm]) <= 2 and len(fused_in[embedding]) == 1
    for site in sites:
        assert site["root_id"] in site["fused_ids"], site["index"]
    # Every linear keeps its own dispatches: the query projection is a batch matmul.
    q_projection = next(s for s in sites if s["root_id"] == "main/torch.aten.linear#0")
    assert "batch_matmul" in q_projection["export"] and q_projection["fused_ids"] == ["main/torch.aten.linear#0"]
