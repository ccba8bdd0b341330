"""What every Python entry point ends with (:func:`dfit_mlir.frontends.torch.compile`,
:func:`dfit_mlir.frontends.jax.compile`): the exported text compiled with tags and the
summary printed. Apart from :mod:`dfit_mlir.frontends`' frontend knowledge, which the
compiler itself reads (the compiler is below the entry points, not beside them)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def compile_text(text: str, output: str | Path, *, default_flags: Sequence[str], mode: str = "full",
                 flags: Sequence[str] | None = None, manifest_path: str | Path | None = None,
                 mlir_path: str | Path | None = None, trace_tensors: tuple[str, ...] = (),
                 lineage_detail: str = "phases", quiet: bool = False) -> Any:
    """The end every Python entry point shares (:func:`dfit_mlir.frontends.torch.compile`,
    :func:`dfit_mlir.frontends.jax.compile`): write the exported MLIR ``text`` beside
    ``output`` (``<output stem>.mlir`` unless ``mlir_path``), compile it with tags
    (``flags``, default: the frontend's ``default_flags``) and, unless ``quiet``, print
    what ``dfit compile`` prints (:func:`dfit_mlir.passes.compile_report.compile_report`); returns the
    :class:`~dfit_mlir.passes.instrumented_compile.CompileResult`."""
    from dfit_mlir.core import atomic
    from dfit_mlir.passes.compile_report import compile_report
    from dfit_mlir.passes.instrumented_compile import compile_instrumented

    output = Path(output)
    source = Path(mlir_path) if mlir_path else output.with_suffix(".mlir")
    atomic.write_text(source, text)
    result = compile_instrumented(source, output, mode=mode, flags=tuple(default_flags if flags is None else flags),
                                  manifest_path=Path(manifest_path) if manifest_path else None,
                                  trace_tensors=trace_tensors, lineage_detail=lineage_detail)
    if not quiet:
        print(compile_report(result), flush=True)
    return result
