"""The structural join on real models: a BERT from ``transformers`` (small config, random
weights, no download) exported with iree-turbine and run with *default* inputs (its
token ids must index the embedding), and a real TFLite model (``../shared/fixtures``)
compiled with data tiling, whose weights are encoded by initializers at load time.
Every dispatch resolves to its site, every site's root is among its own fused IDs, and
every queue and memory record sits in the invocation of its submission."""

from __future__ import annotations

import json
import warnings
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from dfit_mlir.passes.instrumented_compile import CompileResult, compile_instrumented
from dfit_mlir.runtime_hooks import hal_profile
from dfit_mlir.runtime_hooks.run import run_bundle
from tests import realmodels

pytestmark = pytest.mark.slow

#: Small enough to export and compile in ~1 minute on 2 cores; a real BERT graph.
BERT_CONFIG = {"vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
               "intermediate_size": 128, "max_position_embeddings": 64}
SEQUENCE = 16
DATA_TILING = ("--iree-opt-data-tiling=true",)


def export_bert(target: Path) -> Path:
    """torch-dialect MLIR (with locations) of ``BertModel(input_ids)``; MODELS.md: call
    with input ids only."""
    import iree.turbine.aot as aot
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    model = BertModel(BertConfig(**BERT_CONFIG)).eval()

    class InputIdsOnly(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = model

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            return self.bert(input_ids=input_ids).last_hidden_state

    with warnings.catch_warnings():
        # torch.export / dynamo notes about transformers internals, not about this test.
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", FutureWarning)
        exported = aot.export(InputIdsOnly(), args=(torch.zeros(1, SEQUENCE, dtype=torch.int64),))
    target.write_text(exported.mlir_module.operation.get_asm(enable_debug_info=True))
    return target


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> CompileResult:
    root = tmp_path_factory.mktemp("bert")
    return compile_instrumented(export_bert(root / "bert.mlir"), root / "bert.vmfb", mode="ids")


@pytest.fixture(scope="module")
def franco_tiled(tmp_path_factory: pytest.TempPathFactory) -> CompileResult:
    model = realmodels.skip_unavailable(realmodels.TFLITE_MODELS["franco_fc"])
    root = tmp_path_factory.mktemp("franco")
    source = realmodels.tflite_model(model, root)
    return compile_instrumented(source, root / "franco.vmfb", mode="ids", flags=DATA_TILING)


def events_of(bundle: Path) -> list[dict]:
    return pq.read_table(bundle / "events.parquet").to_pylist()


def check_records_in_their_invocation(events: list[dict], invocations: int) -> None:
    """Allocations are numbered on local-task: a transient's alloca and dealloca fall in
    one invocation, and every invocation issues the same records."""
    records = [e for e in events if e["kind"] in ("queue", "memory")]
    assert records and {e["invocation"] for e in records} <= set(range(-1, invocations))
    owner: dict[int, set[int]] = {}
    for event in records:
        allocation = json.loads(event["attributes"] or "{}").get("allocation_id")
        if allocation and event["invocation"] >= 0:
            owner.setdefault(allocation, set()).add(event["invocation"])
    assert all(len(found) == 1 for found in owner.values())
    per_invocation = [Counter(e["partition"] for e in records if e["invocation"] == k) for k in range(invocations)]
    assert all(counts == per_invocation[0] for counts in per_invocation)


@pytest.mark.frontends
@pytest.mark.parametrize("driver", hal_profile.DRIVERS)
def test_bert_with_default_inputs(bert: CompileResult, tmp_path: Path, driver: str) -> None:
    result = run_bundle(bert.vmfb, bert.manifest_path, tmp_path / "b", driver=driver, repeat=2, warmup=1)
    # Token ids feed the 1000-row word embedding: defaults below 1000, not random int64.
    assert result.summary["inputs"] == [{
        "shape": [1, SEQUENCE], "dtype": "si64", "made": "integers-below", "bound": BERT_CONFIG["vocab_size"],
        "reason": "main/torch.aten.embedding#0 indexes a 1000x64 table"}]
    sites = bert.manifest["partitions"]["dispatch_sites"]
    assert all(s["root_id"] in s["fused_ids"] for s in sites)
    events = events_of(result.bundle)
    dispatches = [e for e in events if e["kind"] == "dispatch"]
    # One straight-line command buffer: each invocation runs every site once, and the
    # exports the runtime recorded, in its order, are the sites'.
    for invocation in (0, 1):
        mine = sorted((e for e in dispatches if e["invocation"] == invocation), key=lambda e: e["start_ns"])
        assert [e["partition"] for e in mine] == [s["export"] for s in sites]
        assert [e["site"] for e in mine] == [s["index"] for s in sites]
    if driver == "local-task":
        check_records_in_their_invocation(events, 2)


@pytest.mark.frontends
@pytest.mark.parametrize("mode", ["none", "ids"])
def test_bert_in_process_with_default_inputs(bert: CompileResult, tmp_path: Path, mode: str) -> None:
    result = run_bundle(bert.vmfb, bert.manifest_path, tmp_path / "b", mode=mode, repeat=2)
    assert result.summary["invocations"] == 2 and result.summary["inputs"][0]["made"] == "integers-below"


@pytest.mark.parametrize("driver", hal_profile.DRIVERS)
def test_data_tiled_tflite_with_load_time_encodings(franco_tiled: CompileResult, tmp_path: Path,
                                                     driver: str) -> None:
    sites = franco_tiled.manifest["partitions"]["dispatch_sites"]
    assert all(s["root_id"] in s["fused_ids"] for s in sites)
    # The weights' layout changes run in initializers (load time); the activation's and
    # the matmuls run per call.
    load = [s for s in sites if s["phase"] == "load"]
    assert load and all(s["kind"] == "encoding" and s["export"].startswith("_encoding_") for s in load)
    # The two fully-connected layers' weight matrices, each encoded once at load time.
    weights = [t for s in load for t in s["encodes"] if t.startswith("main/tosa.const")]
    assert len(weights) == len(set(weights)) == 2
    for s in load:
        assert all(t.split(":")[0] in s["fused_ids"] for t in s["encodes"])
    assert {s["kind"] for s in sites if s["phase"] == "invocation"} == {"encoding", "compute"}
    result = run_bundle(franco_tiled.vmfb, franco_tiled.manifest_path, tmp_path / "b", driver=driver, repeat=3)
    events = events_of(result.bundle)
    dispatches = [e for e in events if e["kind"] == "dispatch"]
    per_call = [s for s in sites if s["phase"] == "invocation"]
    assert Counter(e["invocation"] for e in dispatches) == {k: len(per_call) for k in range(3)}
    by_index = {s["index"]: s for s in sites}
    for event in dispatches:
        assert event["partition"] == by_index[event["site"]]["export"] and event["workgroups"] > 0
        if by_index[event["site"]]["kind"] == "compute":
            # matmul_like dispatches are the model's two fully-connected layers.
            assert "matmul" in event["partition"] and event["root_id"].startswith("main/tosa.conv2d")
    if driver == "local-task":
        check_records_in_their_invocation(events, 3)
