"""memory-proxy: peak resident activations from a liveness walk, weights apart, and a
verdict against the backend's on-chip memory.

The walk, per model of the bundle (a reconstruction may hold several; an operator's
model is its partition's ``model`` attribute, else the first component of its ID):

* **steps** are the operators that produce or consume a tensor of the manifest's tensor
  graph, in manifest order. Manifests list operators in program order (IREE: the order
  of the ops in the input function; TFLite: the interpreter's execution order), which
  is a topological order of the graph;
* a tensor is **live** from the step of its producer to the step of its last consumer;
  graph inputs (no producer among the steps) live from the start, and results that are
  never consumed (graph outputs), or consumed by an op outside the walk, to the end;
* **weights** (constant tensors, or results of ``*.constant`` ops) are counted apart,
  and results of ``*.empty`` ops (placeholders with undefined contents) not at all;
* the **peak** is the largest sum of live activation bytes over the steps.

The verdict adds the parameters (the compiler's on-chip + off-chip parameter figures,
``memory`` events ``on_chip_parameter_bytes`` / ``off_chip_parameter_bytes``, where it
reported them; else the manifest's weight bytes) to the peak and compares the sum with
the profile's on-chip memory (Edge TPU: 8 MiB). It is a proxy: compilers reuse buffers,
tile, and stream, so what the chip really holds can be less (or, with padding, more).
A bundle of several models (a co-compile) also gets a co-resident verdict: every model's
parameters, as one shared parameter cache holds them, plus the largest single peak.

Options: ``profile=PATH``, ``calibration=PATH`` (as for program-analyzer).
Outputs: ``liveness.csv`` (model, step, op, live bytes), ``memory.json``, ``report.txt``.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from dfit_mlir.analysis.model import SemanticModel
from dfit_mlir.analysis.profiles import load_profile
from dfit_mlir.analysis.tools.api import Tool, ToolContext

OPTIONS = ("profile", "calibration")
PARAMETER_EVENTS = ("on_chip_parameter_bytes", "off_chip_parameter_bytes")
MIB = 1 << 20


class MemoryProxy(Tool):
    name = "memory-proxy"
    description = "peak live activations (liveness walk), weights, and whether they fit the on-chip memory"
    needs = ("tensor_shapes", "memory")
    options = OPTIONS

    def on_init(self, ctx: ToolContext) -> None:
        ctx.state.update(compiler=defaultdict(dict), report=[])

    def on_event(self, ctx: ToolContext, batch: Any) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        # The few compiler-summary events found column-wise: a run's millions of events
        # are never made Python values.
        def decoded(name: str) -> Any:
            column = batch.column(name)
            return column.dictionary_decode() if pa.types.is_dictionary(column.type) else column

        wanted = pc.and_(pc.and_(pc.fill_null(pc.equal(decoded("kind"), pa.scalar("memory")), False),
                                 pc.fill_null(pc.is_in(decoded("name"), pa.array(sorted(PARAMETER_EVENTS))), False)),
                         pc.is_valid(batch.column("bytes")))
        if not pc.any(wanted).as_py():
            return
        found = batch.filter(wanted)
        columns = [found.column(name).to_pylist() for name in ("kind", "name", "bytes", "attributes")]
        for kind, name, size, attributes in zip(*columns, strict=True):
            if kind == "memory" and name in PARAMETER_EVENTS and size is not None:
                model = json.loads(attributes or "{}").get("model", "")
                ctx.state["compiler"][model][name] = size

    def on_shutdown(self, ctx: ToolContext) -> None:
        if ctx.model is None:
            ctx.note("no semantic model (nothing was compiled or analyzed): nothing to analyze")
            return
        profile = load_profile(ctx.backend, ctx.options.get("profile"), ctx.options.get("calibration"))
        budget = profile.on_chip_memory if profile is not None else None
        if budget is None:
            ctx.note(f"no on-chip memory figure for the {ctx.backend} backend (give profile=PATH): no verdict")
        walks = {name: walk for name, walk in liveness(ctx.model).items() if is_entry_point(ctx.model, name)}
        compiler = ctx.state["compiler"]
        limit = budget.value if budget is not None else None
        steps, models = [], []
        for model in sorted(set(walks) | set(compiler)):
            walk = walks.get(model, {"steps": [], "weights": None})
            steps += [{"model": model, "step": i, "op": op, "live_bytes": live, "live_tensors": count}
                      for i, (op, live, count) in enumerate(walk["steps"])]
            peak_op, peak, _ = max(walk["steps"], key=lambda step: step[1], default=(None, None, None))
            if model in compiler:
                parameters, source = sum(compiler[model].get(key, 0) for key in PARAMETER_EVENTS), "compiler summary"
            else:
                parameters, source = walk["weights"], "manifest weights"
            models.append({"model": model, "steps": len(walk["steps"]), "peak_activation_bytes": peak,
                           "peak_op": peak_op, "weight_bytes": walk["weights"],
                           "compiler_parameter_bytes": compiler.get(model),
                           **_verdict(parameters, source, peak, limit)})
        if not any(walk["steps"] for walk in walks.values()):
            ctx.note("no tensor sizes in the manifest: activations not recovered")
        combined = None
        if len(models) > 1:
            # One co-compiled parameter cache holds every model's parameters; one model runs at a time.
            combined = {"model": "all models co-resident", **_verdict(
                sum(m["parameters_bytes"] or 0 for m in models), "sum over the models",
                max((m["peak_activation_bytes"] for m in models if m["peak_activation_bytes"] is not None),
                    default=None), limit)}
        ctx.export_table("liveness", steps or _empty_liveness())
        document = {"backend": ctx.backend, "budget": None if budget is None else
                    {"bytes": budget.value, "source": budget.source, "profile": profile.name if profile else None},
                    "models": models, "combined": combined}
        ctx.write_text("memory.json", json.dumps(document, indent=1) + "\n")
        lines = [f"{m['model']}: {m['verdict']}" for m in [*models, *([combined] if combined else [])]]
        if budget is not None and profile is not None and lines:
            lines.insert(0, f"on-chip budget {_size(budget.value)} ({profile.name})")
        ctx.state["report"] = lines or ["no models with tensors or compiler memory figures"]
        ctx.write_text("report.txt", "\n".join(ctx.state["report"] + ctx.notes) + "\n")

    def report(self, ctx: ToolContext) -> str:
        return "\n".join(ctx.state.get("report", []))


def model_of_operators(model: SemanticModel) -> dict[str, str]:
    """operator ID → the model it belongs to."""
    by_partition = {p.id: p.attributes["model"] for p in model.partitions if p.attributes.get("model")}
    by_op = {op_id: by_partition[p.id] for p in model.partitions if p.id in by_partition for op_id in p.operator_ids}
    return {op.id: by_op.get(op.id) or by_partition.get(op.partition or "") or op.id.split("/", 1)[0]
            for op in model.operators.values()}


def is_entry_point(model: SemanticModel, name: str) -> bool:
    """Whether a walk's model is something a user runs: not a private function of a
    compiled module (JAX emits ``log_softmax``, ``_one_hot``, ``_where`` … as private
    helpers, dozens in a training step; IREE inlines them into their callers, so they
    are no program of their own). Which functions are public comes from the compiled
    host program (``partitions.host_functions``); without it, every model is kept."""
    host = (model.manifest.get("partitions") or {}).get("host_functions")
    if not host:
        return True
    functions = {op["id"] for op in model.manifest.get("operators", ())
                 if op.get("parent") is None and op.get("op") in ("func.func", "util.func")}
    if name not in functions and name not in host:
        return True  # not a function: a reconstructed model, a partition's own name
    return bool(host.get(name, {}).get("public"))


def liveness(model: SemanticModel) -> dict[str, dict[str, Any]]:
    """Per model: ``steps`` [(op, live activation bytes, live tensors)] and ``weights`` bytes."""
    owner = model_of_operators(model)
    kinds = {op.id: op.kind for op in model.operators.values()}
    activations: defaultdict[str, list[dict[str, Any]]] = defaultdict(list)
    weights: defaultdict[str, int] = defaultdict(int)
    touching = set()
    for tensor in model.tensors:
        producer = tensor.get("producer")
        producer_kind = kinds.get(producer) if producer is not None else None
        ends = [producer, *(tensor.get("consumers") or ())]
        known = [op for op in ends if op in owner]
        if not known or tensor.get("bytes") is None or producer_kind == "empty":
            continue
        touching.update(known)
        if tensor.get("constant") is True or producer_kind == "constant":
            weights[owner[known[0]]] += tensor["bytes"]
        else:
            activations[owner[known[0]]].append(tensor)
    walks = {}
    for name in sorted(set(activations) | set(weights)):
        order = [op for op in model.operators if op in touching and owner[op] == name]
        index = {op: i for i, op in enumerate(order)}
        delta_bytes, delta_count = [0] * (len(order) + 1), [0] * (len(order) + 1)
        for tensor in activations[name]:
            consumers = tensor.get("consumers") or []
            producer = tensor.get("producer")
            start = index.get(producer, 0) if producer is not None else 0
            inside = [index[c] for c in consumers if c in index]
            end = max(inside) if consumers and len(inside) == len(consumers) else len(order) - 1
            end = max(end, start)  # a consumer listed before its producer: the value lives at least one step
            delta_bytes[start] += tensor["bytes"]
            delta_bytes[end + 1] -= tensor["bytes"]
            delta_count[start] += 1
            delta_count[end + 1] -= 1
        steps, live, count = [], 0, 0
        for i, op in enumerate(order):
            live, count = live + delta_bytes[i], count + delta_count[i]
            steps.append((op, live, count))
        walks[name] = {"steps": steps, "weights": weights.get(name, 0)}
    return walks


def _verdict(parameters: int | None, source: str, peak: int | None, budget: float | None) -> dict[str, Any]:
    total = (parameters or 0) + (peak or 0)
    fits: bool | None = None
    margin: float | None = None
    verdict = "no verdict (no on-chip budget, or no sizes)"
    if budget is not None and (parameters is not None or peak is not None):
        fits, margin = total <= budget, budget - total
        what = "parameters + peak activations" if peak is not None else "parameters alone (activations unknown)"
        verdict = (f"{'fits' if fits else 'does not fit'}: {what} = {_size(total)} of {_size(budget)}, "
                   f"{_size(abs(margin))} {'spare' if fits else 'over'}")
    return {"parameters_bytes": parameters, "parameters_source": source if parameters is not None else None,
            "total_bytes": total, "budget_bytes": budget, "fits": fits,
            "margin_bytes": margin, "verdict": verdict}


def _size(count: float) -> str:
    return f"{count / MIB:.2f} MiB" if count < 1 << 30 else f"{count / (1 << 30):.2f} GiB"


def _empty_liveness() -> Any:
    import pyarrow as pa

    return pa.table({column: pa.array([], pa.null()) for column in ("model", "step", "op", "live_bytes",
                                                                    "live_tensors")})
