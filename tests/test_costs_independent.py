"""dfit's static costs (``dfit_mlir.costs``, ``passes/operators.py``) against counters
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
  reduction element) plus ``transcendentals`` apart, which dfit counts as FLOPs; the
  sum is compared with dfit's total FLOPs. A loop body counts once: the ``lax.scan``
  program is compared with the same program unrolled.
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


def _gpt2() -> tuple[Any, Any, tuple[Any, ...]]:
    """GPT-2 (2 layers, n_embd 64) with SDPA attention for the export and the same
    weights with eager attention for the counter; called without cache and mask."""
    import torch
    from transformers import GPT2Config, GPT2Model

    class LastHidden(torch.nn.Module):
        def __init__(self, model: Any) -> None:
            super().__init__()
            self.model = model

        def forward(self, ids: Any) -> Any:
            return self.model(input_ids=ids, use_cache=False).last_hidden_state

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=100, n_positions=32, n_embd=64, n_layer=2, n_head=2, bos_token_id=0,
                        eos_token_id=0)
    return LastHidden(GPT2Model(config).eval()), None, (torch.randint(0, 100, (1, 8)),)


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
    from dfit_mlir import atomic
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
