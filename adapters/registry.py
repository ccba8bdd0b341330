"""Backends by name: built-ins plus plugins of the ``dfit.backends`` entry-point group.

Names map to zero-argument factories that import on call, so an optional backend costs
nothing until used. A plugin is an entry point whose object is an
:class:`~dfit_mlir.adapters.base.Adapter` subclass (or a factory returning one)::

    [project.entry-points."dfit.backends"]
    mybackend = "my_package.adapter:MyAdapter"

Two providers of one name is an error that names both.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from dfit_mlir.adapters.base import Adapter, ReconstructionAdapter, expand
from dfit_mlir.core.errors import DfitError, InvalidInputError

ENTRY_POINT_GROUP = "dfit.backends"


class EdgeTpuAdapter(ReconstructionAdapter):
    name = "edgetpu"
    module = "dfit_mlir.adapters.edgetpu"


class CerebrasAdapter(ReconstructionAdapter):
    name = "cerebras"
    module = "dfit_mlir.adapters.cerebras"


class SambaNovaAdapter(ReconstructionAdapter):
    name = "sambanova"
    module = "dfit_mlir.adapters.sambanova"


#: name → "module:attribute" of the built-in adapters.
BUILTIN = {
    "iree": "dfit_mlir.adapters.iree:IreeAdapter",
    "edgetpu": "dfit_mlir.adapters.registry:EdgeTpuAdapter",
    "cerebras": "dfit_mlir.adapters.registry:CerebrasAdapter",
    "sambanova": "dfit_mlir.adapters.registry:SambaNovaAdapter",
}


class RegistryError(DfitError):
    """Two providers for one backend name, or a plugin that is not an adapter."""


@dataclass(frozen=True)
class Provider:
    name: str
    #: ``module:attribute`` of the adapter (or its factory).
    target: str
    #: ``built-in`` or the distribution that declares the entry point.
    origin: str

    def load(self) -> Adapter:
        module, _, attribute = self.target.partition(":")
        factory: Callable[[], object] = getattr(importlib.import_module(module), attribute)
        adapter = factory()
        if not isinstance(adapter, Adapter):
            raise RegistryError(f"backend {self.name!r} from {self.origin} ({self.target}) is not a dfit adapter")
        return adapter


def providers(entry_points: Iterable[metadata.EntryPoint] | None = None) -> dict[str, Provider]:
    """Every backend name with its provider; ``entry_points`` defaults to the installed
    ``dfit.backends`` group (tests pass their own)."""
    found = {name: Provider(name, target, "built-in") for name, target in BUILTIN.items()}
    if entry_points is None:
        entry_points = metadata.entry_points(group=ENTRY_POINT_GROUP)
    for point in entry_points:
        origin = point.dist.name if point.dist is not None else "an unnamed distribution"
        provider = Provider(point.name, point.value, origin)
        if point.name in found and found[point.name].target != point.value:
            other = found[point.name]
            raise RegistryError(f"backend {point.name!r} is provided twice: by {other.origin} ({other.target}) "
                                f"and by {origin} ({point.value})")
        found[point.name] = provider
    return found


def get(name: str, entry_points: Iterable[metadata.EntryPoint] | None = None) -> Adapter:
    known = providers(entry_points)
    if name not in known:
        raise InvalidInputError(f"unknown backend {name!r}; known: {', '.join(sorted(known))}")
    return known[name].load()


def detect(paths: Sequence[Path], entry_points: Iterable[metadata.EntryPoint] | None = None) -> Adapter:
    """The reconstruction backend whose readers recognise most of the files in ``paths``
    (capability discovery for a dump: which backend left it behind)."""
    files = expand(paths)
    if not files:
        raise InvalidInputError(f"no files in {', '.join(map(str, paths))}")
    scores: list[tuple[int, str, Adapter, list[Path]]] = []
    for name, provider in sorted(providers(entry_points).items()):
        adapter = provider.load()
        if adapter.path != "reconstruction":
            continue
        recognised = adapter.recognised(files)
        scores.append((len(recognised), name, adapter, recognised))
    scores.sort(key=lambda item: (-item[0], item[1]))
    if not scores or scores[0][0] == 0:
        raise InvalidInputError(f"no backend recognises any of the {len(files)} file(s) in "
                                f"{', '.join(map(str, paths))}; give --backend")
    tied = [score for score in scores if score[0] == scores[0][0]]
    if len(tied) > 1:
        # Name each backend's files: the user may have mixed two backends' dumps by
        # mistake (then they reconstruct each separately) or want one (then --backend).
        which = "; ".join(f"{name} recognises {_file_list(found)}" for _, name, _, found in tied)
        raise InvalidInputError(f"backends {', '.join(name for _, name, _, _ in tied)} each recognise "
                                f"{scores[0][0]} file(s): {which}; reconstruct each backend's files "
                                "separately, or give --backend")
    return scores[0][2]


def _file_list(files: Sequence[Path], shown: int = 3) -> str:
    names = ", ".join(map(str, files[:shown]))
    return names + (f" and {len(files) - shown} more" if len(files) > shown else "")


#: Inputs of the compiler-visible path: MLIR for a compile, a vmfb for a run.
COMPILER_VISIBLE_SUFFIXES = frozenset({".mlir", ".mlirbc", ".vmfb"})


def discover(paths: Sequence[Path], entry_points: Iterable[metadata.EntryPoint] | None = None) -> Adapter:
    """Capability discovery at session start: MLIR or a vmfb goes down the compiler-visible
    path (IREE); anything else is a dump for the reconstruction backend that recognises it."""
    if any(Path(p).suffix in COMPILER_VISIBLE_SUFFIXES for p in paths):
        return get("iree", entry_points)
    return detect(paths, entry_points)
