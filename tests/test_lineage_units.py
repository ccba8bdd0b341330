"""Unit tests of the engine-neutral pieces on synthetic inputs written for the tests:
location trees, lineage classification, static costs."""

from __future__ import annotations

import pytest

from dfit_mlir.core import costs
from dfit_mlir.core.lineage import StageFigures, is_constant
from dfit_mlir.core.locations import (
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
    # A transcendental is not a FLOP (XLA's count): its own figure, below.
    ("stablehlo.exponential", "tensor<4xf32>", 0),
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


@pytest.mark.parametrize(("name", "flops", "transcendentals"), [
    ("stablehlo.exponential", 0, 8), ("stablehlo.tanh", 0, 8), ("stablehlo.logistic", 0, 8),
    ("stablehlo.rsqrt", 0, 8), ("stablehlo.log_plus_one", 0, 8), ("stablehlo.power", 0, 8),
    ("torch.aten.exp", 0, 8), ("torch.aten.sigmoid", 0, 8), ("torch.aten.erf", 0, 8), ("math.tanh", 0, 8),
    ("torch.aten.gelu", 8, 8), ("torch.aten.silu", 8, 8), ("torch.aten.mish", 8, 24),
    ("torch.aten._softmax", 32, 8), ("stablehlo.divide", 8, 0), ("torch.aten.add.Tensor", 8, 0),
])
def test_transcendentals_are_counted_apart_from_flops(name: str, flops: int, transcendentals: int) -> None:
    """SYNTHETIC types (2x4): XLA's HloCostAnalysis list is a transcendental per element
    and no FLOP; an activation around one keeps its FLOP (module doc of dfit_mlir.core.costs)."""
    operand = "!torch.vtensor<[2,4],f32>" if name.startswith("torch.") else "tensor<2x4xf32>"
    cost = costs.op_cost(name, [operand], [operand])
    assert (cost.flops, cost.transcendentals, cost.kind) == (flops, transcendentals, costs.ARITHMETIC)


def test_a_generic_body_counts_its_math_transcendentals_apart() -> None:
    """SYNTHETIC: a linalg.generic over 32 points whose body is mulf, math.exp, addf."""
    cost = costs.op_cost("linalg.generic", ["tensor<4x8xf32>"], ["tensor<4x8xf32>"], body_ops=3, iteration_space=32,
                         body_transcendentals=1)
    assert (cost.flops, cost.transcendentals) == (64, 32)
    assert costs.is_transcendental("math.exp") and costs.is_transcendental("math.powf")
    assert not costs.is_transcendental("arith.mulf") and not costs.is_transcendental("math.absf")


# --- cost rules of every frontend (dfit_mlir.core.costs), SYNTHETIC types ---------------------

V = "!torch.vtensor<[{}],f32>"


@pytest.mark.parametrize(
    ("name", "operands", "results", "constants", "attributes", "macs"),
    [
        # HF Conv1D: addmm(bias, x, w); the bias add is not counted.
        ("torch.aten.addmm", [V.format("64"), V.format("8,64"), V.format("64,192")], [V.format("8,192")], (), {},
         8 * 192 * 64),
        ("torch.aten.baddbmm", [V.format("2,4,8"), V.format("2,4,16"), V.format("2,16,8")], [V.format("2,4,8")],
         (), {}, 2 * 4 * 8 * 16),
        ("torch.aten.linear", [V.format("2,3,32"), V.format("16,32"), V.format("16")], [V.format("2,3,16")], (), {},
         2 * 3 * 16 * 32),
        ("torch.aten.einsum", ["!torch.str", "!torch.list<vtensor>"], [V.format("2,12,32")],
         ("bij,bjk->bik", (V.format("2,12,12"), V.format("2,12,32"))), {}, 2 * 12 * 12 * 32),
        # SDPA: Q·Kᵀ + P·V, batch 2 x heads 4, L 12, S 10, E 8, Ev 6.
        ("torch.aten.scaled_dot_product_attention", [V.format("2,4,12,8"), V.format("2,4,10,8"),
                                                     V.format("2,4,10,6")], [V.format("2,4,12,6")], (), {},
         2 * 4 * 12 * 10 * (8 + 6)),
        # Transposed conv: input elements x weight [I, O/g, kh, kw] past its first dim.
        ("torch.aten.convolution", [V.format("1,4,8,8"), V.format("4,6,3,3")] + ["!torch.int"] * 7,
         [V.format("1,6,16,16")], (None, None, None, None, None, None, True, None, 1), {}, 4 * 64 * 6 * 9),
        ("torch.aten.convolution", [V.format("1,6,16,16"), V.format("6,2,3,3")] + ["!torch.int"] * 7,
         [V.format("1,6,16,16")], (None, None, None, None, None, None, False, None, 3), {}, 6 * 256 * 2 * 9),
        # StableHLO conv in NCHW/OIHW: the kernel spec says where the output features are.
        ("stablehlo.convolution", ["tensor<1x3x8x8xf32>", "tensor<4x3x3x3xf32>"], ["tensor<1x4x6x6xf32>"], (),
         {"dimension_numbers": "#stablehlo.conv<[b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1]>"}, 144 * 27),
        ("tosa.transpose_conv2d", ["tensor<1x4x4x3xf32>", "tensor<5x3x3x3xf32>", "tensor<5xf32>"],
         ["tensor<1x9x9x5xf32>"], (), {}, 16 * 3 * 5 * 9),
        ("onnx.Gemm", ["tensor<64x8xf32>", "tensor<64x16xf32>"], ["tensor<8x16xf32>"], (),
         {"torch.onnx.transA": "1 : si64"}, 8 * 16 * 64),
    ],
)
def test_contraction_rules(name: str, operands: list[str], results: list[str], constants: tuple,
                           attributes: dict, macs: int) -> None:
    cost = costs.op_cost(name, operands, results, constants=constants, attributes=attributes)
    assert (cost.macs, cost.flops, cost.kind) == (macs, 2 * macs, costs.CONTRACTION)


@pytest.mark.parametrize(("name", "operands", "constants", "attributes", "flops", "kind"), [
    ("torch.aten.layer_norm", [V.format("8,64"), "!torch.list<int>", V.format("64"), V.format("64")], (), {},
     7 * 512, costs.ARITHMETIC),
    ("torch.aten._softmax", [V.format("8,64")], (), {}, 4 * 512, costs.ARITHMETIC),  # + 512 transcendentals
    ("torch.aten.max_pool2d", [V.format("1,4,8,8"), "!torch.list<int>"], (None, (2, 2)), {}, 4 * 16 * 4,
     costs.ARITHMETIC),
    ("stablehlo.reduce_window", ["tensor<1x8x8x4xf32>"], (), {"window_dimensions": "array<i64: 1, 2, 2, 1>"},
     4 * 16 * 4, costs.ARITHMETIC),
    ("torch.aten.transpose.int", [V.format("8,64")], (), {}, None, costs.DATA),
    ("iree_encoding.set_encoding", ["tensor<8x64xf32>"], (), {}, None, costs.DATA),
])
def test_arithmetic_and_data_rules(name: str, operands: list[str], constants: tuple, attributes: dict,
                                   flops: int | None, kind: str) -> None:
    out = {"torch.aten.max_pool2d": V.format("1,4,4,4"), "stablehlo.reduce_window": "tensor<1x4x4x4xf32>"}
    cost = costs.op_cost(name, operands, [out.get(name, operands[0])], constants=constants, attributes=attributes)
    assert (cost.macs, cost.flops, cost.kind) == (None, flops, kind)


def test_weighted_placement_follows_what_each_dispatch_computes() -> None:
    """SYNTHETIC: conv2's ID is named by its own dispatch and by the downsample's (its
    bias add fused there); only the first convolves, so all its MACs go there. An op no
    rule knows takes its dispatches' figures; an encoding carries none."""
    from dfit_mlir.core.site_costs import moves_data_only, placed_costs

    placed = placed_costs([["conv2"], ["down", "conv2"], ["mm"], ["odd"]], [True, True, False, True],
                          {"conv2": 1000, "down": 100, "mm": 64, "odd": None},
                          [{"conv2": 1000}, {"down": 100}, {}, {"odd": 7}])
    assert placed == [{"conv2": 1000}, {"down": 100}, {"mm": 64}, {"odd": 7}]
    split = placed_costs([["a"], ["a"]], [True, True], {"a": 10}, [{"a": 1}, {"a": 2}])
    assert [p["a"] for p in split] == [3, 7]
    assert moves_data_only("_encoding_0_encode_128x784xf32_to_128x784xf32")


def test_static_trip_counts_of_loops() -> None:
    """SYNTHETIC: an scf.for from 0 to 10 step 3 runs 4 trips; ops in its body are per trip."""
    from iree.compiler import ir

    from dfit_mlir.passes import mlir_engine, operators, snapshot

    text = """
    func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
      %c0 = arith.constant 0 : index
      %c10 = arith.constant 10 : index
      %c3 = arith.constant 3 : index
      %r = scf.for %i = %c0 to %c10 step %c3 iter_args(%acc = %x) -> (tensor<4xf32>) {
        %y = arith.addf %acc, %acc : tensor<4xf32>
        scf.yield %y : tensor<4xf32>
      }
      return %r : tensor<4xf32>
    }"""
    context = ir.Context()
    with context:
        module = ir.Module.parse(text)
        table, _ = operators.operator_table(mlir_engine.tag_module(module.operation), snapshot.LocationCache())
    add = next(op for op in table if op["op"] == "arith.addf")
    assert (add["per_trip"], add["trips"], add["flops"]) == (True, 4, 4)
    assert next(op for op in table if op["op"] == "scf.for")["trips"] == 1
