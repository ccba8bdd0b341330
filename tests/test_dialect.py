"""The xDSL ``dfit`` dialect: probe ops round-trip and verify, and the typed views read
the on-IR encoding."""

from __future__ import annotations

from io import StringIO

import pytest
from iree.compiler import ir
from xdsl.dialects.builtin import (
    FileLineColLoc,
    FusedLoc,
    IntAttr,
    NameLoc,
    NoneAttr,
    StringAttr,
    TensorType,
    f32,
)
from xdsl.ir import Block
from xdsl.printer import Printer
from xdsl.utils.exceptions import VerifyException

from dfit_mlir.core import ids
from dfit_mlir.dialects.dfit import (
    BEGIN,
    END,
    ProbeOp,
    ProbeTensorOp,
    dfit_ids_of_location,
    op_hash,
    op_id,
)
from dfit_mlir.passes import xdsl_engine

PROBES = """
func.func @probes(%t: tensor<4x16xf32>) -> tensor<4x16xf32> {
  dfit.probe "begin" "probes/linalg.matmul#0"
  %traced = dfit.probe_tensor %t {id = "probes/linalg.matmul#0"} : tensor<4x16xf32>
  dfit.probe "end" "probes/linalg.matmul#0" region "dispatch_0"
  func.return %traced : tensor<4x16xf32>
}
"""


def probes_of(text: str) -> list[ProbeOp | ProbeTensorOp]:
    module = xdsl_engine.parse(text)
    module.verify()
    return [op for op in module.walk() if isinstance(op, ProbeOp | ProbeTensorOp)]


def test_probe_round_trip() -> None:
    printed = str(xdsl_engine.parse(PROBES))
    assert str(xdsl_engine.parse(printed)) == printed
    assert 'dfit.probe "end" "probes/linalg.matmul#0" region "dispatch_0"' in printed

    begin, tensor, end = probes_of(printed)
    assert isinstance(begin, ProbeOp) and isinstance(end, ProbeOp)
    assert (begin.kind.data, begin.id.data, begin.region) == (BEGIN, "probes/linalg.matmul#0", None)
    assert end.kind.data == END and end.region == StringAttr("dispatch_0")
    assert isinstance(tensor, ProbeTensorOp)
    assert tensor.id.data == "probes/linalg.matmul#0"
    assert tensor.output.type == tensor.input.type == TensorType(f32, [4, 16])


def test_generic_form_round_trip_and_mlir_reads_the_fields() -> None:
    """The generic form carries the fields as plain attributes, so MLIR (no dfit
    dialect there) reads them off an unregistered op."""
    stream = StringIO()
    Printer(stream=stream, print_generic_format=True).print_op(xdsl_engine.parse(PROBES))
    generic = stream.getvalue()
    assert '"dfit.probe"() {kind = "begin", id = "probes/linalg.matmul#0"}' in generic
    assert [op.kind.data for op in probes_of(generic) if isinstance(op, ProbeOp)] == [BEGIN, END]

    context = ir.Context()
    context.allow_unregistered_dialects = True
    with context:
        module = ir.Module.parse(generic)
        func = module.body.operations[0]
        begin = func.regions[0].blocks[0].operations[0]
        fields = {name: ir.StringAttr(begin.attributes[name]).value for name in ("kind", "id")}
    del module, func, begin
    assert fields == {"kind": BEGIN, "id": "probes/linalg.matmul#0"}


def test_builders_make_valid_ops() -> None:
    probe = ProbeOp(END, "main/linalg.matmul#0", region="dispatch_3")
    probe.verify()
    assert str(probe) == 'dfit.probe "end" "main/linalg.matmul#0" region "dispatch_3"'
    block = Block(arg_types=[TensorType(f32, [2])])
    traced = ProbeTensorOp(block.args[0], "main/x#0")
    block.add_op(traced)
    traced.verify()
    assert traced.output.type == TensorType(f32, [2])


def test_verifier_rejects_bad_kind() -> None:
    with pytest.raises(VerifyException, match='kind must be "begin" or "end", got "middle"'):
        ProbeOp("middle", "main/linalg.matmul#0").verify()
    with pytest.raises(VerifyException, match="middle"):
        probes_of('dfit.probe "middle" "main/linalg.matmul#0"')


def test_probe_tensor_rejects_non_tensor() -> None:
    text = """
    func.func @f(%x: f32) -> f32 {
      %y = dfit.probe_tensor %x {id = "f/x#0"} : f32
      func.return %y : f32
    }
    """
    with pytest.raises(VerifyException, match="f32 should be of base attribute tensor"):
        probes_of(text)


def test_probes_are_transparent_to_ids() -> None:
    """Probes get no ID, and inserting them changes no other op's ID or hash."""
    module = xdsl_engine.parse(PROBES)
    tagged = {item.op: item for item in xdsl_engine.tag_module(module)}
    assert not any(isinstance(op, ProbeOp | ProbeTensorOp) for op in tagged)
    without_probes = PROBES.replace('  dfit.probe "begin" "probes/linalg.matmul#0"\n', "").replace(
        '  dfit.probe "end" "probes/linalg.matmul#0" region "dispatch_0"\n', "").replace(
        '  %traced = dfit.probe_tensor %t {id = "probes/linalg.matmul#0"} : tensor<4x16xf32>\n', "").replace(
        "func.return %traced", "func.return %t")
    plain = {item.id: item.hash for item in xdsl_engine.tag_module(xdsl_engine.parse(without_probes))}
    assert {item.id: item.hash for item in tagged.values()} == plain
    assert set(plain) == {"probes", "probes/func.return#0"}


def test_typed_views_read_the_encoding() -> None:
    module = xdsl_engine.parse(PROBES)
    tagged = {item.op: item for item in xdsl_engine.tag_module(module)}
    ret = next(op for op in module.walk() if op.name == "func.return")
    assert tagged[ret].id == "probes/func.return#0"
    assert op_id(ret) == "probes/func.return#0"
    assert op_hash(ret) == tagged[ret].hash
    assert dfit_ids_of_location(ret.location) == ("probes/func.return#0",)

    # Attributes stripped (as before an IREE compile): the ID stays in the location.
    del ret.attributes[ids.ID_ATTR], ret.attributes[ids.HASH_ATTR]
    assert op_id(ret) == "probes/func.return#0"
    assert op_hash(ret) is None


def test_dfit_ids_of_fused_location() -> None:
    source = FileLineColLoc(StringAttr("model.py"), IntAttr(3), IntAttr(7))
    fused = FusedLoc(
        [NameLoc(StringAttr("dfit:main/a#0"), source), NameLoc(StringAttr("relu"), source),
         NameLoc(StringAttr("dfit:main/b#1"), source)],
        NoneAttr(),
    )
    assert dfit_ids_of_location(fused) == ("main/a#0", "main/b#1")
    assert dfit_ids_of_location(source) == ()
