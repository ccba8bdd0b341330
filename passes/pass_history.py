"""Pass-level lineage: which compiler pass changed the lineage class of each source ID.

dfit's per-phase lineage (:mod:`dfit_mlir.core.lineage`) says, after each of IREE's phases,
whether a source ID is preserved, fused, split or erased. This module answers the next
question — *which pass* inside the phase did it — without keeping whole modules in memory.

How it observes (read-only: nothing here changes the IR or the pipeline IREE runs):

* Each phase runs as ``iree-compile --compile-from/--compile-to`` with MLIR's own IR
  printing: ``--mlir-print-ir-after-all --mlir-print-ir-after-change`` (a pass that did
  not change its IR unit prints nothing) and ``--mlir-print-ir-tree-dir``, which writes one
  file per (IR unit, pass): ``<dir>/<op path>/<pipeline position>_<pass argument>.mlir``.
  The print flags are process-wide options of the compiler library that can be parsed once
  per process, so they cannot be set on the in-process session: this mode always uses the
  subprocess phase driver. The files are printed in the generic op form with local-scope
  locations, read one at a time and deleted.
* Function-scope passes that MLIR runs in parallel write to different IR units' files.
  MLIR names a dump ``<c_1>_…_<c_n>_<pass>``: ``c_n`` counts the unit's own dumps, each
  ``c_i`` before it its ancestor's dumps so far, which orders every dump against its
  ancestors' (:func:`ordered_dumps`). Passes on different IR units touch disjoint ops, so
  the order between them does not change any class: no single-threading is needed.
* Besides class changes, a row records when a pass puts an ID into a dispatch region
  (``flow.dispatch.region`` / ``workgroups``): the region's root IDs, in ``dispatch``.
* The state is the per-phase snapshot's: for every op, the source IDs its location names
  (:func:`dfit_mlir.core.locations.dfit_ids`), kept per IR unit. A dump of unit ``U`` replaces
  the ops of ``U`` and of every unit inside it. After each dump the classes of the IDs it
  touched are recomputed with the snapshot's rule (:class:`StageFigures` semantics:
  erased / split / fused / preserved over the whole module); each change is one row.
* The state at a phase's start is read from the module dfit holds between phases:
  iree-compile's own output of the phase before (printed with the same flags as the dumps),
  or, where dfit changed the module since, a printout of it; so dfit's own insertions
  between phases never show as a pass's change.
* Cost (the dumps of a model run to tens of MB): a module-level pass reprints every
  function and executable but changes few. Each IR unit a module printout lists is
  digested (SSA names left out: the printer numbers values across the module) and only
  those whose digest differs from the one the state was read from are scanned
  (:func:`module_children`). One-line ops without a ``dfit:`` ID are skipped unparsed. And
  the replay runs on a thread of its own (:class:`PhaseReplayer`), phase by phase, while
  dfit goes on with the next phase's compile: what the compile waits for at its end is
  recorded (``replay_s`` in the table).
* IREE's const-eval compiles a scratch module it builds inside the module and erases
  within its own pass; dumps under a module the state does not hold are not replayed and
  are counted in ``scratch_units`` (:meth:`PassHistory._scratch_module`).

Records are one row per (ID, pass that changed its class or region): see :class:`PassChange` and the
manifest's ``pass_history`` table (:func:`to_table`). Agreement with the per-phase classes
is checked on every compile: the last change of an ID within a phase gives its class at
that phase (:func:`check_against_stages`).
"""

from __future__ import annotations

import hashlib
import queue
import re
import shutil
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dfit_mlir.core import locations
from dfit_mlir.core.errors import CompileError
from dfit_mlir.core.lineage import CLASS_LETTERS, CONTAINER_KINDS, StageFigures

#: The printing flags of one observed phase; the tree directory is added per phase.
PRINT_FLAGS = (
    "--mlir-print-ir-after-all",
    "--mlir-print-ir-after-change",
    "--mlir-print-debuginfo",
    "--mlir-print-local-scope",
    "--mlir-print-op-generic",
    # No --mlir-elide-elementsattrs-if-larger / --mlir-elide-resource-strings-if-larger:
    # iree-compile applies them to the bytecode it writes as well, and the next phase then
    # lacks the weights. So dumps print constants in full (the reader skips over them):
    # this mode's cost grows with the weights that module-level passes reprint.
)
TABLE_VERSION = 1
TABLE_COLUMNS = ("id", "pass", "from", "to", "with", "kinds_before", "kinds_after", "dispatch")

_QUOTED = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_FILE_LINE_COL = re.compile(r":(\d+):(\d+)(?: to (?:\d+)?:\d+)?")
_DUMP_NAME = re.compile(r"^((?:\d+_)+)(.+)\.mlir$")
_SYM_NAME = re.compile(r'sym_name = "((?:[^"\\]|\\.)*)"')
_OP_NAME = re.compile(r'^(?:%[^=]*= )?"([^"]+)"')
_LETTER = {letter: name for name, letter in CLASS_LETTERS.items()}


# --------------------------------------------------------------------------- locations


def parse_loc(text: str) -> locations.Loc:
    """A location as MLIR prints it with local scope (``loc(...)`` or its inside)."""
    text = text.strip()
    if text.startswith("loc(") and text.endswith(")"):
        text = text[4:-1]
    loc, _ = _parse_loc_at(text, 0)
    return loc


def _skip_string(text: str, pos: int) -> int:
    """Index after the quoted string starting at ``pos``."""
    return _QUOTED.match(text, pos).end()  # type: ignore[union-attr]


def _string(text: str, pos: int) -> tuple[str, int]:
    end = _skip_string(text, pos)
    raw = text[pos + 1 : end - 1]
    return (raw.replace('\\"', '"').replace("\\\\", "\\") if "\\" in raw else raw), end


def _parse_loc_at(text: str, pos: int) -> tuple[locations.Loc, int]:
    if text.startswith("unknown", pos):
        return locations.UNKNOWN, pos + len("unknown")
    if text.startswith("callsite(", pos):
        callee, pos = _parse_loc_at(text, pos + len("callsite("))
        assert text.startswith(" at ", pos), text[pos : pos + 20]
        caller, pos = _parse_loc_at(text, pos + 4)
        return locations.CallSiteLoc(callee, caller), pos + 1  # ")"
    if text.startswith("fused", pos):
        pos += len("fused")
        if text[pos] == "<":  # metadata: fused<#attr>[...]
            depth = 0
            while True:
                depth += {"<": 1, ">": -1}.get(text[pos], 0)
                pos += 1
                if depth == 0:
                    break
        pos += 1  # "["
        items: list[locations.Loc] = []
        while text[pos] != "]":
            item, pos = _parse_loc_at(text, pos)
            items.append(item)
            if text.startswith(", ", pos):
                pos += 2
        return locations.FusedLoc(tuple(items)), pos + 1
    if text[pos] == '"':
        name, pos = _string(text, pos)
        if text.startswith(":", pos):  # "file":line:col [to line:col]
            match = _FILE_LINE_COL.match(text, pos)
            assert match, text[pos : pos + 30]
            return locations.FileLoc(name, int(match[1]), int(match[2])), match.end()
        if text.startswith("(", pos):
            child, pos = _parse_loc_at(text, pos + 1)
            child = None if child == locations.UNKNOWN else child
            return locations.NameLoc(name, child), pos + 1
        return locations.NameLoc(name, None), pos
    raise ValueError(f"unexpected location text at {pos}: {text[pos:pos + 40]!r}")


def _trailing_loc(line: str) -> str | None:
    """The location an op line ends with, or None."""
    at = line.rfind(" loc(")
    return line[at + 1 :] if at >= 0 and line.endswith(")") else None


# --------------------------------------------------------------------------- IR units


#: One op of a printout: (kind, the source IDs its location names, the IDs of the dispatch
#: region holding it or ()). A plain tuple, so a unit's op list compares at C speed when a
#: dump leaves it unchanged.
OpRecord = tuple[str, tuple[str, ...], tuple[str, ...]]
#: Dispatch regions before outlining (as :mod:`dfit_mlir.passes.snapshot` knows them).
REGION_KINDS = frozenset({"flow.dispatch.region", "flow.dispatch.workgroups"})


#: Ops with regions but no symbol that the pass manager still nests on.
UNIT_KINDS = frozenset({"builtin.module", "util.initializer", "vm.initializer"})


def unit_component(kind: str, symbol: str | None) -> str:
    """How ``--mlir-print-ir-tree-dir`` names the directory of an IR unit."""
    return f"{kind.replace('.', '_')}_{symbol if symbol else 'no-symbol-name'}"


def scan_ops(text: str, root: tuple[str, ...], id_cache: dict[str, tuple[str, ...]]) -> dict[tuple[str, ...], list[OpRecord]]:
    """The ops of a generic-form printout, grouped by the IR unit that holds them.

    ``root`` is the tree path of the printout's top op, which is itself an IR unit. An IR
    unit is what the pass manager nests on: a module, a function-like op, or an op with
    regions and a symbol (executables, variants). Every unit opened is a key, a module's
    with no ops of its own (modules are containers) too. A unit's own op is kept with the
    unit, so replacing a unit replaces it too. Ops end where their location is printed: on
    their own line, or on the line closing their last region (``}) … loc(…)``). One-line
    ops whose location names no ``dfit:`` ID are left out: they carry no ID, so they
    cannot change a class, and most ops of lowered code are such."""
    units: dict[tuple[str, ...], list[OpRecord]] = defaultdict(list)
    # Open ops with regions: (kind, the unit their contents belong to, whether they are it,
    # for a dispatch region the index in its unit's list where its ops start, else -1).
    stack: list[tuple[str, tuple[str, ...], bool, int]] = []
    siblings: Counter = Counter()  # (parent, component): units named alike (no symbol)
    resources = text.find("\n{-#")  # the resource block closes a printout: nothing to read
    for raw in (text if resources < 0 else text[:resources]).split("\n"):
        line = raw.lstrip()
        if not line:
            continue
        first = line[0]
        if first == "}":
            if line.startswith("}, {"):
                continue  # the next region of the same op
            kind, inner, is_unit, start = stack.pop()
            owner = inner if is_unit else (stack[-1][1] if stack else root)
            ids = _record(units, owner, kind, _trailing_loc(line), id_cache)
            if start >= 0:
                _enclose(units[owner], start, ids)
            continue
        if first != '"' and first != "%":
            continue  # block labels, comments, aliases
        if not line.endswith("({"):
            if "dfit:" in line:
                match = _OP_NAME.match(line)
                if match is not None:
                    _record(units, stack[-1][1] if stack else root, match[1], _trailing_loc(line), id_cache)
            continue
        match = _OP_NAME.match(line)
        if match is None:
            continue
        kind = match[1]
        if not stack:
            stack.append((kind, root, True, -1))
            units[root]  # noqa: B018 - known as a unit even with no ops of its own
        elif kind in UNIT_KINDS or "sym_name = " in line:
            symbol = _SYM_NAME.search(line)
            parent = stack[-1][1]
            component = unit_component(kind, symbol[1] if symbol else None)
            seen = siblings[parent, component]
            siblings[parent, component] += 1
            path = (*parent, component if not seen else f"{component}#{seen}")
            stack.append((kind, path, True, -1))
            units[path]  # noqa: B018
        else:
            unit = stack[-1][1]
            stack.append((kind, unit, False, len(units[unit]) if kind in REGION_KINDS else -1))
    return units


#: A line opening one op of a top op's region: two spaces in, neither a closing brace nor
#: the label of a block (printed two spaces less than its ops).
_CHILD_LINE = re.compile(r"\n  [^ }^]")


@dataclass(frozen=True, slots=True)
class _Child:
    """One op of a module printout's body: its text and, for an IR unit, its tree path."""

    text: str
    path: tuple[str, ...] | None  # None: an op of the module unit itself (no IR unit)


def module_children(body: str, root: tuple[str, ...]) -> list[_Child] | None:
    """The ops of a ``builtin.module`` printout's body, each with its text, or None where
    the printout is not laid out as expected (then it is scanned whole).

    A module-level pass reprints every function and executable, but most such passes change
    one of them: cut at the body's top-level op lines, each IR unit's text can be compared
    with the one last seen at its path, and only those that differ are scanned."""
    if not body.startswith('"builtin.module"'):
        return None
    close = body.find("\n}")  # the module's own closing line (strings hold no newlines)
    if close < 0:
        return None
    starts = [match.start() + 1 for match in _CHILD_LINE.finditer(body, 0, close)]
    if not starts or body.count("\n", 0, starts[0]) != 1:
        return None  # something between the module's line and its first op
    ends = [*starts[1:], close + 1]
    siblings: Counter = Counter()
    children = []
    for start, end in zip(starts, ends, strict=True):
        text = body[start:end]
        first = text.split("\n", 1)[0]
        match = _OP_NAME.match(first[2:])
        if match is None:
            return None
        kind = match[1]
        if not first.endswith("({"):
            if text.count("\n") != 1:
                return None  # an op printed on more than one line: not the expected layout
            children.append(_Child(text, None))
            continue
        if kind not in UNIT_KINDS and "sym_name = " not in first:
            # A region op that is no IR unit (iree_codegen.dispatch_config): its ops belong
            # to the module's own.
            children.append(_Child(text, None))
            continue
        symbol = _SYM_NAME.search(first)
        component = unit_component(kind, symbol[1] if symbol else None)
        seen = siblings[component]
        siblings[component] += 1
        children.append(_Child(text, (*root, component if not seen else f"{component}#{seen}")))
    return children


_DIGEST_BYTES_PER_LINE = 400
_SSA_NAME = re.compile(r"%[\w$.-]+")
#: Every quoted string, captured only where it holds a ``%`` (so few are copied). Each
#: match consumes a whole string, so the next starts at an opening quote.
_QUOTED_PERCENT = re.compile(r'"[^"\\%]*(?:\\[^%][^"\\%]*)*"|("[^"\\]*(?:\\.[^"\\]*)*")')


def _digest(text: str) -> bytes:
    """A digest of an IR unit's printout that ignores SSA names: the printer numbers values
    across the whole module, so one function that gains a value renames every later one.
    The text is digested without SSA names, and its quoted strings that hold a ``%`` in
    full (a ``%`` in a location or symbol is kept): nothing the replay reads (op kinds, locations, symbols,
    the lines) is lost, so two printouts with one digest scan alike."""
    digest = hashlib.blake2b(_SSA_NAME.sub("", text).encode("utf-8", "surrogatepass"), digest_size=16)
    digest.update("\0".join(_QUOTED_PERCENT.findall(text)).encode("utf-8", "surrogatepass"))
    return digest.digest()


def _record(units: dict, unit: tuple[str, ...], kind: str, loc_text: str | None,
            id_cache: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
    ids: tuple[str, ...] = ()
    if loc_text is not None and "dfit:" in loc_text:
        ids = id_cache.get(loc_text)  # type: ignore[assignment]
        if ids is None:
            ids = id_cache[loc_text] = locations.dfit_ids(parse_loc(loc_text))
    if kind not in CONTAINER_KINDS:
        units[unit].append((kind, ids, ()))
    return ids


def _enclose(ops: list[OpRecord], first: int, region: tuple[str, ...]) -> None:
    """Mark the ops of a dispatch region whose own op was just recorded, last in ``ops``
    (the innermost region wins)."""
    for index in range(first, len(ops) - 1):
        kind, ids, inside = ops[index]
        if not inside:
            ops[index] = (kind, ids, region)


# --------------------------------------------------------------------------- the replay


@dataclass(frozen=True, slots=True)
class PassChange:
    """One source ID whose class one pass changed."""

    id: str
    pass_name: str
    pass_index: int
    phase: str
    unit: str
    before: str  # class letter: p f s e
    after: str
    with_ids: tuple[str, ...]  # the other IDs on the op carrying it (fused)
    kinds_before: tuple[str, ...]
    kinds_after: tuple[str, ...]
    dispatch: tuple[str, ...] = ()  # root IDs of the dispatch region the pass put it in


@dataclass
class _Totals:
    """Module-wide carriers, maintained incrementally as units are replaced."""

    carriers: Counter = field(default_factory=Counter)
    fused: Counter = field(default_factory=Counter)  # ops carrying the ID with others
    kinds: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    regions: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))

    def apply(self, ops: Iterable[OpRecord], sign: int) -> None:
        carriers, fused, kinds, regions = self.carriers, self.fused, self.kinds, self.regions
        for kind, ids, region in ops:
            if not ids:
                continue
            shared = len(ids) > 1
            for item in ids:
                carriers[item] += sign
                kinds[item][kind] += sign
                if shared:
                    fused[item] += sign
                if region:
                    regions[item][region] += sign

    def letter(self, item: str) -> str:
        count = self.carriers[item]
        if count <= 0:
            return "e"
        if count > 1:
            return "s"
        return "f" if self.fused[item] > 0 else "p"

    def kinds_of(self, item: str) -> tuple[str, ...]:
        return _kinds(self.kinds.get(item, {}))

    def region_of(self, item: str) -> tuple[str, ...]:
        """The root IDs of the dispatch regions holding the ID's ops, joined."""
        found = self.regions.get(item)
        return tuple(sorted({root for region, n in found.items() if n > 0 for root in region})) if found else ()


def _kinds(counts: dict[str, int]) -> tuple[str, ...]:
    """The op kinds carrying an ID, once per carrier, sorted."""
    return tuple(sorted(kind for kind, n in counts.items() for _ in range(n)))


class PassHistory:
    """Replays one compile's pass dumps over the per-unit state and records changes."""

    def __init__(self) -> None:
        self.units: dict[tuple[str, ...], list[OpRecord]] = {}
        self.totals = _Totals()
        self.changes: list[PassChange] = []
        self.pass_runs = 0  # dumps read (passes that changed some IR unit)
        self.unresolved: list[str] = []  # dumps of IR units the state did not hold
        # Dumps of scratch modules (path → count): see _scratch_module.
        self.scratch: Counter = Counter()
        self.replay_s = 0.0  # time spent replaying (on the replay thread)
        self.waited_s = 0.0  # time the compile waited for the replay to finish
        self._ids: dict[str, tuple[str, ...]] = {}
        self._root: tuple[str, ...] = ()
        # Tree path → digest of the text the state of that IR unit (and all inside it) was
        # last read from, for the units a module printout lists: see module_children.
        self._digests: dict[tuple[str, ...], bytes] = {}

    def reset(self, module_text: str) -> None:
        """The state at a phase's start: the module as dfit holds it."""
        top = _OP_NAME.match(module_text.lstrip())
        symbol = _SYM_NAME.search(module_text.split("\n", 1)[0])
        self._root = (unit_component(top[1] if top else "builtin.module", symbol[1] if symbol else None),)
        self.units, self._digests = {}, {}
        units, digests = self._scan(module_text.lstrip(), self._root)
        self.units = dict(units)
        self._digests = digests
        self.totals = _Totals()
        for ops in self.units.values():
            self.totals.apply(ops, +1)

    def observe_phase(self, phase: str, tree: Path) -> None:
        """Read (and delete) one phase's dumps in the order the passes ran."""
        for path, pass_name in ordered_dumps(tree):
            self.observe_dump(phase, tree, path, pass_name)

    def observe_dump(self, phase: str, tree: Path, path: Path, pass_name: str) -> None:
        """Read (and delete) one dump of ``tree``: the IR unit at its path after ``pass_name``."""
        where = tuple(path.parent.relative_to(tree).parts)
        scratch = self._scratch_module(where)
        if scratch is not None:
            path.unlink()  # not read: passes on a copy the pass that made it then erases
            self.scratch[scratch] += 1
            self.pass_runs += 1
            return
        text = path.read_text(encoding="utf-8", errors="replace")
        path.unlink()
        body = text.split("\n", 1)[1] if text.startswith("//") else text
        unit = self._resolve(where, body)
        units, digests = self._scan(body, unit)
        self._replace(unit, units, pass_name, phase)
        # The units inside or around ``unit`` now hold what this dump printed: earlier
        # digests of them no longer describe the state.
        width = len(unit)
        for key in [key for key in self._digests if key[:width] == unit or unit[: len(key)] == key]:
            del self._digests[key]
        self._digests.update(digests)
        self.pass_runs += 1

    def _scan(self, body: str, unit: tuple[str, ...]) -> tuple[dict, dict[tuple[str, ...], bytes]]:
        """The ops of a printout of ``unit`` grouped by IR unit, and the digests of the IR
        units a module printout lists. Those whose text has the digest the state was read
        from are taken from the state, not scanned again."""
        children = module_children(body, unit)
        if children is None:
            return scan_ops(body, unit, self._ids), {}
        width = len(unit)
        held: dict[str, list[tuple[str, ...]]] = defaultdict(list)  # child component → state keys
        for key in self.units:
            if len(key) > width and key[:width] == unit:
                held[key[width]].append(key)
        units: dict[tuple[str, ...], list[OpRecord]] = defaultdict(list)
        units[unit]  # noqa: B018 - as scan_ops: the module is a unit
        digests: dict[tuple[str, ...], bytes] = {}
        # With one IR unit in the printout, the pass that printed it most likely changed it:
        # no digest to keep.
        digesting = sum(child.path is not None for child in children) > 1
        for child in children:
            if child.path is None:
                own = scan_ops(child.text, unit, self._ids)
                if own.keys() - {unit}:  # an IR unit inside an op of the module: scan it whole
                    return scan_ops(body, unit, self._ids), {}
                if own:
                    units[unit].extend(own[unit])
                continue
            # Scanning costs by the line, digesting by the byte: a unit of long lines (inline
            # constants) is scanned sooner than digested.
            if digesting and len(child.text) < _DIGEST_BYTES_PER_LINE * child.text.count("\n"):
                digest = digests[child.path] = _digest(child.text)
                if self._digests.get(child.path) == digest:
                    for key in held.get(child.path[-1], ()):
                        units[key] = self.units[key]
                    continue
            units.update(scan_ops(child.text, child.path, self._ids))
        return units, digests

    def _scratch_module(self, path: tuple[str, ...]) -> str | None:
        """The module a dump's path runs through that the module being compiled does not
        hold, or None. IREE's const-eval (``iree-consteval-jit-globals``) builds a scratch
        module inside the module, runs a whole compile pipeline on it to evaluate
        initializers, and erases it before its own pass ends: the dumps of those passes show
        copies of the initializers' ops, not the module's, so they change no ID's history.
        The pass's own dump then shows the module without it, with the evaluated constants.
        (The state knows every IR unit it was read with, modules with no ops of their own
        too, so a module it lacks was made after the last dump of the unit around it.)"""
        for end in range(2, len(path) + 1):
            if path[end - 1].startswith("builtin_module_") and path[:end] not in self.units:
                return "/".join(path[:end])
        return None

    def _resolve(self, path: tuple[str, ...], body: str) -> tuple[str, ...]:
        """The state's key of the IR unit a dump prints: its tree path, unless unnamed
        siblings share it (two initializers, say): then the one holding the dump's nested
        symbols, else the most of its IDs."""
        if path in self.units or len(path) == 1:
            return path
        candidates = [key for key in self.units
                      if len(key) == len(path) and key[:-1] == path[:-1] and key[-1].split("#")[0] == path[-1]]
        if len(candidates) == 1:
            return candidates[0]
        if not candidates:
            self.unresolved.append("/".join(path))
            return path
        for name in _SYM_NAME.findall(body.lstrip().split("\n", 1)[-1][:100_000]):
            suffix = f"_{name}"
            for key in candidates:
                if any(other[: len(key)] == key and len(other) > len(key) and other[len(key)].endswith(suffix)
                       for other in self.units):
                    return key
        ids = {item for ops in scan_ops(body, candidates[0], self._ids).values() for _, op_ids, _ in ops for item in op_ids}
        return max(candidates, key=lambda key: len(ids.intersection(
            item for other, ops in self.units.items() if other[: len(key)] == key for _, op_ids, _ in ops for item in op_ids)))

    def _replace(self, unit: tuple[str, ...], new_units: dict, pass_name: str, phase: str) -> None:
        width = len(unit)
        old_keys = [key for key in self.units if key[:width] == unit]
        # Only units whose ops differ are re-applied: a module-level dump reprints much
        # that the pass did not touch.
        changed_old = [key for key in old_keys if not _same(new_units.get(key), self.units[key])]
        changed_new = [key for key in new_units if not _same(self.units.get(key), new_units[key])]
        if not changed_old and not changed_new:
            return
        touched: set[str] = set()
        for key in changed_old:
            for _, ids, _ in self.units[key]:
                touched.update(ids)
        for key in changed_new:
            for _, ids, _ in new_units[key]:
                touched.update(ids)
        totals = self.totals
        kinds = totals.kinds
        before = {item: (totals.letter(item), dict(kinds.get(item, ())), totals.region_of(item)) for item in touched}
        for key in changed_old:
            self.totals.apply(self.units.pop(key), -1)
        for key in old_keys:
            if key not in new_units:
                self.units.pop(key, None)
        for key in changed_new:
            self.units[key] = new_units[key]
            self.totals.apply(new_units[key], +1)
        label = "/".join(unit)
        for item in sorted(touched):
            old_letter, old_kinds, old_region = before[item]
            new_letter, new_region = totals.letter(item), totals.region_of(item)
            entered = new_region if new_region and new_region != old_region else ()
            if new_letter != old_letter or entered:
                partners = self._partners(item, new_units) if new_letter == "f" else ()
                self.changes.append(PassChange(item, pass_name, self.pass_runs, phase, label, old_letter,
                                               new_letter, partners, _kinds(old_kinds), totals.kinds_of(item), entered))

    def _partners(self, item: str, recent: dict) -> tuple[str, ...]:
        """The other IDs on the one op that carries ``item`` (looked up in the dump just
        read first: that is where a fusion happens)."""
        for units in (recent, self.units):
            for ops in units.values():
                for _, ids, _ in ops:
                    if item in ids and len(ids) > 1:
                        return tuple(other for other in ids if other != item)
        return ()



def _same(old: list[OpRecord] | None, new: list[OpRecord] | None) -> bool:
    return old is new or old == new


def ordered_dumps(tree: Path) -> list[tuple[Path, str]]:
    """The dump files of one pipeline run, in the order the passes ran.

    MLIR names a dump ``<c_1>_…_<c_n>_<pass>.mlir``: ``c_n`` counts the dumps of the IR
    unit itself, each ``c_i`` before it the count (from 0) of its ancestor's dumps at that
    moment. So a dump with ancestor count ``k`` came after that ancestor's dump ``k`` and
    before its dump ``k + 1``: the sort key interleaves ``(c_1, 1, c_2, 1, …, c_n, 0)``."""
    found = []
    for path in tree.rglob("*.mlir"):
        match = _DUMP_NAME.match(path.name)
        if match is None:
            continue
        counts = [int(part) for part in match[1].rstrip("_").split("_")]
        key: list[int] = []
        for count in counts[:-1]:
            key += [count, 1]
        key += [counts[-1], 0]
        found.append((tuple(key), path, match[2]))
    found.sort(key=lambda item: item[0])
    return [(path, name) for _, path, name in found]


# --------------------------------------------------------------------------- results


def check_against_stages(history: Sequence[PassChange], stages: Sequence[StageFigures],
                         source_ids: Sequence[str], phases: Sequence[str]) -> list[str]:
    """IDs whose replayed class at the end of a phase differs from the snapshot's, as
    ``"<phase> <id>: passes say X, snapshot says Y"``; empty when all agree."""
    by_stage = {figures.stage: figures for figures in stages}
    current = {item: by_stage["source"].classify(item) if "source" in by_stage else "preserved" for item in source_ids}
    letters = {item: CLASS_LETTERS[kind] for item, kind in current.items()}
    by_phase: dict[str, list[PassChange]] = defaultdict(list)
    for change in history:
        by_phase[change.phase].append(change)
    problems: list[str] = []
    for phase in phases:
        if phase not in by_stage:
            continue
        for change in by_phase.get(phase, ()):
            letters[change.id] = change.after
        figures = by_stage[phase]
        for item in source_ids:
            expected = CLASS_LETTERS[figures.classify(item)]
            if letters.get(item) != expected:
                problems.append(f"{phase} {item}: passes say {letters.get(item)}, snapshot says {expected}")
                letters[item] = expected  # report each divergence once
    return problems


def to_table(history: Sequence[PassChange], *, threads: str) -> dict[str, Any]:
    """The manifest's compact ``pass_history``: passes listed once, one row per change."""
    passes: list[dict[str, Any]] = []
    seen: dict[int, int] = {}
    rows = []
    for change in history:
        slot = seen.get(change.pass_index)
        if slot is None:
            slot = seen[change.pass_index] = len(passes)
            passes.append({"index": change.pass_index, "name": change.pass_name, "phase": change.phase, "unit": change.unit})
        rows.append([change.id, slot, change.before, change.after, list(change.with_ids),
                     list(change.kinds_before), list(change.kinds_after), list(change.dispatch)])
    return {"version": TABLE_VERSION, "observer": "mlir-print-ir-tree-dir (after change)",
            "threads": threads, "passes": passes, "columns": list(TABLE_COLUMNS), "rows": rows}


def from_table(table: dict[str, Any], source: str = "the manifest") -> list[PassChange]:
    """The rows of a manifest's ``pass_history`` as records; a row that does not read
    (a pass index past the table's passes, a missing value) is an InvalidInputError
    naming ``source`` and the row (``manifest.load`` refuses these already)."""
    from dfit_mlir.core.errors import InvalidInputError

    changes = []
    number = -1
    try:
        passes = table["passes"]
        columns = table["columns"]
        for number, row in enumerate(table["rows"]):  # noqa: B007 - the except below names it
            values = dict(zip(columns, row, strict=True))
            if not isinstance(values["pass"], int) or not 0 <= values["pass"] < len(passes):
                raise IndexError(f"names pass {str(values['pass'])[:40]}, the table lists {len(passes)} passes")
            run = passes[values["pass"]]
            changes.append(PassChange(values["id"], run["name"], run["index"], run["phase"], run["unit"],
                                      values["from"], values["to"], tuple(values["with"]),
                                      tuple(values["kinds_before"]), tuple(values["kinds_after"]),
                                      tuple(values.get("dispatch", ()))))
    except (KeyError, IndexError, TypeError, ValueError) as error:
        where = f"pass_history/rows/{number}" if number >= 0 else "pass_history"
        raise InvalidInputError(f"{source}: invalid manifest at {where}: {type(error).__name__}: "
                                f"{str(error)[:200]}") from None
    return changes


def class_name(letter: str) -> str:
    return _LETTER.get(letter, letter)


# --------------------------------------------------------------------------- the driver


def print_for_replay(module: Any) -> str:
    """The module as the dumps print it (generic form, local-scope locations)."""
    return module.get_asm(print_generic_op_form=True, enable_debug_info=True, use_local_scope=True,
                          large_elements_limit=8, large_resource_limit=16, assume_verified=True)


class PhaseReplayer:
    """Replays each phase's dumps on a thread of its own, in phase order, while dfit goes on
    with the next phase: the replay is Python, the compile is another process, so on a
    machine with a core to spare the replay hides under the compile of the next phase.

    A job names the phase's dump tree and where its start state is: the file iree-compile
    wrote for the phase before (printed with the same flags as the dumps) or a printout of
    the module dfit changed. Both are deleted once read."""

    def __init__(self, history: PassHistory):
        self.history = history
        self._jobs: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._cancel = threading.Event()
        self._thread = threading.Thread(target=self._work, name="dfit-pass-replay", daemon=True)
        self._thread.start()

    def submit(self, phase: str, tree: Path, start: Path | str) -> None:
        self._jobs.put((phase, tree, start))

    def wait(self) -> PassHistory:
        """The history once every phase submitted is replayed; a replay's error is raised here."""
        started = time.perf_counter()
        self._jobs.join()
        self.history.waited_s += time.perf_counter() - started
        if self._error is not None:
            raise self._error
        return self.history

    def drain(self) -> None:
        """Return once every phase submitted is replayed (an error is kept for :meth:`wait`)."""
        self._jobs.join()

    def stop(self) -> None:
        """Drop what is not replayed yet (after an error elsewhere, say) and end the thread."""
        self._cancel.set()
        self._jobs.put(None)
        self._thread.join()

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                if job is None:
                    return
                if self._error is None and not self._cancel.is_set():
                    started = time.perf_counter()
                    self._replay(*job)
                    self.history.replay_s += time.perf_counter() - started
            except BaseException as error:  # noqa: BLE001 - handed to the thread that waits
                self._error = error
            finally:
                if job is not None:
                    shutil.rmtree(job[1], ignore_errors=True)
                    if isinstance(job[2], Path):
                        job[2].unlink(missing_ok=True)
                self._jobs.task_done()

    def _replay(self, phase: str, tree: Path, start: Path | str) -> None:
        self.history.reset(start.read_text(encoding="utf-8", errors="replace") if isinstance(start, Path) else start)
        for path, pass_name in ordered_dumps(tree):
            if self._cancel.is_set():
                return
            self.history.observe_dump(phase, tree, path, pass_name)


#: Free space a memory file system needs to take the dumps (a phase's run to hundreds of MB
#: on models with inline weights; the replay deletes them as it goes).
DUMP_MEMORY_BYTES = 4 << 30


def dump_root(workdir: Path) -> Path:
    """Where iree-compile writes the dumps: a new directory in ``/dev/shm`` where that is a
    writable file system with room, else ``workdir``. The dumps are written once, read once
    and deleted, and on a disk file system creating and deleting thousands of files costs
    wall time the CPU figures do not show. (Named with this process's PID: a later compile
    removes it if this one is killed, :func:`dfit_mlir.passes.phases.remove_stale_folders`.)"""
    import os
    import tempfile

    from dfit_mlir.core import atomic
    from dfit_mlir.core.paths import private_prefix
    from dfit_mlir.passes.phases import DUMPS_PREFIX

    memory = Path("/dev/shm")
    try:
        stats = os.statvfs(memory)
        if stats.f_bavail * stats.f_frsize >= DUMP_MEMORY_BYTES and os.access(memory, os.W_OK):
            root = Path(tempfile.mkdtemp(prefix=private_prefix(DUMPS_PREFIX), dir=memory))
            atomic.LIVE_TEMPORARIES.add(root)  # removed on SIGINT/SIGTERM too
            return root
    except OSError:
        pass
    return workdir


#: How iree-compile says it could not write a dump (``--mlir-print-ir-tree-dir``): the
#: first two are printed and the compile goes on (exit 0, a history with holes: a full
#: ``/dev/shm``, no inodes left); the last ends it.
DUMP_WRITE_FAILURES = ("Error while creating directory ", "Error opening output file ")
DUMP_STREAM_FAILURE = "IO failure on output stream"


def dump_write_failure(stderr: str, tree: Path) -> str | None:
    """The first line of iree-compile's ``stderr`` saying a dump under ``tree`` was not
    written, or None."""
    for line in stderr.splitlines():
        if (line.startswith(DUMP_WRITE_FAILURES) and str(tree) in line) or DUMP_STREAM_FAILURE in line:
            return line.strip()[:500]
    return None


def observing_driver(flags: Sequence[str]):
    """A subprocess phase driver that records the pass history of every phase it runs."""
    from dfit_mlir.passes import phases

    class PassObservingDriver(phases.SubprocessDriver):
        name = "subprocess+passes"

        def __init__(self, flags: Sequence[str]):
            super().__init__(flags)
            self._replayer = PhaseReplayer(PassHistory())
            self._dumps = dump_root(self.workdir)

        @property
        def history(self) -> PassHistory:
            return self._replayer.wait()

        def run(self, module, after, to):  # noqa: ANN001 - the PhaseDriver protocol's types
            # The start state: iree-compile's own output of the phase before, unless dfit
            # changed the module since (then a printout of it, made now).
            held = self._written is not None and self._written[0] is module
            start = self._written[1] if held else print_for_replay(module)  # type: ignore[index]
            out = self.workdir / f"{to}.mlir"
            while True:
                tree = self._dumps / f"passes-{to}"
                try:
                    stderr = self._compile(module, after, [f"--compile-to={to}", *self.OUTPUT_FLAGS, *PRINT_FLAGS,
                                                           f"--mlir-print-ir-tree-dir={tree}"], out)
                    failure = dump_write_failure(stderr, tree)
                except CompileError as error:
                    failure = dump_write_failure(str(error), tree)
                    if failure is None:
                        shutil.rmtree(tree, ignore_errors=True)
                        raise
                except BaseException:
                    shutil.rmtree(tree, ignore_errors=True)
                    raise
                if failure is None:
                    break
                # A dump not written is a history with holes: never kept. Memory full: the
                # phase once more with its dumps on disk; the disk too: exit 3.
                shutil.rmtree(tree, ignore_errors=True)
                if self._dumps == self.workdir:
                    raise CompileError(f"iree-compile could not write the pass dumps of phase {to} to {tree}: "
                                       f"{failure} (the pass history would be incomplete; free space there or set "
                                       "TMPDIR to a folder with room)")
                print(f"dfit: note: iree-compile could not write the pass dumps of phase {to} to "
                      f"{self._dumps} ({failure}); writing them to {self.workdir} instead", file=sys.stderr)
                self._drop_memory_dumps(drain=True)
            self._replayer.submit(to, tree, start)
            self._written = None  # the replay deletes that file once read, not _parse_output
            return self._parse_output(out)

        def _drop_memory_dumps(self, drain: bool = False) -> None:
            """From now on the dumps go to the work folder (on disk); the memory one is removed
            (with ``drain``, once the replay has read the phases already in it)."""
            from dfit_mlir.core import atomic

            if self._dumps != self.workdir:
                if drain:
                    self._replayer.drain()
                shutil.rmtree(self._dumps, ignore_errors=True)
                atomic.LIVE_TEMPORARIES.discard(self._dumps)
                self._dumps = self.workdir

        def close(self) -> None:
            self._replayer.stop()
            self._drop_memory_dumps()
            super().close()

    return PassObservingDriver(flags)


def deciding_passes(table: dict[str, Any] | None) -> dict[tuple[str, str], PassChange]:
    """(ID, phase) → the last change of the ID's class in that phase: the pass whose
    result the phase's class is (``dfit diff`` names it when two compiles differ)."""
    found: dict[tuple[str, str], PassChange] = {}
    if table:
        for change in from_table(table):
            if change.before != change.after:
                found[change.id, change.phase] = change
    return found
