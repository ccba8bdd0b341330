"""The adapter contract: one lifecycle for every backend.

``prepare → compile → load → run → collect``. The IREE adapter does all five (the
compiler-visible path); a closed backend's adapter can only ``collect``: it reads what
the vendor toolchain left behind and rebuilds the semantic model (reconstruction). A
step a backend cannot do raises :class:`UnsupportedStep`, whose message says why, so a
session can fall back instead of guessing.

Every adapter returns a capability descriptor: what the backend exposes and at which
fidelity (``"none"`` when it does not), so tools degrade gracefully.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from dfit_mlir.adapters.recovery import HEAD_BYTES, Recovery, files_of, readers_of
from dfit_mlir.core.errors import DfitError

#: The lifecycle, in order.
STEPS = ("prepare", "compile", "load", "run", "collect")
#: Aspects every capability descriptor names (``"none"`` when not exposed).
ASPECTS = ("compiler_ir", "lineage", "source_locations", "tensor_shapes", "partitions", "static_cost",
           "per_op_timing", "per_partition_timing", "per_program_timing", "memory")


class UnsupportedStep(DfitError):
    """A lifecycle step the backend cannot perform; the message says why."""


class Adapter:
    """Base of every backend adapter. Subclasses set :attr:`name` and :attr:`path` and
    override the steps they support."""

    name: ClassVar[str]
    #: ``compiler-visible`` or ``reconstruction``.
    path: ClassVar[str]
    #: Why the compile / load / run steps are unavailable (reconstruction backends).
    why_not: ClassVar[str] = ""

    def capabilities(self) -> dict[str, Any]:
        raise NotImplementedError

    def steps(self) -> dict[str, bool]:
        """Which lifecycle steps this adapter performs."""
        return {step: getattr(type(self), step) is not getattr(Adapter, step) for step in STEPS}

    def prepare(self, **options: Any) -> None:
        """Check that what the backend needs is present (toolchain, files)."""

    def compile(self, source: Path, output: Path, **options: Any) -> Any:
        raise UnsupportedStep(f"the {self.name} backend cannot compile here: {self.why_not}")

    def load(self, artifact: Path, **options: Any) -> Any:
        raise UnsupportedStep(f"the {self.name} backend cannot load a module here: {self.why_not}")

    def run(self, artifact: Path, bundle: Path, **options: Any) -> Any:
        raise UnsupportedStep(f"the {self.name} backend cannot run here: {self.why_not}")

    def collect(self, paths: Sequence[Path]) -> Recovery:
        raise UnsupportedStep(f"the {self.name} backend has nothing to collect from artifacts")

    def recognised(self, paths: Sequence[Path]) -> list[Path]:
        """The files among ``paths`` (directories searched recursively) this backend's
        readers recognise; used by auto-detection. None for compiler-visible backends."""
        return []


class ReconstructionAdapter(Adapter):
    """A closed backend: ``collect`` runs its readers over a dump; nothing else is
    possible without the vendor's hardware and toolchain."""

    path = "reconstruction"
    why_not = "no pass interface or runtime is available; use `dfit reconstruct` on the toolchain's artifacts"
    #: The module holding ``READERS``, ``capabilities()`` and ``reconstruct(paths)``.
    module: ClassVar[str]

    def _backend(self) -> Any:
        import importlib

        return importlib.import_module(self.module)

    def capabilities(self) -> dict[str, Any]:
        return self._backend().capabilities()

    def collect(self, paths: Sequence[Path]) -> Recovery:
        return self._backend().reconstruct([Path(p) for p in paths])

    def recognised(self, paths: Sequence[Path]) -> list[Path]:
        readers = self._backend().READERS
        return [path for path in files_of(paths, readers) if readers_of(readers, path)]


def expand(paths: Sequence[Path]) -> list[Path]:
    """Files of ``paths``, directories searched recursively, in a stable order."""
    files: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            files.extend(sorted(p for p in path.rglob("*") if p.is_file()))
        elif path.is_file():
            files.append(path)
    return files


__all__ = ["ASPECTS", "Adapter", "HEAD_BYTES", "ReconstructionAdapter", "STEPS", "UnsupportedStep", "expand"]
