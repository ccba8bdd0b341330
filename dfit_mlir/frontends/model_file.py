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

**The model's code cannot end dfit or move its outputs** (:func:`_model_code`): from the
file's import to the end of the export, ``sys.exit``/``os._exit`` raise (exit 3 naming the
model's file and line), the working folder and ``sys.stdout``/``sys.stderr`` are put back
as they were, and the ``atexit`` handlers the model's own files register are not left for
the interpreter's exit (where they could change dfit's exit status after the fact): they
run, under the same guard, when the export ends.
"""

from __future__ import annotations

import ast
import atexit
import contextlib
import io
import os
import sys
from collections.abc import Callable, Iterator
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
    streams = sys.stdout, sys.stderr
    with _model_code(path):
        model, args = torch_frontend.load_module_file(path, name)
        restore_streams(streams)  # the export may print
        if _is_torch_module(model):
            with _exits_caught(path, "exporting the model"):
                return ExportedFile("torch", torch_frontend.export_mlir(model, args), torch_frontend.DEFAULT_FLAGS)
        if not callable(model):
            raise InvalidInputError(f"{path}: {name}() must return (nn.Module or function, example args), "
                                    f"got ({type(model).__name__}, ...)")
        with _exits_caught(path, "lowering the function"):
            return ExportedFile("jax", jax_frontend.lower_text(model, *args), jax_frontend.DEFAULT_FLAGS)


@contextlib.contextmanager
def _exits_caught(path: Path, what: str) -> Iterator[None]:
    """``sys.exit``/``os._exit`` from the model's code while dfit does ``what`` → exit 3
    naming the model's file and line."""
    from dfit_mlir.frontends.torch import ModelCodeError, ModelExit, _exits_raise

    try:
        with _exits_raise(path):
            yield
    except ModelExit as error:
        raise ModelCodeError(f"{error.where}: {what} called {error.call}: the model's code must return, "
                             "not end the process") from None


def _is_models_file(filename: str, path: Path) -> bool:
    """Whether ``filename`` (a frame's) is the model file or a file beside it (its own
    helpers), not an installed library's."""
    try:
        where = Path(filename).resolve()
    except (OSError, ValueError):
        return False
    installed = {Path(prefix).resolve() for prefix in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    if any(where.is_relative_to(prefix) for prefix in installed):
        return False
    return where == path.resolve() or where.is_relative_to(path.resolve().parent)


@contextlib.contextmanager
def _model_code(path: Path) -> Iterator[None]:
    """While the model's code runs (see the module docstring): the working folder and the
    standard streams are restored afterwards, and ``atexit`` handlers registered from the
    model's files are collected, then run (last first) when the block ends without error."""
    import traceback

    from dfit_mlir.frontends.torch import ModelCodeError

    cwd = os.getcwd()
    streams = sys.stdout, sys.stderr
    open_before = {fd for fd in (1, 2) if _is_open(fd)}
    handlers: list[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], str]] = []
    real_register, real_unregister = atexit.register, atexit.unregister

    def register(func: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Callable[..., Any]:
        caller = traceback.extract_stack(limit=2)[0]
        if not _is_models_file(caller.filename, path):
            return real_register(func, *args, **kwargs)
        handlers.append((func, args, kwargs, f"{caller.filename}:{caller.lineno}"))
        return func

    def unregister(func: Callable[..., Any], /) -> None:
        handlers[:] = [handler for handler in handlers if handler[0] is not func]
        real_unregister(func)

    atexit.register, atexit.unregister = register, unregister  # type: ignore[assignment]
    try:
        yield
        atexit.register, atexit.unregister = real_register, real_unregister
        while handlers:
            func, args, kwargs, where = handlers.pop()
            try:
                with _exits_caught(path, f"the atexit handler registered at {where}"):
                    func(*args, **kwargs)
            except ModelCodeError:
                raise
            except Exception as error:
                raise ModelCodeError(f"{where}: the atexit handler registered here raised "
                                     f"{type(error).__name__}: {str(error)[:200]}") from None
        if open_before - {fd for fd in (1, 2) if _is_open(fd)}:
            raise ModelCodeError(f"{path}: the model's code closed dfit's standard output or error "
                                 "(file descriptor 1 or 2)")
    finally:
        atexit.register, atexit.unregister = real_register, real_unregister
        with contextlib.suppress(OSError):
            os.chdir(cwd)
        restore_streams(streams)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def restore_streams(streams: tuple[Any, Any]) -> None:
    """``sys.stdout`` and ``sys.stderr`` as they were before the model's code ran (reopened
    on their descriptors if the model closed them)."""
    sys.stdout, sys.stderr = (_usable(stream, fd) for stream, fd in zip(streams, (1, 2), strict=True))


def _usable(stream: Any, fd: int) -> Any:
    """``stream`` if still open, else a new text stream on a copy of ``fd`` (a model that
    closed ``sys.stdout`` must not make dfit fail after writing its outputs)."""
    if not getattr(stream, "closed", True):
        return stream
    try:
        return io.TextIOWrapper(open(os.dup(fd), "wb", buffering=0), write_through=True,  # noqa: SIM115
                                errors="backslashreplace")
    except OSError:  # the descriptor itself is closed: dfit's own messages fail where they are written
        return stream
