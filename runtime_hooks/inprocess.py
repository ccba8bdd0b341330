"""Loading a compiled module in this process with ``iree.runtime``, with dfit's hook
module and tensor debug sink when asked for.

Teardown order matters on ``local-task``: results, the function, the context, the module
and the config are released in that order (RUNTIME-NOTES.md: the other order segfaults
at interpreter exit).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


class Runner:
    """``with Runner(vmfb, "local-task") as runner: runner.function("main")(x)``;
    :class:`~dfit_mlir.runtime_hooks.instrument.InstrumentedModule` times the calls.

    ``hooks``: a ``PyModuleInterface`` (the ``dfit`` probe module) placed before the
    user's module so its optional imports resolve; ``debug_sink``: a
    ``HalModuleDebugSink`` receiving ``flow.tensor.trace`` tensors. Without them the
    module's optional imports fall back, and IREE prints traced tensors to stderr, so
    a traced module always gets a sink (see ``runtime_hooks/tensors.py``)."""

    def __init__(self, vmfb: Path, driver: str, *, hooks: Any = None, debug_sink: Any = None):
        import iree.runtime as rt

        self._config = rt.Config(driver)
        instance = self._config.vm_instance
        self._hal = rt.create_hal_module(instance, self._config.device, debug_sink=debug_sink) \
            if debug_sink is not None else rt.create_hal_module(instance, self._config.device)
        self._hooks = hooks.create() if hooks is not None else None
        self._module = rt.VmModule.mmap(instance, str(vmfb))
        modules = [self._hal, *([self._hooks] if self._hooks is not None else []), self._module]
        self._context = rt.VmContext(instance, modules)
        self._functions: dict[str, Any] = {}

    def lookup(self, name: str) -> Any:
        """The module's function ``name``, or ``None``."""
        return self._module.lookup_function(name)

    def function(self, name: str) -> Any:
        if name not in self._functions:
            import iree.runtime as rt

            handle = self.lookup(name)
            if handle is None:
                raise KeyError(name)
            self._functions[name] = rt.FunctionInvoker(self._context, self._config.device, handle)
        return self._functions[name]

    def close(self) -> None:
        # Release order that avoids the local-task crash at exit: invokers, context,
        # modules, then the device's config.
        self._functions.clear()
        for name in ("_context", "_module", "_hooks", "_hal", "_config"):
            if hasattr(self, name):
                delattr(self, name)

    def __enter__(self) -> "Runner":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def materialize(result: Any) -> None:
    """Wait for the invocation's results the way a user would: read them to host."""
    for value in result if isinstance(result, (tuple, list)) else (result,):
        if hasattr(value, "to_host"):
            try:
                value.to_host()
            except ValueError as error:
                if "minImportedHostPointerAlignment" not in str(error):
                    raise
                staged_read(value)
        else:
            np.asarray(value)


def staged_read(value: Any) -> np.ndarray:
    """A device array read to host through a mapped staging buffer. IREE 3.13's
    ``DeviceArray.to_host`` imports a fresh ``np.empty`` where the allocator says host
    memory is importable, which the Vulkan driver then refuses when the array is not
    page-aligned (lavapipe); this is the binding's own path for allocators that cannot
    import."""
    import iree.runtime as rt

    view = value._buffer_view
    source = view.get_buffer()
    device = value._device
    staging = device.allocator.allocate_buffer(
        memory_type=int(rt.MemoryType.HOST_LOCAL | rt.MemoryType.DEVICE_VISIBLE),
        allowed_usage=int(rt.BufferUsage.TRANSFER_TARGET | rt.BufferUsage.MAPPING_SCOPED),
        allocation_size=source.byte_length())
    semaphore = device.create_semaphore(0)
    device.queue_copy(source, staging, wait_semaphores=rt.HalFence.create_at(semaphore, 0),
                      signal_semaphores=rt.HalFence.create_at(semaphore, 1))
    rt.HalFence.create_at(semaphore, 1).wait()
    return np.array(staging.map().asarray(view.shape, rt.HalElementType.map_to_dtype(view.element_type)))
