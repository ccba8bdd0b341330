"""Declarative input → expected output tests of the runtime join's small readers: the
signal a child died of, the entry anchor that splits invocations, the bound of integer
inputs, the export table's declarations. SYNTHETIC inputs (written for the tests); the
same code runs on real modules in test_runtime_shapes.py and test_runtime_realmodels.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dfit_mlir.core.vmfb import ExportedFunction
from dfit_mlir.passes.host_calls import anchor
from dfit_mlir.runtime_hooks.inputs import integer_bounds
from dfit_mlir.runtime_hooks.run import fault_signal


@pytest.mark.parametrize("returncode, signal", [
    (-11, 11), (-6, 6), (139, 11), (134, 6), (245, 11),  # killed; shell-style 128+n; exit(-n) as 256-n
    (0, None), (1, None), (2, None), (3, None), (255, None),
])
def test_fault_signal(returncode: int, signal: int | None) -> None:
    assert fault_signal(returncode) == signal


def _function(entry: list, queue_ops: int = 0, calls: tuple[str, ...] = ()) -> dict:
    return {"public": True, "initializer": False, "calls": list(calls), "executes": [], "entry": entry,
            "queue_ops": queue_ops}


@pytest.mark.parametrize("functions, name, expected", [
    # Straight into an execution after two allocas.
    ({"main": _function([["queue"], ["queue"], ["execute", [0]]], 3)}, "main", ([0], 2)),
    # A sync wrapper calling its $async body first (PyTorch/ONNX imports).
    ({"main": _function([["call", "main$async"]], 0, ("main$async",)),
      "main$async": _function([["queue"], ["execute", [1, 2]]], 2)}, "main", ([1, 2], 1)),
    # A call to a helper that issues nothing is skipped.
    ({"main": _function([["call", "h"], ["queue"], ["execute", [0]]], 2, ("h",)), "h": _function([], 0)},
     "main", ([0], 1)),
    # A call that issues queue operations but has no anchor of its own: unknown.
    ({"main": _function([["call", "h"], ["execute", [0]]], 1, ("h",)), "h": _function([["queue"]], 3)},
     "main", None),
    # No execution in the entry block (all under control flow), or one that cannot be traced.
    ({"main": _function([["queue"]], 4)}, "main", None),
    ({"main": _function([["execute", None]], 1)}, "main", None),
])
def test_entry_anchor(functions: dict, name: str, expected: tuple | None) -> None:
    assert anchor(functions, name) == expected


def _manifest(*chain: tuple[str, list]) -> dict:
    """main(arg0: 1x8xsi64) feeding ops in a chain; each (op, operands)."""
    operators, tensors = [], [{"id": "main/arg0", "producer": "main", "consumers": [], "shape": [1, 8],
                               "dtype": "si64"}]
    previous = tensors[0]
    for position, (op, operands) in enumerate(chain):
        op_id = f"main/{op}#{position}"
        operators.append({"id": op_id, "op": op, "operands": operands})
        previous["consumers"].append(op_id)
        previous = {"id": f"{op_id}:0", "producer": op_id, "consumers": [], "shape": [1, 8], "dtype": "si64"}
        tensors.append(previous)
    return {"operators": operators, "tensors": tensors}


def _one_hot_manifest() -> dict:
    """main(arg0) compared with a broadcast iota of 10, as JAX's one_hot lowers."""
    manifest = _manifest(("stablehlo.broadcast_in_dim", [IDS]), ("stablehlo.compare", [IDS, IDS]))
    manifest["operators"] += [{"id": "main/stablehlo.iota#0", "op": "stablehlo.iota", "operands": []},
                              {"id": "main/stablehlo.broadcast_in_dim#9", "op": "stablehlo.broadcast_in_dim",
                               "operands": [{"shape": [1, 10]}]}]
    manifest["tensors"] += [
        {"id": "main/stablehlo.iota#0:0", "producer": "main/stablehlo.iota#0",
         "consumers": ["main/stablehlo.broadcast_in_dim#9"], "shape": [1, 10], "dtype": "si64"},
        {"id": "main/stablehlo.broadcast_in_dim#9:0", "producer": "main/stablehlo.broadcast_in_dim#9",
         "consumers": ["main/stablehlo.compare#1"], "shape": [8, 10], "dtype": "si64"}]
    return manifest


TABLE = {"shape": [500, 16], "dtype": "f32"}
IDS = {"shape": [1, 8], "dtype": "si64"}


@pytest.mark.parametrize("manifest, expected", [
    (_manifest(("torch.aten.embedding", [TABLE, IDS])), {0: 500}),
    (_manifest(("torch.aten.to.dtype", [IDS]), ("torch.aten.embedding", [TABLE, IDS])), {0: 500}),
    (_manifest(("onnx.Gather", [{"shape": [30, 40, 7]}, IDS])), {0: 7}),  # any axis: the smallest dim
    (_manifest(("torch.aten.add.Tensor", [IDS, IDS]), ("torch.aten.embedding", [TABLE, IDS])), {}),  # not an index
    (_manifest(("torch.aten.mul.Tensor", [IDS, IDS])), {}),
    (_one_hot_manifest(), {0: 10}),
])
def test_integer_bounds(manifest: dict, expected: dict[int, int]) -> None:
    assert {k: bound for k, (bound, _) in integer_bounds(manifest, "main").items()} == expected


@pytest.mark.parametrize("declaration, arguments", [
    ("sync func @main(%input0: tensor<1x?x3xf32>, %input1: tensor<i64>) -> (%output0: tensor<f32>)",
     [{"shape": [1, None, 3], "dtype": "f32"}, {"shape": [], "dtype": "i64"}]),
    ("async func @second(%input0: tensor<32x32xf32>) -> (%output0: tensor<32x32xf32>)",
     [{"shape": [32, 32], "dtype": "f32"}]),
    ("sync func @f() -> (%output0: tensor<2xf32>)", []),
    ("sync func @f(%input0: !torch.int)", None),
    (None, None),
])
def test_export_declarations(declaration: str | None, arguments: list | None) -> None:
    assert ExportedFunction("f", declaration).arguments == arguments


def test_a_fault_saves_the_generated_inputs(tmp_path) -> None:
    """Generated inputs live in a scratch directory that goes with the run: a fault
    copies them beside the (unwritten) bundle and names that directory."""
    import numpy as np

    from dfit_mlir.core.errors import ModuleFaultError
    from dfit_mlir.runtime_hooks.run import FaultContext

    scratch = tmp_path / "dfit-run-abc"
    scratch.mkdir()
    np.save(scratch / "input0.npy", np.arange(4))
    fault = FaultContext(tmp_path / "m.vmfb", "main", [f"@{scratch / 'input0.npy'}", "2xf32=1"], tmp_path / "b", 1)
    with pytest.raises(ModuleFaultError, match=r"m\.vmfb: main faulted with SIGABRT in iree-run-module in invocation 1 "
                                               r"of 1 \(no bundle written\); inputs used: .*/b\.fault-inputs$"):
        fault.raise_for(6, "iree-run-module")
    assert np.array_equal(np.load(tmp_path / "b.fault-inputs" / "input0.npy"), np.arange(4))
    assert not (tmp_path / "b").exists()


def test_a_child_killed_by_sigkill_is_said_to_have_run_out_of_memory(tmp_path) -> None:
    """SIGKILL comes from the kernel (its out-of-memory killer), not from a module: the
    message says so, where a stderr line would say nothing (the binary was killed)."""
    from dfit_mlir.core.errors import ModuleFaultError
    from dfit_mlir.runtime_hooks.run import OUT_OF_MEMORY_HINT, FaultContext

    fault = FaultContext(tmp_path / "m.vmfb", "main", ["16x16xf32=1", "4294967296"], tmp_path / "b", 1)
    with pytest.raises(ModuleFaultError) as error:
        fault.raise_for(9, "iree-benchmark-module")
    assert "faulted with SIGKILL" in str(error.value) and str(error.value).endswith(f"({OUT_OF_MEMORY_HINT})")


def test_an_anchor_that_dispatches_nothing_is_found_by_its_executions() -> None:
    """The entry block's first command buffer only copies (no dispatch record names its
    buffer): it is the one buffer nothing else explains that runs once per call."""
    from dfit_mlir.runtime_hooks.hal_profile import invocation_starts

    manifest = {"partitions": {
        "recordings": [
            {"index": 0, "function": "__main_memoize_apply", "commands": [{"op": "copy_buffer"}],
             "global_name": "g0", "executors": ["main"], "load_time": False},
            {"index": 1, "function": "__main_memoize_apply_0", "commands": [{"op": "dispatch", "site": 0}],
             "global_name": "g1", "executors": ["main"], "load_time": False}],
        "host_functions": {"main": _function([["queue"], ["execute", [0]]], 4) | {"executes": [[0], [1]]}},
    }}
    executions = [(4, 1), (6, 2), (9, 1), (11, 2)]  # (submission, command buffer) of each execute
    assert invocation_starts(manifest, "main", 2, {2: 1}, executions) == [3, 8]


@pytest.mark.parametrize("values", [[], [5], [3, -1, 3, 2, 2, 9, -1], list(range(1000, 0, -3)) * 2],
                         ids=["empty", "one", "repeats", "many"])
def test_sorted_distinct_is_np_unique(values: list[int]) -> None:
    """SYNTHETIC: the sort-based distinct values (what a long run's arrays use instead of
    numpy 2's hashing ``np.unique``) are ``np.unique``'s, values and dtype."""
    from dfit_mlir.core.perf import sorted_distinct

    array = np.array(values, dtype=np.int64)
    found, expected = sorted_distinct(array), np.unique(array)
    assert found.tolist() == expected.tolist() and found.dtype == expected.dtype
    assert array.tolist() == values  # the input is not sorted in place


@pytest.mark.parametrize("values", [[], [5], [3, -1, 3, 2, 2, 9, -1], [4] * 9, list(range(1000, 0, -3)) * 2],
                         ids=["empty", "one", "repeats", "same", "many"])
@pytest.mark.parametrize("step", [1, 2, 5, 1 << 18])
def test_distinct_in_place_is_np_unique(values: list[int], step: int) -> None:
    """SYNTHETIC: sorted and made distinct in place, a piece at a time (the index's
    executions), the front of the array holds ``np.unique``'s values."""
    from dfit_mlir.core.perf import distinct_in_place

    array = np.array(values, dtype=np.int64)
    count = distinct_in_place(array, step)
    assert array[:count].tolist() == np.unique(np.array(values, dtype=np.int64)).tolist()


@pytest.mark.parametrize("values", [[], [5], [3, 1, 2], [2**62, -(2**62), 7, 2**62 - 1, 1],
                                    list(range(999_999, 0, -7))], ids=["empty", "one", "three", "huge", "many"])
def test_duration_stats_of_an_array_are_the_lists_exactly(values: list[int]) -> None:
    """SYNTHETIC: the stats of a run's per-invocation times, taken as an int64 array, are
    those of the Python integers: ``statistics.median`` (the mean of the two middle ones
    for an even count, as the view's spread takes it) and an exact mean (a float64 sum
    would round the huge ones), ints where ints were."""
    import statistics

    from dfit_mlir.runtime_hooks.instrument import duration_stats

    expected = None if not values else {
        "count": len(values), "min": min(values), "median": statistics.median(values),
        "mean": sum(values) / len(values), "max": max(values)}
    for given in (values, np.array(values, dtype=np.int64)):
        found = duration_stats(given)
        assert found == expected
        assert found is None or all(type(found[key]) is type(expected[key]) for key in found)  # type: ignore[index]


@pytest.mark.parametrize("values", [[], [5], [3, 1, 2], [4, 1], [2**62, -(2**62), 7, 2**62 - 1, 1],
                                    [-(2**63), 2**63 - 1, 0, -1], [7] * 10 + [-3] * 9, list(range(999_999, 0, -7))],
                         ids=["empty", "one", "three", "two", "huge", "int64-ends", "repeats", "many"])
@pytest.mark.parametrize("piece", [1, 3, 1 << 18])
def test_duration_stats_a_piece_at_a_time_are_the_whole_arrays(values: list[int], piece: int) -> None:
    """SYNTHETIC: the stats of values given a piece at a time (a long run's per-invocation
    times, in a file) are those of the whole array: the median by a radix select over
    the pieces (both middle values of an even count), the mean exact."""
    from dfit_mlir.core.perf import kth_smallest
    from dfit_mlir.runtime_hooks.instrument import duration_stats, piecewise_duration_stats

    array = np.array(values, dtype=np.int64)

    def pieces() -> Any:
        return (array[begin:begin + piece] for begin in range(0, len(array), piece))

    found = piecewise_duration_stats(pieces)
    assert found == duration_stats(array)
    assert found is None or all(type(found[key]) is type(duration_stats(values)[key]) for key in found)  # type: ignore[index]
    ordered = sorted(values)
    for k in {0, len(values) // 2, len(values) - 1} if values else ():
        assert kth_smallest(pieces, k) == ordered[k]
    with pytest.raises(IndexError):
        kth_smallest(pieces, len(values))


def test_paged_arrays_keep_their_values_and_hand_their_pages_back(tmp_path: Path) -> None:
    """The arrays a long run keeps in files (``core.paged``): filled, grown, copied and
    written through the mapping, they hold what the same calls give in memory, after
    their pages are handed back too; handed back, none of their pages is resident
    (the kernel's own count, ``/proc/self/smaps``); discarded, their files are gone."""
    from dfit_mlir.core.paged import PagedArrays

    size, step = 100_000, 4096

    def filled(paged: PagedArrays) -> dict[str, np.ndarray]:
        arrays = {"low": paged.full("low", size, np.iinfo(np.int64).max, np.int64),
                  "counts": paged.full("counts", size, 0, np.int32),
                  "copied": paged.copied("copied", np.arange(size, dtype=np.uint32) * 3, step=step)}
        np.minimum.at(arrays["low"], np.arange(0, size, 7), np.arange(0, size, 7) - 5)
        arrays["counts"][::3] += 2
        paged.release()
        arrays["counts"] = paged.grown("counts", arrays.pop("counts"), size * 2, 9)
        arrays["counts"][-1] = 4
        paged.release()
        return arrays

    in_memory, on_disk = filled(PagedArrays(None)), filled(paged := PagedArrays(tmp_path))
    assert not PagedArrays(None).on_disk and paged.on_disk
    for name, values in in_memory.items():
        assert np.array_equal(values, on_disk[name]) and values.dtype == on_disk[name].dtype, name
    assert in_memory["counts"][size:-1].tolist() == [9] * (size - 1)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["copied.values", "counts.values", "low.values"]

    def resident_kib(name: str) -> int:
        """Resident KiB of the mapping of ``name``'s file (its smaps entry)."""
        lines = Path("/proc/self/smaps").read_text().splitlines()
        at = next(i for i, line in enumerate(lines) if line.endswith(f"/{name}.values"))
        return int(next(line.split()[1] for line in lines[at:] if line.startswith("Rss:")))

    if Path("/proc/self/smaps").exists():
        int(on_disk["low"].sum())  # every page touched
        assert resident_kib("low") >= size * 8 // 1024
        paged.release()
        assert resident_kib("low") == 0
        assert [int(piece.sum()) for (piece,) in paged.pieces(on_disk["low"], step=step)] == \
            [int(in_memory["low"][begin:begin + step].sum()) for begin in range(0, size, step)]
        assert resident_kib("low") == 0  # each piece handed back as the next is asked for
    paged.discard()
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("in_files", [False, True], ids=["in memory", "in files"])
def test_a_column_read_while_it_grows_holds_every_row_so_far(tmp_path: Path, in_files: bool) -> None:
    """``Appended.so_far`` (what the early join reads of the index walk's columns while the
    walk goes on): every row added so far, rows of two values too; the column goes on
    taking pieces, and read whole at the end (``array``) holds every row, in order."""
    from dfit_mlir.core.paged import PagedArrays

    paged = PagedArrays(tmp_path if in_files else None)
    column, pairs = paged.appended("column", np.int64), paged.appended("pairs", np.int32, width=2)
    assert column.so_far().shape == (0,) and pairs.so_far().shape == (0, 2)
    added: list[int] = []
    for piece in ([3, 1], [4], [], [1, 5, 9, 2]):
        column.add(np.array(piece))
        pairs.add(np.array([[value, -value] for value in piece], np.int32).reshape(-1, 2))
        added += piece
        assert column.so_far().tolist() == added
        assert pairs.so_far().tolist() == [[value, -value] for value in added]
    column.add(np.array([6]))
    assert column.array().tolist() == [*added, 6] and pairs.array().shape == (len(added), 2)


@pytest.mark.parametrize("index", [[], [0], [4, 4, 4], [9, 2, 7, 2, 9, 9], list(range(50, 0, -3))],
                         ids=["none", "first", "repeated", "unordered", "many"])
def test_add_counts_counts_as_add_at(index: list[int]) -> None:
    """SYNTHETIC: counting over the span the indices cover adds what ``np.add.at`` of
    ones adds, onto counts already there, and nothing outside the span."""
    from dfit_mlir.core.perf import add_counts

    counts, expected = np.arange(60, dtype=np.int64), np.arange(60, dtype=np.int64)
    add_counts(counts, np.array(index, dtype=np.int64))
    np.add.at(expected, np.array(index, dtype=np.int64), 1)
    assert counts.tolist() == expected.tolist()


@pytest.mark.parametrize("failure", ["no space", "not supported"])
def test_paged_arrays_reserve_their_disk_space_before_mapping(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              failure: str) -> None:
    """A mapped write to a page a full disk has no room for kills the process (SIGBUS);
    the space is reserved first, so a full disk is an ``OSError`` naming the file (the
    CLI's one line and exit 2) before anything is mapped; a filesystem that cannot
    reserve is written sparse, as without it."""
    import errno
    import os

    from dfit_mlir.core.paged import PagedArrays

    def refuse(fd: int, offset: int, size: int) -> None:
        raise OSError(errno.ENOSPC if failure == "no space" else errno.EOPNOTSUPP, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", refuse, raising=False)
    paged = PagedArrays(tmp_path)
    if failure == "no space":
        with pytest.raises(OSError) as error:
            paged.full("totals", 1000, -1, np.int64)
        assert error.value.errno == errno.ENOSPC and error.value.filename == str(tmp_path / "totals.values")
        assert "TMPDIR" in error.value.strerror
    else:
        assert paged.full("totals", 1000, -1, np.int64).tolist() == [-1] * 1000


def test_a_full_disk_names_the_file_dfit_was_writing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk, wherever a long run writes (found by a new-user trial on a small
    tmpfs as TMPDIR): the paged columns and the plan's totals (numpy's ``tofile`` said "N
    requested and M written", no errno, no file, and the CLI named the input module), the
    profile the IREE tool writes (its own failure, exit 3, said nothing of TMPDIR) and the
    bundle (Arrow's writer names no file) each are ``OSError(ENOSPC)`` naming the file or
    folder: the CLI's one line and exit 2."""
    import errno
    import subprocess

    from dfit_mlir.core import atomic
    from dfit_mlir.core.paged import append_values
    from dfit_mlir.exporters import bundle
    from dfit_mlir.runtime_hooks import hal_profile

    if Path("/dev/full").exists():  # every write to it is ENOSPC
        with pytest.raises(OSError) as error:
            append_values(Path("/dev/full"), np.arange(100_000))
        assert (error.value.errno, error.value.filename) == (errno.ENOSPC, "/dev/full")
        assert "TMPDIR" in error.value.strerror

    stderr = ("iree/base/.../stdio_stream.c:399: UNKNOWN; write failed, possibly out of disk space or device lost; "
              "additional failure: failed to seek")
    monkeypatch.setattr(atomic, "run_process",
                        lambda command: subprocess.CompletedProcess(command, 1, "", stderr))
    profile = tmp_path / "profile.ireeprof"
    profile.write_bytes(bytes(3_000_000))  # what the tool wrote before the disk filled
    with pytest.raises(OSError) as error:
        hal_profile.record_profile(tmp_path / "m.vmfb", [], profile, function="main", invocations=60_000)
    assert (error.value.errno, error.value.filename) == (errno.ENOSPC, str(profile))
    assert "60000 invocation(s)" in error.value.strerror and "3 MB" in error.value.strerror
    assert "TMPDIR" in error.value.strerror

    def fill(sink: Any) -> Any:
        raise OSError("IOError: No space left on device")  # as Arrow's writer raises it: no errno, no file

    with pytest.raises(OSError) as error:
        bundle.write_bundle(tmp_path / "b", {}, fill, {})
    assert (error.value.errno, error.value.filename) == (errno.ENOSPC, str(tmp_path / "b"))
    assert not (tmp_path / "b").exists()
