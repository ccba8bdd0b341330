"""Unit tests of the engine-neutral pieces on synthetic inputs written for the tests:
location trees, lineage classification, static costs."""

from __future__ import annotations

import pytest

from dfit_mlir import costs
from dfit_mlir.lineage import StageFigures, is_constant
from dfit_mlir.locations import (
    CallSiteLoc,
    FileLoc,
    FusedLoc,
    NameLoc,
    dfit_context_ids,
    dfit_ids,
    render,
    source_info,
    strip_dfit,
)

MM = NameLoc("dfit:main/linalg.matmul#0", CallSiteLoc(NameLoc("fc1", FileLoc("model.py", 30, 16)), FileLoc("train.py", 7, 3)))
RELU = NameLoc("dfit:main/linalg.generic#0", FileLoc("model.py", 31, 16))
INLINED = CallSiteLoc(RELU, NameLoc("dfit:main/func.call#0", FileLoc("model.py", 50, 1)))


def test_ids_from_name_fused_and_callee_side_only() -> None:
    assert dfit_ids(MM) == ("main/linalg.matmul#0",)
    assert dfit_ids(FusedLoc((RELU, MM))) == ("main/linalg.generic#0", "main/linalg.matmul#0")
    assert dfit_ids(INLINED) == ("main/linalg.generic#0",)
    assert dfit_context_ids(INLINED) == ("main/func.call#0",)


def test_source_info_and_strip() -> None:
    info = source_info(strip_dfit(MM))
    assert info.file_loc == FileLoc("model.py", 30, 16)
    assert info.name_path == ("fc1",)
    assert info.call_stack == (FileLoc("model.py", 30, 16), FileLoc("train.py", 7, 3))
    assert render(MM) == '"dfit:main/linalg.matmul#0"(callsite("fc1"("model.py":30:16) at "train.py":7:3))'


def test_classification() -> None:
    figures = StageFigures("test")
    figures.add("linalg.matmul", ("a",))
    figures.add("linalg.generic", ("b", "c"))
    figures.add("linalg.generic", ("d",))
    figures.add("linalg.generic", ("d",))
    figures.add("linalg.yield", (), enclosed_by_tagged=True)
    figures.add("arith.constant", ())
    figures.add("util.global", ())
    figures.add("util.global.load", ())
    assert [figures.classify(i) for i in "abcde"] == ["preserved", "fused", "fused", "split", "erased"]
    assert figures.non_constant_ops == 6 and figures.non_constant_tagged == 4
    assert figures.coverage == pytest.approx(4 / 6) and figures.attributed == pytest.approx(5 / 6)
    assert figures.materialised_by_kind() == {"arith.constant": 1, "linalg.yield": 1, "util.global": 1, "util.global.load": 1}


@pytest.mark.parametrize("kind, constant", [("arith.constant", True), ("tosa.const", True), ("vm.const.i32", True),
                                            ("llvm.mlir.constant", True), ("util.global", True),
                                            ("util.global.load", False), ("linalg.matmul", False)])
def test_constant_kinds(kind: str, constant: bool) -> None:
    assert is_constant(kind) is constant


@pytest.mark.parametrize(
    "name, operands, results, macs",
    [
        ("linalg.matmul", ["tensor<4x16xf32>", "tensor<16x32xf32>", "tensor<4x32xf32>"], ["tensor<4x32xf32>"], 4 * 32 * 16),
        ("linalg.batch_matmul", ["tensor<2x4x16xf32>", "tensor<2x16x8xf32>", "tensor<2x4x8xf32>"], ["tensor<2x4x8xf32>"], 2 * 4 * 8 * 16),
        ("linalg.conv_2d_nchw_fchw", ["tensor<1x3x8x8xf32>", "tensor<4x3x3x3xf32>", "tensor<1x4x6x6xf32>"], ["tensor<1x4x6x6xf32>"], 144 * 27),
        ("linalg.depthwise_conv_2d_nhwc_hwc", ["tensor<1x8x8x4xf32>", "tensor<3x3x4xf32>", "tensor<1x6x6x4xf32>"], ["tensor<1x6x6x4xf32>"], 144 * 9),
        ("tosa.conv2d", ["tensor<1x8x8x3xi8>", "tensor<4x3x3x3xi8>", "tensor<4xi32>"], ["tensor<1x6x6x4xi32>"], 144 * 27),
        ("tosa.depthwise_conv2d", ["tensor<1x8x8x4xi8>", "tensor<3x3x4x1xi8>", "tensor<4xi32>"], ["tensor<1x6x6x4xi32>"], 144 * 9),
        ("tosa.matmul", ["tensor<1x4x16xf32>", "tensor<1x16x8xf32>"], ["tensor<1x4x8xf32>"], 4 * 8 * 16),
        ("torch.aten.mm", ["!torch.vtensor<[4,16],f32>", "!torch.vtensor<[16,8],f32>"], ["!torch.vtensor<[4,8],f32>"], 4 * 8 * 16),
    ],
)
def test_macs(name: str, operands: list[str], results: list[str], macs: int) -> None:
    cost = costs.op_cost(name, operands, results)
    assert cost.macs == macs and cost.flops == 2 * macs


def test_bytes_and_types() -> None:
    assert costs.parse_shaped("tensor<1x?x3xf32>") == costs.ShapedType((1, None, 3), "f32")
    assert costs.parse_shaped("tensor<2x!quant.uniform<i8:f32, 0.1>>").nbytes == 2
    assert costs.parse_shaped("!torch.vtensor<[2,3],si8>").nbytes == 6
    assert costs.parse_shaped("tensor<4xi1>").nbytes == 4
    assert costs.parse_shaped("f32") is None
    assert costs.op_cost("linalg.add", ["tensor<4xf32>", "tensor<4xf32>", "tensor<4xf32>"], ["tensor<4xf32>"]).flops == 4


@pytest.mark.parametrize(("name", "operand", "flops"), [
    # StableHLO spells arithmetic out; a JAX optimizer update is multiply + subtract.
    ("stablehlo.multiply", "tensor<8x16xf32>", 128),
    ("stablehlo.subtract", "tensor<16x1xf32>", 16),
    ("stablehlo.divide", "tensor<4xf32>", 4),
    ("stablehlo.exponential", "tensor<4xf32>", 4),
    # torch ops end in an overload name: the residual add of every transformer block.
    ("torch.aten.add.Tensor", "!torch.vtensor<[2,32],f32>", 64),
    ("torch.aten.mul.Scalar", "!torch.vtensor<[2,32],f32>", 64),
    ("torch.aten.gelu", "!torch.vtensor<[2,64],f32>", 128),
    # Not arithmetic: no FLOPs.
    ("stablehlo.broadcast_in_dim", "tensor<4xf32>", None),
    ("torch.aten.view", "!torch.vtensor<[2,32],f32>", None),
])
def test_elementwise_flops_of_every_frontend_spelling(name: str, operand: str, flops: int | None) -> None:
    assert costs.op_cost(name, [operand, operand], [operand]).flops == flops
