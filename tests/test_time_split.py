"""The measured time model (dfit_mlir.analysis.op_timing, issue 28): a fused dispatch's
time split by what its ops cost on this device.

SYNTHETIC units: the ledger reads cached standalone timings (``measured-standalone``),
falls back to per-element costs (``calibrated-elementwise``) and to the roofline, and
says which in ``time_model``. Slow: a Linear fused with GELU, SiLU or softmax (two
sizes each) compiled through the torch frontend and run; dfit's measured split of the
fused dispatch against the Linear and the activation compiled as their own models and
timed apart with ``dfit run``."""

from __future__ import annotations

import hashlib
import json
import statistics
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
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


# --- slow: fused Linear + activation against the parts timed apart --------------------------

#: (in, out) features and rows: 16x64 -> 128 and 128x256 -> 512 (the issue's small case
#: and one 8x bigger each way, both a few ms per 300 runs on this 2-core machine).
SIZES = ((16, 64, 128), (128, 256, 512))
ACTIVATIONS = ("gelu", "silu", "softmax")
#: Invocations per run (medians over them), one thread (local-sync: no thread pool noise).
REPEAT = 300
#: Absolute tolerance on the activation's share. dfit's split and the reference are both
#: proportions of standalone times, but of different compiles (the op cut out of the
#: fused model's input vs a torch model of that op alone) timed in different processes:
#: on this shared 2-core machine medians of 300 runs of a 2-10 us dispatch move by up
#: to ~10 % between processes (seen: 2 445 vs 2 610 ns for the same GELU), which moves a
#: 25 % share by ~0.04; 0.08 leaves room for two such moves. The roofline's GELU share
#: (~0.01) is off by 0.1-0.3: the check tells the two models apart. One process can be
#: off by far more (a 16x128 GELU alone at 2 864 ns in CI where it takes 1 200-1 700 ns;
#: under load average 7, 285 us against 78 us at 128x512): both sides are therefore the
#: least median of op_timing.ROUNDS separate runs.
TOLERANCE = 0.08


def _act(name: str) -> Any:
    import torch

    return {"gelu": torch.nn.GELU(), "silu": torch.nn.SiLU(), "softmax": torch.nn.Softmax(dim=-1)}[name]


def _dispatch_ns(bundle: Path) -> float:
    """Median over invocations of the summed dispatch durations."""
    events = [e for e in pq.read_table(bundle / "events.parquet").to_pylist() if e["kind"] == "dispatch"]
    per_run: dict[int, int] = {}
    for event in events:
        per_run[event["invocation"]] = per_run.get(event["invocation"], 0) + event["duration_ns"]
    return float(statistics.median(per_run.values()))


def _site_median_ns(bundle: Path, site: int) -> float:
    events = pq.read_table(bundle / "events.parquet").to_pylist()
    return float(statistics.median(e["duration_ns"] for e in events if e["kind"] == "dispatch" and e["site"] == site))


def _compile(module: Any, example: Any, folder: Path) -> Any:
    from dfit_mlir.frontends import torch as torch_frontend

    folder.mkdir(parents=True, exist_ok=True)
    return torch_frontend.compile(module.eval(), (example,), output=folder / "m.vmfb", mode="ids", quiet=True)


def _run(compiled: Any, folder: Path) -> Path:
    from dfit_mlir.runtime_hooks.run import run_bundle

    return run_bundle(compiled.vmfb, compiled.manifest_path, folder, mode="full", repeat=REPEAT,
                      warmup=20, driver="local-sync").bundle


def _timed_apart_ns(module: Any, example: Any, folder: Path) -> float:
    """The reference: ``module`` compiled as a model of its own and run ROUNDS times, the
    least of the runs' medians (the estimator dfit's standalone timings use, for the same
    reason: interference only adds time; see op_timing.ROUNDS)."""
    compiled = _compile(module, example, folder)
    return min(_dispatch_ns(_run(compiled, folder / f"run{i}")) for i in range(op_timing.ROUNDS))


@pytest.mark.slow
@pytest.mark.frontends
@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("rows,features,out", SIZES)
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_measured_split_against_the_parts_timed_apart(activation: str, rows: int, features: int, out: int,
                                                      tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setenv(op_timing.CACHE_DIR_ENV, str(tmp_path / "cache"))
    torch.manual_seed(0)
    linear = torch.nn.Linear(features, out)
    x = torch.randn(rows, features)
    fused_bundle = _run(_compile(torch.nn.Sequential(linear, _act(activation)), x, tmp_path / "fused"),
                        tmp_path / "fused" / "run")
    model = SemanticModel.open(fused_bundle)
    roofline = ledger.Ledger(model)
    timed = [p for p in model.partitions if p.kind == "dispatch" and roofline.partition_ns(p.id) > 0]
    (root,) = [p for p in timed if p.root_id and "linear" in p.root_id]
    act_ids = {i for p in timed for i in model.compute_ops(p) if "linear" not in i}
    fused = bool(act_ids & set(model.compute_ops(root)))  # GELU, SiLU: yes; a softmax gets its own dispatch

    def act_share(book: ledger.Ledger) -> float:
        """The activation's share of the model's attributed time (where it is fused, of
        the one dispatch that runs both)."""
        return sum(ns for op_id, ns in book.op_time().items() if op_id in act_ids) / book.attributed_time_ns

    roofline_share = act_share(roofline)
    report = op_timing.measure(model, timed, repeat=REPEAT, warmup=20, calibrate_elements=False)
    assert not report.failed, report.failed
    measured = ledger.Ledger(model)
    assert {measured.partition_summary(p)["time_model"] for p in timed} == {"measured-standalone"}
    share = act_share(measured)
    split = measured.partition_summary(root)["shares"]
    # The reference: the Linear and the activation as models of their own, timed apart.
    linear_ns = _timed_apart_ns(linear, x, tmp_path / "linear")
    act_ns = _timed_apart_ns(_act(activation), torch.randn(rows, out), tmp_path / "act")
    fused_ns = _site_median_ns(fused_bundle, root.attributes["site"])
    apart = act_ns / (linear_ns + act_ns)
    line = {"activation": activation, "shape": f"{rows}x{features}->{out}", "fused": fused, "dispatches": len(timed),
            "fused_ns": round(fused_ns), "linear_ns": linear_ns, "activation_ns": act_ns,
            "apart_share": round(apart, 4), "measured_share": round(share, 4),
            "roofline_share": round(roofline_share, 4),
            "fused_minus_linear": round(max(0.0, fused_ns - linear_ns) / fused_ns, 4)}
    print("TIME-SPLIT " + json.dumps(line))
    if not fused:
        # IREE 3.x on llvm-cpu keeps a softmax (a reduction) out of the matmul's dispatch:
        # each dispatch runs one op, so no model splits anything and the shares are the
        # run's own dispatch times. Recorded, not checked (their sums carry the machine's
        # preemption spikes); should IREE fuse it, the check below applies.
        assert split == {root.root_id: 1.0}
        return
    assert share == pytest.approx(apart, abs=TOLERANCE), line
    assert abs(roofline_share - apart) > abs(share - apart)
