"""dfit's xDSL plugin: found by ``xdsl-opt`` through the ``xdsl.universe`` entry point.

The factories import on call, so listing dfit costs nothing until it is used.
"""

from __future__ import annotations

from xdsl.ir import Dialect
from xdsl.passes import ModulePass
from xdsl.universe import Universe


def _dfit_dialect() -> Dialect:
    from dfit_mlir.dialects.dfit import DFIT

    return DFIT


def _dfit_tag_pass() -> type[ModulePass]:
    from dfit_mlir.passes.xdsl_tag import DfitTagPass

    return DfitTagPass


DFIT_UNIVERSE = Universe(
    all_dialects={"dfit": _dfit_dialect},
    all_passes={"dfit-tag": _dfit_tag_pass},
)
