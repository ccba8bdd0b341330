"""The dispatch panel's roofline position of every partition (IREE dispatch call site or a
reconstruction's group), in FLOP terms: program-analyzer's point (``regions.csv``, in MACs)
with both axes and the roof in FLOPs, 2 per MAC — one point, two units.

Every figure is the ledger's (:mod:`dfit_mlir.analysis.ledger`): MACs (per trip, placed once
where IREE split an op), the bytes crossing the partition's boundary
(:meth:`~dfit_mlir.analysis.ledger.Ledger.bytes_moved`), calls and summed dispatch time. The roof
is the backend's performance profile, the one program-analyzer draws
(:func:`dfit_mlir.analysis.profiles.load_profile`; the local CPU's is calibrated on this
host for the run's threads and cached), and the class (memory-bound / balanced /
compute-bound) is program-analyzer's own (:func:`program_analyzer.region_row`), so the view
and ``regions.csv`` never disagree on it.

* intensity = 2 x MACs / boundary bytes (FLOP/B), per trip (one call's work over one
  call's bytes);
* attained FLOP/s = 2 x MACs x calls / time, attained B/s = bytes x calls / time: the
  time sums every call (each trip of a loop), so the work over it is the executed work
  of those calls (per-trip figure x calls, the ledger's ``executed_macs`` of the events
  the run kept), never the per-trip figure alone;
* the roof at that intensity = min(peak FLOP/s, intensity x the bandwidth roof), where
  peak FLOP/s is twice the profile's peak MAC/s (a MAC is a multiply and an add; the
  profiles halve the vendors' ops/s) and the bandwidth roof is the memory's or the
  fastest cache level the bytes fit in (:meth:`Profile.bandwidth_for`);
* each partition is held against the peak of its own element type (program-analyzer's
  ``peak_dtype``: an ``i8`` dispatch against the measured i8 peak, not the f32 one), and
  the plot draws one roof per element type its points use;
* % of roof = attained / that roof. Above 100 % (by program-analyzer's
  ``ROOF_TOLERANCE``) is a measurement problem, flagged, not a result.

A manifest without a run has intensity and class only ("not timed").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dfit_mlir.analysis import ledger
from dfit_mlir.analysis.model import SemanticModel
from dfit_mlir.analysis.profiles import Profile
from dfit_mlir.core.errors import InvalidInputError

#: FLOPs per MAC (a fused multiply-add).
FLOPS_PER_MAC = 2


@dataclass(frozen=True)
class Roof:
    """The target's roofline as the page draws it."""

    name: str
    #: ``vendor-published peaks`` or ``measured on this host``.
    basis: str
    dtype: str
    peak_flops_per_s: float
    bandwidth_bytes_per_s: float
    #: (name, capacity in bytes, bandwidth) of each cache level the profile measured: the
    #: roof of a partition whose bytes fit there (:attr:`Profile.cache_roofs`).
    caches: tuple[tuple[str, int, float], ...] = ()
    #: (element type, peak FLOP/s) of every type the profile has a peak for (``dtype``'s
    #: included): partitions of another type are drawn under their own roof.
    peaks: tuple[tuple[str, float], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "basis": self.basis, "dtype": self.dtype, "peak": self.peak_flops_per_s,
                "peaks": dict(self.peaks), "bandwidth": self.bandwidth_bytes_per_s,
                "caches": [{"name": name, "capacity": capacity, "bandwidth": bandwidth}
                           for name, capacity, bandwidth in self.caches]}


def profile_of(model: SemanticModel) -> tuple[Profile | None, str | None]:
    """(The backend's profile, else ``None`` and why), as program-analyzer loads it."""
    from dfit_mlir.analysis.calibration import threads_of_run
    from dfit_mlir.analysis.profiles import load_profile, missing

    device = model.summary.get("device")
    try:
        profile = load_profile(model.backend, threads=threads_of_run(model.summary)[0], device=device)
    except InvalidInputError as error:
        return None, str(error)
    if profile is None:
        return None, missing(model.backend, device)
    return profile, None


def roof(profile: Profile) -> Roof:
    dtype, peak = profile.peak(None)
    return Roof(profile.name, "measured on this host" if profile.calibrated else "vendor-published peaks", dtype,
                FLOPS_PER_MAC * peak.value, profile.memory_bandwidth.value,
                tuple((name, capacity, figure.value) for name, capacity, figure in profile.cache_roofs),
                tuple((element, FLOPS_PER_MAC * figure.value)
                      for element, figure in sorted(profile.peak_macs_per_s.items())))


def table(model: SemanticModel, book: ledger.Ledger, profile: Profile | None) -> dict[str, list]:
    """Columns, one row per partition in model order (``None``: no figure)."""
    from dfit_mlir.analysis.tools.builtin import program_analyzer

    columns: dict[str, list] = {key: [] for key in ("intensity", "flops_per_s", "bytes_per_s", "roof", "pct",
                                                    "bound", "above", "bandwidth_roof", "peak_dtype")}
    for part in model.partitions:
        region = program_analyzer.region_row(part, model, book, profile)
        work, moved = FLOPS_PER_MAC * region["macs"], region["bytes_moved"]
        time_ns, calls = region["time_ns"], region["calls"]
        intensity = work / moved if moved else None
        timed = bool(time_ns) and calls > 0
        attained = work * calls / (time_ns * 1e-9) if timed else None
        ceiling = None
        if profile is not None and intensity is not None and region["peak_macs_per_s"]:
            bandwidth = profile.bandwidth_for(moved)[1].value
            ceiling = min(FLOPS_PER_MAC * region["peak_macs_per_s"], intensity * bandwidth)
        pct = 100 * attained / ceiling if attained is not None and ceiling else None
        columns["intensity"].append(intensity)
        columns["flops_per_s"].append(attained)
        columns["bytes_per_s"].append(moved * calls / (time_ns * 1e-9) if timed and moved else None)
        columns["roof"].append(ceiling)
        columns["pct"].append(None if pct is None else round(pct, 3))
        columns["bound"].append(region["boundness"])
        columns["above"].append(pct is not None and pct > 100 * program_analyzer.ROOF_TOLERANCE)
        columns["bandwidth_roof"].append(region["bandwidth_roof"])
        columns["peak_dtype"].append(region["peak_dtype"])
    return columns
