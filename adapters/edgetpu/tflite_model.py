"""Reader for TFLite flatbuffers: an original (converter-output) model or one compiled by
``edgetpu_compiler`` (``*_edgetpu.tflite``).

The file is read with the pinned ``tflite`` package (flatbuffers-generated accessors of
the TFLite schema); no byte of the format is decoded by hand. Parsing happens in two
steps so the cross-file matching in :mod:`.matching` can walk the graph by tensor index:

* :meth:`TFLiteModelReader.model` returns a :class:`TFLiteModel` (subgraphs, operators
  with tensor indices, tensors with their constant-buffer sizes);
* :meth:`TFLiteModelReader.read` turns that into a :class:`Recovery`.

IDs: operators are ``subgraph<N>/<op type>#<k>`` where the op type is the
``BuiltinOperator`` name (``CONV_2D``) or, for a custom op, its custom code
(``edgetpu-custom-op``, ``TFLite_Detection_PostProcess``); tensors are
``subgraph<N>/tensor#<index>``. :func:`to_recovery` can put a scope in front
(``yolov8n_full_integer_quant/subgraph0/CONV_2D#3``) when several models share one
reconstruction.

Dtypes are spelled as MLIR spells them (``i8``, ``ui8``, ``f32``) so that the static-cost
helpers shared with the IREE path understand them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from dfit_mlir.adapters.recovery import (
    ArtifactError,
    Coverage,
    CoverageNote,
    RecoveredOperator,
    RecoveredPartition,
    RecoveredTensor,
    Recovery,
    ValueInfo,
    source_artifact,
)

BACKEND = "edgetpu"
#: Custom code of the op that holds everything the Edge TPU compiler mapped.
EDGETPU_CUSTOM_OP = "edgetpu-custom-op"
#: The TFLite file identifier, at bytes 4..8 of every model.
TFLITE_IDENTIFIER = b"TFL3"

#: TFLite ``TensorType`` name -> (MLIR element type, bytes per element or None).
_DTYPES: Mapping[str, tuple[str, int | None]] = {
    "FLOAT32": ("f32", 4),
    "FLOAT16": ("f16", 2),
    "FLOAT64": ("f64", 8),
    "BFLOAT16": ("bf16", 2),
    "INT4": ("i4", None),  # packed two to a byte
    "INT8": ("i8", 1),
    "INT16": ("i16", 2),
    "INT32": ("i32", 4),
    "INT64": ("i64", 8),
    "UINT8": ("ui8", 1),
    "UINT16": ("ui16", 2),
    "UINT32": ("ui32", 4),
    "UINT64": ("ui64", 8),
    "BOOL": ("i1", 1),
    "COMPLEX64": ("complex<f32>", 8),
    "COMPLEX128": ("complex<f64>", 16),
    "STRING": ("!tflite.string", None),
    "RESOURCE": ("!tflite.resource", None),
    "VARIANT": ("!tflite.variant", None),
}


def _enum_names(enum_class: type) -> dict[int, str]:
    """Value -> name of a flatbuffers-generated enum class (``BuiltinOperator``)."""
    return {
        value: name
        for name, value in vars(enum_class).items()
        if not name.startswith("_") and isinstance(value, int)
    }


@dataclass(frozen=True)
class TFLiteTensor:
    index: int
    name: str | None
    shape: tuple[int | None, ...] | None
    dtype: str | None
    #: Static size of the tensor's data (shape x element size); None when dynamic.
    nbytes: int | None
    #: Size of the constant data stored in the model for this tensor (0: activation).
    buffer_bytes: int
    is_variable: bool = False
    #: The shape signature has a dynamic (-1) dimension; ``shape`` holds its concrete size.
    dynamic: bool = False

    @property
    def constant(self) -> bool:
        return self.buffer_bytes > 0

    def value_info(self) -> ValueInfo:
        return ValueInfo(name=self.name, shape=self.shape, dtype=self.dtype, bytes=self.nbytes)


@dataclass(frozen=True)
class TFLiteOperator:
    id: str
    subgraph: int
    index: int
    #: ``BuiltinOperator`` name, or the custom code of a custom op.
    op_type: str
    #: ``BuiltinOperator`` name (``CUSTOM`` for custom ops).
    builtin: str
    #: Tensor indices; -1 marks an omitted optional input.
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    opcode_version: int
    custom_options_bytes: int = 0
    options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def is_edgetpu(self) -> bool:
        return self.op_type == EDGETPU_CUSTOM_OP


@dataclass(frozen=True)
class TFLiteSubgraph:
    index: int
    name: str | None
    tensors: tuple[TFLiteTensor, ...]
    operators: tuple[TFLiteOperator, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]

    def tensor_id(self, tensor_index: int) -> str:
        return f"subgraph{self.index}/tensor#{tensor_index}"


@dataclass(frozen=True)
class TFLiteModel:
    path: Path
    schema_version: int
    description: str | None
    subgraphs: tuple[TFLiteSubgraph, ...]
    buffer_count: int
    #: Bytes of constant data (weights, biases, metadata) held in the model's buffers.
    buffer_bytes: int
    metadata_names: tuple[str, ...]

    @property
    def operators(self) -> tuple[TFLiteOperator, ...]:
        return tuple(op for subgraph in self.subgraphs for op in subgraph.operators)

    @property
    def is_compiled(self) -> bool:
        """Whether ``edgetpu_compiler`` wrote it (it holds an ``edgetpu-custom-op``)."""
        return any(op.is_edgetpu for op in self.operators)


def operator_macs(op: TFLiteOperator, subgraph: TFLiteSubgraph) -> int | None:
    """Multiply-accumulates of one op, from its tensor shapes (None where not derivable).

    * ``CONV_2D``: filter ``[Cout, kh, kw, Cin]``, output ``[N, H, W, Cout]``:
      ``N*H*W*Cout * kh*kw*Cin`` (one MAC per filter tap per output element).
    * ``DEPTHWISE_CONV_2D``: filter ``[1, kh, kw, Cout]``: ``N*H*W*Cout * kh*kw``.
    * ``FULLY_CONNECTED``: weights ``[units, in]``, output ``[..., units]``:
      ``elements(output) * in``.

    Any other op type, or a dynamic dimension, gives None.
    """
    if op.builtin not in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED"):
        return None
    if len(op.inputs) < 2 or not op.outputs or op.inputs[1] < 0:
        return None
    weights = subgraph.tensors[op.inputs[1]].shape
    output = subgraph.tensors[op.outputs[0]].shape
    if not weights or not output or None in weights or None in output:
        return None
    output_elements = math.prod(output)  # type: ignore[arg-type]
    if op.builtin == "CONV_2D" and len(weights) == 4:
        return output_elements * weights[1] * weights[2] * weights[3]  # type: ignore[operator]
    if op.builtin == "DEPTHWISE_CONV_2D" and len(weights) == 4:
        return output_elements * weights[1] * weights[2]  # type: ignore[operator]
    if op.builtin == "FULLY_CONNECTED" and len(weights) == 2:
        return output_elements * weights[1]  # type: ignore[operator]
    return None


def operator_bytes(op: TFLiteOperator, subgraph: TFLiteSubgraph) -> int | None:
    """Static sizes of every operand and result (the convention of ``dfit_mlir.core.costs``)."""
    sizes = [subgraph.tensors[i].nbytes for i in (*op.inputs, *op.outputs) if i >= 0]
    return None if not sizes or None in sizes else sum(sizes)  # type: ignore[arg-type]


def module_path_of(name: str | None) -> tuple[str, ...]:
    """``model/tf.reshape_2/Reshape`` -> ``("model", "tf.reshape_2", "Reshape")``; a
    converter-fused name (``a/Relu6;a/add_fold;...``) is read from its first part."""
    if not name:
        return ()
    return tuple(part for part in name.split(";", 1)[0].split("/") if part)


class TFLiteModelReader:
    """``.tflite`` (original or Edge TPU compiled) -> operators, tensors, partitions."""

    format: ClassVar[str] = "tflite"
    parser: ClassVar[str] = "tflite-flatbuffers"

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    #: A flatbuffer: recognised on its raw bytes (NUL bytes are part of the format).
    binary: ClassVar[bool] = True

    @classmethod
    def recognises(cls, path: Path, head: bytes) -> bool:
        return head[4:8] == TFLITE_IDENTIFIER

    @classmethod
    def refuses(cls, path: Path, head: bytes) -> str | None:
        """Why a path named like a TFLite model (``*.tflite``) is not one, or None. Such
        a file is the user's model: one that is empty, a folder or another format is an
        error, never a file to pass over (the rest of the dump would give a smaller
        model and no word said)."""
        if path.suffix.lower() != ".tflite":
            return None
        if path.is_dir():
            return "is a directory; a .tflite model is one flatbuffer file"
        if head[4:8] == TFLITE_IDENTIFIER:
            return None
        return f"not a TFLite model: {_what_it_is(path, head)}"

    def model(self) -> TFLiteModel:
        try:
            data = self.path.read_bytes()
        except OSError as error:
            raise ArtifactError.at(self.path, None, f"cannot read: {error.strerror}") from error
        if data[4:8] != TFLITE_IDENTIFIER:
            raise ArtifactError.at(self.path, None, f"not a TFLite model: {_what_it_is(self.path, data[:8])}")
        # A truncated or corrupt flatbuffer surfaces as struct/numpy errors from the
        # generated accessors when an offset points past the end; name the record at fault.
        where = ["model header"]
        try:
            return _parse_model(self.path, data, where)
        except ArtifactError:
            raise
        except Exception as error:  # noqa: BLE001 - any decoding failure is a bad artifact
            raise ArtifactError.at(
                self.path,
                None,
                f"corrupt or truncated TFLite flatbuffer at {where[0]} "
                f"({len(data)} bytes): {type(error).__name__}: {error}",
            ) from error

    def read(self) -> Recovery:
        return to_recovery(self.model(), format=self.format, parser=self.parser)


#: First bytes of formats a misnamed ``.tflite`` is often found to be.
_OTHER_FORMATS = (
    (b"PK\x03\x04", "a ZIP archive (an IREE .vmfb is one)"),
    (b"\x89HDF", "an HDF5 file (a Keras .h5 model)"),
    (b"ML\xefR", "an MLIR bytecode file"),
)


def _what_it_is(path: Path, head: bytes) -> str:
    """What a file that should be a TFLite flatbuffer holds instead, in words."""
    if not head:
        return "the file is empty (0 bytes)"
    if len(head) < 8:
        return f"the file has {len(head)} bytes; a TFLite flatbuffer starts with 8 (a root offset and 'TFL3')"
    found = head[4:8]
    if sorted(found) == sorted(TFLITE_IDENTIFIER):
        return (f"bytes 4..8 are {found!r}, not the identifier b'TFL3' (its bytes are there in another "
                "order: the file was altered)")
    for magic, what in _OTHER_FORMATS:
        if head.startswith(magic):
            return f"it is {what}, without the identifier b'TFL3' at bytes 4..8"
    return f"bytes 4..8 are {found!r}, not the identifier b'TFL3'"


def _parse_model(path: Path, data: bytes, where: list[str]) -> TFLiteModel:
    from tflite.BuiltinOperator import BuiltinOperator
    from tflite.Model import Model
    from tflite.TensorType import TensorType

    builtin_names = _enum_names(BuiltinOperator)
    type_names = _enum_names(TensorType)
    model = Model.GetRootAs(data, 0)

    buffer_sizes: list[int] = []
    for b in range(model.BuffersLength()):
        where[0] = f"buffer {b}"
        buffer = model.Buffers(b)
        # DataAsNumpy is a view into ``data``; building it checks the vector lies inside
        # the file without copying the weights.
        view = buffer.DataAsNumpy()
        size = 0 if isinstance(view, int) else int(view.nbytes)
        if size == 0 and buffer.Offset() > 1:  # data stored after the flatbuffer (>2 GB models)
            size = int(buffer.Size())
            if buffer.Offset() + size > len(data):
                raise ArtifactError.at(path, None, f"buffer {b} points past the end of the file")
        buffer_sizes.append(size)

    opcodes: list[tuple[str, str, int]] = []  # (op type, builtin name, version)
    for c in range(model.OperatorCodesLength()):
        where[0] = f"operator code {c}"
        code = model.OperatorCodes(c)
        # Schema 3a moved the code from an int8 field to an int32 one; readers take the max.
        value = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
        builtin = builtin_names.get(value, f"BUILTIN_{value}")
        custom = code.CustomCode()
        op_type = custom.decode("utf-8", "replace") if builtin == "CUSTOM" and custom else builtin
        opcodes.append((op_type, builtin, code.Version()))

    subgraphs = tuple(
        _parse_subgraph(path, model, s, opcodes, buffer_sizes, type_names, where)
        for s in range(model.SubgraphsLength())
    )
    where[0] = "metadata"
    metadata = tuple(_text(model.Metadata(m).Name()) or "" for m in range(model.MetadataLength()))
    return TFLiteModel(
        path=path,
        schema_version=model.Version(),
        description=_text(model.Description()),
        subgraphs=subgraphs,
        buffer_count=len(buffer_sizes),
        buffer_bytes=sum(buffer_sizes),
        metadata_names=metadata,
    )


def _parse_subgraph(
    path: Path,
    model: Any,
    s: int,
    opcodes: Sequence[tuple[str, str, int]],
    buffer_sizes: Sequence[int],
    type_names: Mapping[int, str],
    where: list[str],
) -> TFLiteSubgraph:
    graph = model.Subgraphs(s)
    tensors = []
    for t in range(graph.TensorsLength()):
        where[0] = f"subgraph {s} tensor {t}"
        tensor = graph.Tensors(t)
        # The concrete shape, not the signature: the Edge TPU compiles static shapes only,
        # and these are the ones the interpreter allocates (a -1 batch becomes 1).
        shape = _indices(tensor.ShapeAsNumpy())
        type_name = type_names.get(tensor.Type(), f"TYPE_{tensor.Type()}")
        dtype, itemsize = _DTYPES.get(type_name, (type_name.lower(), None))
        # A negative dimension (a -1 left in a dynamic shape, or a corrupt one) has no size.
        nbytes = math.prod(shape) * itemsize if itemsize and all(d >= 0 for d in shape) else None
        buffer_index = tensor.Buffer()
        if not 0 <= buffer_index < max(len(buffer_sizes), 1):
            raise ArtifactError.at(
                path,
                None,
                f"subgraph {s} tensor {t}: buffer index {buffer_index} "
                f"outside the model's {len(buffer_sizes)} buffers",
            )
        buffer_bytes = buffer_sizes[buffer_index] if buffer_sizes else 0
        tensors.append(
            TFLiteTensor(
                index=t,
                name=_text(tensor.Name()),
                shape=shape,
                dtype=dtype,
                nbytes=nbytes,
                buffer_bytes=buffer_bytes,
                is_variable=tensor.IsVariable(),
                dynamic=_dynamic(tensor),
            )
        )

    operators = []
    seen: dict[str, int] = {}
    for k in range(graph.OperatorsLength()):
        where[0] = f"subgraph {s} operator {k}"
        op = graph.Operators(k)
        opcode_index = op.OpcodeIndex()
        if not 0 <= opcode_index < len(opcodes):
            raise ArtifactError.at(
                path,
                None,
                f"subgraph {s} operator {k}: opcode index {opcode_index} "
                f"outside the model's {len(opcodes)} operator codes",
            )
        op_type, builtin, version = opcodes[opcode_index]
        inputs = _indices(op.InputsAsNumpy())
        outputs = _indices(op.OutputsAsNumpy())
        for i in (*inputs, *outputs):
            if not -1 <= i < len(tensors):  # -1: an omitted optional input
                raise ArtifactError.at(
                    path,
                    None,
                    f"subgraph {s} operator {k}: tensor index {i} "
                    f"outside the subgraph's {len(tensors)} tensors",
                )
        custom = op.CustomOptionsAsNumpy()
        ordinal = seen.get(op_type, 0)
        seen[op_type] = ordinal + 1
        operators.append(
            TFLiteOperator(
                id=f"subgraph{s}/{op_type}#{ordinal}",
                subgraph=s,
                index=k,
                op_type=op_type,
                builtin=builtin,
                inputs=inputs,
                outputs=outputs,
                opcode_version=version,
                custom_options_bytes=0 if isinstance(custom, int) else int(custom.nbytes),
                options=_options(op, builtin),
            )
        )
    where[0] = f"subgraph {s} inputs/outputs"
    graph_inputs, graph_outputs = _indices(graph.InputsAsNumpy()), _indices(graph.OutputsAsNumpy())
    for role, indices in (("input", graph_inputs), ("output", graph_outputs)):
        for i in indices:
            if not 0 <= i < len(tensors):
                raise ArtifactError.at(path, None, f"subgraph {s} {role} tensor index {i} "
                                                   f"outside the subgraph's {len(tensors)} tensors")
    return TFLiteSubgraph(
        index=s,
        name=_text(graph.Name()),
        tensors=tuple(tensors),
        operators=tuple(operators),
        inputs=graph_inputs,
        outputs=graph_outputs,
    )


def _dynamic(tensor: Any) -> bool:
    """Whether the shape signature marks a dimension dynamic (-1, mostly the batch)."""
    return any(dim < 0 for dim in _indices(tensor.ShapeSignatureAsNumpy()))


def _indices(view: Any) -> tuple[int, ...]:
    # The generated accessors return 0 (not an empty array) for an absent vector.
    return () if isinstance(view, int) else tuple(int(x) for x in view)


def _text(raw: bytes | None) -> str | None:
    return None if raw is None else raw.decode("utf-8", "replace")


def _options(op: Any, builtin: str) -> dict[str, Any]:
    """The builtin options that decide an op's cost (strides, padding, kernel size)."""
    from tflite.ActivationFunctionType import ActivationFunctionType
    from tflite.Conv2DOptions import Conv2DOptions
    from tflite.DepthwiseConv2DOptions import DepthwiseConv2DOptions
    from tflite.Padding import Padding
    from tflite.Pool2DOptions import Pool2DOptions

    readers = {
        "CONV_2D": Conv2DOptions,
        "DEPTHWISE_CONV_2D": DepthwiseConv2DOptions,
        "AVERAGE_POOL_2D": Pool2DOptions,
        "MAX_POOL_2D": Pool2DOptions,
    }
    if builtin not in readers:
        return {}
    table = op.BuiltinOptions()
    if table is None:
        return {}
    options = readers[builtin]()
    options.Init(table.Bytes, table.Pos)
    found: dict[str, Any] = {
        "stride": (options.StrideH(), options.StrideW()),
        "padding": _enum_names(Padding).get(options.Padding(), str(options.Padding())),
        "fused_activation": _enum_names(ActivationFunctionType).get(
            options.FusedActivationFunction(), str(options.FusedActivationFunction())
        ),
    }
    if builtin in ("CONV_2D", "DEPTHWISE_CONV_2D"):
        found["dilation"] = (options.DilationHFactor(), options.DilationWFactor())
    if builtin == "DEPTHWISE_CONV_2D":
        found["depth_multiplier"] = options.DepthMultiplier()
    if builtin.endswith("POOL_2D"):
        found["filter"] = (options.FilterHeight(), options.FilterWidth())
    return found


def scoped(scope: str, local_id: str) -> str:
    return f"{scope}/{local_id}" if scope else local_id


def build_operator(
    op: TFLiteOperator, subgraph: TFLiteSubgraph, scope: str = "", **changes: Any
) -> RecoveredOperator:
    """One operator record; ``changes`` sets partition, status or extra attributes."""
    name = subgraph.tensors[op.outputs[0]].name if op.outputs else None
    macs = operator_macs(op, subgraph)
    attributes: dict[str, Any] = {
        "subgraph": op.subgraph,
        "builtin": op.builtin,
        "opcode_version": op.opcode_version,
        **op.options,
    }
    if op.builtin == "CUSTOM":
        attributes["custom_code"] = op.op_type
        attributes["custom_options_bytes"] = op.custom_options_bytes
    attributes.update(changes.pop("attributes", {}))
    missing = ValueInfo(name=None, shape=None, dtype=None)  # an omitted optional input (-1)
    return RecoveredOperator(
        id=scoped(scope, op.id),
        op=f"tflite.{op.op_type}",
        index=op.index,
        name=name,
        inputs=tuple(subgraph.tensors[i].value_info() if i >= 0 else missing for i in op.inputs),
        outputs=tuple(subgraph.tensors[i].value_info() for i in op.outputs),
        macs=macs,
        flops=None if macs is None else 2 * macs,
        bytes=operator_bytes(op, subgraph),
        module_path=module_path_of(name),
        attributes=attributes,
        **changes,
    )


def build_tensors(subgraph: TFLiteSubgraph, scope: str = "") -> tuple[RecoveredTensor, ...]:
    producers: dict[int, str] = {}
    consumers: dict[int, list[str]] = {}
    for op in subgraph.operators:
        for i in op.outputs:
            producers[i] = scoped(scope, op.id)
        for i in op.inputs:
            if i >= 0:
                consumers.setdefault(i, []).append(scoped(scope, op.id))
    return tuple(
        RecoveredTensor(
            id=scoped(scope, subgraph.tensor_id(t.index)),
            producer=producers.get(t.index),
            consumers=tuple(consumers.get(t.index, ())),
            shape=t.shape,
            dtype=t.dtype,
            # A constant's size is what the model stores; an activation's is its shape's.
            bytes=t.buffer_bytes if t.constant else t.nbytes,
            constant=t.constant,
            name=t.name,
        )
        for t in subgraph.tensors
    )


def edgetpu_partition_id(scope: str, ordinal: int) -> str:
    return scoped(scope, f"edgetpu#{ordinal}")


def cpu_partition_id(scope: str) -> str:
    return scoped(scope, "cpu")


def model_attributes(model: TFLiteModel) -> dict[str, Any]:
    return {
        "schema_version": model.schema_version,
        "description": model.description,
        "compiled_for_edgetpu": model.is_compiled,
        "buffer_count": model.buffer_count,
        "buffer_bytes": model.buffer_bytes,
        "metadata": list(model.metadata_names),
        "tensors_with_dynamic_signature": sum(t.dynamic for g in model.subgraphs for t in g.tensors),
        "subgraphs": [
            {
                "index": g.index,
                "name": g.name,
                "operators": len(g.operators),
                "tensors": len(g.tensors),
                "inputs": [g.tensors[i].name for i in g.inputs],
                "outputs": [g.tensors[i].name for i in g.outputs],
            }
            for g in model.subgraphs
        ],
    }


def compiled_partitions(
    model: TFLiteModel, scope: str = ""
) -> tuple[dict[str, str], tuple[RecoveredPartition, ...]]:
    """What a compiled model alone says about its partitions: one per
    ``edgetpu-custom-op`` (holding that op; the original ops it absorbed are not in the
    file) and one ``cpu`` partition with every other op. Returns (op id -> partition id,
    partitions)."""
    assignment: dict[str, str] = {}
    partitions = []
    ordinal = 0
    cpu_ops: list[str] = []
    for subgraph in model.subgraphs:
        for op in subgraph.operators:
            if op.is_edgetpu:
                partition_id = edgetpu_partition_id(scope, ordinal)
                ordinal += 1
                assignment[op.id] = partition_id
                partitions.append(
                    RecoveredPartition(
                        id=partition_id,
                        kind=EDGETPU_CUSTOM_OP,
                        operator_ids=(scoped(scope, op.id),),
                        attributes={
                            "custom_op": scoped(scope, op.id),
                            "executable_bytes": op.custom_options_bytes,
                            "boundary_inputs": [subgraph.tensors[i].name for i in op.inputs if i >= 0],
                            "boundary_outputs": [subgraph.tensors[i].name for i in op.outputs],
                        },
                    )
                )
            else:
                assignment[op.id] = cpu_partition_id(scope)
                cpu_ops.append(scoped(scope, op.id))
    if cpu_ops:
        partitions.append(
            RecoveredPartition(id=cpu_partition_id(scope), kind="cpu", operator_ids=tuple(cpu_ops))
        )
    return assignment, tuple(partitions)


def to_recovery(
    model: TFLiteModel,
    format: str = TFLiteModelReader.format,
    parser: str | None = TFLiteModelReader.parser,
    scope: str = "",
) -> Recovery:
    """The recovery of one model file on its own (no matching with other files)."""
    assignment: dict[str, str] = {}
    partitions: tuple[RecoveredPartition, ...] = ()
    if model.is_compiled:
        assignment, partitions = compiled_partitions(model, scope)
    operators = []
    for subgraph in model.subgraphs:
        for op in subgraph.operators:
            partition = assignment.get(op.id)
            status = None
            if partition is not None:
                status = "Mapped to Edge TPU" if op.is_edgetpu else "cpu"
            operators.append(build_operator(op, subgraph, scope, partition=partition, status=status))
    tensors = tuple(t for subgraph in model.subgraphs for t in build_tensors(subgraph, scope))
    return Recovery(
        backend=BACKEND,
        sources=(source_artifact(model.path, format, parser),),
        operators=tuple(operators),
        tensors=tensors,
        partitions=partitions,
        coverage=model_coverage(model),
        attributes=model_attributes(model),
    )


def model_coverage(model: TFLiteModel) -> tuple[CoverageNote, ...]:
    ops = len(model.operators)
    if model.is_compiled:
        custom = sum(op.is_edgetpu for op in model.operators)
        operators = CoverageNote(
            "operators",
            Coverage.PARTIAL,
            f"{ops} ops of the compiled model ({custom} edgetpu-custom-op, {ops - custom} on "
            "the CPU); the original ops inside a custom op are only known with the "
            "original .tflite",
        )
        partitions = CoverageNote(
            "partitions", Coverage.RECOVERED, f"{custom} Edge TPU custom op(s) and the CPU remainder"
        )
    else:
        operators = CoverageNote(
            "operators", Coverage.RECOVERED, f"{ops} ops with their operands and results"
        )
        partitions = CoverageNote(
            "partitions", Coverage.NOT_EXPOSED, "an uncompiled model has no Edge TPU partitions"
        )
    return (
        operators,
        CoverageNote(
            "tensor_shapes",
            Coverage.RECOVERED,
            "every tensor's shape, dtype and size (concrete shapes; a -1 in a shape signature is "
            "counted in attributes['tensors_with_dynamic_signature'])",
        ),
        CoverageNote(
            "static_cost",
            Coverage.PARTIAL,
            "MACs of CONV_2D, DEPTHWISE_CONV_2D and FULLY_CONNECTED from shapes; bytes of every op",
        ),
        partitions,
        CoverageNote(
            "source_locations", Coverage.PARTIAL, "tensor names only (used as op name and module path)"
        ),
        CoverageNote("per_op_timing", Coverage.NOT_EXPOSED, "a model file holds no timing"),
    )
