"""dfit's static costs (``dfit_mlir.core.costs``, ``passes/operators.py``) against counters
dfit did not write, on real models built here (no download): ``transformers`` GPT-2,
BERT and ResNet (BatchNorm) from configs with random weights, modules of our own
(attention via SDPA, transposed convolution, bmm/einsum/baddbmm), JAX programs (one
with ``lax.scan``) and the ``onnx`` wheel's light models.

What each counter counts, so that like is compared with like:

* ``torch.utils.flop_counter.FlopCounterMode``: 2 FLOPs per MAC of matmuls,
  convolutions and attention; nothing for elementwise ops, norms, softmax. Compared
  with the FLOPs of dfit's ops of kind ``contraction``, in total and per module (its
  module names are dfit's module paths after the root class name). On CPU its SDPA
  kernel (``_scaled_dot_product_flash_attention_for_cpu``) has no formula, so eager runs
  under the math backend, whose bmm it counts.
* XLA's ``compiled.cost_analysis()``: ``flops`` (2 per MAC, 1 per elementwise or
  reduction element) and ``transcendentals`` (exp, tanh, rsqrt, ... per element) apart,
  as dfit counts them; each is compared with dfit's total of the same name. A loop body
  counts once: the ``lax.scan`` program is compared with the same program unrolled.
* ``onnx-tool``: a Conv/Gemm's MACs include one add per output element for its bias,
  which dfit does not count (as FlopCounterMode does not); taken off before comparing.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests import frontend_models

pytestmark = [
    pytest.mark.frontends,
    pytest.mark.filterwarnings("ignore:While compiling, we found certain side effects:UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

TORCH_TOLERANCE = 0.02
XLA_TOLERANCE = 0.05
ONNX_TOLERANCE = 0.02


def static_operators(source: Path) -> list[dict[str, Any]]:
    """The manifest's operator table of ``source``, as ``dfit compile`` builds it (tag,
    then ``operators.operator_table``), without running IREE."""
    from dfit_mlir.passes import mlir_engine, operators, phases, snapshot

    driver = phases.open_driver([], "in-process")
    try:
        with driver.context:
            module = driver.parse(source)
            table, _ = operators.operator_table(mlir_engine.tag_module(module), snapshot.LocationCache())
            del module
    finally:
        driver.close()
    return table


def total(ops: list[dict[str, Any]], key: str = "flops", kind: str | None = None) -> int:
    """Static total per model call: per-trip figures times their trips."""
    return sum((op[key] or 0) * op["trips"] for op in ops if kind is None or op["cost_kind"] == kind)


def within(measured: float, expected: float, tolerance: float) -> bool:
    return expected > 0 and abs(measured - expected) <= tolerance * expected


# --- PyTorch ----------------------------------------------------------------------------


GPT2_SEQ = 8


def _gpt2() -> tuple[Any, Any, tuple[Any, ...]]:
    """GPT-2 (2 layers, n_embd 64) with SDPA attention for the export and the same
    weights with eager attention for the counter; called without cache and mask."""
    import torch
    from transformers import GPT2Config, GPT2Model

    class LastHidden(torch.nn.Module):
        """Positions and a 4-D float causal mask built here: the ones transformers derives
        (``diff`` of a cache position, a boolean mask) do not compile in IREE 3.13."""

        def __init__(self, model: Any, length: int) -> None:
            super().__init__()
            self.model = model
            self.register_buffer("positions", torch.arange(length)[None], persistent=False)
            causal = torch.full((length, length), torch.finfo(torch.float32).min).triu(1)
            self.register_buffer("mask", causal[None, None], persistent=False)

        def forward(self, ids: Any) -> Any:
            return self.model(input_ids=ids, position_ids=self.positions, attention_mask=self.mask,
                              use_cache=False).last_hidden_state

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=100, n_positions=32, n_embd=64, n_layer=2, n_head=2, bos_token_id=0,
                        eos_token_id=0)
    return LastHidden(GPT2Model(config).eval(), GPT2_SEQ), None, (torch.randint(0, 100, (1, GPT2_SEQ)),)


def _bert() -> tuple[Any, Any, tuple[Any, ...]]:
    model, args = frontend_models.bert()
    return model, None, args


def _resnet() -> tuple[Any, Any, tuple[Any, ...]]:
    """transformers ResNet (BatchNorm after every conv, a 1x1 downsample shortcut)."""
    import torch
    from transformers import ResNetConfig, ResNetModel

    torch.manual_seed(0)
    config = ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
                          layer_type="basic", downsample_in_first_stage=False)
    return ResNetModel(config).eval(), None, (torch.randn(1, 3, 32, 32),)


def _mobilenet() -> tuple[Any, Any, tuple[Any, ...]]:
    """transformers MobileNetV2: depthwise (grouped) convolutions, BatchNorm, ReLU6."""
    import torch
    from transformers import MobileNetV2Config, MobileNetV2Model

    torch.manual_seed(0)
    config = MobileNetV2Config(num_channels=3, image_size=32, depth_multiplier=0.25, min_depth=4)
    return MobileNetV2Model(config).eval(), None, (torch.randn(1, 3, 32, 32),)


def _own_ops() -> tuple[Any, Any, tuple[Any, ...]]:
    """Our own module: attention through ``F.scaled_dot_product_attention``, a
    transposed and a grouped convolution, bmm, einsum, baddbmm, broadcasting matmul,
    linear, pooling."""
    import torch
    import torch.nn.functional as F

    class Attention(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = torch.nn.Linear(32, 96)
            self.out = torch.nn.Linear(32, 32)

        def forward(self, x: Any) -> Any:
            q, k, v = self.qkv(x).view(2, 12, 3, 4, 8).permute(2, 0, 3, 1, 4).unbind(0)
            return self.out(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(2, 12, 32))

    class Mixer(torch.nn.Module):
        def forward(self, x: Any, y: Any) -> Any:
            a = torch.bmm(x, y.transpose(1, 2))                       # [2, 12, 12]
            b = torch.einsum("bij,bjk->bik", a, x)                    # [2, 12, 32]
            c = torch.baddbmm(b, a, x)
            return torch.matmul(c, torch.ones(32, 16))                # broadcasting matmul

    class Convs(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up = torch.nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1)
            self.grouped = torch.nn.Conv2d(6, 6, 3, padding=1, groups=3)
            self.pool = torch.nn.MaxPool2d(2)

        def forward(self, x: Any) -> Any:
            return self.pool(self.grouped(self.up(x)))

    class Own(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attention = Attention()
            self.mixer = Mixer()
            self.convs = Convs()

        def forward(self, x: Any, image: Any) -> Any:
            h = self.attention(x)
            return self.mixer(h, x).sum() + self.convs(image).sum()

    torch.manual_seed(0)
    return Own().eval(), None, (torch.randn(2, 12, 32), torch.randn(1, 4, 8, 8))


TORCH_MODELS = {"gpt2": _gpt2, "bert": _bert, "resnet": _resnet, "mobilenet_v2": _mobilenet, "own_ops": _own_ops}


def flop_counter(model: Any, args: tuple[Any, ...]) -> tuple[int, dict[str, int]]:
    """(total, module path → FLOPs incl. submodules) by FlopCounterMode; eager SDPA on
    the math backend (the CPU flash kernel has no formula)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(*args)
    per_module = {}
    for name, counts in counter.get_flop_counts().items():
        if name != "Global":
            per_module[name.partition(".")[2]] = sum(counts.values())  # drop the root class name
    return counter.get_total_flops(), per_module


def dfit_per_module(ops: list[dict[str, Any]]) -> dict[str, int]:
    """Module path → contraction FLOPs of its ops and its submodules' ops."""
    found: dict[str, int] = defaultdict(int)
    for op in ops:
        if op["cost_kind"] != "contraction" or op.get("module_path") is None:
            continue
        parts = op["module_path"].split(".") if op["module_path"] else []
        for depth in range(len(parts) + 1):
            found[".".join(parts[:depth])] += op["flops"] * op["trips"]
    return found


@pytest.fixture(scope="module", params=sorted(TORCH_MODELS))
def torch_counted(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from dfit_mlir.core import atomic
    from dfit_mlir.frontends import torch as torch_frontend

    model, _, args = TORCH_MODELS[request.param]()
    source = tmp_path_factory.mktemp(request.param) / f"{request.param}.mlir"
    atomic.write_text(source, torch_frontend.export_mlir(model, args))
    expected, expected_modules = flop_counter(model, args)
    return {"name": request.param, "ops": static_operators(source), "expected": expected,
            "expected_modules": expected_modules}


def test_torch_contraction_flops_match_flop_counter(torch_counted: dict[str, Any]) -> None:
    ops, expected = torch_counted["ops"], torch_counted["expected"]
    measured = total(ops, kind="contraction")
    print(f"ACCURACY torch {torch_counted['name']}: dfit {measured} FlopCounterMode {expected} "
          f"error {100 * (measured - expected) / expected:+.2f}%")
    assert within(measured, expected, TORCH_TOLERANCE), (measured, expected)


def test_torch_per_module_flops_match_flop_counter(torch_counted: dict[str, Any]) -> None:
    measured = dfit_per_module(torch_counted["ops"])
    compared = 0
    for module, expected in torch_counted["expected_modules"].items():
        if expected == 0:
            continue
        assert within(measured.get(module, 0), expected, TORCH_TOLERANCE), (module, measured.get(module), expected)
        compared += 1
    assert compared >= 2, torch_counted["expected_modules"]


def test_every_torch_op_that_computes_has_flops(torch_counted: dict[str, Any]) -> None:
    """No op is left without a figure unless it only moves data: matmuls, attention,
    convolutions, norms, pooling, elementwise all carry FLOPs."""
    unknown = sorted({op["op"] for op in torch_counted["ops"] if op["cost_kind"] == "unknown"
                      and op["op"].startswith("torch.aten.")})
    assert unknown == [], unknown


# --- JAX --------------------------------------------------------------------------------


def _jax_mlp() -> tuple[Any, tuple[Any, ...]]:
    """Dense + tanh, a layer norm by hand, a second dense, softmax."""
    import jax
    import jax.numpy as jnp

    def forward(params: dict, x: Any) -> Any:
        h = jnp.tanh(x @ params["w1"] + params["b1"])
        h = (h - h.mean(-1, keepdims=True)) * jax.lax.rsqrt(h.var(-1, keepdims=True) + 1e-5)
        return jax.nn.softmax(h @ params["w2"])

    key1, key2 = jax.random.split(jax.random.PRNGKey(0))
    params = {"w1": jax.random.normal(key1, (32, 64)), "b1": jnp.zeros(64), "w2": jax.random.normal(key2, (64, 16))}
    return forward, (params, jnp.ones((8, 32)))


def _jax_cnn() -> tuple[Any, tuple[Any, ...]]:
    """``conv_general_dilated`` (VALID: XLA counts only the taps inside the input, so a
    padded conv would differ by design), relu, a max-pool ``reduce_window``, a dense."""
    import jax
    import jax.numpy as jnp

    def forward(params: dict, x: Any) -> Any:
        y = jax.lax.conv_general_dilated(x, params["kernel"], (1, 1), "VALID",
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"))
        y = jax.lax.reduce_window(jax.nn.relu(y), -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
        return y.reshape(y.shape[0], -1) @ params["dense"]

    key1, key2 = jax.random.split(jax.random.PRNGKey(0))
    params = {"kernel": jax.random.normal(key1, (3, 3, 4, 8)), "dense": jax.random.normal(key2, (7 * 7 * 8, 10))}
    return forward, (params, jnp.ones((2, 16, 16, 4)))


SCAN_LAYERS = 4


def _attention_layer(h: Any, w: Any) -> tuple[Any, None]:
    import jax
    import jax.numpy as jnp

    with jax.named_scope("attn"):
        a = jax.nn.softmax((h @ w[0]) @ (h @ w[1]).T / 4.0) @ (h @ w[2])
    with jax.named_scope("mlp"):
        return h + jnp.tanh(a @ w[3]), None


def _jax_scanned(weights: Any, h: Any) -> Any:
    import jax

    return jax.lax.scan(_attention_layer, h, weights)[0]


def _jax_unrolled(weights: Any, h: Any) -> Any:
    for layer in range(weights.shape[0]):
        h = _attention_layer(h, weights[layer])[0]
    return h


def _scan_args() -> tuple[Any, ...]:
    import jax

    return jax.random.normal(jax.random.PRNGKey(1), (SCAN_LAYERS, 4, 32, 32)) * 0.1, jax.numpy.ones((16, 32))


def xla_cost(fn: Any, *args: Any, key: str = "flops") -> float:
    """XLA's ``key`` (``flops`` / ``transcendentals``) of the compiled program."""
    import jax

    analysis = jax.jit(fn).lower(*args).compile().cost_analysis()
    analysis = analysis[0] if isinstance(analysis, list) else analysis
    return analysis.get(key, 0.0)


def xla_flops(fn: Any, *args: Any) -> float:
    """XLA's flops of the compiled program (its transcendentals apart, as dfit's)."""
    return xla_cost(fn, *args)


def _jax_ops(fn: Any, args: tuple[Any, ...], root: Path, name: str) -> list[dict[str, Any]]:
    from dfit_mlir.core import atomic
    from dfit_mlir.frontends import jax as jax_frontend

    source = root / f"{name}.mlir"
    atomic.write_text(source, jax_frontend.lower_text(fn, *args))
    return static_operators(source)


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_jax_flops_match_xla_cost_analysis(name: str, tmp_path: Path) -> None:
    fn, args = {"mlp": _jax_mlp, "cnn": _jax_cnn}[name]()
    measured, expected = total(_jax_ops(fn, args, tmp_path, name)), xla_flops(fn, *args)
    print(f"ACCURACY jax {name}: dfit {measured} XLA {expected:.0f} error {100 * (measured - expected) / expected:+.2f}%")
    assert within(measured, expected, XLA_TOLERANCE), (measured, expected)


def test_jax_scan_counts_every_trip(tmp_path: Path) -> None:
    """The scan body's ops are per trip with ``trips`` = the scan length, through the
    ``closed_call`` the body calls; their static total matches XLA on the unrolled
    program (XLA counts the scanned program's body once)."""
    args = _scan_args()
    ops = _jax_ops(_jax_scanned, args, tmp_path, "scan")
    dot = [op for op in ops if op["op"] == "stablehlo.dot_general"]
    assert dot and all(op["per_trip"] and op["trips"] == SCAN_LAYERS for op in dot)
    measured, expected = total(ops), xla_flops(_jax_unrolled, *args)
    once = xla_flops(_jax_scanned, *args)
    print(f"ACCURACY jax scan x{SCAN_LAYERS}: dfit {measured} XLA unrolled {expected:.0f} (XLA scanned, body once: "
          f"{once:.0f}) error {100 * (measured - expected) / expected:+.2f}%")
    assert within(measured, expected, XLA_TOLERANCE), (measured, expected)
    assert not within(once, expected, XLA_TOLERANCE)  # the counter itself counts the body once
    assert total(_jax_ops(_jax_unrolled, args, tmp_path, "unrolled")) == pytest.approx(measured, rel=0.001)


def _jax_block() -> tuple[Any, tuple[Any, ...]]:
    """Dense + GELU (tanh form, JAX's default), a layer norm by hand with its affine
    weight and bias, a second dense and a softmax: exp, tanh and rsqrt."""
    import jax
    import jax.numpy as jnp

    def forward(params: dict, x: Any) -> Any:
        h = jax.nn.gelu(x @ params["w1"] + params["b1"])
        centred = h - h.mean(-1, keepdims=True)
        h = centred * jax.lax.rsqrt((centred ** 2).mean(-1, keepdims=True) + 1e-5) * params["g"] + params["b"]
        return jax.nn.softmax(h @ params["w2"])

    key1, key2 = jax.random.split(jax.random.PRNGKey(0))
    params = {"w1": jax.random.normal(key1, (32, 64)), "b1": jnp.zeros(64), "g": jnp.ones(64), "b": jnp.zeros(64),
              "w2": jax.random.normal(key2, (64, 16))}
    return forward, (params, jnp.ones((8, 32)))


@pytest.mark.parametrize("name", ["block", "mlp", "scan"])
def test_jax_transcendentals_match_xla_cost_analysis(name: str, tmp_path: Path) -> None:
    """dfit's transcendentals (exp, tanh, rsqrt per element, not FLOPs) and its FLOPs
    without them, each within 5 % of XLA's count of the same name; the ``lax.scan``
    program against the same program unrolled (XLA counts a loop body once)."""
    if name == "scan":
        fn, args, reference = _jax_scanned, _scan_args(), _jax_unrolled
    else:
        (fn, args), reference = {"block": _jax_block, "mlp": _jax_mlp}[name](), None
    ops = _jax_ops(fn, args, tmp_path, name)
    for key in ("transcendentals", "flops"):
        measured, expected = total(ops, key), xla_cost(reference or fn, *args, key=key)
        print(f"ACCURACY jax {name} {key}: dfit {measured} XLA {expected:.0f} "
              f"error {100 * (measured - expected) / expected:+.2f}%")
        assert within(measured, expected, XLA_TOLERANCE), (key, measured, expected)
    # Every transcendental is an op of its own: FLOPs do not count it as well.
    assert all(op["flops"] == 0 for op in ops if op["op"] in ("stablehlo.exponential", "stablehlo.tanh"))
    assert any(op["op"] == "stablehlo.tanh" and op["transcendentals"] for op in ops)


# --- ONNX -------------------------------------------------------------------------------


def onnx_tool_macs(path: Path) -> int:
    """MACs of the Conv/Gemm/MatMul nodes by onnx-tool, less the one add per output
    element it counts for a bias."""
    import math

    import onnx_tool

    model = onnx_tool.Model(str(path))
    graph = model.graph
    graph.graph_reorder_nodes()
    graph.shape_infer()
    graph.profile()
    found = 0
    for node in graph.nodemap.values():
        if node.op_type in ("Conv", "ConvTranspose", "Gemm", "MatMul"):
            macs = node.macs[0] if isinstance(node.macs, (list, tuple)) else node.macs
            bias = math.prod(graph.tensormap[node.output[0]].get_shape()) if len(node.input) > 2 else 0
            found += int(macs) - bias
    return found


@pytest.mark.parametrize("name", ["squeezenet", "resnet50", "inception_v1"])
def test_onnx_macs_match_onnx_tool(name: str, tmp_path: Path) -> None:
    from dfit_mlir.core import atomic
    from dfit_mlir.frontends import onnx as onnx_frontend
    from tests.realmodels import onnx_light_path

    path = onnx_light_path(name)
    source = tmp_path / f"{name}.mlir"
    atomic.write_text(source, onnx_frontend.import_model(path))
    measured, expected = total(static_operators(source), "macs"), onnx_tool_macs(path)
    print(f"ACCURACY onnx {name}: dfit {measured} onnx-tool {expected} error {100 * (measured - expected) / expected:+.2f}%")
    assert within(measured, expected, ONNX_TOLERANCE), (measured, expected)


# --- Where the MACs land: one compute dispatch each --------------------------------------


def _block() -> tuple[Any, tuple[Any, ...]]:
    """A ResNet basic block with a 1x1 stride-2 downsample shortcut (BatchNorm-free:
    IREE 3.13 does not compile eval BatchNorm from torch.export); conv biases and the
    residual add fuse into the convolutions' dispatches."""
    import torch

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = torch.nn.Conv2d(32, 64, 3, stride=2, padding=1)
            self.conv2 = torch.nn.Conv2d(64, 64, 3, padding=1)
            self.downsample = torch.nn.Conv2d(32, 64, 1, stride=2)

        def forward(self, x: Any) -> Any:
            return torch.relu(self.conv2(torch.relu(self.conv1(x))) + self.downsample(x))

    torch.manual_seed(0)
    return Block().eval(), (torch.randn(1, 32, 16, 16),)


def _mlp() -> tuple[Any, tuple[Any, ...]]:
    import torch

    class MLP(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = torch.nn.Linear(64, 128)
            self.fc2 = torch.nn.Linear(128, 32)

        def forward(self, x: Any) -> Any:
            return self.fc2(torch.relu(self.fc1(x)))

    torch.manual_seed(0)
    return MLP().eval(), (torch.randn(16, 64),)


def _compiled(build: Any, root: Path, extra_flags: tuple[str, ...] = ()) -> dict[str, Any]:
    from dfit_mlir.frontends import torch as torch_frontend

    model, args = build()
    flags = (*torch_frontend.DEFAULT_FLAGS, *extra_flags)
    return torch_frontend.compile(model, args, output=root / "model.vmfb", mode="ids", flags=flags).manifest


def _placed(manifest: dict[str, Any], key: str) -> list[dict[str, int]]:
    from dfit_mlir.core.site_costs import op_figures, placed_costs, site_members, site_weights

    sites = manifest["partitions"]["dispatch_sites"]
    kinds = {op["id"]: op["cost_kind"] for op in manifest["operators"]}
    costs = op_figures({op["id"]: op[key] for op in manifest["operators"]}, kinds)
    return placed_costs([site_members(s) for s in sites], [True] * len(sites), costs, site_weights(sites, key, kinds))


def assert_each_contraction_in_one_dispatch(manifest: dict[str, Any]) -> None:
    from dfit_mlir.core.site_costs import dispatch_site_costs

    contractions = {op["id"]: op["macs"] for op in manifest["operators"] if op["cost_kind"] == "contraction"}
    placed = _placed(manifest, "macs")
    for op_id, macs in contractions.items():
        holding = [share[op_id] for share in placed if share.get(op_id)]
        assert holding == [macs], (op_id, holding)
    per_site = dispatch_site_costs(manifest, "macs")
    assert sum(per_site) == sum(contractions.values()) == sum(op["macs"] or 0 for op in manifest["operators"])
    assert [s["macs"] for s in manifest["partitions"]["dispatch_sites"]] == per_site
    flops = dispatch_site_costs(manifest, "flops")
    assert sum(f or 0 for f in flops) == sum(op["flops"] or 0 for op in manifest["operators"])


@pytest.mark.slow
def test_resnet_block_downsample_dispatch_gets_its_own_macs(tmp_path: Path) -> None:
    """The 1x1 downsample's dispatch carries 32 x 64 x 8 x 8 = 131,072 MACs, and the 3x3
    conv's dispatch, where the residual add is fused, none of them (the even split over
    every dispatch naming an op, which this replaces, gave 65,536 and 2,424,832 here);
    each conv's MACs sit in one dispatch and the dispatches sum to the model."""
    manifest = _compiled(_block, tmp_path)
    assert_each_contraction_in_one_dispatch(manifest)
    by_module = {op["module_path"]: op for op in manifest["operators"] if op["cost_kind"] == "contraction"}
    assert by_module["downsample"]["macs"] == 32 * 64 * 8 * 8 == 131_072
    assert by_module["conv2"]["macs"] == 64 * 9 * 64 * 8 * 8
    sites = manifest["partitions"]["dispatch_sites"]
    downsample = [s for s in sites if by_module["downsample"]["id"] in (s.get("region_macs") or {})]
    assert len(downsample) == 1 and downsample[0]["macs"] == 131_072
    # Bytes at the boundary: the dispatch reads the input and the 1x1 weights, writes 64x8x8.
    assert downsample[0]["bytes_read"] >= 4 * (32 * 16 * 16 + 64 * 32) and downsample[0]["bytes_written"] == 4 * 64 * 8 * 8


@pytest.mark.slow
def test_data_tiled_encodings_carry_bytes_and_no_macs(tmp_path: Path) -> None:
    manifest = _compiled(_mlp, tmp_path, ("--iree-opt-data-tiling=true",))
    sites = manifest["partitions"]["dispatch_sites"]
    encodings = [s for s in sites if s["kind"] == "encoding"]
    assert encodings, [s["export"] for s in sites]
    assert all(s["macs"] == 0 and s["flops"] == 0 for s in encodings)
    assert any(s["bytes_read"] == 4 * 64 * 128 for s in encodings)  # fc1's weight, laid out
    assert_each_contraction_in_one_dispatch(manifest)
    assert sum(s["macs"] for s in sites if s["kind"] == "compute") == 16 * 64 * 128 + 16 * 128 * 32


@pytest.mark.slow
def test_gpt2_matmul_and_attention_dispatches_carry_their_macs(tmp_path: Path) -> None:
    """GPT-2's projections (``addmm`` of HF ``Conv1D``) and SDPA land in their dispatches
    with their MACs (none was counted before), GELU's elementwise ops fused into
    ``c_fc`` add FLOPs but no MACs; the dispatches sum to the model."""
    def build() -> tuple[Any, tuple[Any, ...]]:
        model, _, args = _gpt2()
        return model, args

    manifest = _compiled(build, tmp_path)
    assert_each_contraction_in_one_dispatch(manifest)
    ops = {op["id"]: op for op in manifest["operators"]}
    sites = manifest["partitions"]["dispatch_sites"]
    computing = [s for s in sites if "matmul" in s["export"] or "attention" in s["export"]]
    assert len(computing) == 2 * 5 and all(s["macs"] > 0 for s in computing)

    def site_of(module: str) -> dict[str, Any]:
        return next(s for s in sites if any(ops[i]["module_path"] == module and ops[i]["cost_kind"] == "contraction"
                                            for i in s.get("region_macs") or {}))

    c_fc = site_of("model.h.0.mlp.c_fc")
    assert c_fc["macs"] == GPT2_SEQ * 64 * 256 and c_fc["flops"] > 2 * c_fc["macs"]  # + the fused GELU
    assert site_of("model.h.0.attn")["macs"] == 2 * GPT2_SEQ * GPT2_SEQ * (32 + 32)  # 2 heads of 32


@pytest.mark.slow
def test_jax_scan_dispatches_are_per_trip_and_sum_to_the_model(tmp_path: Path) -> None:
    """Compiled, the scan body's dispatches say they run per trip, ``trips`` = the scan
    length; their MACs x trips sum to the static total, which matches XLA unrolled."""
    from dfit_mlir.frontends import jax as jax_frontend

    args = _scan_args()
    manifest = jax_frontend.compile(_jax_scanned, *args, output=tmp_path / "scan.vmfb", mode="ids").manifest
    computing = [s for s in manifest["partitions"]["dispatch_sites"] if s["macs"]]
    assert computing and all(s["per_trip"] and s["trips"] == SCAN_LAYERS for s in computing)
    dispatched = sum(s["macs"] * s["trips"] for s in computing)
    assert dispatched == total(manifest["operators"], "macs") == SCAN_LAYERS * 16 * 32 * (4 * 32 + 2 * 16)


@pytest.mark.slow
def test_an_op_no_rule_knows_takes_its_dispatch_figures(tmp_path: Path) -> None:
    """``torch.aten.logaddexp`` has no rule of its own: its FLOPs are what its lowered
    ``linalg.generic`` computes (iteration domain x arith/math ops of its body), said in
    ``cost_source``; the matmul keeps its own rule."""
    import torch

    class LogAddExp(torch.nn.Module):
        def forward(self, x: Any, y: Any) -> Any:
            return torch.logaddexp(x, y) @ y.T

    manifest = _compiled(lambda: (LogAddExp(), (torch.randn(8, 16), torch.randn(8, 16))), tmp_path)
    op = next(op for op in manifest["operators"] if op["op"] == "torch.aten.logaddexp")
    assert op["cost_source"] == "dispatch" and op["macs"] is None
    assert op["flops"] > 0 and op["flops"] % (8 * 16) == 0  # a whole number of ops per element
    # Its exp and log1p are transcendentals, counted from the lowered body's math ops
    # (region_transcendentals) and placed by the ledger: a whole number per element.
    from dfit_mlir.analysis.ledger import Ledger
    from dfit_mlir.analysis.model import SemanticModel

    placed = sum(r["transcendentals"] or 0 for r in Ledger(SemanticModel(manifest)).entries.to_pylist()
                 if r["op_id"] == op["id"])
    assert placed > 0 and placed % (8 * 16) == 0, placed
    matmul = next(op for op in manifest["operators"] if op["op"] == "torch.aten.matmul")
    assert (matmul["cost_source"], matmul["macs"]) == ("source", 8 * 8 * 16)
    assert_each_contraction_in_one_dispatch(manifest)
