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
only), ``renamed``, ``op``, ``shape``, ``fusion`` (the rows sharing each of its partitions
differ), ``placement`` (the partition kinds differ: dispatch vs Edge TPU custom op vs
CPU, or in vs out of any partition), ``lineage`` (a class differs at a stage both sides
have) and ``bytes``. Time is not a label, runs always differ a little; rows are sorted by
the absolute change in time instead.

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

from dfit_mlir import atomic
from dfit_mlir.tools.model import Operator, Partition, SemanticModel

SCHEMA = "dfit.diff"
VERSION = "1.0"
MATCHES = ("id", "hash", "name", "only-a", "only-b")
CSV_COLUMNS = ("key", "match", "changes", "time_delta_ns", "time_a_ns", "time_b_ns", "ids_a", "ids_b", "op_a", "op_b",
               "shape_a", "shape_b", "partitions_a", "partitions_b", "placement_a", "placement_b", "fused_with_a",
               "fused_with_b", "lineage_changes", "bytes_a", "bytes_b")


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


@dataclass(frozen=True)
class BundleInfo:
    source: str
    backend: str
    #: Invocations the dispatch events span (0: no dispatch events).
    invocations: int


@dataclass(frozen=True)
class DiffResult:
    a: BundleInfo
    b: BundleInfo
    #: Sorted by absolute time change, largest first, then by key.
    rows: tuple[OpDiff, ...]

    def row(self, key: str) -> OpDiff:
        """The row of ``key`` (an ID of side A, a tensor name, or a one-side ID)."""
        for row in self.rows:
            if row.key == key:
                return row
        raise KeyError(key)

    def changed(self) -> list[OpDiff]:
        return [row for row in self.rows if row.changes]

    def counts(self) -> dict[str, int]:
        counts = {match: 0 for match in MATCHES}
        for row in self.rows:
            counts[row.match] += 1
        counts["changed"] = len(self.changed())
        return counts


# --- per-bundle facts ---------------------------------------------------------------------

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
        sizes = [op.bytes for op in ops if op.bytes is not None]
        return Side(
            ids=ids, ops=tuple(op.op for op in ops),
            shapes=tuple(",".join(str(r.get("type", "?")) for r in op.results) for op in ops),
            partitions=tuple(p.id for p in partitions), placement=tuple(sorted({p.kind for p in partitions})),
            fused_with=tuple(fused), lineage={stage: "/".join(sorted(c)) for stage, c in lineage.items()},
            time_ns=sum(self.time.get(i, 0.0) for i in ids) if self.invocations else None,
            bytes=sum(sizes) if sizes else None)


def _changes(match: str, a: Side | None, b: Side | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    if a is None:
        return ("added",), ()
    if b is None:
        return ("removed",), ()
    changes = []
    if match == "hash" and a.ids != b.ids:
        changes.append("renamed")
    if sorted(set(a.ops)) != sorted(set(b.ops)):
        changes.append("op")
    if sorted(set(a.shapes)) != sorted(set(b.shapes)):
        changes.append("shape")
    if a.fused_with != b.fused_with:
        changes.append("fusion")
    if a.placement != b.placement:
        changes.append("placement")
    lineage = tuple(f"{stage}: {a.lineage[stage]}→{b.lineage[stage]}" for stage in a.lineage
                    if stage in b.lineage and a.lineage[stage] != b.lineage[stage])
    if lineage:
        changes.append("lineage")
    if a.bytes != b.bytes:
        changes.append("bytes")
    return tuple(changes), lineage


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
    rows = []
    for m in matches:
        side_a, side_b = facts_a.side(m.ids_a, m.key), facts_b.side(m.ids_b, m.key)
        changes, lineage = _changes(m.match, side_a, side_b)
        delta = _time_of(side_b) - _time_of(side_a) if timed else None
        rows.append(OpDiff(m.key, m.match, side_a, side_b, changes, delta, lineage))
    rows.sort(key=lambda row: (-abs(row.time_delta_ns or 0.0), row.key))
    return DiffResult(BundleInfo(a.source, a.backend, facts_a.invocations),
                      BundleInfo(b.source, b.backend, facts_b.invocations), tuple(rows))


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
        "key": row.key, "match": row.match, "changes": ";".join(row.changes),
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
                "counts": result.counts(),
                "rows": [{"key": row.key, "match": row.match, "changes": list(row.changes),
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


def render(result: DiffResult, limit: int | None = 40) -> str:
    """The changed or re-timed rows as a table (the first ``limit``; ``None``: all)."""
    counts = result.counts()
    lines = [f"A: {result.a.source} ({result.a.backend}, {result.a.invocations} invocations)",
             f"B: {result.b.source} ({result.b.backend}, {result.b.invocations} invocations)",
             "matched: " + ", ".join(f"{counts[m]} by {m}" for m in ("id", "hash", "name"))
             + f"; only in A: {counts['only-a']}, only in B: {counts['only-b']}; changed: {counts['changed']}"]
    shown = [row for row in result.rows if row.changes or row.time_delta_ns]
    if not shown:
        return "\n".join([*lines, "no differences"])
    header = f"{'key':<44} {'match':<6} {'Δtime ns':>10} {'A ns':>10} {'B ns':>10}  {'partitions A → B':<44} changes"
    lines += ["", header]
    for row in shown[:limit]:
        parts = f"{_short(row.a.partitions if row.a else ())} → {_short(row.b.partitions if row.b else ())}"
        lines.append(f"{_clip(row.key, 44):<44} {row.match:<6} {_ns(row.time_delta_ns, signed=True):>10} "
                     f"{_ns(row.a.time_ns if row.a else None):>10} {_ns(row.b.time_ns if row.b else None):>10}  "
                     f"{_clip(parts, 44):<44} {','.join(row.changes)}")
    if limit is not None and len(shown) > limit:
        lines.append(f"... {len(shown) - limit} more rows in diff.csv")
    unchanged = len(result.rows) - len(shown)
    if unchanged:
        lines.append(f"({unchanged} unchanged rows not shown)")
    return "\n".join(lines)


def _short(partitions: tuple[str, ...]) -> str:
    """``site3, site4`` for dispatches (the export names are in diff.csv)."""
    return ", ".join(p.split(":", 1)[0] if p.startswith("site") else p for p in partitions) or "-"


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def _ns(value: float | None, signed: bool = False) -> str:
    return "-" if value is None else f"{value:+.0f}" if signed else f"{value:.0f}"
