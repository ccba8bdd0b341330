"""The xDSL engine gives exactly the IDs and hashes of the MLIR engine, and ``dfit-tag``
is an ``xdsl-opt`` pass found through dfit's entry point."""

from __future__ import annotations

import random
import re
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from iree.compiler import ir
from xdsl.dialects import builtin
from xdsl.universe import Universe

from dfit_mlir.core import ids, locations
from dfit_mlir.passes import mlir_engine, xdsl_engine
from tests.conftest import CONVNET, tag_text

XDSL_OPT = Path(sys.executable).with_name("xdsl-opt")

MULTI_FUNCTION = """
module {
  func.func private @helper(%a: f32, %b: f32) -> f32 {
    %c = arith.constant 2.5 : f32
    %m = arith.mulf %a, %c : f32
    %s = arith.addf %m, %b fastmath<fast> : f32
    return %s : f32
  }
  func.func @loop(%n: index, %init: f32) -> f32 {
    %c0 = arith.constant 0 : index
    %c1 = arith.constant 1 : index
    %one = arith.constant 1.0 : f32
    %r = scf.for %i = %c0 to %n step %c1 iter_args(%acc = %init) -> (f32) {
      %x = func.call @helper(%acc, %one) : (f32, f32) -> f32
      %k = arith.constant 7 : i32
      %t = arith.constant true
      %y = arith.negf %x : f32
      scf.yield %y : f32
    }
    return %r : f32
  }
}
"""

# Float and integer constants that xDSL and MLIR spell differently before normalization:
# APFloat's fallback form (-3.40282347E+38), hex for inf and for integral f64 values.
ARITH_CONSTANTS = """
func.func @consts(%a: i32, %b: i32, %x: f32, %y: f32) -> (i32, i1, f32) {
  %c = arith.constant -42 : i32
  %d = arith.addi %a, %c : i32
  %e = arith.muli %d, %b : i32
  %f = arith.cmpi slt, %e, %a : i32
  %big = arith.constant 123456789 : i64
  %g = arith.constant 0.1 : f64
  %h = arith.constant 1.0e-10 : f32
  %pi = arith.constant 3.14159274 : f32
  %max = arith.constant -3.40282347E+38 : f32
  %inf = arith.constant 0x7F800000 : f32
  %nz = arith.constant -0.0 : f64
  %int = arith.constant 16777217.0 : f64
  %half = arith.constant 123.456 : f16
  %bf = arith.constant 1.1 : bf16
  %lt = arith.cmpf olt, %x, %y : f32
  %s = arith.select %lt, %x, %pi : f32
  %q = arith.divf %s, %max fastmath<nnan,ninf> : f32
  return %e, %f, %q : i32, i1, f32
}
"""

TENSOR_OPS = """
func.func @tensors(%t: tensor<4x8xf32>, %d: tensor<?x8xf32>, %i: index) -> tensor<2x8xf32> {
  %c0 = arith.constant 0 : index
  %small = arith.constant dense<[1.0, 2.0, 3.5, -4.0]> : tensor<4xf32>
  %ints = arith.constant dense<[[1, 2], [3, 4]]> : tensor<2x2xi32>
  %weights = arith.constant dense<0.5> : tensor<4x8xf32>
  %e = tensor.empty() : tensor<2x8xf32>
  %s = tensor.extract_slice %t[0, 0] [2, 8] [1, 1] : tensor<4x8xf32> to tensor<2x8xf32>
  %x = tensor.extract %t[%c0, %i] : tensor<4x8xf32>
  %dim = tensor.dim %d, %c0 : tensor<?x8xf32>
  %ins = tensor.insert %x into %e[%c0, %c0] : tensor<2x8xf32>
  %cast = tensor.cast %d : tensor<?x8xf32> to tensor<4x8xf32>
  %add = arith.addf %cast, %weights : tensor<4x8xf32>
  %r = tensor.insert_slice %s into %add[2, 0] [2, 8] [1, 1] : tensor<2x8xf32> into tensor<4x8xf32>
  %s2 = tensor.extract_slice %r[%i, 0] [2, 8] [1, 1] : tensor<4x8xf32> to tensor<2x8xf32>
  %flat = tensor.collapse_shape %t [[0, 1]] : tensor<4x8xf32> into tensor<32xf32>
  return %s2 : tensor<2x8xf32>
}
"""

# Named linalg ops parsed from their custom form: xDSL builds their hidden regions itself.
NAMED_LINALG = """
#id2 = affine_map<(n, c) -> (n, c)>
func.func @mm(%a: tensor<4x8xf32>, %b: tensor<8x16xf32>, %v: tensor<16xf32>) -> tensor<16x4xf32> {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<4x16xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<4x16xf32>) -> tensor<4x16xf32>
  %m = linalg.matmul ins(%a, %b : tensor<4x8xf32>, tensor<8x16xf32>)
                     outs(%f : tensor<4x16xf32>) -> tensor<4x16xf32>
  %bc = linalg.broadcast ins(%v : tensor<16xf32>) outs(%e : tensor<4x16xf32>) dimensions = [0]
  %r = linalg.generic {indexing_maps = [#id2, #id2, #id2],
                       iterator_types = ["parallel", "parallel"]}
      ins(%m, %bc : tensor<4x16xf32>, tensor<4x16xf32>) outs(%e : tensor<4x16xf32>) {
  ^bb0(%x: f32, %y: f32, %o: f32):
    %s = arith.addf %x, %y : f32
    %z = arith.maximumf %s, %zero : f32
    linalg.yield %z : f32
  } -> tensor<4x16xf32>
  %c = linalg.copy ins(%r : tensor<4x16xf32>) outs(%e : tensor<4x16xf32>) -> tensor<4x16xf32>
  %et = tensor.empty() : tensor<16x4xf32>
  %t = linalg.transpose ins(%c : tensor<4x16xf32>) outs(%et : tensor<16x4xf32>) permutation = [1, 0]
  return %t : tensor<16x4xf32>
}
"""

CONV_AND_POOL = """
func.func @cp(%img: tensor<1x8x8x3xf32>, %w: tensor<3x3x3x4xf32>, %nchw: tensor<1x4x6x6xf32>,
              %win: tensor<2x2xf32>) -> (tensor<1x6x6x4xf32>, tensor<1x4x3x3xf32>) {
  %zero = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<1x6x6x4xf32>
  %f = linalg.fill ins(%zero : f32) outs(%e : tensor<1x6x6x4xf32>) -> tensor<1x6x6x4xf32>
  %c = linalg.conv_2d_nhwc_hwcf
      {dilations = dense<1> : tensor<2xi64>, strides = dense<1> : tensor<2xi64>}
      ins(%img, %w : tensor<1x8x8x3xf32>, tensor<3x3x3x4xf32>)
      outs(%f : tensor<1x6x6x4xf32>) -> tensor<1x6x6x4xf32>
  %ep = tensor.empty() : tensor<1x4x3x3xf32>
  %p = linalg.pooling_nchw_max
      {dilations = dense<1> : tensor<2xi64>, strides = dense<2> : tensor<2xi64>}
      ins(%nchw, %win : tensor<1x4x6x6xf32>, tensor<2x2xf32>)
      outs(%ep : tensor<1x4x3x3xf32>) -> tensor<1x4x3x3xf32>
  return %c, %p : tensor<1x6x6x4xf32>, tensor<1x4x3x3xf32>
}
"""

# Nested symbol tables, unregistered ops, and attribute kinds xDSL prints differently:
# unsorted dictionaries, i64/f64 array elements, unit attributes, affine maps.
ATTRIBUTES = """
module {
  module @inner {
    func.func @nested(%a: tensor<4xf32> {foo.bar = 1 : i64, foo.a = "x"})
        -> (tensor<4xf32> {foo.res})
        attributes {llvm.emit_c_interface} {
      %0 = "test.op"(%a) {z = {b = 2 : i32, a = [1.5, 2, true, 1.0 : f32, -7 : i64, "s\\"q"]}, u,
                          m = affine_map<(d0, d1)[s0]
                                 -> (d0 + s0 - 3, d0 - d1 * 2, -d1, d0 floordiv 4)>}
          : (tensor<4xf32>) -> tensor<4xf32>
      %1 = "test.region"() ({
      ^bb0(%x: index):
        "test.term"(%x) : (index) -> ()
      }) : () -> i32
      return %0 : tensor<4xf32>
    }
  }
}
"""

def xdsl_tags(text: str) -> dict[str, str]:
    return {item.id: item.hash for item in xdsl_engine.tag_module(xdsl_engine.parse(text))}


def mlir_generic(path: Path) -> str:
    """``path`` printed by MLIR in generic form with locations inline: xDSL 0.74 parses
    this where it lacks an op's custom syntax (linalg.pooling_nhwc_max, linalg.softmax)
    or meets location aliases defined after their use."""
    context = ir.Context()
    context.allow_unregistered_dialects = True
    with context:
        module = ir.Module.parseFile(str(path))
        text = module.operation.get_asm(
            print_generic_op_form=True, enable_debug_info=True, use_local_scope=True
        )
    del module
    return text


@pytest.fixture(scope="module")
def convnet_generic() -> str:
    return mlir_generic(CONVNET)


def test_convnet_ids_and_hashes_match_mlir(convnet_generic: str) -> None:
    expected = tag_text(CONVNET.read_text())
    got = xdsl_tags(convnet_generic)
    assert got == expected
    assert len(got) == 60
    assert {"main/linalg.matmul#1", "main/linalg.conv_2d_nhwc_hwcf#0/arith.mulf#0",
            "main/linalg.pooling_nhwc_max#0", "main/linalg.softmax#0"} <= set(got)


@pytest.mark.parametrize(
    "text",
    [MULTI_FUNCTION, ARITH_CONSTANTS, TENSOR_OPS, NAMED_LINALG, ATTRIBUTES],
    ids=["multi_function", "arith_constants", "tensor_ops", "named_linalg", "attributes"],
)
def test_ids_and_hashes_match_mlir(text: str) -> None:
    expected = tag_text(text)
    assert xdsl_tags(text) == expected
    assert len(expected) >= 6


def test_multi_function_ids() -> None:
    got = xdsl_tags(MULTI_FUNCTION)
    assert got["loop/scf.for#0/func.call#0"] == "5e6cd2d9f34f9528"
    assert got["helper/arith.constant#0"] == "ca263441bfdec240"
    assert {"helper", "loop", "loop/scf.for#0", "loop/scf.for#0/arith.constant#1"} <= set(got)


def test_conv_and_pooling_custom_form_match_mlir() -> None:
    """MLIR's verifier caches linalg.memoized_indexing_maps on conv/pooling ops; xDSL
    never does; the hash leaves the cache out (ids.IGNORED_ATTRS)."""
    assert xdsl_tags(CONV_AND_POOL) == tag_text(CONV_AND_POOL)


def test_named_op_hidden_region_hashed_as_mlir_builds_it() -> None:
    """xDSL builds linalg.matmul's body as add(mul, out), MLIR as add(out, mul)."""
    got = xdsl_tags(NAMED_LINALG)
    expected = tag_text(NAMED_LINALG)
    for op_id in ("mm/linalg.matmul#0/arith.addf#0", "mm/linalg.matmul#0"):
        assert got[op_id] == expected[op_id]


def test_tag_module_locations_match_mlir(convnet_generic: str) -> None:
    module = xdsl_engine.parse(convnet_generic)
    xdsl_engine.tag_module(module)
    got = {
        xdsl_engine.to_loc(op.location): op.attributes[ids.ID_ATTR]
        for op in xdsl_engine.walk_ops(module)
    }
    context = ir.Context()
    context.allow_unregistered_dialects = True
    with context:
        mlir_module = ir.Module.parseFile(str(CONVNET))
        mlir_engine.tag_module(mlir_module.operation)
        expected = [
            mlir_engine.to_loc(op.location) for op in mlir_engine.walk_ops(mlir_module.operation)
        ]
    del mlir_module
    assert set(got) == set(expected)
    conv = locations.NameLoc(
        "dfit:main/linalg.conv_2d_nhwc_hwcf#0",
        locations.CallSiteLoc(
            locations.NameLoc("conv1", locations.FileLoc("convnet.py", 21, 16)),
            locations.FileLoc("convnet.py", 40, 12),
        ),
    )
    assert got[conv] == builtin.StringAttr("main/linalg.conv_2d_nhwc_hwcf#0")


def test_retagging_never_nests() -> None:
    module = xdsl_engine.parse(MULTI_FUNCTION)
    first = {item.id: item.hash for item in xdsl_engine.tag_module(module)}
    second = {item.id: item.hash for item in xdsl_engine.tag_module(module)}
    assert first == second
    for op in xdsl_engine.walk_ops(module):
        op_id = op.attributes[ids.ID_ATTR]
        assert isinstance(op_id, builtin.StringAttr)
        assert locations.dfit_ids(xdsl_engine.to_loc(op.location)) == (op_id.data,)
        assert isinstance(op.location, builtin.NameLoc)
        assert not isinstance(op.location.location, builtin.NameLoc)


def _random_floats(count: int, bits: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.getrandbits(bits) for _ in range(count)]


def _from_bits(bits: int, fmt: str) -> float:
    if fmt == "bf16":  # the top half of an f32
        return struct.unpack("<f", struct.pack("<I", (bits & 0xFFFF) << 16))[0]
    int_fmt = {"e": "<H", "f": "<I", "d": "<Q"}[fmt]
    return struct.unpack("<" + fmt, struct.pack(int_fmt, bits))[0]


@pytest.mark.parametrize(
    ("mlir_type", "xdsl_type", "fmt"),
    [
        (ir.F16Type.get, builtin.Float16Type(), "e"),
        (ir.BF16Type.get, builtin.BFloat16Type(), "bf16"),
        (ir.F32Type.get, builtin.Float32Type(), "f"),
        (ir.F64Type.get, builtin.Float64Type(), "d"),
    ],
    ids=["f16", "bf16", "f32", "f64"],
)
def test_float_text_matches_mlir(
    mlir_type: Callable[[], ir.Type], xdsl_type: builtin.AnyFloat, fmt: str
) -> None:
    """Random bit patterns (NaNs with payloads included), printed as MLIR prints them."""
    width = xdsl_type.bitwidth
    values = [_from_bits(bits, fmt) for bits in _random_floats(400, width, seed=width)]
    values += [0.0, -0.0, 1.0, 0.1, 1e-10, 3.4028234663852886e38, 65504.0, 1048576.5,
               16777217.0, 123.456, 1 / 3, float("inf"), -float("inf")]
    context = ir.Context()
    with context, ir.Location.unknown():
        element = mlir_type()
        expected = [str(ir.FloatAttr.get(element, value)).rsplit(" : ", 1)[0] for value in values]
    got = [xdsl_engine._mlir_float(value, xdsl_type) for value in values]
    assert got == expected
    assert width != 32 or "3.40282347E+38" in got  # APFloat's fallback form, upper-case E


@pytest.mark.parametrize(
    "text",
    [
        "affine_map<(d0, d1) -> (d0 - d1, d0 - 1, -d0, d0 * 2 + d1, d0 + d1 * 2, d0 - d1 * 3)>",
        "affine_map<(d0, d1)[s0] -> (d0 floordiv 4, d1 mod 8, s0 ceildiv 2, (d0 + d1) floordiv 2)>",
        "affine_map<(d0, d1, d2, d3, d4, d5) -> (d0, d1 * 2 + d4, d2 * 2 + d5, d3)>",
        "affine_map<(d0) -> (d0 mod 4 + 1, 0)>",
        "affine_map<() -> ()>",
        "[[0], [1, 2, 3]]",
        "[1.5, 2.0 : f32, true, -7, 3 : i32, \"s\"]",
        "{b = 2 : i32, a = [1, 2], u}",
        "dense<[1.0, 2.5]> : tensor<2xf32>",
        "dense<0.5> : tensor<4x8xf32>",
        "dense<[true, false]> : tensor<2xi1>",
        "dense<1> : tensor<2x2x2x2x2xi8>",
        "array<i64: 0, -9223372036854775808>",
        "#linalg.iterator_type<parallel>",
    ],
)
def test_attribute_text_matches_mlir(text: str) -> None:
    from xdsl.parser import Parser

    context = ir.Context()
    context.allow_unregistered_dialects = True
    with context:
        expected = mlir_engine._attr_text(ir.Attribute.parse(text))
    attribute = Parser(xdsl_engine.context(), text).parse_attribute()
    assert xdsl_engine._attr_text(attribute) == expected


def test_dfit_tag_found_through_entry_point() -> None:
    universe = Universe.get_multiverse()
    assert "dfit-tag" in universe.all_passes and "dfit" in universe.all_dialects
    assert universe.all_passes["dfit-tag"]().name == "dfit-tag"

    result = subprocess.run(
        [str(XDSL_OPT), "-p", "dfit-tag"], input=MULTI_FUNCTION, capture_output=True, text=True,
        check=True,
    )
    pattern = r'dfit\.id = "([^"]+)", dfit\.hash = "([0-9a-f]{16})"'
    stamped = dict(re.findall(pattern, result.stdout))
    assert stamped == tag_text(MULTI_FUNCTION)


def test_xdsl_opt_rejects_unknown_custom_syntax_with_a_clear_error() -> None:
    """xDSL 0.74 has no custom syntax for linalg.pooling_nhwc_max: convnet.mlir must go
    through MLIR's generic form (see :func:`mlir_generic`)."""
    command = [str(XDSL_OPT), "--allow-unregistered-dialect", "-p", "dfit-tag", str(CONVNET)]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode != 0
    assert "does not have a custom format" in result.stderr
