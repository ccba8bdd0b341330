"""Real models for the frontend tests and the attribution benchmark, built from registry
packages without any download: ``transformers`` architectures from a config with random
weights (PyTorch), a JAX training step (MLP + layer norm, softmax cross-entropy loss,
``jax.value_and_grad``, optax Adam under ``jax.named_scope("optimizer")``) and a Flax
model. Sizes are tiny so that export + compile stay within seconds.
"""

from __future__ import annotations

from typing import Any

BERT_LAYERS = 3
BERT_HIDDEN = 64
BERT_SEQ = 8


def bert() -> tuple[Any, tuple[Any, ...]]:
    """A BERT encoder (``transformers.BertModel``), 3 layers of hidden size 64, called
    with input ids only (an attention mask hits an iree-turbine literal IREE 3.13 does
    not legalize, see MODELS.md)."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=100, hidden_size=BERT_HIDDEN, num_hidden_layers=BERT_LAYERS,
                        num_attention_heads=2, intermediate_size=2 * BERT_HIDDEN, max_position_embeddings=32)
    return BertModel(config).eval(), (torch.randint(0, 100, (1, BERT_SEQ)),)


def convnext() -> tuple[Any, tuple[Any, ...]]:
    """A ConvNext CNN (``transformers.ConvNextModel``): patchify conv, two stages of
    depthwise conv + layer norm + pointwise MLP, a downsampling conv between them."""
    import torch
    from transformers import ConvNextConfig, ConvNextModel

    torch.manual_seed(0)
    config = ConvNextConfig(num_channels=3, num_stages=2, hidden_sizes=[8, 16], depths=[1, 1], patch_size=2)
    return ConvNextModel(config).eval(), (torch.randn(1, 3, 32, 32),)


# --- JAX ------------------------------------------------------------------------------


def _dense(params: dict, x: Any, name: str) -> Any:
    import jax

    with jax.named_scope(name):
        return x @ params["w"] + params["b"]


def jax_forward(params: dict, x: Any) -> Any:
    import jax
    import jax.numpy as jnp

    h = jnp.tanh(_dense(params["dense1"], x, "dense1"))
    with jax.named_scope("ln1"):
        h = (h - h.mean(-1, keepdims=True)) * jax.lax.rsqrt(h.var(-1, keepdims=True) + 1e-5)
    return _dense(params["dense2"], h, "dense2")


def jax_loss(params: dict, x: Any, y: Any) -> Any:
    import jax
    import jax.numpy as jnp

    logits = jax_forward(params, x)
    with jax.named_scope("loss"):
        return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * jax.nn.one_hot(y, logits.shape[-1]), -1))


def jax_train_step() -> tuple[Any, tuple[Any, ...]]:
    """``train_step(params, opt_state, x, y) -> (params, opt_state, loss)`` and example
    arguments: forward + loss, ``jax.value_and_grad``, an optax Adam update."""
    import jax
    import jax.numpy as jnp
    import optax

    optimizer = optax.adam(1e-3)

    def train_step(params: dict, opt_state: Any, x: Any, y: Any) -> tuple[Any, Any, Any]:
        loss, grads = jax.value_and_grad(jax_loss)(params, x, y)
        with jax.named_scope("optimizer"):
            updates, opt_state = optimizer.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
        return params, opt_state, loss

    key1, key2 = jax.random.split(jax.random.PRNGKey(0))
    params = {"dense1": {"w": jax.random.normal(key1, (8, 16)) * 0.1, "b": jnp.zeros(16)},
              "dense2": {"w": jax.random.normal(key2, (16, 4)) * 0.1, "b": jnp.zeros(4)}}
    x = jnp.ones((2, 8))
    y = jnp.array([1, 3], dtype=jnp.int32)
    return train_step, (params, optimizer.init(params), x, y)


def flax_mlp() -> tuple[Any, tuple[Any, ...]]:
    """A Flax linen model (two blocks of Dense + LayerNorm + relu, a Dense head):
    ``model.apply`` and its arguments."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x: Any) -> Any:
            x = nn.Dense(16, name="fc1")(x)
            x = nn.LayerNorm(name="norm")(x)
            return nn.relu(x)

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x: Any) -> Any:
            x = Block(name="block1")(x)
            x = Block(name="block2")(x)
            return nn.Dense(4, name="head")(x)

    model = MLP()
    x = jnp.ones((2, 8))
    return model.apply, (model.init(jax.random.PRNGKey(0), x), x)


def jax_scan_transformer_step() -> tuple[Any, tuple[Any, ...]]:
    """A training step of a 3-layer transformer whose layers run under ``lax.scan``
    (remat'd, weights stacked on the scan axis): ``attn`` and ``mlp`` named scopes in
    the body, ``layers``/``head``/``loss``/``optimizer`` outside, ``jax.value_and_grad``
    and an optax SGD update."""
    import jax
    import jax.numpy as jnp
    import optax

    width, tokens, depth, classes = 16, 8, 3, 4

    def layer(x: Any, p: dict) -> tuple[Any, None]:
        with jax.named_scope("attn"):
            q, k, v = x @ p["wq"], x @ p["wk"], x @ p["wv"]
            scores = jax.nn.softmax(q @ k.T / jnp.sqrt(width), -1)
            x = x + (scores @ v) @ p["wo"]
        with jax.named_scope("mlp"):
            x = x + jax.nn.gelu(x @ p["w1"]) @ p["w2"]
        return x, None

    def loss_fn(params: dict, x: Any, y: Any) -> Any:
        with jax.named_scope("layers"):
            x, _ = jax.lax.scan(jax.checkpoint(layer), x, params["layers"])
        with jax.named_scope("head"):
            logits = x @ params["head"]
        with jax.named_scope("loss"):
            return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * jax.nn.one_hot(y, classes), -1))

    optimizer = optax.sgd(1e-2)

    def train_step(params: dict, opt_state: Any, x: Any, y: Any) -> tuple[Any, Any, Any]:
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        with jax.named_scope("optimizer"):
            updates, opt_state = optimizer.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
        return params, opt_state, loss

    keys = jax.random.split(jax.random.PRNGKey(0), 7)
    shapes = {"wq": (width, width), "wk": (width, width), "wv": (width, width), "wo": (width, width),
              "w1": (width, 4 * width), "w2": (4 * width, width)}
    params = {"layers": {name: jax.random.normal(key, (depth, *shape)) * 0.1
                         for key, (name, shape) in zip(keys, shapes.items(), strict=False)},
              "head": jax.random.normal(keys[6], (width, classes)) * 0.1}
    x = jnp.ones((tokens, width))
    y = jnp.arange(tokens, dtype=jnp.int32) % classes
    return train_step, (params, optimizer.init(params), x, y)


def jax_scan_layernorm_sgd_step() -> tuple[Any, tuple[Any, ...]]:
    """A training step whose 3 layers (``dense`` + a jitted ``layernorm`` helper + a
    residual) run under ``lax.scan``: ``jax.value_and_grad`` of a squared error and a
    manual SGD update under ``jax.named_scope("optimizer")``. JAX lowers the scan's
    slicing of the stacked weights to private helpers it calls from both the forward
    and the backward loop; the layernorm to one function per pass."""
    import jax
    import jax.numpy as jnp

    @jax.jit
    def layernorm(x: Any, scale: Any) -> Any:
        centered = x - jnp.mean(x, -1, keepdims=True)
        return scale * centered * jax.lax.rsqrt(jnp.mean(centered * centered, -1, keepdims=True) + 1e-5)

    def layer(x: Any, p: dict) -> tuple[Any, None]:
        with jax.named_scope("dense"):
            h = jnp.tanh(x @ p["w"])
        with jax.named_scope("ln"):
            return x + layernorm(h, p["scale"]), None

    def loss_fn(params: dict, x: Any, y: Any) -> Any:
        with jax.named_scope("layers"):
            x, _ = jax.lax.scan(layer, x, params["layers"])
        with jax.named_scope("head"):
            out = x @ params["head"]
        with jax.named_scope("loss"):
            return jnp.mean((out - y) ** 2)

    def train_step(params: dict, x: Any, y: Any) -> tuple[Any, Any]:
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        with jax.named_scope("optimizer"):
            params = jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads)
        return params, loss

    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    params = {"layers": {"w": jax.random.normal(k1, (3, 16, 16)) * 0.3, "scale": jnp.ones((3, 16))},
              "head": jax.random.normal(k2, (16, 4)) * 0.3}
    return train_step, (params, jnp.ones((4, 16)), jnp.zeros((4, 4)))


GPT2_SEQ = 8


def gpt2(layers: int) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """A ``transformers`` GPT-2 (``layers`` blocks of width 64, 2 heads, random weights):
    the model, its token ids and ``{"attention_mask": …}``, a 4-D float causal mask built
    by hand (MODELS.md: the boolean mask transformers builds hits an i1 literal IREE 3.13
    does not legalize)."""
    import torch
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=100, n_positions=32, n_embd=64, n_layer=layers, n_head=2, use_cache=False,
                        bos_token_id=0, eos_token_id=0)
    ids = torch.randint(0, 100, (1, GPT2_SEQ))
    mask = torch.zeros(1, 1, GPT2_SEQ, GPT2_SEQ)
    mask.masked_fill_(torch.triu(torch.ones(GPT2_SEQ, GPT2_SEQ, dtype=torch.bool), 1), -1e9)
    return GPT2Model(config).eval(), (ids,), {"attention_mask": mask}


def gpt2_inputs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, str]:
    """``--input`` values of :func:`gpt2`'s arguments for ``run_bundle``."""
    (ids,), mask = args, kwargs["attention_mask"]
    return (f"1x{GPT2_SEQ}xi64=" + ",".join(str(int(v)) for v in ids.flatten()),
            f"1x1x{GPT2_SEQ}x{GPT2_SEQ}xf32=" + ",".join(repr(float(v)) for v in mask.flatten()))


def flax_scan_loss() -> tuple[Any, tuple[Any, ...]]:
    """A Flax model whose two blocks (``attn`` and ``mlp`` Dense layers) run under
    ``nn.scan(nn.remat(Block))`` named ``layers``: ``jax.value_and_grad`` of its loss
    and the parameters."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x: Any, _: Any) -> tuple[Any, None]:
            h = nn.Dense(8, name="attn")(x)
            return x + nn.Dense(8, name="mlp")(nn.gelu(h)), None

    class Model(nn.Module):
        @nn.compact
        def __call__(self, x: Any) -> Any:
            layers = nn.scan(nn.remat(Block), variable_axes={"params": 0}, split_rngs={"params": True}, length=2)
            x, _ = layers(name="layers")(x, None)
            return nn.Dense(2, name="head")(x)

    model = Model()
    x = jnp.ones((2, 8))

    def loss(params: Any) -> Any:
        return (model.apply(params, x) ** 2).sum()

    return jax.value_and_grad(loss), (model.init(jax.random.PRNGKey(0), x),)
