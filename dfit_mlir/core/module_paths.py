"""Module paths as each frontend writes them, split into their ancestors.

PyTorch paths use ``.`` (``encoder.layer.0`` → ``encoder``, ``encoder.layer``,
``encoder.layer.0``); ONNX, TFLite and JAX paths use ``/`` (``/model.22/cv3.0`` →
``/model.22``, ``/model.22/cv3.0``). ``""`` is the root. The ledger's module-tree rollup,
the flame graph, the view's tree and the diff all split paths here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

ROOT = ""
#: What a node sums: op count, static FLOPs (per trip), boundary bytes, measured time.
FIGURES = ("ops", "flops", "bytes", "time_ns")
#: Executed work over the whole run (static × dispatch events, the ledger's): ``None`` on
#: every node where nothing counted executions (a manifest without a run), never 0.
EXECUTED_FIGURES = ("executed_flops", "executed_macs", "executed_transcendentals")


def _figures() -> dict[str, float | None]:
    return {**dict.fromkeys(FIGURES, 0), **dict.fromkeys(EXECUTED_FIGURES)}


def _plus(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else a + b


def separator(path: str) -> str:
    return "/" if "/" in path else "."


def ancestry(path: str) -> list[str]:
    """Every module path from the root down to ``path`` itself (root ``""`` first)."""
    if path == ROOT:
        return [ROOT]
    sep = separator(path)
    leading = sep if path.startswith(sep) else ""
    parts = [p for p in path.split(sep) if p]
    return [ROOT] + [leading + sep.join(parts[:i]) for i in range(1, len(parts) + 1)]


def leaf_name(path: str) -> str:
    return path.rsplit(separator(path), 1)[-1] if path else "(root)"


@dataclass
class ModuleNode:
    path: str
    parent: str | None
    depth: int
    children: list[str] = field(default_factory=list)
    classes: dict[str, int] = field(default_factory=dict)
    phases: dict[str, int] = field(default_factory=dict)
    #: :data:`FIGURES` and :data:`EXECUTED_FIGURES` of the node's own ops and, in
    #: ``values``, of its subtree (inclusive).
    self_values: dict[str, float | None] = field(default_factory=_figures)
    values: dict[str, float | None] = field(default_factory=_figures)

    @property
    def module_class(self) -> str | None:
        return max(self.classes, key=lambda c: (self.classes[c], c)) if self.classes else None


Item = tuple[str, str | None, str | None, dict[str, float | None], dict[str, str]]


def build_tree(items: Iterable[Item]) -> dict[str, ModuleNode]:
    """``items``: (module path, module class, phase, {ops, flops, bytes, time_ns and,
    where a run counted them, executed_flops, executed_macs, executed_transcendentals},
    {ancestor path: class}) per op. Returns every module path (ancestors included) in
    depth-first, first-seen order. An executed figure no item knows stays ``None``; one
    that some item knows is a number on every node (0 where none of its ops ran)."""
    nodes: dict[str, ModuleNode] = {}
    known: set[str] = set()
    for path, module_class, phase, values, classes in items:
        known.update(key for key in EXECUTED_FIGURES if values.get(key) is not None)
        chain = ancestry(path)
        for depth, ancestor in enumerate(chain):
            node = nodes.get(ancestor)
            if node is None:
                parent = chain[depth - 1] if depth else None
                node = nodes[ancestor] = ModuleNode(ancestor, parent, depth)
                if parent is not None:
                    nodes[parent].children.append(ancestor)
            for key, value in values.items():
                node.values[key] = _plus(node.values.get(key), value if key in EXECUTED_FIGURES else value or 0)
            if ancestor != path and ancestor in classes:
                node.classes[classes[ancestor]] = node.classes.get(classes[ancestor], 0) + 1
        own = nodes[path]
        for key, value in values.items():
            own.self_values[key] = _plus(own.self_values.get(key), value if key in EXECUTED_FIGURES else value or 0)
        if module_class:
            own.classes[module_class] = own.classes.get(module_class, 0) + 1
        phase_key = phase or "(none)"
        own.phases[phase_key] = own.phases.get(phase_key, 0) + 1
    for node in nodes.values():
        for key in known:
            for figures in (node.values, node.self_values):
                if figures[key] is None:
                    figures[key] = 0
    ordered: dict[str, ModuleNode] = {}
    stack = [ROOT] if ROOT in nodes else []
    while stack:
        path = stack.pop()
        ordered[path] = nodes[path]
        stack.extend(reversed(nodes[path].children))
    return ordered
