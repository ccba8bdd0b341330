"""ONNX (imported with IREE's ONNX importer, node names kept as locations).

Every op carries its ONNX node name, ``loc("/model.22/cv3.0/cv3.0.0/conv/Conv")``; models
exported from PyTorch name nodes after the module path, with the op type last. So the
module path is the name's ``/``-prefix (``/model.22/cv3.0/cv3.0.0/conv``); a name
without ``/`` (``conv1``, ``n58``) is a layer of its own; a top-level ``/Concat`` sits in
the root (``""``). The source op is the importer's ``onnx.<OpType>``. An ONNX graph is an
inference graph: every node is ``forward``.

:func:`import_model` is the import that keeps those names (``dfit compile model.onnx``
uses it): IREE's ONNX importer *Python API* printed with debug info. The
``iree-import-onnx`` CLI prints without debug info, so its output has no node names.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dfit_mlir.core.errors import EXIT_TOOLCHAIN_FAILED, DfitError, InvalidInputError
from dfit_mlir.frontends import SourceModel

#: Models below this opset are upgraded to it before import: IREE does not legalize
#: the opset-9 BatchNormalization the onnx wheel's models use (``MODELS.md``).
IMPORT_OPSET = 17

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


class OnnxImportError(DfitError):
    """IREE's ONNX importer (or the opset upgrade before it) rejected a valid ONNX file:
    the toolchain failed on the model (exit 3)."""

    exit_code = EXIT_TOOLCHAIN_FAILED


def prepare(path: str | Path, opset: int = IMPORT_OPSET) -> Any:
    """The ``onnx.ModelProto`` as it is imported: opset upgraded to ``opset`` (when
    lower), every graph-input dim that is symbolic or unknown pinned to 1 (IREE fails
    later on dynamic dims), every unnamed node named after its first output (so that
    every op of the import names the ONNX value it stands for), shapes inferred."""
    try:
        import onnx
    except ImportError as error:
        raise OnnxImportError(f"importing {path} needs the onnx package ({error}); pip install onnx") from None
    path = Path(path)
    try:
        model = onnx.load(str(path))
    except FileNotFoundError:
        raise InvalidInputError(f"{path}: no such file") from None
    except Exception as error:  # protobuf's DecodeError and friends: not an ONNX model
        raise InvalidInputError(f"{path}: not an ONNX model ({type(error).__name__}: {_first_line(error)})") from None
    try:
        onnx.checker.check_model(model)
    except Exception as error:  # onnx.checker.ValidationError: the file is at fault
        raise InvalidInputError(f"{path}: not a valid ONNX model ({type(error).__name__}: "
                                f"{_first_line(error)})") from None
    try:
        if model.opset_import and model.opset_import[0].version < opset:
            model = onnx.version_converter.convert_version(model, opset)
        _static_inputs(model)
        for node in model.graph.node:
            if not node.name and node.output:
                node.name = node.output[0]
        onnx.checker.check_model(model)
        return onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception as error:  # onnx raises its own checker / converter errors
        raise OnnxImportError(f"{path}: preparing the model for import failed: {type(error).__name__}: "
                              f"{_first_line(error)}") from None


def import_model(path: str | Path, opset: int = IMPORT_OPSET) -> str:
    """``path`` (an .onnx file) as torch-dialect MLIR text for IREE, each op located at
    its ONNX node name (``loc("/model.22/cv3.0/cv3.0.0/conv/Conv")``); see :func:`prepare`."""
    from iree.compiler import ir
    from iree.compiler.extras import onnx_importer

    model = prepare(path, opset)
    try:
        context = ir.Context()
        info = onnx_importer.ModelInfo(model)
        module = info.create_module(context=context).operation
        onnx_importer.NodeImporter.define_function(info.main_graph, module).import_all()
        module.verify()
    except Exception as error:  # the importer names the node or type it rejects
        raise OnnxImportError(f"{path}: IREE's ONNX importer failed: {type(error).__name__}: "
                              f"{_first_line(error)}") from None
    return module.get_asm(enable_debug_info=True, assume_verified=True)


def _static_inputs(model: Any) -> None:
    initializers = {init.name for init in model.graph.initializer}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        for dim in value.type.tensor_type.shape.dim:
            if not dim.HasField("dim_value") or dim.dim_value <= 0:
                dim.Clear()
                dim.dim_value = 1


def _first_line(error: BaseException) -> str:
    return str(error).splitlines()[0] if str(error) else ""
