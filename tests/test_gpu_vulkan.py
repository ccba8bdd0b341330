"""`dfit run` on IREE's Vulkan driver, tested on Mesa's software Vulkan (lavapipe: a
Vulkan 1.3 device on the CPU; Debian's ``mesa-vulkan-drivers`` + ``libvulkan1``).

Three small programs compiled with ``--iree-hal-target-device=vulkan`` (lavapipe takes
about a second per dispatch the first time a shader runs, so they are tiny): a 2-matmul
MLP, an ``scf.while`` whose trip count is an input (0 and 3 trips), and two entry points
sharing a callee (one deduplicated export at three call sites). Each run's dispatch
events come from the ``dispatch-events`` family (device timestamps), joined by the same
structural join as on the CPU: every one resolved to its call site and source IDs,
counts = call sites executed × invocations, device times > 0 and inside the device span
of the submission that ran them. A PyTorch model file through ``dfit compile model.py …
--iree-hal-target-device=vulkan``: each dispatch to its ``nn.Module``; its workgroups
and lavapipe's roof in program-analyzer; ``--tensors`` from device buffers against
PyTorch's values; ``dfit view`` of its bundle in headless Chromium. Skipped, saying why,
without a Vulkan loader or device.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from dfit_mlir.core.errors import InvalidInputError
from dfit_mlir.passes.instrumented_compile import CompileResult, compile_instrumented
from dfit_mlir.runtime_hooks import drivers, hal_profile
from dfit_mlir.runtime_hooks.run import run_bundle
from tests import test_view
from tests.conftest import same_by_family
from tests.test_view import no_console_errors, open_view

DFIT = [sys.executable, "-m", "dfit_mlir"]
VULKAN = ["--iree-hal-target-device=vulkan"]


def _no_vulkan() -> str | None:
    """Why Vulkan cannot run here, or ``None``."""
    try:
        import iree.runtime as rt

        if "vulkan" not in rt.query_available_drivers():
            return "this IREE runtime has no vulkan driver"
        if not rt.get_driver("vulkan").query_available_devices():
            return "the Vulkan loader finds no device (install mesa-vulkan-drivers for lavapipe)"
    except Exception as error:  # no libvulkan.so.1: the driver cannot be created
        return f"no Vulkan loader or device: {str(error).strip().splitlines()[0][:160]}"
    return None


pytestmark = pytest.mark.skipif(_no_vulkan() is not None, reason=str(_no_vulkan()))

MLP = """
func.func @main(%x: tensor<4x16xf32>, %w1: tensor<16x16xf32>, %w2: tensor<16x8xf32>) -> tensor<4x8xf32> {
  %z = arith.constant 0.0 : f32
  %e1 = tensor.empty() : tensor<4x16xf32>
  %f1 = linalg.fill ins(%z : f32) outs(%e1 : tensor<4x16xf32>) -> tensor<4x16xf32>
  %h = linalg.matmul ins(%x, %w1 : tensor<4x16xf32>, tensor<16x16xf32>) outs(%f1 : tensor<4x16xf32>) -> tensor<4x16xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>],
                       iterator_types = ["parallel", "parallel"]} ins(%h : tensor<4x16xf32>) outs(%e1 : tensor<4x16xf32>) {
  ^bb0(%a: f32, %o: f32):
    %m = arith.maximumf %a, %z : f32
    linalg.yield %m : f32
  } -> tensor<4x16xf32>
  %e2 = tensor.empty() : tensor<4x8xf32>
  %f2 = linalg.fill ins(%z : f32) outs(%e2 : tensor<4x8xf32>) -> tensor<4x8xf32>
  %y = linalg.matmul ins(%r, %w2 : tensor<4x16xf32>, tensor<16x8xf32>) outs(%f2 : tensor<4x8xf32>) -> tensor<4x8xf32>
  return %y : tensor<4x8xf32>
}
"""
MLP_INPUTS = ["4x16xf32=0.1", "16x16xf32=0.2", "16x8xf32=0.3"]

#: ``x`` doubled ``n`` times (``n``: an input, so the trip count is data), then exp.
LOOP = """
#vec = affine_map<(d0) -> (d0)>
func.func @loop(%n: i32, %x: tensor<16xf32>) -> tensor<16xf32> {
  %c0 = arith.constant 0 : i32
  %c1 = arith.constant 1 : i32
  %e = tensor.empty() : tensor<16xf32>
  %r:2 = scf.while (%i = %c0, %v = %x) : (i32, tensor<16xf32>) -> (i32, tensor<16xf32>) {
    %go = arith.cmpi slt, %i, %n : i32
    scf.condition(%go) %i, %v : i32, tensor<16xf32>
  } do {
  ^bb0(%i: i32, %v: tensor<16xf32>):
    %d = linalg.generic {indexing_maps = [#vec, #vec], iterator_types = ["parallel"]} ins(%v : tensor<16xf32>) outs(%e : tensor<16xf32>) {
    ^bb0(%a: f32, %o: f32):
      %t = arith.addf %a, %a : f32
      linalg.yield %t : f32
    } -> tensor<16xf32>
    %j = arith.addi %i, %c1 : i32
    scf.yield %j, %d : i32, tensor<16xf32>
  }
  %post = linalg.generic {indexing_maps = [#vec, #vec], iterator_types = ["parallel"]} ins(%r#1 : tensor<16xf32>) outs(%e : tensor<16xf32>) {
  ^bb0(%a: f32, %o: f32):
    %t = math.exp %a : f32
    linalg.yield %t : f32
  } -> tensor<16xf32>
  return %post : tensor<16xf32>
}
"""

#: ``@first`` calls ``@shared`` once, ``@second`` twice: one matmul export, three sites.
TWO_ENTRIES = """
#id = affine_map<(d0, d1) -> (d0, d1)>
func.func private @shared(%x: tensor<8x8xf32>) -> tensor<8x8xf32> {
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<8x8xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<8x8xf32>) -> tensor<8x8xf32>
  %m = linalg.matmul ins(%x, %x : tensor<8x8xf32>, tensor<8x8xf32>) outs(%f : tensor<8x8xf32>) -> tensor<8x8xf32>
  return %m : tensor<8x8xf32>
}
func.func @first(%x: tensor<8x8xf32>) -> tensor<8x8xf32> {
  %a = call @shared(%x) : (tensor<8x8xf32>) -> tensor<8x8xf32>
  %e = tensor.empty() : tensor<8x8xf32>
  %b = linalg.generic {indexing_maps = [#id, #id], iterator_types = ["parallel", "parallel"]} ins(%a : tensor<8x8xf32>) outs(%e : tensor<8x8xf32>) {
  ^bb0(%v: f32, %o: f32):
    %t = math.exp %v : f32
    linalg.yield %t : f32
  } -> tensor<8x8xf32>
  return %b : tensor<8x8xf32>
}
func.func @second(%x: tensor<8x8xf32>) -> tensor<8x8xf32> {
  %a = call @shared(%x) : (tensor<8x8xf32>) -> tensor<8x8xf32>
  %b = call @shared(%a) : (tensor<8x8xf32>) -> tensor<8x8xf32>
  return %b : tensor<8x8xf32>
}
"""


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, CompileResult]:
    root = tmp_path_factory.mktemp("vulkan")
    found = {}
    for name, text in (("mlp", MLP), ("loop", LOOP), ("two", TWO_ENTRIES)):
        source = root / f"{name}.mlir"
        source.write_text(text)
        found[name] = compile_instrumented(source, root / f"{name}.vmfb", mode="full", flags=VULKAN)
    return found


def dispatch_rows(bundle: Path) -> list[dict]:
    table = pq.read_table(bundle / "events.parquet").to_pylist()
    return [row for row in table if row["kind"] == "dispatch"]


def check_joined(bundle: Path, manifest: dict, expected: Counter, repeat: int) -> None:
    """Every dispatch event joined (site, root ID, the site's source IDs), counted as
    expected per invocation, device time > 0."""
    rows = dispatch_rows(bundle)
    sites = {site["index"]: site for site in manifest["partitions"]["dispatch_sites"]}
    assert all(row["site"] is not None and row["root_id"] for row in rows), rows
    assert all(sites[row["site"]]["ids"] and sites[row["site"]]["root_id"] == row["root_id"] for row in rows)
    assert all(row["duration_ns"] > 0 for row in rows)
    for k in range(repeat):
        assert Counter(row["root_id"] for row in rows if row["invocation"] == k) == expected, k
    summary = json.loads((bundle / "summary.json").read_text())
    assert summary["records"]["dispatch"] == sum(expected.values()) * repeat
    assert summary["profiling_families"] == list(drivers.CAPABILITIES["vulkan"].full)
    assert summary["clocks"]["dispatch"] == "device_tick fitted to iree_host_time_ns"
    assert summary["device"]["driver"] == "vulkan" and summary["device"]["compiled_for"] == ["vulkan"]


def test_mlp_full_run_joins_every_dispatch(programs: dict[str, CompileResult], tmp_path: Path) -> None:
    mlp = programs["mlp"]
    assert mlp.manifest["compile"]["codegen"]["target"] == {"device": "vulkan"}
    bundle = run_bundle(mlp.vmfb, None, tmp_path / "run", inputs=MLP_INPUTS, repeat=2, driver="vulkan://0").bundle
    check_joined(bundle, mlp.manifest, Counter({"main/linalg.matmul#0": 1, "main/linalg.matmul#1": 1}), 2)
    summary = json.loads((bundle / "summary.json").read_text())
    # vulkan://0 names the device by ordinal; IREE 3.13's Vulkan driver takes its path.
    assert summary["device"]["runtime_uri"].startswith("vulkan://GPU-")
    queue = [row for row in pq.read_table(bundle / "events.parquet").to_pylist() if row["kind"] == "queue"]
    device_spans = [row for row in queue if row["partition"] == "device execute"]
    assert len(device_spans) == 2 and all(json.loads(r["attributes"])["clock"] == "device_tick" for r in device_spans)
    # Host submissions and device spans on one timeline: each device span starts after
    # its submission was issued.
    issued = {json.loads(r["attributes"])["submission_id"]: r["start_ns"] for r in queue
              if r["partition"] == "submit execute"}
    assert all(r["start_ns"] >= issued[json.loads(r["attributes"])["submission_id"]] for r in device_spans)


def test_device_times_inside_their_submission(programs: dict[str, CompileResult]) -> None:
    """Each dispatch's device start/end, on the host clock, lies inside the device span
    of the command-buffer execution (same submission and buffer) that ran it."""
    mlp = programs["mlp"]
    profile = hal_profile.capture_profile(mlp.vmfb, MLP_INPUTS, driver="vulkan", function="main", invocations=1,
                                          families=drivers.CAPABILITIES["vulkan"].full)
    assert profile.clocks and profile.clocks[0].samples >= 2
    spans = {(r["submission_id"], r["command_buffer_id"]): r for r in profile.device_queue_events
             if r["op"] == "execute"}
    events = profile.dispatches
    assert len(events) == 2
    for event in events:
        span = spans[event.submission_id, event.command_buffer_id]
        assert event.duration_ns > 0
        assert span["start_host_time_ns"] <= event.start_ns < event.end_ns <= span["end_host_time_ns"], (event, span)
    joined = hal_profile.join_structural(profile.dispatch_records, mlp.manifest, "main", 1)
    assert [j.root_id for j in joined.invocations[0]] == ["main/linalg.matmul#0", "main/linalg.matmul#1"]


@pytest.mark.parametrize("trips", [0, 3])
def test_while_trip_count_from_an_input(programs: dict[str, CompileResult], trips: int, tmp_path: Path) -> None:
    loop = programs["loop"]
    bundle = run_bundle(loop.vmfb, None, tmp_path / "run", inputs=[str(trips), "16xf32=0.5"], repeat=2,
                        driver="vulkan").bundle
    body = Counter({"loop/scf.while#0/linalg.generic#0": trips}) if trips else Counter()
    check_joined(bundle, loop.manifest, body + Counter({"loop/linalg.generic#0": 1}), 2)


@pytest.mark.parametrize(("function", "calls"), [("first", 1), ("second", 2)])
def test_two_entry_points_sharing_a_callee(programs: dict[str, CompileResult], function: str, calls: int,
                                           tmp_path: Path) -> None:
    two = programs["two"]
    bundle = run_bundle(two.vmfb, None, tmp_path / "run", function=function, repeat=2, driver="vulkan").bundle
    check_joined(bundle, two.manifest, Counter({"shared/linalg.matmul#0": calls}), 2)
    # One deduplicated export serves the call sites; each event keeps its own site.
    sites = Counter(row["site"] for row in dispatch_rows(bundle))
    assert len(sites) == calls and set(sites.values()) == {2}


@pytest.mark.parametrize("mode", ["none", "ids", "lite"])
def test_in_process_modes(programs: dict[str, CompileResult], mode: str, tmp_path: Path) -> None:
    """none / ids / lite run the module in a Python child on the Vulkan device; lite's
    queue pass records dispatch-events + queue-events (the driver has no host-execution)."""
    mlp = programs["mlp"]
    summary = run_bundle(mlp.vmfb, None, tmp_path / "run", mode=mode, inputs=MLP_INPUTS, repeat=2,
                         driver="vulkan").summary
    assert summary["device"]["driver"] == "vulkan" and summary["invocation_ns"]["count"] == 2
    if mode == "lite":
        assert summary["queue_pass"]["families"] == ["dispatch-events", "queue-events"]
        assert summary["queue_pass"]["queue_events"] > 0


def test_wrong_or_absent_driver_is_one_line(programs: dict[str, CompileResult], tmp_path: Path) -> None:
    mlp = programs["mlp"]
    for driver, message in (("local-task", r"compiled for HAL device vulkan, not for --driver local-task"),
                            ("cuda", r"compiled for HAL device vulkan, not for --driver cuda"),
                            ("metal", r"the IREE runtime has no driver 'metal'"),
                            ("vulkan://7", r"the vulkan driver has no such device")):
        with pytest.raises(InvalidInputError, match=message):
            run_bundle(mlp.vmfb, None, tmp_path / driver.replace(":", "_").replace("/", "_"), driver=driver)
    result = subprocess.run([*DFIT, "run", str(mlp.vmfb), "--driver", "local-sync", "-o", str(tmp_path / "x")],
                            capture_output=True, text=True)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "vulkan" in result.stderr and "local-sync" in result.stderr


def test_capabilities_table_is_what_the_driver_answers(programs: dict[str, CompileResult]) -> None:
    """The table's rows for the drivers present here, asked of each driver."""
    mlp = programs["mlp"]
    answers = drivers.ask(mlp.vmfb, "vulkan", "main", 3)
    assert answers is not None
    row = drivers.CAPABILITIES["vulkan"]
    assert all(answers[family] for family in (*row.full, *row.lite))
    assert not any(answers[family] for family in row.unimplemented)


@pytest.mark.slow
def test_analyze_and_view_on_a_vulkan_bundle(programs: dict[str, CompileResult], tmp_path: Path) -> None:
    mlp = programs["mlp"]
    bundle = run_bundle(mlp.vmfb, None, tmp_path / "run", inputs=MLP_INPUTS, repeat=2, driver="vulkan").bundle
    analyzed = subprocess.run([*DFIT, "analyze", str(bundle), "--tool", "all"], capture_output=True, text=True)
    assert analyzed.returncode == 0, analyzed.stderr
    viewed = subprocess.run([*DFIT, "view", str(bundle), "-o", str(tmp_path / "view.html")], capture_output=True,
                            text=True)
    assert viewed.returncode == 0, viewed.stderr
    page = (tmp_path / "view.html").read_text()
    assert "main/linalg.matmul#1" in page
    # The Perfetto trace holds the device's dispatches and the host's queue work.
    trace = json.loads((bundle / "trace.json").read_text())
    names = {event.get("name") for event in (trace["traceEvents"] if isinstance(trace, dict) else trace)}
    assert {"queue device execute", "queue submit execute", "linalg.matmul main/linalg.matmul#1"} <= names, names


# --- a PyTorch model through `dfit compile model.py`, on the Vulkan device -----------------

TORCH_MODEL = """import torch


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def make_model():
    torch.manual_seed(0)
    return Tiny(), (torch.ones(2, 8),)
"""
TORCH_INPUT = "2x8xf32=1"
browser = test_view.browser  # headless Chromium, the fixture of the view's own browser tests
TORCH_MARKS = [pytest.mark.frontends,
               pytest.mark.filterwarnings("ignore:While compiling, we found certain side effects:UserWarning"),
               pytest.mark.filterwarnings("ignore::FutureWarning")]


def _torch_test(test: Any) -> Any:
    """A test of the PyTorch model (torch export's warnings are not errors here)."""
    for mark in TORCH_MARKS:
        test = mark(test)
    return test


def _compile_model_file(source: Path, output: Path, *extra: str) -> dict:
    from click.testing import CliRunner

    from dfit_mlir.cli.app import main
    from dfit_mlir.core.manifest import load

    result = CliRunner().invoke(main, ["compile", str(source), "--dfit-tag", "--mode", "full", *extra, "-o",
                                       str(output), *VULKAN])
    assert result.exit_code == 0, result.output
    return load(output.with_suffix(".manifest.json"))


@pytest.fixture(scope="module")
def torch_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The model compiled with ``dfit compile tiny.py … --iree-hal-target-device=vulkan``
    and run with ``--driver vulkan --mode full`` (2 invocations)."""
    pytest.importorskip("iree.turbine", reason="iree-turbine is not installed")
    root = tmp_path_factory.mktemp("torch-vulkan")
    source = root / "tiny.py"
    source.write_text(TORCH_MODEL)
    manifest = _compile_model_file(source, root / "tiny.vmfb")
    bundle = run_bundle(root / "tiny.vmfb", None, root / "run", inputs=[TORCH_INPUT], repeat=2, mode="full",
                        driver="vulkan").bundle
    return {"root": root, "source": source, "manifest": manifest, "bundle": bundle}


@_torch_test
def test_torch_model_file_every_dispatch_to_its_module(torch_run: dict) -> None:
    manifest, bundle = torch_run["manifest"], torch_run["bundle"]
    assert manifest["input"]["frontend"] == "torch" and manifest["compile"]["codegen"]["target"] == {"device": "vulkan"}
    check_joined(bundle, manifest, Counter({"main/torch.aten.linear#0": 1, "main/torch.aten.linear#1": 1}), 2)
    ops = {op["id"]: op for op in manifest["operators"]}
    sites = {site["index"]: site for site in manifest["partitions"]["dispatch_sites"]}
    rows = dispatch_rows(bundle)
    # Each event's site names source IDs whose ops carry the nn.Module path and the
    # model file's line.
    modules = {row["root_id"]: {ops[i]["module_path"] for i in sites[row["site"]]["ids"] if ops[i]["module_path"]}
               for row in rows}
    assert modules == {"main/torch.aten.linear#0": {"fc1"}, "main/torch.aten.linear#1": {"fc2"}}
    root_frames = [ops[row["root_id"]]["call_stack"] for row in rows]
    assert all(any(frame["file"] == str(torch_run["source"]) and frame["line"] == 11 for frame in stack)
               for stack in root_frames)
    assert all(ops[row["root_id"]]["module_class"] == "Linear" for row in rows)


@_torch_test
def test_workgroups_and_lavapipe_roof_in_program_analyzer(torch_run: dict, tmp_path: Path) -> None:
    """regions.csv has each dispatch's workgroup count as the driver recorded it (checked
    against a profile decoded here); the roof is lavapipe's, the host CPU calibrated."""
    from dfit_mlir.analysis.tools.session import analyze
    from tests.conftest import read_csv

    bundle, manifest = torch_run["bundle"], torch_run["manifest"]
    profile = hal_profile.capture_profile(torch_run["root"] / "tiny.vmfb", [TORCH_INPUT], driver="vulkan",
                                          function="main", invocations=1, families=("dispatch-events",))
    expected, products = {}, []
    for event in profile.dispatches:
        assert len(event.workgroup_count) == 3 and len(event.workgroup_size) == 3
        site = next(s for s in manifest["partitions"]["dispatch_sites"] if s["export"] == event.key)
        expected[f"site{site['index']}:{site['export']}"] = \
            f"{'x'.join(map(str, event.workgroup_count))} of {'x'.join(map(str, event.workgroup_size))}"
        products.append(event.workgroup_count[0] * event.workgroup_count[1] * event.workgroup_count[2])
    assert sorted(products) == [1, 2]
    assert all(int(size) >= 1 for text in expected.values() for size in text.split(" of ")[1].split("x"))
    analyze(bundle, ["program-analyzer"], tmp_path / "analysis")
    out = tmp_path / "analysis" / "program-analyzer"
    assert {row["region"]: row["workgroups"] for row in read_csv(out / "regions.csv")} == expected
    report = (out / "report.txt").read_text()
    assert "profile lavapipe (Mesa software Vulkan) on the host CPU (measured on this host)" in report, report


@_torch_test
def test_tensors_from_device_buffers(torch_run: dict, tmp_path: Path) -> None:
    """``--tensors`` on Vulkan: the HAL debug sink receives the traced device buffers in
    the in-process modes; their statistics and leading values are torch's own."""
    import torch

    from dfit_mlir.frontends import torch as torch_frontend
    from dfit_mlir.runtime_hooks.tensors import TensorPolicy

    _compile_model_file(torch_run["source"], tmp_path / "traced.vmfb", "--tensors", "*linear*")
    model, (x,) = torch_frontend.load_module_file(torch_run["source"])
    with torch.no_grad():
        hidden = model.fc1(x)
        reference = {"main/torch.aten.linear#0": hidden, "main/torch.aten.linear#1": model.fc2(torch.relu(hidden))}
    bundle = run_bundle(tmp_path / "traced.vmfb", None, tmp_path / "run", mode="ids", inputs=[TORCH_INPUT], repeat=2,
                        driver="vulkan", tensors=TensorPolicy(values=4)).bundle
    rows = [row for row in pq.read_table(bundle / "events.parquet").to_pylist() if row["kind"] == "tensor"]
    assert Counter(row["root_id"] for row in rows) == Counter({key: 2 for key in reference})
    for row in rows:
        want = reference[row["root_id"]]
        attributes = json.loads(row["attributes"])
        assert attributes["shape"] == list(want.shape) and attributes["dtype"] == "float32"
        assert row["tensor_min"] == pytest.approx(float(want.min()), abs=1e-5)
        assert row["tensor_max"] == pytest.approx(float(want.max()), abs=1e-5)
        assert row["tensor_mean"] == pytest.approx(float(want.mean()), abs=1e-5)
        assert attributes["values"] == pytest.approx(want.flatten()[:4].tolist(), abs=1e-5)
    # full runs under iree-run-module, which prints traced tensors: refused in one line.
    with pytest.raises(InvalidInputError, match="--tensors needs an in-process mode"):
        run_bundle(tmp_path / "traced.vmfb", None, tmp_path / "full", mode="full", inputs=[TORCH_INPUT],
                   driver="vulkan", tensors=TensorPolicy())


@_torch_test
def test_browser_view_of_a_vulkan_run(torch_run: dict, browser: Any, tmp_path: Path) -> None:
    """``dfit view`` of the Vulkan bundle in headless Chromium: one row per dispatch site
    with its device time (> 0), its workgroups and its ops; the roof is lavapipe's."""
    from selenium.webdriver.common.by import By

    bundle, manifest = torch_run["bundle"], torch_run["manifest"]
    open_view(browser, bundle, tmp_path)
    rows = browser.find_elements(By.CSS_SELECTOR, "tr.dispatch")
    sites = manifest["partitions"]["dispatch_sites"]
    assert len(rows) == len(sites) == 2
    heads = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "#dispatch-body th")]
    assert heads[3].startswith("time")  # "time ▼": the sorted column
    workgroups = next(n for n, head in enumerate(heads) if head.startswith("workgroups"))
    events = dispatch_rows(bundle)
    # Rows are sorted by time, and lavapipe's two matmuls take about as long: by export.
    site_of = {site["export"]: site for site in sites}
    shown = [[td.text for td in row.find_elements(By.CSS_SELECTOR, "td")] for row in rows]
    assert sorted(cells[1] for cells in shown) == sorted(site_of)
    for cells in shown:
        site = site_of[cells[1]]
        assert cells[2] == "2"
        device_ns = sum(e["duration_ns"] for e in events if e["site"] == site["index"])
        assert device_ns > 0 and cells[3] != "-" and cells[3].split()[-1] in ("ns", "µs", "ms")
        value, unit = cells[3].split()
        assert float(value) * {"ns": 1, "µs": 1e3, "ms": 1e6}[unit] == pytest.approx(device_ns, rel=0.01)
        shape = json.loads({e["attributes"] for e in events if e["site"] == site["index"]}.pop())
        assert cells[workgroups] == f"{'x'.join(map(str, shape['workgroup_count']))} of " \
            f"{'x'.join(map(str, shape['workgroup_size']))}"
        assert {e["workgroups"] for e in events if e["site"] == site["index"]}.pop() == \
            shape["workgroup_count"][0] * shape["workgroup_count"][1] * shape["workgroup_count"][2]
    caption = browser.find_element(By.CSS_SELECTOR, "#dispatch-body .roofline .empty").text
    assert caption.startswith("roof: lavapipe (Mesa software Vulkan) on the host CPU (measured on this host)")
    browser.save_screenshot(str(tmp_path / "vulkan-view.png"))
    no_console_errors(browser)


@pytest.mark.parametrize("program, function, inputs", [("mlp", "main", MLP_INPUTS),
                                                        ("loop", "loop", ["3", "16xf32=0.5"])])
def test_windowed_route_places_device_ticks_as_the_whole_run(programs: dict[str, CompileResult], tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch, program: str,
                                                              function: str, inputs: list[str]) -> None:
    """A long Vulkan run is read window by window (memory bounded by a window): its
    device-tick records (dispatch-events, queue-device-events) are placed with the whole
    profile's clock fit, kept by the index as it walks, and the events and the summary
    (the fit included) are the whole-run route's, with a window of about one flush so
    that the look-ahead crosses windows."""
    from dfit_mlir.core.event_pipeline import MemorySink, Policy
    from dfit_mlir.runtime_hooks import run

    monkeypatch.setattr(run, "WINDOW_RECORDS", 8)
    compiled, families = programs[program], tuple(drivers.CAPABILITIES["vulkan"].full)
    repeat, warmup = 6, 1
    profile = run._record_run(compiled.vmfb, inputs, "vulkan", function, repeat, warmup, families, tmp_path)
    windowed = run.WindowedRun.open(profile, compiled.manifest, function, repeat, warmup, families, "vulkan")
    whole = run._whole_run(profile, compiled.manifest, function, repeat, warmup, families, "vulkan")
    sinks = MemorySink(), MemorySink()
    counts = windowed.pipeline(compiled.manifest, Policy(batch_size=7), sinks[0]).close()
    assert whole.pipeline(compiled.manifest, Policy(batch_size=7), sinks[1]).close() == counts
    assert windowed.index.windows >= 4 and windowed.index.dispatch_family == "dispatch-events"
    tables = [sink.table().drop(["session"]) for sink in sinks]
    # Each family's events in the same order (the windowed route writes them window by window).
    assert tables[0].num_rows == tables[1].num_rows > 0 and same_by_family(tables[0], tables[1])
    kinds = set(tables[0].column("kind").to_pylist())
    assert {"dispatch", "queue", "memory"} <= kinds
    assert "device execute" in set(tables[0].column("partition").to_pylist())  # queue-device-events, placed
    summary = windowed.summary()
    assert summary.pop("profile_read")["route"] == "windowed"
    assert summary == whole.summary()
    assert summary["clocks"]["fits"] and summary["clocks"]["fits"][0]["samples"] >= 2


def test_a_vulkan_run_is_not_joined_while_the_tool_runs(programs: dict[str, CompileResult], tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU driver's dispatch records are timed in device ticks, placed with the whole
    profile's clock fit, which only the finished profile gives: the early join
    (``run.EarlyJoin``) stops at its first step, joining nothing, however much of the
    profile it is shown (here all of it, walked)."""
    import threading

    from dfit_mlir.core.event_pipeline import MemorySink, Policy
    from dfit_mlir.core.paged import PagedArrays
    from dfit_mlir.exporters.trace_plan import TraceLimit
    from dfit_mlir.runtime_hooks import profile_stream, run

    monkeypatch.setattr(run, "WINDOW_RECORDS", 8)
    compiled, families = programs["mlp"], tuple(drivers.CAPABILITIES["vulkan"].full)
    profile = run._record_run(compiled.vmfb, MLP_INPUTS, "vulkan", "main", 6, 1, families, tmp_path)
    walk = profile_stream._Walk(profile.path)
    walk.run()
    assert walk.device_ticks and profile_stream.index_so_far(walk, 8) is None
    early = run.EarlyJoin(compiled.manifest, "main", 6, 1, TraceLimit(None), PagedArrays(None))
    early.pipeline = run.new_pipeline(compiled.manifest, Policy(), MemorySink())
    early(walk, threading.Event())
    assert early.windows == 0 and early.unusable is None and "needs whole" in (early.stopped or "")
