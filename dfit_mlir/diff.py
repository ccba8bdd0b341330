"""``dfit diff``: what changed, per stable ID, between two compiles, runs or backends.

Rows are matched in three passes, each over what the previous left unmatched:

1. **ID**: the same stable ID on both sides (two compiles or runs of one source);
2. **structural hash** (the manifest's ``hash``): the same op under another ID — a
   renamed function, an op inserted before it — reported as ``renamed``; equal hashes
   on one side pair up in manifest order;
3. **tensor name**: an op's own ``name`` (reconstructions name an op after its output
   tensor) or else the innermost name of its location (a TFLite import keeps the
   TFLite tensor name there), so the IREE ops of one TFLite op meet the Edge TPU op
   they stand for. All unmatched ops of one name form one row on each side; an op that
   stands for a whole partition (an Edge TPU custom op) is not matched by name.

Per row and side: op names, result types, partitions (IREE dispatch call sites, or a
reconstruction's groups) and their kinds, the rows it is fused with, lineage per stage,
attributed time and static bytes. The change labels are ``added`` / ``removed`` (one side
only), ``renamed``, ``op``, ``shape``, ``dtype``, ``fusion`` (the rows sharing each of its
partitions differ), ``placement`` (the partition kinds differ: dispatch vs Edge TPU custom
op vs CPU, or in vs out of any partition), ``lineage`` (a class differs at a stage both
sides have) and ``bytes``. Time is not a label, runs always differ a little.

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

*Attributed time*: each dispatch event's duration is split evenly over the ops of its
partition that do work — top-level in the partition (a ``linalg.generic`` body belongs to
its op) and consuming a value (constants and empty tensors get none); all of them if none
qualifies. An event without a partition but with a ``root_id`` goes to that op. An op's
time is the sum of its shares divided by the number of invocations (a mean per
invocation). A side without dispatch events has no time (``None``), not zero.
"""

from __future__ import annotations

import csv
import io
import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dfit_mlir import atomic, costs
from dfit_mlir.ids import op_name_of
from dfit_mlir.lineage import is_constant
from dfit_mlir.materialisation import makes_data
from dfit_mlir.tools.model import Operator, Partition, SemanticModel

SCHEMA = "dfit.diff"
VERSION = "1.1"
MATCHES = ("id", "hash", "name", "only-a", "only-b")
LABELS = ("added", "removed", "renamed", "op", "shape", "dtype", "fusion", "placement", "lineage", "bytes")
CSV_COLUMNS = ("key", "match", "changes", "folded", "time_delta_ns", "time_a_ns", "time_b_ns", "ids_a", "ids_b", "op_a",
               "op_b", "shape_a", "shape_b", "partitions_a", "partitions_b", "placement_a", "placement_b", "fused_with_a",
               "fused_with_b", "lineage_changes", "bytes_a", "bytes_b")
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


def tensor_name(op: Operator) -> str | None:
    """The name an op is matched by across backends (see the module docstring)."""
    return op.raw.get("name") or (op.name_path[-1] if op.name_path else None)


def stands_for_partition(model: SemanticModel, op: Operator) -> bool:
    """Whether ``op`` is a partition's stand-in rather than one of its members (an Edge TPU
    custom op of the compiled model: it names the partition it replaces and carries the
    output tensor name of that partition's last op, so matching it by name would pair
    it with that op's counterpart too)."""
    if op.partition is None:
        return False
    partition = next((p for p in model.partitions if p.id == op.partition), None)
    return partition is not None and op.id not in partition.operator_ids


def attributed_time(model: SemanticModel) -> tuple[dict[str, float], int]:
    """({op ID: mean ns per invocation}, invocations) from the dispatch events; ({}, 0)
    when the bundle has none."""
    by_id = {partition.id: partition for partition in model.partitions}
    total: defaultdict[str, float] = defaultdict(float)
    invocations: set[int] = set()
    seen = False
    for batch in model.event_batches():
        columns = batch.select(["kind", "site", "partition", "root_id", "duration_ns", "invocation"]).to_pydict()
        for kind, site, name, root, duration, invocation in zip(*columns.values(), strict=True):
            if kind != "dispatch" or duration is None:
                continue
            seen = True
            if invocation is not None:
                invocations.add(invocation)
            partition = model.partition_of_site(site) if site is not None else by_id.get(name)
            ops = list(model.compute_ops(partition)) if partition is not None else []
            if not ops and root in model.operators:
                ops = [root]
            for op_id in ops:
                total[op_id] += duration / len(ops)
    runs = len(invocations) or (1 if seen else 0)
    return {op_id: ns / runs for op_id, ns in total.items()}, runs


def partitions_by_op(model: SemanticModel) -> dict[str, list[Partition]]:
    """Op ID → the partitions it lands in (members, or the op's own ``partition``)."""
    found: defaultdict[str, list[Partition]] = defaultdict(list)
    by_id = {partition.id: partition for partition in model.partitions}
    for partition in model.partitions:
        for op_id in partition.operator_ids:
            found[op_id].append(partition)
    for op in model.operators.values():
        if op.partition in by_id and not found.get(op.id):
            found[op.id].append(by_id[op.partition])
    return dict(found)


# --- matching -------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Match:
    key: str
    match: str
    ids_a: tuple[str, ...]
    ids_b: tuple[str, ...]


def _match(a: SemanticModel, b: SemanticModel) -> list[_Match]:
    left_a = list(a.operators)
    left_b = list(b.operators)
    in_b = set(left_b)
    found = [_Match(op_id, "id", (op_id,), (op_id,)) for op_id in left_a if op_id in in_b]
    matched = {m.key for m in found}
    left_a = [i for i in left_a if i not in matched]
    left_b = [i for i in left_b if i not in matched]

    for match, key_of in (("hash", lambda op: op.raw.get("hash")), ("name", tensor_name)):
        groups_a = _group(left_a, a, key_of)
        groups_b = _group(left_b, b, key_of)
        used: set[str] = set()
        for value, ids_a in groups_a.items():
            ids_b = groups_b.get(value)
            if not ids_b:
                continue
            if match == "hash":
                pairs = [((x,), (y,)) for x, y in zip(ids_a, ids_b, strict=False)]
            else:
                pairs = [(tuple(ids_a), tuple(ids_b))]
            for pair_a, pair_b in pairs:
                key = pair_a[0] if match == "hash" else value
                found.append(_Match(key, match, pair_a, pair_b))
                used.update(pair_a + pair_b)
        left_a = [i for i in left_a if i not in used]
        left_b = [i for i in left_b if i not in used]

    found += [_Match(op_id, "only-a", (op_id,), ()) for op_id in left_a]
    found += [_Match(op_id, "only-b", (), (op_id,)) for op_id in left_b]
    return _unique_keys(found)


def _group(ids: Iterable[str], model: SemanticModel,
           key_of: Callable[[Operator], str | None]) -> dict[str, list[str]]:
    groups: defaultdict[str, list[str]] = defaultdict(list)
    for op_id in ids:
        value = key_of(model.operators[op_id])
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
        self.model = model
        self.key_of_id = key_of_id
        self.partitions = partitions_by_op(model)
        self.time, self.invocations = attributed_time(model)

    def side(self, ids: tuple[str, ...], key: str) -> Side | None:
        if not ids:
            return None
        ops = [self.model.operators[i] for i in ids]
        partitions = list(dict.fromkeys(p for i in ids for p in self.partitions.get(i, [])))
        fused = sorted(tuple(sorted({self.key_of_id.get(member, member) for member in self.model.compute_ops(p)} - {key}))
                       for p in partitions)
        lineage: dict[str, set[str]] = defaultdict(set)
        for op_id in ids:
            for stage, klass in self.model.lineage(op_id).items():
                lineage[stage].add(klass)
        computing = tuple(not is_data_or_structure(op) for op in ops)
        counted = [op for op, computes in zip(ops, computing, strict=True) if computes] or ops
        sizes = [op.bytes for op in counted if op.bytes is not None]
        return Side(
            ids=ids, ops=tuple(op.op for op in ops),
            shapes=tuple(",".join(str(r.get("type", "?")) for r in op.results) for op in ops),
            partitions=tuple(p.id for p in partitions), placement=tuple(sorted({p.kind for p in partitions})),
            fused_with=tuple(fused), lineage={stage: "/".join(sorted(c)) for stage, c in lineage.items()},
            time_ns=sum(self.time.get(i, 0.0) for i in ids) if self.invocations else None,
            bytes=sum(sizes) if sizes else None, computing=computing)


def _changes(match: str, a: Side | None, b: Side | None,
             same_backend: bool = True) -> tuple[tuple[str, ...], tuple[str, ...]]:
    if a is None:
        return ("added",), ()
    if b is None:
        return ("removed",), ()
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
    lineage = tuple(f"{stage}: {a.lineage[stage]}→{b.lineage[stage]}" for stage in a.lineage
                    if stage in b.lineage and a.lineage[stage] != b.lineage[stage])
    if lineage:
        changes.append("lineage")
    if a.bytes != b.bytes and (same_backend or (len(ops_a) == len(ops_b) and _apart(a.bytes, b.bytes))):
        changes.append("bytes")
    return tuple(changes), lineage


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
    rows = []
    for m in matches:
        side_a, side_b = facts_a.side(m.ids_a, m.key), facts_b.side(m.ids_b, m.key)
        changes, lineage = _changes(m.match, side_a, side_b, same_backend)
        delta = _time_of(side_b) - _time_of(side_a) if timed else None
        rows.append(OpDiff(m.key, m.match, side_a, side_b, changes, delta, lineage, _folded(side_a, side_b)))
    rows.sort(key=_rank)
    return DiffResult(BundleInfo(a.source, a.backend, facts_a.invocations),
                      BundleInfo(b.source, b.backend, facts_b.invocations), tuple(rows),
                      codegen_changes(a.manifest, b.manifest), _notes(a, b))


def _notes(a: SemanticModel, b: SemanticModel) -> tuple[str, ...]:
    """A compile manifest from before shared materialisation was separated lists merged
    empties and fills as fused: fusion compared with a newer one differs for that alone."""
    separated = {side: "shared_materialisation" in model.manifest.get("partitions", {})
                 for side, model in (("A", a), ("B", b)) if model.manifest.get("partitions", {}).get("dispatch_sites")}
    if len(separated) == 2 and len(set(separated.values())) == 2:
        old = next(side for side, done in separated.items() if not done)
        return (f"note: {old}'s manifest predates shared materialisation (dfit_mlir/materialisation.py): its fused "
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
        "key": row.key, "match": row.match, "changes": ";".join(row.changes), "folded": int(row.folded),
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
                "rows": [{"key": row.key, "match": row.match, "changes": list(row.changes), "folded": row.folded,
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
    """The header (counts, codegen differences, folded rows), then the changed or
    re-timed rows, most changed first (the first ``limit``; ``None``: all), each with
    where it runs on either side. ``written``: the ``diff.csv`` written, if one was (the
    footer points there and nowhere else)."""
    counts = result.counts()
    matched = counts["id"] + counts["hash"] + counts["name"]
    lines = [f"A: {result.a.source} ({result.a.backend}, {result.a.invocations} invocations)",
             f"B: {result.b.source} ({result.b.backend}, {result.b.invocations} invocations)",
             f"rows: {len(result.rows)}; matched {matched} ({counts['id']} by id, {counts['hash']} by hash, "
             f"{counts['name']} by name); only in A: {counts['only-a']}, only in B: {counts['only-b']}; "
             f"changed: {counts['changed']}"
             + (f" ({counts['folded_changed']} of them constants or structure, folded)" if counts["folded_changed"] else "")]
    labels = [f"{label} {counts[f'label:{label}']}" for label in LABELS if counts[f"label:{label}"]]
    if labels:
        lines.append("changes: " + ", ".join(labels))
    lines += list(result.notes)
    for change in result.codegen:
        lines.append(f"codegen {change.aspect}: {change.note}")
    folded = [row for row in result.rows if row.folded and (row.changes or row.time_delta_ns)]
    if folded:
        lines.append(_folded_line(folded))
    shown = [row for row in result.rows if (row.changes or row.time_delta_ns) and not row.folded]
    unchanged = len(result.rows) - len(shown) - len(folded)
    if not shown:
        lines.append("no differences" if not result.codegen and not folded
                     else "no differences in computing ops" if not result.codegen
                     else "no differences per op: the same dispatch structure, other code")
        return "\n".join(lines)
    lines += ["", f"{'key':<48} {'match':<6} {'Δtime ns':>10} {'A ns':>10} {'B ns':>10}  changes"]
    for row in shown[:limit]:
        lines.append(f"{_clip(row.key, 48):<48} {row.match:<6} {_ns(row.time_delta_ns, signed=True):>10} "
                     f"{_ns(row.a.time_ns if row.a else None):>10} {_ns(row.b.time_ns if row.b else None):>10}  "
                     f"{','.join(row.changes)}")
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


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def _ns(value: float | None, signed: bool = False) -> str:
    return "-" if value is None else f"{value:+.0f}" if signed else f"{value:.0f}"
