"""Where an operator's static cost (MACs, FLOPs) is counted: once, in the partition(s)
that compute it, never in every partition that merely names it.

IREE splits one source op over several dispatches: a padded ``onnx.Conv`` becomes a
``slow_memcpy`` dispatch that writes the input into a zero-padded buffer and the
convolution dispatch itself; data tiling adds ``pack``/``unpack`` dispatches around a
matmul. Every one of them carries the op's ID (its lineage class is ``split``), and
counting the op's full MACs in each made the copy dispatch look like it computed 8.1M
MACs in 0.17 ms, far above the machine's peak.

The rule, per op with a cost, over the partitions that name it (``fused_ids``, else
``ids``, of a dispatch site; ``operator_ids`` of a reconstruction group):

* **by what the dispatches compute**: an IREE dispatch site carries, per source ID, the
  MACs / FLOPs its own lowered ops compute for that op (``region_macs`` /
  ``region_flops``, counted from the dispatch region's ``linalg`` ops by
  ``passes/region_costs.py``). Where any partition computes some of the op, its cost is
  placed in proportion to those weights (MACs, and a contraction's FLOPs, by
  ``region_macs``; other FLOPs by ``region_flops``), in whole units, so that a conv's
  MACs land where it convolves and not where its bias add was fused, and an encoding,
  pack or copy dispatch gets none. An op without a figure of its own (a frontend op no
  rule knows) takes the weights themselves: its cost is what its dispatches compute.
* otherwise (reconstructions, manifests before 1.3, ops whose lowered form no rule
  counts), by IREE's summary: one partition: all of it there; several: only those that
  *compute* count. A dispatch computes unless it is an encoding (data tiling's
  ``_encoding_N_encode_…``) or IREE's summary in its export name
  (``<function>_dispatch_<n>_<summary>``, written by IREE's AnnotateDispatches from the
  dispatch's dominant op) is pure data movement (:data:`DATA_MOVEMENT_SUMMARIES`); a
  reconstruction group always computes. If none computes (or several do: split-K, an
  op IREE distributed over dispatches), the cost is apportioned evenly over them in
  whole units, so the partitions' sum is the op's cost.

Every consumer of per-partition costs (the event pipeline's per-dispatch ``macs`` /
``flops`` columns, program-analyzer's roofline) takes them from here, so the sum over
partitions equals the sum over the ops the partitions name.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: First words of an IREE dispatch summary that move data without arithmetic.
DATA_MOVEMENT_SUMMARIES = ("slow_memcpy", "memcpy", "copy", "transpose", "pack", "unpack", "set_encoding",
                           "unset_encoding", "broadcast", "fill")
_SUMMARY = re.compile(r"_dispatch_\d+_(?P<summary>.+)$")
_ENCODING = re.compile(r"_encoding_\d+_(?:encode|decode|set_encoding|unset_encoding)")


def moves_data_only(export: str | None) -> bool:
    """Whether an IREE export's name says its dispatch only moves data (an encoding of
    data tiling, or a data-movement summary)."""
    if export and _ENCODING.search(export):
        return True
    match = _SUMMARY.search(export or "")
    return match is not None and match["summary"].startswith(DATA_MOVEMENT_SUMMARIES)


def placed_costs(members: Sequence[Iterable[str]], computes: Sequence[bool],
                 costs: Mapping[str, int | None],
                 weights: Sequence[Mapping[str, int] | None] | None = None) -> list[dict[str, int]]:
    """Per partition (in order): op ID → the part of the op's cost counted there.

    ``members``: the op IDs each partition names; ``computes``: whether each partition
    does arithmetic (see the module docstring); ``costs``: op ID → its whole cost (ops
    without one are left out unless a weight names them); ``weights``: per partition,
    op ID → what that partition's own ops compute of it, None where not counted."""
    weights = weights or [None] * len(members)
    naming: dict[str, list[int]] = defaultdict(list)
    for index, ids in enumerate(members):
        for op_id in dict.fromkeys(ids):
            if costs.get(op_id) is not None:
                naming[op_id].append(index)
    weighted: dict[str, dict[int, int]] = defaultdict(dict)
    for index, own in enumerate(weights):
        for op_id, amount in (own or {}).items():
            if amount > 0:
                weighted[op_id][index] = amount
    placed: list[dict[str, int]] = [{} for _ in members]
    for op_id, shares in weighted.items():
        cost = costs.get(op_id)
        for index, part in _apportion(sum(shares.values()) if cost is None else int(cost), shares).items():
            placed[index][op_id] = part
    for op_id, indices in naming.items():
        if op_id in weighted:
            continue
        counting = [i for i in indices if computes[i]] or indices
        whole, extra = divmod(int(costs[op_id] or 0), len(counting))
        for rank, index in enumerate(counting):
            placed[index][op_id] = whole + (1 if rank < extra else 0)
    return placed


def _apportion(amount: int, shares: Mapping[int, int]) -> dict[int, int]:
    """``amount`` in whole units in proportion to ``shares`` (largest remainder), so the
    parts sum to ``amount``."""
    total = sum(shares.values())
    exact = {index: amount * share / total for index, share in shares.items()}
    parts = {index: int(value) for index, value in exact.items()}
    for index in sorted(exact, key=lambda i: (parts[i] - exact[i], i))[: amount - sum(parts.values())]:
        parts[index] += 1
    return parts


def site_weights(sites: Sequence[Mapping[str, Any]], key: str,
                 kinds: Mapping[str, str | None]) -> list[dict[str, int] | None]:
    """Per site, op ID → the weight ``key`` (``macs``/``flops``) is placed by: its
    ``region_macs`` for MACs and for a contraction's FLOPs, its ``region_flops`` for
    other FLOPs; None for a site without region figures. ``kinds``: op ID → its
    ``cost_kind``."""
    found: list[dict[str, int] | None] = []
    for site in sites:
        macs, flops = site.get("region_macs"), site.get("region_flops")
        if macs is None and flops is None:
            found.append(None)
        elif key == "macs":
            found.append(dict(macs or {}))
        else:
            mine = {i: v for i, v in (flops or {}).items() if kinds.get(i) != "contraction"}
            mine.update({i: 2 * v for i, v in (macs or {}).items()})
            found.append(mine)
    return found


def op_figures(costs: Mapping[str, int | None], kinds: Mapping[str, str | None]) -> dict[str, int | None]:
    """``costs`` with 0 for an op whose rule knows it has none of this figure (an
    arithmetic op has no MACs, data movement no FLOPs): only an op no rule knows
    (``unknown``) takes its figure from the dispatches."""
    known = ("contraction", "arithmetic", "data")
    return {op_id: 0 if cost is None and kinds.get(op_id) in known else cost for op_id, cost in costs.items()}


def site_members(site: Mapping[str, Any]) -> list[str]:
    return list(site.get("fused_ids") or site.get("ids") or ())


def dispatch_site_costs(manifest: Mapping[str, Any], key: str) -> list[int | None]:
    """Per dispatch site of a manifest: its ``key`` (``macs`` / ``flops``) counted once
    per op; 0 for a counted dispatch computing none (an encoding); ``None`` for an
    uncounted site naming no op with a figure."""
    sites = manifest.get("partitions", {}).get("dispatch_sites", [])
    operators = manifest.get("operators", [])
    kinds = {op["id"]: op.get("cost_kind") for op in operators}
    costs = op_figures({op["id"]: op.get(key) for op in operators}, kinds)
    weights = site_weights(sites, key, kinds)
    placed = placed_costs([site_members(s) for s in sites], [not moves_data_only(s.get("export")) for s in sites],
                          costs, weights)
    # A counted dispatch that computes none of its ops' figures carries 0 (an encoding).
    return [sum(share.values()) if share else (0 if counted is not None else None)
            for share, counted in zip(placed, weights, strict=True)]


def settle_manifest_costs(manifest: dict[str, Any]) -> None:
    """At compile time, in place: an op no rule gives a figure takes what its dispatches
    compute for it (``cost_source``: ``dispatch``; else ``source``), and each dispatch
    site records its placed ``macs`` and ``flops`` (:func:`dispatch_site_costs`, per
    execution) and how often it runs per model call as far as the source says
    (``per_trip``, ``trips`` of its root op; None: not static)."""
    sites = manifest.get("partitions", {}).get("dispatch_sites", [])
    from_dispatch: dict[str, dict[str, int]] = {"macs": defaultdict(int), "flops": defaultdict(int)}
    for site in sites:
        for key, field in (("macs", "region_macs"), ("flops", "region_flops")):
            for op_id, amount in (site.get(field) or {}).items():
                from_dispatch[key][op_id] += amount
    for op in manifest.get("operators", []):
        op["cost_source"] = "source"
        if op.get("flops") is None and op["id"] in from_dispatch["flops"]:
            op["flops"] = from_dispatch["flops"][op["id"]]  # a contraction's 2 per MAC included
            op["macs"] = from_dispatch["macs"].get(op["id"]) or None
            op["cost_source"] = "dispatch"
            op["cost_kind"] = "contraction" if op["macs"] else "arithmetic"
    for key in ("macs", "flops"):
        for site, amount in zip(sites, dispatch_site_costs(manifest, key), strict=True):
            site[key] = amount
    # A dispatch runs as often as its root op: per trip inside a loop (passes/loop_trips.py).
    by_id = {op["id"]: op for op in manifest.get("operators", [])}
    for site in sites:
        root = by_id.get(site.get("root_id") or "", {})
        site["per_trip"], site["trips"] = root.get("per_trip", False), root.get("trips", 1)
