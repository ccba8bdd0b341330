"""The printed IR of each ID's carriers per phase (``passes/stage_ir.py``, the manifest's
``stage_ir`` table that ``dfit view``'s stages panel shows).

The real-compile test checks the table of the session's convnet compile against
printouts made here, independently of the compile: the convnet tagged the way the
compile tags it, then ``iree-compile --compile-to=<phase>`` (``iree-opt`` for the
source stage) printing generic form with local-scope locations. Every source ID's
carriers are found there by the ``dfit:<id>`` names in their printed locations."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from dfit_mlir.core import manifest as manifest_io
from dfit_mlir.core import stage_ir_table, toolchain
from dfit_mlir.passes import stage_ir
from tests.conftest import CONVNET

#: Local scope: attributes and locations inline (no #map / #loc aliases), as the table prints.
PRINT_FLAGS = ("--mlir-print-op-generic", "--mlir-print-debuginfo", "--mlir-print-local-scope",
               f"--mlir-elide-elementsattrs-if-larger={stage_ir.ELIDE_ELEMENTS}",
               f"--mlir-elide-resource-strings-if-larger={stage_ir.ELIDE_ELEMENTS}")
_HEAD = re.compile(r'^(?:%[^=]*= )?"([^"]+)"')


# --- unit tests (SYNTHETIC printouts) -------------------------------------------------------

SYNTHETIC = '''"builtin.module"() ({
  "func.func"() <{function_type = () -> (), sym_name = "f"}> ({
  ^bb0:
    %0 = "arith.constant"() <{value = "LONG"}> : () -> i32
    %1 = "flow.dispatch.region"() ({
      "flow.return"() : () -> ()
    }, {
      "flow.return"() : () -> ()
    }) {attr} : () -> tensor<4xf32>
    "func.return"() : () -> ()
  }) : () -> ()
}) : () -> ()
{-#
  dialect_resources: {
    builtin: {
      "x": "0x0400"
    }
  }
#-}
'''.replace("LONG", "a" * 300)


def test_op_lines_pair_heads_with_the_lines_closing_their_regions() -> None:
    lines = stage_ir.op_lines(SYNTHETIC)
    assert [name for name, _, _ in lines] == ["builtin.module", "func.func", "arith.constant", "flow.dispatch.region",
                                             "flow.return", "flow.return", "func.return"]
    name, head, tail = lines[3]
    assert tail == "}) {attr} : () -> tensor<4xf32>"  # after both regions
    assert stage_ir.op_text(head, tail, "flow.return") == (
        '%1 = "flow.dispatch.region"() ({...}) {attr} : () -> tensor<4xf32>\n  // regions: flow.return')
    constant = stage_ir.op_text(lines[2][1], None, "")
    assert constant == f'%0 = "arith.constant"() <{{value = "{"a" * 60}…"}}> : () -> i32'
    assert len(stage_ir.op_text('"x.y"() {s = ' + "[1, 2] " * 1000 + "}", None, "")) == stage_ir.MAX_OP_CHARS + 1


def test_texts_pack_and_unpack() -> None:
    texts = ["%0 = \"a.b\"() : () -> ()", "é ∑ {...}", ""]
    packed = stage_ir_table.pack_texts(texts)
    assert packed["encoding"] == "zlib+base64" and packed["count"] == 3
    assert stage_ir_table.unpack_texts(packed) == texts
    assert stage_ir_table.unpack_texts(stage_ir_table.pack_texts([])) == []
    with pytest.raises(ValueError, match="2 texts, the table says 5"):
        stage_ir_table.unpack_texts({**stage_ir_table.pack_texts(["a", "b"]), "count": 5})


# --- the real compile against independent printouts ------------------------------------------

@dataclass
class PrintedOp:
    name: str
    head: str
    tail: str | None = None
    ids: tuple[str, ...] = ()
    parent: int = -1
    children: list[int] = field(default_factory=list)


def _without_loc(line: str) -> str:
    at = line.rfind(" loc(")
    return line[:at] if at >= 0 else line


def read_printout(text: str) -> list[PrintedOp]:
    """Every op of a generic-form printout with local-scope locations, with the source IDs
    its location names and its nesting. An op's location ends its line, or the line that
    closes its regions. Which names of a location are its IDs is the project's rule
    (:func:`dfit_mlir.core.locations.dfit_ids`: an inlined op's ``callsite(… at "dfit:main")``
    does not carry ``main``), applied to the location text as printed."""
    from dfit_mlir.core import locations
    from dfit_mlir.passes.pass_history import parse_loc

    def ids_in(loc_text: str) -> tuple[str, ...]:
        return locations.dfit_ids(parse_loc(loc_text)) if "dfit:" in loc_text else ()

    ops: list[PrintedOp] = []
    open_ops: list[int] = []
    for raw in text.split("\n{-#")[0].splitlines():
        line = raw.strip()
        if not line or line.startswith(("^", "#", "//")) or line.startswith("}, {"):
            continue
        loc = line[line.rfind(" loc(") + 1:] if " loc(" in line else ""
        if line.startswith("})"):
            op = ops[open_ops.pop()]
            op.tail, op.ids = _without_loc(line), ids_in(loc)
            continue
        match = _HEAD.match(line)
        assert match, line
        op = PrintedOp(match[1], line if line.endswith("({") else _without_loc(line), parent=open_ops[-1] if open_ops else -1)
        if not line.endswith("({"):
            op.ids = ids_in(loc)
        if op.parent >= 0:
            ops[op.parent].children.append(len(ops))
        ops.append(op)
        if line.endswith("({"):
            open_ops.append(len(ops) - 1)
    return ops


def outermost_carriers(ops: list[PrintedOp], source_id: str) -> tuple[int, list[int]]:
    """(how many ops carry the ID, the positions of those no enclosing op carries it too)."""
    carrying = [n for n, op in enumerate(ops) if source_id in op.ids and op.name != "builtin.module"]
    outer = []
    for n in carrying:
        parent = ops[n].parent
        while parent >= 0 and source_id not in ops[parent].ids:
            parent = ops[parent].parent
        if parent < 0:
            outer.append(n)
    return len(carrying), outer


def recorded_matches(text: str, op: PrintedOp, printout: list[PrintedOp]) -> bool:
    """The recorded text is this op: its head (and the tail after its regions) verbatim,
    ``…`` standing for what the table elides, and the ops its region summary names
    nested in it."""
    first, _, summary = text.partition("\n  // regions: ")
    expected = op.head if op.tail is None else op.head[:-2] + "({...}" + op.tail[1:]
    pattern = ".*?".join(re.escape(piece) for piece in first.split(stage_ir.ELISION))
    if not re.fullmatch(pattern + (".*" if first.endswith(stage_ir.ELISION) else ""), expected):
        return False
    nested: set[str] = set()
    stack = list(op.children)
    while stack:
        child = printout[stack.pop()]
        nested.add(child.name)
        stack.extend(child.children)
    names = {re.sub(r" ×\d+$", "", name) for name in summary.split(", ") if summary and not name.startswith("+")}
    return names <= nested


@pytest.fixture(scope="module")
def independent_printouts(iree_bundles: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, list]:
    """Stage → the printout's ops, printed here from the convnet tagged as the compile tags it."""
    from iree.compiler.tools.binaries import find_tool

    from dfit_mlir.passes import mlir_engine, phases

    document = manifest_io.load(iree_bundles["manifest"])
    workdir = tmp_path_factory.mktemp("stage-ir-check")
    session, context = phases.compiler_context()
    module = phases.parse_file(context, CONVNET)
    mlir_engine.tag_module(module)
    mlir_engine.strip_dfit_attributes(module)
    tagged = workdir / "tagged.mlir"
    # Generic form: a named op's body (a fill's yield) keeps its own location, as in memory.
    tagged.write_text(module.get_asm(enable_debug_info=True, print_generic_op_form=True))
    flags = document["compile"]["flags"]
    printouts = {}
    for stage in document["lineage"]["stages"]:
        out = workdir / f"{stage}.mlir"
        if stage == "source":
            command = [find_tool("iree-opt"), str(tagged), *PRINT_FLAGS, "-o", str(out)]
        else:
            command = [find_tool("iree-compile"), str(tagged), *flags, f"--compile-to={stage}", *PRINT_FLAGS,
                       "-o", str(out)]
        done = subprocess.run(command, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        printouts[stage] = read_printout(out.read_text())
    session.close()
    return printouts


@pytest.mark.slow
def test_recorded_carriers_are_the_ops_of_each_phase(iree_bundles: dict[str, Path],
                                                     independent_printouts: dict[str, list]) -> None:
    document = manifest_io.load(iree_bundles["manifest"])
    table = stage_ir_table.read_table(document["stage_ir"])
    assert table.unrecorded == {} and list(table.stages) == document["lineage"]["stages"] == [
        "source", *toolchain.IREE_PHASES]
    assert list(table.ids) == [op["id"] for op in document["operators"]]
    checked = 0
    for stage, printout in independent_printouts.items():
        for source_id in table.ids:
            count, outer = outermost_carriers(printout, source_id)
            found = table.carriers_of(source_id, stage)
            assert found is not None
            recorded_count, texts = found
            assert recorded_count == count, (stage, source_id)
            # The first MAX_CARRIERS distinct outermost carriers, in program order.
            assert len(texts) == len(set(texts)) <= stage_ir.MAX_CARRIERS
            position = 0
            for text in texts:
                while position < len(outer) and not recorded_matches(text, printout[outer[position]], printout):
                    position += 1
                assert position < len(outer), f"{stage} {source_id}: recorded text is no carrier of the phase:\n{text}"
                position += 1
            distinct = {printout[n].head + str(printout[n].tail) for n in outer}
            assert len(texts) == min(len(distinct), stage_ir.MAX_CARRIERS), (stage, source_id)
            checked += len(texts)
    assert checked > 500
    # The lineage classes agree with the recorded counts (split: more than one carrier).
    conv = "main/linalg.conv_2d_nhwc_hwcf#0"
    for letter, stage in zip(document["lineage"]["classes"][conv], table.stages, strict=True):
        count, _ = table.carriers_of(conv, stage)
        assert (letter == "s") == (count > 1) and (letter == "e") == (count == 0), (stage, letter, count)


@pytest.mark.slow
def test_the_conv_is_followed_into_its_dispatch_and_executable(iree_bundles: dict[str, Path]) -> None:
    """What a reader sees for the convnet's first conv, phase by phase (facts read off
    the printouts by hand)."""
    table = stage_ir_table.read_table(manifest_io.load(iree_bundles["manifest"])["stage_ir"])
    conv = "main/linalg.conv_2d_nhwc_hwcf#0"

    def first_lines(stage: str) -> list[str]:
        return [text.split("\n")[0] for text in table.carriers_of(conv, stage)[1]]

    assert first_lines("input")[0].split(" = ")[1].startswith('"linalg.conv_2d_nhwc_hwcf"(')
    assert any('"linalg.generic"' in line for line in first_lines("global-optimization"))  # generalised
    region = next(t for t in table.carriers_of(conv, "dispatch-creation")[1] if '"flow.dispatch.workgroups"' in t)
    assert "({...})" in region and "// regions:" in region and "linalg.generic" in region.split("// regions:")[1]
    assert any(line.startswith('"hal.executable"()') and "main_dispatch_0" in line
               for line in first_lines("executable-targets"))


def test_recording_is_bounded_and_interned(iree_bundles: dict[str, Path]) -> None:
    document = manifest_io.load(iree_bundles["manifest"])
    table = stage_ir_table.read_table(document["stage_ir"])
    texts = table.texts
    assert len(set(texts)) == len(texts) and all(len(t.split("\n")[0]) <= stage_ir.MAX_OP_CHARS + 1 for t in texts)
    assert len(set(table.carriers)) == len(table.carriers)
    assert all(len(c) - 1 <= stage_ir.MAX_CARRIERS for c in table.carriers)
    used = {t for c in table.carriers for t in c[1:]}
    assert used == set(range(len(texts))), "every text is some carrier's"
    # Weights print elided, never in full.
    assert not any(re.search(r"dense<\[[^\]]{200,}", t) for t in texts)


def test_only_full_compiles_keep_ir(iree_bundles: dict[str, Path]) -> None:
    from dfit_mlir.analysis.model import SemanticModel

    assert "stage_ir" not in SemanticModel.open(iree_bundles["lite"]).manifest
    assert "stage_ir" in SemanticModel.open(iree_bundles["full"]).manifest  # a run bundle keeps it


@pytest.mark.parametrize("damage", ["texts", "index", "row"])
def test_view_of_a_damaged_table_is_bad_input(iree_bundles: dict[str, Path], tmp_path: Path, damage: str) -> None:
    """A stage_ir table that does not decode: `dfit view` exits 2 with one line naming the
    manifest, and writes nothing."""
    import json

    from click.testing import CliRunner

    from dfit_mlir.cli.app import main

    document = json.loads(iree_bundles["manifest"].read_text())
    table = document["stage_ir"]
    if damage == "texts":
        table["texts"]["data"] = table["texts"]["data"][:40]  # a truncated deflate stream
    elif damage == "index":
        table["carriers"][0] = f"1,{table['texts']['count'] + 7}"
    else:
        first = next(iter(table["stages"]))
        table["stages"][first] = table["stages"][first].rsplit(",", 1)[0]
    manifest = tmp_path / "damaged.manifest.json"
    manifest.write_text(json.dumps(document))
    out = tmp_path / "view.html"
    result = CliRunner().invoke(main, ["view", str(manifest), "-o", str(out)])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"dfit: {manifest}: stage_ir") and "Traceback" not in result.output
    assert not out.exists()
