"""The in-process API: run an instrumented module from your own Python program.

::

    import dfit_mlir
    with dfit_mlir.instrument("m.vmfb", mode="lite") as m:
        y = m.main(x)          # program + function boundary events recorded
    m.write_bundle("run/")     # the same bundle ``dfit run`` writes

Modes (in-process ones; ``full`` needs the HAL profiler, which only the shipped tools
can drive — use ``dfit run --mode full``):

* ``none`` — nothing recorded (the baseline);
* ``ids`` — one ``program`` event per call, timed around the call;
* ``lite`` — plus ``function`` events from the module's probe calls, delivered to the
  ``dfit`` hook module (the same vmfb runs without it: the probes fall back).

The module runs in your process: a fault in it (SIGSEGV on an out-of-range index, say)
kills your program, which dfit cannot isolate here; ``dfit run`` runs the same modes in
a child process and reports such a fault as one line.

``tensors``: statistics of the values a ``--tensors`` compile traces
(:class:`TensorPolicy`: filter, sampling, kept values). A traced module always gets a
debug sink, even without ``tensors``: IREE would otherwise print every traced tensor.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from dfit_mlir.core import manifest as manifest_io
from dfit_mlir.core.errors import InvalidInputError
from dfit_mlir.core.event_pipeline import EventRow, Policy
from dfit_mlir.core.perf import kth_smallest, middle_value
from dfit_mlir.runtime_hooks.inprocess import Runner, materialize
from dfit_mlir.runtime_hooks.probes import ProbeRecorder, hook_module, pair_spans
from dfit_mlir.runtime_hooks.tensors import TensorPolicy, TensorStatsSink

IN_PROCESS_MODES = ("none", "ids", "lite")


class InstrumentedModule:
    """A loaded module whose calls are recorded as normalized events (see module doc)."""

    def __init__(self, vmfb: str | Path, manifest: str | Path | dict[str, Any] | None = None, *,
                 mode: str = "lite", driver: str = "local-task", tensors: TensorPolicy | None = None,
                 check_vmfb: bool = True, max_events: int | None = None):
        """``max_events`` bounds the events held in memory for a long session; the ones
        past it are counted (``dropped``), never silently lost."""
        if mode not in IN_PROCESS_MODES:
            hint = " (full needs the HAL profiler: use `dfit run --mode full`)" if mode == "full" else ""
            raise InvalidInputError(f"in-process mode {mode!r} is not one of {', '.join(IN_PROCESS_MODES)}{hint}")
        self.vmfb = Path(vmfb)
        if not self.vmfb.is_file():
            raise InvalidInputError(f"{self.vmfb}: no such file")
        if manifest is None:
            manifest = manifest_io.default_path(self.vmfb)
        self.manifest = manifest if isinstance(manifest, dict) else manifest_io.load(manifest)
        if check_vmfb:
            manifest_io.check_belongs(self.manifest, self.vmfb)
        self.mode = mode
        self.driver = driver
        self.session = uuid.uuid4().hex[:12]
        self.rows: dict[str, list[EventRow]] = {"program": [], "function": [], "tensor": [], "queue": []}
        self.invocations = 0
        self.max_events = max_events
        self.dropped = 0
        #: Wall time of each recorded call, kept in every mode (``none`` included).
        self.durations: list[int] = []
        self.probe_calls = 0
        self._probe_sites = self.manifest.get("probes", [])
        self._recorder = ProbeRecorder() if mode == "lite" and self._probe_sites else None
        traced = {t["key"]: t for t in self.manifest.get("tensor_traces", [])}
        if tensors is not None and not traced:
            raise InvalidInputError(f"{self.vmfb} traces no tensors: compile it with `dfit compile --tensors FILTER`")
        # Without a request the sink selects nothing: traced calls return at once.
        self._tensors = TensorStatsSink(traced, tensors, self.manifest.get("operators", ())) if traced else None
        self.tensor_policy = tensors
        self._runner = Runner(
            self.vmfb, driver,
            hooks=hook_module(self._recorder) if self._recorder else None,
            debug_sink=self._tensors.debug_sink() if self._tensors else None,
        )

    @property
    def has_probes(self) -> bool:
        return bool(self._probe_sites)

    def call(self, function: str, *args: Any, wait: bool = False, record: bool = True) -> Any:
        """Call ``function``; ``wait`` reads the results to host inside the timed span
        (what a user who consumes them pays); ``record=False`` runs unrecorded (warm-up)."""
        invoke = self._runner.function(function)
        start = time.perf_counter_ns()
        result = invoke(*args)
        if wait:
            materialize(result)
        end = time.perf_counter_ns()
        self._collect(function, start, end, record)
        return result

    def _collect(self, function: str, start: int, end: int, record: bool) -> None:
        invocation = self.invocations
        probe_rows: list[EventRow] = []
        if self._recorder is not None:
            sites, stamps = self._recorder.take()
            self.probe_calls += len(sites)
            if record:
                probe_rows = [EventRow(invocation, span.function, None, span.start_ns, span.duration_ns,
                                       attributes={"depth": span.depth} if span.depth else None)
                              for span in pair_spans(sites, stamps, self._probe_sites)]
        tensor_rows = self._tensors.take() if self._tensors is not None else []
        if not record:
            return
        self.invocations += 1
        self.durations.append(end - start)
        program_rows = [EventRow(invocation, function, None, start, end - start)] if self.mode != "none" else []
        self._keep("program", program_rows)
        self._keep("function", probe_rows)
        self._keep("tensor", [replace(row, invocation=invocation) for row in tensor_rows])

    def add_rows(self, kind: str, rows: list[EventRow]) -> None:
        """Events recorded elsewhere for this session's invocations (a lite run's
        profiled queue pass), under the same budget."""
        self._keep(kind, rows)

    def _keep(self, kind: str, rows: list[EventRow]) -> None:
        if self.max_events is not None:
            room = max(0, self.max_events - sum(len(kept) for kept in self.rows.values()))
            self.dropped += max(0, len(rows) - room)
            rows = rows[:room]
        self.rows[kind].extend(rows)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("_"):
            raise AttributeError(name)
        if self._runner.lookup(name) is None:
            raise AttributeError(f"{self.vmfb} has no function {name!r}")
        return lambda *args: self.call(name, *args)

    def events(self, policy: Policy | None = None) -> Any:
        """Everything recorded so far as one Arrow table of the normalized event schema."""
        from dfit_mlir.core.event_pipeline import MemorySink

        sink = MemorySink()
        pipeline = self.pipeline(sink, policy)
        pipeline.close()
        return sink.table()

    def pipeline(self, sink: Any, policy: Policy | None = None) -> Any:
        """An :class:`EventPipeline` into ``sink`` holding the recorded events (not closed)."""
        from dfit_mlir.core.event_pipeline import EventPipeline

        pipeline = EventPipeline(self.manifest, policy or Policy(mode=self.mode), sink, session=self.session)
        for kind, rows in self.rows.items():
            pipeline.add_rows(kind, rows)
        return pipeline

    def write_bundle(self, bundle: str | Path, policy: Policy | None = None, **summary: Any) -> Path:
        from dfit_mlir.exporters.bundle import write_bundle

        return write_bundle(Path(bundle), self.manifest, lambda sink: self.pipeline(sink, policy),
                            self.summary(**summary))

    def summary(self, **extra: Any) -> dict[str, Any]:
        tensors = self._tensors
        return {
            "mode": self.mode,
            "driver": self.driver,
            "session": self.session,
            "invocations": self.invocations,
            "dropped_in_process": self.dropped,
            "probe_calls": self.probe_calls,
            "module_has_probes": self.has_probes,
            "tensor_traces": {
                "in_module": len(tensors.traced) if tensors else 0,
                "calls": tensors.calls if tensors else 0,
                "filtered": tensors.filtered if tensors else 0,
                "sampled_out": tensors.sampled_out if tensors else 0,
                "policy": None if self.tensor_policy is None else vars(self.tensor_policy).copy(),
            },
            "invocation_ns": duration_stats(self.durations),
            "timing_harness": "in-process",
            **extra,
        }

    def close(self) -> None:
        if getattr(self, "_runner", None) is not None:
            self._runner.close()
            self._runner = None  # type: ignore[assignment]

    def __enter__(self) -> InstrumentedModule:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def instrument(vmfb: str | Path, manifest: str | Path | dict[str, Any] | None = None, *, mode: str = "lite",
               driver: str = "local-task", tensors: TensorPolicy | Sequence[str] | None = None) -> InstrumentedModule:
    """``with instrument("m.vmfb", mode="lite") as m: m.main(x)`` — see the module doc.
    ``tensors`` may be a :class:`TensorPolicy` or just ID globs."""
    if tensors is not None and not isinstance(tensors, TensorPolicy):
        tensors = TensorPolicy(patterns=tuple(tensors))
    return InstrumentedModule(vmfb, manifest, mode=mode, driver=driver, tensors=tensors)


def duration_stats(values: Sequence[int] | Any) -> dict[str, float] | None:
    """count / min / median / mean / max of nanosecond durations (``None`` if empty;
    ``values``: integers, or an integer array); the median is ``statistics.median``'s, as
    the ledger's per-invocation spread takes it: :func:`piecewise_duration_stats` of the
    values as one int64 array (a 1M-invocation run's per-invocation times as a sorted
    list of Python ints peaked 50 MiB up, as an array 20; issue 29)."""
    import numpy as np

    times = np.asarray(values, dtype=np.int64)
    return piecewise_duration_stats(lambda: (times,))


def piecewise_duration_stats(pieces: Callable[[], Iterable[Any]]) -> dict[str, float] | None:
    """count / min / median / mean / max of the int64 durations ``pieces()`` yields (a
    fresh iterator of arrays on each call), one piece in memory at a time (a long run's
    per-invocation times are in a file, :class:`~dfit_mlir.core.paged.PagedArrays`): the
    median by :func:`~dfit_mlir.core.perf.kth_smallest` (``statistics.median``'s: the mean
    of the two middle ones for an even count), the mean exact (each piece summed in two
    32-bit halves, then divided as Python integers)."""
    import numpy as np

    count = total = 0
    low = high = None
    for piece in pieces():
        if not len(piece):
            continue
        times = np.asarray(piece, dtype=np.int64)
        count += len(times)
        total += int((times >> 32).sum()) * (1 << 32) + int((times & 0xFFFFFFFF).sum())
        low = int(times.min()) if low is None else min(low, int(times.min()))
        high = int(times.max()) if high is None else max(high, int(times.max()))
    if not count:
        return None
    median = middle_value(count, lambda k: kth_smallest(pieces, k))
    return {"count": count, "min": low, "median": median, "mean": total / count, "max": high}
