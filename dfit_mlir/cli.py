"""The ``dfit`` command line."""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any, Callable

import click

from dfit_mlir import atomic
from dfit_mlir.errors import (
    EXIT_INTERNAL_ERROR,
    EXIT_INTERRUPTED,
    EXIT_INVALID_INPUT,
    EXIT_TABLE,
    DfitError,
    OutputRefusedError,
)
from dfit_mlir.placement import MAX_CLOCK_OFFSET_NS, MAX_RANK

# --- the CLI contract: one exit-status table, one line per error, no traceback ---------

#: Parameters naming a command's main input, in the order the internal-error line looks.
_INPUT_PARAMETERS = ("source", "vmfb", "dumps", "bundle", "bundle_a", "manifest_path", "bundles", "store_path")


def _user_errors(command: Callable[..., Any]) -> Callable[..., Any]:
    """Every way a command ends, mapped to the exit-status table of ``dfit --help``:
    :class:`DfitError` → its one-line message and status; SIGINT/SIGTERM → 130 with
    temporaries removed; anything unexpected → one line naming the command and the
    input plus a traceback file, status 70."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        name = click.get_current_context().info_name or command.__name__
        previous = _route_sigterm()
        try:
            return command(*args, **kwargs)
        except DfitError as error:
            # One `dfit:` line says what failed; a toolchain's own diagnostics follow it.
            click.echo(_capped(f"dfit: {error}"), err=True)
            sys.exit(error.exit_code)
        except KeyboardInterrupt:
            atomic.remove_temporaries()
            click.echo(f"dfit {name}: interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except BrokenPipeError:  # `dfit backends | head`
            sys.exit(0)
        except click.exceptions.Exit:
            raise
        except OSError as error:
            where = error.filename or _main_input(kwargs) or ""
            click.echo(f"dfit: {where}: {error.strerror or error}", err=True)
            sys.exit(EXIT_INVALID_INPUT)
        except (SystemExit, click.ClickException):
            raise
        except Exception as error:  # noqa: BLE001 — the catch-all of the exit-status table
            atomic.remove_temporaries()
            saved = _save_traceback(name)
            message = " ".join(str(error).split())[:300]
            click.echo(f"dfit {name}: internal error on {_main_input(kwargs) or '(no input)'}: "
                       f"{type(error).__name__}: {message} (traceback: {saved})", err=True)
            sys.exit(EXIT_INTERNAL_ERROR)
        finally:
            _restore_sigterm(previous)

    return wrapper


#: What an error message may echo of a pathological input: characters per line, lines.
MAX_LINE_CHARS = 1000
MAX_LINES = 60


def _capped(message: str) -> str:
    """``message`` with each line and the line count bounded (a 1 MB line in an input
    must not come back whole in the error about it)."""
    lines = message.splitlines() or [""]
    shown = [line if len(line) <= MAX_LINE_CHARS else
             f"{line[:MAX_LINE_CHARS]}… ({len(line) - MAX_LINE_CHARS} more characters)" for line in lines[:MAX_LINES]]
    if len(lines) > MAX_LINES:
        shown.append(f"… ({len(lines) - MAX_LINES} more lines)")
    return "\n".join(shown)


def _main_input(kwargs: dict[str, Any]) -> str | None:
    for parameter in _INPUT_PARAMETERS:
        value = kwargs.get(parameter)
        if isinstance(value, (tuple, list)):
            return ", ".join(map(str, value)) if value else None
        if value is not None:
            return str(value)
    return None


def _save_traceback(command: str) -> str:
    """Write the current exception's traceback to a file; returns its path."""
    import os
    import tempfile
    import time
    import traceback

    from dfit_mlir.paths import CACHE_DIR_ENV

    base = os.environ.get(CACHE_DIR_ENV) or os.path.join(tempfile.gettempdir(), f"dfit-{os.getuid()}")
    folder = Path(base) / "tracebacks"
    text = f"dfit {command} ({' '.join(sys.argv)})\n" + traceback.format_exc()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{command}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.txt"
        path.write_text(text, encoding="utf-8")
        return str(path)
    except OSError:
        handle, name = tempfile.mkstemp(prefix=f"dfit-{command}-", suffix=".txt")
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        return name


def _route_sigterm() -> Any:
    """SIGINT and SIGTERM raise in the main thread (KeyboardInterrupt, :class:`Interrupted`)
    so that every ``finally`` removes its temporaries, except while an output's temporary
    is being created or swapped into place, which the signal waits for."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None
    wanted = [sig for sig in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(sig) != signal.SIG_IGN]
    return {sig: signal.signal(sig, atomic.on_signal) for sig in wanted}


def _restore_sigterm(previous: Any) -> None:
    import signal

    for sig, handler in (previous or {}).items():
        signal.signal(sig, handler)


def _force_option(command: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--force", is_flag=True,
                        help="Replace an existing output dfit does not recognise as its own (never an input).")(command)


class _FiniteFloat(click.ParamType):
    """A finite float in [low, high] (``nan``, ``inf`` and out-of-range values refused)."""

    name = "float"

    def __init__(self, low: float, high: float, *, low_open: bool = False):
        self.low, self.high, self.low_open = low, high, low_open

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        import math

        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(number) or number > self.high or number < self.low or (
                self.low_open and number == self.low):
            low = f"({self.low}" if self.low_open else f"[{self.low}"
            self.fail(f"{value} is not in {low}, {self.high}]", param, ctx)
        return number


#: Bounds of the numeric options of `dfit run` (beyond them a run would not end, or
#: would keep nothing).
MAX_REPEAT = 1_000_000
MIN_SAMPLE = 1e-6
MAX_TENSOR_VALUES = 1 << 20
#: Bounds of the integer options that end up in the store's int64 columns or an engine's
#: row counts (beyond them a later command would fail, not this one); --rank and
#: --clock-offset-ns: dfit_mlir.placement's.
MAX_INT64 = (1 << 63) - 1
MAX_ROWS = 1_000_000_000

EPILOG = "\b\nExit status (every command):\n" + "\n".join(
    f"  {status:<4} {meaning}" for status, meaning in EXIT_TABLE)


class _DfitGroup(click.Group):
    """Usage errors as one ``dfit <command>: ...`` line (exit 2), like every other error,
    with the pointer to ``--help`` after it; Ctrl-C while click parses → 130."""

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            return super().main(*args, standalone_mode=False, **kwargs)
        except click.exceptions.NoArgsIsHelpError as error:
            error.show()
            sys.exit(error.exit_code)
        except click.UsageError as error:
            command = error.ctx.command_path if error.ctx is not None else "dfit"
            click.echo(f"{command}: {' '.join(error.format_message().split())}", err=True)
            click.echo(f"  (see `{command} --help`)", err=True)
            sys.exit(error.exit_code)
        except click.ClickException as error:
            click.echo(f"dfit: {error.format_message()}", err=True)
            sys.exit(error.exit_code)
        except click.exceptions.Abort:
            click.echo("dfit: interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except click.exceptions.Exit as error:
            sys.exit(error.exit_code)


@click.group(cls=_DfitGroup, context_settings={"help_option_names": ["-h", "--help"]}, epilog=EPILOG)
@click.version_option(package_name="dfit-mlir")
def main() -> None:
    """dfit-mlir: stable semantic IDs and lineage for ML compilers."""


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
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
@_force_option
@click.pass_context
@_user_errors
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
    from dfit_mlir.errors import InvalidInputError

    flags = list(ctx.args)
    if lineage_detail == "passes" and not tag:
        raise InvalidInputError("--lineage passes needs --dfit-tag (the history is kept per dfit ID)")
    if lineage_detail == "passes" and driver == "in-process":
        raise InvalidInputError("--lineage passes runs iree-compile per phase: it cannot use --driver in-process "
                                "(the compiler library parses its IR-printing options once per process)")
    if source.suffix == ".py":
        from dfit_mlir.frontends.model_file import export_model_file

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
    from dfit_mlir.passes.instrumented_compile import compile_instrumented
    from dfit_mlir.passes.tensor_traces import parse_filter
    from dfit_mlir.report import compile_report

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
    from dfit_mlir import atomic, outputs

    exported = output.with_suffix(".mlir")
    outputs.check(exported, "mlir", inputs=[source], force=force, directory=False)
    atomic.write_text(exported, produce(), kind="mlir")
    click.echo(f"wrote {exported}")
    return exported


def _check_compile_paths(source: Path, output: Path, manifest_path: Path | None, force: bool, tag: bool) -> None:
    """The source must be a readable MLIR file; the vmfb and manifest outputs must not
    be the source or each other, nor files dfit did not write."""
    from dfit_mlir import outputs
    from dfit_mlir.errors import InvalidInputError
    from dfit_mlir.manifest import default_path

    _require_file(source, "MLIR source")
    outputs.check(output, "vmfb", inputs=[source], force=force, directory=False)
    if tag:
        manifest_out = manifest_path or default_path(output)
        if outputs.resolve(manifest_out) == outputs.resolve(output):
            raise InvalidInputError(f"{manifest_out}: the manifest cannot be the vmfb output too")
        outputs.check(manifest_out, "manifest", inputs=[source], force=force, directory=False)


def _require_file(path: Path, what: str) -> None:
    """An input that must be a regular, readable, non-empty file."""
    from dfit_mlir.errors import InvalidInputError

    if not path.exists():
        raise InvalidInputError(f"{path}: no such file")
    if path.is_dir():
        raise InvalidInputError(f"{path}: is a directory, not a {what} file")
    if path.stat().st_size == 0:
        raise InvalidInputError(f"{path}: the {what} file is empty")


@main.command()
@click.argument("source", type=click.Path(path_type=Path))
@click.option("--dfit-tag", "tag", is_flag=True, help="Short form of --pass-pipeline='builtin.module(dfit-tag)'.")
@click.option("--pass-pipeline", default=None, help="e.g. 'builtin.module(dfit-tag,canonicalize,cse)'.")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None, help="Output file (default: stdout).")
@click.option("--debuginfo/--no-debuginfo", default=True, show_default=True, help="Print locations.")
@click.option("--allow-unregistered-dialect", is_flag=True, help="Accept ops of dialects IREE does not know.")
@_force_option
@_user_errors
def opt(source: Path, tag: bool, pass_pipeline: str | None, output: Path | None, debuginfo: bool,
        allow_unregistered_dialect: bool, force: bool) -> None:
    """Run a pass pipeline mixing dfit passes with the bundled MLIR/IREE passes."""
    from iree.compiler import ir

    from dfit_mlir.errors import CompileError, InvalidInputError
    from dfit_mlir.passes.phases import compiler_context, parse_file
    from dfit_mlir.passes.pipeline import build_pass_manager, parse_pipeline

    if tag and pass_pipeline:
        raise InvalidInputError("give either --dfit-tag or --pass-pipeline, not both")
    pipeline = pass_pipeline or ("builtin.module(dfit-tag)" if tag else "builtin.module()")
    _require_file(source, "MLIR source")
    if output is not None:
        from dfit_mlir import outputs

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


@main.command()
@click.argument("vmfb", type=click.Path(path_type=Path))
@click.option("--manifest", "manifest_path", type=click.Path(path_type=Path), default=None,
              help="Manifest of VMFB (default: VMFB with .manifest.json).")
@click.option("--mode", type=click.Choice(["none", "ids", "lite", "full"]), default="full", show_default=True,
              help="none: baseline timing only; ids: program events; lite: + function events from probes; "
                   "full: dispatch (joined to IDs), queue and memory events from HAL profiling.")
@click.option("--tensors", "tensor_filter", default=None, metavar="FILTER",
              help="Tensor statistics for traced ops matching these comma-separated globs ('*': all traced; "
                   "matched like compile --tensors); needs a --tensors compile and an in-process mode.")
@click.option("--tensor-values", type=click.IntRange(0, MAX_TENSOR_VALUES), default=0, show_default=True,
              help="Leading values kept per tensor event.")
@click.option("--input", "inputs", multiple=True,
              help="iree-run-module form: 1x3xf32=0.5 or @x.npy, a scalar argument as 3 or i32=3 (default: floats "
                   "random, integers that index a table below its size, other integers 0, scalars 1; summary.json "
                   "says how each was made).")
@click.option("--inputs-from", type=click.Path(path_type=Path), default=None, help="A directory of .npy inputs, in name order.")
@click.option("--repeat", type=click.IntRange(1, MAX_REPEAT), default=1, show_default=True,
              help="Invocations to record.")
@click.option("--warmup", type=click.IntRange(0, MAX_REPEAT), default=0, show_default=True,
              help="Invocations to run first, unrecorded.")
@click.option("--driver", type=click.Choice(["local-task", "local-sync"]), default="local-task", show_default=True)
@click.option("--function", default=None,
              help="Exported function to run (default: the module's only one; the error lists them).")
@click.option("--ids", "id_globs", multiple=True,
              help="Keep only dispatches and events of ops matching this glob (repeatable or comma-separated; IDs, "
                   "op names such as onnx.Conv, module paths; ignoring case). A glob matching no op is an error.")
@click.option("--sample", type=_FiniteFloat(MIN_SAMPLE, 1), default=1.0, show_default=True,
              help="Share of dispatch and tensor events to keep (deterministic: every round(1/RATE)-th; "
                   "tensors: per ID, so each traced ID is sampled).")
@click.option("--max-events", type=click.IntRange(0, 1 << 62), default=None,
              help="Event budget: events past it are dropped and counted in summary.json.")
@click.option("--host", default=None, help="The host this run is part of a job on (default: this machine's name).")
@click.option("--rank", type=click.IntRange(0, MAX_RANK), default=None, help="Its rank in a multi-rank job.")
@click.option("--clock-offset-ns", type=click.IntRange(-MAX_CLOCK_OFFSET_NS, MAX_CLOCK_OFFSET_NS), default=None,
              help="What to add to this run's times to get the job's clock (dfit merge aligns by it when every "
                   "bundle has one).")
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, help="Bundle directory.")
@_force_option
@_user_errors
def run(vmfb: Path, manifest_path: Path | None, mode: str, tensor_filter: str | None, tensor_values: int,
        inputs: tuple[str, ...], inputs_from: Path | None, repeat: int, warmup: int, driver: str,
        function: str | None, id_globs: tuple[str, ...], sample: float, max_events: int | None,
        host: str | None, rank: int | None, clock_offset_ns: int | None, output: Path, force: bool) -> None:
    """Run a compiled module, join runtime events to IDs, write a run bundle."""
    import socket

    from dfit_mlir import manifest
    from dfit_mlir.errors import InvalidInputError
    from dfit_mlir.event_pipeline import Policy
    from dfit_mlir.filters import NameFilter
    from dfit_mlir.runtime_hooks.inputs import inputs_from as read_inputs_dir
    from dfit_mlir.runtime_hooks.run import run_bundle

    if inputs and inputs_from:
        raise InvalidInputError("give either --input or --inputs-from, not both")
    if manifest_path is not None and not manifest_path.is_file():
        raise InvalidInputError(f"{manifest_path}: no such file (--manifest)")
    from dfit_mlir import outputs

    _require_file(vmfb, "vmfb")
    manifest_path = manifest_path or manifest.default_path(vmfb)
    input_files = [Path(text[1:]) for text in inputs if text.startswith("@")]
    # Resolved: `-o .` names the folder itself, which is renamed away when it is replaced.
    output = outputs.check(output, "bundle", inputs=[vmfb, manifest_path, inputs_from, *input_files], force=force)
    sample_every = max(1, round(1 / sample))
    policy = Policy(mode=mode, ids=NameFilter.parse(id_globs, "--ids").patterns if id_globs else (),
                    sample_every=sample_every, max_events=max_events)
    if policy.ids:  # a glob matching no op fails before the module runs
        manifest_file = manifest_path or manifest.default_path(vmfb)
        policy.check(manifest.load(manifest_file), str(manifest_file))
    tensors = None
    if tensor_filter is not None:
        from dfit_mlir.passes.tensor_traces import parse_filter
        from dfit_mlir.runtime_hooks.tensors import TensorPolicy

        try:
            tensors = TensorPolicy(parse_filter(tensor_filter), sample_every, tensor_values)
        except ValueError as error:
            raise InvalidInputError(str(error)) from None
    result = run_bundle(vmfb, manifest_path, output, mode=mode,
                        inputs=read_inputs_dir(inputs_from) if inputs_from else inputs, repeat=repeat,
                        warmup=warmup, driver=driver, function=function, policy=policy, tensors=tensors,
                        placement={"host": host or socket.gethostname(), "rank": rank,
                                   "clock_offset_ns": clock_offset_ns})
    counts = result.summary["counts"]
    timing = result.summary.get("invocation_ns") or {}
    median = f", median invocation {timing['median'] / 1e6:.3f} ms" if timing else ""
    dropped = result.summary["dropped_events"]
    click.echo(f"wrote {result.bundle}: {counts['kept']} events of {counts['seen']} seen, {dropped} dropped"
               f"{median} ({result.summary['trace_slices']} trace slices; open trace.pftrace in the Perfetto UI)")
    for made in result.summary.get("inputs", ()):
        if made.get("dynamic"):
            click.echo(f"note: {made['dynamic']}", err=True)
    if mode == "lite" and not result.summary.get("module_has_probes"):
        click.echo("note: the module has no function probes (compile it with --mode lite or --probes): "
                   "program events only", err=True)


@main.command()
@click.argument("dumps", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--backend", default="auto", show_default=True,
              help="auto (detect from the files' content) or a backend name (see `dfit backends`).")
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, help="Bundle directory.")
@_force_option
@_user_errors
def reconstruct(dumps: tuple[Path, ...], backend: str, output: Path, force: bool) -> None:
    """Rebuild the semantic model from a closed backend's artifacts (files or directories)
    and write the same bundle an IREE run writes, with a coverage report."""
    from dfit_mlir import outputs
    from dfit_mlir.errors import InvalidInputError
    from dfit_mlir.reconstruct import reconstruct_bundle

    missing = [path for path in dumps if not path.exists()]
    if missing:  # the input's error first: it is the one the user came for
        raise InvalidInputError(f"{missing[0]}: no such file or directory")
    output = outputs.check(output, "bundle", inputs=dumps, force=force)
    summary = reconstruct_bundle(list(dumps), output, backend)
    for warning in summary.get("warnings", []):
        click.echo(f"dfit: warning: {warning}", err=True)
    recovered = summary["recovered"]
    groups = f" (in {recovered['partition_groups']} groups)" if recovered.get("partition_groups") else ""
    click.echo(f"wrote {output}: {summary['backend']} ({'detected' if summary['detected'] else 'given'}), "
               f"{recovered['operators']} operators, {recovered['tensors']} tensors, {recovered['partitions']} "
               f"partitions{groups}, {recovered['measurements']} measurements from {len(summary['sources'])} file(s)")
    scopes = recovered.get("scopes") or {}
    if len(scopes) > 1:  # several compiles or runs in the input: each counted on its own
        import re

        kinds: dict[str, int] = {}
        for scope in scopes:
            kind = re.sub(r"\d+$", "", scope) or "scope"
            kinds[kind] = kinds.get(kind, 0) + 1
        found = ", ".join(f"{n} {kind}{'s' if n > 1 else ''}" for kind, n in kinds.items())
        click.echo(f"  found {found}: " + "; ".join(
            f"{scope} {counts['operators']} operators, {counts['partitions']} partitions, "
            f"{counts['measurements']} measurements" for scope, counts in scopes.items()))
    for aspect, status in summary["coverage"].items():
        click.echo(f"  {aspect:<22} {status}")
    unparsed = summary.get("lines", {}).get("unparsed", 0)
    if unparsed:
        click.echo(f"  {unparsed} line(s) of {summary['lines']['files_with_unparsed']} file(s) not parsed: "
                   f"listed under 'lines' in {output / 'coverage.json'}")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the descriptors as JSON.")
@_user_errors
def backends(as_json: bool) -> None:
    """List backends (built-in and `dfit.backends` plugins) with their capabilities."""
    import json

    from dfit_mlir.adapters.registry import providers

    rows = []
    for name, provider in sorted(providers().items()):
        adapter = provider.load()
        rows.append({"name": name, "path": adapter.path, "origin": provider.origin, "steps": adapter.steps(),
                     "capabilities": adapter.capabilities()})
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    for row in rows:
        steps = ", ".join(step for step, able in row["steps"].items() if able)
        click.echo(f"{row['name']} ({row['path']}, {row['origin']}): {steps}")
        for aspect, fidelity in row["capabilities"]["exposes"].items():
            click.echo(f"  {aspect:<22} {fidelity}")


@main.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--tool", "tool_names", multiple=True, required=True,
              help="Tool to run (repeatable; `all` for every built-in); see `dfit tools`.")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=None,
              help="Output folder (default: BUNDLE/analysis, or next to a manifest).")
@click.option("--option", "raw_options", multiple=True, metavar="TOOL.KEY=VALUE",
              help="A tool option, e.g. program-analyzer.profile=my_cpu.yaml (repeatable).")
@click.option("--framework-code", "framework_code", multiple=True, metavar="GLOB",
              help="Source files to count as framework code, not model code (path globs, e.g. "
                   "'mylib/layers/*'; repeatable): semantic-attribution ranks the model-code line "
                   "that called into them.")
@click.option("--model-code", "model_code", multiple=True, metavar="GLOB",
              help="Source files to count as model code even inside a framework package (repeatable).")
@click.option("--explain-site", "explain_sites", multiple=True, metavar="SITE",
              help="Print, for the ops of a sites.csv site, each frame and the code rule that decided it.")
@_force_option
@_user_errors
def analyze(bundle: Path, tool_names: tuple[str, ...], out_dir: Path | None, raw_options: tuple[str, ...],
            framework_code: tuple[str, ...], model_code: tuple[str, ...], explain_sites: tuple[str, ...],
            force: bool) -> None:
    """Run analysis tools over a run/reconstruct bundle or a compile's manifest."""
    from dfit_mlir.errors import InvalidInputError
    from dfit_mlir.tools import registry
    from dfit_mlir.tools.session import analyze as run_tools

    names = list(registry.BUILTIN) if "all" in tool_names else list(dict.fromkeys(tool_names))
    options: dict[str, dict[str, str]] = {}
    for raw in raw_options:
        key, sep, value = raw.partition("=")
        tool, dot, name = key.partition(".")
        if not sep or not dot or not name:
            raise InvalidInputError(f"--option {raw!r}: expected TOOL.KEY=VALUE")
        options.setdefault(tool, {})[name] = value
    if not bundle.exists():
        raise InvalidInputError(f"{bundle}: no such file or directory")
    for key, globs in (("framework_code", framework_code), ("model_code", model_code)):
        if globs:
            given = options.setdefault("semantic-attribution", {}).get(key)
            options["semantic-attribution"][key] = ",".join(([given] if given else []) + list(globs))
    if out_dir is None:
        out_dir = bundle / "analysis" if bundle.is_dir() else bundle.with_name(bundle.name.split(".")[0] + ".analysis")
    from dfit_mlir import outputs

    option_files = [Path(value) for values in options.values() for value in values.values() if Path(value).exists()]
    outputs.check(out_dir, "analysis", inputs=[bundle, *option_files], force=force, inside_input_ok=True)
    _, reports, session = run_tools(bundle, names, out_dir, options)
    for name in names:
        ctx = session.contexts.get(name)
        click.echo(f"== {name}")
        if reports.get(name):
            click.echo(reports[name].rstrip())
        for note in ctx.notes if ctx else []:
            click.echo(f"note: {note}")
        for path in ctx.outputs if ctx else []:
            click.echo(f"  wrote {path}")
    if explain_sites:
        from dfit_mlir.frontends import CodeRules, parse_globs
        from dfit_mlir.tools.builtin.semantic_attribution import explain_site
        from dfit_mlir.tools.model import SemanticModel

        rules = CodeRules.default().extended(framework=parse_globs(framework_code), model=parse_globs(model_code))
        semantic = SemanticModel.open(bundle)
        for site in explain_sites:
            click.echo(explain_site(semantic, site, rules))


@main.command()
@_user_errors
def tools() -> None:
    """List analysis tools (built-in and `dfit.tools` plugins)."""
    from dfit_mlir.tools.registry import providers

    for name, provider in sorted(providers().items()):
        cls = provider.load()
        click.echo(f"{name:<22} {provider.origin:<12} {cls.description}")


@main.command()
@click.argument("bundle_a", type=click.Path(path_type=Path))
@click.argument("bundle_b", type=click.Path(path_type=Path))
@click.option("-o", "--output", "out_dir", type=click.Path(path_type=Path), default=None,
              help="Also write diff.csv and diff.json into this folder.")
@click.option("--json", "as_json", is_flag=True, help="Print the diff as JSON instead of a table.")
@click.option("--limit", type=click.IntRange(0, MAX_ROWS), default=40, show_default=True,
              help="Rows shown in the table, most changed first (0: all).")
@_force_option
@_user_errors
def diff(bundle_a: Path, bundle_b: Path, out_dir: Path | None, as_json: bool, limit: int, force: bool) -> None:
    """What changed per stable ID between two bundles or manifests — ops, shapes, fusion,
    lineage, attributed time outside the runs' spread, bytes (matched within a module path
    by ID, else structural hash, else op kind; else by tensor name), most changed first —
    and in the generated code (target, flags, executables)."""
    from dfit_mlir import diff as bundle_diff
    from dfit_mlir import outputs

    if out_dir is not None:
        outputs.check(out_dir, "diff", inputs=[bundle_a, bundle_b], force=force)
    result = bundle_diff.diff_bundles(bundle_a, bundle_b)
    written = bundle_diff.write(result, out_dir) if out_dir is not None else []
    click.echo(bundle_diff.to_json(result).rstrip() if as_json
               else bundle_diff.render(result, limit or None, written[0] if written else None))
    for path in written:
        click.echo(f"wrote {path}", err=as_json)


@main.command("export-explorer")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True,
              help="Node data file; with several metrics, one NAME.<metric>.json each.")
@click.option("--metric", "metrics", default="macs", show_default=True,
              help="Comma-separated: macs, flops, bytes, time, partition, module, phase.")
@click.option("--key", type=click.Choice(["name", "id"]), default="name", show_default=True,
              help="Node key: the op's tensor/location name (TFLite, MLIR graphs) or its dfit ID.")
@_force_option
@_user_errors
def export_explorer(bundle: Path, output: Path, metrics: str, key: str, force: bool) -> None:
    """Per-op metrics as Model Explorer node data (load it beside the model's graph)."""
    from dfit_mlir import model_explorer, outputs

    for path in model_explorer.output_paths(output, metrics).values():
        outputs.check(path, model_explorer.OUTPUT_KIND, inputs=[bundle], force=force, directory=False)

    for exported in model_explorer.export(bundle, output, metrics=metrics, key=key):
        empty = "" if exported.nodes else f" (the bundle has no {exported.metric} values)"
        click.echo(f"wrote {exported.path}: {exported.metric} for {exported.nodes} nodes{empty}")


@main.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="The HTML file to write (self-contained: opens from disk, no network).")
@click.option("--model-explorer", "model_explorer", is_flag=True,
              help="Start Model Explorer on the bundle with dfit's extension instead of writing HTML.")
@_force_option
@_user_errors
def view(bundle: Path, output: Path | None, model_explorer: bool, force: bool) -> None:
    """One HTML page linking source lines, module tree, IREE phases and dispatches of a
    run/reconstruct bundle or a compile manifest (figures from the ledger)."""
    from dfit_mlir import outputs
    from dfit_mlir.errors import InvalidInputError

    if model_explorer:
        from dfit_mlir.views import explorer_adapter

        explorer_adapter.serve(bundle)
        return
    if output is None:
        raise InvalidInputError("view: give -o FILE.html (or --model-explorer)")
    from dfit_mlir.views import html

    outputs.check(output, html.OUTPUT_KIND, inputs=[bundle], force=force, directory=False)
    atomic.write_text(output, html.render(bundle), kind=html.OUTPUT_KIND)
    click.echo(f"wrote {output}")


@main.command()
@click.argument("bundles", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--output", "store_path", type=click.Path(path_type=Path), required=True,
              help="Store directory (created when absent).")
@click.option("--label", default=None, help="Commit or label of these runs (what `query regressions` compares).")
@click.option("--host", default=None, help="Host the bundles ran on (default: what the bundle says).")
@click.option("--rank", type=click.IntRange(0, MAX_RANK), default=None,
              help="Rank of the bundles in a multi-rank job (default: per event where the bundle says).")
@click.option("--model", default=None, help="Model name (default: the manifest input's name).")
@_user_errors
def collect(bundles: tuple[Path, ...], store_path: Path, label: str | None, host: str | None, rank: int | None,
            model: str | None) -> None:
    """Add run / reconstruct bundles and compile manifests to a bundle store (Parquet,
    Hive-partitioned by backend, model and run); a bundle already there is skipped."""
    from dfit_mlir import outputs
    from dfit_mlir.store import Placement
    from dfit_mlir.store import collect as collect_bundles

    # An existing store is recognised by its dfit-store.json (collect refuses any other
    # non-empty directory); what is left to refuse is a store over, around or in a bundle.
    outputs.check_inputs(store_path, "store", inputs=bundles)
    given = [f"--{name}" for name, value in (("label", label), ("host", host), ("rank", rank), ("model", model))
             if value is not None]
    for done in collect_bundles(list(bundles), store_path, Placement(label=label, host=host, rank=rank, model=model)):
        verb = "added" if done.added else "already in the store:"
        click.echo(f"{verb} {done.source} → backend={done.backend}/model={done.model}/run={done.run} "
                   f"({done.events} events)")
        if not done.added and given:
            click.echo(f"note: {done.source} was stored before; {', '.join(given)} given now are not applied to it "
                       "(a bundle is stored once, by its session)", err=True)
        elif done.added and model is not None and done.model != model:
            click.echo(f"note: --model {model!r} is stored as model={done.model} (a partition value keeps "
                       "letters, digits and ._+-); query it by that name", err=True)


@main.command()
@click.argument("store_path", metavar="STORE")
@click.argument("sql_or_report", metavar="SQL|REPORT")
@click.option("--engine", type=click.Choice(["duckdb", "spark"]), default="duckdb", show_default=True)
@click.option("--master", default=None, help="Spark master URL (--engine spark; default local[--threads] or $DFIT_SPARK_MASTER).")
@click.option("--baseline", default=None, help="regressions: label of the baseline runs.")
@click.option("--candidate", default=None, help="regressions: label of the candidate runs.")
@click.option("--min-runs", type=click.IntRange(min=1), default=None, help="regressions: runs needed per side (2).")
@click.option("--threshold", default=None, help="regressions: smallest relative change (0.05).")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="top-sites: rows (20).")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None, help="Write the rows to .csv or .parquet.")
@click.option("--trace", "trace_path", type=click.Path(path_type=Path), default=None,
              help="Write the selected events (rows with start_ns and kind) as a Perfetto trace.")
@click.option("--rows", "shown", type=click.IntRange(0, MAX_ROWS), default=50, show_default=True, help="Rows printed.")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="Threads the query runs on (default: every CPU dfit may use; Spark: local[N]).")
@click.option("--memory-limit", default=None, metavar="SIZE",
              help="Memory the query may use, e.g. 4GB (default: half the machine's); past it the query fails, exit 3.")
@_force_option
@_user_errors
def query(store_path: str, sql_or_report: str, engine: str, master: str | None, baseline: str | None,
          candidate: str | None, min_runs: int | None, threshold: float | None, limit: int | None,
          output: Path | None, trace_path: Path | None, shown: int, threads: int | None, memory_limit: str | None,
          force: bool) -> None:
    """Run SQL or a named report over a bundle store, read-only: one query statement that
    reads the store (no writes, other files, extensions or settings). Reports: top-sites,
    regressions, rank-skew, coverage. Tables: events, sites, operators, partitions,
    coverage, runs, op_totals, op_ledger."""
    import re

    from dfit_mlir import store
    from dfit_mlir.errors import InvalidInputError
    from dfit_mlir.store import layout, policy, reports
    from dfit_mlir.store import output as outputs

    parameters = {"baseline": baseline, "candidate": candidate, "min_runs": min_runs, "threshold": threshold,
                  "limit": limit}
    text = sql_or_report.strip()
    if not text:
        raise InvalidInputError(f"empty query: give SQL or a report ({', '.join(sorted(store.REPORTS))})")
    is_report = text in store.REPORTS
    if not is_report and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]*", text):
        # One word is no SQL: a table's rows, else a report name (mistyped?).
        if text.lower() not in layout.TABLES:
            reports.get(text)
        text = f"SELECT * FROM {text.lower()}"
    if not is_report and any(value is not None for value in parameters.values()):
        raise InvalidInputError("--baseline/--candidate/--min-runs/--threshold/--limit go with a named report")
    # Before the query: a refused output must not cost a cluster job, and writes nothing.
    outputs.check_paths(store_path, output, trace_path, force=force)
    resources = policy.limits(threads, memory_limit)
    with store.prepare(store_path, None if is_report else text, report=text if is_report else None,
                       parameters={k: v for k, v in parameters.items() if v is not None},
                       engine=engine, master=master, threads=resources.threads,
                       memory_limit=resources.memory_bytes) as prepared:
        if output is None and trace_path is None:
            # Only what is printed is read (a count would be a scan of every row).
            head = prepared.head(shown + 1)
            click.echo(outputs.render(head, shown))
            rows = head.num_rows
        else:
            schema, batches = prepared.stream()
            written = outputs.write(schema, batches, table_path=output, trace_path=trace_path, keep=shown)
            click.echo(outputs.render(written.head, shown, total=written.rows))
            if output is not None:
                click.echo(f"wrote {output} ({written.rows} rows)")
            if trace_path is not None:
                untimed = written.rows - written.traced
                left_out = f"; {untimed} rows without start_ns left out" if untimed else ""
                click.echo(f"wrote {trace_path} ({written.traced} events{left_out})")
            rows = written.rows
        note = prepared.empty_note() if rows == 0 else None
        if note:
            click.echo(f"dfit query {text}: {note}", err=True)


@main.group("store")
def store_group() -> None:
    """Maintain a bundle store."""


@store_group.command("compact")
@click.argument("store_path", metavar="STORE", type=click.Path(path_type=Path))
@click.option("--small-events", type=click.IntRange(0, MAX_INT64), default=None,
              help="Merge a bundle's events too when it has fewer than this many (default 65536).")
@_user_errors
def store_compact(store_path: Path, small_events: int | None) -> None:
    """Merge the store's bundles into a few larger files per backend and model (queries
    open far fewer files); atomic, and safe to rerun or to interrupt."""
    from dfit_mlir.store.compact import SMALL_BUNDLE_EVENTS, compact

    done = compact(store_path, small_events=SMALL_BUNDLE_EVENTS if small_events is None else small_events)
    click.echo(f"compacted {done.runs} bundles into {done.parts} files; removed {done.removed_files} files now "
               f"merged; {done.compacted_runs} runs compacted in all")


@main.command()
@click.argument("bundles", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, help="Merged bundle directory.")
@click.option("--anchor", default=None, metavar="KIND[:NAME]",
              help="Event common to all ranks that clocks are aligned on (default: the first step, else the "
                   "first program invocation).")
@click.option("--allow-mixed", is_flag=True,
              help="Merge bundles of different models or backends (refused by default: not one job).")
@_force_option
@_user_errors
def merge(bundles: tuple[Path, ...], output: Path, anchor: str | None, allow_mixed: bool, force: bool) -> None:
    """Put the runs of one job (ranks, hosts, or the tasks of one data-parallel log) on one
    timeline: a track group per host/rank, clocks aligned, the same step linked across ranks."""
    from dfit_mlir import outputs
    from dfit_mlir.merge import merge_bundles
    from dfit_mlir.runtime_hooks.bundle import BUNDLE_KIND

    target = outputs.check(output, BUNDLE_KIND, inputs=bundles, force=force)
    # Run, reconstruct and merge bundles share the marker kind "bundle": a merge replaces
    # only a merged bundle (its summary's mode), never a run's without --force.
    other = _bundle_mode(target)
    if other not in (None, "merged") and not force:
        raise OutputRefusedError(f"{output}: refusing to overwrite: it is a dfit {other} bundle, not a merged "
                                 "bundle (use --force to replace it)")

    summary = merge_bundles(list(bundles), output, anchor=anchor, allow_mixed=allow_mixed)
    alignment = summary["alignment"]
    if len(summary["ranks"]) == 1:
        clocks = "one rank: no clocks to align"
    elif not alignment["aligned"]:
        clocks = f"clocks NOT aligned ({alignment['method']}): each rank keeps its own clock"
    elif alignment["residual_ns"] is None:
        clocks = f"clocks aligned by {alignment['method']} ({alignment['residual_note']})"
    else:
        clocks = f"clocks aligned by {alignment['method']} (residual {alignment['residual_ns']} ns)"
    mixed = " [mixed models/backends: --allow-mixed]" if summary["mixed"] else ""
    click.echo(f"wrote {output}: {len(summary['ranks'])} ranks, {clocks}, {summary['linked_steps']} steps "
               f"linked{mixed}")


def _bundle_mode(directory: Path) -> str | None:
    """The mode a bundle's summary records (run modes, ``reconstructed``, ``merged``);
    None: no bundle summary there."""
    from dfit_mlir import outputs

    summary = outputs.run_summary(directory)
    if summary is None:
        return None
    mode = summary.get("mode")
    return str(mode) if mode in ("merged", "reconstructed") else f"run ({mode})" if mode else "run"


@main.command()
@click.argument("manifest_path", type=click.Path(path_type=Path))
@click.option("--dispatches/--no-dispatches", default=True, help="Also list dispatch call sites.")
@click.option("--passes", "pass_ids", multiple=True, metavar="ID",
              help="Print the lineage history of this ID (a glob; repeatable): its class at each phase and each "
                   "pass that changed it (manifests of `dfit compile --lineage passes`).")
@_user_errors
def show(manifest_path: Path, dispatches: bool, pass_ids: tuple[str, ...]) -> None:
    """Summarise a manifest: per-phase attribution, lineage and dispatches."""
    from dfit_mlir import manifest
    from dfit_mlir.report import attribution_summary, dispatch_summary

    document = manifest.load(manifest_path)
    if pass_ids:
        from dfit_mlir.report import pass_histories

        click.echo(pass_histories(document, pass_ids, manifest_path))
        return
    click.echo(attribution_summary(document))
    if dispatches:
        click.echo(dispatch_summary(document))


if __name__ == "__main__":
    main()
