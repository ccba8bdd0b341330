"""The time split of a fused dispatch against the ops timed apart (issue 28): a Linear
fused with an activation (torch frontend, ``llvm-cpu``, ``local-sync``: one thread),
two sizes each. dfit's split (``dfit_mlir.analysis.op_timing.measure``: each compute op
cut out of the compiled input, compiled alone, timed by ``dfit run --mode full``, the
least median of ``op_timing.ROUNDS`` runs) against the reference: ``nn.Linear`` and the
activation compiled as models of their own and timed the same way.

    .venv/bin/python -m benchmarks.time_split

A comparison of microsecond timings across processes: it lives here, not in the tests
(``tests/test_time_split.py`` checks the mechanism), because two runs of the suite on
this shared 2-core machine saw one process time a 16x128 GELU at 2.9 us where it takes
1.2-1.7 us, and a SiLU split 0.25 against 0.16 apart. The result replaces this
benchmark's section of ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BEGIN = "<!-- time_split:begin -->"
END = "<!-- time_split:end -->"
#: (rows, in features, out features): the issue's small case and one 8x bigger each way.
SIZES = ((16, 64, 128), (128, 256, 512))
ACTIVATIONS = ("gelu", "silu", "softmax")
#: Invocations per run (medians over them) and warm-up invocations.
REPEAT = 300
WARMUP = 20
#: The agreement the issue asks for: dfit's activation share within this of the apart share.
TOLERANCE = 0.08
DRIVER = "local-sync"


def activation(name: str) -> Any:
    import torch

    return {"gelu": torch.nn.GELU(), "silu": torch.nn.SiLU(), "softmax": torch.nn.Softmax(dim=-1)}[name]


def compile_model(module: Any, example: Any, folder: Path) -> Any:
    from dfit_mlir.frontends import torch as torch_frontend

    folder.mkdir(parents=True, exist_ok=True)
    return torch_frontend.compile(module.eval(), (example,), output=folder / "m.vmfb", mode="ids", quiet=True)


def run(compiled: Any, folder: Path) -> Path:
    from dfit_mlir.runtime_hooks.run import run_bundle

    return run_bundle(compiled.vmfb, compiled.manifest_path, folder, mode="full", repeat=REPEAT, warmup=WARMUP,
                      driver=DRIVER).bundle


def timed_apart_ns(module: Any, example: Any, folder: Path) -> float:
    """``module`` as a model of its own: the least over ``op_timing.ROUNDS`` runs of the
    median over invocations of its summed dispatch durations (dfit's estimator)."""
    from dfit_mlir.analysis import op_timing

    compiled = compile_model(module, example, folder)
    return min(op_timing.bundle_timing(run(compiled, folder / f"run{i}"), REPEAT).ns
               for i in range(op_timing.ROUNDS))


def site_median_ns(bundle: Path, site: int) -> float:
    import pyarrow.parquet as pq

    events = pq.read_table(bundle / "events.parquet", columns=["kind", "site", "duration_ns"]).to_pylist()
    return float(statistics.median(e["duration_ns"] for e in events if e["kind"] == "dispatch" and e["site"] == site))


def measure_case(name: str, rows: int, features: int, out: int, work: Path) -> dict[str, Any]:
    """One Linear + activation: dfit's split of the fused model against the parts apart."""
    import torch

    from dfit_mlir.analysis import ledger, op_timing
    from dfit_mlir.analysis.model import SemanticModel

    os.environ[op_timing.CACHE_DIR_ENV] = str(work / "cache")  # a fresh cache: nothing reused
    torch.manual_seed(0)
    linear = torch.nn.Linear(features, out)
    x = torch.randn(rows, features)
    fused_bundle = run(compile_model(torch.nn.Sequential(linear, activation(name)), x, work / "fused"),
                       work / "fused" / "run")
    model = SemanticModel.open(fused_bundle)
    roofline = ledger.Ledger(model)
    timed = [p for p in model.partitions if p.kind == "dispatch" and roofline.partition_ns(p.id) > 0]
    (root,) = [p for p in timed if p.root_id and "linear" in p.root_id]
    act_ids = {i for p in timed for i in model.compute_ops(p) if "linear" not in i}
    fused = bool(act_ids & set(model.compute_ops(root)))

    def act_share(book: Any) -> float:
        return sum(ns for op_id, ns in book.op_time().items() if op_id in act_ids) / book.attributed_time_ns

    roofline_share = act_share(roofline)
    report = op_timing.measure(model, timed, repeat=REPEAT, warmup=WARMUP, calibrate_elements=False)
    if report.failed:
        raise SystemExit(f"time_split: ops not timed alone: {report.failed}")
    measured = ledger.Ledger(model)
    linear_ns = timed_apart_ns(linear, x, work / "linear")
    act_ns = timed_apart_ns(activation(name), torch.randn(rows, out), work / "act")
    fused_ns = site_median_ns(fused_bundle, root.attributes["site"])
    apart = act_ns / (linear_ns + act_ns)
    share = act_share(measured)
    return {"activation": name, "shape": f"{rows}x{features} → {out}", "fused": fused, "fused_ns": fused_ns,
            "linear_ns": linear_ns, "activation_ns": act_ns, "apart_share": apart, "measured_share": share,
            "roofline_share": roofline_share, "measured_ops_ns": dict(report.measured),
            "fused_minus_linear": max(0.0, fused_ns - linear_ns) / fused_ns, "gap": abs(share - apart)}


def microseconds(ns: float) -> str:
    return f"{ns / 1000:.3g} µs"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-publish", action="store_true", help="print the section, leave RESULTS.md alone")
    args = parser.parse_args(argv)
    from benchmarks.compile_overhead import command_line, publish

    command = command_line(__file__, argv).replace("python benchmarks/time_split.py",
                                                   ".venv/bin/python -m benchmarks.time_split")
    started = dt.datetime.now(dt.timezone.utc)
    load_before = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory(prefix="dfit-time-split-") as tmp:
        for name in ACTIVATIONS:
            for rows_, features, out in SIZES:
                row = measure_case(name, rows_, features, out, Path(tmp) / f"{name}-{rows_}")
                rows.append(row)
                print(json.dumps(row), flush=True)
    load_after = os.getloadavg()
    from dfit_mlir.analysis import op_timing

    lines = [BEGIN, "## Time split of a fused dispatch: measured-standalone against the ops timed apart (issue 28)",
             "", f"    {command}", "",
             f"Measured {started.strftime('%Y-%m-%d %H:%M UTC')}; load average {load_before[0]:.1f} at the start, "
             f"{load_after[0]:.1f} at the end (2-core machine). A Linear fused with an activation (torch frontend, "
             f"`llvm-cpu`, `{DRIVER}`: one thread). dfit's split: each compute op of the dispatch cut out of the "
             "compiled input, compiled alone with the same flags, timed with `dfit run --mode full` in "
             f"{op_timing.ROUNDS} separate runs of {REPEAT} invocations ({WARMUP} warm-up), the least of the runs' "
             "medians (`op_timing.ROUNDS`: interference only adds time); the ledger splits the dispatch in those "
             "proportions (`time_model` `measured-standalone`). The reference: `nn.Linear` and the activation "
             "compiled as models of their own and timed the same way. \"Activation share\" = activation / "
             "(Linear + activation); \"fused − Linear\" = (the fused dispatch's median in one run − the Linear "
             "alone) / the fused dispatch, for comparison with the issue's figure (one run's median: it carries "
             "that run's interference).", "",
             "| fused | shape (rows x in → out) | fused dispatch (median) | Linear alone | activation alone | "
             "apart share | dfit measured-standalone | roofline (before) | fused − Linear |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    labels = {"gelu": "Linear + GELU (erf)", "silu": "Linear + SiLU", "softmax": "Linear, softmax"}
    for row in rows:
        fused_ns = microseconds(row["fused_ns"]) + ("" if row["fused"] else " (Linear's)")
        measured = f"{row['measured_share']:.1%}" + ("" if row["fused"] else " (own dispatch)")
        fused_minus_linear = f"{row['fused_minus_linear']:.1%}" if row["fused"] else "—"
        lines.append(f"| {labels[row['activation']]} | {row['shape']} | {fused_ns} | {microseconds(row['linear_ns'])} | "
                     f"{microseconds(row['activation_ns'])} | {row['apart_share']:.1%} | {measured} | "
                     f"{row['roofline_share']:.2%} | {fused_minus_linear} |")
    fused_rows = [row for row in rows if row["fused"]]
    worst = max((row["gap"] for row in fused_rows), default=0.0)
    within = all(row["gap"] <= TOLERANCE for row in fused_rows)
    lines += ["", f"Where the activation is fused, dfit's share is within {worst:.3f} of the apart share (target "
              f"≤ {TOLERANCE}: {'met' if within else 'NOT met'}); the roofline's is 0.1-0.3 off. IREE does not "
              "fuse a softmax into the matmul's dispatch on `llvm-cpu` (it is a reduction): each dispatch runs "
              "one op and no model splits anything; those shares are the run's own dispatch times (sums, so "
              "preemption spikes enter them), recorded, not held to the target."]
    if args.no_publish:
        print("\n".join([*lines, "", END]))
    else:
        publish(lines, begin=BEGIN, end=END)
    return 0 if within else 1


if __name__ == "__main__":
    sys.exit(main())
