"""Invocation boundaries from the profile's flushes: the chunks of a raw HAL profile
bundle (``.ireeprof``), read for what ``iree-profile``'s projections drop — which chunk
each queue event was written in.

``iree-benchmark-module`` (IREE 3.13, ``tools/iree-benchmark-module-main.cc``) begins
profiling after the module is loaded and its inputs are made, and calls
``iree_hal_device_profiling_flush`` after every iteration of its loop (one invocation:
``--batch_size`` is 1), once the call has returned. A flush writes what was recorded
since the last one as one chunk per event family, and writes nothing for a family with
nothing recorded. Queue events are recorded when the host submits an operation, which a
call does before it returns. So the queue-events chunks are the invocations' own
submissions, one chunk per invocation that issued any — whatever control flow issued
them. (Host-execution records of work a call did not wait for may land in a later
flush; they are placed by their submission id, never by chunk.)

Format facts (``iree/hal/profile_*.h``): after the file header come records, each a
header (``record_length`` u64 at 0, ``payload_length`` u64 at 8, ``header_length`` u32
at 56) followed by its content type, name and payload — the payload is the record's last
``payload_length`` bytes. A queue-events payload is a run of
``iree_hal_profile_queue_event_t``, each starting with its own ``record_length`` (u32),
``event_id`` (u64) at 16 and ``submission_id`` (u64) at 32. Framing and chunk flags come
from ``iree-profile cat``; what this module reads from the payload is checked against
``iree-profile queue``'s own decoding of the same events.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

QUEUE_EVENTS = "application/vnd.iree.hal.profile.queue-events"
EVENTS_SUFFIX = "-events"
#: ``IREE_HAL_PROFILE_CHUNK_FLAG_TRUNCATED``: the producer dropped records of this chunk.
CHUNK_FLAG_TRUNCATED = 1
_EVENT_ID_AT, _SUBMISSION_ID_AT, _MIN_EVENT_LENGTH = 16, 32, 40


class FlushLayoutError(ValueError):
    """The bundle is not laid out as this reader knows it (another IREE version)."""


@dataclass(frozen=True, slots=True)
class EventChunk:
    """One chunk of events, as one flush wrote it."""

    content_type: str
    truncated: bool
    stream_id: int
    #: Queue-events chunks: (event_id, submission_id) of each event, in stored order.
    queue_events: tuple[tuple[int, int], ...] = ()

    @property
    def family(self) -> str:
        return self.content_type.rsplit(".", 1)[-1]


def event_chunks(profile: Path, records: Sequence[dict[str, Any]]) -> list[EventChunk]:
    """The event chunks of ``profile`` in file order; ``records``: ``iree-profile cat
    --format=jsonl`` of it (the file header first, then one line per record)."""
    data = profile.read_bytes()
    header = next((r for r in records if r.get("type") == "file"), None)
    if header is None or data[:4] != str(header.get("magic", "")).encode():
        raise FlushLayoutError(f"{profile}: no profile file header")
    offset = int(header["header_length"])
    chunks = []
    for record in (r for r in records if r.get("type") == "record"):
        length, payload_length = struct.unpack_from("<QQ", data, offset)
        if length != record["record_length"] or payload_length != record["payload_length"]:
            raise FlushLayoutError(f"{profile}: record {record['index']} at byte {offset} does not have the length "
                                   f"iree-profile gives it ({length} != {record['record_length']})")
        content_type = record.get("content_type", "")
        if record.get("record_type") == "chunk" and content_type.endswith(EVENTS_SUFFIX):
            payload = data[offset + length - payload_length:offset + length]
            chunks.append(EventChunk(content_type, bool(int(record.get("chunk_flags", 0)) & CHUNK_FLAG_TRUNCATED),
                                     int(record.get("stream_id", 0)),
                                     _queue_events(payload) if content_type == QUEUE_EVENTS else ()))
        offset += length
    if offset != len(data):
        raise FlushLayoutError(f"{profile}: records end at byte {offset} of {len(data)}")
    return chunks


def _queue_events(payload: bytes) -> tuple[tuple[int, int], ...]:
    events = []
    at = 0
    while at < len(payload):
        (length,) = struct.unpack_from("<I", payload, at)
        if length < _MIN_EVENT_LENGTH or at + length > len(payload):
            raise FlushLayoutError(f"a queue event of {length} bytes at payload byte {at} of {len(payload)}")
        (event_id,) = struct.unpack_from("<Q", payload, at + _EVENT_ID_AT)
        (submission_id,) = struct.unpack_from("<Q", payload, at + _SUBMISSION_ID_AT)
        events.append((event_id, submission_id))
        at += length
    return tuple(events)


@dataclass(frozen=True)
class FlushSplit:
    """The first submission of each invocation that issued any, from the queue-events
    chunks; ``truncated``: families whose records the profiler dropped."""

    first_submissions: tuple[int, ...]
    truncated: tuple[str, ...]


def flush_split(chunks: Sequence[EventChunk], decoded: Sequence[dict[str, Any]]) -> FlushSplit:
    """Check the chunks' queue events against ``decoded`` (``iree-profile queue``'s
    ``queue_event`` records: every event in exactly one chunk, with the same submission)
    and give each flush's first submission. Submissions grow from flush to flush."""
    queue = [c for c in chunks if c.content_type == QUEUE_EVENTS]
    if len({c.stream_id for c in queue}) > 1:
        raise FlushLayoutError(f"queue events of {len({c.stream_id for c in queue})} streams: one flush may write "
                               "several queue-event chunks, so chunks are not invocations")
    stored = {event: submission for c in queue for event, submission in c.queue_events}
    wanted = {int(r["event_id"]): int(r["submission_id"]) for r in decoded}
    if stored != wanted or sum(len(c.queue_events) for c in queue) != len(stored):
        differing = sorted(set(stored.items()) ^ set(wanted.items()))[:3]
        raise FlushLayoutError(f"the queue events read from the chunks are not iree-profile's "
                               f"(first differences, (event_id, submission_id): {differing})")
    firsts: list[int] = []
    last = 0
    for chunk in queue:
        submissions = [s for _, s in chunk.queue_events]
        if not submissions:
            continue
        if min(submissions) <= last:
            raise FlushLayoutError(f"flush {len(firsts)} holds submission {min(submissions)}, not after the "
                                   f"previous flush's last ({last})")
        firsts.append(min(submissions))
        last = max(submissions)
    truncated = tuple(sorted({c.family for c in chunks if c.truncated}))
    return FlushSplit(tuple(firsts), truncated)
