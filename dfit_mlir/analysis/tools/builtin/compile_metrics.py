"""compile-metrics: what each compiler stage did to the tagged ops, and what it cost.

Per stage (``manifest.stages``): op counts, how many carry a dfit ID, coverage, how the
source IDs fared (preserved / fused / split / erased), the ops the compiler materialised
without an ID (by kind), the partitions formed there, and the phase's compile time.
Outputs ``stages.csv``, ``phases.csv`` and ``materialised.csv``.

A reconstructed bundle has one ``reconstructed`` stage and no per-phase times in its
manifest; the tool says so and lists the vendor log's ``compile`` events instead, when
there are any.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

from dfit_mlir.analysis.tools.api import Tool, ToolContext
from dfit_mlir.core.errors import InvalidInputError

#: Lineage classes, in the order the columns appear.
LINEAGE_CLASSES = ("preserved", "fused", "split", "erased", "erased_constants")
STAGE_COLUMNS = ("stage", "ops", "tagged_ops", "non_constant_ops", "non_constant_tagged", "coverage", "attributed",
                 *LINEAGE_CLASSES, "materialised", "top_materialised", "partitions", "partition_kinds",
                 "phase_s", "snapshot_s")
PHASE_COLUMNS = ("phase", "level", "seconds", "share_of_total", "source")
MATERIALISED_COLUMNS = ("stage", "kind", "count")
DEFAULT_TOP_KINDS = 5


def _top_kinds(option: Any) -> int:
    try:
        top = int(option)
    except (TypeError, ValueError):
        top = 0
    if top < 1:
        raise InvalidInputError(f"compile-metrics: option top={option!r} must be a positive integer")
    return top


def _table(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> Any:
    """Rows as an Arrow table with fixed columns, so that an empty table keeps its header."""
    import pyarrow as pa

    return pa.table({column: [row.get(column) for row in rows] for column in columns})


def _kinds_text(counts: Counter[str] | dict[str, int], top: int | None = None) -> str:
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return ";".join(f"{kind}:{count}" for kind, count in ranked[:top])


class CompileMetrics(Tool):
    name = "compile-metrics"
    description = "Per-stage op counts, ID coverage, lineage, materialised ops, partitions and compile time."
    needs = ("compiler_ir", "lineage")
    options = ("top",)

    def on_init(self, ctx: ToolContext) -> None:
        ctx.state.update(top=_top_kinds(ctx.options.get("top", DEFAULT_TOP_KINDS)), compile_events=[],
                         busy_s=0.0)

    def on_event(self, ctx: ToolContext, batch: Any) -> None:
        started = time.perf_counter()
        # Reconstructions carry the vendor's compile phases as events; a compiler-visible
        # backend has them in the manifest already. Found column-wise: a run's millions of
        # dispatch events are never made Python rows (41 s at 2.2M events when they were).
        import pyarrow as pa
        import pyarrow.compute as pc

        kind = batch.column("kind")
        if pa.types.is_dictionary(kind.type):
            kind = kind.dictionary_decode()
        wanted = pc.and_(pc.fill_null(pc.equal(kind, pa.scalar("compile")), False), pc.is_valid(batch.column("duration_ns")))
        if pc.any(wanted).as_py():
            ctx.state["compile_events"].extend(batch.filter(wanted).to_pylist())
        ctx.state["busy_s"] += time.perf_counter() - started

    def on_shutdown(self, ctx: ToolContext) -> None:
        started = time.perf_counter()
        model = ctx.require_model()
        stages = model.stages
        stage_rows = [self._stage_row(ctx, stage) for stage in stages]
        materialised = [{"stage": stage["name"], "kind": kind, "count": count}
                        for stage in stages
                        for kind, count in sorted((stage.get("materialised_by_kind") or {}).items(),
                                                  key=lambda item: (-item[1], item[0]))]
        phases = self._phase_rows(ctx)
        if model.reconstructed:
            ctx.note("reconstructed bundle: one `reconstructed` stage; the manifest has no compiler phases and no "
                     "per-phase compile times"
                     + (f"; {len(phases)} compile timings from the vendor's logs are listed instead" if phases else ""))
        elif not stages:
            ctx.note("the manifest has no stages (compiled without --dfit-tag snapshots)")
        ctx.export_table("stages", _table(stage_rows, STAGE_COLUMNS))
        ctx.export_table("phases", _table(phases, PHASE_COLUMNS))
        ctx.export_table("materialised", _table(materialised, MATERIALISED_COLUMNS))
        ctx.state.update(stage_rows=stage_rows, phases=phases)
        ctx.state["busy_s"] += time.perf_counter() - started

    def _stage_row(self, ctx: ToolContext, stage: dict[str, Any]) -> dict[str, Any]:
        lineage = stage.get("lineage") or {}
        materialised = stage.get("materialised_by_kind") or {}
        partitions = self._partitions_at(ctx, stage["name"])
        return {
            "stage": stage["name"],
            **{key: stage.get(key) for key in ("ops", "tagged_ops", "non_constant_ops", "non_constant_tagged",
                                               "coverage", "attributed")},
            **{key: lineage.get(key) for key in LINEAGE_CLASSES},
            "materialised": sum(materialised.values()),
            "top_materialised": _kinds_text(materialised, ctx.state["top"]),
            "partitions": sum(partitions.values()) if partitions else None,
            "partition_kinds": _kinds_text(partitions) if partitions else None,
            "phase_s": stage.get("phase_s"),
            "snapshot_s": stage.get("snapshot_s"),
        }

    @staticmethod
    def _partitions_at(ctx: ToolContext, stage_name: str) -> Counter[str]:
        """Partitions formed at a stage: IREE-style exports and dispatch sites are recorded
        with the stage that produced them; reconstructed groups belong to the only stage."""
        model = ctx.require_model()
        section = model.manifest.get("partitions") or {}
        found: Counter[str] = Counter()
        if section.get("exports_stage") == stage_name and section.get("exports"):
            found["export"] = len(section["exports"])
        if section.get("sites_stage") == stage_name and section.get("dispatch_sites"):
            found["dispatch"] = len(section["dispatch_sites"])
        if model.reconstructed:
            found.update(partition.kind for partition in model.partitions if partition.kind != "dispatch")
        return found

    @staticmethod
    def _phase_rows(ctx: ToolContext) -> list[dict[str, Any]]:
        model = ctx.require_model()
        compile_info = model.manifest.get("compile") or {}
        phase_s = compile_info.get("phase_s") or {}
        total = compile_info.get("total_s")
        rows = [{"phase": phase, "level": 0, "seconds": seconds,
                 "share_of_total": round(seconds / total, 6) if total and seconds is not None else None,
                 "source": "manifest"} for phase, seconds in phase_s.items()]
        if total is not None:
            rows.append({"phase": "total", "level": 0, "seconds": total, "share_of_total": 1.0, "source": "manifest"})
        if rows:
            return rows
        for event in ctx.state["compile_events"]:
            attributes = json.loads(event["attributes"] or "{}")
            rows.append({"phase": attributes.get("phase") or event["name"] or "compile",
                         "level": attributes.get("level"), "seconds": event["duration_ns"] / 1e9,
                         "share_of_total": None, "source": "events"})
        return rows

    def report(self, ctx: ToolContext) -> str:
        rows = ctx.state.get("stage_rows", [])
        if not rows:
            return "no stages"
        last = rows[-1]
        lines = [f"{len(rows)} stage(s); {rows[0]['stage']}: {rows[0]['ops']} ops → {last['stage']}: {last['ops']} "
                 f"ops, {last['tagged_ops']} tagged (coverage {last['coverage']})"]
        total = next((row["seconds"] for row in ctx.state["phases"] if row["phase"] == "total"), None)
        if total is not None:
            slowest = max((row for row in ctx.state["phases"] if row["phase"] != "total"),
                          key=lambda row: row["seconds"])
            lines.append(f"compile {total:.3f} s; slowest phase {slowest['phase']} ({slowest['seconds']:.3f} s)")
        lines.append(f"analysis took {ctx.state['busy_s'] * 1e3:.1f} ms")
        return "\n".join(lines)
