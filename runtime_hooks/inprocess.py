"""Running a compiled module in this process with ``iree.runtime``: the ``ids`` mode's
per-invocation timing, with no hook of any kind in the module.

Teardown order matters on ``local-task``: results, the function, the context, the module
and the config are released in that order (RUNTIME-NOTES.md: the other order segfaults
at interpreter exit).
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from dfit_mlir.errors import InvalidInputError

_INPUT_RE = re.compile(r"^(?P<shape>(?:\d+x)*)(?P<dtype>[a-z]+\d+)=(?P<value>.*)$")
_NUMPY_DTYPES = {"f16": "float16", "f32": "float32", "f64": "float64", "i8": "int8", "ui8": "uint8",
                 "i16": "int16", "i32": "int32", "i64": "int64", "i1": "bool"}


def load_input(text: str) -> np.ndarray:
    """An input in ``iree-run-module`` form: ``@x.npy`` or ``2x3xf32=0.5`` (a splat)."""
    if text.startswith("@"):
        path = Path(text[1:])
        try:
            return np.load(path)
        except (OSError, ValueError) as error:
            raise InvalidInputError(f"{path}: not a readable .npy file ({error})") from None
    match = _INPUT_RE.match(text)
    if match is None or match["dtype"] not in _NUMPY_DTYPES:
        raise InvalidInputError(f"input {text!r} is neither @file.npy nor SHAPExDTYPE=VALUE")
    shape = [int(dim) for dim in match["shape"].split("x") if dim]
    try:
        value = float(match["value"])
    except ValueError:
        raise InvalidInputError(f"input {text!r}: only splat values are supported here") from None
    return np.full(shape, value, dtype=_NUMPY_DTYPES[match["dtype"]])


class Runner:
    """``with Runner(vmfb, "local-task") as runner: runner.time(fn, inputs, n)``."""

    def __init__(self, vmfb: Path, driver: str):
        import iree.runtime as rt

        self._config = rt.Config(driver)
        self._context = rt.SystemContext(config=self._config)
        self._module = rt.VmModule.mmap(self._config.vm_instance, str(vmfb))
        self._context.add_vm_module(self._module)
        self._functions: dict[str, Any] = {}

    def function(self, name: str) -> Any:
        if name not in self._functions:
            module = self._context.modules[self._module.name]
            self._functions[name] = module[name]
        return self._functions[name]

    def time(self, function: str, inputs: Sequence[np.ndarray], invocations: int, warmup: int = 0) -> list[tuple[int, int]]:
        """(start ns, duration ns) of each recorded invocation, outputs read back to host."""
        call = self.function(function)
        spans = []
        for index in range(warmup + invocations):
            start = time.perf_counter_ns()
            result = call(*inputs)
            _materialize(result)
            if index >= warmup:
                spans.append((start, time.perf_counter_ns() - start))
            del result
        return spans

    def close(self) -> None:
        self._functions.clear()
        for name in ("_context", "_module", "_config"):
            if hasattr(self, name):
                delattr(self, name)

    def __enter__(self) -> "Runner":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _materialize(result: Any) -> None:
    """Wait for the invocation's results the way a user would: read them to host."""
    for value in result if isinstance(result, (tuple, list)) else (result,):
        if hasattr(value, "to_host"):
            value.to_host()
        else:
            np.asarray(value)
