"""``dfit compile`` and ``dfit opt``: the compiler's front door."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import click

from dfit_mlir.cli.contract import force_option, require_file, user_errors
from dfit_mlir.core import atomic


@click.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("source", type=click.Path(path_type=Path))
@click.option("--dfit-tag", "tag", is_flag=True, help="Instrument: stamp IDs, snapshot lineage, write the manifest.")
@click.option("--mode", type=click.Choice(["ids", "lite", "full"]), default="full", show_default=True,
              help="ids: dispatch mapping only; lite: 7 phase snapshots + function probes; full: all 12.")
@click.option("--probes/--no-probes", default=None,
              help="Function-boundary probes for `dfit run --mode lite` (default: with --mode lite only).")
@click.option("--tensors", "tensor_filter", default=None, metavar="FILTER",
              help="Trace the values of source ops matching these comma-separated globs, ignoring case: IDs, op "
                   "names as the frontend shows them (onnx.Softmax, torch.aten.softmax, tosa.conv2d, '*softmax*'), "
                   "lowered op names (linalg.matmul), module paths; a glob matching nothing is an error. Changes "
                   "fusion around the traced ops.")
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, help="Output .vmfb.")
@click.option("--manifest", "manifest_path", type=click.Path(path_type=Path), default=None,
              help="Manifest path (default: OUTPUT with .manifest.json).")
@click.option("--driver", type=click.Choice(["in-process", "subprocess"]), default=None,
              help="Phase driver (default: in-process when the toolchain gate passes).")
@click.option("--model-factory", default=None,
              help="For a model file (SOURCE.py): the function returning (nn.Module, example args) (PyTorch) or "
                   "(function, example args) (JAX) [default: make_model, else make_step].")
@click.option("--lineage", "lineage_detail", type=click.Choice(["phases", "passes"]), default="phases",
              show_default=True, help="passes: also record which compiler pass changed each ID's lineage class "
                                      "(--mode full; iree-compile per phase; see `dfit show --passes`).")
@force_option
@click.pass_context
@user_errors
def compile(ctx: click.Context, source: Path, tag: bool, mode: str, probes: bool | None, tensor_filter: str | None,
            output: Path, manifest_path: Path | None, driver: str | None, model_factory: str | None, lineage_detail: str,
            force: bool) -> None:
    """Compile with iree-compile; with --dfit-tag also write the manifest. Any other
    option is passed to iree-compile. SOURCE may be a PyTorch model file (.py defining
    make_model() -> (nn.Module, example args)): it is exported with iree-turbine, each op
    keeping its nn.Module path, to OUTPUT with .mlir first; or a JAX file (.py defining
    make_step() -> (function, example args)): it is lowered with jax.jit, each op keeping
    its name stack, to OUTPUT with .mlir first. SOURCE may be an ONNX model
    (.onnx): it is imported with node names as locations (opset upgraded to 17, dynamic
    input dims pinned to 1) to OUTPUT with .mlir first."""
    from dfit_mlir.core.errors import InvalidInputError

    flags = list(ctx.args)
    # Absolute before any model code runs: a model file that changes the working folder
    # must not move the outputs (the folder is also put back after it ran).
    output = Path(os.path.abspath(output))
    manifest_path = Path(os.path.abspath(manifest_path)) if manifest_path is not None else None
    if lineage_detail == "passes" and not tag:
        raise InvalidInputError("--lineage passes needs --dfit-tag (the history is kept per dfit ID)")
    if lineage_detail == "passes" and driver == "in-process":
        raise InvalidInputError("--lineage passes runs iree-compile per phase: it cannot use --driver in-process "
                                "(the compiler library parses its IR-printing options once per process)")
    if source.suffix == ".py":
        from dfit_mlir.frontends.model_file import export_model_file

        source = Path(os.path.abspath(source))  # the model's frames are matched to it after any chdir
        exported: list[Any] = []  # the export runs after the output check, inside the writer
        source = _write_frontend_mlir(source, output, force, lambda: exported.append(
            export_model_file(source, model_factory)) or exported[0].text)
        if not any(flag.startswith("--iree-hal-target-device") for flag in flags):
            flags += list(exported[0].default_flags)
    elif source.suffix.lower() == ".onnx":
        from dfit_mlir.frontends import onnx as onnx_frontend

        source = _write_frontend_mlir(source, output, force, lambda: onnx_frontend.import_model(source))
    if tensor_filter is not None and not tag:
        raise InvalidInputError("--tensors needs --dfit-tag (traces are keyed by dfit IDs)")
    _check_compile_paths(source, output, manifest_path if tag else None, force, tag)
    if not tag:
        from dfit_mlir.passes.plain_compile import plain_compile

        plain_compile(source, output, flags)
        return
    from dfit_mlir.passes.compile_report import compile_report
    from dfit_mlir.passes.instrumented_compile import compile_instrumented
    from dfit_mlir.passes.tensor_traces import parse_filter

    try:
        tensors = parse_filter(tensor_filter) if tensor_filter is not None else ()
    except ValueError as error:
        raise InvalidInputError(str(error)) from None
    result = compile_instrumented(source, output, mode=mode, flags=flags, manifest_path=manifest_path,
                                  driver_name=driver, trace_tensors=tensors, probes=probes,
                                  lineage_detail=lineage_detail)
    click.echo(compile_report(result))
    if tensors:
        traced = result.manifest["tensor_traces"]
        skipped = result.manifest["tensor_traces_skipped"]
        click.echo(f"tensor traces: {len(traced)} ops" + (f" ({len(skipped)} matched but skipped: "
                   + "; ".join(f"{s['id']}: {s['reason']}" for s in skipped[:3]) + ")" if skipped else ""))


def _write_frontend_mlir(source: Path, output: Path, force: bool, produce: Callable[[], str]) -> Path:
    """Write the MLIR a frontend makes of ``source`` (``produce``, called after the output
    check) to OUTPUT with .mlir first; the path written."""
    from dfit_mlir.core import atomic, outputs

    exported = output.with_suffix(".mlir")
    outputs.check(exported, "mlir", inputs=[source], force=force, directory=False)
    atomic.write_text(exported, produce(), kind="mlir")
    try:
        click.echo(f"wrote {exported}")
    except BaseException:  # no half-done command leaves the file it wrote (a closed stdout)
        exported.unlink(missing_ok=True)
        raise
    return exported


def _check_compile_paths(source: Path, output: Path, manifest_path: Path | None, force: bool, tag: bool) -> None:
    """The source must be a readable MLIR file; the vmfb and manifest outputs must not
    be the source or each other, nor files dfit did not write."""
    from dfit_mlir.core import outputs
    from dfit_mlir.core.errors import InvalidInputError
    from dfit_mlir.core.manifest import default_path

    require_file(source, "MLIR source")
    outputs.check(output, "vmfb", inputs=[source], force=force, directory=False)
    if tag:
        manifest_out = manifest_path or default_path(output)
        if outputs.resolve(manifest_out) == outputs.resolve(output):
            raise InvalidInputError(f"{manifest_out}: the manifest cannot be the vmfb output too")
        outputs.check(manifest_out, "manifest", inputs=[source], force=force, directory=False)


@click.command()
@click.argument("source", type=click.Path(path_type=Path))
@click.option("--dfit-tag", "tag", is_flag=True, help="Short form of --pass-pipeline='builtin.module(dfit-tag)'.")
@click.option("--pass-pipeline", default=None, help="e.g. 'builtin.module(dfit-tag,canonicalize,cse)'.")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None, help="Output file (default: stdout).")
@click.option("--debuginfo/--no-debuginfo", default=True, show_default=True, help="Print locations.")
@click.option("--allow-unregistered-dialect", is_flag=True, help="Accept ops of dialects IREE does not know.")
@force_option
@user_errors
def opt(source: Path, tag: bool, pass_pipeline: str | None, output: Path | None, debuginfo: bool,
        allow_unregistered_dialect: bool, force: bool) -> None:
    """Run a pass pipeline mixing dfit passes with the bundled MLIR/IREE passes."""
    from iree.compiler import ir

    from dfit_mlir.core.errors import CompileError, InvalidInputError
    from dfit_mlir.passes.phases import compiler_context, parse_file
    from dfit_mlir.passes.pipeline import build_pass_manager, parse_pipeline

    if tag and pass_pipeline:
        raise InvalidInputError("give either --dfit-tag or --pass-pipeline, not both")
    pipeline = pass_pipeline or ("builtin.module(dfit-tag)" if tag else "builtin.module()")
    require_file(source, "MLIR source")
    if output is not None:
        from dfit_mlir.core import outputs

        outputs.check(output, "mlir", inputs=[source], force=force, directory=False)
    session, context = compiler_context(allow_unregistered_dialect)
    module = parse_file(context, source)
    anchor = parse_pipeline(pipeline)[0]
    if anchor not in (module.operation.name, "any"):  # MLIR would fail only once running it: a usage error
        raise InvalidInputError(f"--pass-pipeline {pipeline[:200]!r}: anchored on {anchor}, but the file's top op "
                                f"is {module.operation.name}; nest it: {module.operation.name}({pipeline[:200]})")
    manager = build_pass_manager(pipeline, context)
    with context:
        try:
            manager.run(module)
        except ir.MLIRError as error:
            raise CompileError(f"{source}: pass pipeline failed: {error}") from None
        text = module.get_asm(enable_debug_info=debuginfo)
    if output is None:
        click.echo(text, nl=False)
    else:
        atomic.write_text(output, text, kind="mlir")
    session.close()
