"""What a function of the host program calls and issues, read from the manifest's
``partitions.host_functions`` (written by :mod:`dfit_mlir.passes.recordings`): plain
data, no MLIR, so the runtime join reads it without loading the compiler's bindings
(about 110 MiB of a run's memory).
"""

from __future__ import annotations

from typing import Any


def reachable(roots: set[str] | list[str], calls: dict[str, list[str]]) -> set[str]:
    """``roots`` and every function they call, transitively."""
    seen: set[str] = set()
    stack = list(roots)
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        stack.extend(calls.get(name, ()))
    return seen


def anchor(functions: dict[str, dict[str, Any]], name: str, depth: int = 0) -> tuple[list[int], int] | None:
    """The first command-buffer execution a call of ``name`` makes for sure: (recordings
    it may run, queue operations — one submission each — issued before it in the call).
    Found in the entry block, following calls made there; ``None`` when a call or branch
    before it could issue any number of submissions."""
    function = functions.get(name)
    if function is None or depth > 16:
        return None
    issued = 0
    for item in function["entry"]:
        if item[0] == "queue":
            issued += 1
        elif item[0] == "execute":
            return (item[1], issued) if item[1] else None
        elif item[0] == "call":
            callee = item[1]
            if not _issues_queue_ops(functions, callee):
                continue
            found = anchor(functions, callee, depth + 1)
            return None if found is None else (found[0], issued + found[1])
    return None


def _issues_queue_ops(functions: dict[str, dict[str, Any]], name: str) -> bool:
    return any(functions[n]["queue_ops"] for n in reachable([name], {k: f["calls"] for k, f in functions.items()})
               if n in functions)
