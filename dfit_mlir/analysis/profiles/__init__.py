"""Backend performance profiles: peak compute, memory bandwidth and on-chip memory, each
figure with the public document it comes from.

One YAML file per backend sits beside this module; its ``backend:`` key names the
backend it describes (so adding a backend is adding a file). A profile looks like::

    name: Coral Edge TPU
    backend: edgetpu
    default_dtype: i8
    peak_macs_per_s:                      # by element type of the MAC-carrying operands
      i8: {value: 2.0e+12, source: "Coral Edge TPU FAQ: 4 TOPS int8 ..."}
    memory_bandwidth_bytes_per_s: {value: 5.0e+8, source: "..."}
    on_chip_memory_bytes: {value: 8388608, source: "..."}

A profile with ``calibrate: true`` (the local CPU) has no figures of its own: they are
measured on this host by :mod:`dfit_mlir.analysis.calibration`. Users replace a bundled
profile with ``profile=PATH`` (a tool option); a file that lacks a key is refused with
an :class:`~dfit_mlir.core.errors.InvalidInputError` naming the file and the key.

A profile with ``devices:`` (globs over the device name a GPU driver reports, ignoring
case) and ``drivers:`` describes one named part (``nvidia-h200.yaml``,
``amd-mi300x.yaml``, ``lavapipe.yaml``): a run on a GPU driver (``summary.json`` →
``device``) takes the profile whose glob matches its device's name (the longest glob
wins: ``*H100*PCIe*`` over ``*H100``); a GPU dfit has no profile for gets no roof and a
note naming the device (:func:`missing`), never the host CPU's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dfit_mlir.core.errors import InvalidInputError

PROFILE_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Figure:
    """A number and where it comes from (a document, or the measurement that made it)."""

    value: float
    source: str


@dataclass(frozen=True)
class Profile:
    name: str
    backend: str
    path: Path
    default_dtype: str
    #: Element type (``i8``, ``f32``, ``bf16``, as manifests spell dtypes) → peak MAC/s.
    peak_macs_per_s: Mapping[str, Figure]
    memory_bandwidth: Figure
    #: ``None`` where unknown (a calibrated host without a cache description).
    on_chip_memory: Figure | None
    calibrated: bool = False
    #: (name, capacity in bytes, bandwidth) of each cache level a calibration measured
    #: (``L2``, ``L3``): the roof of a region whose bytes fit there, since they may have
    #: stayed resident between dispatches and repeats. Empty: one memory roof for all.
    cache_roofs: tuple[tuple[str, int, Figure], ...] = ()

    def bandwidth_for(self, moved: int | None) -> tuple[str, Figure]:
        """The bandwidth roof of a region moving ``moved`` bytes: the fastest of memory
        and every cache level they fit in (a roof is an upper bound)."""
        roofs = [("memory", self.memory_bandwidth)]
        roofs += [(name, figure) for name, capacity, figure in self.cache_roofs
                  if moved is not None and moved <= capacity]
        return max(roofs, key=lambda roof: roof[1].value)

    def peak(self, dtype: str | None) -> tuple[str, Figure]:
        """The peak for ``dtype``, or for the default type where the profile has none."""
        chosen = dtype if dtype is not None and dtype in self.peak_macs_per_s else self.default_dtype
        return chosen, self.peak_macs_per_s[chosen]

    def ridge(self, dtype: str | None) -> float:
        """Arithmetic intensity (MAC/byte) where the bandwidth slope meets the compute ceiling."""
        return self.peak(dtype)[1].value / self.memory_bandwidth.value


def _bundled_files() -> list[tuple[Path, dict[str, Any]]]:
    import yaml

    return [(path, yaml.safe_load(path.read_text(encoding="utf-8")) or {})
            for path in sorted(PROFILE_DIR.glob("*.yaml"))]


def bundled() -> dict[str, Path]:
    """backend → bundled profile file (the backend's default device; the profiles of
    named devices are :func:`device_profiles`)."""
    return {str(data.get("backend")): path for path, data in _bundled_files() if "devices" not in data}


#: Drivers whose device is not the host CPU: their runs take a named device's profile.
GPU_DRIVERS = ("vulkan", "cuda", "hip")


def device_profiles() -> list[tuple[tuple[str, ...], tuple[str, ...], Path]]:
    """(device-name globs, drivers, file) of each bundled profile of a named device."""
    return [(tuple(str(g) for g in data["devices"]), tuple(str(d) for d in data.get("drivers") or GPU_DRIVERS), path)
            for path, data in _bundled_files() if "devices" in data]


def gpu_device(device: Mapping[str, Any] | None) -> tuple[str, str] | None:
    """(driver, device name) of a run on a GPU driver (``summary.json`` → ``device``);
    ``None`` for a CPU run or no run."""
    if not device or str(device.get("driver")) not in GPU_DRIVERS:
        return None
    return str(device["driver"]), str(device.get("name") or "")


def profile_path_for_device(driver: str, name: str) -> Path | None:
    """The bundled profile of the device ``name`` on ``driver``: the file whose glob
    matches (ignoring case) with the most literal characters; ``None`` if none does."""
    import fnmatch

    matches = [(len(glob.replace("*", "")), path) for globs, drivers, path in device_profiles() if driver in drivers
               for glob in globs if fnmatch.fnmatchcase(name.lower(), glob.lower())]
    return max(matches)[1] if matches else None


def missing(backend: str, device: Mapping[str, Any] | None = None) -> str:
    """Why :func:`load_profile` found no profile, as a note."""
    gpu = gpu_device(device)
    if gpu is not None:
        named = ", ".join(sorted({path.stem for _, _, path in device_profiles()}))
        return (f"dfit has no peaks for the {gpu[0]} device {gpu[1] or '(unnamed)'!r} (bundled: {named}; "
                f"give profile=PATH)")
    return f"dfit has no performance profile for the {backend} backend (give profile=PATH)"


def load_profile(backend: str, override_path: str | Path | None = None,
                 calibration_path: str | Path | None = None, threads: int | None = None,
                 device: Mapping[str, Any] | None = None) -> Profile | None:
    """The profile for ``backend`` (``override_path`` wins), or for a GPU run's
    ``device`` (``summary.json`` → ``device``: the named part's vendor peaks, lavapipe's
    calibrated host CPU); ``None`` when dfit has none (:func:`missing` says why).
    ``threads``: how many threads a calibrated profile is measured with (default: every core)."""
    if override_path is not None:
        return read_profile(Path(override_path), calibration_path, threads)
    gpu = gpu_device(device)
    path = profile_path_for_device(*gpu) if gpu is not None else bundled().get(backend)
    return None if path is None else read_profile(path, calibration_path, threads)


def read_profile(path: Path, calibration_path: str | Path | None = None, threads: int | None = None) -> Profile:
    import yaml

    if not path.is_file():
        raise InvalidInputError(f"profile {path}: no such file")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        raise InvalidInputError(f"profile {path}: not valid YAML ({str(error).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise InvalidInputError(f"profile {path}: expected a mapping of keys, found {type(data).__name__}")
    name, backend = _text(path, data, "name"), _text(path, data, "backend")
    default_dtype = _text(path, data, "default_dtype")
    if data.get("calibrate") is True:
        return _calibrated(path, name, backend, default_dtype, calibration_path, threads)
    peaks = _get(path, data, "peak_macs_per_s")
    if not isinstance(peaks, dict) or not peaks:
        raise InvalidInputError(f"profile {path}: 'peak_macs_per_s' must map element types to figures")
    if default_dtype not in peaks:
        raise InvalidInputError(f"profile {path}: missing key 'peak_macs_per_s.{default_dtype}' (the default_dtype)")
    return Profile(
        name=name, backend=backend, path=path, default_dtype=default_dtype,
        peak_macs_per_s={str(dtype): _figure(path, peaks, dtype, "peak_macs_per_s.") for dtype in peaks},
        memory_bandwidth=_figure(path, data, "memory_bandwidth_bytes_per_s"),
        on_chip_memory=_figure(path, data, "on_chip_memory_bytes"),
    )


def _calibrated(path: Path, name: str, backend: str, default_dtype: str,
                calibration_path: str | Path | None, threads: int | None) -> Profile:
    from dfit_mlir.analysis import calibration

    measured = calibration.calibrate(calibration_path, threads=threads)
    cache = None if measured.last_level_cache_bytes is None else Figure(measured.last_level_cache_bytes,
                                                                          measured.cache_method)
    peaks = {default_dtype: Figure(measured.peak_macs_per_s, measured.compute_method)}
    if measured.peak_i8_macs_per_s is not None:  # int8 regions' roof (their own matmul, measured)
        peaks["i8"] = Figure(measured.peak_i8_macs_per_s, measured.i8_compute_method)
    return Profile(name=name, backend=backend, path=path, default_dtype=default_dtype,
                   peak_macs_per_s=peaks,
                   memory_bandwidth=Figure(measured.memory_bandwidth_bytes_per_s, measured.bandwidth_method),
                   on_chip_memory=cache, calibrated=True,
                   cache_roofs=tuple((f"L{roof.level}", roof.capacity_bytes,
                                      Figure(roof.bandwidth_bytes_per_s, roof.method))
                                     for roof in measured.cache_roofs))


def _get(path: Path, data: Mapping[str, Any], key: str, prefix: str = "") -> Any:
    if key not in data or data[key] is None:
        raise InvalidInputError(f"profile {path}: missing key '{prefix}{key}'")
    return data[key]


def _text(path: Path, data: Mapping[str, Any], key: str, prefix: str = "") -> str:
    return str(_get(path, data, key, prefix))


def _figure(path: Path, data: Mapping[str, Any], key: str, prefix: str = "") -> Figure:
    entry = _get(path, data, key, prefix)
    if not isinstance(entry, dict):
        raise InvalidInputError(f"profile {path}: '{prefix}{key}' must be a mapping with 'value' and 'source'")
    raw = _get(path, entry, "value", f"{prefix}{key}.")
    source = _text(path, entry, "source", f"{prefix}{key}.")
    try:
        value = float(raw)  # YAML 1.1 reads 2.0e12 (no exponent sign) as text
    except (TypeError, ValueError):
        raise InvalidInputError(f"profile {path}: '{prefix}{key}.value' is not a number ({raw!r})") from None
    if value <= 0:
        raise InvalidInputError(f"profile {path}: '{prefix}{key}.value' must be positive ({raw!r})")
    return Figure(value, source)
