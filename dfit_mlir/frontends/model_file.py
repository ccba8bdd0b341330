"""``dfit compile model.py``: a Python file that builds a model, PyTorch or JAX.

How the CLI tells the two apart, in this order:

1. **The factory's name.** Without ``--model-factory`` the file must define
   ``make_model()`` (PyTorch: returns ``(nn.Module, example args)``) or ``make_step()``
   (JAX: returns ``(function, example args)``: plain JAX, Flax ``model.apply``, an optax
   training step, a Keras-on-JAX ``stateless_call``). The names are read off the file's
   top-level ``def``s before it runs; a file with both uses ``make_model``.
2. **What the factory returns.** With ``--model-factory NAME`` (or when the name says
   nothing), an ``nn.Module`` is exported with iree-turbine
   (:func:`dfit_mlir.frontends.torch.export_mlir`); any other callable is lowered with
   ``jax.jit(fn).lower(*args)`` (:func:`dfit_mlir.frontends.jax.lower_text`).

Imports are not used to decide: a JAX file may import torch for data and the other way
round. Either way the result is MLIR text with locations that name modules, compiled
like any other source.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Factory names the CLI looks for, in order, and the frontend each one implies.
FACTORIES = (("make_model", "torch"), ("make_step", "jax"))


@dataclass(frozen=True, slots=True)
class ExportedFile:
    """What a model file became: the frontend that exported it, the MLIR text, and the
    iree-compile flags that frontend's text needs by default (this machine's CPU)."""

    frontend: str
    text: str
    default_flags: tuple[str, ...]


def default_factory(path: Path) -> str:
    """``make_model`` or ``make_step``, whichever the file defines (or assigns) at top
    level (see the module docstring); ``make_model`` when it has neither."""
    from dfit_mlir.core.errors import InvalidInputError

    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except FileNotFoundError:
        raise InvalidInputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InvalidInputError(f"{path}: is a directory, not a Python model file") from None
    except SyntaxError as error:
        raise InvalidInputError(f"{path}:{error.lineno}: {error.msg}") from None
    except ValueError as error:  # NUL bytes and the like
        raise InvalidInputError(f"{path}: not a Python file ({error})") from None
    defined = {node.name for node in tree.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}
    defined |= {target.id for node in tree.body if isinstance(node, ast.Assign)
                for target in node.targets if isinstance(target, ast.Name)}  # make_step = build
    for name, _ in FACTORIES:
        if name in defined:
            return name
    # Neither at top level: the file runs (its own errors come first, exit 3) and the
    # loader names the missing make_model().
    return FACTORIES[0][0]


def _is_torch_module(value: Any) -> bool:
    torch = sys.modules.get("torch")  # a JAX file that never imported torch costs no import
    return torch is not None and isinstance(value, torch.nn.Module)


def export_model_file(path: str | Path, factory: str | None = None) -> ExportedFile:
    """Run the file's factory and export what it returns (see the module docstring)."""
    from dfit_mlir.core.errors import InvalidInputError
    from dfit_mlir.frontends import jax as jax_frontend
    from dfit_mlir.frontends import torch as torch_frontend

    path = Path(path)
    name = factory or default_factory(path)
    model, args = torch_frontend.load_module_file(path, name)
    if _is_torch_module(model):
        return ExportedFile("torch", torch_frontend.export_mlir(model, args), torch_frontend.DEFAULT_FLAGS)
    if not callable(model):
        raise InvalidInputError(f"{path}: {name}() must return (nn.Module or function, example args), "
                                f"got ({type(model).__name__}, ...)")
    return ExportedFile("jax", jax_frontend.lower_text(model, *args), jax_frontend.DEFAULT_FLAGS)
