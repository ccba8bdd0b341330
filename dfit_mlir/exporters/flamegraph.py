"""Module trees of a model and the pictures made of them: a flame graph (SVG, or PNG
where matplotlib is installed) and a speedscope profile (https://www.speedscope.app).

A module path is split into its ancestors the way its frontend writes it: PyTorch paths
with ``.`` (``encoder.layer.0`` → ``encoder``, ``encoder.layer``, ``encoder.layer.0``),
ONNX, TFLite and JAX paths with ``/`` (``/model.22/cv3.0`` → ``/model.22``,
``/model.22/cv3.0``). ``""`` is the root.

Widths are measured time (which counts every trip of a loop), else FLOPs, else op count.
Each frame's tooltip (the SVG's ``<title>``) gives the module's FLOPs **per trip** (each
op once, as the program says) and, where a run counted executions, its **executed**
FLOPs over the whole run and per invocation (the ledger's: per-trip × the run's dispatch
events, ÷ its invocations; else per-trip × the manifest's static trip counts, the source
named): a scan body's module shows both, so the time a frame is wide
by can be read against the work that time did. The tooltip rather than a second picture:
the frame a user hovers is the one whose figures they want, and a picture sized by
executed FLOPs is the view's icicle with "executed FLOPs" chosen.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dfit_mlir.core import atomic
from dfit_mlir.core.module_paths import ROOT, ModuleNode, ancestry, leaf_name

WEIGHTS = ("time_ns", "flops", "ops")

#: Characters XML 1.0 does not allow (C0 controls but tab and newline, lone surrogates,
#: U+FFFE/U+FFFF): a name holding one would make the SVG unreadable.
_NOT_XML = re.compile("[\x00-\x08\x0b-\x1f\ud800-\udfff\ufffe\uffff]")


def _xml(text: str) -> str:
    """``text`` escaped for XML content and attributes, characters XML cannot hold
    written visibly (``\\x01``)."""
    return html.escape(_NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}", text))


def weight_of(nodes: dict[str, ModuleNode]) -> str:
    """The measure the pictures are sized by: measured time, else FLOPs, else op count."""
    root = nodes.get(ROOT)
    return next((w for w in WEIGHTS if root is not None and root.values.get(w)), "ops")


@dataclass(frozen=True)
class Box:
    path: str
    depth: int
    x: float
    width: float
    value: float


def layout(nodes: dict[str, ModuleNode], weight: str) -> list[Box]:
    """Flame graph boxes: x and width as shares of the root (children left to right in
    program order, each as wide as its inclusive weight)."""
    if ROOT not in nodes or not nodes[ROOT].values[weight]:
        return []
    total = nodes[ROOT].values[weight]
    boxes = []
    pending = [(ROOT, 0.0)]
    while pending:
        path, x = pending.pop()
        node = nodes[path]
        width = node.values[weight] / total
        boxes.append(Box(path, node.depth, x, width, node.values[weight]))
        child_x = x
        for child in node.children:
            pending.append((child, child_x))
            child_x += nodes[child].values[weight] / total
    return boxes


_UNITS = {"time_ns": "ns", "flops": "FLOPs per trip", "ops": "ops"}


def _colour(path: str) -> str:
    """Warm flame colours, stable per name (the same module gets the same colour)."""
    import zlib

    h = zlib.crc32(leaf_name(path).encode())
    return f"rgb({205 + h % 50},{80 + (h >> 8) % 120},{40 + (h >> 16) % 50})"


#: The ledger's executed FLOPs of one invocation, on a node (``None``: unknown).
PER_INVOCATION = "executed_flops_per_invocation"


def work_text(node: ModuleNode, per_invocation: Callable[[float | None], float | None] | None = None,
              basis: str | None = None) -> str:
    """A frame's work: ``FLOPs per trip 1,234; executed FLOPs 22,212 over the run (7,404
    per invocation, from run events)``; where only the manifest's trip counts give them,
    ``…; executed FLOPs 7,404 per invocation (from manifest trips; over the run unknown)``;
    else ``…; executed FLOPs unknown (no run counted executions)``. The per-invocation
    figure is the node's own (the ledger's), else ``per_invocation(executed)``."""
    text = f"FLOPs per trip {node.values['flops']:,.0f}"
    executed, each = node.values.get("executed_flops"), node.values.get(PER_INVOCATION)
    if each is None and executed is not None and per_invocation is not None:
        each = per_invocation(executed)
    source = f", from {basis}" if basis else ""
    if executed is None and each is None:
        return text + "; executed FLOPs unknown (no run counted executions)"
    if executed is None:
        return text + f"; executed FLOPs {each:,.0f} per invocation ({source[2:] or 'known'}; over the run unknown)"
    return text + f"; executed FLOPs {executed:,.0f} over the run" + (
        f" ({each:,.0f} per invocation{source})" if each is not None else "")


def write_svg(nodes: dict[str, ModuleNode], path: str | Path, title: str, weight: str | None = None,
              width: int = 1200, row: int = 18,
              per_invocation: Callable[[float | None], float | None] | None = None,
              basis: str | None = None) -> Path:
    """The flame graph; ``per_invocation``: the ledger's division of an executed figure
    by the run's invocations (:meth:`~dfit_mlir.analysis.ledger.Ledger.per_invocation`),
    for nodes that carry no per-invocation figure of their own; ``basis``: where the
    executed figures come from (the ledger's ``executed_basis``)."""
    weight = weight or weight_of(nodes)
    boxes = layout(nodes, weight)
    depth = max((b.depth for b in boxes), default=0) + 1
    height = depth * row + 40
    total = nodes[ROOT].values[weight] if boxes else 0
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'font-family="monospace" font-size="11">',
             '<rect width="100%" height="100%" fill="#fdfdf6"/>',
             f'<text x="6" y="16" font-size="13">{_xml(title)} — width: {_UNITS[weight]} '
             f'(total {total:,.0f})</text>']
    for box in boxes:
        x, w = box.x * (width - 12) + 6, max(box.width * (width - 12), 0.5)
        y = height - (box.depth + 1) * row - 4
        node = nodes[box.path]
        label = leaf_name(box.path) + (f" ({node.module_class})" if node.module_class else "")
        tip = (f"{box.path or '(root)'}{' : ' + node.module_class if node.module_class else ''}\n"
               f"{_UNITS[weight]}: {box.value:,.0f} ({100 * box.width:.1f}%), ops {node.values['ops']:,.0f}\n"
               f"{work_text(node, per_invocation, basis)}")
        parts.append(f'<g><title>{_xml(tip)}</title><rect x="{x:.2f}" y="{y}" width="{w:.2f}" '
                     f'height="{row - 1}" fill="{_colour(box.path)}" rx="2"/>')
        chars = int(w / 6.6)
        if chars >= 3:
            text = label if len(label) <= chars else label[:chars - 2] + ".."
            parts.append(f'<text x="{x + 3:.2f}" y="{y + row - 5}">{_xml(text)}</text>')
        parts.append("</g>")
    parts.append("</svg>")
    atomic.write_text(path, "\n".join(parts) + "\n")
    return Path(path)


def write_png(nodes: dict[str, ModuleNode], path: str | Path, title: str, weight: str | None = None) -> Path:
    """The same picture as :func:`write_svg` as a PNG (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    weight = weight or weight_of(nodes)
    boxes = layout(nodes, weight)
    depth = max((b.depth for b in boxes), default=0) + 1
    figure = plt.figure(figsize=(14, 0.32 * depth + 0.8), dpi=110)
    axes = figure.add_axes((0.005, 0.02, 0.99, 0.9))
    for box in boxes:
        rgb = tuple(int(c) / 255 for c in _colour(box.path)[4:-1].split(","))
        axes.add_patch(matplotlib.patches.Rectangle((box.x, box.depth), box.width, 0.94, facecolor=rgb,
                                                    edgecolor="white", linewidth=0.4))
        node = nodes[box.path]
        label = leaf_name(box.path) + (f" ({node.module_class})" if node.module_class else "")
        chars = int(box.width * 14 * 110 / 6.5)
        if chars >= 3:
            axes.text(box.x + 0.002, box.depth + 0.45, label if len(label) <= chars else label[:chars - 2] + "..",
                      va="center", fontsize=7, family="monospace", clip_on=True)
    axes.set_xlim(0, 1)
    axes.set_ylim(0, depth)
    axes.axis("off")
    total = nodes[ROOT].values[weight] if boxes else 0
    figure.suptitle(f"{title} — width: {_UNITS[weight]} (total {total:,.0f})", fontsize=10, x=0.01, ha="left")
    with atomic.atomic_path(Path(path)) as tmp:
        figure.savefig(tmp, format="png")
    plt.close(figure)
    return Path(path)


def speedscope(nodes: dict[str, ModuleNode], name: str, profiles: Sequence[tuple[str, dict[str, ModuleNode]]] = (),
               weight: str | None = None) -> dict[str, Any]:
    """A speedscope document (``sampled`` profiles): one sample per module with self
    weight, its stack the module's ancestry. ``profiles``: further (name, tree) pairs,
    e.g. one per phase, sized by the same weight."""
    weight = weight or weight_of(nodes)
    frames: list[dict[str, str]] = []
    index: dict[str, int] = {}

    def frame(path: str, tree: dict[str, ModuleNode]) -> int:
        if path not in index:
            index[path] = len(frames)
            cls = tree[path].module_class
            frames.append({"name": (path or "(root)") + (f" ({cls})" if cls else "")})
        return index[path]

    documents = []
    for profile_name, tree in ((name, nodes), *profiles):
        samples, weights = [], []
        for path, node in tree.items():
            if node.self_values[weight]:
                samples.append([frame(p, tree) for p in ancestry(path)])
                weights.append(node.self_values[weight])
        documents.append({"type": "sampled", "name": profile_name,
                          "unit": "nanoseconds" if weight == "time_ns" else "none",
                          "startValue": 0, "endValue": sum(weights), "samples": samples, "weights": weights})
    return {"$schema": "https://www.speedscope.app/file-format-schema.json", "name": name,
            "exporter": "dfit-mlir semantic-attribution", "activeProfileIndex": 0,
            "shared": {"frames": frames}, "profiles": documents}


def write_speedscope(document: dict[str, Any], path: str | Path) -> Path:
    atomic.write_text(path, json.dumps(document) + "\n")
    return Path(path)
