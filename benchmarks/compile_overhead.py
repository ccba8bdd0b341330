"""Compile-time overhead of ``dfit compile --dfit-tag`` against a plain compile.

For every real model of ``tests/realmodels.py`` (inputs built into ``build/models``), run
``--rounds`` rounds; each round times, as subprocess wall time, in an order that rotates
from round to round:

* ``plain``: ``dfit compile IN -o X.vmfb`` (no ``--dfit-tag``: a plain ``iree-compile``);
* ``ids``:   ``dfit compile IN --dfit-tag --mode ids -o X.vmfb``;
* ``full``:  ``dfit compile IN --dfit-tag --mode full -o X.vmfb``;
* ``passes``: ``dfit compile IN --dfit-tag --mode full --lineage passes -o X.vmfb`` (the
  pass-level lineage: iree-compile per phase, printing each IR unit after each pass that
  changed it, replayed by dfit on a thread beside the compile), with the growth of its
  manifest over ``full``'s and, from that manifest, how long the replay took and how much
  of it the compile waited for at its end.

Other work on the machine skews the times, so the 1-minute load average is recorded before
every round and reported with the results.

The machine's speed drifts, so the variants alternate within a round and the report uses
medians. The result replaces this benchmark's section of ``benchmarks/RESULTS.md``.

    python benchmarks/compile_overhead.py [--rounds 3] [--models squeezenet,...]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests import realmodels  # noqa: E402

RESULTS = REPO / "benchmarks" / "RESULTS.md"
BEGIN = "<!-- compile_overhead:begin -->"
END = "<!-- compile_overhead:end -->"
VARIANTS = {
    "plain": [],
    "ids": ["--dfit-tag", "--mode", "ids"],
    "full": ["--dfit-tag", "--mode", "full"],
    "passes": ["--dfit-tag", "--mode", "full", "--lineage", "passes"],
}
TARGETS = {"ids": 1.10, "full": 1.30, "passes": 3.0}


def dfit_executable() -> str:
    beside = Path(sys.executable).parent / "dfit"
    found = str(beside) if beside.is_file() else shutil.which("dfit")
    if not found:
        sys.exit("compile_overhead: the dfit command is not installed (pip install -e .)")
    return found


def build_inputs(workdir: Path, selected: set[str] | None) -> dict[str, Path]:
    inputs: dict[str, Path] = {}
    for name in realmodels.ONNX_MODELS:
        label = f"onnx:{name}"
        if selected is None or name in selected or label in selected:
            inputs[label] = realmodels.onnx_model(name, workdir)
    for name, path in realmodels.TFLITE_MODELS.items():
        label = f"tflite:{name}"
        if selected is not None and name not in selected and label not in selected:
            continue
        try:
            inputs[label] = realmodels.tflite_model(path, workdir)
        except realmodels.FixtureUnavailable as reason:
            print(f"skipping {label}: {reason}", file=sys.stderr)
    return inputs


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def manifest_bytes(source: Path, variant: str, out_dir: Path) -> int:
    """Size of the manifest the last compile of ``variant`` wrote (0 for plain)."""
    path = out_dir / f"{source.stem}.{variant}.manifest.json"
    return path.stat().st_size if path.is_file() else 0


def time_compile(dfit: str, source: Path, variant: str, out_dir: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds user+sys) of one compile as a subprocess."""
    output = out_dir / f"{source.stem}.{variant}.vmfb"
    command = [dfit, "compile", str(source), *VARIANTS[variant], "-o", str(output)]
    cpu_before = _children_cpu()
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - started
    cpu = _children_cpu() - cpu_before
    if done.returncode != 0:
        raise SystemExit(
            f"compile_overhead: {shlex.join(command)} failed (exit {done.returncode}):\n{done.stderr.strip()[-4000:]}"
        )
    return wall, cpu


def replay_seconds(source: Path, out_dir: Path) -> tuple[float, float]:
    """(busy, waited) seconds of the pass replay the last ``passes`` compile recorded."""
    import json

    path = out_dir / f"{source.stem}.passes.manifest.json"
    timing = json.loads(path.read_text(encoding="utf-8"))["pass_history"].get("replay_s", {})
    return float(timing.get("busy", 0.0)), float(timing.get("waited", 0.0))


def summarize(label: str, samples: dict[str, list[float]], cpu: dict[str, list[float]]) -> dict:
    """Medians, and the median over rounds of each round's ratio to that round's plain
    compile: pairing within a round cancels most of the machine's drift between rounds."""
    def paired(values: dict[str, list[float]], variant: str) -> float:
        return statistics.median(v / p for v, p in zip(values[variant], values["plain"], strict=True))

    return {
        "label": label,
        "samples": samples,
        "median": {variant: statistics.median(values) for variant, values in samples.items()},
        "wall": {variant: paired(samples, variant) for variant in TARGETS},
        "cpu": {variant: paired(cpu, variant) for variant in TARGETS},
        "rounds_passes": [(v / p, c / q) for v, p, c, q in zip(samples["passes"], samples["plain"], cpu["passes"],
                                                               cpu["plain"], strict=True)],
    }


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def nproc() -> str:
    try:
        return subprocess.run(["nproc"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return str(os.cpu_count())


def render(rows: list[dict], rounds: int, command: str, started: dt.datetime, elapsed: float) -> str:
    from dfit_mlir.core import toolchain

    versions = ", ".join(f"{package} {version}" for package, version in toolchain.versions().items())
    lines = [
        BEGIN,
        "## Compile overhead: `dfit compile --dfit-tag` vs plain",
        "",
        f"Measured {started.strftime('%Y-%m-%d %H:%M UTC')} on {nproc()} CPUs (`nproc`), {cpu_model()}; "
        f"Python {platform.python_version()}, {versions}.",
        f"{rounds} rounds per model, the four variants alternating within each round (order rotated per round); "
        f"whole run {elapsed / 60:.1f} min. Times are subprocess wall seconds (medians). Ratios are the median "
        "over rounds of each round's ratio to that round's plain compile, for wall time and for CPU time "
        "(user+sys of the compile and its threads); the targets are judged on the wall ratio.",
        "",
        "Command:",
        "",
        "```",
        command,
        "```",
        "",
        "Each variant is `dfit compile IN [flags] -o X.vmfb` with the default llvm-cpu host target: "
        "`plain` has no `--dfit-tag` (it runs `iree-compile`), `ids` adds `--dfit-tag --mode ids`, "
        "`full` adds `--dfit-tag --mode full`, `passes` adds `--dfit-tag --mode full --lineage passes`. "
        "The manifest columns are the sizes `full` and `passes` wrote.",
        "",
        "| model | plain (s) | ids (s) | full (s) | passes (s) | ids / plain wall (cpu) | full / plain wall (cpu) "
        "| passes / plain wall (cpu) | ids ≤ 1.10x | full ≤ 1.30x | passes ≤ 3x | manifest full → passes "
        "| samples plain / ids / full / passes (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|:-:|:-:|:-:|---:|---|",
    ]
    for row in rows:
        med, wall, cpu = row["median"], row["wall"], row["cpu"]
        samples = " / ".join(", ".join(f"{value:.2f}" for value in row["samples"][variant]) for variant in VARIANTS)
        ratios = " | ".join(f"{wall[variant]:.3f}x ({cpu[variant]:.3f}x)" for variant in TARGETS)
        verdicts = " | ".join("yes" if wall[variant] <= target else "**no**" for variant, target in TARGETS.items())
        full_kb, passes_kb = row["manifest_bytes"]["full"] / 1024, row["manifest_bytes"]["passes"] / 1024
        lines.append(
            f"| {row['label']} | {med['plain']:.2f} | {med['ids']:.2f} | {med['full']:.2f} | {med['passes']:.2f} | "
            f"{ratios} | {verdicts} | {full_kb:.0f} → {passes_kb:.0f} KiB (+{passes_kb / full_kb - 1:.0%}) | {samples} |"
        )
    lines += [
        "",
        "The `passes` variant round by round (paired ratios wall (cpu); the load is the 1-minute load "
        "average before the round; replay: the Python replay of the dumps, which runs on a thread beside "
        "the compile, and the part of it the compile waited for at its end):",
        "",
        "| model | passes / plain per round | load per round | replay busy (s) | replay waited (s) |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        per_round = ", ".join(f"{wall:.2f}x ({cpu:.2f}x)" for wall, cpu in row["rounds_passes"])
        loads = ", ".join(f"{load:.1f}" for load in row["loads"])
        busy = ", ".join(f"{b:.2f}" for b, _ in row["replay"])
        waited = ", ".join(f"{w:.2f}" for _, w in row["replay"])
        lines.append(f"| {row['label']} | {per_round} | {loads} | {busy} | {waited} |")
    lines += ["", END]
    return "\n".join(lines) + "\n"


def update_results(section: str, path: Path = RESULTS, *, begin: str = BEGIN, end: str = END) -> None:
    """Replace the section between ``begin`` and ``end`` markers (or append it)."""
    from dfit_mlir.core import atomic

    if path.is_file():
        text = path.read_text(encoding="utf-8")
    else:
        text = "# Benchmark results\n\nWritten by the scripts in `benchmarks/`; each owns one section.\n\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        tail = rest.split(end, 1)[1].lstrip("\n")
        text = head + section + ("\n" + tail if tail else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    atomic.write_text(path, text)


def command_line(script: str, argv: list[str] | None) -> str:
    """The command that reruns benchmark ``script`` (its ``__file__``) with ``argv``
    (default: this process's arguments), as RESULTS.md quotes it."""
    return shlex.join(["python", f"benchmarks/{Path(script).name}", *(sys.argv[1:] if argv is None else argv)])


def publish(lines: list[str], *, begin: str, end: str) -> None:
    """Close a section started with ``begin``, write it to RESULTS.md and print it."""
    section = "\n".join([*lines, "", end]) + "\n"
    update_results(section, begin=begin, end=end)
    print(section)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds per model (default 3)")
    parser.add_argument("--models", default=None,
                        help="comma-separated subset, e.g. squeezenet,franco_fc (default: all)")
    parser.add_argument("--workdir", type=Path, default=REPO / "build" / "models", help="where inputs are built")
    parser.add_argument("--results", type=Path, default=RESULTS, help="markdown file to update")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")

    command = command_line(__file__, argv)  # what RESULTS.md quotes: no machine's paths
    started = dt.datetime.now(dt.timezone.utc)
    t0 = time.perf_counter()
    dfit = dfit_executable()
    selected = set(args.models.split(",")) if args.models else None
    inputs = build_inputs(args.workdir, selected)
    if not inputs:
        sys.exit("compile_overhead: no model selected or available")
    out_dir = REPO / "build" / "bench"
    out_dir.mkdir(parents=True, exist_ok=True)
    order = list(VARIANTS)
    rows = []
    for label, source in inputs.items():
        samples: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
        cpu: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
        loads, replay = [], []
        for round_index in range(args.rounds):
            shift = round_index % len(order)
            loads.append(os.getloadavg()[0])
            for variant in order[shift:] + order[:shift]:
                wall, cpu_s = time_compile(dfit, source, variant, out_dir)
                samples[variant].append(wall)
                cpu[variant].append(cpu_s)
                if variant == "passes":
                    replay.append(replay_seconds(source, out_dir))
                print(f"{label:<40} round {round_index + 1}/{args.rounds} {variant:<6} {wall:7.2f} s wall "
                      f"{cpu_s:7.2f} s cpu (load {loads[-1]:.1f})", flush=True)
        row = summarize(label, samples, cpu)
        row["loads"], row["replay"] = loads, replay
        row["manifest_bytes"] = {variant: manifest_bytes(source, variant, out_dir) for variant in ("full", "passes")}
        rows.append(row)
        print(f"{label:<40} paired wall ratio " + ", ".join(f"{v} {row['wall'][v]:.3f}x" for v in TARGETS)
              + "; cpu " + ", ".join(f"{v} {row['cpu'][v]:.3f}x" for v in TARGETS), flush=True)
    section = render(rows, args.rounds, command, started, time.perf_counter() - t0)
    update_results(section, args.results)
    print(f"wrote {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
