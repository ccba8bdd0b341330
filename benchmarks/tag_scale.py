"""Scale of the compile-side Python work: parse, tag, operator table and one lineage
snapshot of a synthetic module of N ops (default 100,000), next to the bindings' own
parse and print of the same module as the yardstick.

The module is synthetic (written by this script): one function holding a chain of
``arith.addf``/``arith.mulf`` on tensors, every op with its own file location. The
result replaces this benchmark's section of ``benchmarks/RESULTS.md``.

    python benchmarks/tag_scale.py [--ops 100000]
"""

from __future__ import annotations

import argparse
import datetime as dt
import resource
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.compile_overhead import command_line, update_results  # noqa: E402

BEGIN = "<!-- tag_scale:begin -->"
END = "<!-- tag_scale:end -->"


def synthetic_module(ops: int) -> str:
    lines = ["func.func @big(%a: tensor<16xf32>, %b: tensor<16xf32>) -> tensor<16xf32> {"]
    previous = "%a"
    for index in range(ops // 2):
        lines.append(f'  %x{index} = arith.addf {previous}, %b : tensor<16xf32> loc("big.py":{index + 1}:3)')
        lines.append(f'  %y{index} = arith.mulf %x{index}, %a : tensor<16xf32> loc("big.py":{index + 1}:9)')
        previous = f"%y{index}"
    lines += [f"  return {previous} : tensor<16xf32>", "}"]
    return "\n".join(lines) + "\n"


def measure(path: Path) -> dict[str, float]:
    from iree.compiler import ir

    from dfit_mlir.passes import mlir_engine, operators, snapshot

    timings: dict[str, float] = {}
    with ir.Context():
        t0 = time.perf_counter()
        module = ir.Module.parseFile(str(path))
        timings["parse (bindings)"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        module.operation.get_asm(enable_debug_info=True)
        timings["print (bindings)"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        tagged = mlir_engine.tag_module(module.operation)
        timings["dfit-tag"] = time.perf_counter() - t0
        cache = snapshot.LocationCache()
        t0 = time.perf_counter()
        operators.operator_table(tagged, cache)
        timings["operator table"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        snapshot.take_snapshot(module.operation, "source", cache)
        timings["lineage snapshot"] = time.perf_counter() - t0
        timings["ops"] = len(tagged)
    return timings


def render(timings: dict[str, float], command: str, started: dt.datetime, peak_mib: float) -> str:
    ops = int(timings.pop("ops"))
    parse = timings["parse (bindings)"]
    lines = [
        BEGIN,
        "## Tagging scale: a synthetic module of %d ops" % ops,
        "",
        f"Measured {started.strftime('%Y-%m-%d %H:%M UTC')}, one process, peak RSS {peak_mib:.0f} MiB. Command:",
        "",
        "```",
        command,
        "```",
        "",
        "| step | seconds | ops/s | ratio to the bindings' parse |",
        "|---|---:|---:|---:|",
    ]
    for step, seconds in timings.items():
        lines.append(f"| {step} | {seconds:.2f} | {ops / seconds:,.0f} | {seconds / parse:.1f}x |")
    lines += ["", END]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=100_000)
    args = parser.parse_args(argv)
    command = command_line(__file__, argv)
    started = dt.datetime.now(dt.timezone.utc)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big.mlir"
        path.write_text(synthetic_module(args.ops))
        timings = measure(path)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    section = render(timings, command, started, peak_mib)
    print(section)
    update_results(section, begin=BEGIN, end=END)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
