"""program-analyzer: a roofline of every execution region (IREE dispatch call site, or a
partition / custom op / kernel of a reconstruction).

Per region:

* **MACs**: the sum of the static ``macs`` of its operators (an op without a figure, an
  elementwise op for one, counts 0), each op counted once across regions: an op IREE
  split over several dispatches (a padded conv's ``slow_memcpy`` and the conv itself)
  counts where it computes (:mod:`dfit_mlir.core.site_costs`), so regions sum to the model;
* **bytes moved**: the bytes of the values that cross the region's boundary, each value
  once: tensors an op of the region consumes that are produced outside it, and tensors
  produced inside that are consumed outside, returned or never consumed (graph outputs).
  Weights (constant tensors, or results of ``*.constant`` ops) count as inputs even when
  the compiler fused the constant into the region, since they are still read from
  memory; results of ``*.empty`` ops (destination placeholders with undefined contents)
  move nothing. Without a tensor graph the operators' own operand + result bytes are
  summed instead: an upper bound, since values passed between them count twice;
  A dispatch that computes in a narrower type than its source ops (a QDQ int8 conv run
  as ``i8 x i8 → i32``) moves its region's own operands and results instead (``bytes_rule``
  ``dispatch signature``; :meth:`dfit_mlir.analysis.ledger.Ledger.dtype`);
* **arithmetic intensity** = MACs / bytes moved;
* **observed time**: the summed ``duration_ns`` of the region's ``dispatch`` events
  (``None`` where the backend times no region); achieved MAC/s = MACs x calls / time;
  efficiency = achieved / the profile's peak for the region's element type.

The element type (``dtype``) is what the region computes in (the ledger's: the dispatch's
own where it is narrower than the source graph's, so a QDQ int8 conv says ``i8``, a
QLinearConv ``ui8``); ``peak_dtype`` is the type whose peak the profile has for it (the
profile's default where it publishes none for ``dtype``: the local CPU calibrates an f32
matmul only), and the roof is drawn under that peak.

The bandwidth roof is the memory's, or, for a region whose bytes fit in a cache level
the profile measured (the local CPU's L2 / L3, calibrated), the fastest such level's:
its data can stay resident between dispatches and repeats (column ``bandwidth_roof``). The local CPU is calibrated with the threads the
run used (1 for IREE's local-sync driver, every core for local-task; ``threads=N``
overrides). A region achieving more than its roof (column ``above_roof``) is a
measurement problem (a stale or disturbed calibration, a timer too coarse for the
dispatch), flagged in the notes and never reported as the most efficient region.

Boundness uses the region's ridge point (peak MAC/s / its bandwidth roof): memory-bound below
half the ridge, compute-bound above twice the ridge, balanced in between, the band where
the roof bends and neither limit clearly dominates. Shares per class are of observed
time, or of MACs where no region is timed.

Options: ``profile=PATH`` (a backend profile YAML replacing the bundled one),
``calibration=PATH`` (the local-CPU calibration file), ``threads=N`` (threads to
calibrate the local CPU with). Outputs: ``regions.csv``,
``boundness.csv``, ``roofline.png``, ``report.txt``.
"""

from __future__ import annotations

from typing import Any

from dfit_mlir.analysis import ledger
from dfit_mlir.analysis.model import Partition, SemanticModel
from dfit_mlir.analysis.profiles import Profile, load_profile, missing
from dfit_mlir.analysis.tools.api import Tool, ToolContext
from dfit_mlir.core import atomic
from dfit_mlir.core.errors import InvalidInputError

OPTIONS = ("profile", "calibration", "threads")
#: Achieved above the roof by more than this is a measurement problem, not a result (the
#: margin absorbs timer granularity on the shortest dispatches).
ROOF_TOLERANCE = 1.05
CLASSES = ("memory-bound", "balanced", "compute-bound", "unknown")
COLUMNS = ("region", "kind", "root", "label", "operators", "dtype", "peak_dtype", "macs", "bytes_moved", "bytes_rule", "intensity",
           "peak_macs_per_s", "attainable_macs_per_s", "calls", "time_ns", "achieved_macs_per_s", "efficiency",
           "boundness", "bandwidth_roof", "above_roof", "workgroups")


class ProgramAnalyzer(Tool):
    name = "program-analyzer"
    description = "roofline per execution region: arithmetic intensity, achieved MAC/s, efficiency, boundness"
    needs = ("static_cost", "per_partition_timing")
    options = OPTIONS

    def on_init(self, ctx: ToolContext) -> None:
        ctx.state.update(report=[])

    def on_shutdown(self, ctx: ToolContext) -> None:
        if ctx.model is None:
            ctx.note("no semantic model (nothing was compiled or analyzed): nothing to analyze")
            return
        threads, why = _threads(ctx)
        device = ctx.model.summary.get("device")
        profile = load_profile(ctx.backend, ctx.options.get("profile"), ctx.options.get("calibration"), threads,
                               device=device)
        if profile is not None and profile.calibrated:
            ctx.note(f"calibrated for {threads} thread(s): {why}")
        if profile is None:
            ctx.note(f"{missing(ctx.backend, device)}: no roof")
        book = ledger.of(ctx.model)
        groups = dispatch_workgroups(ctx.model)
        rows = [{**region_row(part, ctx.model, book, profile), "workgroups": groups.get(part.id)}
                for part in ctx.model.partitions]
        timed = any(row["time_ns"] for row in rows)
        basis = "time_ns" if timed else "macs"
        total = sum(row[basis] or 0 for row in rows)
        shares = []
        for cls in CLASSES:
            members = [row for row in rows if row["boundness"] == cls]
            amount = sum(row[basis] or 0 for row in members)
            shares.append({"class": cls, "regions": len(members), "time_ns": sum(r["time_ns"] or 0 for r in members),
                           "macs": sum(r["macs"] for r in members), "share": amount / total if total else None,
                           "share_of": "observed time" if timed else "MACs"})
        ctx.export_table("regions", rows or _empty_table())
        ctx.export_table("boundness", shares)
        if profile is not None:
            _plot(ctx, rows, profile, timed, basis, total)
        lines = _report_lines(ctx, rows, shares, profile, timed)
        ctx.state["report"] = lines
        ctx.write_text("report.txt", "\n".join(lines + ctx.notes) + "\n")

    def report(self, ctx: ToolContext) -> str:
        return "\n".join(ctx.state.get("report", []))


def region_row(part: Partition, model: SemanticModel, book: ledger.Ledger, profile: Profile | None) -> dict[str, Any]:
    """One region's row (``regions.csv``, and the view's roofline reads the same rule); MACs,
    bytes, calls and time are the ledger's."""
    ops = [model.operators[op_id] for op_id in part.operator_ids if op_id in model.operators]
    macs = book.partition_figures(part.id)["macs"]
    moved, how = book.bytes_moved(part)
    intensity = macs / moved if moved else None
    time_ns, calls = book.partition_ns(part.id) or None, book.calls(part.id)
    achieved = macs * calls / (time_ns * 1e-9) if time_ns else None
    dtype, peak_dtype, peak, attainable, boundness, roof = book.dtype(part), None, None, None, "unknown", None
    if profile is not None:
        peak_dtype, figure = _peak(profile, dtype)
        peak = figure.value
        if intensity is not None:
            roof, bandwidth = profile.bandwidth_for(moved)
            attainable = min(peak, intensity * bandwidth.value)
            ridge = peak / bandwidth.value
            boundness = ("memory-bound" if intensity < 0.5 * ridge else
                         "compute-bound" if intensity > 2 * ridge else "balanced")
    root = model.operator(part.root_id) if part.root_id else None
    label = (f"{model.module_path(root.id) or '(root)'} {root.source_op or root.kind}"
             if root is not None and model.module_path(root.id) is not None else (part.root_id or part.id))
    return {"region": part.id, "kind": part.kind, "root": part.root_id, "label": label, "operators": len(ops),
            "dtype": dtype, "peak_dtype": peak_dtype,
            "macs": macs, "bytes_moved": moved, "bytes_rule": how, "intensity": intensity, "peak_macs_per_s": peak,
            "attainable_macs_per_s": attainable, "calls": calls, "time_ns": time_ns,
            "achieved_macs_per_s": achieved, "efficiency": achieved / peak if achieved is not None and peak else None,
            "boundness": boundness, "bandwidth_roof": roof,
            "above_roof": None if achieved is None or not attainable else achieved > ROOF_TOLERANCE * attainable}


def _peak(profile: Profile, dtype: str | None) -> tuple[str, Any]:
    """The profile's peak for ``dtype``, a signed or unsigned integer (``si8``, ``ui8``)
    taking its signless type's (``i8``) where the profile has only that."""
    signless = dtype.lstrip("su") if dtype is not None and dtype[:1] in "su" else None
    if dtype not in profile.peak_macs_per_s and signless in profile.peak_macs_per_s:
        return profile.peak(signless)
    return profile.peak(dtype)


def dispatch_workgroups(model: SemanticModel) -> dict[str, str]:
    """Partition ID → the distinct workgroup shapes of its dispatch events, as the runtime
    recorded them: ``2x1x1 of 64x1x1`` (count per axis ``of`` threads per workgroup,
    from the event's attributes) or, for a bundle without them, the count's product
    (``1`` or ``2, 4``); none without a run."""
    import json

    import pyarrow as pa
    import pyarrow.compute as pc

    wanted = (pc.field("kind") == "dispatch") & pc.field("site").is_valid() & (pc.field("workgroups") >= 0)
    found: dict[int, set[tuple[int, str]]] = {}
    for batch in model.event_batches(columns=["kind", "site", "workgroups", "attributes"]):
        table = pa.Table.from_batches([batch])
        keys = ["site", "workgroups", *(["attributes"] if "attributes" in table.column_names else [])]
        distinct = table.select(["kind", *keys]).filter(wanted).group_by(keys).aggregate([])
        texts = distinct.column("attributes").to_pylist() if "attributes" in keys else [None] * distinct.num_rows
        for site, count, text in zip(distinct.column("site").to_pylist(), distinct.column("workgroups").to_pylist(),
                                     texts, strict=True):
            if site is not None and count is not None:  # always: filtered above
                found.setdefault(site, set()).add((count, _workgroup_shape(json.loads(text) if text else {}, count)))
    parts = {site: model.partition_of_site(site) for site in found}
    return {part.id: ", ".join(dict.fromkeys(shape for _, shape in sorted(found[site])))
            for site, part in parts.items() if part is not None}


def _workgroup_shape(attributes: Any, product: int) -> str:
    """``2x1x1 of 64x1x1`` from a dispatch event's attributes, else ``product``."""
    count = attributes.get("workgroup_count") if isinstance(attributes, dict) else None
    if not count:
        return str(product)
    size = attributes.get("workgroup_size")
    return "x".join(map(str, count)) + (" of " + "x".join(map(str, size)) if size else "")


def _empty_table() -> Any:
    import pyarrow as pa

    return pa.table({column: pa.array([], pa.null()) for column in COLUMNS})


def _plot(ctx: ToolContext, rows: list[dict[str, Any]], profile: Profile, timed: bool, basis: str,
          total: float) -> None:
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    y_key = "achieved_macs_per_s" if timed else "attainable_macs_per_s"
    points = [row for row in rows if row["intensity"] and row[y_key]]
    bandwidth = profile.memory_bandwidth.value
    ridges = [_peak(profile, row["peak_dtype"])[1].value / bandwidth for row in points] or [profile.ridge(None)]
    xs = [row["intensity"] for row in points]
    grid = np.geomspace(min(xs + ridges) / 10, max(xs + ridges) * 10, 256)
    figure = Figure(figsize=(8, 5))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for dtype in sorted({row["peak_dtype"] for row in points} or {profile.default_dtype}):
        _, peak = _peak(profile, dtype)
        axes.plot(grid, np.minimum(peak.value, grid * bandwidth), label=f"roof ({dtype}): {peak.value:.3g} MAC/s, "
                  f"{bandwidth:.3g} B/s")
        for name, capacity, cache in profile.cache_roofs:
            axes.plot(grid, np.minimum(peak.value, grid * cache.value), linestyle="--", linewidth=0.8,
                      label=f"{name} roof (regions moving <= {capacity / (1 << 20):.3g} MiB): {cache.value:.3g} B/s")
    sizes = [30 + 600 * ((row[basis] or 0) / total if total else 0) for row in points]
    above = [row["above_roof"] is True for row in points]
    for flag, name, color in ((False, "regions", "tab:red"), (True, "above the roof: measurement problem", "black")):
        chosen = [i for i, a in enumerate(above) if a is flag]
        if chosen:
            axes.scatter([xs[i] for i in chosen], [points[i][y_key] for i in chosen], s=[sizes[i] for i in chosen],
                         alpha=0.6, color=color, marker="x" if flag else "o", label=name)
    axes.set(xscale="log", yscale="log", xlabel="arithmetic intensity (MAC/byte)", ylabel="MAC/s")
    if any(above):
        axes.text(0.01, 0.01, f"{sum(above)} region(s) drawn above the roof (x): achieved more than the roof allows, so the "
                  "calibration or the timer is off for them;\nthey are not results (see report.txt)",
                  transform=axes.transAxes, fontsize=6.5, va="bottom")
    _label_points(figure, axes, sorted(points, key=lambda r: -(r[basis] or 0))[:12], y_key)
    axes.set_title(f"{profile.name}: achieved MAC/s per region (size: share of time)" if timed else
                   f"{profile.name}: no per-region timing, regions drawn on the roof at attainable MAC/s "
                   "(size: share of MACs)", fontsize=9)
    axes.legend(fontsize=7)
    with atomic.atomic_path(ctx.output_path("roofline.png")) as tmp:
        figure.savefig(tmp, format="png", dpi=110)
    skipped = len(rows) - len(points)
    if skipped:
        ctx.note(f"roofline: {skipped} of {len(rows)} regions not drawn (no MACs, bytes or time to place them)")


def _label_points(figure: Any, axes: Any, rows: list[dict[str, Any]], y_key: str) -> None:
    """Label the regions (module path + op) where a label overlaps no other: each tries
    a few offsets around its point, and a label that fits nowhere is left out."""
    renderer = figure.canvas.get_renderer()
    placed: list[Any] = []
    offsets = ((4, 4), (4, -10), (-4, 8), (-4, -12), (6, 16), (6, -20))
    for row in rows:
        text = row["label"] if len(row["label"]) <= 34 else "…" + row["label"][-33:]
        for dx, dy in offsets:
            note = axes.annotate(text, (row["intensity"], row[y_key]), xytext=(dx, dy), textcoords="offset points",
                                 fontsize=6.5, ha="left" if dx > 0 else "right")
            box = note.get_window_extent(renderer)
            if not any(box.overlaps(other) for other in placed):
                placed.append(box)
                break
            note.remove()


def _report_lines(ctx: ToolContext, rows: list[dict[str, Any]], shares: list[dict[str, Any]],
                  profile: Profile | None, timed: bool) -> list[str]:
    lines = [f"{len(rows)} regions, {sum(1 for r in rows if r['time_ns'])} with observed time"]
    if profile is not None:
        dtype, peak = profile.peak(None)
        kind = "measured on this host" if profile.calibrated else "vendor-published peaks, not measurements"
        caches = "".join(f", {name} {figure.value:.3g} B/s" for name, _, figure in profile.cache_roofs)
        lines.append(f"profile {profile.name} ({kind}): peak {peak.value:.3g} MAC/s {dtype}, bandwidth "
                     f"{profile.memory_bandwidth.value:.3g} B/s{caches}, ridge {profile.ridge(None):.3g} MAC/B")
        if profile.calibrated:
            lines.append(f"  compute: {peak.source}")
        stand_in = sorted({str(r["dtype"]) for r in rows if r["dtype"] and r["peak_dtype"] != r["dtype"]})
        if stand_in:
            lines.append(f"  no {'/'.join(stand_in)} peak in this profile: those regions are held against the "
                         f"{dtype} peak (column peak_dtype)")
    split = ", ".join(f"{s['class']} {s['share']:.1%}" for s in shares if s["share"])
    lines.append(f"share of {'observed time' if timed else 'MACs'}: {split or 'nothing to share'}")
    above = sorted((r for r in rows if r["above_roof"]), key=lambda r: -r["achieved_macs_per_s"] / r["attainable_macs_per_s"])
    if above:
        worst = above[0]
        ctx.note(f"measurement problem: {len(above)} region(s) ran above the roof (worst {worst['region']} at "
                 f"{worst['achieved_macs_per_s'] / worst['attainable_macs_per_s']:.0%} of its attainable MAC/s); "
                 "their efficiency is not a result: the calibration may have been measured on a busy machine "
                 "(delete it to measure again) or with other threads than the run used (option threads=N), or the "
                 "timer is too coarse for these dispatches")
    plausible = (r for r in rows if r["efficiency"] is not None and r["macs"] and not r["above_roof"])
    best = max(plausible, key=lambda r: r["efficiency"], default=None)
    if best is not None:
        lines.append(f"most efficient region: {best['region']} at {best['efficiency']:.1%} of peak")
    return lines


def _threads(ctx: ToolContext) -> tuple[int, str]:
    """Threads to calibrate the local CPU with: ``threads=N`` or the run's driver."""
    from dfit_mlir.analysis.calibration import threads_of_run

    given = ctx.options.get("threads")
    if given is not None:
        if not str(given).isdigit() or int(given) < 1:
            raise InvalidInputError(f"program-analyzer: option threads={given!r} is not a positive whole number")
        return int(given), "given as option threads"
    return threads_of_run(ctx.model.summary if ctx.model is not None else {})
