"""``dfit run``, ``dfit reconstruct`` and ``dfit backends``: bundles from runs and from vendor dumps."""

from __future__ import annotations

from pathlib import Path

import click

from dfit_mlir.cli.contract import (
    MAX_REPEAT,
    MAX_TENSOR_VALUES,
    MIN_SAMPLE,
    FiniteFloat,
    force_option,
    require_file,
    user_errors,
)
from dfit_mlir.fleet.placement import MAX_CLOCK_OFFSET_NS, MAX_RANK


@click.command()
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
@click.option("--driver", default="local-task", show_default=True, metavar="DRIVER|URI",
              help="IREE HAL driver or device URI: local-task, local-sync, vulkan, cuda, hip, or vulkan://0, "
                   "cuda://GPU-<uuid>; it must be one the vmfb was compiled for, with a device here.")
@click.option("--function", default=None,
              help="Exported function to run (default: the module's only one; the error lists them).")
@click.option("--ids", "id_globs", multiple=True,
              help="Keep only dispatches and events of ops matching this glob (repeatable or comma-separated; IDs, "
                   "op names such as onnx.Conv, module paths; ignoring case). A glob matching no op is an error.")
@click.option("--sample", type=FiniteFloat(MIN_SAMPLE, 1), default=1.0, show_default=True,
              help="Share of dispatch and tensor events to keep (deterministic: every round(1/RATE)-th; "
                   "tensors: per ID, so each traced ID is sampled).")
@click.option("--max-events", type=click.IntRange(0, 1 << 62), default=None,
              help="Event budget: events past it are dropped and counted in summary.json.")
@click.option("--trace-all", is_flag=True,
              help="Draw every event in trace.pftrace and trace.json. By default a run of more than 1,000,000 "
                   "events (≈200 MB of trace.pftrace) keeps its first and last invocations in full (as many as "
                   "hold 500,000 events) and draws each invocation between as one summary slice; summary.json "
                   "says which (its 'trace' entry).")
@click.option("--max-input-bytes", "max_input_bytes", default=None, metavar="SIZE",
              help="Memory the given inputs may take together, e.g. 64GB (default: a quarter of the machine's); "
                   "a larger input is refused before it is allocated.")
@click.option("--host", default=None, help="The host this run is part of a job on (default: this machine's name).")
@click.option("--rank", type=click.IntRange(0, MAX_RANK), default=None, help="Its rank in a multi-rank job.")
@click.option("--clock-offset-ns", type=click.IntRange(-MAX_CLOCK_OFFSET_NS, MAX_CLOCK_OFFSET_NS), default=None,
              help="What to add to this run's times to get the job's clock (dfit merge aligns by it when every "
                   "bundle has one).")
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, help="Bundle directory.")
@force_option
@user_errors
def run(vmfb: Path, manifest_path: Path | None, mode: str, tensor_filter: str | None, tensor_values: int,
        inputs: tuple[str, ...], inputs_from: Path | None, repeat: int, warmup: int, driver: str,
        function: str | None, id_globs: tuple[str, ...], sample: float, max_events: int | None, trace_all: bool,
        max_input_bytes: str | None, host: str | None, rank: int | None, clock_offset_ns: int | None, output: Path, force: bool) -> None:
    """Run a compiled module, join runtime events to IDs, write a run bundle.

    The HAL profile (--mode full) and the run's scratch columns go to $TMPDIR, in a
    dfit-run-* folder removed when the run ends: a few KB an invocation for a model of a
    few dispatches (about 3.7 KB for the bundled demo; more events an invocation, more
    KB), so for a long run set TMPDIR to a folder with room.
    """
    import socket

    from dfit_mlir.core import manifest
    from dfit_mlir.core.errors import InvalidInputError
    from dfit_mlir.core.event_pipeline import Policy
    from dfit_mlir.core.filters import NameFilter
    from dfit_mlir.fleet.store.policy import parse_size
    from dfit_mlir.runtime_hooks.inputs import inputs_from as read_inputs_dir
    from dfit_mlir.runtime_hooks.run import run_bundle

    if inputs and inputs_from:
        raise InvalidInputError("give either --input or --inputs-from, not both")
    if manifest_path is not None and not manifest_path.is_file():
        raise InvalidInputError(f"{manifest_path}: no such file (--manifest)")
    from dfit_mlir.core import outputs

    require_file(vmfb, "vmfb")
    manifest_path = manifest_path or manifest.default_path(vmfb)
    input_files = [Path(text[1:]) for text in inputs if text.startswith("@")]
    # Resolved: `-o .` names the folder itself, which is renamed away when it is replaced.
    output = outputs.check(output, "bundle", inputs=[vmfb, manifest_path, inputs_from, *input_files], force=force)
    sample_every = max(1, round(1 / sample))
    policy = Policy(mode=mode, ids=NameFilter.parse(id_globs, "--ids").patterns if id_globs else (),
                    sample_every=sample_every, max_events=max_events, trace_all=trace_all)
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
                                   "clock_offset_ns": clock_offset_ns},
                        max_input_bytes=None if max_input_bytes is None else parse_size(max_input_bytes,
                                                                                        "--max-input-bytes"))
    counts = result.summary["counts"]
    timing = result.summary.get("invocation_ns") or {}
    # iree-benchmark-module (full mode) reports a mean per invocation, no distribution;
    # the in-process modes time every call.
    if timing and result.summary.get("timing_harness") == "iree-benchmark-module":
        median = f", mean invocation {timing['mean'] / 1e6:.3f} ms (iree-benchmark-module)"
    else:
        median = f", median invocation {timing['median'] / 1e6:.3f} ms" if timing else ""
    dropped = result.summary["dropped_events"]
    slices = result.summary["trace_slices"]
    # A run that kept no event (a `none` run, or every event filtered out) has nothing to open.
    traces = f"{slices} trace slices; open trace.pftrace in the Perfetto UI" if slices else "no trace slices to draw"
    click.echo(f"wrote {result.bundle}: {counts['kept']} events of {counts['seen']} seen, {dropped} dropped"
               f"{median} ({traces})")
    for made in result.summary.get("inputs", ()):
        if made.get("dynamic"):
            click.echo(f"note: {made['dynamic']}", err=True)
        if made.get("made") == "all-true":  # a made-up mask: said, as it decides what the model computes
            click.echo(f"note: {made['reason']}", err=True)
    if mode == "lite" and not result.summary.get("module_has_probes"):
        click.echo("note: the module has no function probes (compile it with --mode lite or --probes): "
                   "program events only", err=True)


@click.command()
@click.argument("dumps", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--backend", default="auto", show_default=True,
              help="auto (detect from the files' content) or a backend name (see `dfit backends`).")
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, help="Bundle directory.")
@force_option
@user_errors
def reconstruct(dumps: tuple[Path, ...], backend: str, output: Path, force: bool) -> None:
    """Rebuild the semantic model from a closed backend's artifacts (files or directories)
    and write the same bundle an IREE run writes, with a coverage report."""
    from dfit_mlir.adapters.reconstruct import reconstruct_bundle
    from dfit_mlir.core import outputs
    from dfit_mlir.core.errors import InvalidInputError

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


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the descriptors as JSON.")
@user_errors
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
