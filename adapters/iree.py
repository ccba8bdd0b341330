"""The IREE backend: the compiler-visible path, every lifecycle step.

``compile`` is ``dfit compile --dfit-tag`` (tagging, phase snapshots, manifest),
``load`` the in-process :class:`~dfit_mlir.runtime_hooks.instrument.InstrumentedModule`,
``run`` ``dfit run`` (a run bundle), ``collect`` reads a bundle's or a compile's
manifest back. Its capability descriptor says what an IREE compile and run expose.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dfit_mlir.adapters.base import Adapter


def capabilities() -> dict[str, Any]:
    """Capability descriptor of the IREE backend (the compiler writes it into every
    manifest, so it lives with the compiler; this adapter reads it from there)."""
    from dfit_mlir.passes.instrumented_compile import capabilities as compiler_capabilities

    return compiler_capabilities()


class IreeAdapter(Adapter):
    name = "iree"
    path = "compiler-visible"

    def capabilities(self) -> dict[str, Any]:
        return capabilities()

    def prepare(self, **options: Any) -> None:
        from dfit_mlir.core import toolchain

        toolchain.require_pinned("iree-base-compiler", "dfit's IREE path")
        toolchain.require_pinned("iree-base-runtime", "dfit's IREE path")

    def compile(self, source: Path, output: Path, **options: Any) -> Any:
        from dfit_mlir.passes.instrumented_compile import compile_instrumented

        return compile_instrumented(Path(source), Path(output), **options)

    def load(self, artifact: Path, **options: Any) -> Any:
        from dfit_mlir.runtime_hooks.instrument import instrument

        return instrument(artifact, **options)

    def run(self, artifact: Path, bundle: Path, **options: Any) -> Any:
        from dfit_mlir.core import manifest
        from dfit_mlir.runtime_hooks.run import run_bundle

        manifest_path = options.pop("manifest_path", None) or manifest.default_path(artifact)
        return run_bundle(Path(artifact), Path(manifest_path), Path(bundle), **options)

    def collect(self, paths: Sequence[Path]) -> Any:
        """The manifest of a run bundle or a compile (``.manifest.json``)."""
        from dfit_mlir.core import manifest
        from dfit_mlir.core.errors import InvalidInputError

        for path in map(Path, paths):
            candidate = path / "manifest.json" if path.is_dir() else path
            if candidate.name.endswith("manifest.json") and candidate.is_file():
                return manifest.load(candidate)
        raise InvalidInputError(f"no dfit manifest among {', '.join(map(str, paths))}")
