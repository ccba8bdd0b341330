"""What the per-phase IR of every ID's carriers (``passes/stage_ir.py``, the manifest's
``stage_ir`` table that ``dfit view``'s stages panel shows) costs a ``--mode full`` compile.

For each model, ``--rounds`` rounds; each round compiles it twice with
``compile_instrumented(mode="full")``, each in its own Python process (order alternating
per round): ``with`` as shipped, ``without`` with the recording turned off
(``STAGE_IR_MODES = ()``). Reported: wall and CPU time (medians, and the median of each
round's paired ratio), the manifest's size with and without the table, the table's own
recording time (printing + reading the printouts), and what the table holds.

Models: the hand-written convnet (``examples/models/convnet.mlir``), ONNX light
SqueezeNet (``tests/realmodels.py``) and a ``transformers`` BERT with random weights
(``tests/frontend_models.py``, exported to torch-dialect MLIR once).

    python benchmarks/stage_ir_cost.py [--rounds 2] [--models convnet,squeezenet,bert]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.compile_overhead import command_line, nproc, publish  # noqa: E402

BEGIN = "<!-- stage_ir_cost:begin -->"
END = "<!-- stage_ir_cost:end -->"
MODELS = ("convnet", "squeezenet", "bert")

_CHILD = """
import json, resource, sys, time
from pathlib import Path
from dfit_mlir.passes import instrumented_compile as ic
if sys.argv[3] == "without":
    ic.STAGE_IR_MODES = ()
t0 = time.perf_counter()
result = ic.compile_instrumented(Path(sys.argv[1]), Path(sys.argv[2]), mode="full")
wall = time.perf_counter() - t0
usage = resource.getrusage(resource.RUSAGE_SELF)
table = result.manifest.get("stage_ir")
print(json.dumps({"wall": wall, "cpu": usage.ru_utime + usage.ru_stime,
                  "manifest_bytes": result.manifest_path.stat().st_size,
                  "stage_ir_bytes": len(json.dumps(table, separators=(",", ":"))) if table else 0,
                  "record_s": table["time_s"] if table else 0.0,
                  "texts": table["texts"]["count"] if table else 0,
                  "carriers": len(table["carriers"]) if table else 0,
                  "unrecorded": table["unrecorded"] if table else {}}))
"""

#: The recording's own CPU time, isolated from the compile's noise: each phase's module
#: is snapshotted twice back to back, without and with the recording (CPU seconds).
_CHILD_SNAPSHOTS = """
import json, sys, time
from pathlib import Path
from dfit_mlir import toolchain
from dfit_mlir.passes import mlir_engine, phases, snapshot, stage_ir
driver = phases.open_driver([])
module = driver.parse(Path(sys.argv[1]))
mlir_engine.tag_module(module)
mlir_engine.strip_dfit_attributes(module)
cache = snapshot.LocationCache()
texts = stage_ir.StageIR()
plain = recorded = phase_cpu = 0.0
after = None
for phase in (None, *toolchain.IREE_PHASES):
    if phase is not None:
        t0 = time.process_time()
        module = driver.run(module, after, phase)
        phase_cpu += time.process_time() - t0
        after = phase
    t0 = time.process_time()
    snapshot.take_snapshot(module, phase or "source", cache)
    t1 = time.process_time()
    snapshot.take_snapshot(module, phase or "source", cache, texts)
    t2 = time.process_time()
    plain += t1 - t0
    recorded += t2 - t1
driver.close()
print(json.dumps({"snapshot_cpu": plain, "with_recording_cpu": recorded, "phases_cpu": phase_cpu}))
"""


def snapshot_cost(source: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", _CHILD_SNAPSHOTS, str(source)], capture_output=True, text=True, cwd=REPO)
    if done.returncode != 0:
        raise SystemExit(f"stage_ir_cost: snapshots of {source} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def build_input(name: str, workdir: Path) -> Path:
    if name == "convnet":
        return REPO / "examples" / "models" / "convnet.mlir"
    if name == "squeezenet":
        from tests import realmodels

        return realmodels.onnx_model("squeezenet", workdir)
    if name == "bert":
        target = workdir / "bert_seq8.mlir"
        if not target.is_file():
            from dfit_mlir.frontends import torch as torch_frontend
            from tests import frontend_models

            model, args = frontend_models.bert()
            target.write_text(torch_frontend.export_mlir(model, args))
        return target
    raise SystemExit(f"stage_ir_cost: unknown model {name!r} (one of {', '.join(MODELS)})")


def compile_once(source: Path, variant: str, out_dir: Path) -> dict:
    output = out_dir / f"{source.stem}.{variant}.vmfb"
    done = subprocess.run([sys.executable, "-c", _CHILD, str(source), str(output), variant],
                          capture_output=True, text=True, cwd=REPO)
    if done.returncode != 0:
        raise SystemExit(f"stage_ir_cost: {source} ({variant}) failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(name: str, source: Path, rounds: int, out_dir: Path) -> dict:
    runs: dict[str, list[dict]] = {"with": [], "without": []}
    for round_index in range(rounds):
        order = ("with", "without") if round_index % 2 == 0 else ("without", "with")
        for variant in order:
            runs[variant].append(compile_once(source, variant, out_dir))

    def paired(key: str) -> float:
        return statistics.median(a[key] / b[key] for a, b in zip(runs["with"], runs["without"], strict=True))

    last = runs["with"][-1]
    snapshots = snapshot_cost(source)
    return {
        "snapshots": snapshots,
        "name": name, "runs": runs, "wall": paired("wall"), "cpu": paired("cpu"),
        "with_s": statistics.median(r["wall"] for r in runs["with"]),
        "without_s": statistics.median(r["wall"] for r in runs["without"]),
        "record_s": statistics.median(r["record_s"] for r in runs["with"]),
        "bytes_with": last["manifest_bytes"], "bytes_without": runs["without"][-1]["manifest_bytes"],
        "table_bytes": last["stage_ir_bytes"], "texts": last["texts"], "carriers": last["carriers"],
        "unrecorded": last["unrecorded"],
    }


def render(rows: list[dict], rounds: int, argv: list[str] | None, started: dt.datetime) -> list[str]:
    load = os.getloadavg()[0]
    lines = [
        BEGIN,
        "## Per-phase IR of the ID carriers (`stage_ir`): manifest size and compile time",
        "",
        f"`{command_line(__file__, argv)}`",
        "",
        f"Measured {started.strftime('%Y-%m-%d %H:%M UTC')} on {nproc()} CPUs, load average {load:.1f} at the end "
        f"(a shared machine: the paired ratios matter more than the seconds). {rounds} rounds, `--mode full`, "
        "in-process driver, each compile in its own process; `without` turns the recording off.",
        "",
        "`recording CPU` isolates the cost from the compile's noise: in one process, each phase's module is "
        "snapshotted twice back to back, without and with the recording; the figure is the sum over the 13 stages "
        "of the difference in CPU time, against the CPU time of the 12 phases themselves.",
        "",
        "| model | manifest without → with | growth | wall with / without (paired) | CPU ratio | "
        "recording CPU / phases CPU | recording (print + read) | texts / carrier lists | walls with; without (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        walls = "; ".join(", ".join(f"{r['wall']:.2f}" for r in row["runs"][v]) for v in ("with", "without"))
        growth = row["bytes_with"] / row["bytes_without"] - 1
        snapshots = row["snapshots"]
        extra, phases_cpu = snapshots["with_recording_cpu"] - snapshots["snapshot_cpu"], snapshots["phases_cpu"]
        lines.append(
            f"| {row['name']} | {row['bytes_without'] / 1024:.0f} → {row['bytes_with'] / 1024:.0f} KiB | "
            f"+{growth:.0%} | {row['wall']:.3f}x | {row['cpu']:.3f}x | {extra:.2f} s / {phases_cpu:.1f} s "
            f"(+{extra / phases_cpu:.1%}) | {row['record_s']:.2f} s of "
            f"{row['with_s']:.1f} s ({row['record_s'] / row['with_s']:.1%}) | {row['texts']} / {row['carriers']} | "
            f"{walls} |")
    unrecorded = {row["name"]: row["unrecorded"] for row in rows if row["unrecorded"]}
    lines += ["", f"Phases not recorded (printout and walk disagreed): {unrecorded or 'none'}."]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--workdir", type=Path, default=REPO / "build" / "models")
    args = parser.parse_args(argv)
    started = dt.datetime.now(dt.timezone.utc)
    out_dir = REPO / "build" / "bench-stage-ir"
    out_dir.mkdir(parents=True, exist_ok=True)
    args.workdir.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.models.split(","):
        t0 = time.perf_counter()
        rows.append(measure(name, build_input(name, args.workdir), args.rounds, out_dir))
        print(f"{name}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    publish(render(rows, args.rounds, argv, started), begin=BEGIN, end=END)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
