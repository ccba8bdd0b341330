"""dfit's semantic model on Google's Model Explorer graph, as an adapter extension.

``model-explorer BUNDLE/manifest.json --extensions=dfit_mlir.views.explorer_adapter``
(or ``dfit view --model-explorer BUNDLE``, which calls :func:`serve`) draws a compile
manifest, an IREE run bundle or a reconstructed bundle (Edge TPU, Cerebras, SambaNova):

* **nodes** are the manifest's source ops (:func:`shown_ops`: the top-level ops of the
  model's functions; region bodies are part of their op, functions are the graph, and an
  op that only stands in for a backend partition — an Edge TPU custom op — is its
  members), node id = the op's dfit ID;
* **namespaces** are module paths (:meth:`SemanticModel.module_path`, one group per
  component: ``encoder.layer.0`` → ``encoder/layer/0``; the root: no namespace);
* **edges** are the manifest's tensors: one per (producer, consumer) pair of shown ops;
  each output carries its tensor name, so ``dfit export-explorer`` node data keyed by
  name lands on this graph too;
* **node attributes** are the ledger's figures per op (:mod:`dfit_mlir.analysis.ledger`, the
  spec; nothing is re-derived here): ``time_ns`` (measured, summed over the run's
  dispatches, present when the bundle measured time), ``macs``, ``flops`` (**per trip**:
  an op inside a loop once, as the program says), ``executed_flops`` (the work the
  whole run did, every trip: beside ``time_ns``, which counts every trip too) and
  ``executed_flops_per_invocation`` (the same per invocation; from the manifest's static
  trip counts where no run counted them, so a manifest alone has it), each present where
  the ledger knows it, ``bytes_read``, ``bytes_written``, ``bytes`` (their sum),
  ``dispatch`` (the partitions the op runs in), ``role`` (root/fused), ``phase``, plus
  the op's ``source``.

:func:`serve` also hands Model Explorer one node data overlay per figure
(:data:`OVERLAYS`), keyed by node id, so the graph can be coloured by time or FLOPs; the
executed ones' titles say where the figure comes from (``run events`` or ``manifest
trips``, the ledger's ``executed_basis``).
Model Explorer loads ``<extension>.main`` (:mod:`.main` holds the adapter class); this
module imports ``model_explorer`` only when a graph is built or served.
"""

from __future__ import annotations

import json
import socket
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dfit_mlir.analysis import ledger
from dfit_mlir.analysis.model import Operator, SemanticModel, stands_for_partition
from dfit_mlir.core.errors import InvalidInputError, ToolchainError
from dfit_mlir.views.model_explorer import GRADIENT, PALETTE

ADAPTER_ID = "dfit_semantic_model"
#: What ``--extensions=`` names (Model Explorer imports its ``.main``).
EXTENSION = __name__
PIN = "ai-edge-model-explorer==0.1.34"
#: Ops that are a function (the graph itself), not a node of it.
FUNCTION_OPS = frozenset({"func.func", "util.func", "builtin.module"})
#: Host names :func:`serve` binds to: the adapter reads any path a request names, so the
#: server must not be reachable from another machine.
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
#: Node data overlays :func:`serve` adds: figure → title. Text figures get one colour per
#: value. Model Explorer colours the graph by the last one: time, whole run, with the
#: executed FLOPs of that same whole run beside it (static ``flops`` are per trip).
OVERLAYS = {"dispatch": "dfit dispatch", "phase": "dfit phase", "bytes": "dfit bytes (read + written)",
            "macs": "dfit macs", "flops": "dfit flops (per trip)",
            "executed_flops_per_invocation": "dfit executed flops (per invocation)",
            "executed_flops": "dfit executed flops (whole run)", "time_ns": "dfit time (ns, whole run)"}
#: Overlays whose title names the ledger's ``executed_basis``.
EXECUTED_OVERLAYS = frozenset({"executed_flops", "executed_flops_per_invocation"})
TEXT_FIGURES = frozenset({"phase", "dispatch", "role"})


@dataclass(frozen=True)
class OpFigures:
    """One op's ledger figures, summed over the partitions it runs in (``None``: unknown)."""

    time_ns: float | None
    macs: int | None
    flops: int | None
    bytes_read: int | None
    bytes_written: int | None
    partitions: tuple[str, ...]
    roles: tuple[str, ...]
    #: Executed FLOPs over the whole run and per invocation (the ledger's ``op_figures``).
    executed_flops: int | None = None
    executed_flops_per_invocation: float | None = None

    @property
    def bytes(self) -> int | None:
        known = [b for b in (self.bytes_read, self.bytes_written) if b is not None]
        return sum(known) if known else None


def model_file(path: str | Path) -> Path:
    """The file Model Explorer is given: a bundle's ``manifest.json``, or the manifest itself
    (its ``.json`` extension picks the adapter)."""
    path = Path(path)
    return path / "manifest.json" if path.is_dir() else path


def open_model(path: str | Path) -> SemanticModel:
    """A bundle (its directory or its ``manifest.json``) or a compile manifest. A bundle's
    ``manifest.json`` opens the bundle, so its measured time comes along."""
    path = Path(path)
    if path.name == "manifest.json" and (path.parent / "summary.json").is_file():
        return SemanticModel.open(path.parent)
    return SemanticModel.open(path)


def shown_ops(model: SemanticModel) -> list[Operator]:
    """The ops drawn as nodes, in manifest order (see the module doc)."""
    operators = model.operators
    shown = []
    for op in operators.values():
        parent = operators.get(op.raw.get("parent") or "")
        top_level = parent is None or parent.op in FUNCTION_OPS
        if top_level and op.op not in FUNCTION_OPS and not stands_for_partition(model, op):
            shown.append(op)
    return shown


def op_figures(model: SemanticModel) -> dict[str, OpFigures]:
    """Op ID → its ledger figures, from the ledger's entry rows (an op in several
    partitions sums them, as :meth:`Ledger.rollup` does)."""
    book = ledger.of(model)
    timed = book.totals.measured_ns > 0
    rows: defaultdict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in book.entries.to_pylist():
        rows[row["op_id"]].append(row)
    executed = book.op_figures()
    return {op_id: OpFigures(
        time_ns=sum(r["time_ns"] or 0 for r in found) if timed else None,
        macs=_sum(r["macs"] for r in found), flops=_sum(r["flops"] for r in found),
        bytes_read=_sum(r["bytes_read"] for r in found), bytes_written=_sum(r["bytes_written"] for r in found),
        partitions=tuple(dict.fromkeys(r["partition"] for r in found if r["partition"])),
        roles=tuple(dict.fromkeys(r["role"] for r in found)),
        executed_flops=executed[op_id]["executed_flops"],
        executed_flops_per_invocation=book.per_invocation_of(executed[op_id]),
    ) for op_id, found in rows.items()}


def _sum(values: Iterable[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def namespace(op: Operator) -> str:
    """The op's module path as Model Explorer's ``/``-separated namespace."""
    if op.module_path is not None:
        return op.module_path.replace(".", "/")
    return "/".join(op.name_path)


def figure_values(figures: OpFigures | None, op: Operator) -> dict[str, str]:
    """The node attributes of one op's figures (unknown figures left out)."""
    values: dict[str, str] = {}
    if figures is not None:
        if figures.time_ns is not None:
            values["time_ns"] = f"{figures.time_ns:.1f}"
        for name in ("macs", "flops", "executed_flops", "executed_flops_per_invocation", "bytes_read",
                     "bytes_written", "bytes"):
            if (value := getattr(figures, name)) is not None:
                values[name] = str(value)
        if figures.partitions:
            values["dispatch"] = "; ".join(figures.partitions)
        values["role"] = "; ".join(figures.roles)
    if op.phase:
        values["phase"] = op.phase
    return values


def build_graph(model: SemanticModel) -> Any:
    """The model as one Model Explorer ``graph_builder.Graph``."""
    gb = _graph_builder()
    ops = shown_ops(model)
    ids = {op.id for op in ops}
    figures = op_figures(model)
    outputs: defaultdict[str, list[dict[str, Any]]] = defaultdict(list)
    incoming: defaultdict[str, list[Any]] = defaultdict(list)
    inputs_seen: defaultdict[str, int] = defaultdict(int)
    for tensor in model.tensors:
        producer = tensor.get("producer")
        if producer not in ids:
            continue
        output_id = str(len(outputs[producer]))
        outputs[producer].append(tensor)
        for consumer in dict.fromkeys(tensor.get("consumers") or ()):
            if consumer in ids:
                incoming[consumer].append(gb.IncomingEdge(sourceNodeId=producer, sourceNodeOutputId=output_id,
                                                          targetNodeInputId=str(inputs_seen[consumer])))
                inputs_seen[consumer] += 1
    nodes = []
    for op in ops:
        attrs = {"dfit_id": op.id, "op": op.op, **figure_values(figures.get(op.id), op)}
        if (source := model.source_of(op.id)) is not None:
            attrs["source"] = source
        nodes.append(gb.GraphNode(
            id=op.id, label=op.source_op or op.op, namespace=namespace(op),
            attrs=[gb.KeyValue(key=k, value=v) for k, v in attrs.items()], incomingEdges=incoming[op.id],
            outputsMetadata=[gb.MetadataItem(id=str(i), attrs=_tensor_attrs(gb, t))
                             for i, t in enumerate(outputs[op.id])]))
    return gb.Graph(id=graph_name(model), nodes=nodes)


def _tensor_attrs(gb: Any, tensor: dict[str, Any]) -> list[Any]:
    attrs = {"tensor_name": tensor.get("name") or tensor["id"], "shape": str(tensor.get("shape")),
             "dtype": str(tensor.get("dtype")), "bytes": str(tensor.get("bytes"))}
    return [gb.KeyValue(key=k, value=v) for k, v in attrs.items()]


def graph_name(model: SemanticModel) -> str:
    if model.bundle is not None:
        return model.bundle.name
    return Path(model.source).name.removesuffix(".json").removesuffix(".manifest")


def node_data(model: SemanticModel) -> dict[str, dict[str, Any]]:
    """Figure → a Model Explorer ``GraphNodeData`` document keyed by node id (figures no
    op has are left out)."""
    figures = op_figures(model)
    values = {op.id: figure_values(figures.get(op.id), op) for op in shown_ops(model)}
    basis = ledger.of(model).executed_basis
    documents = {}
    for figure, title in OVERLAYS.items():
        if figure in EXECUTED_OVERLAYS and basis is not None:
            title = title.removesuffix(")") + f", from {basis})"
        found = {op_id: v[figure] for op_id, v in values.items() if figure in v}
        if not found:
            continue
        if figure in TEXT_FIGURES:
            colours = {label: PALETTE[i % len(PALETTE)] for i, label in enumerate(dict.fromkeys(found.values()))}
            results = {k: {"value": label, "bgColor": colours[label]} for k, label in found.items()}
            documents[figure] = {"name": title, "results": results}
        else:
            results = {k: {"value": float(v) if "." in v else int(v)} for k, v in found.items()}
            documents[figure] = {"name": title, "results": results, "gradient": [dict(g) for g in GRADIENT]}
    return documents


def _graph_builder() -> Any:
    try:
        from model_explorer import graph_builder
    except ImportError:
        raise ToolchainError(f"Model Explorer is not installed (pip install {PIN})") from None
    return graph_builder


def free_port(host: str, port: int = 0) -> int:
    """``port`` if it is free on ``host`` (any free port for 0); an input error if taken."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError as error:
            raise InvalidInputError(f"--port {port}: cannot serve on {host} ({error.strerror})") from None
        return probe.getsockname()[1]


def serve(path: str | Path, port: int | None = None, host: str = "127.0.0.1", open_browser: bool = True) -> None:
    """Start Model Explorer's server on ``host:port`` (a free port when ``None``) with this
    extension, the model at ``path`` and its node data overlays; returns on Ctrl+C."""
    if host not in LOOPBACK:
        raise InvalidInputError(f"--host {host}: Model Explorer serves only on this machine (127.0.0.1): "
                                "its adapters read any file a request names")
    model = open_model(path)
    _graph_builder()  # says how to install Model Explorer when it is absent
    from model_explorer import server
    from model_explorer.config import ModelExplorerConfig

    chosen = free_port(host, port or 0)
    config = ModelExplorerConfig()
    config.add_model_from_path(str(model_file(path).resolve()), adapterId=ADAPTER_ID)
    for document in node_data(model).values():
        config.add_node_data(name=document["name"], node_data=json.dumps(document, allow_nan=False))
    # Model Explorer asks PyPI and GitHub for a newer release; dfit reaches no network.
    server._check_new_version = lambda print_msg=True: {"version": "", "runningVersion": "", "releaseUrl": "",
                                                         "desktopAppUrl": ""}
    server.start(host=host, port=chosen, config=config, extensions=[EXTENSION], no_open_in_browser=not open_browser)
