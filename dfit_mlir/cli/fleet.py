"""``dfit collect``, ``query``, ``store compact`` and ``merge``: many bundles at once."""

from __future__ import annotations

from pathlib import Path

import click

from dfit_mlir.cli.contract import MAX_INT64, MAX_ROWS, force_option, user_errors
from dfit_mlir.core.errors import OutputRefusedError
from dfit_mlir.fleet.placement import MAX_RANK


@click.command()
@click.argument("bundles", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--output", "store_path", type=click.Path(path_type=Path), required=True,
              help="Store directory (created when absent).")
@click.option("--label", default=None, help="Commit or label of these runs (what `query regressions` compares).")
@click.option("--host", default=None, help="Host the bundles ran on (default: what the bundle says).")
@click.option("--rank", type=click.IntRange(0, MAX_RANK), default=None,
              help="Rank of the bundles in a multi-rank job (default: per event where the bundle says).")
@click.option("--model", default=None, help="Model name (default: the manifest input's name).")
@user_errors
def collect(bundles: tuple[Path, ...], store_path: Path, label: str | None, host: str | None, rank: int | None,
            model: str | None) -> None:
    """Add run / reconstruct bundles and compile manifests to a bundle store (Parquet,
    Hive-partitioned by backend, model and run); a bundle already there is skipped."""
    from dfit_mlir.core import outputs
    from dfit_mlir.fleet.store import Placement
    from dfit_mlir.fleet.store import collect as collect_bundles

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


@click.command()
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
@force_option
@user_errors
def query(store_path: str, sql_or_report: str, engine: str, master: str | None, baseline: str | None,
          candidate: str | None, min_runs: int | None, threshold: float | None, limit: int | None,
          output: Path | None, trace_path: Path | None, shown: int, threads: int | None, memory_limit: str | None,
          force: bool) -> None:
    """Run SQL or a named report over a bundle store, read-only: one query statement that
    reads the store (no writes, other files, extensions or settings). Reports: top-sites,
    regressions, rank-skew, coverage. Tables: events, sites, operators, partitions,
    coverage, runs, op_totals, op_ledger."""
    import re

    from dfit_mlir.core.errors import InvalidInputError
    from dfit_mlir.fleet import store
    from dfit_mlir.fleet.store import layout, policy, reports
    from dfit_mlir.fleet.store import output as outputs

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


@click.group("store")
def store_group() -> None:
    """Maintain a bundle store."""


@store_group.command("compact")
@click.argument("store_path", metavar="STORE", type=click.Path(path_type=Path))
@click.option("--small-events", type=click.IntRange(0, MAX_INT64), default=None,
              help="Merge a bundle's events too when it has fewer than this many (default 65536).")
@user_errors
def store_compact(store_path: Path, small_events: int | None) -> None:
    """Merge the store's bundles into a few larger files per backend and model (queries
    open far fewer files); atomic, and safe to rerun or to interrupt."""
    from dfit_mlir.fleet.store.compact import SMALL_BUNDLE_EVENTS, compact

    done = compact(store_path, small_events=SMALL_BUNDLE_EVENTS if small_events is None else small_events)
    click.echo(f"compacted {done.runs} bundles into {done.parts} files; removed {done.removed_files} files now "
               f"merged; {done.compacted_runs} runs compacted in all")


@click.command()
@click.argument("bundles", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True, help="Merged bundle directory.")
@click.option("--anchor", default=None, metavar="KIND[:NAME]",
              help="Event common to all ranks that clocks are aligned on (default: the first step, else the "
                   "first program invocation).")
@click.option("--allow-mixed", is_flag=True,
              help="Merge bundles of different models or backends (refused by default: not one job).")
@force_option
@user_errors
def merge(bundles: tuple[Path, ...], output: Path, anchor: str | None, allow_mixed: bool, force: bool) -> None:
    """Put the runs of one job (ranks, hosts, or the tasks of one data-parallel log) on one
    timeline: a track group per host/rank, clocks aligned, the same step linked across ranks."""
    from dfit_mlir.core import outputs
    from dfit_mlir.exporters.bundle import BUNDLE_KIND
    from dfit_mlir.fleet.merge import merge_bundles

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
    from dfit_mlir.core import outputs

    summary = outputs.run_summary(directory)
    if summary is None:
        return None
    mode = summary.get("mode")
    return str(mode) if mode in ("merged", "reconstructed") else f"run ({mode})" if mode else "run"
