"""Long runs: ``dfit run --mode full --repeat N`` against ``iree-benchmark-module``
profiling the same vmfb with the same families the same number of times, side by side
in one run (issue 29). Each is a child process timed with ``/usr/bin/time -v`` style
accounting (``resource.getrusage(RUSAGE_CHILDREN)`` deltas for CPU, ``ru_maxrss`` of
the child via ``os.wait4``): wall, CPU and peak RSS.

    .venv/bin/python -m benchmarks.long_runs --invocations 1000,5000,30000 [--repeats 3]

With ``--repeats K`` each pair runs K times, alternating; the table shows the median
wall and CPU of each and the largest peak RSS (the bound must hold in every run).

Both checkouts are byte-compiled first (:func:`byte_compiled`). The module is
``examples/models/convnet.mlir`` compiled with ``dfit compile ...
--dfit-tag --mode full`` (6 dispatches, 22 profiled records per invocation).

``--baseline DIR`` also times the dfit of another checkout (``git worktree add DIR
COMMIT``) in the same alternation: a change's effect measured side by side.

``--decode-records R`` also records a profile of about R records and times its decode,
best of three, in a fresh process of this checkout (and of the baseline's, given): the
windowed reader's index pass alone, the index plus every record of every family read
into typed columns window by window (what a run reads), and the whole-file reader
(``profile_file.read_profile``: every record into typed columns at once).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from dfit_mlir.core.toolchain import runtime_tool  # the binary itself, as dfit runs it

ROOT = Path(__file__).resolve().parent.parent
FAMILIES = "host-execution,queue-events,memory-events"


def timed(command: list[str], cwd: Path | None = None, digits: int = 3,
          env: dict[str, str] | None = None) -> dict[str, float]:
    """Wall seconds, CPU seconds (user + system) and peak RSS (MiB) of ``command`` (a
    child process, measured by ``wait4``)."""
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=cwd, env=env)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    stderr = child.stderr.read().decode(errors="replace") if child.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(command)} failed: {stderr.strip()[-1500:]}")
    return {"wall_s": round(wall, digits), "cpu_s": round(usage.ru_utime + usage.ru_stime, digits),
            "rss_mib": round(usage.ru_maxrss / 1024, 1)}


#: ``python -c`` this, a checkout's root, then dfit's arguments: that checkout's dfit. Its
#: ``dfit_mlir`` comes first on the path, and its folders mapped into the package
#: (``runtime_hooks``, ``passes``, ...: pyproject's ``package-dir``) are found there too,
#: not in the editable install of this checkout.
_BASELINE_LAUNCHER = ("import runpy, sys; root = sys.argv.pop(1); sys.path.insert(0, root); import dfit_mlir; "
                      "dfit_mlir.__path__.append(root); runpy.run_module('dfit_mlir', run_name='__main__')")


def byte_compiled(root: Path) -> None:
    """Write a checkout's bytecode caches (``__pycache__``) before its dfit is timed, as
    Python does on a first import (or pip on installing a wheel) unless
    ``PYTHONDONTWRITEBYTECODE`` is set — as it is on the machines these were measured
    on, where every dfit run compiled its 59 modules again (0.09 s a run, a cost no
    installed dfit pays)."""
    import compileall

    for folder in ("dfit_mlir", "runtime_hooks", "passes", "dialects", "adapters"):  # pyproject's package-dir
        if (root / folder).is_dir():
            compileall.compile_dir(root / folder, quiet=1)


def median(runs: list[dict[str, float]]) -> dict[str, float]:
    """Each measure's median over ``runs`` (RSS: the largest, a bound must hold in every run)."""
    return {key: (max(run[key] for run in runs) if key == "rss_mib" else round(float(np.median([run[key] for run in runs])), 3))
            for key in runs[0]}


#: The decode measured in a child process of the checkout at ``sys.argv[1]`` (this one, or
#: the baseline's, so that both are timed alike): best wall and CPU of three reads of the
#: profile at ``sys.argv[2]`` by each reader, as JSON. Only names both checkouts have.
_DECODE_SCRIPT = """
import json, sys, time
from pathlib import Path
root, profile = sys.argv[1], Path(sys.argv[2])
sys.path.insert(0, root)
import dfit_mlir
dfit_mlir.__path__.insert(0, root)
from dfit_mlir.runtime_hooks import profile_file, profile_stream

def index_only():
    return sum(profile_stream.index_profile(profile).counts.values())

def windows():
    index = profile_stream.index_profile(profile)
    if not hasattr(profile_stream, "WindowReads"):  # (before it: each family of a window read on its own)
        return sum(len(index.family_window(family, w)) for family in index.counts for w in range(index.windows))
    reads, read = profile_stream.WindowReads(index, [tuple(index.counts)]), 0
    for w in range(index.windows):
        read += sum(len(reads(w, family)) for family in index.counts)
        reads.forget_before(w + 1)
    return read

def whole():
    return sum(len(r) for r in profile_file.read_profile(profile).records.values())

found = {}
for name, read in (("index", index_only), ("index + every window", windows), ("whole file", whole)):
    walls, cpus, count = [], [], 0
    for _ in range(3):
        start, cpu = time.perf_counter(), time.process_time()
        count = read()
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
    found[name] = {"records": count, "s": round(min(walls), 3), "records_per_s": round(count / min(walls)),
                   "cpu_s": round(min(cpus), 3), "records_per_cpu_s": round(count / max(min(cpus), 1e-9))}
print(json.dumps(found))
"""


def decode_rate(vmfb: Path, inputs: Path, records: int, driver: str, work: Path,
                baseline: Path | None = None) -> dict[str, Any]:
    """Records per second of the profile readers on a profile of about ``records``
    records, this checkout's and, given, ``baseline``'s (each in a process of its own,
    alternating, the best of three reads each)."""
    profile = work / "decode.ireeprof"
    n = -(-records // 22)
    subprocess.run([runtime_tool("iree-benchmark-module"), f"--module={vmfb}",
                    f"--device={driver}", f"--device_profiling_mode={FAMILIES}",
                    f"--device_profiling_output={profile}", f"--input=@{inputs}", "--function=main",
                    f"--benchmark_min_time={n}x"], check=True, capture_output=True)
    found: dict[str, Any] = {"invocations": n, "profile_mb": round(profile.stat().st_size / 1e6, 1)}
    checkouts = {"this": ROOT, **({"baseline": baseline.resolve()} if baseline is not None else {})}
    for name, root in checkouts.items():
        child = subprocess.run([sys.executable, "-c", _DECODE_SCRIPT, str(root), str(profile)], check=True,
                               capture_output=True, text=True)
        found[name] = json.loads(child.stdout)
    profile.unlink()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--invocations", default="1000,5000,30000", help="comma-separated N")
    parser.add_argument("--driver", default="local-task")
    parser.add_argument("--decode-records", type=int, default=0, help="also time the decode of a profile this big")
    parser.add_argument("--repeats", type=int, default=1,
                        help="run each pair this many times, alternating, and report the medians")
    parser.add_argument("--baseline", type=Path,
                        help="a checkout of another commit (git worktree add DIR COMMIT): its dfit, run by this "
                             "environment's Python, is timed in the same alternation")
    args = parser.parse_args()
    baseline = [sys.executable, "-c", _BASELINE_LAUNCHER, str(args.baseline.resolve())] if args.baseline else None
    print(f"load average at the start: {', '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    bin_dir = Path(sys.executable).parent
    for root in (ROOT, *([args.baseline.resolve()] if args.baseline else [])):
        byte_compiled(root)
    with tempfile.TemporaryDirectory(prefix="dfit-long-runs-") as tmp:
        work = Path(tmp)
        vmfb = work / "convnet.vmfb"
        subprocess.run([str(bin_dir / "dfit"), "compile", str(ROOT / "examples/models/convnet.mlir"), "-o", str(vmfb),
                        "--dfit-tag", "--mode", "full"], check=True, capture_output=True)
        np.save(work / "x.npy", np.random.default_rng(0).standard_normal((1, 32, 32, 3)).astype(np.float32))
        rows = []
        for n in (int(text) for text in args.invocations.split(",")):
            profile = work / f"p{n}.ireeprof"
            bundle = work / f"b{n}"
            benches, dfits, baselines = [], [], []
            for _ in range(args.repeats):  # alternating, so that a slow spell of the machine hits both
                benches.append(timed([runtime_tool("iree-benchmark-module"), f"--module={vmfb}",
                                      f"--device={args.driver}", f"--device_profiling_mode={FAMILIES}",
                                      f"--device_profiling_output={profile}", f"--input=@{work / 'x.npy'}",
                                      "--function=main", f"--benchmark_min_time={n}x", "--benchmark_format=json"]))
                size = profile.stat().st_size
                profile.unlink()
                subprocess.run(["rm", "-rf", str(bundle)], check=True)
                run = ["run", str(vmfb), "--mode", "full", "--repeat", str(n), "--driver", args.driver,
                       "--input", f"@{work / 'x.npy'}", "-o", str(bundle)]
                if baseline is not None:
                    baselines.append(timed([*baseline, *run], cwd=work))
                    subprocess.run(["rm", "-rf", str(bundle)], check=True)
                dfits.append(timed([str(bin_dir / "dfit"), *run]))
            bench, dfit = median(benches), median(dfits)
            summary = json.loads((bundle / "summary.json").read_text())
            events = sum(summary["records"][k] for k in ("dispatch", "queue", "memory"))
            row = {"invocations": n, "events": events, "route": summary.get("profile_read", {}).get("route"),
                   "profile_mb": round(size / 1e6, 1), "benchmark": bench, "dfit": dfit,
                   "wall_ratio": round(dfit["wall_s"] / bench["wall_s"], 2),
                   "cpu_ratio": round(dfit["cpu_s"] / max(bench["cpu_s"], 1e-3), 2),
                   "pairs": [{"benchmark_wall_s": b["wall_s"], "dfit_wall_s": d["wall_s"], "dfit_rss_mib": d["rss_mib"]}
                             for b, d in zip(benches, dfits, strict=True)]}
            if baselines:
                row["baseline"] = median(baselines)
                row["baseline_wall_ratio"] = round(row["baseline"]["wall_s"] / bench["wall_s"], 2)
                row["baseline_pairs"] = [b["wall_s"] for b in baselines]
            rows.append(row)
            print(json.dumps(row), flush=True)
            subprocess.run(["rm", "-rf", str(bundle)], check=True)
        if args.decode_records:
            print(json.dumps({"decode": decode_rate(vmfb, work / "x.npy", args.decode_records, args.driver, work,
                                                    args.baseline)}), flush=True)
    print(f"load average at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print("| invocations | events | .ireeprof | iree-benchmark-module wall / CPU / RSS | dfit run wall / CPU / RSS "
          "| wall ratio | CPU ratio |")
    print("|---:|---:|---:|---|---|---:|---:|")
    for r in rows:
        b, d = r["benchmark"], r["dfit"]
        print(f"| {r['invocations']:,} | {r['events']:,} | {r['profile_mb']} MB | {b['wall_s']} s / {b['cpu_s']} s / "
              f"{b['rss_mib']} MiB | {d['wall_s']} s / {d['cpu_s']} s / {d['rss_mib']} MiB | {r['wall_ratio']}x "
              f"| {r['cpu_ratio']}x |")
    for r in rows:
        if "baseline" in r:
            base = r["baseline"]
            print(f"baseline ({args.baseline}) at {r['invocations']:,} invocations: {base['wall_s']} s / "
                  f"{base['cpu_s']} s / {base['rss_mib']} MiB, wall ratio {r['baseline_wall_ratio']}x")


if __name__ == "__main__":
    main()
