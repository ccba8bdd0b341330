"""``dfit-tag`` as an xDSL pass (``xdsl-opt -p dfit-tag``), found through dfit's
``xdsl.universe`` entry point."""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass


@dataclass(frozen=True)
class DfitTagPass(ModulePass):
    """Stamp every op below the module with its dfit ID and structural hash
    (``dfit.id`` / ``dfit.hash`` attributes and a ``dfit:<id>`` NameLoc)."""

    name = "dfit-tag"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        from dfit_mlir.passes.xdsl_engine import tag_module

        tag_module(op)
