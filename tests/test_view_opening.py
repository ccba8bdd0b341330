"""``dfit view`` opens on the answer (issue 28): the hottest line selected and in view,
``#line=`` / ``#op=`` links scrolled to, the dispatch table sorted by time with load-time
work last, and a reconstructed run log's measurements shown (a timeline and a table).

Expectations come from the ledger, the manifest and events.parquet, never from the
page's data; what is "in view" is measured in the browser (bounding boxes)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from dfit_mlir.analysis import ledger
from dfit_mlir.analysis.model import SemanticModel
from dfit_mlir.analysis.tools.builtin.semantic_attribution import op_site
from dfit_mlir.views import html
from tests import test_view
from tests.conftest import CONVNET, REPO, vendor_fixture
from tests.test_view import _quoted, click, no_console_errors, open_view

browser = test_view.browser  # the headless Chromium fixture, shared

#: The convnet's locations moved into two model files: the four costly ops (conv1, conv2,
#: pool, fc1: 18-33 % of the time each, their order up to the machine's noise) to lines
#: 221-260 of the second file, the softmax to its last lines, the rest to the first file,
#: which opens with a long licence header (the UNet page's case: the hottest line is in a
#: file that is not first, far below the top).
MOVES = {"21": ("blocks.py", 221), "24": ("blocks.py", 240), "27": ("blocks.py", 250), "30": ("blocks.py", 260),
         "34": ("blocks.py", 290), "33": ("blocks.py", 289)}
FIRST_FILE, SECOND_FILE = "model.py", "blocks.py"


def _moved_convnet(folder: Path) -> Path:
    text = CONVNET.read_text()

    def move(match: re.Match[str]) -> str:
        line = match.group(1)
        name, number = MOVES.get(line, (FIRST_FILE, int(line)))
        return f'"{folder / name}":{number}:'

    (folder / FIRST_FILE).write_text("".join(f"# licence header line {n}\n" for n in range(1, 61)))
    (folder / SECOND_FILE).write_text("".join(f"x{n} = {n}  # model code\n" for n in range(1, 301)))
    source = folder / "twofiles.mlir"
    source.write_text(re.sub(r'"convnet\.py":(\d+):', move, text))
    return source


@pytest.fixture(scope="module")
def two_file_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from dfit_mlir.passes.instrumented_compile import compile_instrumented
    from dfit_mlir.runtime_hooks.run import run_bundle

    folder = tmp_path_factory.mktemp("two-files")
    compiled = compile_instrumented(_moved_convnet(folder), folder / "twofiles.vmfb", mode="full")
    return run_bundle(compiled.vmfb, compiled.manifest_path, folder / "run", mode="full", repeat=3, warmup=1).bundle


def hottest_site(model: SemanticModel) -> str:
    """The site (``file:line``) with the largest share of attributed time, recounted from
    the ledger's op figures by the project's site rule."""
    book = ledger.of(model)
    sites = {op.id: site[0] for op in model.operators.values() if (site := op_site(model, op)) is not None}
    rolled = book.rollup_ops(sites)
    return max(rolled, key=lambda key: rolled[key]["time_ns"])


def in_view(browser: Any, element: Any, panel: str) -> bool:
    """Whether ``element``'s box lies inside the window and inside ``panel``'s visible
    area: its content box (inside its border: the table's last row, scrolled fully into
    view, ends 0.4 px past the border box's top + clientHeight), below its sticky heading."""
    return browser.execute_script("""
        const e = arguments[0].getBoundingClientRect(), p = document.getElementById(arguments[1]);
        const top = p.getBoundingClientRect().top + p.clientTop, head = p.querySelector('h2').offsetHeight;
        return e.height > 0 && e.top >= Math.max(0, top + head) && e.bottom <= Math.min(innerHeight, top + p.clientHeight)
            && e.left >= 0 && e.left < innerWidth;""", element, panel)


def selected(browser: Any, selector: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return browser.find_elements(By.CSS_SELECTOR, selector + ".sel")


def test_view_opens_with_the_hottest_line_selected_and_visible(browser: Any, two_file_run: Path,
                                                                tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    model = SemanticModel.open(two_file_run)
    hot = hottest_site(model)
    assert hot.startswith(str(two_file_run.parent / SECOND_FILE)) and int(hot.rsplit(":", 1)[1]) > 200, hot
    data = html.view_data(model)
    assert not data["strings"][data["files"][0]["name"]].endswith(SECOND_FILE)  # not first as compiled
    open_view(browser, two_file_run, tmp_path)
    [line] = selected(browser, "#source .line")
    assert line.get_attribute("data-line") == hot and in_view(browser, line, "source")
    # The hottest file is listed first, with its share; the address is left as it was.
    heads = browser.find_elements(By.CSS_SELECTOR, "#source .src-file")
    assert heads[0].text.endswith(SECOND_FILE)
    assert "#" not in browser.current_url
    # The stages panel shows the line's ops; its dispatch row is lit and in view.
    assert browser.find_elements(By.CSS_SELECTOR, "#stages-body th .opchip")
    rows = browser.find_elements(By.CSS_SELECTOR, "tr.dispatch.hl")
    assert rows and in_view(browser, rows[0], "dispatches")
    browser.save_screenshot(str(tmp_path / "opens-on-hottest.png"))
    no_console_errors(browser)


def test_line_and_op_links_scroll_to_what_they_select(browser: Any, two_file_run: Path, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    model = SemanticModel.open(two_file_run)
    last = f"{two_file_run.parent / SECOND_FILE}:290"  # the softmax, near the end of the second file
    page = open_view(browser, two_file_run, tmp_path, "#line=" + _quoted(last))
    [line] = selected(browser, "#source .line")
    assert line.get_attribute("data-line") == last and in_view(browser, line, "source")
    # A link followed on the open page (hashchange): a line at the top of the first file.
    first = f"{two_file_run.parent / FIRST_FILE}:22"  # relu1
    browser.execute_script("location.hash = arguments[0]", "#line=" + _quoted(first))
    [line] = selected(browser, "#source .line")
    assert line.get_attribute("data-line") == first and in_view(browser, line, "source")
    # #op=: its line and its dispatch row are both brought into view.
    softmax = next(op.id for op in model.operators.values() if op.kind.startswith("softmax"))
    browser.get(page.as_uri() + "#op=" + _quoted(softmax))
    lit = browser.find_elements(By.CSS_SELECTOR, "#source .line.hl")
    assert [e.get_attribute("data-line") for e in lit] == [last] and in_view(browser, lit[0], "source")
    # A fragment navigation returns before the page's hashchange handler may have run:
    # wait (up to 5 s) for the lit dispatch row to be brought into view.
    from selenium.webdriver.support.ui import WebDriverWait

    def row_shown(driver: Any) -> bool:
        rows = driver.find_elements(By.CSS_SELECTOR, "tr.dispatch.hl")
        return bool(rows) and in_view(driver, rows[0], "dispatches")

    browser.save_screenshot(str(tmp_path / "op-link.png"))
    WebDriverWait(browser, 5, poll_frequency=0.05).until(row_shown, "the op's dispatch row was not scrolled into view")
    no_console_errors(browser)


def test_a_link_to_each_dispatch_brings_its_row_into_view(browser: Any, two_file_run: Path, tmp_path: Path) -> None:
    """Every row of the dispatch table, the first and the last included (at the bottom of
    a panel scrolled to its end, a row ends just past the border box: the row a flaky
    run's op link selected), is in view once a link selects it."""
    from selenium.webdriver.support.ui import WebDriverWait

    open_view(browser, two_file_run, tmp_path)
    order = _row_order(browser)
    assert len(order) > 3, order

    def shown(dispatch: int) -> Any:
        def check(driver: Any) -> bool:
            rows = selected(driver, "tr.dispatch")
            return len(rows) == 1 and rows[0].get_attribute("data-dispatch") == str(dispatch) \
                and in_view(driver, rows[0], "dispatches")
        return check

    for dispatch in (order[-1], order[0], *order[1:-1]):
        browser.execute_script("location.hash = arguments[0]", f"#dispatch={dispatch}")
        # The hashchange handler runs after the script returns: waited for (5 s at most).
        WebDriverWait(browser, 5, poll_frequency=0.05).until(shown(dispatch), f"dispatch {dispatch} of {order}")
    no_console_errors(browser)


def _row_order(browser: Any) -> list[int]:
    from selenium.webdriver.common.by import By

    return [int(row.get_attribute("data-dispatch")) for row in browser.find_elements(By.CSS_SELECTOR, "tr.dispatch")]


def test_dispatch_table_sorted_by_time_with_load_time_work_last(browser: Any, iree_bundles: dict[str, Path],
                                                                tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    from dfit_mlir.passes.instrumented_compile import compile_instrumented
    from dfit_mlir.runtime_hooks.run import run_bundle

    model = SemanticModel.open(iree_bundles["full"])
    book = ledger.of(model)
    times = [book.partition_ns(part.id) for part in model.partitions]
    open_view(browser, iree_bundles["full"], tmp_path)
    assert _row_order(browser) == sorted(range(len(times)), key=lambda d: (-times[d], d))
    # A click on "#" gives the manifest's order; on "time" again, the largest first.
    heads = browser.find_elements(By.CSS_SELECTOR, "#dispatch-body th")
    click(browser, heads[0])
    assert _row_order(browser) == list(range(len(times)))
    click(browser, heads[3])
    assert _row_order(browser)[0] == max(range(len(times)), key=lambda d: times[d])
    no_console_errors(browser)
    # A module whose initializer dispatches at load time (not timed by the run): that
    # partition is listed last, and says it is load-time work.
    folder = tmp_path / "init"
    folder.mkdir()
    compiled = compile_instrumented(REPO / "tests" / "inputs" / "shapes" / "initializer.mlir", folder / "init.vmfb",
                                    mode="full", flags=("--iree-opt-const-eval=false",))
    bundle = run_bundle(compiled.vmfb, compiled.manifest_path, folder / "run", mode="full", inputs=("8x64xf32=1",),
                        repeat=2, warmup=1).bundle
    sites = SemanticModel.open(bundle).manifest["partitions"]["dispatch_sites"]
    load = [str(s["index"]) for s in sites if s["phase"] == "load"]
    assert load and load[0] == "0"  # the manifest lists the initializer's dispatch first
    open_view(browser, bundle, folder)
    rows = browser.find_elements(By.CSS_SELECTOR, "tr.dispatch")
    assert [row.get_attribute("data-dispatch") for row in rows][-len(load):] == load
    assert "load time" in rows[-1].text and "load time" not in rows[0].text
    browser.save_screenshot(str(tmp_path / "load-time-last.png"))
    no_console_errors(browser)


def test_icicle_labels_separate_name_and_time(browser: Any, iree_bundles: dict[str, Path], tmp_path: Path) -> None:
    """A module called "1" taking 247.7 µs must not read "1 247.7 µs" (thousands)."""
    from selenium.webdriver.common.by import By

    open_view(browser, iree_bundles["full"], tmp_path)
    labels = [e.get_attribute("textContent") for e in browser.find_elements(By.CSS_SELECTOR, "#icicle .mod")]
    assert labels and all(re.fullmatch(r".+ · [\d.]+\u00a0(ns|µs|ms|s)", label) for label in labels), labels


# --- a reconstructed run log: its measurements ------------------------------------------------

def _named_events(bundle: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    return [e for e in pq.read_table(bundle / "events.parquet").to_pylist() if e["name"] is not None]


@pytest.fixture(scope="module")
def cerebras_run_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The CS-2 BERT-large run log alone: no ops, no partitions, only measurements."""
    from dfit_mlir.adapters.reconstruct import reconstruct_bundle

    out = tmp_path_factory.mktemp("cerebras-log") / "bundle"
    reconstruct_bundle([vendor_fixture("cerebras/alcf_bert_large_bs512_r2x")], out, "cerebras")
    return out


def test_run_log_table_holds_every_measurement(cerebras_run_log: Path) -> None:
    events = _named_events(cerebras_run_log)
    data = html.view_data(SemanticModel.open(cerebras_run_log))
    table, strings = data["measurements"], data["strings"]
    assert len(events) > 50 and table["total"] == len(table["name"]) == len(events)
    shown = sorted((strings[n], v, s) for n, v, s in zip(table["name"], table["value"], table["step"], strict=True))
    assert shown == sorted((e["name"], float(f"{e['value']:.6g}"), e["step"]) for e in events)
    starts = [s for s in table["start"] if s is not None]
    assert starts == sorted(starts) and starts[0] == 0
    assert table["t0"] == min(e["start_ns"] for e in events if e["start_ns"] is not None)


@pytest.mark.parametrize("which", ["log-only", "with-ir"])
def test_browser_run_log_shows_its_measurements(browser: Any, cerebras_run_log: Path, cerebras_bundle: Path,
                                                which: str, tmp_path: Path) -> None:
    """The run log alone opens on its measurements (the empty op panels are not shown);
    with the CIRH samples, the four panels stay and the measurements follow them. The
    loss curve has one point per logged loss; clicking one selects its table row."""
    from selenium.webdriver.common.by import By

    bundle = cerebras_run_log if which == "log-only" else cerebras_bundle
    events = _named_events(bundle)
    open_view(browser, bundle, tmp_path)
    section = browser.find_element(By.ID, "measurements")
    assert section.is_displayed()
    rows = browser.find_elements(By.CSS_SELECTOR, "tr.measure")
    assert len(rows) == len(events)
    assert sorted(row.get_attribute("data-name") for row in rows) == sorted(e["name"] for e in events)
    losses = [e for e in events if e["name"] == "train.loss"]
    assert len(losses) == 10
    loss_rows = [row for row in rows if row.get_attribute("data-name") == "train.loss"]
    assert [row.find_elements(By.TAG_NAME, "td")[3].text for row in loss_rows] == [str(e["step"]) for e in
                                                                                   sorted(losses, key=lambda e: e["start_ns"])]
    marks = {m.get_attribute("data-measure") for m in browser.find_elements(By.CSS_SELECTOR, "#timeline-plot .mark")}
    assert {row.get_attribute("data-measure") for row in loss_rows} <= marks
    panels = [browser.find_element(By.ID, name).is_displayed() for name in ("source", "modules", "stages", "dispatches")]
    assert panels == ([False] * 4 if which == "log-only" else [True] * 4)
    if which == "with-ir":
        browser.execute_script("arguments[0].scrollIntoView()", section)
    point = browser.find_element(By.CSS_SELECTOR, f'#timeline-plot circle.mark[data-measure="{loss_rows[-1].get_attribute("data-measure")}"]')
    browser.execute_script("arguments[0].dispatchEvent(new MouseEvent('click', {bubbles: true}))", point)
    assert "sel" in loss_rows[-1].get_attribute("class") and in_view(browser, loss_rows[-1], "measurements")
    browser.save_screenshot(str(tmp_path / f"cerebras-{which}.png"))
    no_console_errors(browser)
