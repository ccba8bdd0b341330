"""transformers KV caches as tensors at the export's boundary.

A decoder step with a cache (``model(ids, cache=DynamicCache)`` returning logits and
the grown cache) takes and returns a ``transformers.DynamicCache``, which ``torch.export``
cannot pass through unless the class is a pytree node. transformers 5.x offers that
registration (``transformers.integrations.executorch.register_dynamic_cache_export_support``):
a cache flattens to ``{"key_cache": [k0, k1, …], "value_cache": [v0, v1, …]}``, one
tensor per layer. Its unflatten rebuilds the cache with ``DynamicLayer.update``, whose
lazy initialisation makes an empty ``torch.tensor([])`` per key and value;
``ExportedProgram.run_decompositions`` (which dfit needs: IREE lowers none of the
training-IR ops) re-traces that unflatten and lifts those empty tensors as constants
it then does not find (``SpecViolationError: Constant tensor lifted_tensor_4 is not in
the constants dictionary``), for every model with a cache among its inputs.

:func:`register_cache_pytrees` registers the same flat layout (same pytree context: a
program exported with transformers' registration reads the same), with an unflatten
that sets each layer's key and value tensors directly: no empty tensor, no ``cat`` with
one, nothing for the re-trace to lift. In the compiled function a cache is then
``2 × layers`` tensor arguments (keys of every layer, then values) and the grown cache
``2 × layers`` results, in that order, after the logits.

An encoder-decoder's ``EncoderDecoderCache`` (tested on T5) is a node of two such
caches, self-attention then cross-attention: a T5 forward with ``use_cache`` on returns
one, and without the registration ``torch.export`` refuses the output.
"""

from __future__ import annotations

import sys
from typing import Any


def register_cache_pytrees() -> bool:
    """Make ``transformers.DynamicCache`` a pytree node with dfit's unflatten (replacing
    transformers' own registration, whose layout it keeps). Only when transformers is
    already imported (a model that holds no transformers object needs nothing); whether
    the class is registered now."""
    cache_utils = sys.modules.get("transformers.cache_utils")
    if cache_utils is None:
        return False
    from torch.utils import _pytree as pytree

    _register(pytree, cache_utils.DynamicCache, _flatten, _unflatten, _flatten_with_keys)
    _register(pytree, cache_utils.EncoderDecoderCache, _flatten_pair, _unflatten_pair, _flatten_pair_with_keys)
    return True


def _register(pytree: Any, cache_class: type, flatten: Any, unflatten: Any, flatten_with_keys: Any) -> None:
    registered = pytree.SUPPORTED_NODES.get(cache_class)
    if registered is not None and registered.unflatten_fn is unflatten:
        return
    if registered is not None:
        pytree._deregister_pytree_node(cache_class)
    # The Python pytree only (what torch.export flattens with): the C++ one (optree) keeps
    # whatever transformers registered there and cannot drop a registration.
    pytree._private_register_pytree_node(
        cache_class, flatten, unflatten,
        serialized_type_name=f"{cache_class.__module__}.{cache_class.__name__}",
        flatten_with_keys_fn=flatten_with_keys)


_PAIR = ("self_attention_cache", "cross_attention_cache")


def _flatten_pair(cache: Any) -> tuple[list[Any], Any]:
    return [getattr(cache, name) for name in _PAIR], None


def _flatten_pair_with_keys(cache: Any) -> tuple[list[Any], Any]:
    from torch.utils import _pytree as pytree

    return [(pytree.GetAttrKey(name), getattr(cache, name)) for name in _PAIR], None


def _unflatten_pair(children: Any, context: Any) -> Any:
    from transformers.cache_utils import EncoderDecoderCache

    return EncoderDecoderCache(*children)


def _cache_dict(cache: Any) -> dict[str, list[Any]]:
    """Keys and values of every initialised layer (transformers' layout)."""
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    odd = [type(layer).__name__ for layer in cache.layers
           if not isinstance(layer, (DynamicLayer, DynamicSlidingWindowLayer))]
    if odd:
        raise TypeError(f"dfit passes a DynamicCache of DynamicLayer/DynamicSlidingWindowLayer layers through "
                        f"the export, not {odd[0]}")
    return {"key_cache": [layer.keys for layer in cache.layers if layer.keys is not None],
            "value_cache": [layer.values for layer in cache.layers if layer.values is not None]}


def _layout(cache: Any) -> list[int | None]:
    """Each layer's sliding window (``None``: a full layer), as in transformers' context."""
    return [getattr(layer, "sliding_window", None) for layer in cache.layers]


def _flatten(cache: Any) -> tuple[list[Any], Any]:
    from torch.utils import _pytree as pytree

    values, keys = pytree._dict_flatten(_cache_dict(cache))
    return values, [keys, _layout(cache)]


def _flatten_with_keys(cache: Any) -> tuple[list[Any], Any]:
    from torch.utils import _pytree as pytree

    values, keys = pytree._dict_flatten_with_keys(_cache_dict(cache))
    return values, [keys, _layout(cache)]


def _unflatten(values: Any, context: Any) -> Any:
    """The cache back from its tensors: full layers get their tensors set directly;
    sliding-window layers (whose window state the flat layout does not keep) are
    rebuilt through ``update`` as transformers does."""
    from itertools import zip_longest

    from torch.utils import _pytree as pytree
    from transformers.cache_utils import (
        Cache,
        DynamicCache,
        DynamicLayer,
        DynamicSlidingWindowLayer,
    )

    keys, layout = context
    tensors = pytree._dict_unflatten(values, keys)
    layers = []
    for key, value, window in zip_longest(tensors["key_cache"], tensors["value_cache"], layout):
        if window is not None:
            layer = DynamicSlidingWindowLayer(sliding_window=int(window))
            if key is not None:
                layer.update(key, value)
        else:
            layer = DynamicLayer()
            if key is not None:
                layer.keys, layer.values, layer.device, layer.is_initialized = key, value, key.device, True
        layers.append(layer)
    if not layers:
        return DynamicCache()
    # What ``DynamicCache(ddp_cache_data)`` ends with, minus the ``update`` of each layer.
    cache = DynamicCache.__new__(DynamicCache)
    Cache.__init__(cache, layers=layers)
    return cache
