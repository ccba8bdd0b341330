"""Greedy decoding with ``lax.while_loop``: a one-layer recurrent language model (token
embedding, a tanh cell, a tied output head) generates tokens until it emits the end
token or reaches the step limit; the number of steps depends on the inputs."""

import jax
import jax.numpy as jnp

VOCAB, HIDDEN, MAX_STEPS, END = 32, 16, 12, 0


def step(params, token, state):
    with jax.named_scope("embed"):
        x = params["embed"][token]
    with jax.named_scope("cell"):
        state = jnp.tanh(x @ params["w_in"] + state @ params["w_state"])
    with jax.named_scope("head"):
        logits = state @ params["embed"].T
    return jnp.argmax(logits).astype(jnp.int32), state


def decode(params, first_token):
    def running(carry):
        index, token, _, _ = carry
        return (index < MAX_STEPS) & ((index == 0) | (token != END))

    def body(carry):
        index, token, state, tokens = carry
        token, state = step(params, token, state)
        return index + 1, token, state, tokens.at[index].set(token)

    init = (jnp.int32(0), first_token, jnp.zeros(HIDDEN), jnp.full(MAX_STEPS, -1, jnp.int32))
    steps, _, _, tokens = jax.lax.while_loop(running, body, init)
    return steps, tokens


def make_step():
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
    params = {"embed": jax.random.normal(k1, (VOCAB, HIDDEN)),
              "w_in": jax.random.normal(k2, (HIDDEN, HIDDEN)) * 0.5,
              "w_state": jax.random.normal(k3, (HIDDEN, HIDDEN)) * 0.5}
    return decode, (params, jnp.int32(5))
