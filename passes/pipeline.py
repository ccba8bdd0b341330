"""``dfit opt``: textual pass pipelines that mix dfit passes with any pass registered in
the MLIR/IREE bundled with ``iree.compiler``.

The bundled ``PassManager`` accepts Python-defined passes through ``add(callable)`` but
cannot find them by name inside a textual pipeline, so the pipeline is split at its top
level: each run of registered passes is added as text, each dfit pass as a callable,
in the order written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from iree.compiler import ir, passmanager

from dfit_mlir.core.errors import InvalidInputError
from dfit_mlir.passes import mlir_engine


@dataclass(frozen=True)
class PythonPass:
    argument: str
    description: str
    run: Callable[[ir.Operation, object], None]


def _strip_dfit_pass(op: ir.Operation, pass_: object) -> None:
    mlir_engine.strip_dfit_attributes(op.operation)


def _probes_pass(op: ir.Operation, pass_: object) -> None:
    from dfit_mlir.passes import probes

    probes.insert_function_probes(op.operation)


#: dfit passes available to ``dfit opt`` pipelines, by pipeline name.
DFIT_PASSES = {
    "dfit-tag": PythonPass("dfit-tag", "stamp stable semantic IDs (dfit.id, dfit.hash, NameLoc)", mlir_engine.dfit_tag_pass),
    "dfit-strip": PythonPass("dfit-strip", "remove dfit.* attributes (IDs stay in locations)", _strip_dfit_pass),
    "dfit-probes": PythonPass("dfit-probes", "insert function-boundary dfit.probe calls (optional import)",
                              _probes_pass),
}


def split_top_level(text: str) -> list[str]:
    """Split ``a,b{x=1,y=2},func.func(c,d)`` at top-level commas."""
    parts, depth, current = [], 0, []
    for char in text:
        if char in "({" :
            depth += 1
        elif char in ")}":
            depth -= 1
            if depth < 0:
                raise InvalidInputError(f"unbalanced pass pipeline: {text!r}")
        if char == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    if depth != 0:
        raise InvalidInputError(f"unbalanced pass pipeline: {text!r}")
    if "".join(current).strip():
        parts.append("".join(current).strip())
    return parts


def parse_pipeline(pipeline: str) -> tuple[str, list[str]]:
    """``builtin.module(a,b)`` → ("builtin.module", ["a", "b"]); a bare list anchors on
    ``builtin.module``."""
    pipeline = pipeline.strip()
    anchor = "builtin.module"
    if pipeline.endswith(")") and "(" in pipeline:
        head, _, body = pipeline.partition("(")
        if head.strip() and all(c.isalnum() or c in "._" for c in head.strip()):
            anchor, pipeline = head.strip(), body[:-1]
    return anchor, split_top_level(pipeline)


def build_pass_manager(pipeline: str, context: ir.Context) -> passmanager.PassManager:
    anchor, elements = parse_pipeline(pipeline)
    with context:
        manager = passmanager.PassManager(anchor)
        pending: list[str] = []

        def flush() -> None:
            if pending:
                try:
                    manager.add(",".join(pending))
                except ValueError as error:
                    reason = str(error).splitlines()[0]
                    raise InvalidInputError(f"bad pass pipeline {','.join(pending)!r}: {reason}") from None
                pending.clear()

        for element in elements:
            name = element.split("{", 1)[0].strip()
            if name in DFIT_PASSES:
                if "{" in element:
                    raise InvalidInputError(f"pass '{name}' takes no options in this pipeline")
                flush()
                dfit_pass = DFIT_PASSES[name]
                manager.add(dfit_pass.run, name=name, argument=dfit_pass.argument, description=dfit_pass.description)
            else:
                pending.append(element)
        flush()
    return manager
