"""Peak compute and memory bandwidth of this host, measured once per thread count and cached.

A vendor datasheet says nothing about the CPU an IREE module ran on, so the local-CPU
profile is measured instead, with as many threads as the run used (IREE's
``local-sync`` driver runs every dispatch on the calling thread; ``local-task`` spreads
workgroups over one worker per core): a float32 matmul (numpy's BLAS, its thread pool
sized by the ``*_NUM_THREADS`` variables of a child process, since a BLAS reads them once
at load) for compute — and, for int8 regions, an ``i8 x i8 -> i32`` matmul compiled by
IREE for this CPU (numpy and PyTorch have no fast int8 matmul on a CPU; IREE's own code is
what runs an int8 dispatch), run on as many IREE workers — and copies split over that
many threads for bandwidth — one of a
large array (twice the last-level cache: memory) and one of arrays that fit in the
last-level cache (cache bandwidth: the roof for a region whose data can stay resident).
Each figure is the best of a few repeats (the best run is the one the rest of the
machine disturbed least). The result is cached as JSON, keyed by host name and thread
count, so every later analysis on this host reuses the same figures::

    ${DFIT_CACHE_DIR:-${XDG_CACHE_HOME:-~/.cache}/dfit-mlir}/calibration-<hostname>-<N>threads.json

A whole calibration takes a few seconds (the int8 matmul is compiled once per measurement).
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from dfit_mlir.core import atomic
from dfit_mlir.core.errors import InvalidInputError
from dfit_mlir.core.paths import CACHE_DIR_ENV

SCHEMA = "dfit.calibration"
#: Version 2 records the thread count, version 3 the int8 peak; an older default cache is
#: measured again.
VERSION = 3
#: Environment variable naming the cache folder (tests point it at a temporary one).
#: The matmul's side for one thread; with N threads it grows by N^(1/3) (rounded up to a
#: multiple of 128) so every thread still has a 512^3 share of work.
MATMUL_SIZE = 512
#: Variables the common BLAS builds (OpenBLAS, MKL, BLIS, Accelerate, OpenMP) size their pools from.
BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
                         "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")
#: The copy's source and destination together are twice the last-level cache, within
#: these bounds, so the copy measures memory, not cache, and a whole calibration stays
#: under two seconds. Together, not each: each twice the cache, a calibration (a child of
#: the first ``dfit analyze`` on a host) peaked at 631 MiB on a host reporting a 480 MiB
#: cache; they are copied before IREE's compiler is loaded for the int8 peak (240 MiB),
#: and handed back before it.
MIN_COPY_BYTES = 64 * 1024 * 1024
MAX_COPY_BYTES = 256 * 1024 * 1024
#: Each figure is the best of at least MIN_REPEATS runs spread over at least MIN_SECONDS.
MIN_REPEATS = 5
MAX_REPEATS = 10_000
MIN_SECONDS = 0.3
#: Bytes one timed copy run moves per thread (a small chunk is copied this often).
COPY_RUN_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class CacheRoof:
    """The copy bandwidth of data resident in one cache level, for this many threads."""

    level: int
    #: Bytes the run's threads can keep resident there (a private cache counts once per thread).
    capacity_bytes: int
    bandwidth_bytes_per_s: float
    method: str


@dataclass(frozen=True)
class Calibration:
    host: str
    #: Threads the figures were measured with (the run's: 1 for local-sync, every core for local-task).
    threads: int
    peak_macs_per_s: float
    memory_bandwidth_bytes_per_s: float
    #: Bandwidth of data resident in each cache level (level 2 up), smallest first; empty
    #: where the OS describes no cache.
    cache_roofs: tuple[CacheRoof, ...]
    last_level_cache_bytes: int | None
    compute_method: str
    bandwidth_method: str
    cache_method: str
    measured_at: str
    #: MAC/s of an IREE-compiled ``i8 x i8 -> i32`` matmul (int8 regions' roof); ``None``
    #: where it could not be measured (``i8_compute_method`` says why): int8 regions then
    #: take the f32 peak, as a profile without an i8 figure gives them.
    peak_i8_macs_per_s: float | None = None
    i8_compute_method: str = ""


#: Figures a calibration file may leave out.
OPTIONAL_FIELDS = ("peak_i8_macs_per_s", "i8_compute_method")


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def threads_of_run(summary: dict[str, Any]) -> tuple[int, str]:
    """How many threads a run's dispatches used, and why we think so: IREE's
    ``local-sync`` runs them on the calling thread, ``local-task`` (the default) on one
    worker per core; anything else (no run, another backend) is taken as every core."""
    driver = summary.get("driver")
    cores = available_cores()
    if driver == "local-sync":
        return 1, "the run's driver local-sync executes every dispatch on the calling thread"
    if driver == "local-task":
        return cores, f"the run's driver local-task runs workgroups on one worker per core ({cores} available)"
    if driver:  # a GPU driver, or one this table does not know: not the host's cores' work
        return cores, f"the run's driver {driver} is not a CPU driver dfit models: every core ({cores} available) assumed"
    return cores, f"no run driver recorded: every core ({cores} available) assumed"


def cache_path(override: str | Path | None = None, threads: int | None = None) -> Path:
    if override is not None:
        return Path(override)
    folder = os.environ.get(CACHE_DIR_ENV)
    if folder:
        base = Path(folder)
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dfit-mlir"
    return base / f"calibration-{_host()}-{threads or available_cores()}threads.json"


def calibrate(path: str | Path | None = None, *, refresh: bool = False, threads: int | None = None) -> Calibration:
    """The cached figures of this host for ``threads`` threads (default: every core),
    measuring them first if there are none.

    An explicitly given ``path`` is used as it is, whatever thread count it records; one
    that holds something unreadable is an error (someone wrote it by hand); a damaged or
    older default cache is simply measured again."""
    threads = threads or available_cores()
    target = cache_path(path, threads)
    if target.is_file() and not refresh:
        cached = _read(target)
        if cached is not None:
            return cached
        if path is not None:
            raise InvalidInputError(f"calibration {target}: not a {SCHEMA} file of version {VERSION} "
                                    "(delete it and dfit measures this host again)")
    measured = measure(threads)
    atomic.write_text(target, json.dumps({"schema": SCHEMA, "version": VERSION, **asdict(measured)}, indent=1) + "\n")
    return measured


def measure(threads: int = 1) -> Calibration:
    """Measure with ``threads`` threads, and with one: each figure is the higher of the
    two, where compute and cache bandwidth take one thread's figure times ``threads``
    (cores each have their own arithmetic units and a slice of every cache, so that is
    an upper bound, and with fewer cores busy each runs as fast or faster). A machine
    busy with other work holds a many-thread measurement far down (every BLAS thread
    waits for the slowest), and a roof below what a run achieves is no roof; memory
    bandwidth, shared by all cores, takes the plain higher of the two."""
    many = _measure_in_child(threads)
    if threads == 1:
        return many
    one = _measure_in_child(1)

    def best(figure_many: float, figure_one: float, method_many: str, method_one: str,
             scale: int) -> tuple[float, str]:
        if figure_one * scale <= figure_many:
            return figure_many, method_many
        times = f"{scale} x " if scale > 1 else ""
        return figure_one * scale, (f"{times}({method_one}); the {threads}-thread measurement "
                                    f"({figure_many:.3g}: {method_many}) was lower, held down by a busy machine")

    peak, compute_method = best(many.peak_macs_per_s, one.peak_macs_per_s, many.compute_method,
                                one.compute_method, threads)
    peak_i8, i8_method = best(many.peak_i8_macs_per_s or 0.0, one.peak_i8_macs_per_s or 0.0,
                              many.i8_compute_method, one.i8_compute_method, threads)
    memory, bandwidth_method = best(many.memory_bandwidth_bytes_per_s, one.memory_bandwidth_bytes_per_s,
                                    many.bandwidth_method, one.bandwidth_method, 1)
    roofs = []
    for roof in many.cache_roofs:
        single = next((r for r in one.cache_roofs if r.level == roof.level), None)
        figure, method = best(roof.bandwidth_bytes_per_s, single.bandwidth_bytes_per_s if single else 0.0,
                              roof.method, single.method if single else "", threads)
        roofs.append(replace(roof, bandwidth_bytes_per_s=figure, method=method))
    return replace(many, peak_macs_per_s=peak, compute_method=compute_method, memory_bandwidth_bytes_per_s=memory,
                   bandwidth_method=bandwidth_method, cache_roofs=tuple(roofs),
                   peak_i8_macs_per_s=peak_i8 or None, i8_compute_method=i8_method)


def _measure_in_child(threads: int) -> Calibration:
    """Measure in a child process whose BLAS pool has ``threads`` threads."""
    env = {**os.environ, **dict.fromkeys(BLAS_THREAD_VARIABLES, str(threads))}
    done = subprocess.run([sys.executable, "-c", f"from {__name__} import _print_measurement; "
                           f"_print_measurement({int(threads)})"], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"calibration child failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")
    fields = json.loads(done.stdout.strip().splitlines()[-1])
    return Calibration(**{**fields, "cache_roofs": tuple(CacheRoof(**roof) for roof in fields["cache_roofs"])})


def _print_measurement(threads: int) -> None:
    print(json.dumps(asdict(_measure_here(threads))))


def _measure_here(threads: int) -> Calibration:
    import numpy as np

    levels, cache_method = _cache_levels()
    cache_bytes = max((size for _, size, _ in levels), default=None)
    where = f"{threads} thread(s), measured on {_host()}"
    # Memory and caches first: their arrays are the biggest, let go before IREE's compiler is loaded.
    copy_bytes = min(max(MIN_COPY_BYTES, 2 * (cache_bytes or 0)), MAX_COPY_BYTES)
    memory_s, memory_copied, copy_runs, memory_array = _parallel_copy(np, copy_bytes // 2, threads)
    roofs = []
    for level, size, sharing in levels:
        # Source and destination of every thread together fill a quarter of the cache
        # (a private one per thread): resident after the first copy, whatever else runs.
        per_thread = size // 8 // min(threads, sharing)
        seconds, copied, runs, array = _parallel_copy(np, per_thread * threads, threads)
        roofs.append(CacheRoof(level=level, capacity_bytes=size * max(1, threads // sharing),
                               bandwidth_bytes_per_s=2 * copied / seconds,
                               method=f"numpy copy of {array / 1024:.0f} KiB resident in L{level} (read + write "
                                      f"counted) split over {threads} thread(s), best of {runs}, {where}"))
    side = 128 * math.ceil(MATMUL_SIZE / 128 * threads ** (1 / 3) - 1e-9)  # 512 * N^(1/3), in steps of 128
    rng = np.random.default_rng(0)
    a = rng.standard_normal((side, side), dtype=np.float32)
    b = rng.standard_normal((side, side), dtype=np.float32)
    matmul_s, matmul_runs = _best_of(lambda: a @ b)
    peak_i8, i8_method = _int8_matmul_rate(np, side, threads)
    return Calibration(
        host=_host(),
        threads=threads,
        peak_macs_per_s=side ** 3 / matmul_s,
        # A copy reads every byte once and writes it once.
        memory_bandwidth_bytes_per_s=2 * memory_copied / memory_s,
        cache_roofs=tuple(roofs),
        last_level_cache_bytes=cache_bytes,
        compute_method=f"numpy {np.__version__} float32 matmul {side}x{side}x{side}, BLAS threads set to "
                       f"{threads}, best of {matmul_runs}, {where}",
        bandwidth_method=f"numpy copy of {memory_array / (1 << 20):.0f} MiB into as much (read + write counted) split over "
                         f"{threads} thread(s), best of {copy_runs}, {where}",
        cache_method=cache_method,
        measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        peak_i8_macs_per_s=peak_i8,
        i8_compute_method=f"{i8_method}, {where}",
    )


#: The int8 matmul IREE compiles for the host: what an int8 dispatch (``..._i8xi8xi32``)
#: computes, accumulating in i32.
_INT8_MATMUL = """
func.func @matmul(%a: tensor<{n}x{n}xi8>, %b: tensor<{n}x{n}xi8>) -> tensor<{n}x{n}xi32> {{
  %zero = arith.constant 0 : i32
  %empty = tensor.empty() : tensor<{n}x{n}xi32>
  %init = linalg.fill ins(%zero : i32) outs(%empty : tensor<{n}x{n}xi32>) -> tensor<{n}x{n}xi32>
  %product = linalg.matmul ins(%a, %b : tensor<{n}x{n}xi8>, tensor<{n}x{n}xi8>)
                           outs(%init : tensor<{n}x{n}xi32>) -> tensor<{n}x{n}xi32>
  return %product : tensor<{n}x{n}xi32>
}}
"""


def _int8_matmul_rate(np: Any, side: int, threads: int) -> tuple[float | None, str]:
    """MAC/s of an ``i8 x i8 -> i32`` matmul of ``side`` cubed, compiled by IREE for this
    CPU and run on ``threads`` workers (``local-sync``: the calling thread), best of
    repeats; ``(None, why)`` when it cannot be compiled or run here."""
    try:
        import iree.compiler
        import iree.runtime

        vmfb = iree.compiler.compile_str(_INT8_MATMUL.format(n=side), target_backends=["llvm-cpu"],
                                         extra_args=["--iree-llvmcpu-target-cpu=host"])
        if threads > 1:  # before the device exists: the task system reads it once
            iree.runtime.flags.parse_flags(f"--task_topology_max_group_count={threads}")
        config = iree.runtime.Config("local-sync" if threads == 1 else "local-task")
        context = iree.runtime.SystemContext(config=config)
        context.add_vm_module(iree.runtime.VmModule.copy_buffer(context.instance, vmfb))
        matmul = context.modules.module.matmul
        rng = np.random.default_rng(0)
        a, b = (iree.runtime.asdevicearray(config.device, rng.integers(-128, 128, (side, side), dtype=np.int8))
                for _ in range(2))
        seconds, runs = _best_of(lambda: matmul(a, b))
    except Exception as error:  # an int8 roof is optional: say why there is none
        return None, f"no int8 peak: IREE's i8 matmul failed here ({type(error).__name__}: {str(error)[:200]})"
    driver = "local-sync" if threads == 1 else f"local-task, {threads} workers"
    from iree.compiler.version import VERSION as iree_version

    return side ** 3 / seconds, (f"IREE {iree_version} i8 x i8 -> i32 matmul {side}x{side}x{side} compiled for the "
                                 f"host CPU ({driver}), best of {runs}")


def _parallel_copy(np: Any, total_bytes: int, threads: int) -> tuple[float, int, int, int]:
    """Best time of copying ``total_bytes`` as ``threads`` chunks on as many threads
    (numpy's copy releases the GIL); the bytes one run copies, the runs, and the size
    of the copied array (the chunks together)."""
    chunk = max(1, total_bytes // 4 // threads)
    sources = [np.ones(chunk, dtype=np.float32) for _ in range(threads)]
    targets = [np.empty_like(source) for source in sources]
    # A cache-sized copy takes microseconds, as long as the call around it: each timed
    # run copies the chunk over and over, COPY_RUN_BYTES in all.
    laps = max(1, COPY_RUN_BYTES // (chunk * 4))

    def copy_laps(target: Any, source: Any) -> None:
        for _ in range(laps):
            np.copyto(target, source)

    if threads == 1:
        best, runs = _best_of(lambda: copy_laps(targets[0], sources[0]))
    else:
        with ThreadPoolExecutor(threads) as pool:
            best, runs = _best_of(lambda: list(pool.map(copy_laps, targets, sources)))
    return best, chunk * 4 * threads * laps, runs, chunk * 4 * threads


def _best_of(work: Any) -> tuple[float, int]:
    """The fastest of repeated runs over at least :data:`MIN_SECONDS` (and
    :data:`MIN_REPEATS` runs): on a busy machine the best run is the one the rest of
    the machine disturbed least, and a longer window gives it more chances."""
    work()  # the first call pays for page faults and BLAS thread start-up
    best, runs, started = float("inf"), 0, time.perf_counter()
    while runs < MIN_REPEATS or (time.perf_counter() - started < MIN_SECONDS and runs < MAX_REPEATS):
        began = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - began)
        runs += 1
    return max(best, 1e-9), runs


def _cache_levels() -> tuple[list[tuple[int, int, int]], str]:
    """(level, bytes, CPUs sharing it) of CPU 0's data caches from level 2 up, from
    Linux sysfs; none elsewhere."""
    folder = Path("/sys/devices/system/cpu/cpu0/cache")
    levels = []
    for index in sorted(folder.glob("index*")):
        def read(name: str, index: Path = index) -> str:
            return (index / name).read_text().strip() if (index / name).is_file() else ""

        match = re.fullmatch(r"(\d+)([KMG]?)", read("size"))
        if not match or read("type") == "Instruction" or not read("level").isdigit() or int(read("level")) < 2:
            continue
        size = int(match[1]) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[match[2]]
        levels.append((int(read("level")), size, max(1, _cpu_count(read("shared_cpu_list")))))
    if not levels:
        return [], "no cache sizes known (no Linux sysfs cache description): memory roof only"
    return sorted(levels), f"data caches of cpu0 in {folder} (Linux sysfs) on {_host()}"


def _cpu_count(cpu_list: str) -> int:
    """CPUs in a sysfs list like ``0-3,8``."""
    count = 0
    for part in filter(None, cpu_list.split(",")):
        low, _, high = part.partition("-")
        count += int(high or low) - int(low) + 1 if low.isdigit() and (high or low).isdigit() else 1
    return count


def _read(path: Path) -> Calibration | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("schema") != SCHEMA or data.get("version") != VERSION:
            return None
        figures = (data["peak_macs_per_s"], data["memory_bandwidth_bytes_per_s"], data["threads"])
        if not all(isinstance(figure, int | float) and figure > 0 for figure in figures):
            return None
        # The int8 figures may be absent (a file written by hand): int8 regions then take f32's.
        fields = {key: data[key] for key in Calibration.__dataclass_fields__ if key not in OPTIONAL_FIELDS}
        fields.update({key: data[key] for key in OPTIONAL_FIELDS if data.get(key) is not None})
        if not isinstance(fields.get("peak_i8_macs_per_s", 1.0), int | float):
            return None
        fields["cache_roofs"] = tuple(CacheRoof(**roof) for roof in fields["cache_roofs"])
        return Calibration(**fields)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname()) or "localhost"
