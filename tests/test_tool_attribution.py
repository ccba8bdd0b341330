"""semantic-attribution: ops, partitions and measured time → source sites, on every
backend's bundle; the convnet's fused first dispatch checked by hand."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from dfit_mlir.analysis.tools.builtin.semantic_attribution import is_framework
from dfit_mlir.analysis.tools.session import analyze
from dfit_mlir.core.errors import InvalidInputError
from tests.conftest import bundle_path, read_csv

BUNDLES = ("iree-full", "iree-lite", "iree-ids", "iree-none", "iree-manifest", "edgetpu", "sambanova", "cerebras")
OUTPUTS = ("partitions.csv", "sites.csv", "unattributed.csv", "summary.json", "modules.csv", "phases.csv", "flamegraph.svg",
           "speedscope.json")


def manifest_of(bundle: Path) -> dict[str, Any]:
    return json.loads((bundle / "manifest.json" if bundle.is_dir() else bundle).read_text())


def run(bundle: Path, out: Path, **options: str) -> tuple[Path, dict[str, Any], list[str]]:
    _, _, session = analyze(bundle, ["semantic-attribution"], out,
                            {"semantic-attribution": options} if options else None)
    tool_out = out / "semantic-attribution"
    return tool_out, json.loads((tool_out / "summary.json").read_text()), session.contexts["semantic-attribution"].notes


@pytest.mark.parametrize(("path", "framework"), [
    ("convnet.py", False),
    ("/work/main/examples/models/convnet.mlir", False),
    ("transformers/models/bert/modeling_bert.py", False),
    ("torch/nn/modules/linear.py", True),
    ("torch/autograd/__init__.py", True),
    ("/usr/lib/python3.11/site-packages/torch/functional.py", True),
    ("/opt/venv/lib/python3.11/site-packages/keras/layers/core.py", True),
    ("cerebras/pytorch/optim/AdamW.py", True),
    ("myjax/model.py", False),
])
def test_framework_paths(path: str, framework: bool) -> None:
    assert is_framework(path) is framework


@pytest.mark.parametrize("name", BUNDLES)
def test_every_bundle_is_attributed(request: pytest.FixtureRequest, name: str, tmp_path: Path) -> None:
    bundle = bundle_path(request, name)
    out, summary, _ = run(bundle, tmp_path)
    assert all((out / file).is_file() for file in OUTPUTS)
    manifest = manifest_of(bundle)
    assert summary["operators"] == len(manifest["operators"])
    partitions = read_csv(out / "partitions.csv")
    section = manifest["partitions"]
    assert len(partitions) == len(section.get("dispatch_sites", [])) + len(section.get("groups", []))
    sites = read_csv(out / "sites.csv")
    assert sum(int(row["operators"]) for row in sites) == summary["attributed_operators"]
    unattributed_ops = sum(int(row["count"]) for row in read_csv(out / "unattributed.csv") if row["what"] == "op")
    assert summary["attributed_operators"] + unattributed_ops == summary["operators"]


def test_fused_conv_dispatch_is_attributed_to_both_source_lines(iree_bundles: dict[str, Path],
                                                                tmp_path: Path) -> None:
    """Dispatch site 0 fuses conv1 (convnet.py:21), its accumulator fill (the .mlir's own
    line 19) and relu1 (convnet.py:22); its measured time is split by the ledger's roofline."""
    bundle = iree_bundles["full"]
    out, summary, _ = run(bundle, tmp_path)
    site0 = next(row for row in read_csv(out / "partitions.csv") if row["partition"].startswith("site0:"))
    assert site0["root_id"] == "main/linalg.conv_2d_nhwc_hwcf#0" and site0["root_site"] == "convnet.py:21"
    site_list = site0["sites"].split(";")
    assert site_list[0] == "convnet.py:21" and "convnet.py:22" in site_list and len(site_list) == 3
    assert site_list[1].endswith("convnet.mlir:19")  # linalg.fill#2, no Python location
    assert site0["module_paths"] == "conv1;relu1" and site0["compute_ops"] == "3"

    events = pq.read_table(bundle / "events.parquet").to_pylist()
    dispatches = [e for e in events if e["kind"] == "dispatch"]
    site0_ns = sum(e["duration_ns"] for e in dispatches if e["site"] == 0)
    assert int(site0["time_ns"]) == site0_ns
    sites = {row["site"]: row for row in read_csv(out / "sites.csv")}
    conv, relu = sites["convnet.py:21"], sites["convnet.py:22"]
    # The ledger's roofline split (dfit_mlir.analysis.ledger): the conv weighs its 194,400 MACs
    # against ridge x the 13,152 B it reads (1x32x32x3 input + 3x3x3x8 filter, f32) and
    # the 28,800 B the dispatch writes (1x30x30x8 f32, charged to the root); relu its
    # 14,400 FLOPs (bias add + max) against ridge x the 32 B bias it reads; the fill
    # reads nothing from outside. conv1 and relu1 occur in no other dispatch.
    ridge = 4.0
    weights = {"conv": max(194_400, ridge * (13_152 + 28_800)), "relu": max(14_400, ridge * 32)}
    assert site0["time_model"] == "roofline(ridge 4 MAC/B)"
    # The ledger splits in whole ns, the parts summing to the dispatch's time.
    assert float(conv["time_ns"]) == pytest.approx(site0_ns * weights["conv"] / sum(weights.values()), abs=1)
    assert float(relu["time_ns"]) == pytest.approx(site0_ns * weights["relu"] / sum(weights.values()), abs=1)
    assert float(site0["root_share"]) == pytest.approx(weights["conv"] / sum(weights.values()), abs=1e-6)
    # Static cost by hand: conv 1x30x30x8 outputs x 3x3x3 taps x 2; relu = add + max per element.
    assert int(conv["flops"]) == 2 * 30 * 30 * 8 * 3 * 3 * 3 == 388_800
    assert int(relu["flops"]) == 2 * 30 * 30 * 8 == 14_400
    assert (conv["module_paths"], relu["module_paths"]) == ("conv1", "relu1")
    # All dispatch time lands on sites; only queue/memory records stay unattributed.
    assert summary["attributed_time_ns"] == pytest.approx(sum(e["duration_ns"] for e in dispatches), abs=1e-3)
    assert sum(float(row["time_ns"]) for row in sites.values()) == pytest.approx(summary["attributed_time_ns"])
    rest = read_csv(out / "unattributed.csv")
    assert {row["kind"] for row in rest} <= {"queue", "memory"}
    # The queue execute encloses the dispatches: counting it would count their time twice.
    assert "host execute" not in {row["partition"] for row in rest}
    assert 0 < summary["attributed_time_pct"] < 100


def test_convnet_every_op_reaches_a_source_line(iree_bundles: dict[str, Path], tmp_path: Path) -> None:
    manifest = manifest_of(iree_bundles["manifest"])
    located = sum(1 for op in manifest["operators"] if op["source"])
    region_bodies = sum(1 for op in manifest["operators"] if not op["source"] and op["parent"] not in (None, "main"))
    assert located + region_bodies == 60  # region bodies without a location take their parent's line
    out, summary, notes = run(iree_bundles["manifest"], tmp_path)
    assert (summary["attributed_operators"], summary["attributed_operators_pct"]) == (60, 100.0)
    assert summary["operators_by_site_kind"] == {"source": 60}
    assert summary["attributed_time_pct"] is None and any("no measured execution time" in n for n in notes)
    sites = read_csv(out / "sites.csv")
    assert sites[0]["site"] == "convnet.py:24"  # conv2: the most FLOPs when nothing is timed
    assert int(sites[0]["flops"]) == 2 * 28 * 28 * 16 * 3 * 3 * 8 == 1_806_336


def test_lite_run_times_only_the_whole_function(iree_bundles: dict[str, Path], tmp_path: Path) -> None:
    bundle = iree_bundles["lite"]
    _, summary, _ = run(bundle, tmp_path)
    events = pq.read_table(bundle / "events.parquet").to_pylist()
    functions = [e for e in events if e["kind"] == "function"]
    # The queue events come from the lite run's separate profiled pass: nothing encloses them.
    queue = [e for e in events if e["kind"] == "queue"]
    # Each program event encloses its function, so only the functions count; queue
    # records that enclose other queue records (a submission around its execution) drop out.
    timed = summary["timed_events_by_kind"]
    assert set(timed) == {"function", "queue"} and timed["function"] == 3 and 0 < timed["queue"] <= len(queue)
    assert sum(e["duration_ns"] for e in functions) < summary["event_time_ns"] \
        <= sum(e["duration_ns"] for e in functions + queue)
    assert summary["attributed_time_pct"] == 0.0


def test_edgetpu_ops_are_attributed_through_tensor_names(edgetpu_bundle: Path, tmp_path: Path) -> None:
    manifest = manifest_of(edgetpu_bundle)
    named = [op for op in manifest["operators"] if op["name_path"]]
    assert len(named) == len(manifest["operators"]) == 257 and not any(op["source"] for op in manifest["operators"])
    out, summary, notes = run(edgetpu_bundle, tmp_path)
    assert (summary["attributed_operators"], summary["attributed_operators_pct"]) == (257, 100.0)
    assert summary["operators_by_site_kind"] == {"module": 257}
    assert summary["attributed_time_pct"] is None
    assert any("no op has a file:line" in note for note in notes)
    partitions = {row["kind"]: row for row in read_csv(out / "partitions.csv")}
    assert (partitions["edgetpu-custom-op"]["operators"], partitions["cpu"]["operators"]) == ("233", "23")
    # The top site by FLOPs is the largest convolution's output tensor name.
    top_conv = max((op for op in manifest["operators"] if op["flops"]), key=lambda op: op["flops"])
    assert read_csv(out / "sites.csv")[0]["site"] == ".".join(top_conv["name_path"])


def test_sambanova_unattributed_ops_are_listed_by_kind(sambanova_bundle: Path, tmp_path: Path) -> None:
    manifest = manifest_of(sambanova_bundle)
    nameless = Counter(op["op"] for op in manifest["operators"] if not op["name_path"] and not op["source"])
    assert nameless == {"sambanova.crossentropyloss": 4, "sambanova.air.Embedding": 1}
    out, summary, _ = run(sambanova_bundle, tmp_path)
    assert (summary["attributed_operators"], summary["operators"]) == (88, 93)
    rows = read_csv(out / "unattributed.csv")
    assert {row["kind"]: int(row["count"]) for row in rows if row["what"] == "op"} == nameless


def test_cerebras_skips_framework_frames(cerebras_bundle: Path, tmp_path: Path) -> None:
    manifest = manifest_of(cerebras_bundle)
    out, summary, _ = run(cerebras_bundle, tmp_path)
    # A frame outside torch/ (model code: transformers/..., the modelzoo trainer and
    # optimizer) anywhere in an op's call chain gives it a source site.
    user_files = [op for op in manifest["operators"]
                  if any(not frame["file"].startswith("torch/")
                         for frame in [*op["call_stack"], *([op["source"]] if op["source"] else [])])]
    unknown = [op for op in manifest["operators"] if not op["source"] and not op["name_path"]]
    assert summary["operators_by_site_kind"]["source"] == len(user_files) == 42
    assert summary["attributed_operators"] == 48 - len(unknown) == 42
    sites = read_csv(out / "sites.csv")
    # torch/nn/modules/linear.py is framework code: a Linear is ranked under the model
    # line that called it (the next frame of its call chain).
    assert not any(row["site"].startswith("torch/") and row["site_kind"] != "framework" for row in sites)
    query = next(row for row in sites if row["site"] == "transformers/models/bert/modeling_bert.py:245")
    assert query["site_kind"] == "source" and query["module_paths"] == "bert.encoder.layer.3.attention.self.query"
    assert int(query["flops"]) == 2 * 512 * 128 * 1024 * 1024  # the forward MatMul; its gradients have no FLOPs
    # Whole-program timings (log windows, job waits) belong to no op.
    assert summary["attributed_time_pct"] == 0.0
    assert {row["kind"] for row in read_csv(out / "unattributed.csv") if row["what"] == "event"} <= {"program", "queue"}


def test_unknown_options_are_refused(iree_bundles: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="semantic-attribution: unknown option 'top'; known: framework_code, model_code"):
        run(iree_bundles["manifest"], tmp_path, top="3")
