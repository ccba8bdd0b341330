"""What dfit's PyTorch export does for decoders beyond the decomposition table
(``dfit_mlir/frontends/torch.py``, ``dfit_mlir/frontends/torch_caches.py``):

* a ``scaled_dot_product_attention`` whose mask leaves a query row with no key: IREE
  3.13 gives NaN there, PyTorch zeros; dfit's guard gives PyTorch's value (checked on
  the FX program, then in IREE with the guard and without it, which pins the cause on
  IREE's lowering: the same torch-dialect op, NaN without the guard);
* a transformers ``DynamicCache`` among a model's inputs and outputs crosses the export
  as tensors, through dfit's pytree registration (which replaces transformers' own,
  keeping its layout).

GPT-2 with a left-padded batch and the zoo's Llama decode step are the end-to-end
checks (``tests/test_frontend_torch.py``, ``tests/test_zoo.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytestmark = [
    pytest.mark.frontends,
    pytest.mark.filterwarnings("ignore:While compiling, we found certain side effects:UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]


def _attention_model() -> Any:
    import torch

    class Attention(torch.nn.Module):
        def forward(self, q: Any, k: Any, v: Any, mask: Any) -> Any:
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask) + 1

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = Attention()

        def forward(self, q: Any, k: Any, v: Any, mask: Any) -> Any:
            return self.attn(q, k, v, mask)

    return Net().eval()


def _inputs(boolean: bool) -> tuple[Any, ...]:
    """q, k, v (1×2×4×8) and a causal mask whose first query row masks every key."""
    import torch

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4, 8) for _ in range(3))
    mask = torch.ones(1, 1, 4, 4, dtype=torch.bool).tril()
    mask[..., 0, :] = False
    if not boolean:
        mask = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    return q, k, v, mask


@pytest.mark.parametrize("boolean", [True, False], ids=["bool-mask", "additive-mask"])
def test_guarded_attention_gives_torch_zeros_on_fully_masked_rows(boolean: bool) -> None:
    """On the FX program (no IREE): the guard changes no value; PyTorch's result for the
    fully masked row is 0 (+1 here), every other row is as before; the guard's nodes sit
    in the attention's module on its source line."""
    import torch

    from dfit_mlir.frontends import torch as torch_frontend

    model, args = _attention_model(), _inputs(boolean)
    program = torch.export.export(model, args).run_decompositions(torch_frontend.export_decompositions())
    assert torch_frontend.guard_fully_masked_rows(program.graph_module) == 1
    with torch.no_grad():
        expected, got = model(*args), program.module()(*args)
    assert torch.equal(expected[:, :, 0], torch.ones_like(expected[:, :, 0]))  # PyTorch: zeros, then +1
    assert torch.equal(got, expected)
    added = [node for node in program.graph_module.graph.nodes
             if node.op == "call_function" and node.target in (torch.ops.aten.any.dim, torch.ops.aten.where.ScalarOther)]
    assert len(added) == (2 if boolean else 3)
    for node in added:
        assert [path for path, _ in node.meta["nn_module_stack"].values()][-1].endswith("attn")
        assert "scaled_dot_product_attention" in node.meta["stack_trace"]


def test_an_attention_without_a_mask_is_left_alone() -> None:
    import torch

    from dfit_mlir.frontends import torch as torch_frontend

    class Causal(torch.nn.Module):
        def forward(self, q: Any, k: Any, v: Any) -> Any:
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    program = torch.export.export(Causal(), _inputs(True)[:3]).run_decompositions(
        torch_frontend.export_decompositions())
    before = len(program.graph_module.graph.nodes)
    assert torch_frontend.guard_fully_masked_rows(program.graph_module) == 0
    assert len(program.graph_module.graph.nodes) == before


def test_only_masks_computed_from_an_input_are_guarded() -> None:
    """A mask held in a buffer is the same at every call: with the program's user inputs
    given (as the export does), its attention is left alone; an input mask is guarded."""
    import torch

    from dfit_mlir.frontends import torch as torch_frontend

    class FixedMask(torch.nn.Module):
        def __init__(self, mask: Any) -> None:
            super().__init__()
            self.register_buffer("mask", mask)

        def forward(self, q: Any, k: Any, v: Any) -> Any:
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=self.mask)

    q, k, v, mask = _inputs(True)
    fixed = torch.export.export(FixedMask(mask), (q, k, v)).run_decompositions(torch_frontend.export_decompositions())
    assert torch_frontend.guard_fully_masked_rows(fixed.graph_module, fixed.graph_signature.user_inputs) == 0
    given = torch.export.export(_attention_model(), (q, k, v, mask))
    assert torch_frontend.guard_fully_masked_rows(given.graph_module, given.graph_signature.user_inputs) == 1


@pytest.mark.slow
def test_iree_gives_nan_on_a_fully_masked_row_without_the_guard(tmp_path: Path, monkeypatch: Any) -> None:
    """The cause is IREE 3.13's lowering of ``torch.aten.scaled_dot_product_attention``:
    the same MLIR op on the same inputs gives NaN for the fully masked row without the
    guard (eager: zeros), and with the guard IREE equals eager (atol 1e-5). Should IREE
    change its lowering, the first assertion says the guard is no longer needed."""
    import numpy as np
    import torch
    from iree import runtime

    from dfit_mlir.frontends import torch as torch_frontend

    model, args = _attention_model(), _inputs(True)
    with torch.no_grad():
        expected = model(*args).numpy()

    def iree_result(name: str) -> Any:
        compiled = torch_frontend.compile(model, args, output=tmp_path / f"{name}.vmfb", mode="ids")
        module = runtime.load_vm_flatbuffer_file(str(compiled.vmfb), driver="local-sync")
        return np.asarray(module.main(*(tensor.numpy() for tensor in args)))

    guarded = iree_result("guarded")
    monkeypatch.setattr(torch_frontend, "guard_fully_masked_rows", lambda graph_module, inputs=None: 0)
    unguarded = iree_result("unguarded")
    assert np.isnan(unguarded[:, :, 0]).all() and np.allclose(unguarded[:, :, 1:], expected[:, :, 1:], atol=1e-5)
    assert np.isfinite(guarded).all() and np.allclose(guarded, expected, atol=1e-5)


def _tiny_cache() -> Any:
    import torch
    from transformers import DynamicCache

    torch.manual_seed(0)
    return DynamicCache([(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4)) for _ in range(2)])


def test_a_dynamic_cache_flattens_to_its_layers_tensors_and_back(monkeypatch: Any) -> None:
    """Keys of every layer, then values; unflattened, the same tensors in full layers
    that report the cached length, with no empty tensor made on the way."""
    import torch
    from torch.utils import _pytree as pytree

    from dfit_mlir.frontends.torch_caches import register_cache_pytrees

    cache = _tiny_cache()  # imports transformers.cache_utils, as any model holding a cache has
    assert register_cache_pytrees()
    leaves, spec = pytree.tree_flatten(cache)
    assert [id(leaf) for leaf in leaves] == [id(layer.keys) for layer in cache.layers] + \
        [id(layer.values) for layer in cache.layers]
    made: list[Any] = []
    real_tensor = torch.tensor
    monkeypatch.setattr(torch, "tensor", lambda *a, **k: made.append(a) or real_tensor(*a, **k))
    rebuilt = pytree.tree_unflatten(leaves, spec)
    monkeypatch.undo()
    assert not made  # transformers' unflatten makes torch.tensor([]) twice per layer
    assert [id(layer.keys) for layer in rebuilt.layers] == [id(layer.keys) for layer in cache.layers]
    assert [id(layer.values) for layer in rebuilt.layers] == [id(layer.values) for layer in cache.layers]
    assert all(layer.is_initialized for layer in rebuilt.layers) and rebuilt.get_seq_length() == 3


def test_transformers_own_registration_is_replaced_with_the_same_layout() -> None:
    """A model file that called transformers' ``register_dynamic_cache_export_support``
    first still exports: dfit's unflatten takes over, and the pytree context (what an
    exported program's signature records) is the one transformers writes."""
    from torch.utils import _pytree as pytree
    from transformers import DynamicCache
    from transformers.integrations.executorch import register_dynamic_cache_export_support

    from dfit_mlir.frontends import torch_caches

    assert torch_caches.register_cache_pytrees()
    ours_spec = pytree.tree_flatten(_tiny_cache())[1]
    pytree._deregister_pytree_node(DynamicCache)
    try:
        try:
            register_dynamic_cache_export_support()
        except ValueError as error:  # registered in the C++ pytree by an earlier call: Python's is made
            assert "already registered in namespace" in str(error)
        theirs_spec = pytree.tree_flatten(_tiny_cache())[1]
        assert pytree.SUPPORTED_NODES[DynamicCache].unflatten_fn is not torch_caches._unflatten
    finally:
        assert torch_caches.register_cache_pytrees()
    assert pytree.SUPPORTED_NODES[DynamicCache].unflatten_fn is torch_caches._unflatten
    assert ours_spec.context == theirs_spec.context


def test_a_prompt_with_use_cache_exports_its_cache_as_results() -> None:
    """The zoo's Llama on a 6-token prompt with ``use_cache=True`` (the model makes the
    cache itself, and fills it from ``torch.tensor([])`` by ``cat``): the export succeeds
    and ``main`` returns the logits and the 2 keys + 2 values of the cache."""
    import re

    import torch

    from dfit_mlir.frontends import torch as torch_frontend
    from tests.conftest import REPO

    model, _ = torch_frontend.load_module_file(REPO / "examples" / "zoo" / "llama.py")
    ids = torch.randint(0, 64, (1, 6))
    text = torch_frontend.export_mlir(model, (ids,), {"use_cache": True})
    results = re.search(r"func\.func @main\(.*?\) -> \((.*?)\) attributes", text, re.S)
    assert results, text[:2000]
    assert re.findall(r"!torch\.vtensor<\[([\d,]+)\],f32>", results.group(1)) == ["1,6,64", *["1,2,6,8"] * 4]


@pytest.mark.slow
def test_an_encoder_decoder_cache_crosses_the_export(tmp_path: Path) -> None:
    """A transformers T5 from a config, with its default ``use_cache``: the forward
    returns an ``EncoderDecoderCache`` (self- and cross-attention caches), which
    ``torch.export`` refuses without dfit's registration. It exports, compiles, and
    IREE's logits equal eager's; the results are the logits, the self-attention keys and
    values, the cross-attention keys and values and the encoder's output."""
    import numpy as np
    import torch
    from iree import runtime
    from transformers import T5Config, T5ForConditionalGeneration

    from dfit_mlir.frontends import torch as torch_frontend

    torch.manual_seed(0)
    config = T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_decoder_layers=1,
                      num_heads=4, decoder_start_token_id=0)
    model = T5ForConditionalGeneration(config).eval()
    args = (torch.randint(0, 64, (1, 8)), torch.ones(1, 8, dtype=torch.long), torch.randint(0, 64, (1, 4)))
    result = torch_frontend.compile(model, args, output=tmp_path / "t5.vmfb", mode="ids", quiet=True)
    with torch.no_grad():
        expected = model(*args)
    got = runtime.load_vm_flatbuffer_file(str(result.vmfb), driver="local-sync").main(*[a.numpy() for a in args])
    assert [tuple(np.asarray(g).shape) for g in got] == [(1, 4, 64), (1, 4, 4, 8), (1, 4, 4, 8),
                                                         (1, 4, 8, 8), (1, 4, 8, 8), (1, 8, 32)]
    assert np.allclose(np.asarray(got[0]), expected.logits.numpy(), atol=1e-5)
