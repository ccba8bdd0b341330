"""Running a compiled module in this process with ``iree.runtime``: the ``ids`` mode's
per-invocation timing, with no hook of any kind in the module.

Teardown order matters on ``local-task``: results, the function, the context, the module
and the config are released in that order (RUNTIME-NOTES.md: the other order segfaults
at interpreter exit).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np


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
