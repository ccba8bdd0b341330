"""``dfit analyze``, ``tools``, ``diff``, ``export-explorer``, ``view`` and ``show``: reading one bundle (or two)."""

from __future__ import annotations

from pathlib import Path

import click

from dfit_mlir.cli.contract import MAX_ROWS, force_option, user_errors
from dfit_mlir.core import atomic


@click.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--tool", "tool_names", multiple=True,
              help="Tool to run (repeatable; `all` for every built-in); see `dfit tools`.")
@click.option("--time-model", "time_model", type=click.Choice(["cached", "measured"]), default="cached",
              show_default=True,
              help="measured: first compile each op of the hottest dispatches alone, time it on this device "
                   "and cache it (minutes); the split then follows those timings (measured-standalone, else "
                   "calibrated-elementwise). cached: use such timings where a measurement was cached, "
                   "else the roofline.")
@click.option("--measure-top", "measure_top", type=click.IntRange(0, MAX_ROWS), default=5, show_default=True,
              help="With --time-model measured: the dispatches taken apart, longest first (0: all).")
@click.option("--measure-repeat", "measure_repeat", type=click.IntRange(3, 100_000), default=100,
              show_default=True, help="With --time-model measured: timed invocations per op (medians).")
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
@force_option
@user_errors
def analyze(bundle: Path, tool_names: tuple[str, ...], time_model: str, measure_top: int, measure_repeat: int,
            out_dir: Path | None, raw_options: tuple[str, ...], framework_code: tuple[str, ...],
            model_code: tuple[str, ...], explain_sites: tuple[str, ...], force: bool) -> None:
    """Run analysis tools over a run/reconstruct bundle or a compile's manifest."""
    from dfit_mlir.analysis.tools import registry
    from dfit_mlir.analysis.tools.session import analyze as run_tools
    from dfit_mlir.core.errors import InvalidInputError

    if not tool_names and time_model != "measured":
        raise InvalidInputError("give --tool (see `dfit tools`), or --time-model measured to measure op costs")
    if time_model == "measured":
        if not bundle.is_dir():
            raise InvalidInputError(f"{bundle}: --time-model measured needs a run bundle (a directory)")
        _measure_op_costs(bundle, measure_top, measure_repeat)
    if not tool_names:
        return
    names = list(registry.BUILTIN) if "all" in tool_names else list(dict.fromkeys(tool_names))
    options: dict[str, dict[str, str]] = {}
    for raw in raw_options:
        key, sep, value = raw.partition("=")
        tool, dot, name = key.partition(".")
        if not sep or not dot or not name:
            raise InvalidInputError(f"--option {raw!r}: expected TOOL.KEY=VALUE")
        given = options.setdefault(tool, {}).get(name)
        if given is not None and given != value:  # the last one silently won, dropping the first
            raise InvalidInputError(f"--option {key} is given twice ({given!r}, then {value!r}): give it once "
                                    f"(several values as one list, e.g. {key}=A,B)")
        options[tool][name] = value
    if not bundle.exists():
        raise InvalidInputError(f"{bundle}: no such file or directory")
    for key, globs in (("framework_code", framework_code), ("model_code", model_code)):
        if globs:
            given = options.setdefault("semantic-attribution", {}).get(key)
            options["semantic-attribution"][key] = ",".join(([given] if given else []) + list(globs))
    if out_dir is None:
        out_dir = bundle / "analysis" if bundle.is_dir() else bundle.with_name(bundle.name.split(".")[0] + ".analysis")
    from dfit_mlir.core import outputs

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
        from dfit_mlir.analysis.model import SemanticModel
        from dfit_mlir.analysis.tools.builtin.semantic_attribution import explain_site
        from dfit_mlir.frontends import CodeRules, parse_globs

        rules = CodeRules.default().extended(framework=parse_globs(framework_code), model=parse_globs(model_code))
        semantic = SemanticModel.open(bundle)
        for site in explain_sites:
            click.echo(explain_site(semantic, site, rules))


def _measure_op_costs(bundle: Path, top: int, repeat: int) -> None:
    """Time the ops of the bundle's ``top`` longest dispatches alone on this device and
    cache them (:mod:`dfit_mlir.analysis.op_timing`)."""
    from dfit_mlir.analysis import ledger, op_timing
    from dfit_mlir.analysis.model import SemanticModel

    model = SemanticModel.open(bundle)
    book = ledger.Ledger(model, time_model=ledger.time_model_for(model))  # the roofline's: ranks by time only
    timed = [p for p in model.partitions if p.kind == "dispatch" and book.partition_ns(p.id) > 0]
    timed.sort(key=lambda p: -book.partition_ns(p.id))
    chosen = timed[:top] if top else timed
    report = op_timing.measure(model, chosen, repeat=repeat, progress=lambda line: click.echo(line, err=True))
    for line in report.lines():
        click.echo(line)


@click.command()
@user_errors
def tools() -> None:
    """List analysis tools (built-in and `dfit.tools` plugins)."""
    from dfit_mlir.analysis.tools.registry import providers

    for name, provider in sorted(providers().items()):
        cls = provider.load()
        click.echo(f"{name:<22} {provider.origin:<12} {cls.description}")


@click.command()
@click.argument("bundle_a", type=click.Path(path_type=Path))
@click.argument("bundle_b", type=click.Path(path_type=Path))
@click.option("-o", "--output", "out_dir", type=click.Path(path_type=Path), default=None,
              help="Also write diff.csv and diff.json into this folder.")
@click.option("--json", "as_json", is_flag=True, help="Print the diff as JSON instead of a table.")
@click.option("--limit", type=click.IntRange(0, MAX_ROWS), default=40, show_default=True,
              help="Rows shown in the table, most changed first (0: all).")
@force_option
@user_errors
def diff(bundle_a: Path, bundle_b: Path, out_dir: Path | None, as_json: bool, limit: int, force: bool) -> None:
    """What changed per stable ID between two bundles or manifests — ops, shapes, fusion,
    lineage, attributed time outside the runs' spread, bytes (matched within a module path
    by ID, else structural hash, else op kind; else by tensor name), most changed first —
    and in the generated code (target, flags, executables)."""
    from dfit_mlir.core import outputs
    from dfit_mlir.fleet import diff as bundle_diff

    if out_dir is not None:
        outputs.check(out_dir, "diff", inputs=[bundle_a, bundle_b], force=force)
    result = bundle_diff.diff_bundles(bundle_a, bundle_b)
    written = bundle_diff.write(result, out_dir) if out_dir is not None else []
    click.echo(bundle_diff.to_json(result).rstrip() if as_json
               else bundle_diff.render(result, limit or None, written[0] if written else None))
    for path in written:
        click.echo(f"wrote {path}", err=as_json)


@click.command("export-explorer")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True,
              help="Node data file; with several metrics, one NAME.<metric>.json each.")
@click.option("--metric", "metrics", default="macs", show_default=True,
              help="Comma-separated: macs, flops (per trip), bytes, time, executed_flops (per invocation, "
                   "every trip), partition, module, phase.")
@click.option("--key", type=click.Choice(["name", "id"]), default="name", show_default=True,
              help="Node key: the op's tensor/location name (TFLite, MLIR graphs) or its dfit ID.")
@force_option
@user_errors
def export_explorer(bundle: Path, output: Path, metrics: str, key: str, force: bool) -> None:
    """Per-op metrics as Model Explorer node data (load it beside the model's graph)."""
    from dfit_mlir.core import outputs
    from dfit_mlir.views import model_explorer

    for path in model_explorer.output_paths(output, metrics).values():
        outputs.check(path, model_explorer.OUTPUT_KIND, inputs=[bundle], force=force, directory=False)

    for exported in model_explorer.export(bundle, output, metrics=metrics, key=key):
        empty = "" if exported.nodes else f" (the bundle has no {exported.metric} values)"
        click.echo(f"wrote {exported.path}: {exported.metric} for {exported.nodes} nodes{empty}")


@click.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="The HTML file to write (self-contained: opens from disk, no network).")
@click.option("--model-explorer", "model_explorer", is_flag=True,
              help="Start Model Explorer on the bundle with dfit's extension instead of writing HTML.")
@force_option
@user_errors
def view(bundle: Path, output: Path | None, model_explorer: bool, force: bool) -> None:
    """One HTML page linking source lines, module tree, IREE phases and dispatches of a
    run/reconstruct bundle or a compile manifest (figures from the ledger)."""
    from dfit_mlir.core import outputs
    from dfit_mlir.core.errors import InvalidInputError

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



@click.command()
@click.argument("manifest_path", type=click.Path(path_type=Path))
@click.option("--dispatches/--no-dispatches", default=True, help="Also list dispatch call sites.")
@click.option("--passes", "pass_ids", multiple=True, metavar="ID",
              help="Print the lineage history of this ID (a glob; repeatable): its class at each phase and each "
                   "pass that changed it (manifests of `dfit compile --lineage passes`).")
@user_errors
def show(manifest_path: Path, dispatches: bool, pass_ids: tuple[str, ...]) -> None:
    """Summarise a manifest: per-phase attribution, lineage and dispatches."""
    from dfit_mlir.core import manifest
    from dfit_mlir.passes.compile_report import attribution_summary, dispatch_summary

    document = manifest.load(manifest_path)
    if pass_ids:
        from dfit_mlir.passes.compile_report import pass_histories

        click.echo(pass_histories(document, pass_ids, manifest_path))
        return
    click.echo(attribution_summary(document))
    if dispatches:
        click.echo(dispatch_summary(document))

