"""Default integer inputs that index a table (:func:`dfit_mlir.runtime_hooks.inputs.index_uses`)
on JAX programs written here, one per way JAX reaches a table with an index: a scalar
``table[token]`` (``select`` then ``dynamic_slice``), ``lax.dynamic_slice`` and
``dynamic_index_in_dim`` (a private helper), an array ``table[ids]`` (``select`` then
``gather``), ``jnp.take`` with ``mode="clip"`` (``clamp``) and ``mode="wrap"``
(``remainder``), and a token carried through a ``lax.while_loop`` / ``fori_loop`` into
the lookup, as the zoo's greedy decoder does. The programs are lowered by JAX and tagged
by dfit (the manifest's operator and tensor tables), not compiled."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dfit_mlir.core.errors import InvalidInputError
from dfit_mlir.runtime_hooks import inputs

pytestmark = pytest.mark.frontends

VOCAB, WIDTH = 32, 16
ZOO = Path(__file__).resolve().parent.parent / "examples" / "zoo"


def _manifest(fn: Any, *args: Any, tmp_path: Path) -> dict[str, Any]:
    """The operator and tensor tables dfit writes for ``jax.jit(fn)`` at ``args``."""
    from dfit_mlir.frontends import jax as jax_frontend
    from dfit_mlir.passes import mlir_engine, operators, phases, snapshot

    source = tmp_path / "program.mlir"
    source.write_text(jax_frontend.lower_text(fn, *args))
    module = phases.open_driver((), None).parse(source)
    ops, tensors = operators.operator_table(mlir_engine.tag_module(module), snapshot.LocationCache())
    return {"operators": ops, "tensors": tensors}


def _table() -> Any:
    import jax.numpy as jnp

    return jnp.arange(VOCAB * WIDTH, dtype=jnp.float32).reshape(VOCAB, WIDTH)


def _programs() -> dict[str, tuple[Any, tuple[Any, ...], int, str]]:
    """name -> (function, example args, the index argument's bound, what the reason names)."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    token, ids = jnp.int32(3), jnp.arange(8, dtype=jnp.int32)

    def fori_decode(table: Any, first: Any) -> Any:
        def body(_: Any, carry: tuple[Any, Any]) -> tuple[Any, Any]:
            token, total = carry
            row = table[token]
            return jnp.argmax(row).astype(jnp.int32) % VOCAB, total + row
        return lax.fori_loop(0, 4, body, (first, jnp.zeros(WIDTH)))[1]

    return {
        "scalar lookup": (lambda table, t: table[t] * 2.0, (_table(), token), VOCAB, "window"),
        "dynamic_slice": (lambda table, t: lax.dynamic_slice(table, (t, 0), (2, WIDTH)), (_table(), token),
                          VOCAB - 1, "window"),
        "dynamic_index_in_dim": (lambda table, t: lax.dynamic_index_in_dim(table, t, 0, keepdims=False),
                                 (_table(), token), VOCAB, "window"),
        # A gather's bound is its table's smallest dimension (the operator table does not
        # say which one it indexes).
        "array lookup (select)": (lambda table, i: table[i], (_table(), ids), WIDTH, "through a select"),
        "take clip (clamp)": (lambda table, i: jnp.take(table, i, axis=0, mode="clip"), (_table(), ids), WIDTH,
                              "indexes"),
        "take wrap (remainder)": (lambda table, i: jnp.take(table, i, axis=0, mode="wrap"), (_table(), ids),
                                  WIDTH, "indexes"),
        "fori_loop carry": (fori_decode, (_table(), token), VOCAB, "window"),
        "jit helper": (jax.jit(lambda table, t: table[t]), (_table(), token), VOCAB, "window"),
    }


@pytest.mark.parametrize("name", list(_programs()))
def test_an_index_reaching_a_table_gets_valid_varied_defaults(name: str, tmp_path: Path) -> None:
    fn, args, bound, reason = _programs()[name]
    manifest = _manifest(fn, *args, tmp_path=tmp_path)
    bounds = inputs.integer_bounds(manifest, "main")
    assert set(bounds) == {1}, bounds  # the index argument, not the table
    assert bounds[1][0] == bound and reason in bounds[1][1], bounds
    arguments = inputs.signature(manifest, "main")
    made, plans = inputs.default_inputs(arguments, tmp_path, manifest=manifest, function="main", seed=1)
    assert plans[1].made == "integers-below" and plans[1].bound == bound
    values = np.load(made[1][1:])
    assert values.shape == np.shape(args[1]) and values.min() >= 0 and values.max() < bound
    if values.size > 1:  # varied, not a constant row
        assert len(set(values.tolist())) > 1 and values.max() > 0


def test_the_greedy_decoder_start_token_indexes_the_embedding(tmp_path: Path) -> None:
    """The zoo's decoder carries its start token through ``lax.while_loop`` into
    ``params["embed"][token]`` (``select`` then ``dynamic_slice``): the default start
    token is drawn below the vocabulary, and a given one past it is refused with the
    table's size."""
    sys.path.insert(0, str(ZOO))
    try:
        import jax_greedy_decode as decoder
    finally:
        sys.path.remove(str(ZOO))
    fn, args = decoder.make_step()
    manifest = _manifest(fn, *args, tmp_path=tmp_path)
    loop = next(op for op in manifest["operators"] if op["op"] == "stablehlo.while")
    start = next(state for state in loop["carried"] if state["operand"] == "main/arg3")
    assert start["consumers"]  # the loop state the start token becomes is used inside
    (bound, reason), = inputs.integer_bounds(manifest, "main").values()
    assert bound == decoder.VOCAB and "dynamic_slice" in reason and "32x16 table" in reason
    arguments = inputs.signature(manifest, "main")
    made, plans = inputs.default_inputs(arguments, tmp_path, manifest=manifest, function="main")
    start_token = int(np.load(made[3][1:]))
    assert plans[3].made == "integers-below" and 0 < start_token < decoder.VOCAB
    inputs.check_indices(made, manifest, "main")  # the defaults pass the check
    with pytest.raises(InvalidInputError, match=r"input 3 holds the index 40, .* \(valid indices 0\.\.31\)"):
        inputs.check_indices([*made[:3], "i32=40"], manifest, "main")
