"""Runtime overhead of dfit's run modes against an uninstrumented run, on the real models
of ``tests/realmodels.py``.

Two harnesses, each with its own uninstrumented baseline, because ``lite`` needs this
process (the Python hook module) and ``full`` needs the shipped tools (the HAL
profiler):

* in this process, timing calls through ``dfit_mlir.instrument`` with results read back
  to host (mean time per call over a run of about ``--run-ms``):
  ``none``    the plain ``iree-compile`` module, nothing recorded;
  ``ids``     the ``--mode ids`` module, one program event per call;
  ``lite``    the ``--mode lite`` module (function probes) with the hook module;
  ``tensors`` a ``--tensors '*'`` module (every op's value traced), statistics of one
              call in ``--tensor-sample`` per ID;
* with ``iree-benchmark-module`` (real time per invocation):
  ``none-tool`` the plain module; ``full`` the ``--mode full`` module under HAL
  profiling of host-execution, queue and memory events — what ``dfit run --mode full``
  executes.

Variants alternate within each round (order rotated per round); the report gives the
median over rounds of each round's ratio to that round's baseline of the same harness.
The result replaces this benchmark's section of ``benchmarks/RESULTS.md``.

    python benchmarks/runtime_overhead.py [--rounds 7] [--run-ms 500] [--driver local-task] [--models ...]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.compile_overhead import build_inputs, command_line, publish  # noqa: E402
from dfit_mlir.core.toolchain import runtime_tool  # noqa: E402
from dfit_mlir.passes.instrumented_compile import compile_instrumented  # noqa: E402
from dfit_mlir.passes.plain_compile import plain_compile  # noqa: E402
from dfit_mlir.runtime_hooks import hal_profile  # noqa: E402
from dfit_mlir.runtime_hooks.inputs import entry_function, load_input, random_inputs, signature  # noqa: E402
from dfit_mlir.runtime_hooks.instrument import InstrumentedModule  # noqa: E402
from dfit_mlir.runtime_hooks.tensors import TensorPolicy  # noqa: E402

BEGIN = "<!-- runtime_overhead:begin -->"
END = "<!-- runtime_overhead:end -->"
IN_PROCESS = ("none", "ids", "lite", "tensors")
TOOL = ("none-tool", "full")
VARIANTS = IN_PROCESS + TOOL
BASELINE = {"ids": "none", "lite": "none", "tensors": "none", "full": "none-tool"}
TARGETS = {"ids": 1.005, "lite": 1.01, "full": 1.03}


def time_per_invocation(vmfb: Path, function: str, inputs: list[str], driver: str, iterations: int,
                        profile: Path | None) -> float:
    """Real time per invocation in ms, as iree-benchmark-module measures it."""
    command = [runtime_tool("iree-benchmark-module"), f"--module={vmfb}", f"--function={function}",
               f"--device={driver}", f"--benchmark_min_time={iterations}x", "--benchmark_format=json",
               *(f"--input={value}" for value in inputs)]
    if profile is not None:
        command += [f"--device_profiling_mode={','.join(hal_profile.FULL_FAMILIES)}",
                    f"--device_profiling_output={profile}"]
    run = subprocess.run(command, capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"runtime_overhead: {shlex.join(command)} failed:\n{run.stderr.strip()[-2000:]}")
    result = json.loads(run.stdout)["benchmarks"][0]
    scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[result["time_unit"]]
    return result["real_time"] * scale


def time_in_process(module: InstrumentedModule, function: str, arrays: list, iterations: int) -> float:
    """Mean ms per call over ``iterations`` calls (results read back to host)."""
    started = time.perf_counter()
    for _ in range(iterations):
        module.call(function, *arrays, wait=True)
    return (time.perf_counter() - started) * 1e3 / iterations


def _alternate(modules: dict[str, InstrumentedModule], plain: Path, full: Path, profile: Path, function: str,
               inputs: list[str], arrays: list, args: argparse.Namespace) -> dict[str, list[float]]:
    """ms per call of every variant, ``args.rounds`` rounds, order rotated per round."""
    # Sub-millisecond models need many invocations per run to rise above the noise.
    once = time_per_invocation(plain, function, inputs, args.driver, 10, None)
    iterations = max(10, min(5000, math.ceil(args.run_ms / max(once, 1e-3))))
    for module in modules.values():
        time_in_process(module, function, arrays, 3)  # warm-up
    tool = {"none-tool": (plain, None), "full": (full, profile)}
    samples: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    for round_index in range(args.rounds):
        shift = round_index % len(VARIANTS)
        for variant in VARIANTS[shift:] + VARIANTS[:shift]:
            if variant in modules:
                samples[variant].append(time_in_process(modules[variant], function, arrays, iterations))
            else:
                vmfb, profile_path = tool[variant]
                samples[variant].append(time_per_invocation(vmfb, function, inputs, args.driver, iterations,
                                                            profile_path))
    samples["iterations"] = [iterations]
    return samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--run-ms", type=float, default=500.0,
                        help="aim each timed run at this many milliseconds (sets the iterations per model)")
    parser.add_argument("--driver", default="local-task", choices=["local-task", "local-sync"])
    parser.add_argument("--tensor-sample", type=int, default=10, help="tensors: statistics of 1 call in N per ID")
    parser.add_argument("--models", default=None, help="comma-separated subset (default: all)")
    args = parser.parse_args(argv)
    command = command_line(__file__, argv)
    started = dt.datetime.now(dt.timezone.utc)
    selected = set(args.models.split(",")) if args.models else None
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        for label, source in build_inputs(REPO / "build" / "models", selected).items():
            stem = label.replace(":", "_")
            plain = workdir / f"{stem}.plain.vmfb"
            plain_compile(source, plain, [])
            compiled = {mode: compile_instrumented(source, workdir / f"{stem}.{mode}.vmfb", mode=mode)
                        for mode in ("ids", "lite", "full")}
            traced = compile_instrumented(source, workdir / f"{stem}.tensors.vmfb", mode="ids", trace_tensors=("*",))
            function = entry_function(compiled["ids"].manifest, None)
            inputs = random_inputs(signature(compiled["ids"].manifest, function), workdir)
            arrays = [load_input(text) for text in inputs]
            with contextlib.ExitStack() as stack:
                load = stack.enter_context
                modules = {
                    "none": load(InstrumentedModule(plain, compiled["ids"].manifest, mode="none",
                                                    driver=args.driver, check_vmfb=False)),
                    "ids": load(InstrumentedModule(compiled["ids"].vmfb, mode="ids", driver=args.driver)),
                    "lite": load(InstrumentedModule(compiled["lite"].vmfb, mode="lite", driver=args.driver)),
                    "tensors": load(InstrumentedModule(traced.vmfb, mode="ids", driver=args.driver,
                                                       tensors=TensorPolicy(sample_every=args.tensor_sample))),
                }
                samples = _alternate(modules, plain, compiled["full"].vmfb, workdir / f"{stem}.prof", function,
                                     inputs, arrays, args)
            ratios = {variant: statistics.median(v / b for v, b in zip(samples[variant], samples[base], strict=True))
                      for variant, base in BASELINE.items()}
            iterations = int(samples.pop("iterations")[0])
            medians = {variant: statistics.median(values) for variant, values in samples.items()}
            rows.append((label, iterations, medians, ratios, len(traced.manifest["tensor_traces"])))
            print(f"{label:<32} " + ", ".join(f"{v} {ratios[v]:.3f}x" for v in BASELINE), flush=True)
    lines = [
        BEGIN,
        f"## Runtime overhead: `dfit run` modes vs an uninstrumented run ({args.driver})",
        "",
        f"Measured {started.strftime('%Y-%m-%d %H:%M UTC')}; {args.rounds} rounds, each timing about "
        f"{args.run_ms:.0f} ms of invocations per variant, variants alternating; ratios are medians of per-round "
        "ratios to the baseline of the same harness (`none`: in-process calls through `dfit_mlir.instrument`, "
        "results read back; `none-tool`: iree-benchmark-module real time). `tensors` traces every op's value "
        f"and keeps statistics of 1 call in {args.tensor_sample} per ID. Targets from the DFIT paper's 3.53% / 8.26% "
        "/ 13.62%: ids ≤ 1.005x, lite ≤ 1.01x, full ≤ 1.03x. Command:",
        "",
        "```",
        command,
        "```",
        "",
        "| model | calls per run | none (ms) | none-tool (ms) | ids / none | lite / none | full / none-tool "
        "| tensors / none (traced ops) | ids ≤ 1.005x | lite ≤ 1.01x | full ≤ 1.03x |",
        "|---|---:|---:|---:|---:|---:|---:|---:|:-:|:-:|:-:|",
    ]
    for label, iterations, medians, ratios, traces in rows:
        verdicts = " | ".join("yes" if ratios[v] <= TARGETS[v] else "**no**" for v in ("ids", "lite", "full"))
        lines.append(
            f"| {label} | {iterations} | {medians['none']:.3f} | {medians['none-tool']:.3f} | {ratios['ids']:.3f}x | "
            f"{ratios['lite']:.3f}x | {ratios['full']:.3f}x | {ratios['tensors']:.3f}x ({traces}) | {verdicts} |"
        )
    publish(lines, begin=BEGIN, end=END)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
