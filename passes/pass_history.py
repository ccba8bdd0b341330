"""Pass-level lineage: which compiler pass changed the lineage class of each source ID.

dfit's per-phase lineage (:mod:`dfit_mlir.lineage`) says, after each of IREE's phases,
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
  (:func:`dfit_mlir.locations.dfit_ids`), kept per IR unit. A dump of unit ``U`` replaces
  the ops of ``U`` and of every unit inside it. After each dump the classes of the IDs it
  touched are recomputed with the snapshot's rule (:class:`StageFigures` semantics:
  erased / split / fused / preserved over the whole module); each change is one row.
* The state at a phase's start is read from the module dfit holds between phases (printed
  the same way), so dfit's own insertions between phases never show as a pass's change.

Records are one row per (ID, pass that changed its class or region): see :class:`PassChange` and the
manifest's ``pass_history`` table (:func:`to_table`). Agreement with the per-phase classes
is checked on every compile: the last change of an ID within a phase gives its class at
that phase (:func:`check_against_stages`).
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dfit_mlir import locations
from dfit_mlir.lineage import CLASS_LETTERS, CONTAINER_KINDS, StageFigures

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
    pos += 1
    while text[pos] != '"':
        pos += 2 if text[pos] == "\\" else 1
    return pos + 1


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
            match = re.compile(r":(\d+):(\d+)(?: to (?:\d+)?:\d+)?").match(text, pos)
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
    regions and a symbol (executables, variants). A unit's own op is kept with the unit, so
    replacing a unit replaces it too. Ops end where their location is printed: on their own
    line, or on the line closing their last region (``}) … loc(…)``)."""
    units: dict[tuple[str, ...], list[OpRecord]] = defaultdict(list)
    # Open ops with regions: (kind, the unit their contents belong to, whether they are it,
    # for a dispatch region the index in its unit's list where its ops start, else -1).
    stack: list[tuple[str, tuple[str, ...], bool, int]] = []
    siblings: Counter = Counter()  # (parent, component): units named alike (no symbol)
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
            if line.startswith("}, {"):
                continue  # the next region of the same op
            kind, inner, is_unit, first = stack.pop()
            owner = inner if is_unit else (stack[-1][1] if stack else root)
            ids = _record(units, owner, kind, _trailing_loc(line), id_cache)
            if first >= 0:
                _enclose(units[owner], first, ids)
            continue
        match = _OP_NAME.match(line)
        if match is None:
            continue
        kind = match[1]
        if line.endswith("({"):
            if not stack:
                stack.append((kind, root, True, -1))
            elif kind in UNIT_KINDS or "sym_name = " in line:
                symbol = _SYM_NAME.search(line)
                parent = stack[-1][1]
                component = unit_component(kind, symbol[1] if symbol else None)
                seen = siblings[parent, component]
                siblings[parent, component] += 1
                stack.append((kind, (*parent, component if not seen else f"{component}#{seen}"), True, -1))
            else:
                unit = stack[-1][1]
                stack.append((kind, unit, False, len(units[unit]) if kind in REGION_KINDS else -1))
            continue
        _record(units, stack[-1][1] if stack else root, kind, _trailing_loc(line), id_cache)
    return units


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
        return tuple(sorted(kind for kind, n in self.kinds[item].items() for _ in range(n)))

    def region_of(self, item: str) -> tuple[str, ...]:
        """The root IDs of the dispatch regions holding the ID's ops, joined."""
        found = self.regions.get(item)
        return tuple(sorted({root for region, n in found.items() if n > 0 for root in region})) if found else ()


class PassHistory:
    """Replays one compile's pass dumps over the per-unit state and records changes."""

    def __init__(self) -> None:
        self.units: dict[tuple[str, ...], list[OpRecord]] = {}
        self.totals = _Totals()
        self.changes: list[PassChange] = []
        self.pass_runs = 0  # dumps read (passes that changed some IR unit)
        self.unresolved: list[str] = []  # dumps of IR units the state did not hold
        self._ids: dict[str, tuple[str, ...]] = {}
        self._root: tuple[str, ...] = ()

    def reset(self, module_text: str) -> None:
        """The state at a phase's start: the module as dfit holds it."""
        top = _OP_NAME.match(module_text.lstrip())
        symbol = _SYM_NAME.search(module_text.split("\n", 1)[0])
        self._root = (unit_component(top[1] if top else "builtin.module", symbol[1] if symbol else None),)
        self.units = dict(scan_ops(module_text, self._root, self._ids))
        self.totals = _Totals()
        for ops in self.units.values():
            self.totals.apply(ops, +1)

    def observe_phase(self, phase: str, tree: Path) -> None:
        """Read (and delete) one phase's dumps in the order the passes ran."""
        for path, pass_name in ordered_dumps(tree):
            text = path.read_text(encoding="utf-8", errors="replace")
            path.unlink()
            body = text.split("\n", 1)[1] if text.startswith("//") else text
            unit = self._resolve(tuple(path.parent.relative_to(tree).parts), body)
            self._replace(unit, scan_ops(body, unit, self._ids), pass_name, phase)
            self.pass_runs += 1

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
        changed_old = [key for key in old_keys if new_units.get(key) != self.units[key]]
        changed_new = [key for key in new_units if self.units.get(key) != new_units[key]]
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
        before = {item: (totals.letter(item), totals.kinds_of(item), totals.region_of(item)) for item in touched}
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
                                               new_letter, partners, old_kinds, totals.kinds_of(item), entered))

    def _partners(self, item: str, recent: dict) -> tuple[str, ...]:
        """The other IDs on the one op that carries ``item`` (looked up in the dump just
        read first: that is where a fusion happens)."""
        for units in (recent, self.units):
            for ops in units.values():
                for _, ids, _ in ops:
                    if item in ids and len(ids) > 1:
                        return tuple(other for other in ids if other != item)
        return ()



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


def from_table(table: dict[str, Any]) -> list[PassChange]:
    """The rows of a manifest's ``pass_history`` as records."""
    passes = table["passes"]
    columns = table["columns"]
    changes = []
    for row in table["rows"]:
        values = dict(zip(columns, row, strict=True))
        run = passes[values["pass"]]
        changes.append(PassChange(values["id"], run["name"], run["index"], run["phase"], run["unit"],
                                  values["from"], values["to"], tuple(values["with"]),
                                  tuple(values["kinds_before"]), tuple(values["kinds_after"]),
                                  tuple(values.get("dispatch", ()))))
    return changes


def class_name(letter: str) -> str:
    return _LETTER.get(letter, letter)


# --------------------------------------------------------------------------- the driver


def print_for_replay(module: Any) -> str:
    """The module as the dumps print it (generic form, local-scope locations)."""
    return module.get_asm(print_generic_op_form=True, enable_debug_info=True, use_local_scope=True,
                          large_elements_limit=8, large_resource_limit=16, assume_verified=True)


def observing_driver(flags: Sequence[str]):
    """A subprocess phase driver that records the pass history of every phase it runs."""
    import shutil

    from dfit_mlir.passes import phases

    class PassObservingDriver(phases.SubprocessDriver):
        name = "subprocess+passes"

        def __init__(self, flags: Sequence[str]):
            super().__init__(flags)
            self.history = PassHistory()

        def run(self, module, after, to):  # noqa: ANN001 - the PhaseDriver protocol's types
            self.history.reset(print_for_replay(module))
            tree, out = self.workdir / f"passes-{to}", self.workdir / f"{to}.mlir"
            try:
                self._compile(module, after, [f"--compile-to={to}", *self.OUTPUT_FLAGS, *PRINT_FLAGS,
                                              f"--mlir-print-ir-tree-dir={tree}"], out)
                self.history.observe_phase(to, tree)
            finally:
                shutil.rmtree(tree, ignore_errors=True)
            return self._parse_output(out)

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
