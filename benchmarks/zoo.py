"""The model zoo (``tests/zoo_models.py``): 17 real models of different families from four
frontends, each through ``dfit compile --dfit-tag``, ``dfit run --mode full --repeat 5``
on default inputs and ``dfit analyze --tool all``.

Per model: the CPU time (all threads and child processes; on a shared machine wall
time measures the neighbours) of the front-door ``dfit compile --dfit-tag`` (for ``.py`` and
``.onnx`` sources the export or import is included) over plain ``iree-compile`` of the
MLIR it compiled (the iree-turbine export, the JAX lowering, the ONNX import, the TFLite
TOSA bytecode), so the ratio overstates the instrumentation's own cost by the export,
the dispatch events resolved to a call site and ID, the share of non-constant ops with a
module path and with a model-code source line (ONNX and TFLite carry no source lines),
and the top-3 sites of ``sites.csv`` by measured time.

    .venv/bin/python -m benchmarks.zoo [--out build/zoo] [--only gpt2,resnet] [--results benchmarks/RESULTS.md]

Prints the Markdown table and, with ``--results``, replaces the zoo section of that file.
"""

from __future__ import annotations

import argparse
import json
import re
import warnings
from pathlib import Path
from typing import Any

from tests import realmodels, zoo_models

SECTION = "## Model zoo: 17 models through the front door"
COMMAND = ".venv/bin/python -m benchmarks.zoo --results benchmarks/RESULTS.md"


def measure(model: zoo_models.ZooModel, workdir: Path) -> dict[str, Any]:
    """The front door (:func:`tests.zoo_models.run_zoo_model`), then plain
    ``iree-compile`` of the MLIR it compiled, and the figures of the module docstring."""
    result = zoo_models.run_zoo_model(model, workdir)
    mlir = result.frontend_mlir or model.source(workdir)
    started = zoo_models.cpu_seconds()
    plain = realmodels.iree_compile(mlir, workdir / "plain.vmfb")
    plain_s = zoo_models.cpu_seconds() - started
    if plain.returncode != 0:
        raise zoo_models.ZooCommandFailed(f"iree-compile failed on {mlir}:\n{plain.stderr[-2000:]}")
    events = result.dispatch_events()
    resolved = sum(1 for event in events if event["site"] is not None and event["root_id"])
    shares = zoo_models.attribution_shares(result.manifest)
    return {"model": model.name, "frontend": model.frontend, "family": model.family,
            "plain_s": round(plain_s, 1), "dfit_s": round(result.compile_s, 1),
            "ratio": round(result.compile_s / plain_s, 2),
            "dispatch_events": len(events), "resolved": resolved,
            "invocations": len({event["invocation"] for event in events}),
            "ops": shares["ops"], "module_pct": round(100 * shares["module"], 2),
            "line_pct": round(100 * shares["line"], 2),
            "top_sites": [_short_site(row) for row in result.sites[:3]]}


def _short_site(row: dict[str, str]) -> str:
    """``modeling_gpt2.py:245 (41%)``: the site without its directory, and its share of attributed time."""
    site = row["site"]
    if row["site_kind"] == "source":
        site = re.sub(r"^.*/", "", site)
    share = float(row["attributed_share"] or 0)
    return f"`{site}` ({100 * share:.0f}%)"


def markdown(rows: list[dict[str, Any]], failures: dict[str, str]) -> str:
    lines = ["| model | frontend | family | plain iree-compile CPU s | dfit compile --dfit-tag CPU s | ratio | "
             "dispatch events resolved | module path % | model-code line % | top-3 sites (time share) |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for row in rows:
        lines.append(f"| {row['model']} | {row['frontend']} | {row['family']} | "
                     f"{row['plain_s']} | {row['dfit_s']} | {row['ratio']} | "
                     f"{row['resolved']}/{row['dispatch_events']} ({row['invocations']} inv.) | "
                     f"{row['module_pct']} | {row['line_pct']} | {'; '.join(row['top_sites'])} |")
    for name, reason in failures.items():
        lines.append(f"| {name} | failed: {reason} ||||||||")
    return "\n".join(lines) + "\n"


def write_results(results: Path, table: str) -> None:
    """Replace (or append) the zoo section of ``results``."""
    text = results.read_text() if results.is_file() else ""
    section = f"{SECTION}\n\nCommand: `{COMMAND}`\n\n{table}"
    pattern = re.compile(rf"^{re.escape(SECTION)}\n.*?(?=^## |\Z)", re.S | re.M)
    text = pattern.sub(section + "\n", text) if pattern.search(text) else text.rstrip("\n") + "\n\n" + section
    results.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("build/zoo"))
    parser.add_argument("--only", default="", help="comma-separated model names")
    parser.add_argument("--results", type=Path, default=None, help="RESULTS.md to update")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    rows, failures = [], {}
    for model in zoo_models.MODELS:
        if args.only and model.name not in args.only.split(","):
            continue
        try:
            row = measure(model, args.out / model.name)
        except (realmodels.FixtureUnavailable, zoo_models.ZooCommandFailed) as error:
            failures[model.name] = str(error).splitlines()[0]
            print(f"{model.name}: {failures[model.name]}", flush=True)
            continue
        rows.append(row)
        print(json.dumps(row), flush=True)
    (args.out / "zoo.json").write_text(json.dumps({"rows": rows, "failures": failures}, indent=1) + "\n")
    table = markdown(rows, failures)
    print(table)
    if args.results:
        write_results(args.results, table)


if __name__ == "__main__":
    main()
