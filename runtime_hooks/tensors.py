"""Tensor statistics from ``flow.tensor.trace`` ops keyed ``dfit:<id>``
(``passes/tensor_traces.py``), received through a ``HalModuleDebugSink``.

The sink callback runs inside the invocation, so it does as little as the policy
allows: a key outside the filter or a sampled-out call returns at once (IREE has
already waited for the dispatch; that wait is the unavoidable part of the cost), and
only selected calls map the buffer and reduce it with numpy.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from dfit_mlir.core import filters
from dfit_mlir.core.errors import UnresolvedRecordError
from dfit_mlir.core.event_pipeline import EventRow
from dfit_mlir.passes.tensor_traces import KEY_PREFIX


@dataclass(frozen=True)
class TensorPolicy:
    """``patterns``: globs over the traced ops' names — IDs, op names as the frontend
    shows them, module paths, ignoring case (``dfit_mlir/core/filters.py``; empty: every
    trace in the module);
    ``sample_every``: keep one call in k per key; ``values``: how many leading values
    to keep per event (0: statistics only)."""

    patterns: tuple[str, ...] = ()
    sample_every: int = 1
    values: int = 0


class TensorStatsSink:
    """Collects one :class:`EventRow` (kind ``tensor``) per selected traced call."""

    def __init__(self, traced: dict[str, dict[str, Any]], policy: TensorPolicy | None,
                 operators: Iterable[Mapping[str, Any]] = ()):
        """``operators``: the manifest's, for the names a filter matches; a glob that
        selects no traced op is a :class:`~dfit_mlir.core.filters.FilterMatchesNothing`."""
        #: ``key`` → the manifest's ``tensor_traces`` entry.
        self.traced = traced
        known = filters.names_by_id(operators)
        #: ``key`` → the names the policy's globs are matched against.
        self._names = {key: (*(known.get(entry["id"]) or filters.id_names(entry["id"])), entry.get("op") or "")
                       for key, entry in traced.items()}
        self._filter = filters.NameFilter(tuple(policy.patterns), "--tensors") if policy and policy.patterns else None
        if self._filter is not None:
            self._filter.select(self._names, "the traced ops of this module", "compile with --tensors to trace others")
        #: ``None``: no statistics requested; every traced call returns at once.
        self.policy = policy
        self.invocation: int | None = None
        self.rows: list[EventRow] = []
        self.calls = 0
        self.sampled_out = 0
        self.filtered = 0
        self._per_key: dict[str, int] = {}
        self._selected: dict[str, bool] = {}

    def debug_sink(self) -> Any:
        import iree.runtime as rt

        return rt.HalModuleDebugSink(self._on_trace)

    def _on_trace(self, key: str, buffer_views: list[Any]) -> None:
        self.calls += 1
        selected = self._selected.get(key)
        if selected is None:
            selected = self._selected[key] = self._select(key)
        if not selected:
            self.filtered += 1
            return
        count = self._per_key.get(key, 0)
        self._per_key[key] = count + 1
        assert self.policy is not None  # _select keeps nothing without one
        if count % self.policy.sample_every:
            self.sampled_out += 1
            return
        import iree.runtime as rt

        stamp = time.perf_counter_ns()
        for view in buffer_views:
            array = view.map().asarray(view.shape, rt.HalElementType.map_to_dtype(view.element_type))
            self.rows.append(self._row(key, array, stamp))

    def take(self) -> list[EventRow]:
        """The rows collected since the last ``take``."""
        rows, self.rows = self.rows, []
        return rows

    def _select(self, key: str) -> bool:
        if key not in self.traced:
            known = ", ".join(sorted(self.traced)[:5]) or "none"
            raise UnresolvedRecordError(f"traced tensor {key!r} is not in the manifest's tensor_traces "
                                        f"(first of those: {known})")
        if self.policy is None:
            return False
        return self._filter is None or self._filter.matches(self._names[key])

    def _row(self, key: str, array: np.ndarray, stamp: int) -> EventRow:
        values = array.astype(np.float64, copy=False).ravel()
        finite = np.isfinite(values)
        nans = int(np.isnan(values).sum())
        good = values[finite] if not finite.all() else values
        attributes: dict[str, Any] = {"shape": list(array.shape), "dtype": str(array.dtype)}
        if self.policy is not None and self.policy.values:
            attributes["values"] = values[: self.policy.values].tolist()
        return EventRow(
            invocation=self.invocation,
            partition=key,
            root_id=key[len(KEY_PREFIX):],
            start_ns=stamp,
            duration_ns=0,
            bytes=int(array.nbytes),
            attributes=attributes,
            tensor_min=float(good.min()) if good.size else None,
            tensor_max=float(good.max()) if good.size else None,
            tensor_mean=float(good.mean()) if good.size else None,
            tensor_std=float(good.std()) if good.size else None,
            tensor_nans=nans,
            tensor_infs=int(values.size - finite.sum()) - nans,
        )
