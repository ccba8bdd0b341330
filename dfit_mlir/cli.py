"""The ``dfit`` command line."""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any, Callable

import click

from dfit_mlir.errors import DfitError


def _user_errors(command: Callable[..., Any]) -> Callable[..., Any]:
    """Turn :class:`DfitError` into its message on stderr and its exit status."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except DfitError as error:
            click.echo(f"dfit: {error}" if "\n" not in str(error) else str(error), err=True)
            sys.exit(error.exit_code)
        except BrokenPipeError:  # `dfit backends | head`
            sys.exit(0)
        except OSError as error:
            click.echo(f"dfit: {error.filename or ''}: {error.strerror}", err=True)
            sys.exit(2)

    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
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
@click.pass_context
@_user_errors
def compile(ctx: click.Context, source: Path, tag: bool, mode: str, probes: bool | None, tensor_filter: str | None,
            output: Path, manifest_path: Path | None, driver: str | None) -> None:
    """Compile with iree-compile; with --dfit-tag also write the manifest. Any other
    option is passed to iree-compile."""
    from dfit_mlir.errors import InvalidInputError

    flags = list(ctx.args)
    if tensor_filter is not None and not tag:
        raise InvalidInputError("--tensors needs --dfit-tag (traces are keyed by dfit IDs)")
    if not tag:
        from dfit_mlir.passes.plain_compile import plain_compile

        plain_compile(source, output, flags)
        return
    from dfit_mlir.passes.instrumented_compile import compile_instrumented
    from dfit_mlir.passes.tensor_traces import parse_filter
    from dfit_mlir.report import attribution_summary

    try:
        tensors = parse_filter(tensor_filter) if tensor_filter is not None else ()
    except ValueError as error:
        raise InvalidInputError(str(error)) from None
    result = compile_instrumented(source, output, mode=mode, flags=flags, manifest_path=manifest_path,
                                  driver_name=driver, trace_tensors=tensors, probes=probes)
    click.echo(f"wrote {result.vmfb}")
    click.echo(f"wrote {result.manifest_path}")
    click.echo(attribution_summary(result.manifest))
    if tensors:
        traced = result.manifest["tensor_traces"]
        skipped = result.manifest["tensor_traces_skipped"]
        click.echo(f"tensor traces: {len(traced)} ops" + (f" ({len(skipped)} matched but skipped: "
                   + "; ".join(f"{s['id']}: {s['reason']}" for s in skipped[:3]) + ")" if skipped else ""))


@main.command()
@click.argument("source", type=click.Path(path_type=Path))
@click.option("--dfit-tag", "tag", is_flag=True, help="Short form of --pass-pipeline='builtin.module(dfit-tag)'.")
@click.option("--pass-pipeline", default=None, help="e.g. 'builtin.module(dfit-tag,canonicalize,cse)'.")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None, help="Output file (default: stdout).")
@click.option("--debuginfo/--no-debuginfo", default=True, show_default=True, help="Print locations.")
@click.option("--allow-unregistered-dialect", is_flag=True, help="Accept ops of dialects IREE does not know.")
@_user_errors
def opt(source: Path, tag: bool, pass_pipeline: str | None, output: Path | None, debuginfo: bool,
        allow_unregistered_dialect: bool) -> None:
    """Run a pass pipeline mixing dfit passes with the bundled MLIR/IREE passes."""
    from iree.compiler import ir

    from dfit_mlir.errors import CompileError, InvalidInputError
    from dfit_mlir.passes.phases import compiler_context, parse_file
    from dfit_mlir.passes.pipeline import build_pass_manager

    if tag and pass_pipeline:
        raise InvalidInputError("give either --dfit-tag or --pass-pipeline, not both")
    pipeline = pass_pipeline or ("builtin.module(dfit-tag)" if tag else "builtin.module()")
    session, context = compiler_context(allow_unregistered_dialect)
    module = parse_file(context, source)
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
        from dfit_mlir import atomic

        atomic.write_text(output, text)
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
@click.option("--tensor-values", type=int, default=0, show_default=True,
              help="Leading values kept per tensor event.")
@click.option("--input", "inputs", multiple=True, help="iree-run-module form: 1x3xf32=0.5 or @x.npy (default: random).")
@click.option("--inputs-from", type=click.Path(path_type=Path), default=None, help="A directory of .npy inputs, in name order.")
@click.option("--repeat", type=int, default=1, show_default=True, help="Invocations to record.")
@click.option("--warmup", type=int, default=0, show_default=True, help="Invocations to run first, unrecorded.")
@click.option("--driver", type=click.Choice(["local-task", "local-sync"]), default="local-task", show_default=True)
@click.option("--function", default=None, help="Function to run (default: the module's only one).")
@click.option("--ids", "id_globs", multiple=True,
              help="Keep only dispatches and events of ops matching this glob (repeatable or comma-separated; IDs, "
                   "op names such as onnx.Conv, module paths; ignoring case). A glob matching no op is an error.")
@click.option("--sample", type=click.FloatRange(0, 1, min_open=True), default=1.0, show_default=True,
              help="Share of dispatch and tensor events to keep (deterministic: every round(1/RATE)-th; "
                   "tensors: per ID, so each traced ID is sampled).")
@click.option("--max-events", type=click.IntRange(min=0), default=None,
              help="Event budget: events past it are dropped and counted in summary.json.")
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, help="Bundle directory.")
@_user_errors
def run(vmfb: Path, manifest_path: Path | None, mode: str, tensor_filter: str | None, tensor_values: int,
        inputs: tuple[str, ...], inputs_from: Path | None, repeat: int, warmup: int, driver: str,
        function: str | None, id_globs: tuple[str, ...], sample: float, max_events: int | None,
        output: Path) -> None:
    """Run a compiled module, join runtime events to IDs, write a run bundle."""
    from dfit_mlir import manifest
    from dfit_mlir.errors import InvalidInputError
    from dfit_mlir.event_pipeline import Policy
    from dfit_mlir.filters import NameFilter
    from dfit_mlir.runtime_hooks.inputs import inputs_from as read_inputs_dir
    from dfit_mlir.runtime_hooks.run import run_bundle

    if inputs and inputs_from:
        raise InvalidInputError("give either --input or --inputs-from, not both")
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
    result = run_bundle(vmfb, manifest_path or manifest.default_path(vmfb), output, mode=mode,
                        inputs=read_inputs_dir(inputs_from) if inputs_from else inputs, repeat=repeat,
                        warmup=warmup, driver=driver, function=function, policy=policy, tensors=tensors)
    counts = result.summary["counts"]
    timing = result.summary.get("invocation_ns") or {}
    median = f", median invocation {timing['median'] / 1e6:.3f} ms" if timing else ""
    dropped = result.summary["dropped_events"]
    click.echo(f"wrote {result.bundle}: {counts['kept']} events of {counts['seen']} seen, {dropped} dropped"
               f"{median} ({result.summary['trace_slices']} trace slices; open trace.pftrace in the Perfetto UI)")
    if mode == "lite" and not result.summary.get("module_has_probes"):
        click.echo("note: the module has no function probes (compile it with --mode lite or --probes): "
                   "program events only", err=True)


@main.command()
@click.argument("dumps", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--backend", default="auto", show_default=True,
              help="auto (detect from the files' content) or a backend name (see `dfit backends`).")
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, help="Bundle directory.")
@_user_errors
def reconstruct(dumps: tuple[Path, ...], backend: str, output: Path) -> None:
    """Rebuild the semantic model from a closed backend's artifacts (files or directories)
    and write the same bundle an IREE run writes, with a coverage report."""
    from dfit_mlir.reconstruct import reconstruct_bundle

    summary = reconstruct_bundle(list(dumps), output, backend)
    recovered = summary["recovered"]
    click.echo(f"wrote {output}: {summary['backend']} ({'detected' if summary['detected'] else 'given'}), "
               f"{recovered['operators']} operators, {recovered['tensors']} tensors, {recovered['partitions']} "
               f"partitions, {recovered['measurements']} measurements from {len(summary['sources'])} file(s)")
    for aspect, status in summary["coverage"].items():
        click.echo(f"  {aspect:<22} {status}")


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
@_user_errors
def analyze(bundle: Path, tool_names: tuple[str, ...], out_dir: Path | None, raw_options: tuple[str, ...]) -> None:
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
    if out_dir is None:
        out_dir = bundle / "analysis" if bundle.is_dir() else bundle.with_name(bundle.name.split(".")[0] + ".analysis")
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
@click.option("--limit", type=click.IntRange(min=0), default=40, show_default=True,
              help="Rows shown in the table, most changed first (0: all).")
@_user_errors
def diff(bundle_a: Path, bundle_b: Path, out_dir: Path | None, as_json: bool, limit: int) -> None:
    """What changed per stable ID between two bundles or manifests — ops, shapes, fusion,
    lineage, attributed time, bytes (matched by ID, else structural hash, else tensor
    name), most changed first — and in the generated code (target, flags, executables)."""
    from dfit_mlir import diff as bundle_diff

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
              help="Comma-separated: macs, flops, bytes, time, partition.")
@click.option("--key", type=click.Choice(["name", "id"]), default="name", show_default=True,
              help="Node key: the op's tensor/location name (TFLite, MLIR graphs) or its dfit ID.")
@_user_errors
def export_explorer(bundle: Path, output: Path, metrics: str, key: str) -> None:
    """Per-op metrics as Model Explorer node data (load it beside the model's graph)."""
    from dfit_mlir import model_explorer

    for exported in model_explorer.export(bundle, output, metrics=metrics, key=key):
        empty = "" if exported.nodes else f" (the bundle has no {exported.metric} values)"
        click.echo(f"wrote {exported.path}: {exported.metric} for {exported.nodes} nodes{empty}")


@main.command()
@click.argument("manifest_path", type=click.Path(path_type=Path))
@click.option("--dispatches/--no-dispatches", default=True, help="Also list dispatch call sites.")
@_user_errors
def show(manifest_path: Path, dispatches: bool) -> None:
    """Summarise a manifest: per-phase attribution, lineage and dispatches."""
    from dfit_mlir import manifest
    from dfit_mlir.report import attribution_summary, dispatch_summary

    document = manifest.load(manifest_path)
    click.echo(attribution_summary(document))
    if dispatches:
        click.echo(dispatch_summary(document))


if __name__ == "__main__":
    main()
