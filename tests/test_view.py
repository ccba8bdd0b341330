"""``dfit view``: the page's tables on real bundles (the convnet compiled and run, the
reconstructed Edge TPU yolov8n) and the page itself driven in headless Chromium.

Expected highlights are derived here from the manifest (its partitions' member IDs) and
the project's site rule (``op_site``), never from the page's own data."""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from dfit_mlir.analysis import ledger
from dfit_mlir.analysis.model import SemanticModel
from dfit_mlir.analysis.tools.builtin.semantic_attribution import op_site
from dfit_mlir.cli.app import main
from dfit_mlir.core import module_paths
from dfit_mlir.views import html

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")


# --- expectations from the manifest ------------------------------------------------------

def manifest_partitions(model: SemanticModel) -> list[set[str]]:
    """Member IDs of every partition, in the manifest's order (dispatch sites, then groups)."""
    parts = model.manifest["partitions"]
    found = [set(site["fused_ids"] or site["ids"]) for site in parts.get("dispatch_sites", [])]
    return found + [set(group["operator_ids"]) for group in parts.get("groups", [])]


def site_ops(model: SemanticModel) -> dict[str, set[str]]:
    """Site key (``file:line`` or node name) → its op IDs, by the project's site rule."""
    found: dict[str, set[str]] = defaultdict(set)
    for op in model.operators.values():
        site = op_site(model, op)
        if site is not None:
            found[site[0]].add(op.id)
    return found


def dispatches_of(model: SemanticModel, ids: set[str]) -> set[str]:
    return {str(n) for n, members in enumerate(manifest_partitions(model)) if members & ids}


def lines_of(model: SemanticModel, members: set[str]) -> set[str]:
    return {site for site, ids in site_ops(model).items() if ids & members}


# --- the tables -----------------------------------------------------------------------------

def test_tables_of_the_convnet_run_agree_with_its_events(iree_bundles: dict[str, Path]) -> None:
    import pyarrow.parquet as pq

    model = SemanticModel.open(iree_bundles["full"])
    data = html.view_data(model)
    book = ledger.of(model)
    assert data["weight"] == "time" and data["measured_ns"] == book.totals.measured_ns > 0
    assert len(set(data["strings"])) == len(data["strings"]), "strings are interned once"
    # The convnet's own source file is embedded verbatim.
    [embedded] = data["files"]
    source = Path(model.operators["main"].source["file"])
    assert embedded["text"] == (source if source.is_absolute() else Path.cwd() / source).read_text()
    # Per-invocation figures: recounted from events.parquet, summed per (site, invocation).
    events = pq.read_table(iree_bundles["full"] / "events.parquet").to_pylist()
    per_call: dict[tuple[int, int], int] = defaultdict(int)
    for event in events:
        if event["kind"] == "dispatch" and event["site"] is not None:
            per_call[(event["site"], event["invocation"])] += event["duration_ns"]
    table = data["dispatches"]
    for site in range(len(table["name"])):
        times = [ns for (s, _), ns in per_call.items() if s == site]
        assert table["min"][site] == min(times) and table["max"][site] == max(times)
        assert table["median"][site] == statistics.median(times)
        assert table["time"][site] == pytest.approx(sum(times))
    # Gutter figures: op times are the ledger's; their sum is what the ledger attributed.
    assert sum(data["ops"]["time"]) == pytest.approx(book.totals.attributed_ns, rel=1e-6)
    assert sum(data["dispatches"]["flops"]) == pytest.approx(data["total_flops"])


def test_compile_manifest_without_a_run_weighs_by_flops(iree_bundles: dict[str, Path]) -> None:
    model = SemanticModel.open(iree_bundles["manifest"])
    data = html.view_data(model)
    assert data["weight"] == "flops" and data["measured_ns"] == 0
    assert data["dispatches"]["median"] == [None] * len(model.partitions)
    assert data["total_flops"] == sum(op.flops or 0 for op in model.operators.values()
                                      if any(op.id in m for m in manifest_partitions(model)))


def test_lite_bundle_and_edgetpu_reconstruction_render(iree_bundles: dict[str, Path], edgetpu_bundle: Path) -> None:
    for bundle in (iree_bundles["lite"], edgetpu_bundle):
        text = html.render(bundle)
        assert "/*DFIT_VIEW_DATA*/null" not in text
        assert "<script src" not in text and "<link" not in text and "http://" not in text.split("<script>")[0]
    data = html.view_data(SemanticModel.open(edgetpu_bundle))
    assert data["files"] == []  # TFLite: no source files, a node-name tree
    names = {data["strings"][i] for i in data["sites"]["name"]}
    assert names == set(site_ops(SemanticModel.open(edgetpu_bundle)))


def test_cli_writes_atomically_and_refuses_what_it_did_not_write(iree_bundles: dict[str, Path],
                                                                 tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "view.html"
    first = runner.invoke(main, ["view", str(iree_bundles["full"]), "-o", str(out)])
    assert first.exit_code == 0, first.output
    again = runner.invoke(main, ["view", str(iree_bundles["full"]), "-o", str(out)])
    assert again.exit_code == 0, again.output  # dfit's own output: replaced
    mine = tmp_path / "mine.html"
    mine.write_text("my notes")
    refused = runner.invoke(main, ["view", str(iree_bundles["full"]), "-o", str(mine)])
    assert refused.exit_code == 2 and "refusing to overwrite" in refused.output
    assert mine.read_text() == "my notes"
    missing = runner.invoke(main, ["view", str(tmp_path / "nothing"), "-o", str(tmp_path / "x.html")])
    assert missing.exit_code == 2 and missing.output.startswith("dfit: ") and "Traceback" not in missing.output
    assert not (tmp_path / "x.html").exists()


def test_model_explorer_flag_serves_the_bundle(iree_bundles: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """``--model-explorer`` hands the bundle to the adapter's server (stood in for here:
    the real server is tested in tests/test_explorer_adapter.py); without Model Explorer
    installed it says how to install it (exit 3)."""
    import builtins
    import sys

    from dfit_mlir.views import explorer_adapter

    served: list[Path] = []
    monkeypatch.setattr(explorer_adapter, "serve", served.append)
    result = CliRunner().invoke(main, ["view", "--model-explorer", str(iree_bundles["full"])])
    assert result.exit_code == 0, result.output
    assert served == [iree_bundles["full"]]
    monkeypatch.undo()

    real_import = builtins.__import__

    def no_model_explorer(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.split(".")[0] == "model_explorer":
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_model_explorer)
    for name in [m for m in sys.modules if m.split(".")[0] == "model_explorer"]:
        monkeypatch.delitem(sys.modules, name)
    result = CliRunner().invoke(main, ["view", "--model-explorer", str(iree_bundles["full"])])
    assert result.exit_code == 3 and "Model Explorer is not installed (pip install ai-edge-model-explorer" in result.output, result.output


# --- in a real browser ------------------------------------------------------------------

@pytest.fixture(scope="module")
def browser() -> Any:
    driver = chromium()
    yield driver
    driver.quit()


def chromium() -> Any:
    """Debian's headless Chromium through Selenium, logging the page's console (skips,
    saying why, where either is absent)."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
    if not CHROMIUM.is_file() or not CHROMEDRIVER.is_file():
        pytest.skip(f"{CHROMIUM} / {CHROMEDRIVER} absent (Debian packages chromium, chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=webdriver.ChromeService(executable_path=str(CHROMEDRIVER)), options=options)


def open_view(browser: Any, bundle: Path, tmp_path: Path, fragment: str = "") -> Path:
    page = tmp_path / "view.html"
    page.write_text(html.render(bundle), encoding="utf-8")
    browser.get_log("browser")  # drop what earlier pages logged
    browser.get(page.as_uri() + fragment)
    return page


def click(browser: Any, element: Any) -> None:
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", element)
    element.click()


def highlighted(browser: Any, selector: str, attribute: str) -> set[str]:
    from selenium.webdriver.common.by import By

    return {e.get_attribute(attribute) for e in browser.find_elements(By.CSS_SELECTOR, selector + ".hl")}


def no_console_errors(browser: Any) -> None:
    errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert not errors, errors


def check_lines_light_their_dispatches(browser: Any, model: SemanticModel) -> int:
    from selenium.webdriver.common.by import By

    sites = site_ops(model)
    rows = browser.find_elements(By.CSS_SELECTOR, "#source .line.has")
    assert {row.get_attribute("data-line") for row in rows} == set(sites)
    for row in rows:
        key = row.get_attribute("data-line")
        click(browser, row)
        assert highlighted(browser, "tr.dispatch", "data-dispatch") == dispatches_of(model, sites[key]), key
        assert browser.current_url.endswith("#line=" + _quoted(key))
    return len(rows)


def check_dispatches_light_their_lines(browser: Any, model: SemanticModel) -> None:
    from selenium.webdriver.common.by import By

    parts = manifest_partitions(model)
    for row in browser.find_elements(By.CSS_SELECTOR, "tr.dispatch"):
        index = int(row.get_attribute("data-dispatch"))
        click(browser, row)
        assert highlighted(browser, "#source [data-line]", "data-line") == lines_of(model, parts[index]), index


def _quoted(text: str) -> str:
    from urllib.parse import quote

    return quote(text, safe="-_.!~*'()")  # what encodeURIComponent leaves alone


def test_browser_convnet_run(browser: Any, iree_bundles: dict[str, Path], tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    model = SemanticModel.open(iree_bundles["full"])
    open_view(browser, iree_bundles["full"], tmp_path)
    assert check_lines_light_their_dispatches(browser, model) > 5
    check_dispatches_light_their_lines(browser, model)
    browser.save_screenshot(str(tmp_path / "convnet-dispatch.png"))
    # A shared link: the fragment selects the op; the stages panel has one row per phase.
    conv = next(op.id for op in model.operators.values() if op.kind.startswith("conv_2d"))
    open_view(browser, iree_bundles["full"], tmp_path, "#op=" + _quoted(conv))
    stages = [row.get_attribute("data-stage") for row in browser.find_elements(By.CSS_SELECTOR, "tr.stage-row")]
    assert stages == model.manifest["lineage"]["stages"] and len(stages) == 13
    cells = [c.text for c in browser.find_elements(By.CSS_SELECTOR, "tr.stage-row td.cell")]
    assert cells == list(model.lineage(conv).values())
    assert highlighted(browser, "tr.dispatch", "data-dispatch") == dispatches_of(model, {conv})
    browser.save_screenshot(str(tmp_path / "convnet-op.png"))
    assert (tmp_path / "convnet-op.png").stat().st_size > 10_000
    no_console_errors(browser)


@pytest.mark.heavy  # 40-70 s in the browser (Edge TPU view); the other browser checks stay in make test
def test_browser_edgetpu_reconstruction(browser: Any, edgetpu_bundle: Path, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    model = SemanticModel.open(edgetpu_bundle)
    open_view(browser, edgetpu_bundle, tmp_path)
    assert check_lines_light_their_dispatches(browser, model) > 20
    check_dispatches_light_their_lines(browser, model)
    stages = [row.get_attribute("data-stage") for row in browser.find_elements(By.CSS_SELECTOR, "tr.stage-row")]
    assert stages == model.manifest["lineage"]["stages"]
    # The module icicle: clicking a module lights the node rows of its ops.
    module = browser.find_elements(By.CSS_SELECTOR, ".mod")[1]
    click(browser, module)
    path = module.get_attribute("data-module")
    members = {op.id for op in model.operators.values()
               if model.module_path(op.id) is not None and path in module_paths.ancestry(model.module_path(op.id))}
    assert members and highlighted(browser, "#source [data-line]", "data-line") == lines_of(model, members)
    # Double-click zooms the icicle into the module: it becomes the first, full-width box.
    from selenium.webdriver.common.action_chains import ActionChains

    ActionChains(browser).double_click(module).perform()
    boxes = browser.find_elements(By.CSS_SELECTOR, ".mod")
    assert boxes[0].get_attribute("data-module") == path
    assert all(path in module_paths.ancestry(box.get_attribute("data-module")) for box in boxes)
    browser.save_screenshot(str(tmp_path / "edgetpu.png"))
    no_console_errors(browser)


@pytest.mark.parametrize("name", ["sambanova", "cerebras", "iree-lite"])
def test_browser_other_bundles_link_and_log_no_error(browser: Any, request: pytest.FixtureRequest, name: str,
                                                     tmp_path: Path) -> None:
    """Reconstructed SambaNova / Cerebras bundles and a lite run: whatever each has is
    shown and linked; nothing the bundle lacks breaks the page."""
    from selenium.webdriver.common.by import By

    from tests.conftest import bundle_path

    bundle = bundle_path(request, name)
    model = SemanticModel.open(bundle)
    open_view(browser, bundle, tmp_path)
    assert check_lines_light_their_dispatches(browser, model) > 0
    check_dispatches_light_their_lines(browser, model)
    assert browser.find_elements(By.CSS_SELECTOR, "#icicle .mod")  # op counts where nothing is timed
    browser.save_screenshot(str(tmp_path / f"{name}.png"))
    no_console_errors(browser)


@pytest.mark.frontends
@pytest.mark.slow
@pytest.mark.heavy
@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.filterwarnings("ignore:While compiling, we found certain side effects:UserWarning")
def test_browser_bert_run_with_pass_history(browser: Any, tmp_path: Path) -> None:
    """A transformers BERT (random weights) compiled with pass-level lineage and run:
    its modeling_bert.py lines link to the dispatches carrying their ops, and the stages
    panel names the passes the manifest's pass_history records for the selected op."""
    from selenium.webdriver.common.by import By

    from dfit_mlir.frontends import torch as torch_frontend
    from dfit_mlir.passes.pass_history import from_table
    from dfit_mlir.runtime_hooks.run import run_bundle
    from tests import frontend_models

    torch_model, args = frontend_models.bert()
    compiled = torch_frontend.compile(torch_model, args, output=tmp_path / "bert.vmfb", mode="full",
                                      lineage_detail="passes")
    ids = f"1x{frontend_models.BERT_SEQ}xi64=" + ",".join(str(int(v)) for v in args[0].flatten())
    bundle = run_bundle(compiled.vmfb, compiled.manifest_path, tmp_path / "run", mode="full", inputs=(ids,),
                        repeat=2, warmup=1).bundle
    model = SemanticModel.open(bundle)
    open_view(browser, bundle, tmp_path)
    assert any(name.endswith("modeling_bert.py") for name in
               (e.text for e in browser.find_elements(By.CSS_SELECTOR, ".src-file")))
    assert check_lines_light_their_dispatches(browser, model) > 10
    check_dispatches_light_their_lines(browser, model)
    changes = from_table(model.manifest["pass_history"])
    gelu = next(op.id for op in model.operators.values() if op.op == "torch.aten.gelu")
    open_view(browser, bundle, tmp_path, "#op=" + _quoted(gelu))
    shown = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "tr.stage-row td.cell .pass")]
    expected = [f"{c.pass_name}: {c.before}→{c.after}" for c in changes if c.id == gelu
                and c.phase in model.manifest["lineage"]["stages"]]
    assert expected and sorted(shown) == sorted(expected)
    browser.save_screenshot(str(tmp_path / "bert.png"))
    no_console_errors(browser)


# --- roofline position, links from the traces, the node-name tree (issue 21) ----------------

F32 = 4
#: The convnet's first conv dispatch (conv + bias + ReLU), counted by hand as in
#: tests/test_tool_program_analyzer.py: input, filter, bias and output bytes.
CONV1_MACS = 30 * 30 * 8 * (3 * 3 * 3)
CONV1_BYTES = (1 * 32 * 32 * 3 + 3 * 3 * 3 * 8 + 8 + 1 * 30 * 30 * 8) * F32


def _host_roof(summary: dict[str, Any]) -> tuple[float, Any]:
    """(Peak FLOP/s, bytes → bandwidth roof) of this host, read from its calibration
    (measured once per session and cached), independently of the view's code."""
    from dfit_mlir.analysis import calibration

    cal = calibration.calibrate(threads=calibration.threads_of_run(summary)[0])

    def bandwidth(moved: int) -> float:
        return max([cal.memory_bandwidth_bytes_per_s] + [r.bandwidth_bytes_per_s for r in cal.cache_roofs
                                                         if moved <= r.capacity_bytes])

    return 2 * cal.peak_macs_per_s, bandwidth


def test_roofline_of_the_convnet_run_recounted(iree_bundles: dict[str, Path], tmp_path: Path) -> None:
    """Intensity, attained FLOP/s and B/s, the roof and its % recounted from the hand
    count of conv1's bytes, events.parquet and the host's calibration; the class is
    program-analyzer's (its regions.csv, through the tool itself)."""
    import pyarrow.parquet as pq

    from dfit_mlir.analysis.tools.session import analyze
    from tests.conftest import read_csv

    model = SemanticModel.open(iree_bundles["full"])
    data = html.view_data(model)
    R, book = data["roofline"], ledger.of(model)
    peak, bandwidth = _host_roof(model.summary)
    assert data["roof"]["peak"] == pytest.approx(peak) and data["roof"]["basis"] == "measured on this host"
    events = pq.read_table(iree_bundles["full"] / "events.parquet").to_pylist()
    # program-analyzer's point in FLOP terms: 2 FLOPs per MAC (its regions.csv is in MACs).
    macs = {row["partition"]: row["macs"] or 0 for row in book.rollup("partition").to_pylist()}
    placed = 0
    for site, part in enumerate(model.partitions):
        durations = [e["duration_ns"] for e in events if e["kind"] == "dispatch" and e["site"] == site]
        moved = book.bytes_moved(part)[0]
        if site == 0:
            assert moved == CONV1_BYTES and macs[part.id] == CONV1_MACS
        work = 2 * macs[part.id]
        if not work:  # elementwise only: no MAC, no point (program-analyzer plots none either)
            assert R["intensity"][site] == 0 and R["pct"][site] is None
            continue
        placed += 1
        intensity = work / moved
        attained = work * len(durations) / (sum(durations) * 1e-9)
        roof = min(peak, intensity * bandwidth(moved))
        assert R["intensity"][site] == pytest.approx(intensity, abs=1e-3)
        assert R["flops_per_s"][site] == pytest.approx(attained, rel=1e-6)
        assert R["bytes_per_s"][site] == pytest.approx(moved * len(durations) / (sum(durations) * 1e-9), rel=1e-6)
        assert R["roof"][site] == pytest.approx(roof, rel=1e-6)
        assert R["pct"][site] == pytest.approx(100 * attained / roof, abs=1e-3)
    assert placed >= 4
    out = tmp_path / "analysis"
    analyze(iree_bundles["full"], ["program-analyzer"], out)
    region_rows = read_csv(out / "program-analyzer" / "regions.csv")
    regions = {row["region"]: row["boundness"] for row in region_rows}
    for row in region_rows:  # the same point, in MACs there
        site = [p.id for p in model.partitions].index(row["region"])
        if row["intensity"] and float(row["intensity"]):
            assert R["intensity"][site] == pytest.approx(2 * float(row["intensity"]), abs=1e-3)
    assert [data["strings"][b] for b in R["bound"]] == [regions[p.id] for p in model.partitions]
    # A compile manifest: intensity and class only, nothing timed.
    static = html.view_data(SemanticModel.open(iree_bundles["manifest"]))["roofline"]
    assert static["intensity"] == pytest.approx(R["intensity"], abs=1e-3)
    assert static["flops_per_s"] == static["pct"] == static["bytes_per_s"] == [None] * len(model.partitions)


def test_roofline_of_a_reconstruction_uses_the_vendor_peaks(cerebras_bundle: Path) -> None:
    import yaml

    from dfit_mlir.analysis.profiles import bundled

    model = SemanticModel.open(cerebras_bundle)
    data = html.view_data(model)
    profile = yaml.safe_load(bundled()["cerebras"].read_text())
    peak = 2 * profile["peak_macs_per_s"][profile["default_dtype"]]["value"]
    assert data["roof"] == {"name": profile["name"], "basis": "vendor-published peaks",
                            "dtype": profile["default_dtype"], "peak": peak,
                            "bandwidth": profile["memory_bandwidth_bytes_per_s"]["value"], "caches": [],
                            "peaks": {dtype: 2 * figure["value"] for dtype, figure in profile["peak_macs_per_s"].items()}}
    R = data["roofline"]
    placed = [d for d, v in enumerate(R["intensity"]) if v]
    assert placed and all(R["roof"][d] <= peak for d in placed)


def test_browser_roofline_plot_is_linked(browser: Any, iree_bundles: dict[str, Path], tmp_path: Path) -> None:
    """Each plotted partition is a point: clicking it selects its row (and the rows
    sharing its ops, from the manifest); clicking a row lights its point. A compile
    manifest draws hollow points on the roof and says 'not timed'."""
    from selenium.webdriver.common.by import By

    model = SemanticModel.open(iree_bundles["full"])
    parts = manifest_partitions(model)
    open_view(browser, iree_bundles["full"], tmp_path)
    points = browser.find_elements(By.CSS_SELECTOR, "#roofline-plot circle.pt")
    placed = [v for v in html.view_data(model)["roofline"]["intensity"] if v]  # the partitions doing MACs
    assert len(points) == len(placed) >= 4 and not browser.find_elements(By.CSS_SELECTOR, "circle.pt.static")
    for point in points:
        index = int(point.get_attribute("data-dispatch"))
        click(browser, point)
        expected = dispatches_of(model, parts[index])
        assert highlighted(browser, "tr.dispatch", "data-dispatch") == expected
        assert highlighted(browser, "circle.pt", "data-dispatch") == expected
        assert "sel" in point.get_attribute("class")
        assert highlighted(browser, "#source [data-line]", "data-line") == lines_of(model, parts[index])
    row = browser.find_element(By.CSS_SELECTOR, 'tr.dispatch[data-dispatch="3"]')  # rows are sorted by time
    click(browser, row)
    assert "3" in highlighted(browser, "circle.pt", "data-dispatch")
    cells = [td.text for td in row.find_elements(By.CSS_SELECTOR, "td")]
    assert cells[9].endswith("%") and cells[10] in ("memory-bound", "balanced", "compute-bound")
    browser.execute_script("arguments[0].scrollIntoView()", browser.find_element(By.ID, "roofline-plot"))
    browser.save_screenshot(str(tmp_path / "roofline-run.png"))
    no_console_errors(browser)
    open_view(browser, iree_bundles["manifest"], tmp_path)
    static = browser.find_elements(By.CSS_SELECTOR, "#roofline-plot circle.pt.static")
    assert len(static) == len(placed)
    assert {td.text for td in browser.find_elements(By.CSS_SELECTOR, "tr.dispatch td:nth-child(9)")} == {"not timed"}
    browser.save_screenshot(str(tmp_path / "roofline-static.png"))
    no_console_errors(browser)


def _selected_op(browser: Any) -> list[str]:
    """The op(s) the stages panel shows (its column heads)."""
    from selenium.webdriver.common.by import By

    return [chip.get_attribute("data-op") for chip in browser.find_elements(By.CSS_SELECTOR, "#stages-body th .opchip")]


def test_browser_trace_slices_link_back_to_their_op(browser: Any, iree_bundles: dict[str, Path],
                                                    tmp_path: Path) -> None:
    """Every dispatch slice of the run's Chrome JSON and Perfetto traces carries a `view`
    arg; opened as view.html#op=… (or pasted into the search box) it selects exactly
    that op: its stage column, and the dispatches and lines the manifest gives it."""
    import json

    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    from tests.conftest import read_pftrace

    bundle = iree_bundles["full"]
    model = SemanticModel.open(bundle)
    document = json.loads((bundle / "trace.json").read_text())
    links = {e["args"]["op_id"]: e["args"]["view"] for e in document["traceEvents"]
             if e.get("ph") == "X" and e["args"].get("kind") == "dispatch"}
    _, named = read_pftrace(bundle / "trace.pftrace")
    assert {args["op_id"]: args["view"] for _, _, args in named if args.get("kind") == "dispatch"} == links
    assert len(links) == len(model.partitions)
    page = open_view(browser, bundle, tmp_path)
    for op_id, link in links.items():
        assert link.startswith("view.html#op=")
        browser.get(page.parent.as_uri() + "/" + link)
        assert _selected_op(browser) == [op_id], link
        assert highlighted(browser, "tr.dispatch", "data-dispatch") == dispatches_of(model, {op_id})
        assert highlighted(browser, "#source [data-line]", "data-line") == lines_of(model, {op_id})
    # Pasted into the search box: the slice's arg, a bare op ID, a module path.
    browser.get(page.as_uri())
    find = browser.find_element(By.ID, "find")
    op_id, link = next(iter(links.items()))
    for text, expected in ((link, [op_id]), (op_id, [op_id])):
        find.clear()
        find.send_keys(text, Keys.ENTER)
        assert _selected_op(browser) == expected and "miss" not in find.get_attribute("class")
        assert browser.current_url.endswith("#op=" + _quoted(op_id))
    path = model.module_path(op_id)
    find.clear()
    find.send_keys(path, Keys.ENTER)
    assert path in highlighted(browser, ".mod", "data-module")
    find.clear()
    find.send_keys("no/such#op", Keys.ENTER)
    assert "miss" in find.get_attribute("class")
    browser.save_screenshot(str(tmp_path / "trace-link.png"))
    no_console_errors(browser)


@pytest.mark.heavy  # 40-70 s in the browser (Edge TPU view); the other browser checks stay in make test
def test_browser_node_name_tree_collapses(browser: Any, edgetpu_bundle: Path, tmp_path: Path) -> None:
    """The Edge TPU node names form a tree: collapsing a group hides its rows and shows
    the subtree's share (recounted from the ledger's op times); a selection inside a
    collapsed group marks the group; expanding shows the highlighted row again."""
    from selenium.webdriver.common.by import By

    model = SemanticModel.open(edgetpu_bundle)
    sites = site_ops(model)
    book = ledger.of(model)
    column = "time_ns" if book.totals.measured_ns else "flops"  # the gutter's rule (the module doc)
    by_op = {row["op_id"]: row[column] or 0 for row in book.rollup("op_id").to_pylist()}
    whole = book.attributed_time_ns if book.totals.measured_ns else sum(by_op.values())
    open_view(browser, edgetpu_bundle, tmp_path)
    groups = browser.find_elements(By.CSS_SELECTOR, "#source .node.group")

    def inside(group: Any) -> set[str]:  # a group's subtree: every site whose name starts with its path
        return {key for key in sites if key.startswith(group.get_attribute("data-node") + ".")}

    # The largest group that is not the whole model.
    group = max((g for g in groups if len(inside(g)) < len(sites)), key=lambda g: len(inside(g)))
    members = inside(group)
    assert len(members) > 1 and whole > 0
    share = sum(by_op.get(op, 0) for key in members for op in sites[key]) / whole
    click(browser, group.find_element(By.CSS_SELECTOR, ".tog"))
    box = group.find_element(By.XPATH, "following-sibling::div[1]")
    assert "shut" in box.get_attribute("class")
    assert all(not row.is_displayed() for row in box.find_elements(By.CSS_SELECTOR, "[data-line]"))
    assert group.find_element(By.CSS_SELECTOR, ".g").text == f"Σ {100 * share:.1f}%"
    key = sorted(members)[0]
    browser.execute_script("location.hash = arguments[0]", "#line=" + _quoted(key))
    assert "hl-sub" in group.get_attribute("class")
    click(browser, group.find_element(By.CSS_SELECTOR, ".tog"))
    assert "hl-sub" not in group.get_attribute("class") and key in highlighted(browser, "#source [data-line]", "data-line")
    browser.save_screenshot(str(tmp_path / "node-tree.png"))
    no_console_errors(browser)


# --- the stages panel's printed IR (the compile's stage_ir table) ---------------------------

def test_stages_panel_shows_each_phase_ir_of_the_clicked_op(browser: Any, iree_bundles: dict[str, Path],
                                                            tmp_path: Path) -> None:
    """Click the conv's chip in the dispatch panel: each phase row of the stages panel holds
    one open IR block with the texts the manifest recorded for the conv at that phase
    (tests/test_stage_ir.py checks those against iree-compile's own printouts)."""
    from selenium.webdriver.common.by import By

    from dfit_mlir.core.stage_ir_table import read_table

    model = SemanticModel.open(iree_bundles["full"])
    table = read_table(model.manifest["stage_ir"])
    conv = next(op.id for op in model.operators.values() if op.kind.startswith("conv_2d"))
    open_view(browser, iree_bundles["full"], tmp_path)
    chip = browser.find_element(By.CSS_SELECTOR, f'tr.dispatch .opchip[data-op="{conv}"]')
    click(browser, chip)
    assert browser.current_url.endswith("#op=" + _quoted(conv))
    rows = browser.find_elements(By.CSS_SELECTOR, "tr.stage-row")
    assert [row.get_attribute("data-stage") for row in rows] == model.manifest["lineage"]["stages"]
    for row in rows:
        stage = row.get_attribute("data-stage")
        [block] = row.find_elements(By.CSS_SELECTOR, "details.ir")
        assert block.get_attribute("data-ir-op") == conv and block.get_attribute("data-ir-stage") == stage
        assert block.get_attribute("open") is not None  # one op selected: shown open
        count, texts = table.carriers_of(conv, stage)
        shown = [pre.get_attribute("textContent") for pre in block.find_elements(By.CSS_SELECTOR, "pre.ir-text")]
        assert shown == texts and texts, stage
        summary = block.find_element(By.CSS_SELECTOR, "summary").text
        assert summary.startswith(f"{count} op"), (stage, summary)
        assert all(pre.value_of_css_property("font-family").startswith("monospace")
                   for pre in block.find_elements(By.CSS_SELECTOR, "pre.ir-text"))
    # The printout is the op's: the source phase shows the conv itself, in generic form.
    first = rows[0].find_element(By.CSS_SELECTOR, "pre.ir-text").get_attribute("textContent")
    assert '"linalg.conv_2d_nhwc_hwcf"(' in first and "({...})" in first
    # Collapsing a block is not a new selection.
    summary = rows[1].find_element(By.CSS_SELECTOR, "details.ir summary")
    click(browser, summary)
    assert rows[1].find_element(By.CSS_SELECTOR, "details.ir").get_attribute("open") is None
    assert browser.current_url.endswith("#op=" + _quoted(conv))
    browser.execute_script("const s = document.getElementById('stages'); s.scrollLeft = 0; s.scrollTop = 0;")
    browser.save_screenshot(str(tmp_path / "convnet-stages-ir.png"))
    assert (tmp_path / "convnet-stages-ir.png").stat().st_size > 10_000
    no_console_errors(browser)


def test_stages_panel_without_recorded_ir_says_so(browser: Any, iree_bundles: dict[str, Path],
                                                  edgetpu_bundle: Path, tmp_path: Path) -> None:
    """A manifest written before the table existed (the convnet's, with the table taken
    out) and a reconstructed Edge TPU bundle: the panel says "IR not recorded"."""
    import json

    from selenium.webdriver.common.by import By

    old = json.loads(iree_bundles["manifest"].read_text())
    del old["stage_ir"]
    manifest = tmp_path / "old.manifest.json"
    manifest.write_text(json.dumps(old))
    assert html.view_data(SemanticModel.open(manifest))["stage_ir"] is None
    conv = next(op["id"] for op in old["operators"] if op["op"].startswith("linalg.conv_2d"))
    edgetpu = SemanticModel.open(edgetpu_bundle)
    node = next(iter(edgetpu.operators))
    assert len(old["lineage"]["stages"]) == 13
    for bundle, op_id, stages in ((manifest, conv, old["lineage"]["stages"]),
                                  (edgetpu_bundle, node, edgetpu.manifest["lineage"]["stages"])):
        folder = tmp_path / f"page-{bundle.name}"  # a page of its own: a new fragment alone would not reload it
        folder.mkdir()
        open_view(browser, bundle, folder, "#op=" + _quoted(op_id))
        rows = browser.find_elements(By.CSS_SELECTOR, "tr.stage-row")
        assert [row.get_attribute("data-stage") for row in rows] == stages, bundle
        [note] = browser.find_elements(By.CSS_SELECTOR, "#stages .ir-absent")
        assert note.text.startswith("IR not recorded")
        assert not browser.find_elements(By.CSS_SELECTOR, "#stages details.ir")
        no_console_errors(browser)
    browser.save_screenshot(str(tmp_path / "edgetpu-no-ir.png"))


# --- executed figures (issue 28: per trip and executed, apart) -------------------------------

def test_executed_flops_are_the_ledgers_and_unknown_without_a_run(iree_bundles: dict[str, Path]) -> None:
    """The dispatch table's executed FLOPs are the ledger's (per trip × calls, over the run
    and per invocation), the icicle's ``executed_flops`` width is its module tree's, the
    header's total its per-invocation figure; a manifest has none (``None``, and why)."""
    model = SemanticModel.open(iree_bundles["full"])
    data, book = html.view_data(model), ledger.of(model)
    table = data["dispatches"]
    for index, part in enumerate(model.partitions):
        executed = book.partition_figures(part.id)["executed_flops"]
        assert table["executed_flops"][index] == executed == table["flops"][index] * table["calls"][index]
        assert table["executed_flops_per_invocation"][index] == book.per_invocation(executed)
    assert data["executed"] == {"flops": book.executed_totals["executed_flops"],
                                "flops_per_invocation": book.per_invocation(book.executed_totals["executed_flops"]),
                                "instances": book.instances, "unknown": None, "basis": "run events",
                                "per_invocation_unknown": None}
    static = html.view_data(SemanticModel.open(iree_bundles["manifest"]))
    assert set(static["dispatches"]["executed_flops"]) == {None} and static["executed"]["flops"] is None
    assert static["executed"]["unknown"].startswith("nothing ran")
    # Per invocation, the manifest's trip counts stand in (the convnet: no loop, 1 each).
    assert static["executed"]["basis"] == "manifest trips"
    assert static["dispatches"]["executed_flops_per_invocation"] == table["executed_flops_per_invocation"]
    assert static["executed"]["flops_per_invocation"] == data["executed"]["flops_per_invocation"]
    assert all(not any(figures["executed_flops"]) for figures in static["modules"]["figures"].values())


def test_browser_shows_executed_flops_apart_from_per_trip(browser: Any, iree_bundles: dict[str, Path],
                                                          tmp_path: Path) -> None:
    """The dispatch table's "executed FLOPs" column (the run's, per invocation in
    brackets) beside "FLOPs / trip"; the header's per-invocation total; a manifest shows
    "-" there and says the figure is unknown and why."""
    from selenium.webdriver.common.by import By

    model = SemanticModel.open(iree_bundles["full"])
    book = ledger.of(model)
    open_view(browser, iree_bundles["full"], tmp_path)
    heads = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "#dispatch-body th")]
    assert heads[5].startswith("FLOPs / trip") and heads[11].startswith("executed FLOPs")
    cells = [td.text for td in browser.find_elements(By.CSS_SELECTOR, "tr.dispatch td.executed")]
    assert len(cells) == len(model.partitions) and all(text != "-" for text in cells)
    assert all(text.endswith(")") for text, part in zip(cells, model.partitions, strict=True)
               if book.partition_figures(part.id)["executed_flops"])
    work = browser.find_element(By.ID, "work")
    assert "executed per invocation" in work.text and f"in {book.instances} invocation" in work.get_attribute("title")
    no_console_errors(browser)
    open_view(browser, iree_bundles["manifest"], tmp_path)
    cells = [td.text for td in browser.find_elements(By.CSS_SELECTOR, "tr.dispatch td.executed")]
    assert cells and all(text.startswith("- (") for text in cells)  # per invocation only, from the trips
    work = browser.find_element(By.ID, "work")
    assert "(manifest trips)" in work.text and "over the whole run unknown: nothing ran" in work.get_attribute("title")
    browser.find_element(By.CSS_SELECTOR, "#weight option[value='executed_flops']").click()
    assert "executed FLOPs unknown" in browser.find_element(By.ID, "icicle").text
    no_console_errors(browser)
