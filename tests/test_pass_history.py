"""Pass-level lineage (``dfit compile --lineage passes``, ``passes/pass_history.py``).

The readers (locations, dump order, IR units) are tested on labelled SYNTHETIC text in
the form MLIR prints it; the history itself on real compiles: the bundled convnet (facts
checked by hand against IREE 3.13's pipeline), an ONNX CNN, a TFLite model from
``../shared/fixtures`` and a ``transformers`` BERT, where every ID's class at every phase
must be the one the pass history ends on.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dfit_mlir.core import locations
from dfit_mlir.core.locations import CallSiteLoc, FileLoc, FusedLoc, NameLoc
from dfit_mlir.passes import pass_history
from dfit_mlir.passes.instrumented_compile import compile_instrumented
from tests import realmodels

REPO = Path(__file__).resolve().parents[1]
CONVNET = REPO / "examples" / "models" / "convnet.mlir"

# ----------------------------------------------------------------------------- readers

LOCATIONS = [  # (text as MLIR prints it with local scope, expected tree)
    ('loc("m.py":3:7)', FileLoc("m.py", 3, 7)),
    ('loc("m.py":3:7 to 4:2)', FileLoc("m.py", 3, 7)),
    ('loc("m.py":3:7 to :9)', FileLoc("m.py", 3, 7)),
    ("loc(unknown)", locations.UNKNOWN),
    ('loc("dfit:main/linalg.matmul#0"("m.py":1:2))', NameLoc("dfit:main/linalg.matmul#0", FileLoc("m.py", 1, 2))),
    ('loc("relu")', NameLoc("relu", None)),
    ('loc("a \\"q\\""(unknown))', NameLoc('a "q"', None)),
    ('loc(callsite("dfit:f/x#1"("a.py":1:1) at "dfit:main"("b.py":2:2)))',
     CallSiteLoc(NameLoc("dfit:f/x#1", FileLoc("a.py", 1, 1)), NameLoc("dfit:main", FileLoc("b.py", 2, 2)))),
    ('loc(fused["dfit:a"("f":1:1), "dfit:b"])', FusedLoc((NameLoc("dfit:a", FileLoc("f", 1, 1)), NameLoc("dfit:b")))),
    ('loc(fused<"tag">["dfit:a", unknown])', FusedLoc((NameLoc("dfit:a"), locations.UNKNOWN))),
]


@pytest.mark.parametrize(("text", "expected"), LOCATIONS, ids=[text for text, _ in LOCATIONS])
def test_printed_locations_read_back(text: str, expected: locations.Loc) -> None:
    assert pass_history.parse_loc(text) == expected


def test_ids_of_a_printed_location_are_the_callee_sides() -> None:
    loc = pass_history.parse_loc('loc(fused[callsite("dfit:f/x#1"("a":1:1) at "dfit:main"("b":2:2)), "dfit:f/y#0"])')
    assert locations.dfit_ids(loc) == ("f/x#1", "f/y#0")


def test_dumps_are_ordered_as_the_passes_ran(tmp_path: Path) -> None:
    """SYNTHETIC file names in MLIR's scheme (seen on IREE 3.13's abi phase): a unit's own
    counter last, each ancestor's count of dumps so far before it."""
    ran = [
        "builtin_module_m/util_func_main/0_0_first-nested-before-any-module-dump.mlir",
        "builtin_module_m/1_iree-abi-wrap-entry-points.mlir",
        "builtin_module_m/util_func__main/1_0_canonicalize.mlir",
        "builtin_module_m/util_func_main/1_1_canonicalize.mlir",
        "builtin_module_m/util_func_main/1_2_cse.mlir",
        "builtin_module_m/2_inline.mlir",
        "builtin_module_m/hal_executable_e/hal_executable_variant_v/2_0_0_iree-codegen-create-dispatch-config.mlir",
        "builtin_module_m/hal_executable_e/hal_executable_variant_v/builtin_module_no-symbol-name/"
        "func_func_d/2_0_0_0_0_iree-codegen-x.mlir",
        "builtin_module_m/hal_executable_e/hal_executable_variant_v/2_0_1_iree-hal-configure.mlir",
        "builtin_module_m/10_iree-util-fold-globals.mlir",
    ]
    for name in reversed(ran):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    order = [path.relative_to(tmp_path).as_posix() for path, _ in pass_history.ordered_dumps(tmp_path)]
    assert order == ran
    assert [name for _, name in pass_history.ordered_dumps(tmp_path)][1] == "iree-abi-wrap-entry-points"


SYNTHETIC_MODULE = '''\
"builtin.module"() <{sym_name = "m"}> ({
  "util.initializer"() ({
    "util.global.store"(%c) : () -> () loc("dfit:g/store#0")
  }) : () -> () loc("dfit:init#0")
  "util.initializer"() ({
    "util.global.store"(%d) : () -> () loc("dfit:g/store#1")
  }) : () -> () loc("dfit:init#1")
  "util.func"() <{function_type = () -> (), sym_name = "main"}> ({
  ^bb0(%arg0: tensor<4xf32> loc("dfit:main/arg0")):
    %0 = "flow.dispatch.region"() ({
      %1 = "linalg.fill"(%a, %b) ({
      ^bb0(%in: f32 loc(unknown)):
        "linalg.yield"(%in) : (f32) -> () loc("dfit:main/linalg.fill#0/linalg.yield#0")
      }) : (f32, tensor<4xf32>) -> tensor<4xf32> loc("dfit:main/linalg.fill#0"("m.py":1:1))
      "flow.return"(%1) : (tensor<4xf32>) -> () loc("dfit:main/linalg.matmul#0")
    }, {
    }) : () -> tensor<4xf32> loc("dfit:main/linalg.matmul#0"("m.py":2:1))
    "util.return"() : () -> () loc(fused["dfit:main", "dfit:main/func.return#0"])
  }) : () -> () loc("dfit:main"("m.py":1:1))
}) : () -> () loc(unknown)
{-#
  dialect_resources: {
    builtin: {
      blob: "0x0400"
    }
  }
#-}
'''


def test_ops_are_grouped_by_ir_unit_with_their_dispatch_region() -> None:
    """SYNTHETIC generic-form module: units as the tree printer names them (unnamed
    siblings told apart), a unit's own op kept with it, region ops' locations on their
    closing line, dispatch-region members marked, the resource block skipped."""
    units = pass_history.scan_ops(SYNTHETIC_MODULE, ("builtin_module_m",), {})
    assert set(units) == {
        ("builtin_module_m",),  # a known unit, but a container: no ops counted or classified
        ("builtin_module_m", "util_initializer_no-symbol-name"),
        ("builtin_module_m", "util_initializer_no-symbol-name#1"),
        ("builtin_module_m", "util_func_main"),
    }
    assert units[("builtin_module_m",)] == []
    assert units[("builtin_module_m", "util_initializer_no-symbol-name#1")] == [
        ("util.global.store", ("g/store#1",), ()), ("util.initializer", ("init#1",), ())]
    main = units[("builtin_module_m", "util_func_main")]
    region = ("main/linalg.matmul#0",)
    assert main == [
        ("linalg.yield", ("main/linalg.fill#0/linalg.yield#0",), region),
        ("linalg.fill", ("main/linalg.fill#0",), region),
        ("flow.return", ("main/linalg.matmul#0",), region),
        ("flow.dispatch.region", ("main/linalg.matmul#0",), ()),
        ("util.return", ("main", "main/func.return#0"), ()),
        ("util.func", ("main",), ()),
    ]


def test_replay_records_a_fusion_and_the_pass_that_made_it(tmp_path: Path) -> None:
    """SYNTHETIC: two ops, then one pass (a function-level dump) leaves one op carrying
    both IDs: both become fused, by that pass, each naming the other."""
    history = pass_history.PassHistory()
    history.reset('"builtin.module"() <{sym_name = "m"}> ({\n'
                  '  "util.func"() <{sym_name = "f"}> ({\n'
                  '    %0 = "linalg.matmul"() : () -> () loc("dfit:f/linalg.matmul#0")\n'
                  '    %1 = "linalg.generic"() : () -> () loc("dfit:f/linalg.generic#0")\n'
                  '  }) : () -> () loc("dfit:f")\n'
                  '}) : () -> () loc(unknown)\n')
    dump = tmp_path / "builtin_module_m" / "util_func_f" / "0_0_my-fusion.mlir"
    dump.parent.mkdir(parents=True)
    dump.write_text('// -----// IR Dump After MyFusion: my-fusion //----- //\n'
                    '"util.func"() <{sym_name = "f"}> ({\n'
                    '  %0 = "linalg.generic"() : () -> () loc(fused["dfit:f/linalg.generic#0", "dfit:f/linalg.matmul#0"])\n'
                    '}) : () -> () loc("dfit:f")\n')
    history.observe_phase("dispatch-creation", tmp_path)
    assert not dump.exists(), "dumps are deleted once read"
    assert [(c.id, c.pass_name, c.before, c.after, c.with_ids, c.kinds_after) for c in history.changes] == [
        ("f/linalg.generic#0", "my-fusion", "p", "f", ("f/linalg.matmul#0",), ("linalg.generic",)),
        ("f/linalg.matmul#0", "my-fusion", "p", "f", ("f/linalg.generic#0",), ("linalg.generic",)),
    ]
    assert history.changes[0].unit == "builtin_module_m/util_func_f"


def _module_dump(tmp_path: Path, name: str, body: str) -> Path:
    dump = tmp_path / "builtin_module_m" / name
    dump.parent.mkdir(parents=True, exist_ok=True)
    dump.write_text(f"// -----// IR Dump After X: {name} //----- //\n{body}")
    return dump


def _two_functions(first_values: int, second_loc: str) -> str:
    """SYNTHETIC module printout: ``f`` defines ``first_values`` values, so ``g``'s SSA
    names start after them (the printer numbers values across the module)."""
    f_ops = "".join(f'    %{n} = "arith.constant"() : () -> i32 loc("dfit:f/arith.constant#{n}")\n'
                    for n in range(first_values))
    g = first_values
    return ('"builtin.module"() <{sym_name = "m"}> ({\n'
            '  "util.func"() <{sym_name = "f"}> ({\n' + f_ops +
            '  }) : () -> () loc("dfit:f")\n'
            '  "util.global"() <{sym_name = "w"}> : () -> () loc("dfit:w")\n'
            '  "util.func"() <{sym_name = "g"}> ({\n'
            f'  ^bb0(%arg{g}: i32 loc(unknown)):\n'
            f'    %{g} = "linalg.matmul"(%arg{g}) : (i32) -> i32 loc({second_loc})\n'
            f'    %{g + 1} = "linalg.generic"(%{g}) : (i32) -> i32 loc("dfit:g/linalg.generic#0")\n'
            '  }) : () -> () loc("dfit:g")\n'
            '}) : () -> () loc(unknown)\n'
            '{-#\n  dialect_resources: {\n    builtin: {\n      w: "0x04"\n    }\n  }\n#-}\n')


def test_module_dumps_rescan_only_the_units_that_changed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SYNTHETIC module-level dumps: a unit reprinted with only its SSA names shifted (an
    earlier function gained values) is taken from the state, not scanned again; a unit
    whose ops changed is scanned, and its change recorded."""
    history = pass_history.PassHistory()
    history.reset(_two_functions(1, '"dfit:g/linalg.matmul#0"'))
    scanned: list[tuple[str, ...]] = []
    real_scan = pass_history.scan_ops

    def counting_scan(text: str, root: tuple[str, ...], cache: dict) -> dict:
        scanned.append(root)
        return real_scan(text, root, cache)

    monkeypatch.setattr(pass_history, "scan_ops", counting_scan)
    _module_dump(tmp_path, "1_grow-f.mlir", _two_functions(3, '"dfit:g/linalg.matmul#0"'))
    _module_dump(tmp_path, "2_fuse-in-g.mlir",
                 _two_functions(3, 'fused["dfit:g/linalg.matmul#0", "dfit:g/linalg.generic#0"]'))
    history.observe_phase("global-optimization", tmp_path)
    f, g = ("builtin_module_m", "util_func_f"), ("builtin_module_m", "util_func_g")
    # grow-f: f rescanned, g (renumbered only) reused, the global (a module op) read again;
    # fuse-in-g: g rescanned, f reused.
    assert scanned == [f, ("builtin_module_m",), ("builtin_module_m",), g]
    assert [(c.id, c.pass_name, c.before, c.after) for c in history.changes] == [
        ("f/arith.constant#1", "grow-f", "e", "p"), ("f/arith.constant#2", "grow-f", "e", "p"),
        # the generic's ID is now on two ops (split), the matmul's on one with another (fused)
        ("g/linalg.generic#0", "fuse-in-g", "p", "s"), ("g/linalg.matmul#0", "fuse-in-g", "p", "f")]
    assert history.units[g] == pass_history.scan_ops(
        _two_functions(3, 'fused["dfit:g/linalg.matmul#0", "dfit:g/linalg.generic#0"]'), ("builtin_module_m",), {})[g]


def test_digest_keeps_what_the_replay_reads() -> None:
    """SYNTHETIC lines: SSA names do not change the digest; a % inside a quoted string,
    an op kind or a location does."""
    digest = pass_history._digest
    assert digest('%5 = "a.b"(%arg2) : () -> () loc("dfit:x")\n') == digest('%9 = "a.b"(%arg7) : () -> () loc("dfit:x")\n')
    assert digest('%5 = "a.b"() <{s = "v%1"}> : () -> ()\n') != digest('%5 = "a.b"() <{s = "v%2"}> : () -> ()\n')
    assert digest('%5 = "a.b"() : () -> () loc("dfit:x")\n') != digest('%5 = "a.c"() : () -> () loc("dfit:x")\n')
    assert digest('"a.b"() : () -> () loc("dfit:x\\"%1")\n') != digest('"a.b"() : () -> () loc("dfit:x\\"%2")\n')


def test_dumps_of_a_scratch_module_are_not_replayed(tmp_path: Path) -> None:
    """SYNTHETIC: IREE's const-eval builds a module inside the module, compiles it and
    erases it within its own pass. Dumps under a module the state does not hold are
    counted and deleted, and change nothing; the pass's own dump then does."""
    history = pass_history.PassHistory()
    history.reset('"builtin.module"() <{sym_name = "m"}> ({\n'
                  '  "util.func"() <{sym_name = "f"}> ({\n'
                  '    %0 = "linalg.matmul"() : () -> () loc("dfit:f/linalg.matmul#0")\n'
                  '  }) : () -> () loc("dfit:f")\n'
                  '}) : () -> () loc(unknown)\n')
    copy = '"util.func"() <{sym_name = "jit_eval"}> ({\n  %0 = "linalg.matmul"() : () -> () loc("dfit:f/linalg.matmul#0")\n}) : () -> () loc("dfit:f")\n'
    inner = tmp_path / "builtin_module_m" / "builtin_module_no-symbol-name"
    (inner / "util_func_jit_eval").mkdir(parents=True)
    (inner / "0_0_inline.mlir").write_text('"builtin.module"() ({\n' + copy.replace("\n", "\n  ") + '}) : () -> () loc(unknown)\n')
    (inner / "util_func_jit_eval" / "0_0_0_canonicalize.mlir").write_text(copy)
    history.observe_phase("global-optimization", tmp_path)
    assert history.changes == [] and history.unresolved == []
    assert history.scratch == {"builtin_module_m/builtin_module_no-symbol-name": 2}
    assert history.pass_runs == 2 and not any(inner.rglob("*.mlir"))


def test_replay_thread_replays_in_phase_order_and_hands_errors_back(tmp_path: Path) -> None:
    """SYNTHETIC: phases submitted to the replay thread are replayed in order, each from
    its start file (deleted once read); an error while replaying is raised to the waiter."""
    start = '"builtin.module"() <{sym_name = "m"}> ({\n  "util.func"() <{sym_name = "f"}> ({\n' \
            '    %0 = "linalg.matmul"() : () -> () loc("dfit:f/linalg.matmul#0")\n  }) : () -> () loc("dfit:f")\n' \
            '}) : () -> () loc(unknown)\n'
    replayer = pass_history.PhaseReplayer(pass_history.PassHistory())
    try:
        for phase, loc in (("flow", 'loc("dfit:f/linalg.matmul#0")'), ("stream", "loc(unknown)")):
            tree = tmp_path / phase
            dump = tree / "builtin_module_m" / "util_func_f" / "0_0_some-pass.mlir"
            dump.parent.mkdir(parents=True)
            dump.write_text(f'"util.func"() <{{sym_name = "f"}}> ({{\n  %0 = "linalg.generic"() : () -> () {loc}\n'
                            '}) : () -> () loc("dfit:f")\n')
            (tmp_path / f"{phase}.in.mlir").write_text(start)
            replayer.submit(phase, tree, tmp_path / f"{phase}.in.mlir")
        history = replayer.wait()
        assert [(c.phase, c.id, c.before, c.after) for c in history.changes] == [("stream", "f/linalg.matmul#0", "p", "e")]
        assert not any(tmp_path.rglob("*.mlir")), "dumps, trees and start files are deleted once read"
        bad = tmp_path / "bad" / "builtin_module_m" / "util_func_f" / "0_0_x.mlir"
        bad.parent.mkdir(parents=True)
        bad.write_text('"util.func"() ({\n  %0 = "a.b"() : () -> () loc(bogus"dfit:x")\n}) : () -> () loc("dfit:f")\n')
        replayer.submit("vm", tmp_path / "bad", start)
        with pytest.raises(ValueError, match="unexpected location text"):
            replayer.wait()
    finally:
        replayer.stop()


# ----------------------------------------------------------------------------- real compiles


def _history(manifest: dict[str, Any]) -> list[pass_history.PassChange]:
    return pass_history.from_table(manifest["pass_history"])


def _assert_history_explains_every_phase(manifest: dict[str, Any]) -> None:
    """Every ID's class at every phase is the one its last change in that phase set
    (or, with no change there, its class before): checked here independently of the
    compile's own check, from the manifest alone."""
    table = manifest["pass_history"]
    assert table["disagreements"] == []
    # Every dump's IR unit is one the replay holds, or under a const-eval scratch module.
    assert table["unresolved_units"] == []
    assert table["replay_s"]["busy"] >= table["replay_s"]["waited"] >= 0
    stages = manifest["lineage"]["stages"]
    changes: dict[tuple[str, str], list[pass_history.PassChange]] = {}
    for change in _history(manifest):
        changes.setdefault((change.id, change.phase), []).append(change)
    explained = 0
    for item, letters in manifest["lineage"]["classes"].items():
        for position in range(1, len(stages)):
            in_phase = [c for c in changes.get((item, stages[position]), []) if c.before != c.after]
            if letters[position] != letters[position - 1]:
                assert in_phase, f"{item} changed at {stages[position]} but no pass in it changed it"
                explained += 1
            if in_phase:
                assert in_phase[-1].after == letters[position], (item, stages[position])
                assert in_phase[0].before == letters[position - 1], (item, stages[position])
    assert explained > 0


@pytest.fixture(scope="module")
def convnet(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    out = tmp_path_factory.mktemp("passes") / "convnet.vmfb"
    result = compile_instrumented(CONVNET, out, mode="full", lineage_detail="passes")
    return result.manifest, result.manifest_path


@pytest.mark.slow
def test_convnet_history_explains_every_phase(convnet: tuple[dict[str, Any], Path]) -> None:
    manifest, _ = convnet
    _assert_history_explains_every_phase(manifest)
    table = manifest["pass_history"]
    assert table["pass_runs"] > 100  # IREE runs hundreds of passes that change this model
    names = {run["name"] for run in table["passes"]}
    assert {"canonicalize", "iree-dispatch-creation-form-dispatch-regions"} <= names
    assert all(run["phase"] in manifest["lineage"]["stages"] for run in table["passes"])


@pytest.mark.slow
def test_convnet_facts_checked_by_hand(convnet: tuple[dict[str, Any], Path]) -> None:
    """What IREE 3.13 does to the convnet, read off its pass list and IR dumps by hand:
    dispatch formation puts the matmul in its own region; the producer fill is cloned into
    the conv's region by the clone-producers pass; the ReLU after the first conv is fused
    with it by elementwise fusion, in dispatch-creation."""
    manifest, _ = convnet
    by_id: dict[str, list[pass_history.PassChange]] = {}
    for change in _history(manifest):
        by_id.setdefault(change.id, []).append(change)

    matmul = [c for c in by_id["main/linalg.matmul#0"] if c.dispatch]
    assert [(c.phase, c.pass_name, c.dispatch) for c in matmul] == [
        ("dispatch-creation", "iree-dispatch-creation-form-dispatch-regions", ("main/linalg.matmul#0",))]

    fill = [c for c in by_id["main/linalg.fill#2"] if c.dispatch]
    assert [(c.phase, c.pass_name, c.dispatch) for c in fill] == [
        ("dispatch-creation", "iree-dispatch-creation-clone-producers-into-dispatch-regions",
         ("main/linalg.conv_2d_nhwc_hwcf#0",))]

    relu = [c for c in by_id["main/linalg.generic#0"] if c.before != c.after == "f" and c.phase == "dispatch-creation"]
    assert [(c.pass_name, c.with_ids) for c in relu] == [
        ("iree-dispatch-creation-elementwise-op-fusion", ("main/linalg.conv_2d_nhwc_hwcf#0",))]
    assert manifest["lineage"]["classes"]["main/linalg.generic#0"][5] == "f"  # dispatch-creation


@pytest.mark.slow
def test_observing_passes_changes_nothing_iree_builds(convnet: tuple[dict[str, Any], Path],
                                                     tmp_path: Path) -> None:
    """The vmfb of the observed compile is byte for byte the one the same (subprocess)
    phase driver writes without observing."""
    manifest, _ = convnet
    plain = compile_instrumented(CONVNET, tmp_path / "convnet.vmfb", mode="full", driver_name="subprocess")
    assert "pass_history" not in plain.manifest
    observed = Path(manifest["compile"]["output"])
    assert hashlib.sha256(observed.read_bytes()).hexdigest() == plain.manifest["compile"]["vmfb_sha256"]


def _dfit(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dfit_mlir", *args], capture_output=True, text=True)


@pytest.mark.slow
def test_show_passes_prints_an_ops_history(convnet: tuple[dict[str, Any], Path]) -> None:
    _, manifest_path = convnet
    done = _dfit("show", str(manifest_path), "--passes", "main/linalg.matmul#0")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("main/linalg.matmul#0: source=preserved input=preserved")
    assert any("iree-dispatch-creation-form-dispatch-regions" in line
               and "into the dispatch region of main/linalg.matmul#0" in line for line in lines[1:])
    missing = _dfit("show", str(manifest_path), "--passes", "nothing/like#this")
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1
    assert "no source ID matches nothing/like#this" in missing.stderr


def test_show_passes_on_a_compile_without_history(tmp_path: Path) -> None:
    out = tmp_path / "convnet.vmfb"
    done = _dfit("compile", str(CONVNET), "--dfit-tag", "--mode", "ids", "-o", str(out))
    assert done.returncode == 0, done.stderr
    shown = _dfit("show", str(out.with_suffix(".manifest.json")), "--passes", "*")
    assert shown.returncode == 2
    assert "no pass history; compile with `dfit compile --dfit-tag --mode full --lineage passes`" in shown.stderr
    assert "Traceback" not in shown.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["--dfit-tag", "--mode", "lite", "--lineage", "passes"], "--lineage passes needs --mode full"),
    (["--lineage", "passes"], "--lineage passes needs --dfit-tag"),
    (["--dfit-tag", "--lineage", "passes", "--driver", "in-process"], "cannot use --driver in-process"),
])
def test_lineage_passes_usage_errors(tmp_path: Path, args: list[str], message: str) -> None:
    done = _dfit("compile", str(CONVNET), *args, "-o", str(tmp_path / "x.vmfb"))
    assert done.returncode == 2
    assert message in done.stderr and done.stderr.count("\n") == 1
    assert not (tmp_path / "x.vmfb").exists()


REAL_MODELS = [
    pytest.param("onnx", id="onnx-squeezenet"),
    pytest.param("tflite", id="tflite-franco_fc"),
    pytest.param("bert", id="transformers-bert", marks=pytest.mark.frontends),
]


@pytest.mark.slow
@pytest.mark.parametrize("kind", REAL_MODELS)
def test_history_explains_every_phase_on_real_models(kind: str, tmp_path: Path) -> None:
    if kind == "onnx":
        source = realmodels.onnx_model("squeezenet", tmp_path)
    elif kind == "tflite":
        source = realmodels.tflite_model(realmodels.skip_unavailable(realmodels.TFLITE_MODELS["franco_fc"]), tmp_path)
    else:
        from dfit_mlir.frontends import torch as torch_frontend
        from tests import frontend_models

        model, args = frontend_models.bert()
        source = tmp_path / "bert.mlir"
        source.write_text(torch_frontend.export_mlir(model, args))
    result = compile_instrumented(source, tmp_path / "model.vmfb", mode="full", flags=realmodels.IREE_CPU_FLAGS,
                                  lineage_detail="passes")
    _assert_history_explains_every_phase(result.manifest)
    if kind == "tflite":
        # IREE's const-eval compiles a scratch module inside franco_fc's: its dumps are
        # counted, not replayed (they once showed as 7 unresolved units).
        scratch = result.manifest["pass_history"]["scratch_units"]
        assert list(scratch) == ["builtin_module_no-symbol-name/builtin_module_no-symbol-name"]
        assert scratch["builtin_module_no-symbol-name/builtin_module_no-symbol-name"] > 7
    if kind == "tflite":  # real dense weights: observing must not change what IREE writes
        plain = compile_instrumented(source, tmp_path / "plain.vmfb", mode="full", flags=realmodels.IREE_CPU_FLAGS,
                                     driver_name="subprocess")
        assert plain.manifest["compile"]["vmfb_sha256"] == result.manifest["compile"]["vmfb_sha256"]
    assert {run["name"] for run in result.manifest["pass_history"]["passes"]} & {
        "iree-dispatch-creation-form-dispatch-regions", "iree-dispatch-creation-elementwise-op-fusion"}


@pytest.mark.slow
def test_diff_of_two_compiles_names_the_passes(convnet: tuple[dict[str, Any], Path], tmp_path: Path) -> None:
    """The same model compiled with and without data tiling: where a class differs at a
    phase, `dfit diff` says which pass set it on each side (the one the side's own
    history ends on in that phase)."""
    import json

    _, path_a = convnet
    out = tmp_path / "tiled.vmfb"
    done = _dfit("compile", str(CONVNET), "--dfit-tag", "--lineage", "passes", "--iree-opt-data-tiling=true", "-o", str(out))
    assert done.returncode == 0, done.stderr
    path_b = out.with_suffix(".manifest.json")
    shown = _dfit("diff", str(path_a), str(path_b), "--json")
    assert shown.returncode == 0, shown.stderr
    rows = [row for row in json.loads(shown.stdout)["rows"] if row["lineage_changes"]]
    assert rows, "data tiling changes some op's lineage"
    deciding = {label: pass_history.deciding_passes(json.loads(path.read_text())["pass_history"])
                for label, path in (("A", path_a), ("B", path_b))}
    named = 0
    for row in rows:
        ids = {"A": row["a"]["ids"] if row["a"] else [], "B": row["b"]["ids"] if row["b"] else []}
        for change in row["lineage_changes"]:
            stage = change.split(":", 1)[0]
            for label in ("A", "B"):
                expected = sorted({deciding[label][i, stage].pass_name for i in ids[label] if (i, stage) in deciding[label]})
                if expected:
                    assert f"{label}: " in change and f" by {', '.join(expected)}" in change, change
                    named += 1
                else:
                    assert f"{label}: " in change and "no pass of the phase changed it" in change, change
    assert named > 0
