"""The direct ``.ireeprof`` reader (``runtime_hooks/profile_file.py``) against
``iree-profile``, the reference: on real profiles the :class:`hal_profile.Profile` it
builds equals the one decoded from ``iree-profile``'s JSON lines field by field — the
dispatch records, the queue, host-operation and memory records, the flush split — on
loops, branches and an initializer on both CPU drivers, and on Vulkan's
``dispatch-events`` / ``device-queue-events`` where a lavapipe device is present. A
damaged file is exit 2 naming the file and the byte offset."""

from __future__ import annotations

import re
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dfit_mlir.core.errors import EXIT_INVALID_INPUT
from dfit_mlir.passes.instrumented_compile import CompileResult, compile_instrumented
from dfit_mlir.runtime_hooks import drivers, hal_profile, profile_file, profile_stream
from tests.conftest import REPO

SHAPES = REPO / "tests" / "inputs" / "shapes"
#: (program, compile flags, inputs, invocations, driver).
CASES = {
    "loop_task": ("loop.mlir", (), ("16x16xf32=0.01", "i32=5"), 3, "local-task"),
    "loop_sync": ("loop.mlir", (), ("16x16xf32=0.01", "i32=5"), 3, "local-sync"),
    "branch_task": ("branch.mlir", (), ("16x16xf32=0.1", "i32=1"), 2, "local-task"),
    "initializer_sync": ("initializer.mlir", ("--iree-opt-const-eval=false",), ("8x64xf32=1",), 2, "local-sync"),
    "one_invocation": ("loop.mlir", (), ("16x16xf32=0.01", "i32=2"), 1, "local-task"),
}
#: Fields iree-profile prints that describe the output, not the record.
PRESENTATION = {"type", "host_time_domain", "time_domain", "duration_time_domain", "timing_source"}


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, CompileResult]:
    root = tmp_path_factory.mktemp("profile-file")
    return {source: compile_instrumented(SHAPES / source, root / f"{Path(source).stem}.vmfb", mode="ids",
                                         flags=flags)
            for source, flags in sorted({(c[0], c[1]) for c in CASES.values()})}


def record(vmfb: Path, inputs: tuple[str, ...], invocations: int, driver: str, families: tuple[str, ...],
           profile: Path, function: str = "main") -> None:
    hal_profile.record_profile(vmfb, inputs, profile, driver=driver, function=function, invocations=invocations,
                               families=families)


def assert_same_records(direct: Any, reference: Any, what: str) -> None:
    """Every record of ``reference`` (iree-profile's dicts) is the direct reader's, on
    every field both have; the JSON's presentation fields aside."""
    mine, theirs = list(direct), list(reference)
    assert len(mine) == len(theirs), what
    for row, (a, b) in enumerate(zip(mine, theirs, strict=True)):
        shared = {k: v for k, v in b.items() if k not in PRESENTATION and k in a}
        assert {k: a[k] for k in shared} == shared, f"{what} row {row}"
        # iree-profile adds a few derived fields (a device span's duration in ticks, ...).
        assert len(shared) >= len([k for k in b if k not in PRESENTATION]) - 3, f"{what}: fields missing"


def assert_same_profile(profile: Path, families: tuple[str, ...], invocations: int) -> hal_profile.Profile:
    direct = hal_profile.decode_profile(profile, families, invocations, direct=True)
    reference = hal_profile.decode_profile(profile, families, invocations, direct=False)
    assert direct.dispatches == reference.dispatches
    assert direct.flush_starts == reference.flush_starts
    for name in ("queue_events", "host_operations", "memory_events", "device_queue_events"):
        assert_same_records(getattr(direct, name), getattr(reference, name), name)
    assert (direct.clocks or {}) == (reference.clocks or {})
    return direct


@pytest.mark.parametrize("case", sorted(CASES))
def test_direct_reader_is_iree_profile(programs: dict[str, CompileResult], case: str, tmp_path: Path) -> None:
    source, _, inputs, invocations, driver = CASES[case]
    profile = tmp_path / "p.ireeprof"
    record(programs[source].vmfb, inputs, invocations, driver, hal_profile.FULL_FAMILIES, profile)
    assert profile_file.supported(profile)
    found = assert_same_profile(profile, hal_profile.FULL_FAMILIES, invocations)
    assert len(found.dispatches) and found.queue_events and found.memory_events
    assert all(len(event.workgroup_size) == 3 for event in found.dispatches)


def test_every_host_execution_record_is_iree_profiles(programs: dict[str, CompileResult], tmp_path: Path) -> None:
    """All host-execution records (dispatches too) on every field iree-profile prints."""
    profile = tmp_path / "p.ireeprof"
    record(programs["loop.mlir"].vmfb, CASES["loop_task"][2], 2, "local-task", hal_profile.FULL_FAMILIES, profile)
    tables = profile_file.read_profile(profile)
    assert_same_records(profile_file.host_execution_records(tables, dispatches=True),
                        hal_profile.decode_records(profile, "queue", "host_execution_event"), "host_execution_event")


@pytest.mark.parametrize(("block_bytes", "piece"), [(1, 1), (1000, 3), (4096, 1 << 20)])
def test_reader_in_small_blocks_reads_what_it_reads_in_big_blocks(
        programs: dict[str, CompileResult], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block_bytes: int,
        piece: int) -> None:
    """The reader walks the file a block at a time (the next read ahead, the record a
    block cut off carried into the next) and gathers each family a piece at a time: a
    block per record (1 byte), blocks cutting records (1000, 4096 bytes) and pieces of
    one or three records give the same tables, and the index's windows (the run's
    route, the same walk) the same records."""
    profile = tmp_path / "p.ireeprof"
    record(programs["loop.mlir"].vmfb, CASES["loop_task"][2], 7, "local-task", hal_profile.FULL_FAMILIES, profile)
    whole = profile_file.read_profile(profile)
    monkeypatch.setattr(profile_file, "BLOCK_BYTES", block_bytes)
    monkeypatch.setattr(profile_file, "GATHER_PIECE", piece)
    small = profile_file.read_profile(profile)
    assert list(small.records) == list(whole.records) and len(whole.records) >= 3
    for family, records in whole.records.items():
        assert records.dtype == profile_file.FAMILY_DTYPES[family] and len(records)
        assert small.records[family].tobytes() == records.tobytes(), family
        for table in ("chunk_starts", "chunk_streams", "chunk_devices"):
            assert getattr(small, table)[family].tolist() == getattr(whole, table)[family].tolist(), (family, table)
    assert small.functions == whole.functions and whole.functions
    assert small.dropped == whole.dropped == {}
    index = profile_stream.index_profile(profile, window_records=16)  # walked in the small blocks too
    assert index.windows > 2
    for family in index.counts:
        windows = [index.family_window(family, window) for window in range(index.windows)]
        assert b"".join(found.tobytes() for found in windows) == whole.records[family].tobytes(), family


def test_block_reader_hands_out_the_files_bytes_from_wherever_asked(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """SYNTHETIC bytes: each block is the file's bytes from the offset asked, whether
    made of the bytes read ahead and the last block's tail, or read afresh (a jump
    back, a tail longer than the room kept for it, a block longer than the read ahead,
    another file); a file shorter than asked is an error naming it."""
    monkeypatch.setattr(profile_file, "BLOCK_BYTES", 64)
    monkeypatch.setattr(profile_file, "CARRY_BYTES", 16)
    data = bytes(range(256)) * 4
    first, second = tmp_path / "a.bin", tmp_path / "b.bin"
    first.write_bytes(data)
    second.write_bytes(data[::-1])
    asks = [(0, 64), (60, 124), (124, 188), (150, 214), (170, 234), (100, 164), (300, 500), (480, 544), (544, 1024)]
    made: list[bool] = []  # whether each block was made of the bytes read ahead
    from_ahead = profile_file.BlockReader._from_ahead
    monkeypatch.setattr(profile_file.BlockReader, "_from_ahead", lambda self, *args: _recorded(from_ahead(self, *args),
                                                                                              made))
    with open(first, "rb") as a, open(second, "rb") as b, profile_file.BlockReader(ahead=True) as reader:
        for offset, stop in asks:
            block = reader.read(first, a.fileno(), offset, stop, len(data), "asked")
            assert len(block) >= stop - offset and block.tobytes() == data[offset:offset + len(block)], offset
        block = reader.read(second, b.fileno(), 8, 40, len(data), "asked")
        assert block.tobytes()[:32] == data[::-1][8:40]
        # Read ahead: the 2nd and 3rd (4 bytes carried); afresh: the rest, for the reasons above.
        assert made == [False, True, True, False, False, False, False, False, False, False]
        with pytest.raises(profile_file.ProfileFormatError, match=f"{first}: the file ends at byte 1024, before "
                                                                 f"byte 1030, asked"):
            reader.read(first, a.fileno(), 1000, 1030, 1030, "asked")


def _recorded(block: Any, made: list[bool]) -> Any:
    made.append(block is not None)
    return block


def _vulkan_missing() -> str | None:
    from tests.test_gpu_vulkan import _no_vulkan

    return _no_vulkan()


@pytest.mark.skipif(_vulkan_missing() is not None, reason=str(_vulkan_missing()))
def test_direct_reader_on_vulkan_dispatch_events(tmp_path: Path) -> None:
    from tests.test_gpu_vulkan import MLP, MLP_INPUTS, VULKAN

    source = tmp_path / "mlp.mlir"
    source.write_text(MLP)
    mlp = compile_instrumented(source, tmp_path / "mlp.vmfb", mode="ids", flags=tuple(VULKAN))
    families = tuple(drivers.CAPABILITIES["vulkan"].full)
    profile = tmp_path / "p.ireeprof"
    record(mlp.vmfb, tuple(MLP_INPUTS), 3, "vulkan", families, profile)
    found = assert_same_profile(profile, families, 3)
    assert len(found.dispatches) and found.clocks


def _damaged(tmp_path: Path, programs: dict[str, CompileResult], cut: Any) -> Path:
    profile = tmp_path / "p.ireeprof"
    record(programs["loop.mlir"].vmfb, CASES["loop_task"][2], 2, "local-task", hal_profile.FULL_FAMILIES, profile)
    data = bytearray(profile.read_bytes())
    profile.write_bytes(bytes(cut(data)))
    return profile


def _first_event_chunk(data: bytearray) -> int:
    """Byte offset of the first record whose content type ends in ``-events``."""
    offset = struct.unpack_from("<I", data, 8)[0]
    while True:
        length, header, type_length = struct.unpack_from("<Q", data, offset)[0], *struct.unpack_from(
            "<II", data, offset + 56)
        if data[offset + header:offset + header + type_length].endswith(b"-events"):
            return offset
        offset += length


@pytest.mark.parametrize("damage", ["cut_mid_chunk", "wrong_magic", "record_length", "unknown_chunk_type",
                                    "unknown_record_type", "bytes_appended", "length_short"])
def test_damaged_profile_is_exit_2_with_the_offset(programs: dict[str, CompileResult], tmp_path: Path,
                                                   damage: str) -> None:
    damaged_at: list[int] = []

    def cut(data: bytearray) -> bytearray:
        damaged_at.append(_first_event_chunk(data))
        if damage == "wrong_magic":
            data[:4] = b"XXXX"
        elif damage == "bytes_appended":  # passed as a whole profile before: the tail was never read
            data += b"\0" * 13
        elif damage == "length_short":  # the header's length cut (passed, or said "truncated" of a whole file)
            struct.pack_into("<Q", data, 16, len(data) - 1000)
        elif damage == "cut_mid_chunk":
            struct.pack_into("<Q", data, 16, 0)  # an unfinished bundle: no logical length
            data = data[:_first_event_chunk(data) + 150]
        elif damage == "unknown_chunk_type":  # "...queue-events" -> "...queue-eventz": same length, undefined
            at = _first_event_chunk(data)
            header, type_length = struct.unpack_from("<II", data, at + 56)
            data[at + header + type_length - 1:at + header + type_length] = b"z"
        elif damage == "unknown_record_type":
            struct.pack_into("<H", data, _first_event_chunk(data) + 100, 9)
        else:  # the first event record claims another size
            at = _first_event_chunk(data)
            payload_at = at + struct.unpack_from("<Q", data, at)[0] - struct.unpack_from("<Q", data, at + 8)[0]
            struct.pack_into("<I", data, payload_at, 999)
        return data

    profile = _damaged(tmp_path, programs, cut)
    with pytest.raises(hal_profile.DamagedProfileError) as error:
        hal_profile.decode_profile(profile, hal_profile.FULL_FAMILIES, 2)
    assert error.value.exit_code == EXIT_INVALID_INPUT
    assert str(profile) in str(error.value) and "byte" in str(error.value)
    if damage.startswith("unknown"):  # the exact offset, by both readers (the windowed one indexes first)
        offset = f"byte {damaged_at[0]} "
        assert offset in str(error.value)
        with pytest.raises(profile_file.ProfileFormatError, match=offset):
            profile_stream.index_profile(profile)
    if damage in ("bytes_appended", "length_short"):  # both readers say what the header and the file say
        size = profile.stat().st_size
        assert f"the file has {size}: a damaged header" in str(error.value)
        with pytest.raises(profile_file.ProfileFormatError, match=f"the file has {size}: a damaged header"):
            profile_stream.index_profile(profile)


def test_a_content_type_is_known_byte_for_byte() -> None:
    """Each chunk content type the format defines gets its code, and the same type with any
    one byte changed gets none (the words compared cover every byte: the last overlaps the
    one before)."""
    for content in profile_file._CONTENT_CODES:
        variants = [content, *(content[:at] + bytes([content[at] ^ 0x20]) + content[at + 1:]
                               for at in range(len(content)))]
        text = np.frombuffer(b"".join(variants), np.uint8).reshape(len(variants), len(content))
        codes = np.full(len(variants), -1, np.int64)
        profile_file._CONTENT_BY_LENGTH[len(content)].codes(text, np.arange(len(variants)), codes)
        assert codes.tolist() == [profile_file._CONTENT_CODES.get(variant, -1) for variant in variants]
        assert codes[0] >= 0 and (codes[1:] < 0).all()


def _first_chunk_of(data: bytearray, suffix: bytes) -> int:
    """Byte offset of the first record whose content type ends in ``suffix``."""
    offset = struct.unpack_from("<I", data, 8)[0]
    while True:
        length, header, type_length = struct.unpack_from("<Q", data, offset)[0], *struct.unpack_from(
            "<II", data, offset + 56)
        if data[offset + header:offset + header + type_length].endswith(suffix):
            return offset
        offset += length


@pytest.mark.parametrize("damage", ["payload_length_2^64-104", "record_length_2^64-1", "records_past_the_end",
                                    "records_inside_the_header"])
def test_a_length_or_offset_past_the_file_is_named_as_stored(programs: dict[str, CompileResult], tmp_path: Path,
                                                             damage: str) -> None:
    """Lengths are u64 and the first record's offset u32: one past the file is refused by
    both readers as the file stores it (a payload of 2^64 - 104 bytes turned to -104 in
    int64 and passed the header check: a ValueError deep in a gather; a first record
    past the end read as a profile of no records)."""
    at: list[int] = []

    def cut(data: bytearray) -> bytearray:
        chunk = _first_event_chunk(data)
        at.append(chunk)
        if damage == "payload_length_2^64-104":
            struct.pack_into("<Q", data, chunk + 8, 2**64 - 104)
        elif damage == "record_length_2^64-1":
            struct.pack_into("<Q", data, chunk, 2**64 - 1)
        else:
            struct.pack_into("<I", data, 8, 999_999_999 if damage == "records_past_the_end" else 12)
        return data

    profile = _damaged(tmp_path, programs, cut)
    expected = {"payload_length_2^64-104": f"byte {at[0]} has length",
                "record_length_2^64-1": f"byte {at[0]} has length {2**64 - 1}, which does not hold",
                "records_past_the_end": "the records start at byte 999999999, past the file's end",
                "records_inside_the_header": "the records start at byte 12, inside the 24-byte header"}[damage]
    for read in (profile_file.read_profile, profile_stream.index_profile):
        with pytest.raises(profile_file.ProfileFormatError, match=re.escape(expected)):
            read(profile)


def test_a_type_value_past_every_known_one_costs_no_memory(programs: dict[str, CompileResult],
                                                           tmp_path: Path) -> None:
    """SYNTHETIC: a memory and a queue record's ``type`` set to 2^32 - 1 (damage, or a
    newer runtime's operation): the index collects the distinct types by sorting, not
    by a bin per value up to it (32 GiB asked: a MemoryError, or seconds)."""
    def cut(data: bytearray) -> bytearray:
        for suffix in (b"memory-events", b"queue-events"):
            chunk = _first_chunk_of(data, suffix)
            payload_at = chunk + struct.unpack_from("<Q", data, chunk)[0] - struct.unpack_from("<Q", data, chunk + 8)[0]
            struct.pack_into("<I", data, payload_at + 4, 2**32 - 1)
        return data

    profile = _damaged(tmp_path, programs, cut)
    index = profile_stream.index_profile(profile, window_records=16)
    assert 2**32 - 1 in index.types["memory-events"] and 2**32 - 1 in index.types["queue-events"]
    assert profile_file.read_profile(profile).records["memory-events"]["type"].max() == 2**32 - 1


def test_any_damage_is_a_format_error_never_a_crash(programs: dict[str, CompileResult], tmp_path: Path) -> None:
    """SYNTHETIC damage of a real profile, 200 ways (seeded): cut at any byte, a header
    field or a record's bytes overwritten, a record's length changed. Each reader reads
    it or says :class:`ProfileFormatError` (the index may also leave it to the whole-run
    route); no other exception, whatever the bulk walk, the read ahead or a gather meets."""
    import random

    import numpy as np

    profile = tmp_path / "p.ireeprof"
    record(programs["loop.mlir"].vmfb, CASES["loop_task"][2], 3, "local-task", hal_profile.FULL_FAMILIES, profile)
    data = profile.read_bytes()
    starts = [struct.unpack_from("<I", data, 8)[0]]
    while starts[-1] < len(data):
        starts.append(starts[-1] + struct.unpack_from("<Q", data, starts[-1])[0])
    starts.pop()
    rng = random.Random(29)
    outcomes = {"read": 0, "refused": 0}
    damaged = tmp_path / "damaged.ireeprof"
    for case in range(200):
        copy = bytearray(data)
        kind = case % 4
        if kind == 0:  # cut anywhere (an unfinished file: no logical length)
            copy = copy[:rng.randrange(24, len(copy))]
            struct.pack_into("<Q", copy, 16, 0)
        elif kind == 1:  # one header field of one record: lengths, counts, types, flags
            at = rng.choice(starts) + rng.choice([0, 8, 24, 56, 60, 64, 68, 80, 88, 100])
            copy[at:at + 2] = rng.randbytes(2)
        elif kind == 2:  # bytes anywhere after the file header
            at = rng.randrange(24, len(copy) - 8)
            copy[at:at + 8] = rng.randbytes(8)
        else:  # a record's length off by a little or a lot
            at = rng.choice(starts)
            length = struct.unpack_from("<Q", copy, at)[0]
            struct.pack_into("<Q", copy, at, max(0, length + rng.choice([-9, -1, 1, 8, 104, 1 << 20, 1 << 40])))
        damaged.write_bytes(bytes(copy))
        try:
            tables = profile_file.read_profile(damaged)
            assert all(len(records) == len(np.asarray(records)) for records in tables.records.values())
            outcomes["read"] += 1
        except profile_file.ProfileFormatError:
            outcomes["refused"] += 1
        try:
            index = profile_stream.index_profile(damaged, window_records=16)
            for family in index.counts:
                for window in range(index.windows):
                    index.family_window(family, window)
        except (profile_file.ProfileFormatError, profile_stream.WindowedRouteUnavailable):
            pass
    assert outcomes["read"] and outcomes["refused"] > 100, outcomes


def test_unknown_version_goes_to_iree_profile(programs: dict[str, CompileResult], tmp_path: Path) -> None:
    def bump(data: bytearray) -> bytearray:
        struct.pack_into("<H", data, 6, 99)
        return data

    profile = _damaged(tmp_path, programs, bump)
    assert not profile_file.supported(profile)
    with pytest.raises(profile_file.ProfileFormatVersionError, match="format 1.99"):
        profile_file.read_profile(profile)
