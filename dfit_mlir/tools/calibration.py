"""Peak compute and memory bandwidth of this host, measured once and cached.

A vendor datasheet says nothing about the CPU an IREE module ran on, so the local-CPU
profile is measured instead: a float32 matmul (numpy's BLAS) for compute and a large
array copy for bandwidth, each the best of a few repeats (the best run is the one the
rest of the machine disturbed least). The result is cached as JSON, keyed by host
name, so every later analysis on this host reuses the same figures::

    ${DFIT_CACHE_DIR:-${XDG_CACHE_HOME:-~/.cache}/dfit-mlir}/calibration-<hostname>.json

A whole calibration takes well under a second.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from dfit_mlir import atomic
from dfit_mlir.errors import InvalidInputError

SCHEMA = "dfit.calibration"
VERSION = 1
#: Environment variable naming the cache folder (tests point it at a temporary one).
CACHE_DIR_ENV = "DFIT_CACHE_DIR"
MATMUL_SIZE = 512
#: The copied array is twice the last-level cache (source and destination together spill
#: it four times over), within these bounds, so the copy measures memory, not cache, and
#: a whole calibration stays under two seconds.
MIN_COPY_BYTES = 64 * 1024 * 1024
MAX_COPY_BYTES = 256 * 1024 * 1024
#: Best of this many: a 512^3 matmul takes milliseconds, so it can afford more tries than a copy.
MATMUL_REPEATS = 20
COPY_REPEATS = 5


@dataclass(frozen=True)
class Calibration:
    host: str
    peak_macs_per_s: float
    memory_bandwidth_bytes_per_s: float
    last_level_cache_bytes: int | None
    compute_method: str
    bandwidth_method: str
    cache_method: str
    measured_at: str


def cache_path(override: str | Path | None = None) -> Path:
    if override is not None:
        return Path(override)
    folder = os.environ.get(CACHE_DIR_ENV)
    if folder:
        base = Path(folder)
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dfit-mlir"
    return base / f"calibration-{_host()}.json"


def calibrate(path: str | Path | None = None, *, refresh: bool = False) -> Calibration:
    """The cached figures of this host, measuring them first if there are none.

    An explicitly given ``path`` that holds something unreadable is an error (someone
    wrote it by hand); a damaged default cache is simply measured again."""
    target = cache_path(path)
    if target.is_file() and not refresh:
        cached = _read(target)
        if cached is not None:
            return cached
        if path is not None:
            raise InvalidInputError(f"calibration {target}: not a {SCHEMA} file of version {VERSION}")
    measured = measure()
    atomic.write_text(target, json.dumps({"schema": SCHEMA, "version": VERSION, **asdict(measured)}, indent=1) + "\n")
    return measured


def measure() -> Calibration:
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.standard_normal((MATMUL_SIZE, MATMUL_SIZE), dtype=np.float32)
    b = rng.standard_normal((MATMUL_SIZE, MATMUL_SIZE), dtype=np.float32)
    matmul_s = _best_of(MATMUL_REPEATS, lambda: a @ b)
    cache_bytes, cache_method = _last_level_cache()
    copy_bytes = min(max(MIN_COPY_BYTES, 2 * (cache_bytes or 0)), MAX_COPY_BYTES) // 4 * 4
    source = np.ones(copy_bytes // 4, dtype=np.float32)
    target = np.empty_like(source)
    copy_s = _best_of(COPY_REPEATS, lambda: np.copyto(target, source))
    return Calibration(
        host=_host(),
        peak_macs_per_s=MATMUL_SIZE ** 3 / matmul_s,
        # A copy reads every byte once and writes it once.
        memory_bandwidth_bytes_per_s=2 * copy_bytes / copy_s,
        last_level_cache_bytes=cache_bytes,
        compute_method=f"numpy {np.__version__} float32 matmul {MATMUL_SIZE}x{MATMUL_SIZE}x{MATMUL_SIZE}, "
                       f"best of {MATMUL_REPEATS}, measured on {_host()}",
        bandwidth_method=f"numpy copy of {copy_bytes / (1 << 20):.0f} MiB (read + write counted), "
                         f"best of {COPY_REPEATS}, measured on {_host()}",
        cache_method=cache_method,
        measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )


def _best_of(repeats: int, work: Any) -> float:
    work()  # the first call pays for page faults and BLAS thread start-up
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - started)
    return max(best, 1e-9)


def _last_level_cache() -> tuple[int | None, str]:
    """The largest cache of CPU 0 from Linux sysfs; ``None`` elsewhere."""
    folder = Path("/sys/devices/system/cpu/cpu0/cache")
    sizes = []
    for index in sorted(folder.glob("index*")):
        text = (index / "size").read_text().strip() if (index / "size").is_file() else ""
        match = re.fullmatch(r"(\d+)([KMG]?)", text)
        if match:
            sizes.append(int(match[1]) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[match[2]])
    if not sizes:
        return None, "no last-level cache size known (no Linux sysfs cache description)"
    return max(sizes), f"largest cache of cpu0 in {folder} (Linux sysfs) on {_host()}"


def _read(path: Path) -> Calibration | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("schema") != SCHEMA or data.get("version") != VERSION:
            return None
        figures = (data["peak_macs_per_s"], data["memory_bandwidth_bytes_per_s"])
        if not all(isinstance(figure, int | float) and figure > 0 for figure in figures):
            return None
        return Calibration(**{key: data[key] for key in Calibration.__dataclass_fields__})
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname()) or "localhost"
