"""TFLite (converted with ``tosa-converter-for-tflite --emit-debug-info``).

Every op carries its TFLite output tensor name wrapped around the file:
``loc("model_1/model/add_3/add"("model.tflite":0:0))``. Line 0 of a ``.tflite`` is no
source line (:func:`dfit_mlir.core.locations.is_source_line`). Tensor names are Keras/TF
layer paths with the op last, so the module path is the name's ``/``-prefix
(``model_1/model/add_3``); a name without ``/`` (``input``, the function's own
``main``) sits in the root (``""``). The converter joins the names of fused TF ops with ``;``
(``model/conv/BiasAdd;model/conv/Conv2D``): the first one names the layer. The source
op is the TOSA op itself (``tosa.conv2d``); a TFLite model is an inference graph:
``forward``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dfit_mlir.frontends import SourceModel

FILE_SUFFIX = ".tflite"


def tensor_name(op: dict[str, Any]) -> str | None:
    names = op.get("name_path") or ()
    return names[-1].split(";", 1)[0] if names else None


class TfliteFrontend:
    name = "tflite"

    def recognizes(self, operators: Sequence[dict[str, Any]]) -> bool:
        return any((op.get("source") or {}).get("file", "").endswith(FILE_SUFFIX) for op in operators)

    def source_model(self, op: dict[str, Any]) -> SourceModel:
        source_op = op["op"] if op["op"].startswith("tosa.") else None
        name = tensor_name(op)
        if name is None:
            return SourceModel(source_op=source_op)
        head, sep, _ = name.rpartition("/")
        return SourceModel(module_path=head if sep else "", source_op=source_op, phase="forward")

    def finish(self, operators: Sequence[dict[str, Any]]) -> None:
        pass

    def module_classes(self, op: dict[str, Any]) -> dict[str, str]:
        return {}


FRONTEND = TfliteFrontend()
