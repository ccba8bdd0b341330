"""Memory of ``dfit reconstruct`` on big text logs: peak RSS against file size, per format.

Each text format the readers take gets a log of a given size made from a real fixture
(``/work/shared/fixtures``, as pasted by its user): the real file with one of its own
lines (a record a real log repeats: a step line, an operation-log row, a compiler
warning) written again and again right after its first occurrence until the file has
the size asked for. The log is reconstructed into a bundle (``reconstruct_bundle``,
what ``dfit reconstruct`` runs) in a fresh child process, whose peak resident set
(``ru_maxrss`` of ``RUSAGE_CHILDREN``) is compared with that of the same child over the
real file: the growth is what the file's size costs. Target: growth ≤ 10x the file's
longest line, whatever the file's size (the readers stream; repeated records are kept
once, with their count). The logs are written to a temporary folder and deleted.

    python benchmarks/reconstruct_memory.py [--sizes 5,20,50] [--formats cerebras-run-log,...]

The script replaces its section of ``benchmarks/RESULTS.md`` (and prints it).
``tests/test_reconstruct_inputs.py`` uses :func:`repeated_log` and :func:`peak_rss_of`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

BEGIN = "<!-- reconstruct_memory:begin -->"
END = "<!-- reconstruct_memory:end -->"
#: The real vendor artifacts (``../shared/fixtures`` of the checkout, as the tests find them).
FIXTURES = Path(os.environ.get("DFIT_VENDOR_FIXTURES") or REPO.parent / "shared" / "fixtures")
#: Peak RSS growth allowed, in multiples of the log's longest line.
TARGET_LINES = 10
#: What ``ru_maxrss`` of a Python child resolves here: two children reading the same
#: file differ by up to ~4 MiB (allocator arenas, GC timing), more than 10x any line.
RESOLUTION_MIB = 4.0


@dataclass(frozen=True)
class TextFormat:
    """A text format, the real file it is made from and the line of it that repeats."""

    name: str
    backend: str
    fixture: str
    #: The first line containing this text is the one repeated.
    repeated: str


FORMATS = (
    TextFormat("cerebras-run-log", "cerebras", "cerebras/alcf_bert_large_bs512_r2x/mytest.log", "Step=500,"),
    TextFormat("cerebras-compile-log", "cerebras", "cerebras/alcf_bert_large_bs512_r2x/mytest.log",
               "Compiling kernels"),
    TextFormat("cerebras-fit-log", "cerebras", "cerebras/gnn_graphsage_arxiv_client1.1.0/arxiv_wse_cache.log",
               "Train Device=CSX, Step=40,"),
    TextFormat("edgetpu-oplog", "edgetpu", "edgetpu/goalbuddy_yolov8_v16/yolov8n_full_integer_quant_edgetpu.log",
               "Mapped to Edge TPU"),
    TextFormat("edgetpu-console", "edgetpu", "edgetpu/deeppicar_cocompile_stdout_v16/log.txt",
               "Number of operations that will run on Edge TPU"),
    TextFormat("sambanova-compile-log", "sambanova",
               "sambanova/bertlarge_compile_sf1.17.7_sn30/BertLarge_HW_compile_log_base.out",
               "[warning ]: [LinearInputGradInfo] STOC Rounding"),
    TextFormat("sambanova-run-log", "sambanova", "sambanova/bertlarge_run_dp8_sf1.17.7_sn30/BertLarge.out",
               "local_step:2|"),
    TextFormat("sambatune-log", "sambanova", "sambanova/sambatune_uno_sn10_2022/ccle_09_19_22_11_50.log",
               "SUCCESS: Copy Compile Gen Folder"),
)
BY_NAME = {text_format.name: text_format for text_format in FORMATS}


def repeated_log(text_format: TextFormat, target: Path, size: int, fixtures: Path = FIXTURES) -> dict[str, int]:
    """Write the format's real file with its repeated line written again right after it
    until ``target`` has about ``size`` bytes (the real file when ``size`` is 0)."""
    data = (fixtures / text_format.fixture).read_bytes()
    lines = data.splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if text_format.repeated.encode() in line)
    line = lines[at] if lines[at].endswith(b"\n") else lines[at] + b"\n"
    copies = max(0, (size - len(data)) // len(line) + 1) if size else 0
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("wb") as stream:
        stream.writelines(lines[: at + 1])
        block = line * 4096
        for _ in range(copies // 4096):
            stream.write(block)
        stream.write(line * (copies % 4096))
        stream.writelines(lines[at + 1:])
    return {"bytes": target.stat().st_size, "copies": copies,
            "longest_line": max(len(item) for item in lines), "repeated_line": len(line)}


def measure(path: Path, backend: str) -> dict[str, Any]:
    """Reconstruct ``path`` into a temporary bundle in this process (the child's side)."""
    from dfit_mlir.adapters.reconstruct import reconstruct_bundle

    with tempfile.TemporaryDirectory() as tmp:
        summary = reconstruct_bundle([path], Path(tmp) / "b", backend)
    recovered = {k: v for k, v in summary["recovered"].items() if k != "scopes"}
    return {"recovered": recovered, "lines": summary["lines"]["total"],
            "peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}


def peak_rss_of(path: Path, backend: str, timeout: float = 1200) -> dict[str, Any]:
    """:func:`measure` in a fresh interpreter: its result and the child's peak RSS (KiB)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    done = subprocess.run([sys.executable, __file__, "--measure", str(path), "--backend", backend],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)
    if done.returncode != 0:
        raise RuntimeError(f"reconstructing {path} failed ({done.returncode}): {done.stderr[-2000:]}")
    result = json.loads(done.stdout)
    after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    # RUSAGE_CHILDREN is the largest of all children so far: it says this child's peak
    # only when this child set a new maximum; the child's own figure always does.
    result["children_max_rss_kib"] = after if after > before else None
    return result


def section(sizes: list[int], formats: list[TextFormat], command: str) -> list[str]:
    started = dt.datetime.now(dt.timezone.utc)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for text_format in formats:
            path = Path(tmp) / Path(text_format.fixture).name
            shape = repeated_log(text_format, path, 0)
            base = peak_rss_of(path, text_format.backend)
            for size in sizes:
                shape = repeated_log(text_format, path, size << 20)
                result = peak_rss_of(path, text_format.backend)
                growth = result["peak_rss_kib"] - base["peak_rss_kib"]
                bound = max(TARGET_LINES * shape["longest_line"] / 1024, RESOLUTION_MIB * 1024)
                same = result["recovered"] == base["recovered"]
                rows.append((text_format.name, shape, result, base, growth, bound, same))
                print(text_format.name, size, json.dumps(result), file=sys.stderr)
            path.unlink()
    lines = [
        BEGIN,
        "## Reconstruction memory: peak RSS against log size, every text format",
        "",
        f"Measured {started.strftime('%Y-%m-%d %H:%M UTC')} on {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}. Each log is a real fixture with one of its own lines (a record real logs "
        "repeat) written again after its first occurrence up to the size shown; `reconstruct_bundle` (what "
        "`dfit reconstruct` runs, bundle written) reads it in a fresh child process. Peak RSS is the child's "
        "`ru_maxrss` (interpreter and imports included); growth is the peak over the same child reading the "
        f"real file. Target: growth ≤ {TARGET_LINES}x the longest line, whatever the size; the longest line of "
        f"these files is under 2 KiB, below what `ru_maxrss` of a Python child resolves here (two children reading "
        f"the same file differ by up to {RESOLUTION_MIB:.0f} MiB), so 'bounded' is growth within that "
        "resolution and no trend from 5 to 50 MiB. 'same records' compares operators, tensors, partitions and "
        "measurements with the real file's (a repeated record is kept once, with `repeats` and `last_origin`). "
        "Command:",
        "",
        "```",
        command,
        "```",
        "",
        "| format | log (MiB) | lines | repeated line (B) | peak RSS (MiB) | real file's (MiB) | growth (MiB) "
        f"| bound (KiB): max({TARGET_LINES}x longest line, resolution) | bounded | same records |",
        "|---|---:|---:|---:|---:|---:|---:|---:|:-:|:-:|",
    ]
    for name, shape, result, base, growth, bound, same in rows:
        lines.append(
            f"| {name} | {shape['bytes'] / 2**20:.0f} | {result['lines']:,} | {shape['repeated_line']} | "
            f"{result['peak_rss_kib'] / 1024:.0f} | {base['peak_rss_kib'] / 1024:.0f} | {growth / 1024:.1f} | "
            f"{bound:.0f} | {'yes' if growth <= bound else '**no**'} | {'yes' if same else '**no**'} |")
    lines.append("")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="5,20,50", help="log sizes in MiB (default 5,20,50)")
    parser.add_argument("--formats", default=",".join(BY_NAME), help="formats to measure (default all)")
    parser.add_argument("--measure", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--backend", default="auto", help=argparse.SUPPRESS)
    parser.add_argument("--no-publish", action="store_true", help="print the section, leave RESULTS.md alone")
    args = parser.parse_args(argv)
    if args.measure is not None:
        print(json.dumps(measure(args.measure, args.backend)))
        return 0
    sizes = [int(size) for size in args.sizes.split(",") if size]
    unknown = [name for name in args.formats.split(",") if name not in BY_NAME]
    if unknown or not sizes or min(sizes) <= 0:
        parser.error(f"unknown formats {unknown}" if unknown else "--sizes must be positive MiB counts")
    from benchmarks.compile_overhead import command_line, publish

    lines = section(sizes, [BY_NAME[name] for name in args.formats.split(",")], command_line(__file__, argv))
    if args.no_publish:
        print("\n".join(lines))
    else:
        publish(lines, begin=BEGIN, end=END)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
