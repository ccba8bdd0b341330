"""JAX: a training step (MLP + layer norm, softmax cross-entropy under
``jax.named_scope("loss")``, ``jax.value_and_grad``, optax Adam under
``jax.named_scope("optimizer")``) and a Flax model, compiled with
``dfit_mlir.frontends.jax.compile``. Phases and module paths come from the name stacks
(``jit(train_step)/transpose(jvp(dense1))/dot_general``); JAX's private helper functions
(``log_softmax``, ``_one_hot``, ``_var``) take their call sites' phase.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from dfit_mlir.analysis.tools.session import analyze
from dfit_mlir.core.lineage import is_constant
from dfit_mlir.core.manifest import validate
from dfit_mlir.frontends import jax as jax_frontend
from tests import frontend_models
from tests.conftest import read_csv

STRUCTURAL = {"func.func", "func.return"}


@pytest.mark.parametrize(("stack", "function", "expected"), [
    # From MODELS.md (measured on this toolchain) and from the training step below.
    ("jit(train_step)/transpose(jvp(forward))/dense1/dot_general", False, ("dense1", "backward", "dot_general")),
    ("jit(train_step)/jvp(forward)/ln1/rsqrt", False, ("ln1", "forward", "rsqrt")),
    ("jit(train_step)/optimizer/adam_update/sqrt", False, ("optimizer/adam_update", "optimizer", "sqrt")),
    ("jit(train_step)/transpose(jvp(dense1))/dot_general", False, ("dense1", "backward", "dot_general")),
    ("jit(train_step)/jvp(loss)/jit(_one_hot)", False, ("loss", "loss", "_one_hot")),
    ("jit(train_step)/transpose(jvp(loss))/neg", False, ("loss", "backward", "neg")),
    ("jit(train_step)/jvp()/tanh", False, ("", "forward", "tanh")),
    ("jit(apply)/MLP/block1/fc1/dot_general", False, ("MLP/block1/fc1", None, "dot_general")),
    ("jit(train_step)/transpose(jvp(ln1))/jit", True, ("ln1", "backward", None)),
    ("jit(fwd)/Conv1/conv_general_dilated", False, ("Conv1", None, "conv_general_dilated")),
    ("jit(train_step)", False, ("", None, None)),
    # Control flow and transformations are peeled (a scan body's call, a cond branch,
    # remat's repeated scope, vmap), the user's scopes kept.
    ("jit(step)/transpose(jvp(layers))/while/body/closed_call", False, ("layers", "backward", "closed_call")),
    ("jit(f)/jvp(blk)/cond/branch_1_fun/sin", False, ("blk", "forward", "sin")),
    ("jit(f)/transpose(jvp(rem))/jvp(rem)/checkpoint/rematted_computation/exp", False, ("rem", "recompute", "exp")),
    ("jit(f)/jvp(vm)/vmap()/tanh", False, ("vm", "forward", "tanh")),
    ("jit(loss)/jvp(Model)/while/cond/lt", False, ("Model", "forward", "lt")),
    # A private function's own (relative) stack: a Flax nn.scan body.
    ("checkpoint/rematted_computation/layers/attn/dot_general", False, ("layers/attn", "recompute", "dot_general")),
])
def test_name_stacks(stack: str, function: bool, expected: tuple[str, str | None, str | None]) -> None:
    if expected[2] is None and not function:
        # A stack of the jitted function alone: no scope, no primitive.
        assert jax_frontend.read_stack(stack)[:2] == expected[:2]
        return
    assert jax_frontend.read_stack(stack, is_function=function) == expected


@pytest.fixture(scope="module")
def train_step(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("jax-train")
    step, args = frontend_models.jax_train_step()
    compiled = jax_frontend.compile(step, *args, output=root / "train_step.vmfb", mode="ids")
    analyze(compiled.manifest_path, ["semantic-attribution"], root / "analysis")
    return {"compiled": compiled, "out": root / "analysis" / "semantic-attribution"}


@pytest.fixture(scope="module")
def flax_model(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("flax")
    apply, args = frontend_models.flax_mlp()
    compiled = jax_frontend.compile(apply, *args, output=root / "flax.vmfb", mode="ids")
    analyze(compiled.manifest_path, ["semantic-attribution"], root / "analysis")
    return {"compiled": compiled, "out": root / "analysis" / "semantic-attribution"}


def _stack(op: dict[str, Any]) -> str | None:
    return next((n for n in op["name_path"] if jax_frontend.is_name_stack(n)), None)


@pytest.mark.frontends
@pytest.mark.slow
def test_train_step_phases(train_step: dict[str, Any]) -> None:
    manifest = train_step["compiled"].manifest
    validate(manifest)  # phases loss/optimizer and the source-model fields are in the schema
    assert manifest["input"]["frontend"] == "jax"
    ops = manifest["operators"]
    # Every op whose own name stack is a transpose is backward; every backward op of
    # main has one.
    main_ops = [op for op in ops if op["parent"] == "main" and _stack(op)]
    transposed = [op for op in main_ops if "transpose(" in _stack(op)]
    assert transposed and all(op["phase"] == "backward" for op in transposed)
    assert all("transpose(" in _stack(op) for op in main_ops if op["phase"] == "backward")
    optimizer = [op for op in main_ops if "/optimizer/" in _stack(op)]
    assert optimizer and all(op["phase"] == "optimizer" and op["module_path"] == "optimizer" for op in optimizer)
    # The loss's forward ops are "loss"; the layers' forward ops "forward".
    assert {op["phase"] for op in main_ops if "jvp(loss)" in _stack(op) and "transpose" not in _stack(op)} == {"loss"}
    assert {op["phase"] for op in main_ops if "jvp(dense1)" in _stack(op) and "transpose" not in _stack(op)} \
        == {"forward"}
    dots = Counter((op["module_path"], op["phase"]) for op in ops if op["source_op"] == "jax.dot_general")
    # One forward matmul per dense layer; backward: dW and dx for dense2, only dW for
    # dense1 (its input x is not differentiated).
    assert dots == {("dense1", "forward"): 1, ("dense2", "forward"): 1,
                    ("dense1", "backward"): 1, ("dense2", "backward"): 2}


@pytest.mark.frontends
@pytest.mark.slow
def test_private_helpers_take_their_call_sites_phase(train_step: dict[str, Any]) -> None:
    ops = train_step["compiled"].manifest["operators"]
    by_function: dict[str, set[tuple[str | None, str | None]]] = {}
    for op in ops:
        function = op["id"].split("/", 1)[0]
        if function != "main" and "/" in op["id"]:
            by_function.setdefault(function, set()).add((op["module_path"], op["phase"]))
    helpers = {f for f in by_function if f.startswith("log_softmax")}
    assert len(helpers) == 2  # the loss's forward and its transpose
    assert sorted(by_function[f].pop() for f in helpers) == [("loss", "backward"), ("loss", "loss")]
    assert by_function["_one_hot"] == {("loss", "loss")}
    var = {f for f in by_function if f.startswith("_var")}
    assert {p for f in var for p in by_function[f]} == {("ln1", "forward"), ("ln1", "backward")}
    # Their ops have no file:line of their own: they continue the call site's stack,
    # whose innermost model-code line is the loss line of the user's script.
    helper_ops = [op for op in ops if op["id"].startswith("log_softmax") and "/" in op["id"]]
    assert helper_ops and all(op["source"] is None for op in helper_ops)
    assert all(any(frame["file"].endswith("tests/frontend_models.py") for frame in op["call_stack"])
               for op in helper_ops)


@pytest.mark.frontends
@pytest.mark.slow
def test_train_step_attribution_is_complete(train_step: dict[str, Any]) -> None:
    """≥ 99.9% of non-constant ops carry a phase and a module path; what is left is
    listed by kind (here: nothing)."""
    ops = [op for op in train_step["compiled"].manifest["operators"]
           if not is_constant(op["op"]) and op["op"] not in STRUCTURAL]
    assert len(ops) > 250
    without_phase = Counter(op["op"] for op in ops if op["phase"] is None)
    without_module = Counter(op["op"] for op in ops if op["module_path"] is None)
    assert sum(without_phase.values()) <= 0.001 * len(ops), without_phase
    assert sum(without_module.values()) <= 0.001 * len(ops), without_module
    summary = json.loads((train_step["out"] / "summary.json").read_text())
    assert summary["non_constant_ops"] == len(ops)
    assert summary["non_constant_with_phase_pct"] == 100.0 and summary["non_constant_without_phase_by_kind"] == {}
    phases = {row["phase"]: row for row in read_csv(train_step["out"] / "phases.csv")}
    assert {"forward", "loss", "backward", "optimizer"} <= set(phases)
    # Backward does twice the forward's matmul FLOPs (dx and dW per layer).
    assert int(phases["backward"]["flops"]) > int(phases["forward"]["flops"])
    modules = {row["module_path"]: row for row in read_csv(train_step["out"] / "modules.csv")}
    assert {"dense1", "dense2", "ln1", "loss", "optimizer"} <= set(modules)
    assert set(modules["dense1"]["phases"].replace(":", ";").split(";")[::2]) == {"forward", "backward"}
    # The user's script is model code: the sites are lines of tests/frontend_models.py.
    sites = read_csv(train_step["out"] / "sites.csv")
    assert sites[0]["site_kind"] == "source" and "frontend_models.py:" in sites[0]["site"]
    assert not [row for row in sites if "/jax/" in row["site"] and row["site_kind"] == "source"]


@pytest.mark.frontends
@pytest.mark.slow
def test_flax_module_paths(flax_model: dict[str, Any]) -> None:
    ops = flax_model["compiled"].manifest["operators"]
    dots = sorted(op["module_path"] for op in ops if op["source_op"] == "jax.dot_general")
    assert dots == ["MLP/block1/fc1", "MLP/block2/fc1", "MLP/head"]
    computing = [op for op in ops if not is_constant(op["op"]) and op["op"] not in STRUCTURAL]
    assert all(op["phase"] == "forward" for op in computing)  # never differentiated: inference
    # relu is a private helper called from both blocks: it lands on their common module.
    assert any(op["module_path"] == "MLP" and op["source_op"] == "jax.max" for op in ops)
    modules = {row["module_path"]: row for row in read_csv(flax_model["out"] / "modules.csv")}
    assert modules["MLP/block1"]["parent"] == "MLP" and modules["MLP"]["parent"] == ""
    assert {p for p, r in modules.items() if r["parent"] == "MLP/block1"} == {"MLP/block1/fc1", "MLP/block1/norm"}
    assert int(modules["MLP/block1/fc1"]["flops"]) == 2 * 2 * 8 * 16 + 2 * 16  # x @ W + b: 2x8 @ 8x16
    speedscope = json.loads((flax_model["out"] / "speedscope.json").read_text())
    assert speedscope["profiles"][0]["unit"] == "none"  # no run: sized by FLOPs


@pytest.mark.frontends
@pytest.mark.slow
def test_jax_compile_writes_the_stablehlo_beside_the_vmfb(train_step: dict[str, Any]) -> None:
    compiled = train_step["compiled"]
    source = Path(compiled.manifest["input"]["path"])
    assert source == compiled.vmfb.with_suffix(".mlir") and "stablehlo" in source.read_text()


@pytest.mark.frontends
def test_a_function_that_does_not_trace_is_a_clear_error(tmp_path: Path) -> None:
    import jax.numpy as jnp

    from dfit_mlir.core.errors import CompileError

    def reshape_to_seven(x: Any) -> Any:
        return x.reshape(7)

    with pytest.raises(CompileError, match="jax could not lower .*reshape_to_seven: TypeError") as caught:
        jax_frontend.compile(reshape_to_seven, jnp.ones((2, 8)), output=tmp_path / "bad.vmfb")
    assert caught.value.exit_code == 3
    assert list(tmp_path.iterdir()) == []  # nothing written


STEP_FILE = ("import jax\nimport jax.numpy as jnp\n\n"
             "def double_then_sum(x):\n"
             "    with jax.named_scope('scale'):\n"
             "        y = x * 2.0\n"
             "    return jnp.sum(jnp.tanh(y))\n\n"
             "def make_step():\n"
             "    return double_then_sum, (jnp.ones((4, 4)),)\n")


@pytest.mark.frontends
def test_python_api_prints_the_summary_dfit_compile_prints(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """``jax.compile`` prints what ``dfit compile step.py`` prints for the same function
    (the files it wrote, the per-stage table, the dispatch line); ``quiet=True`` nothing."""
    from click.testing import CliRunner

    from dfit_mlir.cli.app import main
    from dfit_mlir.frontends.torch import load_module_file

    source = tmp_path / "step.py"
    source.write_text(STEP_FILE)
    (tmp_path / "cli").mkdir()
    shell = CliRunner().invoke(main, ["compile", str(source), "--dfit-tag", "--mode", "ids",
                                      "-o", str(tmp_path / "cli" / "step.vmfb")])
    assert shell.exit_code == 0, shell.output
    fn, args = load_module_file(source, "make_step")
    capsys.readouterr()
    result = jax_frontend.compile(fn, *args, output=tmp_path / "api" / "step.vmfb", mode="ids")
    printed = capsys.readouterr().out.splitlines()
    assert printed[:2] == [f"wrote {result.vmfb}", f"wrote {result.manifest_path}"]
    table = printed[2:]
    assert table[0].startswith("per-stage attribution (") and table[-1].startswith("dispatches: ")
    assert [line.split()[0] for line in table[2:-1]][:1] == ["source"] and len(table) >= 5  # a row per stage
    shell_lines = shell.output.splitlines()
    assert table == shell_lines[shell_lines.index(table[0]):]  # the same figures as the shell's
    jax_frontend.compile(fn, *args, output=tmp_path / "quiet" / "step.vmfb", mode="ids", quiet=True)
    assert capsys.readouterr().out == ""


@pytest.fixture(scope="module")
def scan_step(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("jax-scan")
    step, args = frontend_models.jax_scan_transformer_step()
    compiled = jax_frontend.compile(step, *args, output=root / "scan_step.vmfb", mode="ids")
    analyze(compiled.manifest_path, ["semantic-attribution"], root / "analysis")
    return {"compiled": compiled, "out": root / "analysis" / "semantic-attribution"}


@pytest.mark.frontends
@pytest.mark.slow
def test_scan_body_ops_keep_their_own_module_path(scan_step: dict[str, Any]) -> None:
    """The layers run in a ``lax.scan`` body (a private function called from
    ``.../while/body/closed_call``): its ops sit at ``layers/attn`` and ``layers/mlp``,
    not at the loop; no function name becomes a module node."""
    ops = scan_step["compiled"].manifest["operators"]
    body = [op for op in ops if op["id"].startswith("closed_call") and "/" in op["id"]
            and not is_constant(op["op"]) and op["op"] not in STRUCTURAL]
    assert len(body) > 100  # the forward body and the backward (transposed, rematerialised) one
    assert {op["module_path"] for op in body} <= {"layers", "layers/attn", "layers/mlp"}
    dots = Counter((op["module_path"], op["phase"]) for op in ops if op["source_op"] == "jax.dot_general")
    # Forward: q, k, v, q·kᵀ, scores·v, the output projection; the MLP's two; the head.
    assert dots[("layers/attn", "forward")] == 6 and dots[("layers/mlp", "forward")] == 2
    assert dots[("head", "forward")] == 1
    # Backward: remat recomputes the forward in the transposed body (``recompute``, issue
    # 28: each forward matmul whose result the gradients need once more, so not the MLP's
    # output projection), then dx and dW (``backward``).
    assert dots[("layers/attn", "recompute")] == 6 and dots[("layers/mlp", "recompute")] == 1
    assert dots[("layers/attn", "backward")] > 6 and dots[("layers/mlp", "backward")] > 2
    assert set(dots) == {(path, phase) for path in ("layers/attn", "layers/mlp", "head")
                         for phase in ("forward", "backward")} | {("layers/attn", "recompute"),
                                                                 ("layers/mlp", "recompute")}
    computing = [op for op in ops if not is_constant(op["op"]) and op["op"] not in STRUCTURAL]
    with_path = [op for op in computing if op["module_path"] is not None]
    assert len(with_path) >= 0.99 * len(computing)
    assert {op["phase"] for op in ops if op["module_path"] == "optimizer"} == {"optimizer"}

    modules = {row["module_path"]: row for row in read_csv(scan_step["out"] / "modules.csv")}
    assert modules["layers/attn"]["parent"] == modules["layers/mlp"]["parent"] == "layers"
    assert modules["layers"]["parent"] == ""
    bogus = [path for path in modules if any(word in path for word in ("jit", "closed_call", "while", "body", ":"))]
    assert bogus == []


def _calls_by_phase(text: str) -> dict[str, set[str]]:
    """Private function -> the phases of its call sites, read with the frontend's rules."""
    from iree.compiler import ir

    from dfit_mlir.frontends import jax_helpers
    from dfit_mlir.passes import phases

    _, context = phases.compiler_context()
    with context:
        records, calls, _ = jax_helpers._call_site_records(ir.Module.parse(text), jax_frontend.FRONTEND)
    phase_of = {record["id"]: record["phase"] for record in records}
    found: dict[str, set[str]] = {}
    for call_id, (callee, _) in calls.items():
        if phase_of[call_id] is not None:
            found.setdefault(callee, set()).add(phase_of[call_id])
    return found


@pytest.mark.frontends
@pytest.mark.slow
def test_helpers_shared_by_forward_and_backward_take_each_call_sites_phase(tmp_path: Path) -> None:
    """JAX calls the scan's weight-slicing helpers from the forward and the backward
    loop: each phase gets its own copy, so every op has a phase, the forward copy's ops
    are forward and the backward copy's backward, in the manifest and in the ledger."""
    import jax

    from dfit_mlir.analysis import ledger
    from dfit_mlir.analysis.model import SemanticModel

    step, args = frontend_models.jax_scan_layernorm_sgd_step()
    raw = jax.jit(step).lower(*args).as_text(debug_info=True)
    shared = {name: found for name, found in _calls_by_phase(raw).items() if len(found) > 1}
    assert shared and all(found == {"forward", "backward"} for found in shared.values()), shared
    assert any(name.startswith("dynamic_index_in_dim") for name in shared)
    assert not [n for n, found in _calls_by_phase(jax_frontend.lower_text(step, *args)).items() if len(found) > 1]

    compiled = jax_frontend.compile(step, *args, output=tmp_path / "step.vmfb", mode="ids", quiet=True)
    ops = compiled.manifest["operators"]
    computing = [op for op in ops if not is_constant(op["op"]) and op["op"] not in STRUCTURAL]
    assert len(computing) > 100
    assert [op["id"] for op in computing if op["phase"] is None] == []
    assert sum(op["module_path"] is not None for op in computing) >= 0.995 * len(computing)
    functions = {op["id"] for op in ops if op["op"] == "func.func"}
    for name in shared:
        assert f"{name}_backward" in functions
        for copy, phase in ((name, "forward"), (f"{name}_backward", "backward")):
            body = [op for op in computing if op["id"].startswith(f"{copy}/")]
            assert body and {op["phase"] for op in body} == {phase}, (copy, body)
            assert {op["module_path"] for op in body} == {"layers"}
    # The layernorm: JAX emits its forward and its transpose as two functions.
    norms = {op["id"].split("/")[0]: set() for op in computing if op["id"].startswith("layernorm")}
    for op in computing:
        if op["id"].split("/")[0] in norms:
            norms[op["id"].split("/")[0]].add((op["module_path"], op["phase"]))
    assert sorted(found.pop() for found in norms.values() if len(found) == 1) == [
        ("layers/ln", "backward"), ("layers/ln", "forward")]
    # The ledger (every tool's figures) has the same phase for every dispatch's ops.
    # (The slicing helpers themselves land in no dispatch: IREE folds a slice into its
    # consumer's operand, so they cost nothing there.)
    entries = ledger.of(SemanticModel.open(compiled.manifest_path)).entries.to_pylist()
    phase_of = {op["id"]: op["phase"] for op in ops}
    assert entries and [e["op_id"] for e in entries if e["phase"] is None] == []
    assert all(e["phase"] == phase_of[e["op_id"]] for e in entries)
    assert {e["phase"] for e in entries} >= {"forward", "backward", "loss", "optimizer"}


@pytest.mark.frontends
@pytest.mark.slow
def test_per_phase_copies_compile_to_the_same_executables(tmp_path: Path) -> None:
    """The copies only name the ops per phase: IREE inlines both, so plain compiles of
    JAX's own text and of the specialized text hold the same executables (without
    DWARF, which records source lines)."""
    import jax

    from dfit_mlir.core.vmfb import read_module
    from dfit_mlir.passes.plain_compile import plain_compile

    step, args = frontend_models.jax_scan_layernorm_sgd_step()
    raw = jax.jit(step).lower(*args).as_text(debug_info=True)
    specialized = jax_frontend.lower_text(step, *args)
    assert specialized != raw and "_backward(" in specialized
    modules = {}
    for name, text in (("raw", raw), ("specialized", specialized)):
        (tmp_path / f"{name}.mlir").write_text(text)
        plain_compile(tmp_path / f"{name}.mlir", tmp_path / f"{name}.vmfb",
                      [*jax_frontend.DEFAULT_FLAGS, "--iree-llvmcpu-debug-symbols=false"])
        modules[name] = read_module(tmp_path / f"{name}.vmfb")
    assert modules["raw"].executables and modules["specialized"].executables == modules["raw"].executables
    assert modules["specialized"].embedded_strings == modules["raw"].embedded_strings


@pytest.mark.frontends
def test_helpers_called_from_one_phase_are_left_as_jax_wrote_them() -> None:
    """Flax's relu is one helper called from both blocks, both forward: not copied, and
    the text is JAX's own."""
    import jax

    apply, args = frontend_models.flax_mlp()
    raw = jax.jit(apply).lower(*args).as_text(debug_info=True)
    assert raw.count("call @relu(") == 2
    assert jax_frontend.lower_text(apply, *args) == raw


@pytest.mark.frontends
def test_flax_scan_body_keeps_its_module_paths(tmp_path: Path) -> None:
    """``nn.scan(nn.remat(Block))``: the body's ops carry ``layers/attn/dot_general``
    (or ``checkpoint/rematted_computation/layers/…`` in the backward body) below the
    call site ``jit(loss)/jvp(Model)/while/body/closed_call``: ``Model/layers/attn``."""
    from dfit_mlir.passes import mlir_engine, operators, phases, snapshot

    grad, args = frontend_models.flax_scan_loss()
    source = tmp_path / "flax_scan.mlir"
    source.write_text(jax_frontend.lower_text(grad, *args))
    module = phases.open_driver((), None).parse(source)
    ops, _ = operators.operator_table(mlir_engine.tag_module(module), snapshot.LocationCache())
    dots = Counter((op["module_path"], op["phase"]) for op in ops if op["source_op"] == "jax.dot_general")
    assert dots[("Model/layers/attn", "forward")] == dots[("Model/layers/mlp", "forward")] == 1
    assert dots[("Model/head", "forward")] == 1
    assert dots[("Model/layers/attn", "backward")] >= 2 and dots[("Model/layers/mlp", "backward")] >= 2
    assert {path for path, _ in dots} == {"Model/layers/attn", "Model/layers/mlp", "Model/head"}
    paths = {op["module_path"] for op in ops if op["module_path"]}
    assert not [p for p in paths if any(word in p for word in ("jit", "closed_call", "while", "body", "checkpoint"))]
