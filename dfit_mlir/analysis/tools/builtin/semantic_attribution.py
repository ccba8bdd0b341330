"""semantic-attribution: which source line, module and phase each op, partition and
measured nanosecond comes from.

An op's *site* is the innermost frame of its call stack that is **model code** (see
:class:`dfit_mlir.frontends.CodeRules`: ``transformers/models/*`` and a user's script are
model code, ``torch``, ``jax``, ``transformers/utils`` and dfit are not; options
``framework_code``/``model_code`` put the user's own globs in front). Where no frame is
model code and no frame has a line (TFLite ``model.tflite:0``, ONNX node names,
reconstructions) the op's module path stands in; where every frame is framework code the
innermost one does. A region-body op without a location (a ``linalg.yield``) belongs to
its parent op's site.

Measured time and costs come from the bundle's ledger (:mod:`dfit_mlir.analysis.ledger`, its
spec): a dispatch's time is split over its compute ops by the ledger's stated time model
(a roofline weight per op: a matmul carries its arithmetic, a fused elementwise consumer
only its own FLOPs and the bytes it writes out), an event naming a ``root_id``
(reconstructions) goes to that op, and "% of measured" is the union of the attributed
leaf intervals over the union of all leaf execution intervals (overlapping asynchronous
spans count once; the summary says which event kinds it covers). Whatever is left is
listed, by event kind and partition, in ``unattributed.csv``. ``partitions.csv`` names
each dispatch's root op, its fused ops and the time model that split it.

Rollups over the frontend's source model (manifest fields ``module_path``,
``module_class``, ``phase``): ``modules.csv`` is the module tree — every module path and
its ancestors, with self and inclusive ops, FLOPs, executed FLOPs, bytes and measured
time; ``phases.csv`` the same per phase; ``flamegraph.svg`` draws the tree (width:
measured time, else FLOPs, else ops; each frame's tooltip gives its FLOPs per trip and,
from a run, its executed FLOPs over the run and per invocation) and ``speedscope.json`` opens in https://www.speedscope.app
(one profile for the model, one per phase).

**Per trip and executed** (the ledger's, module doc "Executed work"). ``flops``,
``self_flops`` and ``transcendentals`` are static, **per trip**: each op counted once per
call of its site, as the program says, however often a loop runs it. Every table then
has the executed columns (:data:`EXECUTED_COLUMNS`): ``executed_flops``,
``executed_macs``, ``executed_transcendentals`` — the work the run did, over the whole run
(per-trip figure × the run's dispatch events at each partition, so a ``lax.scan`` or
``scf.for`` body counts once per trip and per invocation) — and
``executed_flops_per_invocation`` (÷ the run's invocations, ``instances`` in the summary):
the figure to hold against a count of one call of the program with its loops unrolled
(XLA's ``cost_analysis()["flops"]`` of the unrolled step). ``modules.csv`` adds
``self_executed_flops``; ``partitions.csv`` has ``flops`` (per trip) beside ``calls`` and
``executed_flops`` = ``flops`` × ``calls``. Time counts every trip, so a rate derived from
``time_ns`` divides ``executed_flops``, never ``flops``. Where the run counted no
executions — a manifest without a run, a run without dispatch events (``--mode
none/ids/lite``), or one that kept only some (``--ids``, ``--sample``, dropped events) —
the manifest's static trip counts stand in where every dispatch site has one:
``executed_flops_per_invocation`` = per trip × trips, and the whole-run columns that too ×
the invocations a run says ran (empty for a manifest alone). Every table's
``executed_basis`` column (and the summary's) names the source: ``run events`` or
``manifest trips``. Where neither knows (a loop bound known only at run time, a
reconstruction's groups) the executed columns are empty, never 0, and the summary's
``executed_unknown`` / ``per_invocation_unknown`` and a note say why.

Outputs ``partitions.csv``, ``sites.csv`` (the ranking), ``modules.csv``, ``phases.csv``,
``flamegraph.svg``, ``speedscope.json``, ``unattributed.csv`` and ``summary.json``
(totals: ``flops`` per trip, the executed columns, ``instances``).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

from dfit_mlir.analysis import ledger
from dfit_mlir.analysis.model import Operator, SemanticModel
from dfit_mlir.analysis.tools.api import Tool, ToolContext
from dfit_mlir.core import locations, module_paths
from dfit_mlir.core.errors import InvalidInputError
from dfit_mlir.core.lineage import is_constant
from dfit_mlir.exporters import flamegraph
from dfit_mlir.frontends import CodeRules, module_classes, parse_globs, site_notes

EXECUTION_KINDS = ledger.EXECUTION_KINDS
#: Executed work over the whole run (the ledger's: per-trip figure × the run's dispatch
#: events), then executed FLOPs per invocation (÷ the run's invocations): empty where no
#: run counted executions. Every table carries them after its per-trip ``flops``.
EXECUTED_COLUMNS = ("executed_flops", "executed_macs", "executed_transcendentals", "executed_flops_per_invocation")
#: Where every row's executed figures come from (the ledger's ``executed_basis``: ``run
#: events`` or ``manifest trips``; empty where they are unknown), beside them in each table.
BASIS_COLUMN = "executed_basis"
SITE_COLUMNS = ("rank", "site", "site_kind", "operators", "flops", "transcendentals", *EXECUTED_COLUMNS, BASIS_COLUMN,
                "time_ns", "attributed_share", "module_paths", "phases", "site_rule")
PARTITION_COLUMNS = ("partition", "kind", "root_id", "root_site", "sites", "module_paths", "operators",
                     "compute_ops", "fused_ids", "calls", "flops", *EXECUTED_COLUMNS, BASIS_COLUMN, "time_ns",
                     "root_share", "time_model")
UNATTRIBUTED_COLUMNS = ("what", "kind", "partition", "count", "time_ns")
MODULE_COLUMNS = ("module_path", "parent", "depth", "name", "module_class", "self_ops", "ops", "self_flops", "flops",
                  "self_executed_flops", *EXECUTED_COLUMNS, BASIS_COLUMN, "self_bytes", "bytes", "self_time_ns",
                  "time_ns",
                  "self_attributed_share", "attributed_share", "phases")
PHASE_COLUMNS = ("phase", "ops", "non_constant_ops", "flops", "transcendentals", *EXECUTED_COLUMNS, BASIS_COLUMN,
                 "bytes", "time_ns", "attributed_share", "modules")
OPTIONS = ("framework_code", "model_code")
#: Structural ops: neither constants nor computation (counted apart in the summary).
STRUCTURAL_OPS = frozenset({"func.func", "func.return", "util.func", "util.return", "builtin.module"})
ROOT_SITE = "(root)"
PHASES_ORDER = ("forward", "loss", "backward", "recompute", "optimizer", "initializer")


def is_framework(path: str, rules: CodeRules | None = None) -> bool:
    return (rules or CodeRules.default()).is_framework(path)


def op_site(model: SemanticModel, op: Operator, rules: CodeRules | None = None) -> tuple[str, str] | None:
    """(site, kind) with kind ``source``, ``module`` or ``framework``; ``None`` if unknown."""
    rules = rules or CodeRules.default()
    frames = [frame for frame in (*op.call_stack, op.source) if frame and frame.get("file")]
    user = locations.model_frame(frames, rules.is_model_code)
    if user is not None:
        return f"{user['file']}:{user['line']}", "source"
    lines = [frame for frame in frames if locations.is_source_line(frame)]
    parent = model.operator(op.raw.get("parent") or "")
    if not lines and not op.name_path and parent is not None:
        return op_site(model, parent, rules)
    module = model.module_path(op.id)
    if module is not None and (op.name_path or op.module_path is not None):
        return module or ROOT_SITE, "module"
    if lines:
        return f"{lines[0]['file']}:{lines[0]['line']}", "framework"
    return None


def site_rule(site: tuple[str, str], rules: CodeRules) -> str:
    """Why a site is what it is: the code rule that decided its file (``source``:
    model code, ``framework``: every frame was framework code), or that no frame had a
    line (``module``)."""
    name, kind = site
    if kind == "module":
        return "module path (no frame of model code has a source line)"
    return rules.explain(name.rsplit(":", 1)[0]).reason


def explain_site(model: SemanticModel, site: str, rules: CodeRules | None = None, limit: int = 3) -> str:
    """How the ops of ``site`` (a ``sites.csv`` site) got there: per op (the first
    ``limit``), every frame of its call stack, innermost first, with the rule that
    decided whether it is model code (``dfit analyze … --explain-site SITE``)."""
    rules = rules or CodeRules.default()
    found = [(op, kind) for op in model.operators.values() if (at := op_site(model, op, rules)) and at[0] == site
             for kind in (at[1],)]
    if not found:
        raise InvalidInputError(f"--explain-site {site}: no op has this site (sites are the `site` column of "
                                f"sites.csv: file:line, or a module path)")
    lines = [f"site {site} ({found[0][1]}): {len(found)} ops"]
    for op, _ in found[:limit]:
        lines.append(f"  {op.id} ({model.module_path(op.id) or '-'})")
        frames = [frame for frame in (op.source, *op.call_stack) if frame and frame.get("file")]
        for frame in dict.fromkeys((f["file"], f["line"]) for f in frames):
            decision = rules.explain(frame[0])
            where = "model code" if decision.model_code else "framework"
            lines.append(f"    {frame[0]}:{frame[1]}  {where}: {decision.reason}")
        if not frames:
            lines.append("    no frame with a file: " + site_rule((site, found[0][1]), rules))
        lines.extend(f"    note: {note}" for note in site_notes(op.name_path))
    if len(found) > limit:
        lines.append(f"  … {len(found) - limit} more ops")
    return "\n".join(lines)


class SemanticAttribution(Tool):
    name = "semantic-attribution"
    description = ("Ops, partitions and measured time → model-code line, module path and phase; a ranking of "
                   "source sites, a module tree with a flame graph, a per-phase table.")
    needs = ("source_locations",)
    options = OPTIONS

    def on_init(self, ctx: ToolContext) -> None:
        rules = CodeRules.default().extended(framework=parse_globs(ctx.options.get("framework_code")),
                                             model=parse_globs(ctx.options.get("model_code")))
        ctx.state.update(busy_s=0.0, rules=rules)

    def on_shutdown(self, ctx: ToolContext) -> None:
        started = time.perf_counter()
        model = ctx.require_model()
        rules = ctx.state["rules"]
        sites = {op_id: op_site(model, op, rules) for op_id, op in model.operators.items()}
        book = ledger.of(model)
        # The ledger's sums per site: FLOPs per trip, transcendentals (exp/tanh/erf/… per
        # element, dfit_mlir.core.costs, not in flops), executed work, time.
        rolled = book.rollup_ops({op_id: found[0] for op_id, found in sites.items() if found is not None})

        by_site: dict[str, dict[str, Any]] = {}
        for op_id, found in sites.items():
            if found is None:
                continue
            entry = by_site.setdefault(found[0], {"site": found[0], "site_kind": found[1], "operators": 0,
                                                  **_figures(book, rolled.get(found[0])), "module_paths": set(),
                                                  "phases": Counter(), "site_rule": site_rule(found, rules)})
            entry["operators"] += 1
            entry["phases"][model.operators[op_id].phase or "(none)"] += 1
            if model.module_path(op_id):
                entry["module_paths"].add(model.module_path(op_id))
        totals = book.totals
        total_time = totals.measured_ns
        ranking = sorted(by_site.values(), key=lambda e: (-e["time_ns"], -e["flops"], -e["operators"], e["site"]))
        site_rows = [{**entry, "rank": rank, "attributed_share": book.share(entry["time_ns"]),
                      "module_paths": ";".join(sorted(entry["module_paths"])),
                      "phases": ";".join(f"{p}:{n}" for p, n in entry["phases"].most_common())}
                     for rank, entry in enumerate(ranking, 1)]

        partition_rows = []
        for partition in model.partitions:
            compute = model.compute_ops(partition)
            split = book.partition_summary(partition)
            work = book.partition_figures(partition.id)
            partition_rows.append({
                "partition": partition.id, "kind": partition.kind, "root_id": partition.root_id,
                "root_site": root_site[0] if (root_site := sites.get(partition.root_id or "")) else None,
                "sites": ";".join(dict.fromkeys(site[0] for i in compute if (site := sites.get(i)))),
                "module_paths": ";".join(dict.fromkeys(p for i in compute if (p := model.module_path(i)))),
                "operators": len(partition.operator_ids), "compute_ops": len(compute),
                "fused_ids": ";".join(split["fused"]),
                "calls": book.calls(partition.id), "flops": work["flops"], **_executed(book, work),
                "time_ns": book.partition_ns(partition.id),
                "root_share": (round(split["shares"][partition.root_id], 6)
                               if partition.root_id in split["shares"] else None),
                "time_model": split["time_model"]})

        unattributed_ops = Counter(model.operators[i].op for i, found in sites.items() if found is None)
        unattributed_rows = [{"what": "op", "kind": kind, "partition": None, "count": count, "time_ns": None}
                             for kind, count in unattributed_ops.most_common()]
        unattributed_rows += [{"what": "event", "kind": rest.kind, "partition": rest.partition, "count": rest.count,
                               "time_ns": rest.time_ns} for rest in book.unattributed]

        attributed_ops = sum(1 for found in sites.values() if found is not None)
        summary = {
            "operators": len(sites), "attributed_operators": attributed_ops,
            "attributed_operators_pct": round(100 * attributed_ops / len(sites), 2) if sites else None,
            "operators_by_site_kind": dict(Counter(found[1] for found in sites.values() if found)),
            "sites": len(site_rows), "partitions": len(partition_rows),
            "timed_events_by_kind": dict(totals.kinds), "measured_covers": totals.covers,
            "event_time_ns": total_time, "leaf_sum_ns": totals.leaf_sum_ns,
            "attributed_time_ns": book.attributed_time_ns, "attributed_union_ns": totals.attributed_union_ns,
            "shares_of": ledger.SHARE_BASIS, "instances": book.instances,
            "attributed_time_pct": totals.attributed_pct, "time_model": book.time_models_label(),
            "time_model_source": book.time_model.source,
            "top_sites": [row["site"] for row in site_rows[:5]],
            "flops": book.total_flops, **book.executed_totals,
            "executed_flops_per_invocation": book.flops_per_invocation, BASIS_COLUMN: book.executed_basis,
            "executed_unknown": book.executed_unknown, "per_invocation_unknown": book.per_invocation_unknown,
        }
        summary.update(self._rollups(ctx, model, book))
        if not total_time:
            ctx.note("no measured execution time in this bundle: sites are ranked by FLOPs and op count only")
        if book.executed_basis is None:
            ctx.note(f"executed_* columns are empty: {book.per_invocation_unknown}")
        elif book.executed_basis == ledger.MANIFEST_TRIPS:
            ctx.note(f"executed figures are per-trip figures x the manifest's static trip counts (executed_basis: "
                     f"{ledger.MANIFEST_TRIPS}), since {book.events_uncounted}")
            if book.executed_unknown:
                ctx.note(f"executed figures over the whole run are empty (per invocation is known): "
                         f"{book.executed_unknown}")
        if not any(found and found[1] == "source" for found in sites.values()):
            ctx.note("no op has a file:line outside framework code; sites are module paths or framework frames")
        ctx.export_table("sites", _table(site_rows, SITE_COLUMNS))
        ctx.export_table("partitions", _table(partition_rows, PARTITION_COLUMNS))
        ctx.export_table("unattributed", _table(unattributed_rows, UNATTRIBUTED_COLUMNS))
        ctx.write_text("summary.json", json.dumps(summary, indent=1) + "\n")
        ctx.state["summary"] = summary
        ctx.state["busy_s"] += time.perf_counter() - started

    @staticmethod
    def _rollups(ctx: ToolContext, model: SemanticModel, book: ledger.Ledger) -> dict[str, Any]:
        """The module tree (``modules.csv``, ``flamegraph.svg``, ``speedscope.json``) and
        the per-phase table (``phases.csv``), both the ledger's; returns their figures for
        the summary."""
        classes = {op_id: module_classes(model.frontend, op.raw) for op_id, op in model.operators.items()
                   if model.module_path(op_id) is not None}
        tree = book.module_tree(classes=classes.__getitem__)
        module_rows = [{
            "module_path": path, "parent": node.parent, "depth": node.depth, "name": module_paths.leaf_name(path),
            "module_class": node.module_class, "self_ops": node.self_values["ops"], "ops": node.values["ops"],
            "self_flops": node.self_values["flops"], "flops": node.values["flops"],
            "self_executed_flops": node.self_values["executed_flops"], **_executed(book, node.values),
            "self_bytes": node.self_values["bytes"], "bytes": node.values["bytes"],
            "self_time_ns": node.self_values["time_ns"], "time_ns": node.values["time_ns"],
            "self_attributed_share": book.share(node.self_values["time_ns"]),
            "attributed_share": book.share(node.values["time_ns"]),
            "phases": ";".join(f"{p}:{n}" for p, n in sorted(node.phases.items(), key=lambda kv: -kv[1])),
        } for path, node in tree.items()]
        ctx.export_table("modules", _table(module_rows, MODULE_COLUMNS))

        rolled = book.rollup_ops({op_id: op.phase or "(none)" for op_id, op in model.operators.items()})
        by_phase: dict[str, dict[str, Any]] = {}
        for op in model.operators.values():
            key = op.phase or "(none)"
            row = by_phase.setdefault(key, {"phase": key, "ops": 0, "non_constant_ops": 0,
                                            **_figures(book, rolled.get(key)), "modules": set()})
            row["ops"] += 1
            row["non_constant_ops"] += not is_constant(op.op)
            if (path := model.module_path(op.id)) is not None:
                row["modules"].add(path)
        order = {name: index for index, name in enumerate((*PHASES_ORDER, "(none)"))}
        phase_rows = [{**row, "attributed_share": book.share(row["time_ns"]), "modules": len(row["modules"])}
                      for row in sorted(by_phase.values(), key=lambda r: order.get(r["phase"], len(order)))]
        ctx.export_table("phases", _table(phase_rows, PHASE_COLUMNS))

        title = f"{model.frontend or model.backend} model {_model_name(model)}"
        if tree:
            weight = flamegraph.weight_of(tree)
            flamegraph.write_svg(tree, ctx.output_path("flamegraph.svg"), title, weight,
                                 per_invocation=book.per_invocation, basis=book.executed_basis)
            per_phase = []
            for phase in (r["phase"] for r in phase_rows if r["phase"] != "(none)"):
                sub = book.module_tree((op_id for op_id, op in model.operators.items() if op.phase == phase),
                                       classes=classes.__getitem__)
                if sub:
                    per_phase.append((f"phase: {phase}", sub))
            document = flamegraph.speedscope(tree, title, per_phase, weight)
            flamegraph.write_speedscope(document, ctx.output_path("speedscope.json"))
        else:
            ctx.note("no op has a module path: no module tree, flame graph or speedscope profile")
        non_structural = [op for op in model.operators.values()
                          if not is_constant(op.op) and op.op not in STRUCTURAL_OPS]
        return {
            "frontend": model.frontend,
            "modules": len(module_rows),
            "operators_by_phase": {row["phase"]: row["ops"] for row in phase_rows},
            "non_constant_ops": len(non_structural),
            "non_constant_with_phase_pct": _pct(sum(1 for op in non_structural if op.phase), len(non_structural)),
            "non_constant_with_module_pct": _pct(sum(1 for op in non_structural
                                                     if model.module_path(op.id) is not None), len(non_structural)),
            "non_constant_without_phase_by_kind": dict(Counter(op.op for op in non_structural
                                                               if not op.phase).most_common()),
            "non_constant_without_module_by_kind": dict(Counter(op.op for op in non_structural
                                                                if model.module_path(op.id) is None).most_common()),
            "top_modules": [path for path, node in sorted(
                ((path, node) for path, node in tree.items() if node.self_values["ops"]),
                key=lambda item: (-(item[1].self_values["time_ns"] or 0), -(item[1].self_values["flops"] or 0),
                                  -(item[1].self_values["ops"] or 0)))[:5]],
        }

    def report(self, ctx: ToolContext) -> str:
        summary = ctx.state.get("summary")
        if not summary:
            return ""
        time_part = (f", {summary['attributed_time_pct']}% of {_duration_text(summary['event_time_ns'])} measured "
                     f"(union of leaf spans: {summary['measured_covers']}; split by {summary['time_model']})"
                     if summary["attributed_time_pct"] is not None else ", no measured time")
        phases = ", ".join(f"{phase} {count}" for phase, count in summary["operators_by_phase"].items())
        modules = (f"{summary['modules']} modules (top: {', '.join(p or '(root)' for p in summary['top_modules'][:3])})"
                   if summary["modules"] else "no module paths")
        return (f"{summary['attributed_operators']}/{summary['operators']} ops attributed "
                f"({summary['attributed_operators_pct']}%){time_part}; top sites: "
                f"{', '.join(summary['top_sites'][:3]) or 'none'}\n"
                f"{modules}; ops by phase: {phases}\nanalysis took {ctx.state['busy_s'] * 1e3:.1f} ms")


def _executed(book: ledger.Ledger, figures: Any) -> dict[str, Any]:
    """The :data:`EXECUTED_COLUMNS` and :data:`BASIS_COLUMN` of a row from the ledger's
    figures (``None``: unknown)."""
    return {**{key: figures[key] for key in ledger.EXECUTED_FIGURES},
            "executed_flops_per_invocation": book.per_invocation_of(figures), BASIS_COLUMN: book.executed_basis}


def _figures(book: ledger.Ledger, figures: Any) -> dict[str, Any]:
    """A site's or phase's columns from its :meth:`~ledger.Ledger.rollup_ops` row (none:
    its ops have no entry)."""
    figures = figures or book.empty_figures
    return {"flops": figures["flops"], "transcendentals": figures["transcendentals"], "bytes": figures["bytes"],
            "time_ns": figures["time_ns"], **_executed(book, figures)}


def _pct(part: int, whole: int) -> float | None:
    return round(100 * part / whole, 3) if whole else None


def _model_name(model: SemanticModel) -> str:
    from pathlib import Path

    path = model.manifest.get("input", {}).get("path")
    return Path(path).stem if path else model.source


def _duration_text(ns: float) -> str:
    return f"{ns / 1e9:.3f} s" if ns >= 1e9 else f"{ns / 1e6:.3f} ms" if ns >= 1e6 else f"{ns / 1e3:.1f} µs"


def _table(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> Any:
    """Rows as an Arrow table with fixed columns, so that an empty table keeps its header."""
    import pyarrow as pa

    return pa.table({column: [row.get(column) for row in rows] for column in columns})
