"""Shared materialisation: source IDs a dispatch names only because IREE merged data across
the function, not because their computation was fused into it.

IREE's canonicalisation and CSE merge identical ``tensor.empty`` ops, zero ``linalg.fill``
ops and splat constants across a whole function; the merged op keeps the location of its
first occurrence. Every dispatch region that later clones the merged op names that first
source op. On the squeezenet import, ``onnx.MaxPool#0``'s 64x55x55 ``tensor.empty`` and
its ``-inf`` constant land in four other dispatches, an expand conv's zero fill in the
dispatch of its sibling; on a transformer one ``embedding`` and one ``linear`` appear in
most dispatches. Listed as fused, they claim fusion that did not happen and take a share
of each dispatch's time.

What decides is what carries the ID *in the dispatch region* (the ``dispatch-creation``
module, before outlining). A non-root ID that only data-making ops carry there
(:data:`DATA_OPS`: empties, fills, constants, splats; terminators are neutral) is
**shared** in that site when it was merged across the function: its source op computes
(an ``onnx.Conv`` whose zero fill another conv's dispatch reuses), or, for a source op
that itself only makes data (a fill, a constant), when several sites name it — a
convolution's own accumulator fill, used there only, stays with it. An ID that any
other op carries — a ``linalg.generic`` doing the pooling, the ``arith.cmpf``/``select``
of a fused ReLU — is fused, and so is an op nested in a fused op (a ``linalg.yield`` in
its body). A site's root IDs are never shared.

Shared IDs move from ``fused_ids`` to ``shared_ids`` per call site (and per export: the
IDs shared in every site it serves) and are listed once under
``partitions.shared_materialisation``. Time, MACs and FLOPs are split over fused IDs
only. A site without region evidence (a manifest from a compile that did not record it)
falls back to the op's source kind: a constant, empty or fill that several sites name.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dfit_mlir.core.lineage import is_constant

#: Ops of a dispatch region that only make data: what CSE merges across a function.
DATA_OPS = frozenset({
    "tensor.empty", "linalg.fill", "arith.constant", "tensor.splat", "bufferization.alloc_tensor",
    "util.global.load", "flow.tensor.splat",
})
#: Ops that neither make data nor compute: the region's plumbing.
NEUTRAL_OPS = frozenset({
    "linalg.yield", "flow.return", "scf.yield", "iree_tensor_ext.dispatch.workgroup_count_from_slice",
    "flow.dispatch.workgroups", "flow.dispatch.region", "iree_tensor_ext.dispatch.tensor.load",
    "iree_tensor_ext.dispatch.tensor.store", "flow.dispatch.tensor.load", "flow.dispatch.tensor.store",
})
REGION_KINDS = frozenset({"flow.dispatch.workgroups", "flow.dispatch.region"})
#: Last name segments (lower case) of *source* ops that only make data (the fallback).
DATA_MAKING_SEGMENTS = frozenset({
    "empty", "empty_like", "new_empty", "empty_strided", "zeros", "zeros_like", "new_zeros", "ones", "ones_like",
    "new_ones", "full", "full_like", "new_full", "fill", "fill_", "splat", "literal", "constantofshape",
})
PHASE = "dispatch-creation"


def makes_data(kind: str) -> bool:
    """Whether a source op of ``kind`` (``tensor.empty``, ``onnx.ConstantOfShape``,
    ``torch.aten.zeros``, ``tosa.const``) only materialises data."""
    return is_constant(kind) or kind.lower().rsplit(".", 1)[-1] in DATA_MAKING_SEGMENTS


@dataclass(frozen=True)
class RegionEvidence:
    """One dispatch region: every ID it names, and those that only data-making (or
    neutral) ops carry."""

    ids: frozenset[str]
    data_only: frozenset[str]


@dataclass
class RegionLog:
    """Collects :class:`RegionEvidence` from the ``dispatch-creation`` module during a
    compile (observational: reads the module, changes nothing)."""

    regions: list[RegionEvidence] = field(default_factory=list)

    def observe(self, module: Any, phase: str, cache: Any) -> None:
        if phase == PHASE:
            self.regions = region_evidence(module, cache)


def region_evidence(module: Any, cache: Any) -> list[RegionEvidence]:
    """Per dispatch region in program order (``cache``: a snapshot ``LocationCache``)."""
    from dfit_mlir.passes.mlir_engine import OpTree

    tree = OpTree(module)
    found = []
    stack = list(reversed(tree.children(module)))
    while stack:
        op = stack.pop()
        if op.name not in REGION_KINDS:
            stack.extend(reversed(tree.children(op)))
            continue
        working: set[str] = set()
        named: set[str] = set(cache.ids(op.location))
        inner = deque(tree.children(op))
        while inner:
            child = inner.popleft()
            ids = cache.ids(child.location)
            named.update(ids)
            if child.name not in DATA_OPS and child.name not in NEUTRAL_OPS:
                working.update(ids)
            if child.name != "linalg.fill":  # a fill's body is part of the fill
                inner.extend(tree.children(child))
        found.append(RegionEvidence(frozenset(named), frozenset(named - working)))
    return found


def source_kind(op: Mapping[str, Any]) -> str:
    """The op as the frontend names it (``source_op``) where known, else the manifest's op."""
    return op.get("source_op") or op.get("op") or ""


def separate_shared(partitions: dict[str, Any], regions: Sequence[RegionEvidence],
                    operators: Iterable[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """``partitions`` (the manifest's dispatch table) with each site's and export's shared
    materialisation moved from ``fused_ids`` to ``shared_ids``, and listed under
    ``shared_materialisation`` (``[{"id", "op", "sites"}]``, most sites first). A site
    is matched to its region by the IDs it names, in program order."""
    operators = list(operators)
    kinds = {op["id"]: source_kind(op) for op in operators}
    parent_of = {op["id"]: op.get("parent") for op in operators}
    sites = partitions.get("dispatch_sites") or []
    queues: defaultdict[frozenset[str], deque[RegionEvidence]] = defaultdict(deque)
    for region in regions:
        queues[region.ids].append(region)
    sites_naming: defaultdict[str, int] = defaultdict(int)
    for site in sites:
        for op_id in set(site.get("fused_ids") or ()):
            sites_naming[op_id] += 1

    new_sites = []
    for site in sites:
        fused = list(site.get("fused_ids") or ())
        roots = {site.get("root_id"), *(site.get("ids") or ())}
        queue = queues.get(frozenset(fused))
        evidence = queue.popleft().data_only if queue else None
        shared = {i for i in fused if i not in roots and _merged(i, evidence, makes_data(kinds.get(i, "")),
                                                                  sites_naming[i])}
        shared = {i for i in shared if not _inside_fused(i, set(fused) - shared, parent_of)}
        new_sites.append({**site, "fused_ids": [i for i in fused if i not in shared],
                          "shared_ids": [i for i in fused if i in shared]})

    by_export: defaultdict[str, list[dict[str, Any]]] = defaultdict(list)
    for site in new_sites:
        by_export[site["export"]].append(site)
    new_exports = []
    for export in partitions.get("exports") or []:
        served = by_export.get(export["name"], [])
        fused_anywhere = {i for site in served for i in site["fused_ids"]}
        shared_anywhere = {i for site in served for i in site["shared_ids"]}
        shared = [i for i in export.get("fused_ids") or () if i in shared_anywhere and i not in fused_anywhere]
        new_exports.append({**export, "fused_ids": [i for i in export.get("fused_ids") or () if i not in shared],
                            "shared_ids": shared})

    where: defaultdict[str, list[int]] = defaultdict(list)
    for site in new_sites:
        for op_id in site["shared_ids"]:
            where[op_id].append(site["index"])
    listing = [{"id": op_id, "op": kinds.get(op_id), "sites": indices}
               for op_id, indices in sorted(where.items(), key=lambda item: (-len(item[1]), item[0]))]
    return {**partitions, "dispatch_sites": new_sites, "exports": new_exports, "shared_materialisation": listing}


def _merged(op_id: str, data_only: frozenset[str] | None, source_makes_data: bool, sites: int) -> bool:
    """Whether a non-root ID of a site is there as merged data (module docstring);
    ``data_only``: the region's evidence, ``None`` when there is none (then only a
    data-making source op named by several sites is)."""
    if data_only is None:
        return source_makes_data and sites > 1
    return op_id in data_only and (not source_makes_data or sites > 1)


def _inside_fused(op_id: str, fused: set[str], parent_of: Mapping[str, str | None]) -> bool:
    """Whether an enclosing op of ``op_id`` (a ``linalg.generic`` around its ``yield``) is fused."""
    parent = parent_of.get(op_id)
    while parent:
        if parent in fused:
            return True
        parent = parent_of.get(parent)
    return False


def shared_ids_of(manifest: Mapping[str, Any]) -> dict[str, list[int]]:
    """``{id: [site indices]}`` of the manifest's shared materialisation (empty for a
    manifest written before it was separated)."""
    return {row["id"]: list(row["sites"]) for row in manifest.get("partitions", {}).get("shared_materialisation") or ()}
