"""Tools by name: the built-ins plus plugins of the ``dfit.tools`` entry-point group.

A plugin distribution declares::

    [project.entry-points."dfit.tools"]
    my-tool = "my_package.tool:MyTool"

Names map to ``module:attribute`` targets imported on first use; two providers of one
name is an error that names both.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import metadata

from dfit_mlir.analysis.tools.api import Tool
from dfit_mlir.core.errors import DfitError, InvalidInputError

ENTRY_POINT_GROUP = "dfit.tools"

BUILTIN = {
    "compile-metrics": "dfit_mlir.analysis.tools.builtin.compile_metrics:CompileMetrics",
    "overhead": "dfit_mlir.analysis.tools.builtin.overhead:Overhead",
    "program-analyzer": "dfit_mlir.analysis.tools.builtin.program_analyzer:ProgramAnalyzer",
    "semantic-attribution": "dfit_mlir.analysis.tools.builtin.semantic_attribution:SemanticAttribution",
    "memory-proxy": "dfit_mlir.analysis.tools.builtin.memory_proxy:MemoryProxy",
}


class ToolRegistryError(DfitError):
    """Two providers for one tool name, or a plugin that is not a tool."""


@dataclass(frozen=True)
class ToolProvider:
    name: str
    target: str
    origin: str

    def load(self) -> type[Tool]:
        module, _, attribute = self.target.partition(":")
        cls = getattr(importlib.import_module(module), attribute)
        if not (isinstance(cls, type) and issubclass(cls, Tool)):
            raise ToolRegistryError(f"tool {self.name!r} from {self.origin} ({self.target}) is not a dfit Tool")
        return cls


def providers(entry_points: Iterable[metadata.EntryPoint] | None = None) -> dict[str, ToolProvider]:
    found = {name: ToolProvider(name, target, "built-in") for name, target in BUILTIN.items()}
    if entry_points is None:
        entry_points = metadata.entry_points(group=ENTRY_POINT_GROUP)
    for point in entry_points:
        origin = point.dist.name if point.dist is not None else "an unnamed distribution"
        if point.name in found and found[point.name].target != point.value:
            other = found[point.name]
            raise ToolRegistryError(f"tool {point.name!r} is provided twice: by {other.origin} ({other.target}) "
                                    f"and by {origin} ({point.value})")
        found[point.name] = ToolProvider(point.name, point.value, origin)
    return found


def create(name: str, entry_points: Iterable[metadata.EntryPoint] | None = None) -> Tool:
    known = providers(entry_points)
    if name not in known:
        raise InvalidInputError(f"unknown tool {name!r}; known: {', '.join(sorted(known))}")
    return known[name].load()()
