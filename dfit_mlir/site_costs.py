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

* one partition: all of it there;
* several: only those that *compute* count. A dispatch computes unless IREE's summary in
  its export name (``<function>_dispatch_<n>_<summary>``, written by IREE's
  AnnotateDispatches from the dispatch's dominant op) is pure data movement
  (:data:`DATA_MOVEMENT_SUMMARIES`); a reconstruction group always computes. If none
  computes (or several do: split-K, an op IREE distributed over dispatches), the cost is
  apportioned evenly over them in whole units, so the partitions' sum is the op's cost.

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


def moves_data_only(export: str | None) -> bool:
    """Whether an IREE export's name says its dispatch only moves data."""
    match = _SUMMARY.search(export or "")
    return bool(match) and match["summary"].startswith(DATA_MOVEMENT_SUMMARIES)


def placed_costs(members: Sequence[Iterable[str]], computes: Sequence[bool],
                 costs: Mapping[str, int | None]) -> list[dict[str, int]]:
    """Per partition (in order): op ID → the part of the op's cost counted there.

    ``members``: the op IDs each partition names; ``computes``: whether each partition
    does arithmetic (see the module docstring); ``costs``: op ID → its whole cost (ops
    without one are left out)."""
    naming: dict[str, list[int]] = defaultdict(list)
    for index, ids in enumerate(members):
        for op_id in dict.fromkeys(ids):
            if costs.get(op_id) is not None:
                naming[op_id].append(index)
    placed: list[dict[str, int]] = [{} for _ in members]
    for op_id, indices in naming.items():
        counting = [i for i in indices if computes[i]] or indices
        whole, extra = divmod(int(costs[op_id] or 0), len(counting))
        for rank, index in enumerate(counting):
            placed[index][op_id] = whole + (1 if rank < extra else 0)
    return placed


def site_members(site: Mapping[str, Any]) -> list[str]:
    return list(site.get("fused_ids") or site.get("ids") or ())


def dispatch_site_costs(manifest: Mapping[str, Any], key: str) -> list[int | None]:
    """Per dispatch site of a manifest: its ``key`` (``macs`` / ``flops``) counted once
    per op; ``None`` for a site naming no op with a figure."""
    sites = manifest.get("partitions", {}).get("dispatch_sites", [])
    costs = {op["id"]: op.get(key) for op in manifest.get("operators", [])}
    placed = placed_costs([site_members(s) for s in sites], [not moves_data_only(s.get("export")) for s in sites],
                          costs)
    return [sum(share.values()) if share else None for share in placed]
