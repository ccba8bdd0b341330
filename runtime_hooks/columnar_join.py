"""The structural join (:func:`dfit_mlir.runtime_hooks.hal_profile.join_structural`)
over columns: the same rule, with the per-record work done by numpy.

A run repeats a few command buffers many times (every invocation, every loop trip), so
the join matches each *distinct* command-buffer execution once and spreads the answer
over its repeats: records are sorted into blocks (one per submission and command buffer),
each record gets a code for what it is (command index, export, workgroups), blocks with
the same buffer and codes share a signature, and only one block per signature goes
through the per-record matcher (:func:`hal_profile._explains`). Grouping by signature
uses a 64-bit hash of the codes and is then checked exactly (every record against its
signature's first block), so the result is the per-record join's, not a likely one.

Anything out of the ordinary — a block two recordings explain (decided by creation
order), a block none explains, a record in the wrong phase — returns ``None``, and the
per-record join runs instead and decides or raises its error with the record shown.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import numpy as np


@dataclass(frozen=True)
class JoinColumns:
    """One row per dispatch record, in runtime order (blocks in submission order, each
    in command order): the record's index in the input, its call site and invocation
    (``-1``: load time), its times, workgroup count product (``-1``: none) and tiles."""

    event: np.ndarray
    site: np.ndarray
    invocation: np.ndarray
    start_ns: np.ndarray
    duration_ns: np.ndarray
    workgroups: np.ndarray
    tiles: np.ndarray


@dataclass(frozen=True)
class _Records:
    sub: np.ndarray
    buffer: np.ndarray
    index: np.ndarray
    start: np.ndarray
    end: np.ndarray
    key: np.ndarray
    groups: np.ndarray
    group_sizes: np.ndarray
    tiles: np.ndarray
    numbered: bool


def _records(events: Sequence[Any]) -> _Records:
    """The records' fields as arrays; one C-level pass per field (``map`` over an
    ``attrgetter``), strings and workgroup tuples as codes of their distinct values."""
    count = len(events)

    def integers(name: str) -> np.ndarray:
        return np.fromiter(map(attrgetter(name), events), np.int64, count)

    def optional(name: str) -> np.ndarray:
        values = list(map(attrgetter(name), events))
        if None in values:
            return np.fromiter((-1 if v is None else v for v in values), np.int64, count)
        return np.fromiter(values, np.int64, count)

    def coded(name: str) -> tuple[np.ndarray, list[Any]]:
        values = list(map(attrgetter(name), events))
        distinct = {value: code for code, value in enumerate(dict.fromkeys(values))}
        return np.fromiter(map(distinct.__getitem__, values), np.int64, count), list(distinct)

    index = optional("command_index")
    key, _ = coded("key")
    groups, distinct_groups = coded("workgroup_count")
    return _Records(sub=integers("submission_id"), buffer=integers("command_buffer_id"), index=index,
                    start=integers("start_ns"), end=integers("end_ns"), key=key, groups=groups,
                    group_sizes=np.array([int(np.prod(g)) if g else -1 for g in distinct_groups], dtype=np.int64),
                    tiles=optional("tile_count"), numbered=bool((index >= 0).any()))


def _signatures(codes: np.ndarray, buffer: np.ndarray, first: np.ndarray, length: np.ndarray,
                position: np.ndarray, block_of: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(signature of each block, first block of each signature, in first-seen order), or
    ``None`` if two blocks share a hash but not their records (never seen: 64 bits)."""
    mix = np.random.default_rng(0x5EED).integers(1, 2**63 - 1, int(length.max()) + 1, dtype=np.uint64) | np.uint64(1)
    with np.errstate(over="ignore"):
        terms = (codes.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)) * mix[position]
        digest = np.add.reduceat(terms, first) ^ (buffer[first].astype(np.uint64) * np.uint64(0xBF58476D1CE4E5B9))
        digest ^= length.astype(np.uint64) * np.uint64(0x94D049BB133111EB)
    _, first_of, signature = np.unique(digest, return_index=True, return_inverse=True)
    # Renumber signatures by first occurrence: the matcher must see them in block order.
    rank = np.empty(len(first_of), dtype=np.int64)
    rank[np.argsort(first_of, kind="stable")] = np.arange(len(first_of))
    signature = rank[signature.ravel()]
    representative = np.sort(first_of)
    # Exact check: same buffer, length and every record's code as the representative.
    rep = representative[signature]
    if (buffer[first[rep]] != buffer[first]).any() or (length[rep] != length).any():
        return None
    if (codes[first[rep[block_of]] + position] != codes).any():
        return None
    return signature, representative


def _runtime_order(*keys: np.ndarray) -> np.ndarray:
    """Indices sorting the records by ``keys`` (most significant first); decoded profiles
    come sorted so already, which one vectorised comparison confirms."""
    ahead = np.zeros(len(keys[0]) - 1, dtype=bool)  # record i+1 sorts strictly after record i
    tied = np.ones(len(keys[0]) - 1, dtype=bool)
    for key in keys:
        ahead |= tied & (key[1:] > key[:-1])
        tied &= key[1:] == key[:-1]
    if (ahead | tied).all():
        return np.arange(len(keys[0]))
    return np.lexsort(keys[::-1])


def join_columns(events: Sequence[Any], manifest: dict[str, Any], function: str, invocations: int,
                 execute_submissions: Sequence[tuple[int, int]],
                 flush_starts: Sequence[int] | None = None) -> tuple[JoinColumns, list[int], dict[int, int]] | None:
    """(columns, invocation starts, buffer → recording) or ``None`` (see the module doc)."""
    from dfit_mlir.runtime_hooks import hal_profile

    if not events:
        return None
    partitions = manifest["partitions"]
    recordings, sites = partitions["recordings"], partitions["dispatch_sites"]
    invocation_ids, load_ids = hal_profile.candidate_recordings(manifest, function)
    records = _records(events)
    within = records.index if records.numbered else np.zeros_like(records.index)
    order = _runtime_order(records.sub, records.buffer, within, records.start)
    sub, buffer = records.sub[order], records.buffer[order]
    first = np.flatnonzero(np.concatenate(([True], (sub[1:] != sub[:-1]) | (buffer[1:] != buffer[:-1]))))
    length = np.diff(np.append(first, len(order)))
    block_of = np.repeat(np.arange(len(first)), length)
    position = np.arange(len(order)) - first[block_of]
    groups = int(records.groups.max()) + 1
    codes = ((records.index[order] + 1) * (int(records.key.max()) + 1) + records.key[order]) * groups \
        + records.groups[order]
    found = _signatures(codes, buffer, first, length, position, block_of)
    if found is None:
        return None
    signature, representative = found
    recording_of_buffer: dict[int, int] = {}
    fit_of: list[tuple[int, list[int]]] = []
    for block in representative.tolist():
        chunk = [events[i] for i in order[first[block]:first[block] + length[block]].tolist()]
        known = recording_of_buffer.get(int(buffer[first[block]]))
        pool = [known] if known is not None else load_ids + invocation_ids
        fits = [(index, positions) for index in pool
                if (positions := hal_profile._explains(recordings[index], chunk, records.numbered)) is not None]
        if len(fits) != 1:
            return None  # ambiguous or unexplained: the per-record join decides or says why
        fit_of.append(fits[0])
        recording_of_buffer[int(buffer[first[block]])] = fits[0][0]
    site_index = {(r["index"], p): sites[c["site"]]["index"]
                  for r in recordings for p, c in enumerate(r["commands"]) if c.get("site") is not None}
    offsets = np.cumsum([0] + [len(positions) for _, positions in fit_of])
    flat = np.array([site_index[index, p] for index, positions in fit_of for p in positions], dtype=np.int32)
    keys = execute_submissions or list(zip(sub[first].tolist(), buffer[first].tolist(), strict=True))
    starts = hal_profile.invocation_starts(manifest, function, invocations, recording_of_buffer, keys, flush_starts)
    block_recording = np.array([index for index, _ in fit_of], dtype=np.int64)[signature]
    invocation = np.searchsorted(np.array(starts, dtype=np.int64), sub[first], side="right") - 1
    load = np.isin(block_recording, np.array(load_ids, dtype=np.int64))
    if (load & (invocation >= 0)).any() or (~load & ((invocation < 0) | (invocation >= invocations))).any():
        return None  # a record in the wrong phase: the per-record join names it
    invocation = np.where(load, -1, invocation)
    site = flat[offsets[signature][block_of] + position]
    start = records.start[order]
    columns = JoinColumns(event=order, site=site, invocation=invocation[block_of].astype(np.int32), start_ns=start,
                          duration_ns=records.end[order] - start, workgroups=records.group_sizes[records.groups[order]],
                          tiles=records.tiles[order])
    return columns, starts, recording_of_buffer
