"""The control driver: a session resolves the backend adapter, instantiates tools from
the registry by name, binds them, and calls their hooks in order.

The lifecycle is an explicit state machine; a step out of order is an error, so a tool
can rely on, e.g., ``ctx.model`` being set in ``on_run_begin``::

    created ─register─▶ ready ─compile─▶ compiled ─load─▶ loaded ─run─▶ ran ─close─▶ closed
                            └──── analyze (an existing bundle) / reconstruct ─▶ ran

``analyze`` replays a finished compile/run (or a reconstruction) through the same hooks:
the tools cannot tell it from a live session, which is the point.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from dfit_mlir.adapters.base import Adapter
from dfit_mlir.analysis.model import SemanticModel
from dfit_mlir.analysis.tools import registry as tool_registry
from dfit_mlir.analysis.tools.api import Tool, ToolContext, check_options
from dfit_mlir.core.errors import DfitError, InvalidInputError

#: state → the states it may move to.
TRANSITIONS = {
    "created": {"ready"},
    "ready": {"compiled", "ran", "closed"},
    "compiled": {"loaded", "ran", "closed"},
    "loaded": {"ran", "closed"},
    "ran": {"ran", "closed"},
    "closed": set(),
}


class SessionError(DfitError):
    """A lifecycle step out of order."""


class Session:
    """``Session(tools=["compile-metrics"], out_dir=...)`` then ``analyze(bundle)``, or
    live: ``compile(...)``, ``load(...)``, ``run(...)``; ``close()`` shuts tools down."""

    def __init__(self, tools: Iterable[str | Tool], out_dir: str | Path, *, backend: str | Adapter | None = None,
                 options: dict[str, dict[str, Any]] | None = None):
        self.out_dir = Path(out_dir)
        self.state = "created"
        self.adapter: Adapter | None = None
        if backend is not None:
            self._bind_backend(backend)
        self.tools = [tool_registry.create(t) if isinstance(t, str) else t for t in tools]
        self.shared: dict[str, Any] = {}
        self.options = options or {}
        running = [tool.name for tool in self.tools]
        strangers = [name for name in self.options if name not in running]
        if strangers:
            raise InvalidInputError(f"--option {strangers[0]}.{next(iter(self.options[strangers[0]]), 'KEY')}: "
                                    f"{strangers[0]!r} is not a tool of this run (running: {', '.join(running)})")
        self.contexts: dict[str, ToolContext] = {}
        self.timings: dict[str, float] = {}
        self._call_each("on_register", tool_registry)
        self._move("ready")

    @classmethod
    def for_inputs(cls, inputs: Sequence[str | Path], tools: Iterable[str | Tool], out_dir: str | Path,
                   **options: Any) -> Session:
        """Capability discovery at session start: MLIR / a vmfb binds the IREE adapter
        (compiler-visible path), a dump the reconstruction backend that recognises it."""
        from dfit_mlir.adapters import registry as backend_registry

        return cls(tools, out_dir, backend=backend_registry.discover([Path(p) for p in inputs]), **options)

    # --- lifecycle -------------------------------------------------------------------------

    def compile(self, source: Path, output: Path, **options: Any) -> Any:
        """Compile through the adapter, with ``on_compile_begin``/``on_compile_end``."""
        adapter = self._require_adapter()
        self._init_tools()
        self._call_each("on_compile_begin")
        result = adapter.compile(source, output, **options)
        self._set_model(SemanticModel(result.manifest, None, str(result.manifest_path)))
        self._call_each("on_compile_end")
        self._move("compiled")
        return result

    def load(self, artifact: Path, **options: Any) -> Any:
        loaded = self._require_adapter().load(artifact, **options)
        self._call_each("on_load")
        self._move("loaded")
        return loaded

    def run(self, artifact: Path, bundle: Path, **options: Any) -> SemanticModel:
        """Run through the adapter into ``bundle``, then stream its events to the tools."""
        self._require_adapter().run(artifact, bundle, **options)
        model = SemanticModel.open(bundle)
        if self.state == "ready":  # run without a compile in this session
            self._init_tools()
            self._set_model(model)
        self._replay_run(model)
        return model

    def reconstruct(self, paths: Sequence[str | Path], bundle: str | Path) -> SemanticModel:
        """Collect through a reconstruction adapter into ``bundle``, then replay it."""
        from dfit_mlir.adapters.reconstruct import reconstruct_bundle

        reconstruct_bundle([Path(p) for p in paths], Path(bundle), self._require_adapter())
        return self.analyze(bundle)

    def analyze(self, bundle: str | Path) -> SemanticModel:
        """Replay an existing bundle (or a bare manifest) through every hook."""
        model = SemanticModel.open(bundle)
        if self.adapter is None:
            self._bind_backend(model.backend, strict=False)
        self._init_tools(model)
        self._call_each("on_compile_begin")
        self._set_model(model)
        self._call_each("on_compile_end")
        self._call_each("on_load")
        self._replay_run(model)
        return model

    def close(self) -> dict[str, str]:
        """``on_shutdown`` for every tool; returns each tool's report."""
        if self.state == "closed":
            return {}
        self._call_each("on_shutdown")
        self._move("closed")
        return {tool.name: tool.report(self.contexts[tool.name]) for tool in self.tools if tool.name in self.contexts}

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- internals -------------------------------------------------------------------------

    def _bind_backend(self, backend: str | Adapter, strict: bool = True) -> None:
        from dfit_mlir.adapters import registry as backend_registry

        if isinstance(backend, Adapter):
            self.adapter = backend
            return
        try:
            self.adapter = backend_registry.get(backend)
        except DfitError:
            if strict:
                raise
            self.adapter = None  # a bundle from a backend this install does not know: tools still run

    def _require_adapter(self) -> Adapter:
        if self.adapter is None:
            raise SessionError("this session has no backend adapter (give backend=...)")
        return self.adapter

    def _init_tools(self, model: SemanticModel | None = None) -> None:
        if self.contexts:
            return
        if model is not None:
            backend, capabilities = model.backend, model.capabilities
        else:
            adapter = self._require_adapter()
            backend, capabilities = adapter.name, adapter.capabilities()
        for tool in self.tools:
            check_options(tool, self.options.get(tool.name) or {})
            self.contexts[tool.name] = ToolContext(tool, self.out_dir / tool.name, self.shared, backend, capabilities,
                                                   self.options.get(tool.name))
        self._call_each("on_init")

    def _set_model(self, model: SemanticModel) -> None:
        for ctx in self.contexts.values():
            ctx.model = model
            missing = [aspect for aspect in ctx.tool.needs if not model.exposes(aspect)]
            if ctx.tool.needs and len(missing) == len(ctx.tool.needs):
                ctx.note(f"the {model.backend} backend exposes none of {', '.join(ctx.tool.needs)}; "
                         "results are limited to what the manifest holds")

    def _replay_run(self, model: SemanticModel) -> None:
        self._call_each("on_run_begin")
        for batch in model.event_batches():
            self._call_each("on_event", batch)
        self._call_each("on_run_end")
        self._move("ran")

    def _call_each(self, hook: str, *args: Any) -> None:
        for tool in getattr(self, "tools", []):
            started = time.perf_counter()
            if hook == "on_register":
                tool.on_register(*args)
            else:
                getattr(tool, hook)(self.contexts[tool.name], *args)
            key = f"{tool.name}.{hook}"
            self.timings[key] = self.timings.get(key, 0.0) + time.perf_counter() - started

    def _move(self, state: str) -> None:
        if state not in TRANSITIONS[self.state]:
            raise SessionError(f"session cannot go from {self.state} to {state}")
        self.state = state


def analyze(bundle: str | Path, tools: Sequence[str | Tool], out_dir: str | Path,
            options: dict[str, dict[str, Any]] | None = None) -> tuple[SemanticModel, dict[str, str], Session]:
    """Run ``tools`` over one bundle; returns the model, the tools' reports, the session.
    Every tool's output goes into one ``analysis`` directory written atomically: a tool
    failing leaves no other tool's folder behind and an existing analysis untouched."""
    from dfit_mlir.core import atomic

    out_dir = Path(out_dir)
    with atomic.atomic_directory(out_dir, kind=ANALYSIS_KIND) as tmp:
        session = Session(tools, tmp, options=options)
        model = session.analyze(bundle)
        reports = session.close()
    final = out_dir
    session.out_dir = final
    for ctx in session.contexts.values():
        ctx.outputs = [final / path.relative_to(tmp) for path in ctx.outputs]
        ctx.out_dir = final / ctx.out_dir.relative_to(tmp)
    return model, reports, session


#: The output kind of an analysis folder (its marker; see dfit_mlir.core.outputs).
ANALYSIS_KIND = "analysis"
