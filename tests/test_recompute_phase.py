"""Recomputation as its own phase (issue 28): a JAX training step whose blocks are
wrapped in ``jax.checkpoint``, compiled through dfit's JAX frontend. The forward ops the
backward pass runs again (``…/checkpoint/rematted_computation/…``) are ``recompute``;
the gradient matmuls are ``backward``; the first forward pass is ``forward``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("jax", reason="JAX is not installed (pip install -e .[frontends])")


def _step() -> tuple[Any, tuple[Any, ...]]:
    import jax
    import jax.numpy as jnp

    def block(w: Any, x: Any) -> Any:
        return jnp.tanh(x @ w)

    def loss(ws: list[Any], x: Any) -> Any:
        for index, w in enumerate(ws):
            with jax.named_scope(f"layer{index}"):
                x = jax.checkpoint(block)(w, x)
        return jnp.sum(x * x)

    def step(ws: list[Any], x: Any) -> list[Any]:
        grads = jax.grad(loss)(ws, x)
        return [w - 0.1 * g for w, g in zip(ws, grads, strict=True)]

    return step, ([jnp.full((16, 16), 0.01), jnp.full((16, 16), 0.02)], jnp.ones((4, 16)))


def test_checkpointed_forward_ops_are_recompute(tmp_path: Path) -> None:
    from dfit_mlir.core import manifest as manifest_io
    from dfit_mlir.frontends import jax as jax_frontend

    step, args = _step()
    result = jax_frontend.compile(step, *args, output=tmp_path / "step.vmfb", mode="ids", quiet=True)
    operators = manifest_io.load(result.manifest_path)["operators"]
    stack = {op["id"]: next((n for n in op.get("name_path") or () if n.startswith("jit(")), "") for op in operators}
    rematted = [op for op in operators if "/rematted_computation/" in stack[op["id"]]]
    assert rematted and {op["phase"] for op in rematted} == {"recompute"}
    by_phase: dict[str, set[str]] = {}
    for op in operators:
        if op["op"] == "stablehlo.dot_general":
            by_phase.setdefault(op["phase"], set()).add(op["module_path"])
    # Each layer's matmul: once forward, once recomputed, and its gradient matmuls backward.
    assert by_phase["forward"] == by_phase["recompute"] == by_phase["backward"] == {"layer0", "layer1"}
    recomputed = [op for op in rematted if op["op"] == "stablehlo.dot_general"]
    assert len(recomputed) == 2
    assert all(op["phase"] != "recompute" for op in operators if "rematted_computation" not in stack[op["id"]]
               and op["op"] == "stablehlo.dot_general")
