"""The structural join (:func:`dfit_mlir.runtime_hooks.hal_profile.join_structural`)
over columns: the same rule, with the per-record work done by numpy, on the records as
``hal_profile.decode_columns`` gives them (:class:`join_records.DispatchColumns`: no
Python object per record).

A run repeats a few command buffers many times (every invocation, every loop trip), so
the join matches each *distinct* command-buffer execution once and spreads the answer
over its repeats: records are sorted into blocks (one per submission and command buffer),
each record gets a code for what it is (command index, export, workgroups), blocks with
the same buffer and codes share a signature, and only one block per signature goes
through the per-record matcher (:func:`join_records.explains`). Grouping by signature
uses a 64-bit hash of the codes and is then checked exactly (every record against its
signature's first block), so the result is the per-record join's, not a likely one.

Anything out of the ordinary — a block two recordings explain (decided by creation
order), a block none explains, a record in the wrong phase — returns ``None``, and the
per-record join runs instead and decides or raises its error with the record shown.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dfit_mlir.runtime_hooks.join_records import (
    DispatchColumns,
    Executions,
    JoinColumns,
    candidate_recordings,
    explains,
    invocation_starts,
    runtime_order,
    shape_codes,
)


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


@dataclass(frozen=True)
class MatchedBlocks:
    """Each dispatch record's block (one submission and command buffer) and the
    recording command that issued it, before invocations are placed: what
    :func:`join_columns` and the windowed route (``profile_stream``) share."""

    ordered: DispatchColumns
    #: Rows of the input in runtime order (``None``: already so).
    order: np.ndarray | None
    first: np.ndarray
    length: np.ndarray
    block_of: np.ndarray
    position: np.ndarray
    signature: np.ndarray
    #: (recording, command positions) of each signature, in first-seen order.
    fit_of: list[tuple[int, list[int]]]
    recording_of_buffer: dict[int, int]


def match_blocks(records: DispatchColumns, manifest: dict[str, Any], function: str,
                 known: dict[int, int] | None = None, numbered: bool | None = None) -> MatchedBlocks | None:
    """Match each distinct block to the one recording that explains it (see the module
    doc); ``known``: buffers already matched (by earlier windows of the same run), whose
    blocks are checked against that recording only, as the whole-run join does for a
    buffer's later blocks; ``numbered``: the whole run's (a window may not say)."""
    partitions = manifest["partitions"]
    recordings = partitions["recordings"]
    invocation_ids, load_ids = candidate_recordings(manifest, function)
    numbered = records.numbered if numbered is None else numbered
    within = records.command_index if numbered else np.zeros_like(records.command_index)
    order = runtime_order(records.submission_id, records.command_buffer_id, within, records.start_ns)
    ordered = records if order is None else records.take(order)
    sub, buffer = ordered.submission_id, ordered.command_buffer_id
    first = np.flatnonzero(np.concatenate(([True], (sub[1:] != sub[:-1]) | (buffer[1:] != buffer[:-1]))))
    length = np.diff(np.append(first, len(sub)))
    block_of = np.repeat(np.arange(len(first)), length)
    position = np.arange(len(sub)) - first[block_of]
    codes = ((ordered.command_index + 1) * len(records.keys) + ordered.key) * len(records.workgroup_counts) \
        + ordered.workgroup
    found = _signatures(codes, buffer, first, length, position, block_of)
    if found is None:
        return None
    signature, representative = found
    recording_of_buffer: dict[int, int] = dict(known or {})
    fit_of: list[tuple[int, list[int]]] = []
    for block in representative.tolist():
        chunk = [ordered.event(row) for row in range(first[block], first[block] + length[block])]
        matched = recording_of_buffer.get(int(buffer[first[block]]))
        pool = [matched] if matched is not None else load_ids + invocation_ids
        fits = [(index, positions) for index in pool
                if (positions := explains(recordings[index], chunk, numbered)) is not None]
        if len(fits) != 1:
            return None  # ambiguous or unexplained: the per-record join decides or says why
        fit_of.append(fits[0])
        recording_of_buffer[int(buffer[first[block]])] = fits[0][0]
    return MatchedBlocks(ordered, order, first, length, block_of, position, signature, fit_of, recording_of_buffer)


def place_blocks(matched: MatchedBlocks, manifest: dict[str, Any], function: str, invocations: int,
                 starts: Sequence[int] | np.ndarray) -> JoinColumns | None:
    """The join's columns of ``matched``, each block in the invocation its submission
    falls in (``starts``: each invocation's first submission); ``None`` for a record in
    the wrong phase (the per-record join names it)."""
    partitions = manifest["partitions"]
    recordings, sites = partitions["recordings"], partitions["dispatch_sites"]
    _, load_ids = candidate_recordings(manifest, function)
    ordered, first, block_of, position = matched.ordered, matched.first, matched.block_of, matched.position
    signature, fit_of = matched.signature, matched.fit_of
    sub = ordered.submission_id
    site_index = {(r["index"], p): sites[c["site"]]["index"]
                  for index in {index for index, _ in fit_of} for r in (recordings[index],)
                  for p, c in enumerate(r["commands"]) if c.get("site") is not None}
    offsets = np.cumsum([0] + [len(positions) for _, positions in fit_of])
    flat = np.array([site_index[index, p] for index, positions in fit_of for p in positions], dtype=np.int32)
    block_recording = np.array([index for index, _ in fit_of], dtype=np.int64)[signature]
    invocation = np.searchsorted(np.asarray(starts, dtype=np.int64), sub[first], side="right") - 1
    load = np.isin(block_recording, np.array(load_ids, dtype=np.int64))
    if (load & (invocation >= 0)).any() or (~load & ((invocation < 0) | (invocation >= invocations))).any():
        return None  # a record in the wrong phase: the per-record join names it
    invocation = np.where(load, -1, invocation)
    site = flat[offsets[signature][block_of] + position]
    products = np.array([int(np.prod(g)) if g else -1 for g in ordered.workgroup_counts], dtype=np.int64)
    shape, shapes = shape_codes(ordered.workgroup, ordered.workgroup_counts, *ordered.size_codes())
    order = matched.order
    return JoinColumns(event=np.arange(len(sub)) if order is None else order, site=site,
                       invocation=invocation[block_of].astype(np.int32), start_ns=ordered.start_ns,
                       duration_ns=ordered.end_ns - ordered.start_ns, workgroups=products[ordered.workgroup],
                       tiles=ordered.tile_count, shape=shape, shapes=shapes)


def join_columns(records: DispatchColumns, manifest: dict[str, Any], function: str, invocations: int,
                 execute_submissions: Executions | Sequence[tuple[int, int]],
                 flush_starts: Sequence[int] | None = None) -> tuple[JoinColumns, list[int], dict[int, int]] | None:
    """(columns, invocation starts, buffer → recording) or ``None`` (see the module doc)."""
    if not len(records):
        return None
    matched = match_blocks(records, manifest, function)
    if matched is None:
        return None
    sub, buffer, first = matched.ordered.submission_id, matched.ordered.command_buffer_id, matched.first
    executions = execute_submissions if len(execute_submissions) else Executions(sub[first], buffer[first])
    starts = invocation_starts(manifest, function, invocations, matched.recording_of_buffer, executions,
                               flush_starts)
    columns = place_blocks(matched, manifest, function, invocations, starts)
    if columns is None:
        return None
    return columns, starts, matched.recording_of_buffer
