"""A transformer encoder in plain JAX whose layers run under ``lax.scan`` (stacked layer
weights: one traced layer body, N iterations): token embedding, per layer pre-norm
attention and a GELU MLP, a final norm."""

import jax
import jax.numpy as jnp

VOCAB, SEQ, HIDDEN, HEADS, LAYERS = 64, 8, 32, 2, 3


def layer_norm(x):
    with jax.named_scope("norm"):
        mean = x.mean(-1, keepdims=True)
        return (x - mean) * jax.lax.rsqrt(x.var(-1, keepdims=True) + 1e-5)


def attention(layer, x):
    with jax.named_scope("attention"):
        q, k, v = (jnp.einsum("sd,dhk->hsk", x, layer[name]) for name in ("wq", "wk", "wv"))
        scores = jnp.einsum("hsk,htk->hst", q, k) / jnp.sqrt(q.shape[-1])
        mask = jnp.tril(jnp.ones((x.shape[0], x.shape[0]), bool))
        probs = jax.nn.softmax(jnp.where(mask, scores, -1e9), axis=-1)
        return jnp.einsum("hst,htk,hkd->sd", probs, v, layer["wo"])


def mlp(layer, x):
    with jax.named_scope("mlp"):
        return jax.nn.gelu(x @ layer["w1"]) @ layer["w2"]


def forward(params, ids):
    x = params["embed"][ids]

    def body(x, layer):
        with jax.named_scope("layer"):
            x = x + attention(layer, layer_norm(x))
            return x + mlp(layer, layer_norm(x)), None

    x, _ = jax.lax.scan(body, x, params["layers"])
    return layer_norm(x) @ params["embed"].T


def make_step():
    keys = iter(jax.random.split(jax.random.PRNGKey(0), 8))
    head = HIDDEN // HEADS

    def weights(*shape):
        return jax.random.normal(next(keys), (LAYERS, *shape)) * 0.1

    params = {"embed": jax.random.normal(next(keys), (VOCAB, HIDDEN)) * 0.1,
              "layers": {"wq": weights(HIDDEN, HEADS, head), "wk": weights(HIDDEN, HEADS, head),
                         "wv": weights(HIDDEN, HEADS, head), "wo": weights(HEADS, head, HIDDEN),
                         "w1": weights(HIDDEN, 2 * HIDDEN), "w2": weights(2 * HIDDEN, HIDDEN)}}
    return forward, (params, jnp.arange(SEQ, dtype=jnp.int32) % VOCAB)
