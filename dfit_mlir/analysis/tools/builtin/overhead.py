"""overhead: what dfit's own instrumentation costs, stage by stage.

* compile: the time spent snapshotting each stage's IR (``stages[*].snapshot_s``) against
  the phase's own time (``phase_s``) and the whole compile (``compile.total_s``);
* runtime interception: the invocation time of this bundle (the median of the calls it
  timed; a run timed by ``iree-benchmark-module`` has only the tool's mean, and says so in
  ``invocation_statistic``) against a baseline run
  of the same model, given as ``compare=BUNDLE[,BUNDLE...]``. Bundles are grouped by model
  (same input sha256 or path, or the same operator IDs); in each group the least
  instrumented run (``none`` < ``ids`` < ``lite`` < ``full``) is the baseline;
* tracing: events kept, event rate (events per second of recorded invocation time), the
  bytes of the bundle's ``trace.pftrace``, ``trace.json`` and ``events.parquet``, events dropped;
* post-run analysis: this tool's own time in its hooks (``time.perf_counter``).

Outputs ``overhead.csv`` / ``overhead.json`` (one row per bundle: slowdown against trace
size), ``compile.csv`` (per stage) and ``summary.json``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from dfit_mlir.analysis.model import SemanticModel
from dfit_mlir.analysis.tools.api import Tool, ToolContext
from dfit_mlir.core.errors import InvalidInputError

#: Run modes from least to most instrumented; the least instrumented run of a group is its baseline.
INSTRUMENTATION_ORDER = ("none", "ids", "lite", "full")
#: The files a run's events cost on disk (``trace_bytes`` is their sum: both traces and the
#: events' Parquet file).
TRACE_FILES = {"pftrace_bytes": "trace.pftrace", "json_bytes": "trace.json", "parquet_bytes": "events.parquet"}
BUNDLE_COLUMNS = ("bundle", "role", "model", "mode", "events", "dropped", "pftrace_bytes", "json_bytes", "parquet_bytes",
                  "trace_bytes", "invocations", "harness", "invocation_ms", "invocation_statistic", "event_rate_per_s", "baseline",
                  "slowdown", "extra_ms", "not_compared")
COMPILE_COLUMNS = ("stage", "phase_s", "snapshot_s", "snapshot_pct_of_phase")
NOT_MEASURABLE = "runtime overhead not measurable: backend exposes no per-program timing of dfit's own runs"


def _compare_paths(option: Any) -> list[str]:
    if option is None:
        return []
    items = option.split(",") if isinstance(option, str) else [str(item) for item in option]
    paths = [item.strip() for item in items if str(item).strip()]
    if not paths:
        raise InvalidInputError("overhead: option compare= names no bundle (expected compare=BUNDLE[,BUNDLE...])")
    return paths


def _mode(model: SemanticModel) -> str:
    summary = model.summary
    if summary:
        return summary.get("mode") or (summary.get("policy") or {}).get("mode") or "unknown"
    return "reconstructed" if model.reconstructed else "manifest"


def same_model(a: SemanticModel, b: SemanticModel) -> bool:
    """Same input file (by sha256, else by path) or, failing that, the same operator IDs."""
    first, second = a.manifest.get("input") or {}, b.manifest.get("input") or {}
    if first.get("sha256") and first.get("sha256") == second.get("sha256"):
        return True
    if not (first.get("sha256") and second.get("sha256")) and first.get("path") and \
            first.get("path") == second.get("path"):
        return True
    return set(a.operators) == set(b.operators)


def bundle_row(model: SemanticModel, role: str, events: int | None = None) -> dict[str, Any]:
    """Tracing and invocation figures of one bundle (``None`` where it has none)."""
    summary = model.summary
    counts = summary.get("counts") or {}
    if events is None:
        events = counts["kept"] if "kept" in counts else sum(batch.num_rows for batch in model.event_batches())
    sizes = {column: (model.bundle / name).stat().st_size
             if model.bundle is not None and (model.bundle / name).is_file() else None
             for column, name in TRACE_FILES.items()}
    invocations = summary.get("invocation_ns") or {}
    statistic = next((name for name in ("median", "mean") if name in invocations), None)
    # Recorded run time: the invocations dfit itself timed (count × mean).
    run_ns = invocations.get("mean", 0) * invocations.get("count", 0)
    known_sizes = [size for size in sizes.values() if size is not None]
    return {
        "bundle": model.source, "role": role, "mode": _mode(model), "events": events,
        "dropped": counts.get("dropped", summary.get("dropped_events")), **sizes,
        "trace_bytes": sum(known_sizes) if known_sizes else None,
        "invocations": invocations.get("count"),
        # Bundles timed by different harnesses (in-process calls vs iree-benchmark-module)
        # are not compared: the harness's own cost would read as instrumentation overhead.
        "harness": summary.get("timing_harness"),
        # A run's per-invocation time: the median where each call was timed, else the only
        # figure the harness gives (iree-benchmark-module's mean). Runs are compared only
        # within one harness, so a ratio never sets a median against a mean.
        "invocation_ms": invocations[statistic] / 1e6 if statistic else None,
        "invocation_statistic": statistic,
        "event_rate_per_s": round(events / (run_ns / 1e9), 1) if run_ns else None,
    }


def _rank(row: dict[str, Any]) -> int:
    mode = row["mode"]
    return INSTRUMENTATION_ORDER.index(mode) if mode in INSTRUMENTATION_ORDER else len(INSTRUMENTATION_ORDER)


class Overhead(Tool):
    name = "overhead"
    description = "Instrumentation overhead: compile snapshots, runtime slowdown vs a baseline, trace size, analysis."
    needs = ("per_program_timing",)
    options = ("compare",)

    def on_init(self, ctx: ToolContext) -> None:
        started = time.perf_counter()
        compare = [SemanticModel.open(Path(path)) for path in _compare_paths(ctx.options.get("compare"))]
        ctx.state.update(compare=compare, events=0, busy_s=time.perf_counter() - started)

    def on_event(self, ctx: ToolContext, batch: Any) -> None:
        started = time.perf_counter()
        ctx.state["events"] += batch.num_rows
        ctx.state["busy_s"] += time.perf_counter() - started

    def on_shutdown(self, ctx: ToolContext) -> None:
        started = time.perf_counter()
        model = ctx.require_model()
        compile_rows, compile_totals = self._compile_overhead(model)
        rows = [bundle_row(model, "this", ctx.state["events"])]
        rows += [bundle_row(other, "compare") for other in ctx.state["compare"]]
        self._group_and_compare(ctx, [model, *ctx.state["compare"]], rows)

        this = rows[0]
        if this["invocation_ms"] is None:
            ctx.note(NOT_MEASURABLE if model.bundle is not None else
                     "a bare manifest has no run: only the compile overhead is measured")
        elif not ctx.state["compare"]:
            ctx.note("no baseline given: pass compare=BUNDLE[,...] (a `none`-mode run of the same model) for slowdowns")
        if any(row.get("slowdown") is not None and row["slowdown"] < 1 and row["mode"] != row["baseline"]
               for row in rows):
            ctx.note("a more instrumented run was faster than its baseline: timing noise exceeds the instrumentation "
                     "cost at this repeat count (run with a larger --repeat)")
        if not compile_rows:
            ctx.note("no per-stage snapshot or phase times: compile overhead not measurable")
        ctx.export_table("overhead", _table(rows, BUNDLE_COLUMNS), formats=("csv", "json"))
        ctx.export_table("compile", _table(compile_rows, COMPILE_COLUMNS))
        ctx.state["busy_s"] += time.perf_counter() - started
        summary = {"this": this, "compile": compile_totals, "bundles": len(rows),
                   "analysis_s": round(ctx.state["busy_s"], 6), "notes": ctx.notes}
        ctx.write_text("summary.json", json.dumps(summary, indent=1, default=str) + "\n")
        ctx.state.update(rows=rows, compile=compile_totals)

    @staticmethod
    def _compile_overhead(model: SemanticModel) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        rows = [{"stage": stage["name"], "phase_s": stage.get("phase_s"), "snapshot_s": stage.get("snapshot_s"),
                 "snapshot_pct_of_phase": round(100 * stage["snapshot_s"] / stage["phase_s"], 2)
                 if stage.get("phase_s") and stage.get("snapshot_s") is not None else None}
                for stage in model.stages if stage.get("phase_s") is not None or stage.get("snapshot_s") is not None]
        snapshots = sum(row["snapshot_s"] or 0 for row in rows)
        total = (model.manifest.get("compile") or {}).get("total_s")
        return rows, {"snapshot_total_s": round(snapshots, 6) if rows else None, "compile_total_s": total,
                      "snapshot_pct_of_compile": round(100 * snapshots / total, 2) if rows and total else None}

    @staticmethod
    def _group_and_compare(ctx: ToolContext, models: list[SemanticModel], rows: list[dict[str, Any]]) -> None:
        """Group the bundles by model; ratios to each group's least instrumented timed run."""
        groups: list[list[int]] = []
        for index, model in enumerate(models):
            group = next((g for g in groups if same_model(models[g[0]], model)), None)
            if group is None:
                groups.append([index])
            else:
                group.append(index)
        for group in groups:
            label = Path((models[group[0]].manifest.get("input") or {}).get("path") or models[group[0]].source).name
            timed = [i for i in group if rows[i]["invocation_ms"]]
            baselines: dict[str | None, int] = {}  # harness (None: not said) → its least instrumented run
            for i in sorted(timed, key=lambda i: _rank(rows[i])):
                baselines.setdefault(rows[i]["harness"], i)
            for i in group:
                rows[i]["model"] = label
                baseline = baselines.get(rows[i]["harness"])
                if baseline is None or rows[i]["invocation_ms"] is None:
                    continue
                if baseline == i and _rank(rows[i]) > 0 and len(baselines) > 1:
                    ctx.note(f"{rows[i]['mode']} was timed by {rows[i]['harness']}, and no less instrumented run "
                             "was timed the same way; benchmarks/runtime_overhead.py measures each mode against "
                             "its own harness")
                if baseline == i and not any(baselines.get(rows[j]["harness"]) == i for j in timed if j != i):
                    # Alone with its harness: nothing to compare with (not "1.00x").
                    rows[i]["not_compared"] = (f"no other run of this model was timed by {rows[i]['harness']}"
                                               if len(group) > 1 else "no other run of this model was given")
                    continue
                base_ms = rows[baseline]["invocation_ms"]
                rows[i].update(baseline=rows[baseline]["mode"],
                               slowdown=round(rows[i]["invocation_ms"] / base_ms, 4),
                               extra_ms=round(rows[i]["invocation_ms"] - base_ms, 6))
            if 0 not in group:
                others = ", ".join(models[i].source for i in group)
                ctx.note(f"not a run of this model ({label}): {others}; compared only within its own group")

    def report(self, ctx: ToolContext) -> str:
        lines = [f"{'mode':<14}{'events':>8}{'on disk B':>11}{'ms/invocation':>20}{'slowdown':>10}"]
        for row in ctx.state.get("rows", []):
            per_call, slowdown = row["invocation_ms"], row.get("slowdown")
            timed = "-" if per_call is None else f"{per_call:.3f} ({row['invocation_statistic']})"
            shown = ("-" if slowdown is None else "baseline" if row.get("baseline") == row["mode"] and slowdown == 1
                     else f"{slowdown:.2f}x")
            why = f"  (not compared: {row['not_compared']})" if row.get("not_compared") else ""
            lines.append(f"{row['mode']:<14}{row['events']:>8}{row['trace_bytes'] or 0:>11}"
                         f"{timed:>20}{shown:>10}{why}")
        totals = ctx.state.get("compile") or {}
        if totals.get("snapshot_pct_of_compile") is not None:
            lines.append(f"compile: snapshots {totals['snapshot_total_s']:.3f} s of {totals['compile_total_s']:.3f} s "
                         f"({totals['snapshot_pct_of_compile']}%)")
        lines.append(f"analysis took {ctx.state.get('busy_s', 0) * 1e3:.1f} ms")
        return "\n".join(lines)


def _table(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> Any:
    """Rows as an Arrow table with fixed columns, so that an empty table keeps its header."""
    import pyarrow as pa

    return pa.table({column: [row.get(column) for row in rows] for column in columns})
