"""The measured time model (dfit_mlir.analysis.op_timing, issue 28): a fused dispatch's
time split by what its ops cost on this device.

SYNTHETIC units: the ledger reads cached standalone timings (``measured-standalone``),
falls back to per-element costs (``calibrated-elementwise``) and to the roofline, and
says which in ``time_model``. Slow: a Linear fused with GELU, SiLU or softmax (two
sizes each) compiled through the torch frontend, run and taken apart: the split is the
cached standalone times' and far from the roofline's. How close it comes to the Linear and
the activation compiled as models of their own and timed apart is measured by
``benchmarks/time_split.py`` (a timing comparison: not a test's to assert)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from dfit_mlir.analysis import ledger, op_timing
from dfit_mlir.analysis.model import SemanticModel

# --- SYNTHETIC units --------------------------------------------------------------------------


def _model(tmp_path: Path) -> SemanticModel:
    """SYNTHETIC: one dispatch fusing a linear (root) and a gelu, run on local-sync here."""
    source = tmp_path / "m.mlir"
    source.write_text("// stand-in input\n")

    def op(name: str, macs: int | None, flops: int, shape: list[int]) -> dict[str, Any]:
        return {"id": f"main/torch.aten.{name}#0", "op": f"torch.aten.{name}", "macs": macs, "flops": flops,
                "bytes": None, "parent": "main", "operands": [{"shape": shape, "bytes": 4 * shape[0] * shape[1]}],
                "results": [{"shape": [16, 128], "bytes": 8192}]}

    model = SemanticModel({
        "capabilities": {"backend": "iree", "exposes": {}},
        "input": {"path": str(source), "sha256": hashlib.sha256(source.read_bytes()).hexdigest()},
        "compile": {"flags": ["--iree-llvmcpu-target-cpu=host"]},
        "operators": [op("linear", 131072, 262144, [16, 64]), op("gelu", None, 2048, [16, 128])],
        "tensors": [],
        "partitions": {"dispatch_sites": [{"index": 0, "export": "d0_matmul", "root_id": "main/torch.aten.linear#0",
                                           "fused_ids": ["main/torch.aten.linear#0", "main/torch.aten.gelu#0"],
                                           "ids": ["main/torch.aten.linear#0"], "function": "main"}]}})
    model.__dict__["summary"] = {"driver": "local-sync", "host": op_timing._host()}
    return model


def _cache(model: SemanticModel, standalone: dict[str, float], per_element: dict[str, float] | None = None,
           macs_per_ns: float | None = None) -> None:
    device = op_timing.device_of(model)
    assert device is not None
    key = op_timing.model_key(model)
    assert key is not None
    cache = op_timing.Cache(device)
    for op_id, ns in standalone.items():
        cache.ops[f"sig-{op_id}"] = {"ns": ns, "runs": 9, "op": op_id}
        cache.models.setdefault(key, {})[op_id] = {"signature": f"sig-{op_id}"}
    if per_element is not None:
        cache.calibration = {"ns_per_element": per_element, "macs_per_ns": macs_per_ns}
    cache.save()


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv(op_timing.CACHE_DIR_ENV, str(folder))
    return folder


def _split(model: SemanticModel) -> dict[str, Any]:
    return ledger.Ledger(model).partition_summary(model.partitions[0])


def test_without_measurements_the_roofline_splits(cache_dir: Path, tmp_path: Path) -> None:
    """SYNTHETIC: no cache for the device: the roofline, as before (linear 131 072 MACs;
    GELU 4 MAC/B x its 16 KiB of operand + result bytes, no tensor graph here)."""
    summary = _split(_model(tmp_path))
    assert summary["time_model"].startswith("roofline")
    assert summary["shares"]["main/torch.aten.gelu#0"] == pytest.approx(65536 / (131072 + 65536))


def test_standalone_timings_split_the_dispatch(cache_dir: Path, tmp_path: Path) -> None:
    """SYNTHETIC: both ops timed alone (7 000 and 2 500 ns): shares 7000/9500, 2500/9500."""
    model = _model(tmp_path)
    _cache(model, {"main/torch.aten.linear#0": 7000.0, "main/torch.aten.gelu#0": 2500.0})
    summary = _split(model)
    assert summary["time_model"] == "measured-standalone"
    assert summary["shares"]["main/torch.aten.gelu#0"] == pytest.approx(2500 / 9500)
    rows = ledger.Ledger(model).entries.to_pylist()
    assert {row["time_model"] for row in rows} == {"measured-standalone"}


def test_an_explicit_time_model_ignores_the_measurements(cache_dir: Path, tmp_path: Path) -> None:
    model = _model(tmp_path)
    _cache(model, {"main/torch.aten.linear#0": 7000.0, "main/torch.aten.gelu#0": 2500.0})
    book = ledger.Ledger(model, time_model=ledger.TimeModel("roofline", 4.0, "test"))
    assert book.partition_summary(model.partitions[0])["time_model"].startswith("roofline")


def test_per_element_costs_weigh_an_op_not_timed_alone(cache_dir: Path, tmp_path: Path) -> None:
    """SYNTHETIC: the linear timed (7 000 ns), the GELU not: 2048 elements x 1.2 ns."""
    model = _model(tmp_path)
    _cache(model, {"main/torch.aten.linear#0": 7000.0}, {"gelu": 1.2}, macs_per_ns=20.0)
    summary = _split(model)
    assert summary["time_model"] == "calibrated-elementwise"
    assert summary["shares"]["main/torch.aten.gelu#0"] == pytest.approx(2048 * 1.2 / (7000 + 2048 * 1.2))


def test_per_element_costs_with_the_roofline_in_ns(cache_dir: Path, tmp_path: Path) -> None:
    """SYNTHETIC: nothing timed alone: the linear's roofline weight (131 072 MACs, above
    4 MAC/B x its 12 KiB) over 20 MACs/ns, the GELU 2048 x 1.2 ns."""
    model = _model(tmp_path)
    _cache(model, {}, {"gelu": 1.2}, macs_per_ns=20.0)
    summary = _split(model)
    assert summary["time_model"] == "calibrated-elementwise"
    linear_ns = 131072 / 20.0
    assert summary["shares"]["main/torch.aten.gelu#0"] == pytest.approx(2048 * 1.2 / (linear_ns + 2048 * 1.2))


def test_kinds_by_name() -> None:
    assert op_timing.base_kind("torch.aten.add.Tensor") == "add"
    assert op_timing.base_kind("stablehlo.exponential") == "exp"
    assert op_timing.base_kind("math.erf") == "erf"
    assert op_timing.base_kind("torch.aten._softmax") == "softmax"
    assert op_timing.base_kind("onnx.LayerNormalization") == "layer_norm"
    assert op_timing.base_kind("onnx.Gemm") is None
    assert op_timing.base_kind("torch.aten.linear") is None


def test_a_changed_input_is_not_cut(tmp_path: Path) -> None:
    model = _model(tmp_path)
    Path(model.manifest["input"]["path"]).write_text("// edited\n")
    (cut,) = op_timing.standalone_modules(model, ["main/torch.aten.gelu#0"]).values()
    assert cut.text is None and "changed" in (cut.reason or "")


# --- slow: a fused Linear + activation, compiled, run and taken apart ------------------------

#: (rows, in features, out features): the issue's small case and one 8x bigger each way.
SIZES = ((16, 64, 128), (128, 256, 512))
ACTIVATIONS = ("gelu", "silu", "softmax")
#: Invocations per run (medians over them), one thread (local-sync: no thread pool noise).
REPEAT = 300
#: How much more of the fused dispatch the measured split gives the activation than the
#: roofline does, at least. The roofline gives an erf-GELU or a SiLU 1.1 % (16x64 -> 128)
#: and 0.39 % (128x256 -> 512) of the dispatch; timed apart they take 16-46 % and 6-12 %
#: (benchmarks/RESULTS.md, "Time split of a fused dispatch"): 15-40x. How close dfit's
#: split comes to the parts timed apart is a comparison of microsecond timings across
#: processes, which this shared machine moves by up to 0.1 in share (seen in two suite
#: runs): it is measured by ``benchmarks/time_split.py``, not asserted here.
ABOVE_ROOFLINE = 5.0


def _act(name: str) -> Any:
    import torch

    return {"gelu": torch.nn.GELU(), "silu": torch.nn.SiLU(), "softmax": torch.nn.Softmax(dim=-1)}[name]


def _compile_and_run(module: Any, example: Any, folder: Path) -> Path:
    from dfit_mlir.frontends import torch as torch_frontend
    from dfit_mlir.runtime_hooks.run import run_bundle

    folder.mkdir(parents=True, exist_ok=True)
    compiled = torch_frontend.compile(module.eval(), (example,), output=folder / "m.vmfb", mode="ids", quiet=True)
    return run_bundle(compiled.vmfb, compiled.manifest_path, folder / "run", mode="full", repeat=REPEAT,
                      warmup=20, driver="local-sync").bundle


@pytest.mark.slow
@pytest.mark.frontends
@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("rows,features,out", SIZES)
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_a_fused_dispatch_is_split_by_its_ops_timed_alone(activation: str, rows: int, features: int, out: int,
                                                          tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ops of the fused dispatch are cut out, compiled and timed alone (each the least
    median of op_timing.ROUNDS runs, all kept in the cache), and the ledger splits the
    dispatch exactly in the cached proportions; the activation then weighs far more than
    the roofline gave it. A softmax gets a dispatch of its own: nothing to split."""
    import torch

    monkeypatch.setenv(op_timing.CACHE_DIR_ENV, str(tmp_path / "cache"))
    torch.manual_seed(0)
    model = SemanticModel.open(_compile_and_run(
        torch.nn.Sequential(torch.nn.Linear(features, out), _act(activation)), torch.randn(rows, features), tmp_path))
    roofline = ledger.Ledger(model)
    timed = [p for p in model.partitions if p.kind == "dispatch" and roofline.partition_ns(p.id) > 0]
    (root,) = [p for p in timed if p.root_id and "linear" in p.root_id]
    act_ids = {i for p in timed for i in model.compute_ops(p) if "linear" not in i}
    assert act_ids, [model.compute_ops(p) for p in timed]
    fused = bool(act_ids & set(model.compute_ops(root)))
    assert fused == (activation != "softmax")  # IREE 3.x on llvm-cpu keeps a reduction out of the matmul's dispatch

    def act_share(book: ledger.Ledger) -> float:
        return sum(ns for op_id, ns in book.op_time().items() if op_id in act_ids) / book.attributed_time_ns

    roofline_share = act_share(roofline)  # before the measurements exist (the ledger reads them lazily)
    report = op_timing.measure(model, timed, repeat=REPEAT, warmup=20, calibrate_elements=False)
    assert not report.failed, report.failed
    assert set(report.measured) == {i for p in timed for i in model.compute_ops(p)}
    device = op_timing.device_of(model)
    key = op_timing.model_key(model)
    assert device is not None and key is not None
    cache = op_timing.Cache.load(device)
    entries = {op_id: cache.ops[cache.models[key][op_id]["signature"]] for op_id in report.measured}
    for op_id, entry in entries.items():
        assert len(entry["round_ns"]) == op_timing.ROUNDS and entry["ns"] == min(entry["round_ns"]) > 0, op_id
        assert entry["runs"] == REPEAT and entry["dispatches"] >= 1, (op_id, entry)

    measured = ledger.Ledger(model)
    assert {measured.partition_summary(p)["time_model"] for p in timed} == {"measured-standalone"}
    split = measured.partition_summary(root)["shares"]
    if not fused:
        assert split == {root.root_id: 1.0}
        return
    total = sum(entries[op_id]["ns"] for op_id in model.compute_ops(root))
    assert split == pytest.approx({op_id: entries[op_id]["ns"] / total for op_id in model.compute_ops(root)})
    assert act_share(measured) > ABOVE_ROOFLINE * roofline_share, (act_share(measured), roofline_share)
