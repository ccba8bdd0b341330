"""Phases told by data flow (:func:`dfit_mlir.frontends._updates_of_gradients`): a
training step's update that no scope names is ``optimizer``; a metric of the forward
outputs is not. Real JAX programs written here, lowered by JAX and tagged by dfit (no
IREE compile)."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest

from dfit_mlir.core import atomic
from dfit_mlir.core.lineage import is_constant
from tests.test_costs_independent import static_operators

pytestmark = pytest.mark.frontends


def plain_sgd_step(params: dict[str, Any], x: Any, y: Any) -> Any:
    import jax
    import jax.numpy as jnp

    def loss(p: dict[str, Any]) -> Any:
        logits = jnp.tanh(x @ p["w"] + p["b"])
        return jnp.mean((logits - y) ** 2), logits

    (value, logits), grads = jax.value_and_grad(loss, has_aux=True)(params)
    updated = jax.tree.map(lambda weight, grad: weight - 0.1 * grad, params, grads)  # UPDATE
    hits = jnp.sum(jnp.argmax(logits, -1) == jnp.argmax(y, -1))  # METRIC
    return value, updated, hits


def _line(marker: str) -> int:
    lines, first = inspect.getsourcelines(plain_sgd_step)
    return first + next(index for index, text in enumerate(lines) if text.rstrip().endswith(marker))


@pytest.fixture(scope="module")
def step_operators(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    import jax.numpy as jnp

    from dfit_mlir.frontends import jax as jax_frontend

    params = {"w": jnp.ones((8, 4)), "b": jnp.zeros((4,))}
    text = jax_frontend.lower_text(plain_sgd_step, params, jnp.ones((2, 8)), jnp.ones((2, 4)))
    source = tmp_path_factory.mktemp("sgd") / "step.mlir"
    atomic.write_text(source, text)
    return [op for op in static_operators(Path(source)) if not is_constant(op["op"])]


def _at(operators: list[dict[str, Any]], line: int) -> list[dict[str, Any]]:
    return [op for op in operators if (op.get("source") or {}).get("line") == line
            and not op["op"].endswith(".return")]


def test_an_update_no_scope_names_is_the_optimizer(step_operators: list[dict[str, Any]]) -> None:
    update = _at(step_operators, _line("# UPDATE"))
    kinds = {op["op"] for op in update}
    assert {"stablehlo.subtract", "stablehlo.multiply"} <= kinds, kinds
    assert {op["phase"] for op in update} == {"optimizer"}, [(op["op"], op["phase"]) for op in update]
    assert {"forward", "backward"} <= {op["phase"] for op in step_operators}


def test_a_metric_of_the_forward_outputs_is_not_the_optimizer(step_operators: list[dict[str, Any]]) -> None:
    metric = _at(step_operators, _line("# METRIC"))
    assert metric, "the metric's ops carry its line"
    assert "optimizer" not in {op["phase"] for op in metric}, [(op["op"], op["phase"]) for op in metric]
