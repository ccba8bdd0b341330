"""The in-process hook module ``dfit``: receives the probe calls a ``lite``/``full``
compile inserts (``passes/probes.py``) and timestamps them.

The callback is the hot path (one call per function entry and exit): it appends two
integers to typed arrays and nothing else; pairing begin/end and resolving sites to
functions happen after the run.
"""

from __future__ import annotations

import time
from array import array
from dataclasses import dataclass
from typing import Any

from dfit_mlir.core.errors import UnresolvedRecordError
from dfit_mlir.passes.probes import PROBE_CCONV, PROBE_FUNCTION, PROBE_MODULE


class ProbeRecorder:
    """Collects ``(site, perf_counter_ns)`` for every probe call."""

    def __init__(self) -> None:
        self.sites = array("i")
        self.times = array("q")

    def probe(self, site: int, edge: int) -> None:
        self.times.append(time.perf_counter_ns())
        self.sites.append(site)

    def take(self) -> tuple[array, array]:
        """The calls recorded since the last ``take``, and a fresh start."""
        sites, times = self.sites, self.times
        self.sites, self.times = array("i"), array("q")
        return sites, times


def hook_module(recorder: ProbeRecorder) -> Any:
    """A ``PyModuleInterface`` named ``dfit`` exporting ``probe`` with the calling
    convention the compiled import expects (a mismatch fails at context creation)."""
    import iree.runtime as rt

    class _Hooks:
        def __init__(self, interface: Any) -> None:
            pass

        def probe(self, site: int, edge: int) -> None:
            recorder.probe(site, edge)

    interface = rt.PyModuleInterface(PROBE_MODULE, _Hooks)
    interface.export(PROBE_FUNCTION, PROBE_CCONV, _Hooks.probe)
    return interface


@dataclass(frozen=True)
class FunctionSpan:
    function: str
    start_ns: int
    duration_ns: int
    #: Nesting depth at the begin probe (0: called from the host).
    depth: int


def pair_spans(sites: array, times: array, probe_sites: list[dict[str, Any]]) -> list[FunctionSpan]:
    """Match each end probe with the innermost open begin of the same function.

    A probe site the manifest does not list, or an end without a begin, means the
    module and the manifest disagree: an error showing the record, never a drop."""
    spans: list[FunctionSpan] = []
    open_begins: list[tuple[str, int]] = []
    for position, (site, stamp) in enumerate(zip(sites, times, strict=True)):
        if not 0 <= site < len(probe_sites):
            raise UnresolvedRecordError(
                f"probe call {position} has site {site}, but the manifest lists {len(probe_sites)} probe sites")
        entry = probe_sites[site]
        if entry["edge"] == "begin":
            open_begins.append((entry["function"], stamp))
            continue
        if not open_begins or open_begins[-1][0] != entry["function"]:
            innermost = open_begins[-1][0] if open_begins else "none"
            raise UnresolvedRecordError(
                f"probe call {position}: end of {entry['function']} (site {site}) while the innermost open "
                f"function is {innermost}")
        function, start = open_begins.pop()
        spans.append(FunctionSpan(function, start, stamp - start, len(open_begins)))
    if open_begins:
        raise UnresolvedRecordError(f"probe calls end with {len(open_begins)} function(s) still open: "
                                      + ", ".join(name for name, _ in open_begins))
    return spans
