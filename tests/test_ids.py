"""The four properties of stable IDs (dfit_mlir.core.ids), shown on the bundled convnet and on
edits of it that a user makes every day."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from iree.compiler import ir

from dfit_mlir.core import locations
from dfit_mlir.passes import mlir_engine
from tests.conftest import CONVNET, tag_text

ID_SHAPE = re.compile(r"^[A-Za-z_][\w.$-]*(/[\w.$-]+#\d+)+$|^[A-Za-z_][\w.$-]*$")


def test_ids_are_readable_and_unique(convnet_text: str) -> None:
    tagged = tag_text(convnet_text)
    assert "main" in tagged
    assert {"main/linalg.matmul#0", "main/linalg.matmul#1", "main/linalg.conv_2d_nhwc_hwcf#0",
            "main/linalg.softmax#0", "main/linalg.generic#0/arith.maximumf#0"} <= set(tagged)
    assert all(ID_SHAPE.match(op_id) for op_id in tagged), [i for i in tagged if not ID_SHAPE.match(i)]
    assert all(re.fullmatch(r"[0-9a-f]{16}", h) for h in tagged.values())
    assert len(tagged) == 60  # every op below the module, the function included


def test_deterministic_across_processes(convnet_text: str) -> None:
    """Same input, new interpreter, different hash seed: same IDs and hashes."""
    script = (
        "import json,sys; from tests.conftest import tag_text, CONVNET;"
        "print(json.dumps(tag_text(CONVNET.read_text()), sort_keys=True))"
    )
    outputs = []
    for seed in ("1", "987654"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                                cwd=CONVNET.parents[2], check=True)
        outputs.append(json.loads(result.stdout))
    assert outputs[0] == outputs[1] == tag_text(convnet_text)


def test_independent_of_ssa_names_and_whitespace(convnet_text: str) -> None:
    renamed = re.sub(r"%([A-Za-z_][\w]*)", r"%renamed_\1_x", convnet_text)
    spaced = renamed.replace(", ", " ,   ").replace(" = ", "   =   ")
    assert renamed != convnet_text
    assert tag_text(spaced) == tag_text(convnet_text)


def test_independent_of_generic_printing(convnet_text: str) -> None:
    """Round-trip through the generic op form: a completely different text, same IDs."""
    context = ir.Context()
    with context:
        generic = ir.Module.parse(convnet_text).operation.get_asm(print_generic_op_form=True)
    assert "\"linalg.matmul\"" in generic
    assert tag_text(generic) == tag_text(convnet_text)


def test_independent_of_printing_order_of_independent_ops(convnet_text: str) -> None:
    """Move the weight constants of fc2 and conv2 to other legal places."""
    lines = convnet_text.splitlines()
    w4 = next(i for i, line in enumerate(lines) if "%w4 = arith.constant" in line)
    moved = lines.pop(w4)
    lines.insert(next(i for i, line in enumerate(lines) if "%ninf = " in line) + 1, moved)
    b2 = next(i for i, line in enumerate(lines) if "%b2 = arith.constant" in line)
    moved = lines.pop(b2)
    lines.insert(next(i for i, line in enumerate(lines) if "%e2 = tensor.empty" in line) + 1, moved)
    reordered = "\n".join(lines)
    assert reordered != convnet_text
    assert tag_text(reordered) == tag_text(convnet_text)


def test_reordering_in_memory_keeps_ids(convnet_text: str) -> None:
    """Swap two independent ops with the bindings (what a scheduling pass does)."""
    context = ir.Context()
    with context:
        module = ir.Module.parse(convnet_text)
        body = module.body.operations[0].regions[0].blocks[0]
        ops = [op.operation for op in body.operations]
        empties = [op for op in ops if op.name == "tensor.empty"]
        empties[-1].move_before(ops[0])  # %e5 = tensor.empty() to the top of the function
        before = {item.id: item.hash for item in mlir_engine.tag_module(module.operation)}
    assert before == tag_text(convnet_text)


TWO_FUNCTIONS = """
func.func @helper(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = arith.addf %a, %a : tensor<4xf32>
  %1 = arith.mulf %0, %a : tensor<4xf32>
  return %1 : tensor<4xf32>
}
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = call @helper(%x) : (tensor<4xf32>) -> tensor<4xf32>
  %1 = arith.subf %0, %x : tensor<4xf32>
  %2 = math.exp %1 : tensor<4xf32>
  return %2 : tensor<4xf32>
}
"""


def test_local_edits_do_not_change_other_functions() -> None:
    base = tag_text(TWO_FUNCTIONS)
    edited = tag_text(TWO_FUNCTIONS.replace(
        "%1 = arith.mulf %0, %a : tensor<4xf32>",
        "%n = arith.negf %0 : tensor<4xf32>\n  %1 = arith.mulf %n, %a : tensor<4xf32>"))

    def of(tagged: dict[str, str], scope: str) -> dict[str, str]:
        return {k: v for k, v in tagged.items() if k.startswith(scope + "/")}

    assert of(edited, "main") == of(base, "main")
    assert of(edited, "helper") != of(base, "helper")
    assert "helper/arith.negf#0" in edited
    # the edit shows in the hash of the ops downstream of it, not upstream
    assert edited["helper/arith.addf#0"] == base["helper/arith.addf#0"]
    assert edited["helper/arith.mulf#0"] != base["helper/arith.mulf#0"]


def test_hash_matches_same_op_across_different_ids() -> None:
    """Adding an op changes ordinals after it, but the hash still finds the same op."""
    base = tag_text(TWO_FUNCTIONS)
    edited = tag_text(TWO_FUNCTIONS.replace(
        "%2 = math.exp %1", "%e = math.exp %x : tensor<4xf32>\n  %2 = math.exp %1"))
    exp_hash = base["main/math.exp#0"]
    matches = [op_id for op_id, h in edited.items() if h == exp_hash]
    assert len(matches) == 1 and matches[0].startswith("main/math.exp#")


def test_retagging_does_not_nest_locations(convnet_text: str) -> None:
    context = ir.Context()
    with context:
        module = ir.Module.parse(convnet_text)
        first = {i.id: i.hash for i in mlir_engine.tag_module(module.operation)}
        tagged = mlir_engine.tag_module(module.operation)
        second = {i.id: i.hash for i in tagged}
        dfit_names = [
            [node.name for node in locations.walk(mlir_engine.to_loc(item.op.location))
             if isinstance(node, locations.NameLoc) and node.name.startswith(locations.DFIT_NAME_PREFIX)]
            for item in tagged
        ]
    assert first == second
    # every op's location holds exactly one dfit NameLoc: its own ID, not nested twice
    assert dfit_names == [[locations.DFIT_NAME_PREFIX + item.id] for item in tagged]
