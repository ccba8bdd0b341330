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

Format facts (``iree/hal/utils/profile_file.h``, whose layout IREE pins with static
asserts): a 24-byte file header (magic ``IRPF``, ``header_length`` u32 at 8,
``file_length`` u64 at 16), then records, each a 104-byte header (``record_length`` u64
at 0, ``payload_length`` at 8, ``stream_id`` at 24, ``header_length`` u32 at 56,
``content_type_length`` at 60, ``name_length`` at 64, ``chunk_flags`` u64 at 80,
``dropped_record_count`` at 88, ``record_type`` u16 at 100) followed by the content
type, the name and the payload. A queue-events payload is a run of
``iree_hal_profile_queue_event_t``, each starting with its own ``record_length`` (u32),
``event_id`` (u64) at 16 and ``submission_id`` (u64) at 32. What this module reads is
checked against ``iree-profile queue``'s own decoding of the same events.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

QUEUE_EVENTS = "application/vnd.iree.hal.profile.queue-events"
EVENTS_SUFFIX = "-events"
MAGIC = b"IRPF"
RECORD_TYPE_CHUNK = 2
#: ``IREE_HAL_PROFILE_CHUNK_FLAG_TRUNCATED``: the producer dropped records of this chunk.
CHUNK_FLAG_TRUNCATED = 1
_RECORD_HEADER = struct.Struct("<QQQQQQQIIIIIxxxxQQIHH")  # 104 bytes, iree_hal_profile_file_record_header_t
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
    dropped: int = 0

    @property
    def family(self) -> str:
        return self.content_type.rsplit(".", 1)[-1]


def event_chunks(profile: Path) -> list[EventChunk]:
    """The event chunks of the raw profile bundle ``profile``, in file order."""
    data = profile.read_bytes()
    if len(data) < 24 or data[:4] != MAGIC:
        raise FlushLayoutError(f"{profile}: not an IREE HAL profile bundle (no {MAGIC.decode()} header)")
    (offset,) = struct.unpack_from("<I", data, 8)
    (logical_end,) = struct.unpack_from("<Q", data, 16)
    end = logical_end or len(data)
    chunks = []
    while offset < end:
        if offset + _RECORD_HEADER.size > end:
            raise FlushLayoutError(f"{profile}: a record header at byte {offset} runs past the end ({end})")
        (length, payload_length, _session, stream_id, _event, _executable, _buffer, header_length, type_length,
         _name_length, _device, _queue, flags, dropped, _status, record_type, _) = _RECORD_HEADER.unpack_from(data, offset)
        if length < header_length + type_length + payload_length or offset + length > end:
            raise FlushLayoutError(f"{profile}: record at byte {offset} has length {length}, which does not hold "
                                   f"its header, content type and {payload_length}-byte payload within the file")
        content_type = data[offset + header_length:offset + header_length + type_length].decode("ascii", "replace")
        if record_type == RECORD_TYPE_CHUNK and content_type.endswith(EVENTS_SUFFIX):
            payload = data[offset + length - payload_length:offset + length]
            chunks.append(EventChunk(content_type, bool(flags & CHUNK_FLAG_TRUNCATED), stream_id,
                                     _queue_events(payload) if content_type == QUEUE_EVENTS else (), dropped))
        offset += length
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


def flush_split(chunks: Sequence[EventChunk], decoded: Sequence[dict[str, Any]]) -> tuple[int, ...]:
    """The first submission of each flush that holds queue events — of each invocation
    that issued any. The chunks' queue events are checked against ``decoded``
    (``iree-profile queue``'s ``queue_event`` records: every event in exactly one chunk,
    with the same submission), and submissions must grow from flush to flush."""
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
    return tuple(firsts)
