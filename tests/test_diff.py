"""``dfit diff``: two compiles of the convnet (default flags vs split reduction), the
convnet with its function renamed, and one TFLite model compiled by IREE and by the
Edge TPU compiler.

Expected values come from the IR by hand: ``--iree-dispatch-creation-enable-split-reduction``
splits the K=3136 reduction of ``fc1`` (``linalg.matmul#0``, 1x3136 · 3136x32) into a
``matmul_1x32x2`` dispatch and a ``reduce_1x32x1568`` dispatch, and fuses the matmul's
fill and ReLU into the second; every other dispatch keeps its ops.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from dfit_mlir.fleet import diff
from tests import realmodels
from tests.conftest import CONVNET, vendor_fixture

SPLIT_REDUCTION = "--iree-dispatch-creation-enable-split-reduction"
FC1 = "main/linalg.matmul#0"
#: The ops of fc1's dispatch that do work: its fill, the matmul and the ReLU after it.
FC1_WORKERS = ("main/linalg.fill#3", "main/linalg.matmul#0", "main/linalg.generic#2")
UNCHANGED_FUSION = ("main/linalg.conv_2d_nhwc_hwcf#0", "main/linalg.conv_2d_nhwc_hwcf#1",
                    "main/linalg.pooling_nhwc_max#0", "main/linalg.matmul#1", "main/linalg.softmax#0")


@pytest.fixture(scope="module")
def split_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from dfit_mlir.passes.instrumented_compile import compile_instrumented
    from dfit_mlir.runtime_hooks.run import run_bundle

    root = tmp_path_factory.mktemp("split-reduction")
    compiled = compile_instrumented(CONVNET, root / "split.vmfb", mode="full", flags=[SPLIT_REDUCTION])
    return run_bundle(compiled.vmfb, compiled.manifest_path, root / "run", mode="full", repeat=3, warmup=1).bundle


@pytest.fixture(scope="module")
def flags_diff(iree_bundles: dict[str, Path], split_bundle: Path) -> diff.DiffResult:
    return diff.diff_bundles(iree_bundles["full"], split_bundle)


def dispatch_durations(bundle: Path, site: int) -> list[int]:
    events = pq.read_table(bundle / "events.parquet").to_pylist()
    return [e["duration_ns"] for e in events if e["kind"] == "dispatch" and e["site"] == site]


def test_split_reduction_splits_fc1_over_two_dispatches(flags_diff: diff.DiffResult) -> None:
    row = flags_diff.row(FC1)
    assert row.match == "id"
    assert "fusion" in row.changes
    assert [p.split("_", 3)[-1] for p in row.a.partitions] == ["matmul_1x32x3136_f32"]
    assert [p.split("_", 3)[-1] for p in row.b.partitions] == ["matmul_1x32x2_f32", "reduce_1x32x1568_f32"]
    assert row.a.fused_with == (("main/linalg.fill#3", "main/linalg.generic#2"),)
    assert row.b.fused_with == ((), ("main/linalg.fill#3", "main/linalg.generic#2"))


def test_split_reduction_leaves_the_other_dispatches_fused_as_before(flags_diff: diff.DiffResult) -> None:
    assert flags_diff.counts()["only-a"] == flags_diff.counts()["only-b"] == 0
    for op_id in UNCHANGED_FUSION:
        row = flags_diff.row(op_id)
        assert "fusion" not in row.changes, op_id
        assert row.a.placement == row.b.placement == ("dispatch",)
    # The softmax dispatch is renumbered (one dispatch more before it), not refused.
    softmax = flags_diff.row("main/linalg.softmax#0")
    assert softmax.a.partitions[0].startswith("site5:") and softmax.b.partitions[0].startswith("site6:")


def test_time_is_split_by_the_ledgers_shares(flags_diff: diff.DiffResult, iree_bundles: dict[str, Path]) -> None:
    """Each dispatch's time goes to its ops by the ledger's time model (one rule for every
    tool), not evenly: here the shares are read from the ledger of the same bundle."""
    from dfit_mlir.analysis import ledger
    from dfit_mlir.analysis.model import SemanticModel

    fc1_site = dispatch_durations(iree_bundles["full"], 3)
    model = SemanticModel.open(iree_bundles["full"])
    shares = ledger.of(model).partition_summary(model.partition_of_site(3))["shares"]
    assert set(shares) == set(FC1_WORKERS)
    assert len(set(shares.values())) > 1, "the roofline model tells the matmul from its epilogue"
    for op_id in FC1_WORKERS:
        assert flags_diff.row(op_id).a.time_ns == pytest.approx(sum(fc1_site) / len(fc1_site) * shares[op_id])
    # Constants cloned into the dispatch do no work and get no time.
    assert flags_diff.row("main/arith.constant#1").a.time_ns == 0.0


def test_every_dispatch_nanosecond_is_attributed_once(flags_diff: diff.DiffResult, split_bundle: Path) -> None:
    events = pq.read_table(split_bundle / "events.parquet").to_pylist()
    dispatch_ns = sum(e["duration_ns"] for e in events if e["kind"] == "dispatch")
    invocations = {e["invocation"] for e in events if e["kind"] == "dispatch"}
    assert flags_diff.b.invocations == len(invocations) == 3
    assert sum(row.b.time_ns for row in flags_diff.rows) == pytest.approx(dispatch_ns / 3)


def test_rows_are_sorted_by_absolute_time_change(flags_diff: diff.DiffResult) -> None:
    changes = [abs(row.time_delta_ns or 0.0) for row in flags_diff.rows]
    assert changes == sorted(changes, reverse=True)


def test_a_bundle_against_itself_has_no_differences(iree_bundles: dict[str, Path]) -> None:
    same = diff.diff_bundles(iree_bundles["full"], iree_bundles["full"])
    assert same.changed() == [] and {row.time_delta_ns for row in same.rows} == {0.0}
    assert same.counts()["id"] == len(same.rows) == 60


def test_outputs_csv_json_and_a_table(flags_diff: diff.DiffResult, tmp_path: Path) -> None:
    written = diff.write(flags_diff, tmp_path / "out")
    # Atomic writes leave no temporary file behind.
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == [".dfit-output.json", *[p.name for p in written]]  # the marker: a dfit diff folder
    assert [p.name for p in written] == ["diff.csv", "diff.json"]
    rows = list(csv.DictReader((tmp_path / "out" / "diff.csv").read_text().splitlines()))
    assert tuple(rows[0]) == diff.CSV_COLUMNS and len(rows) == len(flags_diff.rows)
    fc1 = next(r for r in rows if r["key"] == FC1)
    assert "fusion" in fc1["changes"].split(";")
    assert fc1["fused_with_b"] == " | main/linalg.fill#3,main/linalg.generic#2"  # two dispatches, the first alone
    document = json.loads((tmp_path / "out" / "diff.json").read_text())
    assert document["schema"] == "dfit.diff" and document["counts"]["id"] == 60
    assert next(r for r in document["rows"] if r["key"] == FC1)["b"]["partitions"][1].endswith("reduce_1x32x1568_f32")
    table = diff.render(flags_diff)
    assert "matched 60 (60 by id" in table and any(FC1 in line and "fusion" in line for line in table.splitlines())


def test_renamed_function_matches_by_structural_hash(iree_bundles: dict[str, Path], tmp_path: Path) -> None:
    from dfit_mlir.passes.instrumented_compile import compile_instrumented

    source = tmp_path / "forward.mlir"
    source.write_text(CONVNET.read_text().replace("func.func @main(", "func.func @forward("))
    renamed = compile_instrumented(source, tmp_path / "forward.vmfb", mode="full")
    result = diff.diff_bundles(iree_bundles["manifest"], renamed.manifest_path)

    # Every op under the function keeps its hash; the function itself (its name is in its
    # hash) is one removed and one added row.
    assert result.counts()["hash"] == 59 and result.counts()["id"] == 0
    assert (result.row("main").changes, result.row("forward").changes) == (("removed",), ("added",))
    fc1 = result.row(FC1)
    assert (fc1.match, fc1.a.ids, fc1.b.ids, fc1.changes) == ("hash", (FC1,), ("forward/linalg.matmul#0",),
                                                                 ("renamed",))
    # Fusion is compared through the match: fc1 is still fused with the same rows.
    assert fc1.a.fused_with == fc1.b.fused_with == (("main/linalg.fill#3", "main/linalg.generic#2"),)


# --- one TFLite model, IREE vs the Edge TPU compiler ----------------------------------------

@pytest.fixture(scope="module")
def franco_diff(tmp_path_factory: pytest.TempPathFactory) -> diff.DiffResult:
    """franco_fc: RESHAPE 1x28x28→1x784, FULLY_CONNECTED 784→128, FULLY_CONNECTED 128→10;
    the Edge TPU compiler maps all three into one custom op, IREE makes one dispatch
    per fully-connected layer."""
    from dfit_mlir.adapters.reconstruct import reconstruct_bundle
    from dfit_mlir.passes.instrumented_compile import compile_instrumented

    folder = vendor_fixture("edgetpu/franco_fc_v15")
    root = tmp_path_factory.mktemp("franco")
    try:
        source = realmodels.tflite_model(folder / "model.tflite", root)
    except realmodels.FixtureUnavailable as reason:
        pytest.skip(str(reason))
    iree = compile_instrumented(source, root / "franco.vmfb", mode="ids")
    reconstruct_bundle([folder], root / "edgetpu")
    return diff.diff_bundles(iree.manifest_path, root / "edgetpu")


@pytest.mark.parametrize(("tensor", "edgetpu_id", "iree_export"), [
    ("tfl.fully_connected", "model/subgraph0/FULLY_CONNECTED#0", "matmul_like_Dx128x784_i8xi8xi32"),
    ("StatefulPartitionedCall:0_int8", "model/subgraph0/FULLY_CONNECTED#1", "matmul_like_Dx10x128_i8xi8xi32"),
])
def test_tflite_ops_match_by_tensor_name_across_backends(franco_diff: diff.DiffResult, tensor: str, edgetpu_id: str,
                                                         iree_export: str) -> None:
    row = franco_diff.row(tensor)
    assert row.match == "name"
    assert row.b.ids == (edgetpu_id,)
    assert any(op.startswith("tosa.conv2d") for op in row.a.ops)  # IREE's TOSA import of a fully-connected op
    assert [p.split("_", 3)[-1] for p in row.a.partitions] == [iree_export]
    assert (row.a.placement, row.b.placement) == (("dispatch",), ("edgetpu-custom-op",))
    assert row.b.partitions == ("model_edgetpu/edgetpu#0",)
    assert {"placement", "fusion"} <= set(row.changes)


def test_edgetpu_fuses_what_iree_keeps_apart(franco_diff: diff.DiffResult) -> None:
    fc = franco_diff.row("tfl.fully_connected")
    assert fc.a.fused_with == ((),)  # alone in its dispatch
    assert fc.b.fused_with == (("StatefulPartitionedCall:0_int8", "model/subgraph0/RESHAPE#0"),)
    # The reshape has no op of its own on IREE (folded into fc1's import), and the custom
    # op stands for the whole partition: both are Edge TPU only, not matched by name.
    assert franco_diff.row("model/subgraph0/RESHAPE#0").match == "only-b"
    assert franco_diff.row("model_edgetpu/subgraph0/edgetpu-custom-op#0").changes == ("added",)
    assert franco_diff.a.invocations == franco_diff.b.invocations == 0  # a compile manifest, a reconstruction


def test_the_table_reads_for_people_across_backends(franco_diff: diff.DiffResult) -> None:
    table = diff.render(franco_diff)
    lines = table.splitlines()
    # Counts in the header, per match kind and per change label.
    assert lines[2] == ("rows: 13; matched 2 (0 by id, 0 by hash, 0 by module, 2 by name); only in A: 9, "
                        "only in B: 2; changed: 13 (9 of them constants or structure, folded)")
    assert lines[3] == "changes: added 2, op 2, fusion 2, placement 2"
    # IREE's weights and the function's structure: one summary line, no rows.
    assert lines[4] == ("folded: 9 rows of constants and structure (tosa.const 7, func.func 1, func.return 1): "
                        "only in A 9, only in B 0, on both sides 0")
    assert not any(line.startswith("main/tosa.const#") for line in lines)
    # Ranked by what changed most: the two layers (fusion touches two rows each) first,
    # each with where it runs, export names included.
    rows = [line.split()[0] for line in lines[7::2]]
    assert rows == ["StatefulPartitionedCall:0_int8", "tfl.fully_connected", "model/subgraph0/RESHAPE#0",
                    "model_edgetpu/subgraph0/edgetpu-custom-op#0"]
    assert "    site0 main_dispatch_0_matmul_like_Dx128x784_i8xi8xi32 → edgetpu#0" in lines
    # A name stands for one tensor: the constants grouped under it are no shape change,
    # a dynamic batch fits the Edge TPU's 1, and cost models' bookkeeping is no bytes change.
    for key in ("tfl.fully_connected", "StatefulPartitionedCall:0_int8"):
        assert franco_diff.row(key).changes == ("op", "fusion", "placement"), key
    assert franco_diff.codegen == ()  # a reconstruction records no IREE code generation


def test_the_footer_names_only_a_file_that_was_written(franco_diff: diff.DiffResult, tmp_path: Path) -> None:
    assert diff.render(franco_diff, limit=1).splitlines()[-1] == "... 3 more rows (all of them: --limit 0; -o DIR writes diff.csv)"
    written = diff.write(franco_diff, tmp_path / "out")
    assert diff.render(franco_diff, limit=1, written=written[0]).splitlines()[-1] == f"... 3 more rows in {written[0]}"


def test_cli_diff_limit_and_output(franco_diff: diff.DiffResult, tmp_path: Path,
                                   iree_bundles: dict[str, Path]) -> None:
    from click.testing import CliRunner

    from dfit_mlir.cli.app import main

    shown = CliRunner().invoke(main, ["diff", str(iree_bundles["manifest"]), str(iree_bundles["full"]), "--limit", "0"])
    assert shown.exit_code == 0, shown.output
    assert shown.output.strip().splitlines()[-1] == "no differences"
    out = tmp_path / "d"
    written = CliRunner().invoke(main, ["diff", str(iree_bundles["manifest"]), str(iree_bundles["full"]), "-o", str(out)])
    assert written.exit_code == 0 and (out / "diff.csv").is_file() and f"wrote {out / 'diff.csv'}" in written.output


# --- one model, two target CPUs: the same dispatches, other code ------------------------------

@pytest.fixture(scope="module")
def generic_cpu_manifest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from dfit_mlir.passes.instrumented_compile import compile_instrumented

    root = tmp_path_factory.mktemp("generic-cpu")
    flags = ["--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=llvm-cpu",
             "--iree-llvmcpu-target-cpu=x86-64"]
    return compile_instrumented(CONVNET, root / "generic.vmfb", mode="ids", flags=flags).manifest_path


def test_another_target_cpu_is_a_codegen_difference(iree_bundles: dict[str, Path], generic_cpu_manifest: Path) -> None:
    from dfit_mlir.core import manifest

    result = diff.diff_bundles(iree_bundles["manifest"], generic_cpu_manifest)
    # The dispatch structure does not depend on the CPU: no row changes ...
    assert result.changed() == [] and result.counts()["id"] == 60
    # ... but the code does, and the diff says how.
    aspects = {change.aspect: change for change in result.codegen}
    assert list(aspects) == ["flags", "target.cpu", "executables", "vmfb"]
    assert (aspects["flags"].a, aspects["flags"].b) == (["--iree-llvmcpu-target-cpu=host"],
                                                        ["--iree-llvmcpu-target-cpu=x86-64"])
    assert (aspects["target.cpu"].a, aspects["target.cpu"].b) == ("host", "x86-64")
    host, generic = manifest.load(iree_bundles["manifest"]), manifest.load(generic_cpu_manifest)
    sizes = [[e["bytes"] for e in m["compile"]["codegen"]["executables"]] for m in (host, generic)]
    assert (aspects["executables"].a, aspects["executables"].b) == tuple(sizes) and sizes[0] != sizes[1]
    assert "in code (.text)" in aspects["executables"].note
    assert (aspects["vmfb"].a, aspects["vmfb"].b) == (host["compile"]["vmfb_bytes"], generic["compile"]["vmfb_bytes"])
    table = diff.render(result)
    assert "codegen target.cpu: host → x86-64" in table
    assert table.splitlines()[-1] == "no differences per op: the same dispatch structure, other code"
    # The executables recorded at compile time are among the vmfb's external segments
    # (the others hold constants), as iree-dump-module lists them.
    from dfit_mlir.core.vmfb import read_module

    contents = read_module(generic_cpu_manifest.with_name("generic.vmfb"))
    recorded = [(e["sha256"], e["bytes"]) for e in generic["compile"]["codegen"]["executables"]]
    assert recorded and set(recorded) <= set(zip(contents.executables, contents.executable_sizes, strict=True))


def test_a_manifest_from_before_shared_materialisation_is_noted(iree_bundles: dict[str, Path], tmp_path: Path) -> None:
    from dfit_mlir.core import manifest

    old = manifest.load(iree_bundles["manifest"])
    old["partitions"].pop("shared_materialisation")
    for site in old["partitions"]["dispatch_sites"]:
        site["fused_ids"] += site.pop("shared_ids")  # as an older dfit wrote them
    path = tmp_path / "old.manifest.json"
    manifest.save(old, path)
    result = diff.diff_bundles(path, iree_bundles["manifest"])
    assert len(result.notes) == 1 and result.notes[0].startswith("note: A's manifest predates shared materialisation")
    assert result.notes[0] in diff.render(result).splitlines()
    assert diff.diff_bundles(iree_bundles["manifest"], iree_bundles["full"]).notes == ()


# --- pairing by module path; time outside the runs' spread ----------------------------------

def test_time_is_a_change_only_outside_the_runs_spread() -> None:
    """SYNTHETIC per-invocation times: the ``regressions`` report's rule decides."""
    samples = {
        "same": ([100.0, 104.0, 98.0, 101.0, 103.0], [102.0, 99.0, 105.0, 100.0, 101.0]),  # overlapping runs
        "slower": ([100.0, 102.0, 101.0, 99.0, 100.0], [150.0, 152.0, 149.0, 151.0, 150.0]),
        "faster": ([200.0, 201.0, 199.0], [100.0, 101.0, 99.0]),
        # Apart, but the gap of the means (7) is under the wider range (8) ...
        "noisy": ([100.0, 108.0, 104.0], [109.0, 113.0, 111.0]),
        # ... or under the threshold (5 % of A).
        "tiny": ([1000.0, 1001.0, 1000.0], [1010.0, 1011.0, 1010.0]),
        "too_few_runs": ([100.0, 100.0], [200.0, 200.0]),
        "untimed": ([0.0, 0.0, 0.0], [0.0, 0.0, 0.0]),
    }
    within_one_process = {"min_delta_ns": 0, "process_noise": 0}
    assert diff.time_changes(samples, **within_one_process) == {"slower": "slower", "faster": "faster"}
    assert diff.time_changes(samples, min_runs=2, **within_one_process)["too_few_runs"] == "slower"
    # One process per side: 50 and 100 ns apart is under what two processes of one vmfb
    # differ by (MIN_TIME_DELTA_NS); on microseconds "faster" (A twice B) is a change,
    # "slower" (+49.8 %) is under PROCESS_NOISE, and so is a +30 % shift.
    assert diff.time_changes(samples) == {}
    microseconds = {key: tuple([100 * ns for ns in side] for side in sides) for key, sides in samples.items()}
    assert diff.time_changes(microseconds) == {"faster": "faster"}
    thirty = {"thirty": ([10_000.0, 10_100.0, 10_050.0], [13_000.0, 13_100.0, 13_050.0])}
    assert diff.time_changes(thirty) == {} and diff.time_changes(thirty, process_noise=0) == {"thirty": "slower"}


@pytest.fixture(scope="module")
def gpt2_bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """GPT-2 (transformers config, random weights) with 2 and with 1 layer; the 2-layer
    vmfb run twice with --repeat 20 on ``local-sync``. (With 5 invocations on
    ``local-task`` a run's op could be twice as slow as the other run's through all five,
    its workers sharing the two cores with the rest of the machine: one of eight runs of
    this test judged ``torch.aten.mm#7`` changed, +4.95 µs. One thread and more invocations,
    so that a burst of load covers only part of a run's, is what the rule assumes.)"""
    from dfit_mlir.frontends import torch as torch_frontend
    from dfit_mlir.runtime_hooks.run import run_bundle
    from tests import frontend_models

    root = tmp_path_factory.mktemp("gpt2-diff")
    found: dict[str, Path] = {}
    for layers in (2, 1):
        model, args, kwargs = frontend_models.gpt2(layers)
        compiled = torch_frontend.compile(model, args, kwargs=kwargs, output=root / f"gpt2_{layers}.vmfb", mode="ids")
        found[f"manifest{layers}"] = compiled.manifest_path
        if layers == 2:
            for run in ("run1", "run2"):
                found[run] = run_bundle(compiled.vmfb, compiled.manifest_path, root / run, mode="full",
                                        inputs=frontend_models.gpt2_inputs(args, kwargs), repeat=20, warmup=3,
                                        driver="local-sync").bundle
    return found


@pytest.mark.slow
@pytest.mark.frontends
@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_gpt2_without_its_second_layer_shows_h1_removed(gpt2_bundles: dict[str, Path], tmp_path: Path) -> None:
    from dfit_mlir.core.manifest import load

    result = diff.diff_bundles(gpt2_bundles["manifest2"], gpt2_bundles["manifest1"])
    # Independently of the diff: the ops the 2-layer manifest puts in h.1 (weights included).
    in_h1 = {op["id"] for op in load(gpt2_bundles["manifest2"])["operators"]
             if (op["module_path"] or "").startswith("h.1.") or op["module_path"] == "h.1"}
    assert len(in_h1) > 40
    assert not [op for op in load(gpt2_bundles["manifest1"])["operators"] if (op["module_path"] or "").startswith("h.1")]
    assert result.removed_modules == (("h.1", len(in_h1)),) and result.added_modules == ()
    removed = [row for row in result.rows if row.match == "only-a"]
    assert {row.a.ids[0] for row in removed} == in_h1
    assert all(row.changes == ("removed",) for row in removed)
    assert result.counts()["only-b"] == 0
    # No false shape changes: every pair of ops sits in one module on both sides, and a
    # 1-layer GPT-2 computes every tensor of h.0, ln_f, wte and wpe at the same shape.
    paired = [row for row in result.rows if row.a and row.b]
    assert paired and all(row.a.modules == row.b.modules for row in paired)
    assert result.counts()["label:shape"] == 0 and not [row for row in result.rows if "shape" in row.changes]
    table = diff.render(result, limit=None)
    assert "removed modules: h.1 (" in table
    assert any(" h.1." in line and line.rstrip().endswith("removed") for line in table.splitlines())
    diff.write(result, tmp_path / "out")
    rows = list(csv.DictReader((tmp_path / "out" / "diff.csv").read_text().splitlines()))
    assert {r["module_a"].split(".")[0] + "." + r["module_a"].split(".")[1] for r in rows
            if r["match"] == "only-a"} == {"h.1"}
    assert all(r["module_a"] == r["module_b"] for r in rows if r["ids_a"] and r["ids_b"])


@pytest.mark.slow
@pytest.mark.frontends
def test_two_runs_of_one_vmfb_report_no_change(gpt2_bundles: dict[str, Path]) -> None:
    result = diff.diff_bundles(gpt2_bundles["run1"], gpt2_bundles["run2"])
    assert result.a.invocations == result.b.invocations == 20
    # The runs differ a little everywhere; none of it is outside the runs' spread.
    assert any(row.time_delta_ns for row in result.rows)
    assert result.changed() == [] and diff.render(result).endswith("no differences")


def test_without_duckdb_time_is_noted_not_judged(flags_diff: diff.DiffResult, iree_bundles: dict[str, Path],
                                                 split_bundle: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_duckdb(name: str, *args: object, **kwargs: object) -> object:
        if name == "duckdb":
            raise ImportError("No module named 'duckdb'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_duckdb)
    result = diff.diff_bundles(iree_bundles["full"], split_bundle)
    assert any("time is not compared" in note and "dfit-mlir[store]" in note for note in result.notes)
    assert not [row for row in result.rows if "time" in row.changes]
    assert [row.key for row in result.rows] == [row.key for row in flags_diff.rows]


@pytest.fixture(scope="module")
def neox_manifests(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """A transformers GPT-NeoX (config, random weights) with 2 and with 3 layers."""
    import torch
    from transformers import GPTNeoXConfig, GPTNeoXModel

    from dfit_mlir.frontends import torch as torch_frontend

    root = tmp_path_factory.mktemp("neox-diff")
    found = {}
    for layers in (2, 3):
        torch.manual_seed(0)
        config = GPTNeoXConfig(vocab_size=100, hidden_size=64, num_hidden_layers=layers, num_attention_heads=2,
                               intermediate_size=128, max_position_embeddings=32, use_cache=False)
        model = GPTNeoXModel(config).eval()
        ids = torch.randint(0, 100, (1, 8))
        found[layers] = torch_frontend.compile(model, (ids,), output=root / f"neox_{layers}.vmfb", mode="ids",
                                               quiet=True).manifest_path
    return found


@pytest.mark.slow
@pytest.mark.frontends
@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_neox_with_a_third_layer_has_no_false_rows(neox_manifests: dict[int, Path]) -> None:
    """Inserting ``layers.2`` renumbers ordinal IDs after it (``ListConstruct#14`` of A and
    of B are two different ops): each op still pairs with its real counterpart, so
    layers 0 and 1 show nothing changed and ``layers.2`` is added, whole."""
    from dfit_mlir.core.manifest import load

    result = diff.diff_bundles(neox_manifests[2], neox_manifests[3])
    in_layer2 = {op["id"] for op in load(neox_manifests[3])["operators"]
                 if (op["module_path"] or "").startswith("layers.2")}
    assert len(in_layer2) > 40
    assert [path for path, _ in result.added_modules] == ["layers.2"]
    assert result.removed_modules == ()
    false = [(row.key, row.changes) for row in result.rows if row.a and row.b
             and set(row.changes) & {"op", "shape", "dtype", "bytes", "replaced"}]
    assert false == []
    added = {op_id for row in result.rows if row.b and not row.a for op_id in row.b.ids}
    assert in_layer2 <= added
    # No pair is two different ops under one ordinal ID (hash and line both differ).
    for row in result.rows:
        if row.a and row.b and row.match == "id":
            assert not (row.a.hashes[0] != row.b.hashes[0] and row.a.lines[0] != row.b.lines[0]), row.key
