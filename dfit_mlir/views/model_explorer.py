"""Per-op metrics as Model Explorer node data, so the numbers show on the graph.

`Model Explorer <https://github.com/google-ai-edge/model-explorer>`_ (``pip install
ai-edge-model-explorer``, not a dependency of dfit) colours a graph's nodes from a
*node data* JSON file. This module writes the single-graph form of its
``node_data_builder.GraphNodeData``::

    {"name": "dfit macs",
     "results": {"<node key>": {"value": 194400}, ...},
     "gradient": [{"stop": 0, "bgColor": "#ffffff"}, {"stop": 1, "bgColor": "#e53935"}]}

The app applies a file whose top level has ``results`` to the graph on screen; a file
holds one metric, so several metrics give several files.

**Node keys.** Model Explorer matches a result key against the ``tensor_name`` of a node's
outputs, else against the node id. Its TFLite adapter gives every op node its output
tensor name, and node ids are flatbuffer op indices; its MLIR adapter numbers ops in
printing order and names them after their location (the printing order is not in a
dfit manifest). So the default key (``key="name"``) is the op's tensor name: a
reconstruction's op ``name`` (the TFLite output tensor), else the innermost location name
(``name_path[-1]``), which for an IREE compile of a TFLite model is again the TFLite
tensor name — IREE's numbers then land on the original ``.tflite`` graph. Ops that share
a key (IREE's several TOSA ops for one TFLite op) are one node: numbers are **summed**,
text values joined with ``; `` (never overwritten). An op without a name, or whose name
is no node name (a PyTorch export's names are nn.Module stacks shared by every op of a
module, :data:`NOT_NODE_NAMES`), is keyed by its dfit ID, so PyTorch ops stay one key each. ``key="id"`` keys every op by its dfit ID. Ops that stand in for a
partition (an Edge TPU custom op) are left out: their numbers are their members'.

**Metrics.** ``macs``, ``flops``, ``bytes`` (static, from the manifest; ``flops`` is
**per trip**: an op inside a loop once, as the program says), ``time`` (mean
attributed ns per invocation: each dispatch's time split over its ops by the ledger's
time model, :mod:`dfit_mlir.analysis.ledger`), ``executed_flops`` (the ledger's executed
FLOPs per invocation, the work that time did: per trip × every trip, counted by the run's
dispatch events, else from the manifest's static trip counts — the file's title names
which; no file values where neither knows them, a loop bound known only at run time),
``partition`` (the partition IDs an op
lands in, as text, one colour per partition), ``module`` (the op's module path from its
frontend, ``encoder.layer.0.attention.self.query``; ``(root)`` for the model's root)
and ``phase`` (forward, backward, optimizer, loss, initializer), as text, one colour
per value. Ops without a value are left out (no
MACs known, no time attributed).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dfit_mlir.analysis import ledger
from dfit_mlir.analysis.model import (
    Operator,
    SemanticModel,
    partitions_by_op,
    stands_for_partition,
    tensor_name,
)
from dfit_mlir.core import atomic
from dfit_mlir.core.errors import InvalidInputError

METRICS = ("macs", "flops", "bytes", "time", "executed_flops", "partition", "module", "phase")
#: Metrics whose values are text (coloured per value, not on a gradient).
TEXT_METRICS = frozenset({"partition", "module", "phase"})
KEYS = ("name", "id")
#: White (smallest) to red (largest): hot ops stand out.
GRADIENT = ({"stop": 0, "bgColor": "#ffffff"}, {"stop": 1, "bgColor": "#e53935"})
#: Light colours for text values (partitions), assigned in order of first appearance.
PALETTE = ("#bbdefb", "#c8e6c9", "#ffe0b2", "#e1bee7", "#b2ebf2", "#f8bbd0", "#dcedc8", "#d7ccc8")
TITLES = {"macs": "dfit macs", "flops": "dfit flops (per trip)", "bytes": "dfit bytes",
          "time": "dfit time (ns per invocation)", "executed_flops": "dfit executed flops (per invocation)",
          "partition": "dfit partition", "module": "dfit module path", "phase": "dfit phase"}


@dataclass(frozen=True)
class Exported:
    metric: str
    path: Path
    #: Node keys with a value (0: the bundle has no value of this metric).
    nodes: int


#: Location names that are no node or tensor name: the PyTorch frontend's nn.Module
#: stack (``nn.Module::BertModel;embeddings:BertEmbeddings``), shared by every op of a
#: module. Keyed by such a name, a BERT's 287 ops would fold into ~30 module totals that
#: match no node of the graph.
NOT_NODE_NAMES = ("nn.Module:",)


def node_key(op: Operator, key: str = "name") -> str:
    """The key Model Explorer matches ``op`` by (see the module docstring)."""
    if key == "id":
        return op.id
    name = tensor_name(op)
    return op.id if name is None or name.startswith(NOT_NODE_NAMES) else name


def parse_metrics(text: str | Iterable[str]) -> tuple[str, ...]:
    """``"macs,time"`` (or a list) → validated metric names, in order, without repeats."""
    names = [n.strip() for n in (text.split(",") if isinstance(text, str) else text) if n.strip()]
    unknown = [n for n in names if n not in METRICS]
    if unknown or not names:
        raise InvalidInputError(f"unknown metric {', '.join(unknown) or '(none given)'}; "
                                f"choose from {', '.join(METRICS)}")
    return tuple(dict.fromkeys(names))


def node_data(model: SemanticModel, metric: str, key: str = "name") -> dict[str, Any]:
    """One metric of ``model`` as a Model Explorer ``GraphNodeData`` document."""
    parse_metrics([metric])
    if key not in KEYS:
        raise InvalidInputError(f"unknown node key {key!r}; choose from {', '.join(KEYS)}")
    value_of = _value_getter(model, metric)
    grouped: defaultdict[str, list[Any]] = defaultdict(list)
    for op in model.operators.values():
        if stands_for_partition(model, op):
            continue
        value = value_of(op)
        if value is not None and value != ():
            grouped[node_key(op, key)].append(value)
    document: dict[str, Any] = {"name": title(model, metric)}
    if metric in TEXT_METRICS:
        labels = {k: "; ".join(dict.fromkeys(p for parts in values for p in parts)) for k, values in grouped.items()}
        colours = {label: PALETTE[i % len(PALETTE)] for i, label in enumerate(dict.fromkeys(labels.values()))}
        document["results"] = {k: {"value": label, "bgColor": colours[label]} for k, label in labels.items()}
    else:
        # A non-finite total (a NaN or inf that slipped into a metric) is no node value:
        # Model Explorer's JSON has no NaN, and a colour scale over inf shows nothing.
        totals = {k: sum(values) for k, values in grouped.items()}
        document["results"] = {k: {"value": _number(total)} for k, total in totals.items()
                               if not isinstance(total, float) or math.isfinite(total)}
        document["gradient"] = [dict(item) for item in GRADIENT]
    return document


def title(model: SemanticModel, metric: str) -> str:
    """A node data file's name: :data:`TITLES`, executed FLOPs with where they come from
    (``dfit executed flops (per invocation, from manifest trips)``)."""
    basis = ledger.of(model).executed_basis if metric == "executed_flops" else None
    return TITLES[metric] if basis is None else TITLES[metric].removesuffix(")") + f", from {basis})"


def export(bundle_or_model: str | Path | SemanticModel, out_path: str | Path,
           metrics: str | Iterable[str] = ("macs",), key: str = "name") -> list[Exported]:
    """Write one node data file per metric: ``out_path`` itself for one metric, else
    ``<stem>.<metric><suffix>`` beside it (atomic writes)."""
    model = bundle_or_model if isinstance(bundle_or_model, SemanticModel) else SemanticModel.open(bundle_or_model)
    written = []
    for metric, path in output_paths(out_path, metrics).items():
        document = node_data(model, metric, key)
        atomic.write_text(path, json.dumps(document, indent=1, allow_nan=False) + "\n", kind=OUTPUT_KIND)
        written.append(Exported(metric, path, len(document["results"])))
    return written


#: The output kind of a node data file (see dfit_mlir.core.outputs).
OUTPUT_KIND = "node-data"


def output_paths(out_path: str | Path, metrics: str | Iterable[str]) -> dict[str, Path]:
    """metric → the file it is written to: ``out_path`` itself for one metric, else
    ``<stem>.<metric><suffix>`` beside it."""
    names = parse_metrics(metrics)
    out_path = Path(out_path)
    return {metric: out_path if len(names) == 1 else out_path.with_name(f"{out_path.stem}.{metric}{out_path.suffix}")
            for metric in names}


def _value_getter(model: SemanticModel, metric: str) -> Callable[[Operator], Any]:
    if metric in ("macs", "flops", "bytes"):
        # The ledger's: placed once where IREE split an op; bytes cross the dispatch boundary.
        # An op doing none of that work has no value (a node without a colour), not 0.
        figures = ledger.of(model).op_figures()
        return lambda op: figures[op.id][metric] or None if op.id in figures else None
    if metric == "executed_flops":
        # The ledger's executed FLOPs per invocation (per trip × trips), beside time per
        # invocation; None on every op where no run or manifest knows the trips.
        figures = ledger.of(model).op_figures()
        return lambda op: figures[op.id][ledger.PER_INVOCATION] or None if op.id in figures else None
    if metric == "time":
        book = ledger.of(model)
        runs = book.instances or 1
        times = {op_id: ns / runs for op_id, ns in book.op_time().items()}
        return lambda op: times.get(op.id)  # ops outside every timed partition: no value
    if metric == "module":
        return lambda op: () if (path := model.module_path(op.id)) is None else (path or "(root)",)
    if metric == "phase":
        return lambda op: (op.phase,) if op.phase else ()
    partitions = partitions_by_op(model)
    return lambda op: tuple(p.id for p in partitions.get(op.id, ()))


def _number(value: float | int) -> float | int:
    return round(value, 1) if isinstance(value, float) else value
