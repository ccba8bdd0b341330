"""Scale of ``dfit view``: time to write ``view.html`` and its size for a large model,
and the page's time to first paint and a selection's time in headless Chromium.

The model is the Cerebras reconstruction of the synthetic CIRH dump of
:mod:`benchmarks.reconstruct_scale` with ``--ops`` operators (default 5,000: ~4,960 ops
in ~970 partitions); the real bundles of the test suite (the convnet run, yolov8n on the
Edge TPU, SambaNova BERT-large) are far smaller. Write time is one ``dfit view``
process (interpreter, imports and manifest validation included), median of ``--runs``;
the split says where it goes. Paint: ``first-contentful-paint`` of the page opened from
disk in Debian's ``/usr/bin/chromium`` (headless, through Selenium), median of ``--runs``
loads; a selection is one click on a partition row until its highlights are drawn.
This script replaces its section of ``benchmarks/RESULTS.md`` (and prints it).

    python benchmarks/view_scale.py [--ops 5000] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
BEGIN, END = "<!-- view_scale:begin -->", "<!-- view_scale:end -->"


def build_bundle(directory: Path, ops: int) -> Path:
    from benchmarks.reconstruct_scale import write_dump
    from dfit_mlir.adapters.reconstruct import reconstruct_bundle

    bundle = directory / "bundle"
    reconstruct_bundle([write_dump(directory / "dump", ops)], bundle, "cerebras")
    return bundle


def write_times(bundle: Path, page: Path, runs: int) -> tuple[list[float], list[float]]:
    """(Wall seconds, CPU seconds: user + system of the child) of each ``dfit view``; on a
    shared machine the CPU time is the figure the load disturbs least."""
    import resource

    dfit = Path(sys.executable).parent / "dfit"
    walls, cpus = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        subprocess.run([str(dfit), "view", str(bundle), "-o", str(page)], check=True, capture_output=True)
        walls.append(time.perf_counter() - started)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return walls, cpus


def validation_times(bundle: Path) -> dict[str, float]:
    """The manifest's parse, the compiled schema check ``manifest.load`` runs, and the
    full jsonschema pass it ran before (what a refused manifest still gets), in process."""
    import jsonschema

    from dfit_mlir.core import manifest

    started = time.process_time()
    document = json.loads((bundle / "manifest.json").read_text())
    parsed = time.process_time()
    assert manifest._accepts()(document)
    checked = time.process_time()
    assert not list(jsonschema.Draft202012Validator(manifest.schema()).iter_errors(document))
    return {"parse JSON": parsed - started, "compiled schema check": checked - parsed,
            "jsonschema (before; still run for a manifest the check refuses)": time.process_time() - checked}


def split(bundle: Path) -> dict[str, float]:
    from dfit_mlir.analysis.model import SemanticModel
    from dfit_mlir.views import html

    started = time.perf_counter()
    model = SemanticModel.open(bundle)
    opened = time.perf_counter()
    data = html.view_data(model)
    tabled = time.perf_counter()
    json.dumps(data, separators=(",", ":"))
    return {"open + validate manifest": opened - started, "tables (ledger included)": tabled - opened,
            "JSON": time.perf_counter() - tabled}


def browser_times(page: Path, runs: int) -> tuple[list[float], list[float]]:
    from selenium import webdriver
    from selenium.webdriver.common.by import By

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path="/usr/bin/chromedriver"),
                              options=options)
    paints, clicks = [], []
    try:
        for _ in range(runs):
            driver.get(page.as_uri())
            paints.append(first_paint(driver))
            row = driver.find_elements(By.CSS_SELECTOR, "tr.dispatch")[0]
            started = time.perf_counter()
            row.click()
            driver.execute_script("return document.querySelectorAll('.hl').length")
            clicks.append(1000 * (time.perf_counter() - started))
    finally:
        driver.quit()
    return paints, clicks


def first_paint(driver: object, patience_s: float = 10.0) -> float:
    """The page's first-contentful-paint (ms after navigation start); Chromium posts the
    entry a little after the paint, so poll for it."""
    deadline = time.monotonic() + patience_s
    while time.monotonic() < deadline:
        found = driver.execute_script(  # type: ignore[attr-defined]
            "const e = performance.getEntriesByName('first-contentful-paint')[0]; return e ? e.startTime : null;")
        if found is not None:
            return float(found)
        time.sleep(0.05)
    raise RuntimeError("Chromium reported no first-contentful-paint")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="dfit-view-scale-") as scratch:
        bundle = build_bundle(Path(scratch), args.ops)
        manifest = json.loads((bundle / "manifest.json").read_text())
        page = Path(scratch) / "view.html"
        writes, cpus = write_times(bundle, page, args.runs)
        parts = split(bundle)
        validation = validation_times(bundle)
        paints, clicks = browser_times(page, args.runs)
        size = page.stat().st_size
    from benchmarks.compile_overhead import command_line, publish

    lines = [BEGIN, "## dfit view: writing view.html and opening it in headless Chromium", "",
             f"`{command_line(__file__, argv)}`", "",
             f"Model: the Cerebras reconstruction of a synthetic CIRH dump: {len(manifest['operators'])} ops, "
             f"{len(manifest['partitions'].get('groups', []))} partitions. Load average {load:.1f} on "
             f"{os.cpu_count()} cores at the start (a shared machine).", "",
             "| measure | median | runs |", "|---|---|---|",
             f"| `dfit view` wall time (one process) | {statistics.median(writes):.2f} s | "
             f"{', '.join(f'{w:.2f}' for w in writes)} |",
             f"| `dfit view` CPU time (user + system) | {statistics.median(cpus):.2f} s | "
             f"{', '.join(f'{c:.2f}' for c in cpus)} |",
             f"| view.html size | {size / 1024:.0f} KiB | |",
             f"| first contentful paint (Chromium) | {statistics.median(paints):.0f} ms | "
             f"{', '.join(f'{p:.0f}' for p in paints)} |",
             f"| one selection (click a partition → highlights) | {statistics.median(clicks):.0f} ms | "
             f"{', '.join(f'{c:.0f}' for c in clicks)} |", "",
             "Where the write time goes (one in-process run): "
             + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in parts.items()) + ".", "",
             "The manifest's validation (CPU seconds, in process): "
             + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in validation.items()) + "."]
    publish(lines, begin=BEGIN, end=END)
    return 0


if __name__ == "__main__":
    sys.exit(main())
