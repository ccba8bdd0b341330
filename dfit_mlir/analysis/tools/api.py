"""The tool API: write an analysis once, run it on every backend.

A tool is a class with a kebab-case ``name`` and any of the lifecycle hooks below; the
session calls them in this order, each at most once except ``on_event`` (once per batch
of normalized events)::

    on_register(registry)                       the tool is known to a session
    on_init(ctx)                                bound to a backend and an output folder
    on_compile_begin(ctx) / on_compile_end(ctx) around the compile (ctx.model set after)
    on_load(ctx)                                the module / artifact is loaded
    on_run_begin(ctx)
    on_event(ctx, batch)                        a pyarrow RecordBatch of the event schema
    on_run_end(ctx)
    on_shutdown(ctx)                            write results, free state

Hooks are observational: they read the model and the events and write their own
outputs; they cannot change what is compiled or run. A tool sees the normalized model
(:class:`~dfit_mlir.analysis.model.SemanticModel`) and never a backend's artifacts, and
checks ``ctx.model.exposes(aspect)`` to degrade gracefully.

A minimal tool::

    class CountDispatches(Tool):
        name = "count-dispatches"

        def on_init(self, ctx):
            ctx.state["n"] = 0

        def on_event(self, ctx, batch):
            ctx.state["n"] += batch.num_rows

        def on_shutdown(self, ctx):
            ctx.export_table("counts", [{"events": ctx.state["n"]}])
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from dfit_mlir.analysis.model import SemanticModel
from dfit_mlir.core import atomic
from dfit_mlir.core.errors import InvalidInputError
from dfit_mlir.core.event_pipeline import Policy

#: The hooks, in the order a session calls them.
HOOKS = ("on_register", "on_init", "on_compile_begin", "on_compile_end", "on_load", "on_run_begin", "on_event",
         "on_run_end", "on_shutdown")
TABLE_FORMATS = ("csv", "parquet", "json")


class Tool:
    """Base of every tool; every hook is optional (the defaults do nothing)."""

    #: Registry name, kebab-case.
    name: ClassVar[str]
    #: One line for ``dfit tools``.
    description: ClassVar[str] = ""
    #: Aspects the tool needs; a backend that exposes none of them gets a note, not a crash.
    needs: ClassVar[tuple[str, ...]] = ()
    #: The ``--option TOOL.KEY=VALUE`` keys the tool reads; ``None``: it checks its own.
    #: Any other key is refused before ``on_init`` (:func:`check_options`).
    options: ClassVar[tuple[str, ...] | None] = None

    def on_register(self, registry: Any) -> None: ...
    def on_init(self, ctx: ToolContext) -> None: ...
    def on_compile_begin(self, ctx: ToolContext) -> None: ...
    def on_compile_end(self, ctx: ToolContext) -> None: ...
    def on_load(self, ctx: ToolContext) -> None: ...
    def on_run_begin(self, ctx: ToolContext) -> None: ...
    def on_event(self, ctx: ToolContext, batch: Any) -> None: ...
    def on_run_end(self, ctx: ToolContext) -> None: ...
    def on_shutdown(self, ctx: ToolContext) -> None: ...

    def report(self, ctx: ToolContext) -> str:
        """A few lines for the terminal once the tool shut down."""
        return ""


def check_options(tool: Tool, given: Mapping[str, Any]) -> None:
    """Refuse an option ``tool`` does not declare, naming the ones it takes (one rule and
    one message for every tool)."""
    if tool.options is None:
        return
    unknown = sorted(set(given) - set(tool.options))
    if unknown:
        known = ", ".join(tool.options) or "none"
        raise InvalidInputError(f"{tool.name}: unknown option {unknown[0]!r}; known: {known}")


class ToolContext:
    """What a tool gets: the semantic model, its own state, output helpers.

    * ``model`` — :class:`SemanticModel` (``None`` before ``on_compile_end`` in a live
      session);
    * ``state`` — this tool's dict, kept across every stage of the session;
    * ``shared`` — one dict for all tools of the session (read what others published);
    * ``out_dir`` — this tool's output folder; :meth:`export_table`, :meth:`write_text`
      and :meth:`output_path` write there (atomically);
    * ``notes`` — lines the tool wants in its report (missing capabilities, caveats).
    """

    def __init__(self, tool: Tool, out_dir: Path, shared: dict[str, Any], backend: str,
                 capabilities: Mapping[str, Any], options: Mapping[str, Any] | None = None):
        self.tool = tool
        self.out_dir = out_dir
        self.shared = shared
        self.backend = backend
        self.capabilities = dict(capabilities)
        self.options = dict(options or {})
        self.state: dict[str, Any] = {}
        self.model: SemanticModel | None = None
        self.notes: list[str] = []
        self.outputs: list[Path] = []

    # --- filtered metadata views ----------------------------------------------------------

    def operators(self, where: Callable[[Any], bool] | None = None, *, kind: str | None = None) -> list[Any]:
        """Operators of the model, optionally filtered by a predicate or a glob over their
        names (``kind``: op names as the frontend shows them, IDs, module paths, ignoring
        case; ``dfit_mlir/core/filters.py``)."""
        from dfit_mlir.core import filters

        ops = list(self.require_model().operators.values())
        if kind is not None:
            selection = filters.NameFilter((kind,), "kind")
            ops = [op for op in ops if selection.matches(filters.op_names(op.raw or {"id": op.id, "op": op.op}))]
        return [op for op in ops if where is None or where(op)]

    def require_model(self) -> SemanticModel:
        if self.model is None:
            raise RuntimeError(f"tool {self.tool.name}: no semantic model yet (before on_compile_end)")
        return self.model

    def exposes(self, aspect: str) -> bool:
        return self.require_model().exposes(aspect)

    def note(self, text: str) -> None:
        self.notes.append(text)

    def policy(self, **fields: Any) -> Policy:
        """A runtime event policy (mode, ID globs, sampling, budget) for a live run."""
        return Policy(**fields)

    # --- outputs ---------------------------------------------------------------------------

    def output_path(self, name: str) -> Path:
        """Where to write ``name`` (plots, ...); recorded as an output of the tool."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / name
        self.outputs.append(path)
        return path

    def write_text(self, name: str, text: str) -> Path:
        path = self.output_path(name)
        atomic.write_text(path, text)
        return path

    def export_table(self, name: str, rows: Sequence[Mapping[str, Any]] | Any,
                     formats: Iterable[str] = ("csv",)) -> list[Path]:
        """Write rows (dicts, or a pyarrow Table) as ``name.csv`` / ``.parquet`` / ``.json``."""
        import pyarrow as pa

        table = rows if isinstance(rows, pa.Table) else pa.Table.from_pylist(list(rows))
        written = []
        for fmt in formats:
            if fmt not in TABLE_FORMATS:
                raise ValueError(f"table format {fmt!r} is not one of {', '.join(TABLE_FORMATS)}")
            path = self.output_path(f"{name}.{fmt}")
            with atomic.atomic_path(path) as tmp:
                if fmt == "parquet":
                    import pyarrow.parquet as pq

                    pq.write_table(table, tmp)
                elif fmt == "json":
                    tmp.write_text(json.dumps(table.to_pylist(), indent=1, default=str) + "\n")
                else:
                    tmp.write_text(_csv_text(table))
            written.append(path)
        return written


def _csv_text(table: Any) -> str:
    """CSV with a header even for an empty table (pyarrow's writer needs a schema)."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(table.column_names)
    for row in table.to_pylist():
        writer.writerow(["" if value is None else value for value in row.values()])
    return out.getvalue()
