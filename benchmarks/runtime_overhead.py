"""Runtime overhead of dfit's run modes against an uninstrumented run, on the real models
of ``tests/realmodels.py``.

Each variant is ``iree-benchmark-module`` timing enough invocations of the model's
function to last about ``--run-ms`` (real time per invocation, as the tool reports it):

* ``none``: the plain ``iree-compile`` module, no profiling;
* ``ids``:  the ``dfit compile --dfit-tag --mode ids`` module, no profiling — what
  ``dfit run --mode ids`` executes (the instrumented compile adds no hook);
* ``full``: the same module with HAL ``host-execution`` profiling on — what
  ``dfit run --mode full`` executes.

Variants alternate within each round (order rotated per round); the report gives the
median over rounds of each round's ratio to that round's ``none``. The result replaces
this benchmark's section of ``benchmarks/RESULTS.md``.

    python benchmarks/runtime_overhead.py [--rounds 7] [--run-ms 1000] [--driver local-task] [--models ...]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.compile_overhead import build_inputs, publish  # noqa: E402
from dfit_mlir.passes.instrumented_compile import compile_instrumented  # noqa: E402
from dfit_mlir.passes.plain_compile import plain_compile  # noqa: E402
from dfit_mlir.runtime_hooks.inputs import entry_function, random_inputs, signature  # noqa: E402
from dfit_mlir.toolchain import runtime_tool  # noqa: E402

BEGIN = "<!-- runtime_overhead:begin -->"
END = "<!-- runtime_overhead:end -->"
VARIANTS = ("none", "ids", "full")
TARGETS = {"ids": 1.005, "full": 1.03}


def time_per_invocation(vmfb: Path, function: str, inputs: list[str], driver: str, iterations: int,
                        profile: Path | None) -> float:
    """Real time per invocation in ms, as iree-benchmark-module measures it."""
    command = [runtime_tool("iree-benchmark-module"), f"--module={vmfb}", f"--function={function}",
               f"--device={driver}", f"--benchmark_min_time={iterations}x", "--benchmark_format=json",
               *(f"--input={value}" for value in inputs)]
    if profile is not None:
        command += ["--device_profiling_mode=host-execution", f"--device_profiling_output={profile}"]
    run = subprocess.run(command, capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"runtime_overhead: {shlex.join(command)} failed:\n{run.stderr.strip()[-2000:]}")
    result = json.loads(run.stdout)["benchmarks"][0]
    scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[result["time_unit"]]
    return result["real_time"] * scale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--run-ms", type=float, default=1000.0,
                        help="aim each timed run at this many milliseconds (sets the iterations per model)")
    parser.add_argument("--driver", default="local-task", choices=["local-task", "local-sync"])
    parser.add_argument("--models", default=None, help="comma-separated subset (default: all)")
    args = parser.parse_args(argv)
    command = shlex.join(["python", "benchmarks/runtime_overhead.py", *(sys.argv[1:] if argv is None else argv)])
    started = dt.datetime.now(dt.timezone.utc)
    selected = set(args.models.split(",")) if args.models else None
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        for label, source in build_inputs(REPO / "build" / "models", selected).items():
            stem = label.replace(":", "_")
            plain = workdir / f"{stem}.plain.vmfb"
            plain_compile(source, plain, [])
            result = compile_instrumented(source, workdir / f"{stem}.ids.vmfb", mode="ids")
            function = entry_function(result.manifest, None)
            inputs = random_inputs(signature(result.manifest, function), workdir)
            modules = {"none": (plain, None), "ids": (result.vmfb, None),
                       "full": (result.vmfb, workdir / f"{stem}.profile.bin")}
            # Sub-millisecond models need many invocations per run to rise above the noise.
            once = time_per_invocation(plain, function, inputs, args.driver, 10, None)
            iterations = max(10, min(5000, math.ceil(args.run_ms / max(once, 1e-3))))
            samples: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
            for round_index in range(args.rounds):
                shift = round_index % len(VARIANTS)
                for variant in VARIANTS[shift:] + VARIANTS[:shift]:
                    vmfb, profile = modules[variant]
                    samples[variant].append(time_per_invocation(vmfb, function, inputs, args.driver,
                                                                iterations, profile))
            ratios = {variant: statistics.median(v / n for v, n in zip(samples[variant], samples["none"], strict=True))
                      for variant in ("ids", "full")}
            medians = {variant: statistics.median(values) for variant, values in samples.items()}
            rows.append((label, iterations, medians, ratios))
            print(f"{label:<32} none {medians['none']:.3f} ms, ids {ratios['ids']:.3f}x, full {ratios['full']:.3f}x",
                  flush=True)
    lines = [
        BEGIN,
        f"## Runtime overhead: `dfit run` modes vs an uninstrumented run ({args.driver})",
        "",
        f"Measured {started.strftime('%Y-%m-%d %H:%M UTC')}; {args.rounds} rounds, each timing about "
        f"{args.run_ms:.0f} ms of invocations per variant with iree-benchmark-module (real time per invocation), "
        "variants alternating; ratios are medians of per-round ratios to `none`. Targets from the DFIT paper's "
        "3.53% (ids) and 13.62% (full): ids ≤ 1.005x, full ≤ 1.03x. Command:",
        "",
        "```",
        command,
        "```",
        "",
        "| model | invocations per run | none (ms/inv.) | ids (ms/inv.) | full (ms/inv.) | ids / none | full / none | ids ≤ 1.005x | full ≤ 1.03x |",
        "|---|---:|---:|---:|---:|---:|---:|:-:|:-:|",
    ]
    for label, iterations, medians, ratios in rows:
        lines.append(
            f"| {label} | {iterations} | {medians['none']:.3f} | {medians['ids']:.3f} | {medians['full']:.3f} | "
            f"{ratios['ids']:.3f}x | {ratios['full']:.3f}x | {'yes' if ratios['ids'] <= TARGETS['ids'] else '**no**'} | "
            f"{'yes' if ratios['full'] <= TARGETS['full'] else '**no**'} |"
        )
    publish(lines, begin=BEGIN, end=END)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
