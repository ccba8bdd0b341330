"""semantic-attribution: which source line (and module) each op, partition and measured
nanosecond comes from.

An op's *site* is the first frame of its call stack (then its own location) that lies
outside framework code; where the backend gives no file:line the module path stands in
(Edge TPU tensor names, SambaFlow op names), and where every frame is framework code the
innermost one does. A region-body op without a location (a ``linalg.yield``) belongs to
its parent op's site.

Measured time is the duration of the execution events that enclose no other timed event
(a program encloses its functions, a queue execute its dispatches: adding both would
count twice; compile and metric events are not execution time). A dispatch event's time is
split **evenly** over the compute ops fused into its partition (the top-level ops that
consume a value: constants and empty tensors materialise values and get none); an event
naming a ``root_id`` (reconstructions) goes to that op. Whatever is left is listed, by
event kind and partition, in ``unattributed.csv``.

Outputs ``partitions.csv``, ``sites.csv`` (the ranking), ``unattributed.csv`` and
``summary.json``.
"""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from dfit_mlir.errors import InvalidInputError
from dfit_mlir.tools.api import Tool, ToolContext
from dfit_mlir.tools.model import Operator, SemanticModel

#: Path fragments of framework, library and compiler code: a frame whose file (with a
#: leading "/") contains one is not the model author's. Frameworks report their own
#: layers' files first (``torch/nn/modules/linear.py``); ranking those would put every
#: Linear of a model on one line. Installed packages live under ``/lib/python``.
FRAMEWORK_PATHS = ("/site-packages/torch", "/torch/nn/", "/torch/autograd/", "/torch/_", "/tensorflow/", "/keras/",
                   "/jax/", "/jaxlib/", "/flax/", "/lib/python", "/iree/", "/cerebras/pytorch/")
#: Event kinds that time execution; ``compile`` and ``metric`` events do not.
EXECUTION_KINDS = frozenset({"dispatch", "queue", "memory", "tensor", "function", "program"})
SITE_COLUMNS = ("rank", "site", "site_kind", "operators", "flops", "time_ns", "time_share", "module_paths")
PARTITION_COLUMNS = ("partition", "kind", "root_id", "root_site", "sites", "module_paths", "operators",
                     "compute_ops", "time_ns")
UNATTRIBUTED_COLUMNS = ("what", "kind", "partition", "count", "time_ns")


def is_framework(path: str) -> bool:
    normalized = "/" + path.lstrip("/")
    return any(fragment in normalized for fragment in FRAMEWORK_PATHS)


def op_site(model: SemanticModel, op: Operator) -> tuple[str, str] | None:
    """(site, kind) with kind ``source``, ``module`` or ``framework``; ``None`` if unknown."""
    frames = [frame for frame in (*op.call_stack, op.source) if frame and frame.get("file")]
    user = next((frame for frame in frames if not is_framework(frame["file"])), None)
    if user is not None:
        return f"{user['file']}:{user['line']}", "source"
    parent = model.operator(op.raw.get("parent") or "")
    if not frames and parent is not None:
        return op_site(model, parent)
    if op.name_path:
        return model.module_path(op.id) or "", "module"
    if frames:
        return f"{frames[0]['file']}:{frames[0]['line']}", "framework"
    return None


def leaf_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Timed events that enclose no other timed event: a program encloses its functions,
    an IREE queue execute its dispatches; adding both would count the time twice."""
    spans = sorted((e for e in events if e["start_ns"] is not None and e["duration_ns"]),
                   key=lambda e: (e["start_ns"], -e["duration_ns"]))
    enclosing: set[int] = set()
    earliest_end = None
    for event in reversed(spans):  # every later span starts at or after this one
        end = event["start_ns"] + event["duration_ns"]
        if earliest_end is not None and earliest_end <= end:
            enclosing.add(id(event))
        earliest_end = end if earliest_end is None else min(earliest_end, end)
    return [e for e in events if id(e) not in enclosing]


@dataclass(frozen=True)
class TimeSplit:
    """Measured time: per op and per partition where attributed, else by (event kind, partition)."""

    op_ns: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    partition_ns: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))
    rest_ns: defaultdict[tuple[str, str | None], int] = field(default_factory=lambda: defaultdict(int))
    rest_count: Counter[tuple[str, str | None]] = field(default_factory=Counter)
    #: Leaf events counted, by kind.
    events: Counter[str] = field(default_factory=Counter)


class SemanticAttribution(Tool):
    name = "semantic-attribution"
    description = "Ops, partitions and measured time → source file:line and module path; a ranking of source sites."
    needs = ("source_locations",)

    def on_init(self, ctx: ToolContext) -> None:
        if ctx.options:
            raise InvalidInputError(f"semantic-attribution: takes no options (got {', '.join(sorted(ctx.options))})")
        ctx.state.update(events=[], busy_s=0.0)

    def on_event(self, ctx: ToolContext, batch: Any) -> None:
        started = time.perf_counter()
        columns = ["kind", "site", "root_id", "partition", "start_ns", "duration_ns"]
        ctx.state["events"].extend(row for row in batch.select(columns).to_pylist()
                                   if row["duration_ns"] is not None and row["kind"] in EXECUTION_KINDS)
        ctx.state["busy_s"] += time.perf_counter() - started

    def on_shutdown(self, ctx: ToolContext) -> None:
        started = time.perf_counter()
        model = ctx.require_model()
        sites = {op_id: op_site(model, op) for op_id, op in model.operators.items()}
        split = self._split_time(model, ctx.state["events"])
        op_time = split.op_ns

        by_site: dict[str, dict[str, Any]] = {}
        for op_id, found in sites.items():
            if found is None:
                continue
            entry = by_site.setdefault(found[0], {"site": found[0], "site_kind": found[1], "operators": 0,
                                                  "flops": 0, "time_ns": 0.0, "module_paths": set()})
            entry["operators"] += 1
            entry["flops"] += model.operators[op_id].flops or 0
            entry["time_ns"] += op_time.get(op_id, 0.0)
            if model.module_path(op_id):
                entry["module_paths"].add(model.module_path(op_id))
        total_time = sum(op_time.values()) + sum(split.rest_ns.values())
        ranking = sorted(by_site.values(), key=lambda e: (-e["time_ns"], -e["flops"], -e["operators"], e["site"]))
        site_rows = [{**entry, "rank": rank, "time_ns": round(entry["time_ns"], 3),
                      "time_share": round(entry["time_ns"] / total_time, 6) if total_time else None,
                      "module_paths": ";".join(sorted(entry["module_paths"]))}
                     for rank, entry in enumerate(ranking, 1)]

        partition_rows = []
        for partition in model.partitions:
            compute = model.compute_ops(partition)
            partition_rows.append({
                "partition": partition.id, "kind": partition.kind, "root_id": partition.root_id,
                "root_site": (sites.get(partition.root_id or "") or (None,))[0],
                "sites": ";".join(dict.fromkeys(sites[i][0] for i in compute if sites.get(i))),
                "module_paths": ";".join(dict.fromkeys(p for i in compute if (p := model.module_path(i)))),
                "operators": len(partition.operator_ids), "compute_ops": len(compute),
                "time_ns": split.partition_ns.get(partition.id, 0)})

        unattributed_ops = Counter(model.operators[i].op for i, found in sites.items() if found is None)
        unattributed_rows = [{"what": "op", "kind": kind, "partition": None, "count": count, "time_ns": None}
                             for kind, count in unattributed_ops.most_common()]
        unattributed_rows += [{"what": "event", "kind": kind, "partition": partition, "count": count,
                               "time_ns": split.rest_ns[(kind, partition)]}
                              for (kind, partition), count in split.rest_count.most_common()]

        attributed_ops = sum(1 for found in sites.values() if found is not None)
        attributed_time = sum(op_time.values())
        summary = {
            "operators": len(sites), "attributed_operators": attributed_ops,
            "attributed_operators_pct": round(100 * attributed_ops / len(sites), 2) if sites else None,
            "operators_by_site_kind": dict(Counter(found[1] for found in sites.values() if found)),
            "sites": len(site_rows), "partitions": len(partition_rows),
            "timed_events_by_kind": dict(split.events),
            "event_time_ns": total_time, "attributed_time_ns": round(attributed_time, 3),
            "attributed_time_pct": round(100 * attributed_time / total_time, 2) if total_time else None,
            "top_sites": [row["site"] for row in site_rows[:5]],
        }
        if not total_time:
            ctx.note("no measured execution time in this bundle: sites are ranked by FLOPs and op count only")
        if not any(found and found[1] == "source" for found in sites.values()):
            ctx.note("no op has a file:line outside framework code; sites are module paths or framework frames")
        ctx.export_table("sites", _table(site_rows, SITE_COLUMNS))
        ctx.export_table("partitions", _table(partition_rows, PARTITION_COLUMNS))
        ctx.export_table("unattributed", _table(unattributed_rows, UNATTRIBUTED_COLUMNS))
        ctx.write_text("summary.json", json.dumps(summary, indent=1) + "\n")
        ctx.state["summary"] = summary
        ctx.state["busy_s"] += time.perf_counter() - started

    @staticmethod
    def _split_time(model: SemanticModel, events: list[dict[str, Any]]) -> TimeSplit:
        split = TimeSplit()
        for event in leaf_events(events):
            split.events[event["kind"]] += 1
            duration = event["duration_ns"]
            partition = model.partition_of_site(event["site"]) if event["site"] is not None else None
            root = model.operator(event["root_id"]) if event["root_id"] else None
            if partition is not None:
                ops = model.compute_ops(partition)
                for op_id in ops:
                    split.op_ns[op_id] += duration / len(ops)
                split.partition_ns[partition.id] += duration
            elif root is not None:
                split.op_ns[root.id] += duration
                if root.partition:
                    split.partition_ns[root.partition] += duration
            else:
                split.rest_ns[(event["kind"], event["partition"])] += duration
                split.rest_count[(event["kind"], event["partition"])] += 1
        return split

    def report(self, ctx: ToolContext) -> str:
        summary = ctx.state.get("summary")
        if not summary:
            return ""
        time_part = (f", {summary['attributed_time_pct']}% of {_duration_text(summary['event_time_ns'])} measured"
                     if summary["attributed_time_pct"] is not None else ", no measured time")
        return (f"{summary['attributed_operators']}/{summary['operators']} ops attributed "
                f"({summary['attributed_operators_pct']}%){time_part}; top sites: "
                f"{', '.join(summary['top_sites'][:3]) or 'none'}\nanalysis took {ctx.state['busy_s'] * 1e3:.1f} ms")


def _duration_text(ns: float) -> str:
    return f"{ns / 1e9:.3f} s" if ns >= 1e9 else f"{ns / 1e6:.3f} ms" if ns >= 1e6 else f"{ns / 1e3:.1f} µs"


def _table(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> Any:
    """Rows as an Arrow table with fixed columns, so that an empty table keeps its header."""
    import pyarrow as pa

    return pa.table({column: [row.get(column) for row in rows] for column in columns})
