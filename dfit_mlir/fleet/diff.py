"""``dfit diff``: what changed, per stable ID, between two compiles, runs or backends.

Rows are matched as a person would pair two versions of a model: within one **module
path** (the frontend's ``module_path``, else the location names: an op of ``h.0.attn``
is only ever paired with an op of ``h.0.attn``), never by position across modules. Each
pass runs over what the previous left unmatched; ops whose module path is unknown on
either side are paired regardless of it:

1. **ID**: the same stable ID on both sides, in the same module, with the same
   structural hash where both have one (two compiles or runs of one source). An ordinal
   ID (``ListConstruct#14``) is not an op's identity: when a change upstream renumbers
   ops, ``#14`` of A and ``#14`` of B can be two different ops, and the next passes pair
   each with its real counterpart;
2. **structural hash** (the manifest's ``hash``): the same op under another ID — a
   renamed function, an op inserted before it — reported as ``renamed``; equal hashes
   pair up in manifest order, those on the same source line first;
3. **module**: the same module path and op kind, paired by ordinal within that module
   (an op whose inputs changed: the module's first ``addmm`` on both sides), those on
   the same source line first;
4. **tensor name**: an op's own ``name`` (reconstructions name an op after its output
   tensor) or else the innermost name of its location (a TFLite import keeps the
   TFLite tensor name there), so the IREE ops of one TFLite op meet the Edge TPU op
   they stand for. All unmatched ops of one name form one row on each side; an op that
   stands for a whole partition (an Edge TPU custom op) is not matched by name.

What is left is ``removed`` (only in A) or ``added`` (only in B); a module all of whose
ops are on one side is named once in the header (``removed modules: h.1 (41 ops)``).

Per row and side: op names, result types, partitions (IREE dispatch call sites, or a
reconstruction's groups) and their kinds, the rows it is fused with, lineage per stage,
attributed time and bytes crossing the dispatch boundary (the ledger's), module paths. The change labels are ``added`` / ``removed`` (one side
only), ``renamed``, ``op``, ``shape``, ``dtype``, ``fusion`` (the rows sharing each of its
partitions differ), ``placement`` (the partition kinds differ: dispatch vs Edge TPU custom
op vs CPU, or in vs out of any partition), ``lineage`` (a class differs at a stage both
sides have), ``bytes`` and ``time``.

*Time* is a change only outside the runs' spread, by the rule of the store's
``regressions`` report (``dfit_mlir/fleet/store/sql/regressions.sql``, run here over the two
bundles' invocations as its runs, :func:`time_changes`): the two sides' per-invocation
times do not overlap, the gap between their means exceeds the wider of the two ranges
and :data:`TIME_THRESHOLD` of A's mean, with at least :data:`MIN_RUNS` invocations per
side, and (one process per side) the larger mean is at least 1 + :data:`PROCESS_NOISE`
times the smaller and they differ by :data:`MIN_TIME_DELTA_NS` per invocation.
Two runs of one vmfb have no ``time`` change; the delta is still in the CSV.

A pair of single ops whose hashes and source lines both differ (the module's k-th op of
a kind is another op now) is ``replaced``, not a shape or bytes change of one op.

Only real differences are labelled. A row's constants and structure (``tosa.const``,
``tensor.empty``, ``func.return``: :func:`is_data_or_structure`) never count for ``op``,
``shape`` or ``bytes``. A row matched by name stands for one tensor, so ``shape``
compares that tensor — the result of the row's last computing op; a dynamic size fits
any — and ``dtype`` its element type up to signedness (a uint8 TFLite tensor is ``i8``
after IREE's TOSA import). Across backends ``op`` compares op kinds without dialect, case or ``_``
(``tosa.depthwise_conv2d`` is ``DEPTHWISE_CONV_2D``) and is a change only when no kind is
shared, and ``bytes`` only where both sides have as many computing ops (one backend's
decomposition is not another's) and differ by over 1% (cost models count a shape
operand or a zero point differently).

Rows are ranked by what changed most: attributed time, then bytes, then how many rows
the fusion change touches, then the number of labels. Rows made only of constants and
structure are *folded*: kept in the CSV and JSON, summed up in one line of the table.

*Codegen*: two compiles with the same dispatch structure can still differ in code —
another target CPU or flags, other executables, another vmfb. Those differences come
from the manifests' ``compile`` sections (``codegen`` is written by ``dfit compile``)
and are reported whatever the rows say.

*Fused with* is, per partition of the row, the other rows whose ops do work in it (see
below): an op split over two dispatches has two groups, and constants or empty tensors,
which IREE clones into every dispatch that uses them, are not fusion.

*Attributed time* and *bytes* are the ledger's (:mod:`dfit_mlir.analysis.ledger`): each
run of the program's time per op (:meth:`~dfit_mlir.analysis.ledger.Ledger.op_time_by_instance`,
split by its time model, named in every tool's output), divided by the ledger's count of
runs (a mean per invocation); bytes are what crosses the op's dispatches' boundary. A side
without timed events has no time (``None``), not zero.
"""

from __future__ import annotations

import csv
import io
import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dfit_mlir.analysis.model import (
    Operator,
    SemanticModel,
    partitions_by_op,
    stands_for_partition,
    tensor_name,
)
from dfit_mlir.core import atomic, costs
from dfit_mlir.core.ids import op_name_of
from dfit_mlir.core.lineage import is_constant
from dfit_mlir.passes.materialisation import makes_data

SCHEMA = "dfit.diff"
VERSION = "1.2"
MATCHES = ("id", "hash", "module", "name", "only-a", "only-b")
LABELS = ("added", "removed", "replaced", "renamed", "op", "shape", "dtype", "fusion", "placement", "lineage", "bytes",
          "time")
CSV_COLUMNS = ("key", "match", "module_a", "module_b", "changes", "folded", "time_delta_ns", "time_a_ns", "time_b_ns",
               "ids_a", "ids_b", "op_a", "op_b", "shape_a", "shape_b", "partitions_a", "partitions_b", "placement_a",
               "placement_b", "fused_with_a", "fused_with_b", "lineage_changes", "bytes_a", "bytes_b")
#: The ``regressions`` report's defaults for a run diff: invocations needed per side and
#: the smallest relative change reported.
MIN_RUNS = 3
TIME_THRESHOLD = 0.05
#: A two-bundle diff judges time over each bundle's invocations, which ran in one process
#: and share its state (threads, caches, placement): their spread does not cover the next
#: process's. Two processes of one GPT-2 vmfb on this 2-core machine, each with a spread
#: of a few per cent: a layer norm 1.35–1.41 µs per invocation in one and 0.89–1.21 µs in
#: the next, an attention 27 % faster, a matmul 6.6–7.3 µs against 10.6–12.1 µs (+56 %).
#: So a change must also be a factor of 1 + PROCESS_NOISE (the larger time at least twice
#: the smaller) and MIN_TIME_DELTA_NS per invocation; smaller ones need several runs per
#: side (the store's ``regressions``, whose runs are separate processes).
PROCESS_NOISE = 1.0
MIN_TIME_DELTA_NS = 1000.0
#: Op kinds that are a program's structure, not its computation.
STRUCTURE_KINDS = frozenset({"func.func", "util.func", "builtin.module", "func.call", "util.call"})


@dataclass(frozen=True)
class Side:
    """What one bundle says about one row."""

    ids: tuple[str, ...]
    ops: tuple[str, ...]
    #: Result types, one per op, ``,``-joined per op.
    shapes: tuple[str, ...]
    partitions: tuple[str, ...]
    #: Partition kinds: ``dispatch``, ``edgetpu-custom-op``, ``cpu``, ...
    placement: tuple[str, ...]
    #: Per partition of the row, the keys of the other rows whose ops do work in it.
    fused_with: tuple[tuple[str, ...], ...]
    #: Stage → lineage class (``fused/preserved`` when the row's ops differ).
    lineage: dict[str, str]
    #: Mean attributed nanoseconds per invocation; ``None`` without dispatch events.
    time_ns: float | None
    bytes: int | None
    #: Per op: whether it computes (not a constant, empty, fill or structure).
    computing: tuple[bool, ...] = ()
    #: The module paths of the row's ops (``""``: the model's root), in op order.
    modules: tuple[str, ...] = ()
    #: Stage → the passes that set the row's class there (compiles with ``--lineage passes``).
    passes: dict[str, str] = field(default_factory=dict)
    #: Attributed nanoseconds per invocation, one per invocation (the spread of the runs).
    samples_ns: tuple[float, ...] = ()
    #: Per op: its structural hash and its source ``file:line`` (``None``: not recorded).
    hashes: tuple[str | None, ...] = ()
    lines: tuple[str | None, ...] = ()

    @property
    def compute_ops(self) -> tuple[str, ...]:
        return tuple(op for op, computes in zip(self.ops, self.computing, strict=False) if computes)

    @property
    def output_type(self) -> str | None:
        """The result type of the row's last computing op (the tensor a name stands for)."""
        types = [shape for shape, computes in zip(self.shapes, self.computing, strict=False) if computes]
        return types[-1].split(",")[0] if types else None


@dataclass(frozen=True)
class OpDiff:
    """One row: an op (or a tensor name's ops) on side A, side B or both."""

    key: str
    match: str
    a: Side | None
    b: Side | None
    changes: tuple[str, ...]
    #: B − A in mean ns per invocation (a side without the op counts 0); ``None`` unless
    #: both bundles have dispatch timing.
    time_delta_ns: float | None
    #: ``stage: a→b`` for every stage both sides have whose class differs.
    lineage_changes: tuple[str, ...] = ()
    #: Only constants and structure on both sides: summed up, not listed, in the table.
    folded: bool = False

    @property
    def module(self) -> str:
        """``h.0.attn.c_attn`` (the same on both sides), ``a → b``, or one side's."""
        a = ",".join(self.a.modules) if self.a and self.a.modules else ("-" if self.a else "")
        b = ",".join(self.b.modules) if self.b and self.b.modules else ("-" if self.b else "")
        return a if a == b or not b else b if not a else f"{a} → {b}"

    @property
    def bytes_delta(self) -> int:
        """|B − A| static bytes where ``bytes`` is a change, else 0 (for ranking)."""
        if "bytes" not in self.changes:
            return 0
        return abs((self.b.bytes if self.b and self.b.bytes else 0) - (self.a.bytes if self.a and self.a.bytes else 0))

    @property
    def fusion_delta(self) -> int:
        """How many rows the fusion change touches (joined or left the row's partitions)."""
        if "fusion" not in self.changes or self.a is None or self.b is None:
            return 0
        return len({k for g in self.a.fused_with for k in g} ^ {k for g in self.b.fused_with for k in g})


@dataclass(frozen=True)
class BundleInfo:
    source: str
    backend: str
    #: Invocations the dispatch events span (0: no dispatch events).
    invocations: int


@dataclass(frozen=True)
class CodegenChange:
    """One code-generation difference: ``aspect`` (``flags``, ``target.cpu``,
    ``executables``, ``vmfb``), what A and B have, and a short reading."""

    aspect: str
    a: Any
    b: Any
    note: str


@dataclass(frozen=True)
class DiffResult:
    a: BundleInfo
    b: BundleInfo
    #: Ranked by what changed most (see the module docstring).
    rows: tuple[OpDiff, ...]
    codegen: tuple[CodegenChange, ...] = ()
    #: What makes the comparison less than like for like (shown under the header).
    notes: tuple[str, ...] = ()
    #: Modules all of whose ops are only in A / only in B: (module path, ops), outermost.
    removed_modules: tuple[tuple[str, int], ...] = ()
    added_modules: tuple[tuple[str, int], ...] = ()

    def row(self, key: str) -> OpDiff:
        """The row of ``key`` (an ID of side A, a tensor name, or a one-side ID)."""
        for row in self.rows:
            if row.key == key:
                return row
        raise KeyError(key)

    def changed(self) -> list[OpDiff]:
        return [row for row in self.rows if row.changes]

    def counts(self) -> dict[str, int]:
        """Rows per match kind, ``changed`` and ``folded`` rows, and unfolded rows per
        change label (``label:fusion``, ...)."""
        counts = {match: 0 for match in MATCHES}
        for row in self.rows:
            counts[row.match] += 1
        counts["changed"] = len(self.changed())
        counts["folded"] = sum(1 for row in self.rows if row.folded)
        counts["folded_changed"] = sum(1 for row in self.rows if row.folded and row.changes)
        for label in LABELS:
            counts[f"label:{label}"] = sum(1 for row in self.rows if label in row.changes and not row.folded)
        return counts


# --- per-bundle facts ---------------------------------------------------------------------

def is_data_or_structure(op: Operator) -> bool:
    """Constants, empties, fills and splats (data IREE materialises and clones freely),
    and a program's structure (functions, returns, yields)."""
    kind = op.op
    return (is_constant(kind) or makes_data(kind) or kind in STRUCTURE_KINDS
            or kind.rsplit(".", 1)[-1] in ("return", "yield") or op_name_of(op.id) is None)


def attributed_time(model: SemanticModel) -> tuple[dict[str, float], int]:
    """({op ID: mean ns per invocation}, invocations) from the dispatch events; ({}, 0)
    when the bundle has none."""
    samples, runs = attributed_samples(model)
    return {op_id: sum(by_run.values()) / runs for op_id, by_run in samples.items()}, runs


def attributed_samples(model: SemanticModel) -> tuple[dict[str, dict[int, float]], int]:
    """({op ID: {invocation: attributed ns}}, invocations): the ledger's split of each run
    of the program (:meth:`dfit_mlir.analysis.ledger.Ledger.op_time_by_instance`) and its
    one count of runs."""
    from dfit_mlir.analysis import ledger

    book = ledger.of(model)
    return book.op_time_by_instance(), book.instances


# --- matching -------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Match:
    key: str
    match: str
    ids_a: tuple[str, ...]
    ids_b: tuple[str, ...]


def _match(a: SemanticModel, b: SemanticModel) -> list[_Match]:
    """The passes of the module docstring: ID, hash, module path and kind, tensor name."""
    module_a = {op_id: a.module_path(op_id) for op_id in a.operators}
    module_b = {op_id: b.module_path(op_id) for op_id in b.operators}

    def same_module(id_a: str, id_b: str) -> bool:
        x, y = module_a[id_a], module_b[id_b]
        return x is None or y is None or x == y

    in_b = set(b.operators)
    found = [_Match(op_id, "id", (op_id,), (op_id,)) for op_id in a.operators
             if op_id in in_b and same_module(op_id, op_id)
             and not _hashes_differ(a.operators[op_id], b.operators[op_id])]
    used = {m.key for m in found}
    left_a = [i for i in a.operators if i not in used]
    left_b = [i for i in b.operators if i not in used]

    def on_line(key: str | None, op: Operator) -> str | None:
        return None if key is None or _line(op) is None else f"{key}@{_line(op)}"

    for match, key_of in (("hash", lambda model, op: on_line(op.raw.get("hash"), op)),
                          ("hash", lambda model, op: op.raw.get("hash")),
                          ("module", lambda model, op: on_line(_module_kind(model, op), op)),
                          ("module", lambda model, op: _module_kind(model, op))):
        groups_b = _group(left_b, b, key_of)
        paired_a: set[str] = set()
        paired_b: set[str] = set()  # the sides' IDs are two namespaces: keep them apart
        for value, ids_a in _group(left_a, a, key_of).items():
            candidates = list(groups_b.get(value, ()))
            for id_a in ids_a:  # in manifest order: the k-th of the module pairs with the k-th
                id_b = next((i for i in candidates if same_module(id_a, i)), None)
                if id_b is not None:
                    candidates.remove(id_b)
                    found.append(_Match(id_a, match, (id_a,), (id_b,)))
                    paired_a.add(id_a)
                    paired_b.add(id_b)
        left_a = [i for i in left_a if i not in paired_a]
        left_b = [i for i in left_b if i not in paired_b]

    groups_a = _group(left_a, a, lambda model, op: tensor_name(op))
    groups_b = _group(left_b, b, lambda model, op: tensor_name(op))
    named_a: set[str] = set()
    named_b: set[str] = set()
    for value, ids_a in groups_a.items():
        ids_b = groups_b.get(value)
        if ids_b:
            found.append(_Match(value, "name", tuple(ids_a), tuple(ids_b)))
            named_a.update(ids_a)
            named_b.update(ids_b)
    found += [_Match(op_id, "only-a", (op_id,), ()) for op_id in left_a if op_id not in named_a]
    found += [_Match(op_id, "only-b", (), (op_id,)) for op_id in left_b if op_id not in named_b]
    return _unique_keys(found)


def _hashes_differ(op_a: Operator, op_b: Operator) -> bool:
    hash_a, hash_b = op_a.raw.get("hash"), op_b.raw.get("hash")
    return hash_a is not None and hash_b is not None and hash_a != hash_b


def _line(op: Operator) -> str | None:
    source = op.source or {}
    return f"{source['file']}:{source['line']}" if source.get("file") and source.get("line") is not None else None


def _module_kind(model: SemanticModel, op: Operator) -> str | None:
    """``h.0.attn.c_attn|torch.aten.addmm``; ``None`` where the module path is unknown."""
    module = model.module_path(op.id)
    return None if module is None else f"{module}|{op.op}"


def _group(ids: Iterable[str], model: SemanticModel,
           key_of: Callable[[SemanticModel, Operator], str | None]) -> dict[str, list[str]]:
    groups: defaultdict[str, list[str]] = defaultdict(list)
    for op_id in ids:
        value = key_of(model, model.operators[op_id])
        if value and not stands_for_partition(model, model.operators[op_id]):
            groups[value].append(op_id)
    return dict(groups)


def _unique_keys(found: list[_Match]) -> list[_Match]:
    """A tensor name can equal an ID of the other side; keep row keys unique."""
    seen: set[str] = set()
    unique = []
    for item in found:
        key = item.key
        if key in seen:
            key = f"{item.key} [{item.match}]"
        seen.add(key)
        unique.append(_Match(key, item.match, item.ids_a, item.ids_b))
    return unique


# --- building rows ----------------------------------------------------------------------------

class _SideFacts:
    """Everything about one bundle that rows are built from, computed once."""

    def __init__(self, model: SemanticModel, key_of_id: Mapping[str, str]):
        from dfit_mlir.passes.pass_history import deciding_passes

        self.model = model
        self.key_of_id = key_of_id
        self.deciding = deciding_passes(model.manifest.get("pass_history"))
        self.partitions = partitions_by_op(model)
        from dfit_mlir.analysis import ledger

        self.samples, self.invocations = attributed_samples(model)
        #: Bytes crossing the dispatch boundary, the ledger's (read + written), per op.
        self.bytes = {op_id: row["bytes"] for op_id, row in ledger.of(model).op_figures().items()}
        self.time = {op_id: sum(by_run.values()) / self.invocations for op_id, by_run in self.samples.items()}
        self.runs = sorted({run for by_run in self.samples.values() for run in by_run})

    def side(self, ids: tuple[str, ...], key: str) -> Side | None:
        if not ids:
            return None
        ops = [self.model.operators[i] for i in ids]
        partitions = list(dict.fromkeys(p for i in ids for p in self.partitions.get(i, [])))
        fused = sorted(tuple(sorted({self.key_of_id.get(member, member) for member in self.model.compute_ops(p)} - {key}))
                       for p in partitions)
        lineage: dict[str, set[str]] = defaultdict(set)
        passes: dict[str, set[str]] = defaultdict(set)
        for op_id in ids:
            for stage, klass in self.model.lineage(op_id).items():
                lineage[stage].add(klass)
                if (op_id, stage) in self.deciding:
                    passes[stage].add(self.deciding[op_id, stage].pass_name)
        computing = tuple(not is_data_or_structure(op) for op in ops)
        counted = [op for op, computes in zip(ops, computing, strict=True) if computes] or ops
        sizes = [self.bytes[op.id] for op in counted if op.id in self.bytes]
        return Side(
            ids=ids, ops=tuple(op.op for op in ops),
            shapes=tuple(",".join(str(r.get("type", "?")) for r in op.results) for op in ops),
            partitions=tuple(p.id for p in partitions), placement=tuple(sorted({p.kind for p in partitions})),
            fused_with=tuple(fused), lineage={stage: "/".join(sorted(c)) for stage, c in lineage.items()},
            time_ns=sum(self.time.get(i, 0.0) for i in ids) if self.invocations else None,
            bytes=sum(sizes) if sizes else None, computing=computing,
            modules=tuple(dict.fromkeys(m for i in ids if (m := self.model.module_path(i)) is not None)),
            passes={stage: ", ".join(sorted(names)) for stage, names in passes.items()},
            samples_ns=tuple(sum(self.samples.get(i, {}).get(run, 0.0) for i in ids) for run in self.runs),
            hashes=tuple(op.raw.get("hash") for op in ops), lines=tuple(_line(op) for op in ops))


def _changes(match: str, a: Side | None, b: Side | None,
             same_backend: bool = True) -> tuple[tuple[str, ...], tuple[str, ...]]:
    if a is None:
        return ("added",), ()
    if b is None:
        return ("removed",), ()
    if _replaced(a, b):
        return ("replaced",), ()
    changes = []
    if match == "hash" and a.ids != b.ids:
        changes.append("renamed")
    ops_a, ops_b = a.compute_ops, b.compute_ops
    if same_backend:
        if sorted(set(ops_a)) != sorted(set(ops_b)):
            changes.append("op")
    elif ops_a and ops_b and not {_kind(op) for op in ops_a} & {_kind(op) for op in ops_b}:
        changes.append("op")
    if match == "name":
        shape_a, shape_b = _shaped(a.output_type), _shaped(b.output_type)
        if shape_a and shape_b and not _compatible(shape_a.shape, shape_b.shape):
            changes.append("shape")
        if shape_a and shape_b and _element(shape_a.dtype) != _element(shape_b.dtype):
            changes.append("dtype")
    elif sorted(set(_computing(a.shapes, a))) != sorted(set(_computing(b.shapes, b))):
        changes.append("shape")
    if a.fused_with != b.fused_with:
        changes.append("fusion")
    if a.placement != b.placement:
        changes.append("placement")
    lineage = tuple(f"{stage}: {a.lineage[stage]}→{b.lineage[stage]}{_by_pass(stage, a, b)}" for stage in a.lineage
                    if stage in b.lineage and a.lineage[stage] != b.lineage[stage])
    if lineage:
        changes.append("lineage")
    if a.bytes != b.bytes and (same_backend or (len(ops_a) == len(ops_b) and _apart(a.bytes, b.bytes))):
        changes.append("bytes")
    return tuple(changes), lineage


def _replaced(a: Side, b: Side) -> bool:
    """One op on each side, and another op: hashes and source lines both differ."""
    if len(a.ids) != 1 or len(b.ids) != 1 or not (a.hashes and b.hashes and a.lines and b.lines):
        return False
    return (None not in (a.hashes[0], b.hashes[0], a.lines[0], b.lines[0])
            and a.hashes[0] != b.hashes[0] and a.lines[0] != b.lines[0])


def _by_pass(stage: str, a: Side, b: Side) -> str:
    """`` (A: fused by X; B: preserved, no pass changed it)`` where a side's compile
    recorded its pass history, else nothing."""
    if not (a.passes or b.passes):
        return ""
    said = [f"{label}: {side.lineage[stage]} by {side.passes[stage]}" if stage in side.passes
            else f"{label}: {side.lineage[stage]}, no pass of the phase changed it" if side.passes
            else f"{label}: no pass history" for label, side in (("A", a), ("B", b))]
    return f" ({'; '.join(said)})"


def _apart(a: int | None, b: int | None) -> bool:
    """Static bytes of two backends' cost models differ by more than operand bookkeeping
    (a shape operand, a zero point): over 1%."""
    if a is None or b is None:
        return a != b
    return abs(a - b) > 0.01 * max(a, b)


def _computing(values: tuple[str, ...], side: Side) -> list[str]:
    return [v for v, computes in zip(values, side.computing, strict=False) if computes] or list(values)


def _kind(op: str) -> str:
    """``tosa.depthwise_conv2d`` and ``tflite.DEPTHWISE_CONV_2D`` → ``depthwiseconv2d``."""
    return op.rsplit(".", 1)[-1].lower().replace("_", "").replace("average", "avg")


def _shaped(type_text: str | None) -> costs.ShapedType | None:
    return costs.parse_shaped(type_text) if type_text else None


def _compatible(a: tuple[int | None, ...], b: tuple[int | None, ...]) -> bool:
    """Same rank, and equal where both know the size (a dynamic batch fits any)."""
    return len(a) == len(b) and all(x is None or y is None or x == y for x, y in zip(a, b, strict=True))


def _element(dtype: str) -> str:
    """An element type up to signedness: ``ui8``, ``si8`` and ``i8`` are one width."""
    return dtype[1:] if dtype[:2] in ("ui", "si") else dtype


def _folded(a: Side | None, b: Side | None) -> bool:
    return not any(side.compute_ops for side in (a, b) if side is not None)


def _rank(row: OpDiff) -> tuple[Any, ...]:
    return (-abs(row.time_delta_ns or 0.0), -row.bytes_delta, -row.fusion_delta, -len(row.changes), row.key)


def _time_of(side: Side | None) -> float:
    return 0.0 if side is None or side.time_ns is None else side.time_ns


def _open(bundle: str | Path | SemanticModel) -> SemanticModel:
    return bundle if isinstance(bundle, SemanticModel) else SemanticModel.open(bundle)


def diff_bundles(bundle_a: str | Path | SemanticModel, bundle_b: str | Path | SemanticModel) -> DiffResult:
    """Match the ops of two bundles (or manifests) and say what changed per row."""
    a, b = _open(bundle_a), _open(bundle_b)
    matches = _match(a, b)
    facts_a = _SideFacts(a, {i: m.key for m in matches for i in m.ids_a})
    facts_b = _SideFacts(b, {i: m.key for m in matches for i in m.ids_b})
    timed = facts_a.invocations > 0 and facts_b.invocations > 0
    same_backend = a.backend == b.backend
    sides = [(m, facts_a.side(m.ids_a, m.key), facts_b.side(m.ids_b, m.key)) for m in matches]
    notes = _notes(a, b)
    try:
        slower_or_faster = time_changes({m.key: (side_a.samples_ns, side_b.samples_ns) for m, side_a, side_b in sides
                                         if side_a is not None and side_b is not None}) if timed else {}
    except ImportError:  # the rule is the store's SQL: DuckDB comes with dfit-mlir[store]
        slower_or_faster = {}
        notes += ("note: time is not compared: judging it against the runs' spread needs DuckDB "
                  "(pip install 'dfit-mlir[store]'); the deltas are in diff.csv",)
    rows = []
    for m, side_a, side_b in sides:
        changes, lineage = _changes(m.match, side_a, side_b, same_backend)
        if m.key in slower_or_faster:
            changes += ("time",)
        delta = _time_of(side_b) - _time_of(side_a) if timed else None
        rows.append(OpDiff(m.key, m.match, side_a, side_b, changes, delta, lineage, _folded(side_a, side_b)))
    rows.sort(key=_rank)
    if timed and min(facts_a.invocations, facts_b.invocations) < MIN_RUNS:
        notes += (f"note: time is not compared: {facts_a.invocations} and {facts_b.invocations} invocations, fewer "
                  f"than {MIN_RUNS} per side leave the runs' spread unknown (run with --repeat {MIN_RUNS} or more)",)
    # Module trees compare within one backend (two backends name modules their own way).
    paths_a = [p for i in a.operators if (p := a.module_path(i)) is not None] if same_backend else []
    paths_b = [p for i in b.operators if (p := b.module_path(i)) is not None] if same_backend else []
    return DiffResult(BundleInfo(a.source, a.backend, facts_a.invocations),
                      BundleInfo(b.source, b.backend, facts_b.invocations), tuple(rows),
                      codegen_changes(a.manifest, b.manifest), notes,
                      _modules_only_in(paths_a, paths_b), _modules_only_in(paths_b, paths_a))


def time_changes(samples: Mapping[str, tuple[Iterable[float], Iterable[float]]], min_runs: int = MIN_RUNS,
                 threshold: float = TIME_THRESHOLD, min_delta_ns: float = MIN_TIME_DELTA_NS,
                 process_noise: float = PROCESS_NOISE) -> dict[str, str]:
    """{row key: ``slower``/``faster``} for the rows whose per-invocation times (A's,
    B's) differ outside the runs' spread: the store's ``regressions`` report, run by
    DuckDB over the invocations as its runs (A the baseline), so that one rule decides;
    then only changes of at least ``process_noise`` times the smaller time and
    ``min_delta_ns`` per invocation (one process per side: :data:`PROCESS_NOISE`,
    :data:`MIN_TIME_DELTA_NS`)."""
    import duckdb
    import pyarrow as pa

    from dfit_mlir.fleet.store import reports
    from dfit_mlir.fleet.store.dialects import DUCKDB

    totals: dict[str, list[Any]] = {"backend": [], "model": [], "run": [], "op_id": [], "time_ns": [],
                                    "run_instances": [], "calls": []}
    runs: dict[str, None] = {}
    for key, per_side in samples.items():
        values = [list(side) for side in per_side]
        if not any(v for side in values for v in side):
            continue  # never timed on either side: nothing to compare
        for label, side in zip("AB", values, strict=True):
            for invocation, ns in enumerate(side):
                run = f"{label}{invocation}"
                runs[run] = None
                for column, value in zip(totals, ("diff", "diff", run, key, float(ns), 1, 1), strict=True):
                    totals[column].append(value)
    if not totals["run"]:
        return {}
    run_table = pa.table({"run": list(runs), "backend": ["diff"] * len(runs), "model": ["diff"] * len(runs),
                          "label": [run[0] for run in runs]})
    connection = duckdb.connect()
    try:
        for statement in DUCKDB.prelude:
            connection.execute(statement)
        connection.register("runs", run_table)
        connection.register("op_ledger", pa.table(totals))
        sql = reports.get("regressions").render(DUCKDB, {"baseline": "A", "candidate": "B", "min_runs": min_runs,
                                                         "threshold": threshold})
        cursor = connection.execute(sql)
        names = [column[0] for column in cursor.description]
        found = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    finally:
        connection.close()
    return {row["op_id"]: row["change"] for row in found
            if abs(row["candidate_ns"] - row["baseline_ns"])
            >= max(min_delta_ns, process_noise * min(row["candidate_ns"], row["baseline_ns"]))}


def _modules_only_in(mine: Iterable[str], other: Iterable[str]) -> tuple[tuple[str, int], ...]:
    """The outermost modules of ``mine`` that ``other`` does not have, with how many of
    ``mine``'s ops sit in each (``h.1``: every op of the removed layer)."""
    from dfit_mlir.core.module_paths import ancestry

    present = {node for path in other for node in ancestry(path)}
    if not present:
        return ()
    gone: defaultdict[str, int] = defaultdict(int)
    for path in mine:
        missing = next((node for node in ancestry(path) if node not in present), None)
        if missing is not None:
            gone[missing] += 1
    return tuple(sorted(gone.items()))


def _notes(a: SemanticModel, b: SemanticModel) -> tuple[str, ...]:
    """A compile manifest from before shared materialisation was separated lists merged
    empties and fills as fused: fusion compared with a newer one differs for that alone."""
    separated = {side: "shared_materialisation" in model.manifest.get("partitions", {})
                 for side, model in (("A", a), ("B", b)) if model.manifest.get("partitions", {}).get("dispatch_sites")}
    if len(separated) == 2 and len(set(separated.values())) == 2:
        old = next(side for side, done in separated.items() if not done)
        return (f"note: {old}'s manifest predates shared materialisation (passes/materialisation.py): its fused "
                f"lists include merged empties, fills and constants; recompile it to compare fusion like for like",)
    return ()


def codegen_changes(a: Mapping[str, Any], b: Mapping[str, Any]) -> tuple[CodegenChange, ...]:
    """What the two manifests' ``compile`` sections say differs in generated code (only
    what both sides record: a reconstruction has no IREE flags or executables)."""
    compile_a, compile_b = a.get("compile") or {}, b.get("compile") or {}
    found: list[CodegenChange] = []
    flags_a, flags_b = compile_a.get("flags"), compile_b.get("flags")
    if flags_a is not None and flags_b is not None and sorted(flags_a) != sorted(flags_b):
        only_a = [f for f in flags_a if f not in flags_b]
        only_b = [f for f in flags_b if f not in flags_a]
        found.append(CodegenChange("flags", only_a, only_b, "; ".join(
            part for part in (f"only in A: {' '.join(only_a)}" if only_a else "",
                              f"only in B: {' '.join(only_b)}" if only_b else "") if part) or "reordered"))
    gen_a, gen_b = compile_a.get("codegen"), compile_b.get("codegen")
    if gen_a is not None and gen_b is not None:
        target_a, target_b = gen_a.get("target") or {}, gen_b.get("target") or {}
        for key in sorted(set(target_a) | set(target_b)):
            if target_a.get(key) != target_b.get(key):
                found.append(CodegenChange(f"target.{key}", target_a.get(key), target_b.get(key),
                                           f"{target_a.get(key, '(default)')} → {target_b.get(key, '(default)')}"))
        exes_a, exes_b = gen_a.get("executables") or [], gen_b.get("executables") or []
        if [e["sha256"] for e in exes_a] != [e["sha256"] for e in exes_b]:
            bytes_a, bytes_b = sum(e["bytes"] for e in exes_a), sum(e["bytes"] for e in exes_b)
            pairs = list(zip(exes_a, exes_b, strict=False))
            differing = sum(1 for x, y in pairs if x["sha256"] != y["sha256"])
            in_code = sum(1 for x, y in pairs if x.get("text_sha256") != y.get("text_sha256"))
            note = (f"{len(exes_a)} → {len(exes_b)}, {bytes_a:,} → {bytes_b:,} bytes ({bytes_b - bytes_a:+,}); "
                    f"{differing} of {len(pairs)} differ" + (f", {in_code} in code (.text)" if in_code else ""))
            found.append(CodegenChange("executables", [e["bytes"] for e in exes_a], [e["bytes"] for e in exes_b], note))
    size_a, size_b = compile_a.get("vmfb_bytes"), compile_b.get("vmfb_bytes")
    sha_a, sha_b = compile_a.get("vmfb_sha256"), compile_b.get("vmfb_sha256")
    if size_a is not None and size_b is not None and (size_a != size_b or (sha_a and sha_b and sha_a != sha_b)):
        found.append(CodegenChange("vmfb", size_a, size_b, f"{size_a:,} → {size_b:,} bytes ({size_b - size_a:+,})"
                                   + ("" if size_a != size_b else ", same size, other content")))
    return tuple(found)


# --- output -----------------------------------------------------------------------------------

def _flat(row: OpDiff) -> dict[str, Any]:
    def joined(side: Side | None, field: str) -> str:
        if side is None:
            return ""
        if field == "fused_with":  # one group per partition
            return " | ".join(",".join(group) for group in side.fused_with)
        return ";".join(getattr(side, field))

    def number(value: float | int | None) -> float | int | None:
        return None if value is None else round(value, 1) if isinstance(value, float) else value

    return {
        "key": row.key, "match": row.match, "module_a": ";".join(row.a.modules) if row.a else "",
        "module_b": ";".join(row.b.modules) if row.b else "",
        "changes": ";".join(row.changes), "folded": int(row.folded),
        "time_delta_ns": number(row.time_delta_ns), "time_a_ns": number(row.a.time_ns if row.a else None),
        "time_b_ns": number(row.b.time_ns if row.b else None),
        **{f"{field}_{name}": joined(side, plural)
           for field, plural in (("ids", "ids"), ("op", "ops"), ("shape", "shapes"), ("partitions", "partitions"),
                                 ("placement", "placement"), ("fused_with", "fused_with"))
           for name, side in (("a", row.a), ("b", row.b))},
        "lineage_changes": ";".join(row.lineage_changes),
        "bytes_a": row.a.bytes if row.a else None, "bytes_b": row.b.bytes if row.b else None,
    }


def to_csv(result: DiffResult) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS)
    writer.writeheader()
    for row in result.rows:
        writer.writerow({k: "" if v is None else v for k, v in _flat(row).items()})
    return out.getvalue()


def to_json(result: DiffResult) -> str:
    document = {"schema": SCHEMA, "version": VERSION, "a": asdict(result.a), "b": asdict(result.b),
                "counts": result.counts(), "codegen": [asdict(change) for change in result.codegen],
                "notes": list(result.notes),
                "removed_modules": [list(item) for item in result.removed_modules],
                "added_modules": [list(item) for item in result.added_modules],
                "rows": [{"key": row.key, "match": row.match, "module": row.module, "changes": list(row.changes),
                          "folded": row.folded,
                          "time_delta_ns": row.time_delta_ns, "lineage_changes": list(row.lineage_changes),
                          "a": asdict(row.a) if row.a else None, "b": asdict(row.b) if row.b else None}
                         for row in result.rows]}
    return json.dumps(document, indent=1) + "\n"


def write(result: DiffResult, out_dir: str | Path) -> list[Path]:
    """``diff.csv`` and ``diff.json`` in ``out_dir``, written as one dfit ``diff``
    directory (atomically; an existing folder is replaced only if it is a previous diff)."""
    out_dir = Path(out_dir)
    names = (("diff.csv", to_csv(result)), ("diff.json", to_json(result)))
    with atomic.atomic_directory(out_dir, kind="diff") as tmp:
        for name, text in names:
            (tmp / name).write_text(text, encoding="utf-8")
    return [out_dir / name for name, _ in names]


def render(result: DiffResult, limit: int | None = 40, written: Path | None = None) -> str:
    """The header (counts, removed and added modules, codegen differences, folded rows),
    then the changed rows with their module paths, most changed first (the first ``limit``; ``None``: all), each with
    where it runs on either side. ``written``: the ``diff.csv`` written, if one was (the
    footer points there and nowhere else)."""
    counts = result.counts()
    matched = counts["id"] + counts["hash"] + counts["module"] + counts["name"]
    lines = [f"A: {result.a.source} ({result.a.backend}, {result.a.invocations} invocations)",
             f"B: {result.b.source} ({result.b.backend}, {result.b.invocations} invocations)",
             f"rows: {len(result.rows)}; matched {matched} ({counts['id']} by id, {counts['hash']} by hash, "
             f"{counts['module']} by module, {counts['name']} by name); only in A: {counts['only-a']}, "
             f"only in B: {counts['only-b']}; "
             f"changed: {counts['changed']}"
             + (f" ({counts['folded_changed']} of them constants or structure, folded)" if counts["folded_changed"] else "")]
    labels = [f"{label} {counts[f'label:{label}']}" for label in LABELS if counts[f"label:{label}"]]
    if labels:
        lines.append("changes: " + ", ".join(labels))
    lines += list(result.notes)
    for what, modules in (("removed", result.removed_modules), ("added", result.added_modules)):
        if modules:
            shown_modules = ", ".join(f"{path or '(root)'} ({ops} ops)" for path, ops in modules[:8])
            lines.append(f"{what} modules: {shown_modules}" + (f", … {len(modules) - 8} more" if len(modules) > 8 else ""))
    for change in result.codegen:
        lines.append(f"codegen {change.aspect}: {change.note}")
    folded = [row for row in result.rows if row.folded and row.changes]
    if folded:
        lines.append(_folded_line(folded))
    shown = [row for row in result.rows if row.changes and not row.folded]
    unchanged = len(result.rows) - len(shown) - len(folded)
    if not shown:
        lines.append("no differences" if not result.codegen and not folded
                     else "no differences in computing ops" if not result.codegen
                     else "no differences per op: the same dispatch structure, other code")
        return "\n".join(lines)
    lines += ["", f"{'key':<48} {'module (A → B)':<28} {'match':<6} {'Δtime ns':>10} {'A ns':>10} {'B ns':>10}  "
                  f"changes"]
    for row in shown[:limit]:
        lines.append(f"{_clip(row.key, 48):<48} {_clip_left(row.module, 28):<28} {row.match:<6} "
                     f"{_ns(row.time_delta_ns, signed=True):>10} {_ns(row.a.time_ns if row.a else None):>10} "
                     f"{_ns(row.b.time_ns if row.b else None):>10}  {','.join(row.changes)}")
        lines.append(f"    {_where(row.a)} → {_where(row.b)}")
    if limit is not None and len(shown) > limit:
        rest = len(shown) - limit
        lines.append(f"... {rest} more rows in {written}" if written is not None
                     else f"... {rest} more rows (all of them: --limit 0; -o DIR writes diff.csv)")
    if unchanged:
        lines.append(f"({unchanged} unchanged rows not shown)")
    return "\n".join(lines)


def _folded_line(rows: list[OpDiff]) -> str:
    kinds: defaultdict[str, int] = defaultdict(int)
    for row in rows:
        for side in (row.a, row.b):
            for op in side.ops if side else ():
                kinds[op] += 1
    ranked = sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0]))
    top = ", ".join(f"{kind} {count}" for kind, count in ranked[:4]) + (", …" if len(ranked) > 4 else "")
    only_a = sum(1 for row in rows if row.match == "only-a")
    only_b = sum(1 for row in rows if row.match == "only-b")
    return (f"folded: {len(rows)} rows of constants and structure ({top}): only in A {only_a}, "
            f"only in B {only_b}, on both sides {len(rows) - only_a - only_b}")


def _where(side: Side | None) -> str:
    """``site48 main_dispatch_48_conv_… (+1)``: the first partition, with its export name."""
    if side is None:
        return "-"
    if not side.partitions:
        return "no partition"
    first = side.partitions[0]
    if first.startswith("site") and ":" in first:
        site, export = first.split(":", 1)
        text = f"{site} {_clip(export, 56)}"
    else:
        text = first.rsplit("/", 1)[-1]
    return text + (f" (+{len(side.partitions) - 1})" if len(side.partitions) > 1 else "")


def _clip_left(text: str, width: int) -> str:
    """A module path keeps its innermost (distinguishing) end."""
    return text if len(text) <= width else "…" + text[-(width - 1):]


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def _ns(value: float | None, signed: bool = False) -> str:
    return "-" if value is None else f"{value:+.0f}" if signed else f"{value:.0f}"
