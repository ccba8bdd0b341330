"""`dfit run --driver vulkan --mode full` against `iree-benchmark-module` with the same
profiling families on the same vmfb (issue 27).

A 2-matmul MLP (the one tests/test_gpu_vulkan.py runs) is compiled once with
`dfit compile --dfit-tag --mode full --iree-hal-target-device=vulkan`; each round then
runs, alternated, (a) `iree-benchmark-module --device=vulkan` under the Vulkan row's
`full` families writing a raw profile, and (b) `dfit run --driver vulkan --mode full`
for the same number of invocations (which runs the same tool, then decodes, fits the
clock, joins and writes the bundle). Reported per variant: the median end-to-end wall
time over the rounds and the tool's own real time per invocation; the difference of the
walls is what dfit adds after the module has run.

    .venv/bin/python -m benchmarks.gpu_overhead --invocations 20 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dfit_mlir.core.toolchain import runtime_tool
from dfit_mlir.runtime_hooks.drivers import CAPABILITIES
from dfit_mlir.runtime_hooks.hal_profile import _benchmark_real_time_ns
from tests.test_gpu_vulkan import MLP, MLP_INPUTS

DFIT = [sys.executable, "-m", "dfit_mlir"]


def _timed(command: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    run = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if run.returncode != 0:
        raise SystemExit(f"{command[0]} failed: {run.stderr.strip()[-400:]}")
    return wall, run.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--invocations", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    families = ",".join(CAPABILITIES["vulkan"].full)
    with tempfile.TemporaryDirectory(prefix="dfit-gpu-bench-") as scratch:
        root = Path(scratch)
        (root / "mlp.mlir").write_text(MLP)
        _timed([*DFIT, "compile", str(root / "mlp.mlir"), "--dfit-tag", "--mode", "full",
                "--iree-hal-target-device=vulkan", "-o", str(root / "mlp.vmfb")])
        bench = [runtime_tool("iree-benchmark-module"), f"--module={root / 'mlp.vmfb'}", "--device=vulkan",
                 "--function=main", *(f"--input={value}" for value in MLP_INPUTS),
                 f"--benchmark_min_time={args.invocations}x", "--benchmark_format=json",
                 f"--device_profiling_mode={families}", f"--device_profiling_output={root / 'bench.ireeprof'}"]
        dfit = [*DFIT, "run", str(root / "mlp.vmfb"), "--driver", "vulkan", "--mode", "full",
                "--repeat", str(args.invocations), *(f"--input={value}" for value in MLP_INPUTS),
                "-o", str(root / "run"), "--force"]
        walls: dict[str, list[float]] = {"iree-benchmark-module": [], "dfit run": []}
        per_call: dict[str, list[float]] = {"iree-benchmark-module": [], "dfit run": []}
        for _ in range(args.rounds):
            wall, stdout = _timed(bench)
            walls["iree-benchmark-module"].append(wall)
            per_call["iree-benchmark-module"].append((_benchmark_real_time_ns(stdout) or 0) / 1e6)
            wall, _ = _timed(dfit)
            walls["dfit run"].append(wall)
            summary = json.loads((root / "run" / "summary.json").read_text())
            per_call["dfit run"].append(summary["invocation_ns"]["mean"] / 1e6)
        device = summary["device"]["name"]
    print(f"device: {device}; families: {families}; {args.invocations} invocations x {args.rounds} rounds")
    print("| variant | wall median (s) | walls (s) | real time per invocation (ms: the tool's mean, median of the rounds) |")
    print("|---|---:|---|---:|")
    for name in walls:
        print(f"| {name} | {statistics.median(walls[name]):.2f} | {', '.join(f'{w:.2f}' for w in walls[name])} | "
              f"{statistics.median(per_call[name]):.2f} |")
    added = statistics.median(walls["dfit run"]) - statistics.median(walls["iree-benchmark-module"])
    print(f"dfit adds {added:.2f} s per run (start-up, device check, decode, clock fit, join, bundle)")


if __name__ == "__main__":
    main()
