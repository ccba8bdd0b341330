"""The printed IR of the ops that carry each source ID, at every snapshot phase.

``dfit view``'s stages panel shows, for a selected op, the op(s) carrying its ID after
each of IREE's phases. The compile keeps what the panel needs, and no more, in the
manifest's ``stage_ir`` table (:meth:`StageIR.table`):

* **What is printed.** Each carrier's own text in MLIR's generic op form with local
  scope (attributes inline, no ``#map`` aliases), as ``iree-compile
  --mlir-print-op-generic`` writes it: its results, name, operands,
  properties, attributes and types, with the bodies of its regions replaced by
  ``{...}`` and a ``// regions: …`` line naming the ops directly inside them (a dispatch
  region lists its loads, linalg ops and stores). Elements attributes above
  :data:`ELIDE_ELEMENTS` elements print as ``dense_resource<__elided__>`` (MLIR's own
  elision), quoted strings above :data:`MAX_STRING_CHARS` characters and texts above
  :data:`MAX_OP_CHARS` are cut with ``…``.
* **Which carriers.** The outermost ones: an op is printed for an ID when no op around it
  carries that ID too (the ops inside a ``hal.executable`` that carries a conv's ID are
  counted, not printed), at most :data:`MAX_CARRIERS` per ID and phase, in program
  order. The count of every carrier (the lineage rule's, so ``split`` means > 1) is kept.
* **Interned.** Every distinct text is stored once (the texts deflated together), and
  every distinct carrier list (count + texts) once; a phase is one integer per source
  ID. Most phases print most ops the same, and the ops of one dispatch region share the
  region's text. The encoding and its reader are :mod:`dfit_mlir.core.stage_ir_table`.

Why one print of the whole module, not one per op: printing a nested op alone numbers
the values of its whole enclosing function each time (MLIR builds the ``AsmState`` over
the nearest isolated-from-above ancestor), which is quadratic in the function's size: a
``transformers`` BERT spent 0.45 s per phase that way. The module is printed once per
phase in generic form, where every op starts its own line in pre-order and nothing is
elided, so the n-th op line is the n-th op of a pre-order walk; the op names are checked
on the way and a phase whose printout does not line up is listed in ``unrecorded``
rather than recorded wrong.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any, Iterable

from iree.compiler import ir

from dfit_mlir.core.lineage import CONTAINER_KINDS
from dfit_mlir.core.stage_ir_table import TABLE_VERSION, ints, pack_texts
from dfit_mlir.passes.mlir_engine import OpTree

ELIDE_ELEMENTS = 16
MAX_STRING_CHARS = 120
MAX_OP_CHARS = 1500
MAX_CARRIERS = 4
#: Names listed by a region summary before ``+N more``.
MAX_SUMMARY_NAMES = 24
ELISION = "…"

_OP_NAME = re.compile(r'^(?:%[^=]*= )?"([^"]+)"')
_LONG_STRING = re.compile(r'"((?:[^"\\]|\\.){%d,})"' % (MAX_STRING_CHARS + 1))


def op_lines(text: str) -> list[tuple[str, str, str | None]]:
    """(name, head, tail) of every op of a generic-form printout, in pre-order: ``head``
    its first line, ``tail`` the line closing its regions (``}) {attrs} : types``) or
    None when it has none. The top op (the module) is the first."""
    found: list[tuple[str, str, str | None]] = []
    open_ops: list[int] = []  # positions in ``found`` of the ops whose regions are open
    in_resources = False
    for raw in text.splitlines():
        line = raw.strip()
        if in_resources:
            in_resources = not line.startswith("#-}")
            continue
        if line.startswith("{-#"):
            in_resources = not line.endswith("#-}")
            continue
        if not line or line.startswith(("//", "^", "#")):
            continue
        if line[0] == "}":
            if not line.startswith("}, {"):  # not the next region of the same op
                position = open_ops.pop()
                name, head, _ = found[position]
                found[position] = (name, head, line)
            continue
        match = _OP_NAME.match(line)
        if match is None:
            continue
        found.append((match[1], line, None))
        if line.endswith("({"):
            open_ops.append(len(found) - 1)
    return found


def op_text(head: str, tail: str | None, summary: str) -> str:
    """One op's text: regions as ``{...}``, long strings and long texts cut."""
    text = head if tail is None else f"{head[:-2]}({{...}}{tail[1:]}"
    text = _LONG_STRING.sub(lambda m: f'"{m[1][:MAX_STRING_CHARS // 2]}{ELISION}"', text)
    if len(text) > MAX_OP_CHARS:
        text = text[:MAX_OP_CHARS] + ELISION
    return f"{text}\n  // regions: {summary}" if summary else text


def region_summary(op: ir.Operation, tree: OpTree) -> str:
    """The names of the ops directly inside ``op``'s regions (repeats as ``name ×n``),
    looking through single-op wrappers (an executable's variant, its inner module)."""
    children = _without_end(tree.children(op))
    for _ in range(4):
        if len(children) != 1 or not children[0].regions:
            break
        children = [children[0], *_without_end(tree.children(children[0]))]
        if len(children) > 2:
            break
    if not children:
        return ""
    runs: list[list[Any]] = []
    for child in children:
        name = child.name
        if runs and runs[-1][0] == name:
            runs[-1][1] += 1
        else:
            runs.append([name, 1])
    names = [name if count == 1 else f"{name} ×{count}" for name, count in runs]
    more = len(names) - MAX_SUMMARY_NAMES
    return ", ".join(names[:MAX_SUMMARY_NAMES]) + (f", +{more} more" if more > 0 else "")


def _without_end(ops: list[ir.Operation]) -> list[ir.Operation]:
    """``ops`` less a trailing bare terminator (``hal.executable_end``, ``flow.return``
    stays: it has operands)."""
    if ops and not ops[-1].regions and not len(ops[-1].operands) and ops[-1].name.endswith(("_end", ".end")):
        return ops[:-1]
    return ops


@dataclass
class StageIR:
    """The carriers' texts of one compile, stage by stage (see the module doc)."""

    texts: list[str] = field(default_factory=list)
    carriers: list[list[int]] = field(default_factory=list)
    stages: dict[str, dict[str, int]] = field(default_factory=dict)
    unrecorded: dict[str, str] = field(default_factory=dict)
    time_s: float = 0.0
    _text_index: dict[str, int] = field(default_factory=dict)
    _carrier_index: dict[tuple[int, ...], int] = field(default_factory=dict)

    def begin(self, module: ir.Operation, stage: str, tree: OpTree) -> "StageRecording":
        """Print ``module`` once; the snapshot's walk then hands every op to the returned
        recording in pre-order (:meth:`StageRecording.visit`) and calls ``finish``."""
        start = time.perf_counter()
        # Local scope: attributes inline, not as aliases (``#map``) whose definitions a
        # text on its own would lack; it is also how iree-compile prints its output.
        printed = module.get_asm(print_generic_op_form=True, use_local_scope=True, large_elements_limit=ELIDE_ELEMENTS,
                                 large_resource_limit=ELIDE_ELEMENTS, assume_verified=True)
        recording = StageRecording(self, stage, tree, op_lines(printed))
        if not recording.lines or recording.lines[0][0] != module.name:
            recording.fail(f"the printout starts with {recording.lines[0][0] if recording.lines else 'nothing'}, "
                           f"not {module.name}")
        recording.time_s = time.perf_counter() - start
        return recording

    def _text(self, text: str) -> int:
        found = self._text_index.get(text)
        if found is None:
            found = self._text_index[text] = len(self.texts)
            self.texts.append(text)
        return found

    def _carrier_list(self, count: int, texts: list[int]) -> int:
        key = (count, *texts)
        found = self._carrier_index.get(key)
        if found is None:
            found = self._carrier_index[key] = len(self.carriers)
            self.carriers.append(list(key))
        return found

    def table(self, source_ids: Iterable[str]) -> dict[str, Any]:
        """The manifest's ``stage_ir`` table; ``stages[name]`` holds, for each of ``ids``,
        its carrier list (``-1``: no op carries it). Integer rows are comma-separated
        strings: the manifest is indented JSON, which gives every list item its own line
        (read them back with :func:`dfit_mlir.core.stage_ir_table.read_table`)."""
        ids = list(source_ids)
        return {
            "version": TABLE_VERSION,
            "form": "generic",
            "limits": {"elements": ELIDE_ELEMENTS, "string_chars": MAX_STRING_CHARS, "op_chars": MAX_OP_CHARS,
                       "carriers": MAX_CARRIERS},
            "ids": ids,
            "texts": pack_texts(self.texts),
            "carriers": [ints(entry) for entry in self.carriers],
            "stages": {stage: ints(by_id.get(item, -1) for item in ids) for stage, by_id in self.stages.items()},
            "unrecorded": dict(self.unrecorded),
            "time_s": round(self.time_s, 6),
        }


@dataclass
class StageRecording:
    """One stage being recorded: the printout's op lines, matched to the walk's ops by
    position (see the module doc)."""

    owner: StageIR
    stage: str
    tree: OpTree
    lines: list[tuple[str, str, str | None]]
    position: int = 0
    failed: str | None = None
    time_s: float = 0.0
    shown: dict[str, list[int]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    def fail(self, why: str) -> None:
        self.failed = self.failed or why

    def visit(self, op: ir.Operation, name: str, ids: tuple[str, ...], around: frozenset[str]) -> frozenset[str]:
        """The next op of the pre-order walk, its name and the source IDs its location
        names; ``around``: the IDs ops around it carry. Returns what its children get."""
        if self.failed:
            return around
        self.position += 1
        if self.position >= len(self.lines) or self.lines[self.position][0] != name:
            found = self.lines[self.position][0] if self.position < len(self.lines) else "the end"
            self.fail(f"op {self.position} of the walk is {name}, of the printout {found}")
            return around
        if not ids or name in CONTAINER_KINDS:
            return around
        counts = self.counts
        for item in ids:
            counts[item] = counts.get(item, 0) + 1
        new = [item for item in ids if item not in around]
        if not new:
            return around
        wanting = [self.shown.setdefault(item, []) for item in new]
        if any(len(listed) < MAX_CARRIERS for listed in wanting):
            _, head, tail = self.lines[self.position]
            text = self.owner._text(op_text(head, tail, region_summary(op, self.tree) if tail else ""))
            for listed in wanting:
                if len(listed) < MAX_CARRIERS and text not in listed:
                    listed.append(text)
        return around.union(new)

    def finish(self) -> None:
        """Keep the stage, or say why not (``time_s``: printing and reading the printout;
        the visits count in the snapshot's own time)."""
        if not self.failed and self.position != len(self.lines) - 1:
            self.fail(f"the walk has {self.position} ops, the printout {len(self.lines) - 1}")
        owner = self.owner
        if self.failed:
            owner.unrecorded[self.stage] = self.failed
        else:
            owner.stages[self.stage] = {item: owner._carrier_list(self.counts[item], texts)
                                        for item, texts in self.shown.items()}
        owner.time_s += self.time_s
