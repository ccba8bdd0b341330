"""ONNX (imported with IREE's ONNX importer, node names kept as locations).

Every op carries its ONNX node name, ``loc("/model.22/cv3.0/cv3.0.0/conv/Conv")``; models
exported from PyTorch name nodes after the module path, with the op type last. So the
module path is the name's ``/``-prefix (``/model.22/cv3.0/cv3.0.0/conv``); a name
without ``/`` (``conv1``, ``n58``) is a layer of its own; a top-level ``/Concat`` sits in
the root (``""``). The source op is the importer's ``onnx.<OpType>``. An ONNX graph is an
inference graph: every node is ``forward``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dfit_mlir.frontends import SourceModel

#: The importer names the graph's function ``graph:<name>``; it is no node.
GRAPH_NAME_PREFIX = "graph:"
#: Names the importer gives ops that stand for no node.
IMPORTER_NAMES = ("onnx_importer.",)


def module_of(node_name: str) -> str:
    """The module path an ONNX node name says: its ``/``-prefix, or the name itself."""
    head, sep, _ = node_name.rpartition("/")
    return head if sep else node_name


def node_name(op: dict[str, Any]) -> str | None:
    names = [n for n in op.get("name_path") or () if not n.startswith(IMPORTER_NAMES)]
    return names[-1] if names else None


class OnnxFrontend:
    name = "onnx"

    def recognizes(self, operators: Sequence[dict[str, Any]]) -> bool:
        return any(op["op"].startswith("onnx.") for op in operators)

    def source_model(self, op: dict[str, Any]) -> SourceModel:
        name = node_name(op)
        source_op = op["op"] if op["op"].startswith("onnx.") else None
        if name is None:
            return SourceModel(source_op=source_op)
        if name.startswith(GRAPH_NAME_PREFIX):
            return SourceModel(module_path="", module_class=name[len(GRAPH_NAME_PREFIX):], source_op=source_op)
        return SourceModel(module_path=module_of(name), source_op=source_op, phase="forward")

    def finish(self, operators: Sequence[dict[str, Any]]) -> None:
        pass

    def module_classes(self, op: dict[str, Any]) -> dict[str, str]:
        return {}


FRONTEND = OnnxFrontend()
