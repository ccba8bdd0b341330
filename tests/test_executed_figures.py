"""Executed figures (issue 28: "loops count once in the tables while time counts every
trip"). Static figures (``flops``, ``transcendentals``) stay **per trip**; every table of
``dfit analyze`` (``sites.csv``, ``modules.csv``, ``phases.csv``, ``partitions.csv``),
the flame graph's tooltips and the view add the run's **executed** work (per trip × the
run's dispatch events) over the whole run and per invocation, computed in the ledger
only; empty, never 0, where nothing counted executions.

The must-show: a JAX GRU training step whose recurrence runs under ``lax.scan`` (forward
and backward loops), compiled from the shell with ``dfit compile --dfit-tag``, run with
``dfit run`` and analyzed: its executed FLOPs per invocation within ±5 % of XLA's
``cost_analysis()["flops"]`` of the same program with the loop unrolled (a Python loop
over the same cell), the scan's modules at executed = per trip × trip count, and the
per-trip figures unchanged (the manifest alone gives the same ``flops``; XLA counts a
``while`` body once as well).

Where the run counted no executions (a manifest alone, ``--mode none/ids/lite``, a
sampled run), the manifest's static trip counts stand in (``executed_basis`` ``manifest
trips``): the GRU manifest's executed FLOPs per invocation equal its run's; a whole-run
figure needs a run's count of invocations. A ``lax.while_loop`` bounded by an input has no
static trip count: its figures stay unknown, and say which site."""

from __future__ import annotations

import functools
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dfit_mlir.analysis import ledger
from dfit_mlir.analysis.model import SemanticModel
from dfit_mlir.analysis.tools.builtin.semantic_attribution import EXECUTED_COLUMNS
from dfit_mlir.analysis.tools.session import analyze
from tests.conftest import read_csv

#: The executed columns over the whole run (``executed_flops_per_invocation`` aside).
WHOLE_RUN_COLUMNS = tuple(column for column in EXECUTED_COLUMNS if column != ledger.PER_INVOCATION)

#: Trips of the scan (time steps), and invocations recorded.
TRIPS = 6
REPEAT = 3
#: The bound the issue sets: executed FLOPs per invocation against XLA's unrolled count.
TOLERANCE = 0.05

GRU_STEP = f'''"""A GRU training step: the recurrence under lax.scan (or, unrolled=True, a Python
loop over the same cell), a dense head, a squared-error loss, an SGD update."""
import jax
import jax.numpy as jnp

T, B, I, H = {TRIPS}, 4, 8, 16


def gru_cell(p, h, x):
    with jax.named_scope("gates"):
        z = jax.nn.sigmoid(x @ p["wz"] + h @ p["uz"] + p["bz"])
        r = jax.nn.sigmoid(x @ p["wr"] + h @ p["ur"] + p["br"])
    with jax.named_scope("candidate"):
        c = jnp.tanh(x @ p["wc"] + (r * h) @ p["uc"] + p["bc"])
    return (1 - z) * h + z * c


def loss_fn(params, xs, y, unrolled=False):
    with jax.named_scope("gru"):
        h = jnp.zeros((B, H))
        if unrolled:
            for t in range(T):
                h = gru_cell(params["gru"], h, xs[t])
        else:
            h, _ = jax.lax.scan(lambda h, x: (gru_cell(params["gru"], h, x), None), h, xs)
    with jax.named_scope("head"):
        out = h @ params["head"]
    with jax.named_scope("loss"):
        return jnp.mean((out - y) ** 2)


def train_step(params, xs, y, unrolled=False):
    loss, grads = jax.value_and_grad(loss_fn)(params, xs, y, unrolled)
    with jax.named_scope("optimizer"):
        params = jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads)
    return params, loss


def make_step():
    shapes = {{"wz": (I, H), "uz": (H, H), "bz": (H,), "wr": (I, H), "ur": (H, H), "br": (H,),
               "wc": (I, H), "uc": (H, H), "bc": (H,)}}
    gru_key, head_key = jax.random.split(jax.random.PRNGKey(0))
    gru = {{name: jax.random.normal(key, shape) * 0.2
            for key, (name, shape) in zip(jax.random.split(gru_key, len(shapes)), shapes.items())}}
    params = {{"gru": gru, "head": jax.random.normal(head_key, (H, 2)) * 0.2}}
    return train_step, (params, jnp.ones((T, B, I)), jnp.zeros((B, 2)))
'''


def dfit(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "dfit_mlir", *args], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def _xla_cost(step: Any, args: tuple[Any, ...]) -> dict[str, float]:
    """XLA's ``cost_analysis()`` of the compiled step (a list of one dict on older jax)."""
    import jax

    found = jax.jit(step).lower(*args).compile().cost_analysis()
    return found[0] if isinstance(found, list) else found


@pytest.fixture(scope="module")
def gru(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The GRU step compiled, run and analyzed through the shell (and the manifest alone),
    and XLA's counts of it rolled (the scan) and unrolled."""
    pytest.importorskip("jax")
    root = tmp_path_factory.mktemp("gru")
    source = root / "gru_step.py"
    source.write_text(GRU_STEP)
    vmfb = root / "gru.vmfb"
    dfit("compile", str(source), "--dfit-tag", "--mode", "ids", "-o", str(vmfb))
    dfit("run", str(vmfb), "--mode", "full", "--repeat", str(REPEAT), "--warmup", "1", "-o", str(root / "run"))
    dfit("analyze", str(root / "run"), "--tool", "semantic-attribution", "--out", str(root / "analysis"))
    static_notes = dfit("analyze", str(vmfb.with_suffix(".manifest.json")), "--tool", "semantic-attribution",
                        "--out", str(root / "static"))
    spec = importlib.util.spec_from_file_location("dfit_test_gru_step", source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    step, args = module.make_step()
    out, static = root / "analysis" / "semantic-attribution", root / "static" / "semantic-attribution"
    return {
        "bundle": root / "run", "manifest": vmfb.with_suffix(".manifest.json"), "out": out, "static": static,
        "static_notes": static_notes,
        "xla_unrolled": _xla_cost(functools.partial(step, unrolled=True), args),
        "xla_scan": _xla_cost(step, args),
        "summary": json.loads((out / "summary.json").read_text()),
        "modules": {row["module_path"]: row for row in read_csv(out / "modules.csv")},
        "static_modules": {row["module_path"]: row for row in read_csv(static / "modules.csv")},
    }


@pytest.mark.frontends
@pytest.mark.slow
def test_gru_step_executed_flops_match_xla_unrolled(gru: dict[str, Any]) -> None:
    """The must-show: executed FLOPs per invocation within ±5 % of XLA's count of the
    unrolled step (transcendentals too: XLA counts them apart, as dfit does)."""
    summary, root = gru["summary"], gru["modules"][""]
    xla = gru["xla_unrolled"]
    assert summary["instances"] == REPEAT
    per_invocation = summary["executed_flops_per_invocation"]
    assert float(root["executed_flops_per_invocation"]) == per_invocation
    error = (per_invocation - xla["flops"]) / xla["flops"]
    assert abs(error) <= TOLERANCE, (per_invocation, xla["flops"], error)
    transcendentals = summary["executed_transcendentals"] / summary["instances"]
    assert transcendentals == pytest.approx(xla["transcendentals"], rel=TOLERANCE)
    # The per-trip figure is far from it: the loops run TRIPS times (the 2x).
    assert summary["flops"] < 0.5 * xla["flops"]


@pytest.mark.frontends
@pytest.mark.slow
def test_scan_modules_execute_per_trip_times_trip_count(gru: dict[str, Any]) -> None:
    """The scan's modules: executed = per trip × TRIPS per invocation (× invocations over
    the run); what runs once per step (head, loss, optimizer) executes once."""
    modules, instances = gru["modules"], gru["summary"]["instances"]
    for path in ("gru", "gru/gates", "gru/candidate"):
        row = modules[path]
        flops = int(row["flops"])
        assert flops > 0
        assert int(row["executed_flops"]) == flops * TRIPS * instances, path
        assert float(row["executed_flops_per_invocation"]) == flops * TRIPS, path
        assert int(row["self_executed_flops"]) == int(row["self_flops"]) * TRIPS * instances, path
    for path in ("head", "loss", "optimizer"):
        assert float(modules[path]["executed_flops_per_invocation"]) == int(modules[path]["flops"]), path
    # partitions.csv: executed = per trip × calls, and the scan bodies' dispatches (the
    # forward loop's and the backward loop's) run TRIPS times an invocation.
    calls = set()
    for row in read_csv(gru["out"] / "partitions.csv"):
        assert int(row["executed_flops"]) == int(row["flops"]) * int(row["calls"]), row["partition"]
        calls.add(int(row["calls"]))
        if row["module_paths"].startswith("gru/") and int(row["flops"]):
            assert int(row["calls"]) == TRIPS * instances, row["partition"]
    assert {instances, TRIPS * instances} <= calls
    # The trip count the run counted is the one the manifest knows statically
    # (passes/loop_trips.py: each dispatch site's ``trips`` per call of the model).
    model = SemanticModel.open(gru["bundle"])
    book = ledger.of(model)
    sites = model.manifest["partitions"]["dispatch_sites"]
    trips = [sites[part.attributes["site"]]["trips"] for part in model.partitions]
    assert TRIPS in trips
    assert [book.calls(part.id) for part in model.partitions] == [count * instances for count in trips]


@pytest.mark.frontends
@pytest.mark.slow
def test_static_figures_stay_per_trip(gru: dict[str, Any]) -> None:
    """A run adds executed columns and changes no per-trip figure: the manifest alone
    gives the same ``flops`` per module, which match XLA's count of the scan (XLA counts
    a while body once too); the manifest's whole-run executed columns are empty (nothing
    says how many invocations ran), and it says why."""
    modules, static = gru["modules"], gru["static_modules"]
    assert set(modules) == set(static)
    for path, row in static.items():
        assert (row["flops"], row["self_flops"]) == (modules[path]["flops"], modules[path]["self_flops"]), path
        assert all(row[column] == "" for column in ("self_executed_flops", *WHOLE_RUN_COLUMNS)), path
    xla = gru["xla_scan"]["flops"]
    assert abs(int(static[""]["flops"]) - xla) <= TOLERANCE * xla, (static[""]["flops"], xla)
    summary = json.loads((gru["static"] / "summary.json").read_text())
    assert summary["executed_flops"] is None and summary["executed_unknown"].startswith("nothing ran")
    assert "executed figures over the whole run are empty" in gru["static_notes"]
    for table in ("sites", "phases", "partitions"):
        rows = read_csv(gru["static"] / f"{table}.csv")
        assert rows and all(row[column] == "" for row in rows for column in WHOLE_RUN_COLUMNS), table


@pytest.mark.frontends
@pytest.mark.slow
def test_manifest_alone_executed_per_invocation_equals_the_runs(gru: dict[str, Any]) -> None:
    """Task 1 of the issue's executed figures: the GRU manifest alone (no run) gives
    executed FLOPs per invocation from its static trip counts (``executed_basis``
    ``manifest trips``), equal to what the run's dispatch events counted (``run events``)
    on every row of every table, in the summary and in the ledger — and so within ±5 % of
    XLA's unrolled count, where the per-trip figure is under half of it."""
    static_book = ledger.of(SemanticModel.open(gru["manifest"]))
    run_book = ledger.of(SemanticModel.open(gru["bundle"]))
    assert (static_book.executed_basis, run_book.executed_basis) == (ledger.MANIFEST_TRIPS, ledger.RUN_EVENTS)
    assert static_book.per_invocation_unknown is None and static_book.executed_unknown.startswith("nothing ran")
    assert static_book.flops_per_invocation == run_book.flops_per_invocation \
        == run_book.per_invocation(run_book.executed_totals["executed_flops"])
    xla = gru["xla_unrolled"]["flops"]
    assert abs(static_book.flops_per_invocation - xla) <= TOLERANCE * xla
    assert static_book.total_flops < 0.5 * static_book.flops_per_invocation
    summary = json.loads((gru["static"] / "summary.json").read_text())
    assert summary["executed_flops_per_invocation"] == gru["summary"]["executed_flops_per_invocation"]
    assert (summary["executed_basis"], gru["summary"]["executed_basis"]) == ("manifest trips", "run events")
    assert "manifest's static trip counts" in gru["static_notes"]
    for table, key in (("modules", "module_path"), ("sites", "site"), ("phases", "phase"),
                       ("partitions", "partition")):
        ran = {row[key]: row for row in read_csv(gru["out"] / f"{table}.csv")}
        alone = {row[key]: row for row in read_csv(gru["static"] / f"{table}.csv")}
        assert set(alone) == set(ran) and ran, table
        for name, row in alone.items():
            assert row["executed_flops_per_invocation"] == ran[name]["executed_flops_per_invocation"] != "", \
                (table, name)
            assert (row["executed_basis"], ran[name]["executed_basis"]) == ("manifest trips", "run events")
    # The scan's modules: per trip x TRIPS, from the manifest alone.
    for path in ("gru/gates", "gru/candidate"):
        row = gru["static_modules"][path]
        assert float(row["executed_flops_per_invocation"]) == int(row["flops"]) * TRIPS > 0, path


@pytest.mark.frontends
@pytest.mark.slow
def test_gru_tables_sum_to_the_ledger(gru: dict[str, Any]) -> None:
    """Sums over sites.csv, phases.csv and partitions.csv = modules.csv's root = the
    ledger's totals = the summary, for every executed column; the flame graph's tooltip
    of the scan's module says both figures."""
    book = ledger.of(SemanticModel.open(gru["bundle"]))
    _tables_sum_to_the_ledger(book, gru["out"], modules=True)
    gates = gru["modules"]["gru/gates"]
    svg = (gru["out"] / "flamegraph.svg").read_text()
    assert (f"FLOPs per trip {int(gates['flops']):,}; executed FLOPs {int(gates['executed_flops']):,} over the run "
            f"({int(gates['flops']) * TRIPS:,} per invocation, from run events)") in svg
    static_svg = (gru["static"] / "flamegraph.svg").read_text()
    assert (f"FLOPs per trip {int(gates['flops']):,}; executed FLOPs {int(gates['flops']) * TRIPS:,} per invocation "
            "(from manifest trips; over the run unknown)") in static_svg


def _tables_sum_to_the_ledger(book: ledger.Ledger, out: Path, modules: bool) -> None:
    totals = book.executed_totals
    assert book.executed_unknown is None and all(value is not None for value in totals.values())
    summary = json.loads((out / "summary.json").read_text())
    for column in ledger.EXECUTED_FIGURES:
        assert summary[column] == totals[column], column
        for table in ("sites", "phases", "partitions"):
            assert sum(int(row[column]) for row in read_csv(out / f"{table}.csv")) == totals[column], (table, column)
        if modules:
            root = next(row for row in read_csv(out / "modules.csv") if row["module_path"] == "")
            assert int(root[column]) == totals[column], column
    per_invocation = book.per_invocation(totals["executed_flops"])
    assert summary["executed_flops_per_invocation"] == per_invocation == book.flops_per_invocation \
        == round(totals["executed_flops"] / book.instances, 3)
    assert summary["executed_basis"] == book.executed_basis
    # Static figures over the same tables: the ledger's per-trip total.
    assert sum(int(row["flops"]) for row in read_csv(out / "sites.csv")) == book.total_flops == summary["flops"]


# --- the convnet's real runs (fast) ---------------------------------------------------------

def test_convnet_run_executed_columns_sum_to_the_ledger(iree_bundles: dict[str, Path], tmp_path: Path) -> None:
    """The convnet run (3 invocations, no loop): every partition executes once an
    invocation, so executed = per trip × 3, and every table sums to the ledger."""
    book = ledger.of(SemanticModel.open(iree_bundles["full"]))
    analyze(iree_bundles["full"], ["semantic-attribution"], tmp_path)
    out = tmp_path / "semantic-attribution"
    _tables_sum_to_the_ledger(book, out, modules=False)
    assert book.instances == 3 and book.executed_totals["executed_flops"] == 3 * book.total_flops
    for row in read_csv(out / "partitions.csv"):
        assert int(row["executed_flops"]) == int(row["flops"]) * int(row["calls"])
        if row["executed_flops_per_invocation"]:
            assert float(row["executed_flops_per_invocation"]) == pytest.approx(int(row["executed_flops"]) / 3)
    entries = book.entries.to_pylist()
    assert all(e["executed_flops"] == e["flops"] * e["calls"] for e in entries if e["flops"] is not None)


@pytest.mark.parametrize(("name", "why", "ran"), [
    ("manifest", "nothing ran", None),
    ("none", "recorded no dispatch events at partitions (dfit run --mode none)", 3),
    ("ids", "recorded no dispatch events at partitions (dfit run --mode ids)", 3),
    ("lite", "recorded no dispatch events at partitions (dfit run --mode lite)", 3),
])
def test_manifest_trips_stand_in_where_no_run_counted(iree_bundles: dict[str, Path], tmp_path: Path, name: str,
                                                      why: str, ran: int | None) -> None:
    """Where the run counted no executions, the manifest's static trip counts give the
    executed figures per invocation (``executed_basis`` ``manifest trips``): on the
    convnet, the full run's per partition. Over the whole run they need how many
    invocations ran, which a run says (``--mode none``: its summary) and a manifest does
    not: there they are None, never 0, and the summary and a note say why."""
    counted = ledger.of(SemanticModel.open(iree_bundles["full"]))
    model = SemanticModel.open(iree_bundles[name])
    book = ledger.of(model)
    assert why in book.events_uncounted and book.executed_basis == ledger.MANIFEST_TRIPS
    assert book.invocations_run == ran and book.per_invocation_unknown is None
    assert book.flops_per_invocation == counted.flops_per_invocation == book.total_flops > 0
    for part in model.partitions:
        mine, theirs = book.partition_figures(part.id), counted.partition_figures(part.id)
        assert book.per_invocation_of(mine) == counted.per_invocation_of(theirs) == mine["flops"], part.id
        if ran is None:
            assert all(mine[key] is None for key in ledger.EXECUTED_FIGURES), part.id
        else:
            assert {key: mine[key] for key in ledger.EXECUTED_FIGURES} == \
                {key: theirs[key] for key in ledger.EXECUTED_FIGURES}, part.id
    _, _, session = analyze(iree_bundles[name], ["semantic-attribution"], tmp_path)
    out = tmp_path / "semantic-attribution"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["executed_basis"] == "manifest trips" and summary["flops"] == book.total_flops
    assert summary["executed_flops_per_invocation"] == book.total_flops
    notes = session.contexts["semantic-attribution"].notes
    assert any("manifest's static trip counts" in note and why in note for note in notes)
    for table in ("sites", "phases", "partitions"):
        rows = read_csv(out / f"{table}.csv")
        assert rows and all(row["executed_basis"] == "manifest trips" for row in rows), table
        assert sum(float(row["executed_flops_per_invocation"]) for row in rows) == book.total_flops, table
        if ran is None:
            assert all(row[column] == "" for row in rows for column in WHOLE_RUN_COLUMNS), table
        else:
            assert sum(int(row["executed_flops"]) for row in rows) == ran * book.total_flops, table
    if ran is None:
        assert summary["executed_flops"] is None and summary["executed_unknown"].startswith("nothing ran")
        assert any("over the whole run are empty" in note for note in notes)
    else:
        assert summary["executed_flops"] == counted.executed_totals["executed_flops"] and book.executed_unknown is None


def test_a_sampled_run_takes_the_manifest_trips(iree_bundles: dict[str, Path], tmp_path: Path) -> None:
    """A run keeping 1 dispatch event in 2 (``--sample 0.5``) counts half the calls:
    executed figures from its events would be short, so the manifest's trip counts give
    them (× its 2 invocations over the run), and the run's ``calls`` stay what it kept."""
    from dfit_mlir.core.event_pipeline import Policy
    from dfit_mlir.runtime_hooks.run import run_bundle

    manifest = iree_bundles["manifest"]
    bundle = run_bundle(manifest.with_name(manifest.name.replace(".manifest.json", ".vmfb")), manifest,
                        tmp_path / "sampled", mode="full", repeat=2, policy=Policy(mode="full", sample_every=2)).bundle
    model = SemanticModel.open(bundle)
    book = ledger.of(model)
    assert "--sample" in book.events_uncounted and book.executed_basis == ledger.MANIFEST_TRIPS
    assert sum(book.calls(part.id) for part in model.partitions) < 2 * len(model.partitions)
    assert book.instances == 2 and book.executed_totals["executed_flops"] == 2 * book.total_flops
    assert book.flops_per_invocation == book.total_flops


def test_a_reconstruction_has_no_trip_counts(edgetpu_bundle: Path) -> None:
    """A reconstruction's partitions are groups, no dispatch site with a trip count, and
    its logs time whole programs: executed figures stay unknown, and say both."""
    book = ledger.of(SemanticModel.open(edgetpu_bundle))
    assert book.executed_basis is None and book.flops_per_invocation is None
    assert "reconstruction's groups" in book.per_invocation_unknown == book.executed_unknown
    assert all(figures[ledger.PER_INVOCATION] is None for figures in book.op_figures().values())


# --- a data-dependent loop: no static trip count ---------------------------------------------

WHILE_STEP = '''"""A data-dependent loop: lax.while_loop runs until a runtime bound (an input)."""
import jax
import jax.numpy as jnp


def step(w, x, bound):
    with jax.named_scope("refine"):
        def cond(carry):
            i, _ = carry
            return i < bound

        def body(carry):
            i, y = carry
            return i + 1, jnp.tanh(y @ w)

        _, y = jax.lax.while_loop(cond, body, (jnp.int32(0), x))
    with jax.named_scope("head"):
        return (y @ w).sum()


def make_step():
    w = jax.random.normal(jax.random.PRNGKey(0), (16, 16)) * 0.2
    return step, (w, jnp.ones((4, 16)), jnp.array(3, jnp.int32))
'''
#: The bound given at run time: the loop body's dispatches run this often an invocation.
BOUND = 5


@pytest.mark.frontends
@pytest.mark.slow
def test_a_data_dependent_loop_stays_unknown_and_says_why(tmp_path: Path) -> None:
    """``lax.while_loop`` bounded by an input: its body's dispatch sites have no static
    trip count, so the manifest alone (and a ``--mode lite`` run, which counts no
    dispatch) leaves executed figures unknown, naming the dynamic sites; a ``--mode full``
    run counts the trips (``run events``): BOUND per invocation."""
    pytest.importorskip("jax")
    source = tmp_path / "while_step.py"
    source.write_text(WHILE_STEP)
    vmfb = tmp_path / "while.vmfb"
    dfit("compile", str(source), "--dfit-tag", "--mode", "ids", "-o", str(vmfb))
    manifest = vmfb.with_suffix(".manifest.json")
    inputs = ["--input", "16x16xf32=0.1", "--input", "4x16xf32=1", "--input", f"i32={BOUND}"]
    for mode in ("lite", "full"):
        dfit("run", str(vmfb), "--mode", mode, "--repeat", "2", "--warmup", "1", *inputs, "-o", str(tmp_path / mode))
    sites = json.loads(manifest.read_text())["partitions"]["dispatch_sites"]
    assert any(site["trips"] is None for site in sites) and any(site["trips"] == 1 for site in sites)
    for source_path, why in ((manifest, "nothing ran"), (tmp_path / "lite", "--mode lite")):
        book = ledger.of(SemanticModel.open(source_path))
        assert book.executed_basis is None and book.flops_per_invocation is None
        reason = book.per_invocation_unknown
        assert why in reason and "dynamic (a loop bound known only at run time)" in reason
        assert "stablehlo.while" in reason and book.executed_unknown == reason
        assert book.executed_totals == dict.fromkeys(ledger.EXECUTED_FIGURES)
        out = tmp_path / f"analysis-{source_path.name}"
        notes = dfit("analyze", str(source_path), "--tool", "semantic-attribution", "--out", str(out))
        assert "executed_* columns are empty" in notes and "dynamic" in notes
        summary = json.loads((out / "semantic-attribution" / "summary.json").read_text())
        assert summary["executed_basis"] is None and summary["per_invocation_unknown"] == reason
        rows = read_csv(out / "semantic-attribution" / "modules.csv")
        assert rows and all(row[column] == "" for row in rows for column in (*EXECUTED_COLUMNS, "executed_basis"))
    book = ledger.of(SemanticModel.open(tmp_path / "full"))
    assert book.executed_basis == ledger.RUN_EVENTS and book.instances == 2
    loop_body = [part for part in book.model.partitions if sites[part.attributes["site"]]["trips"] is None
                 and "matmul" in part.attributes["export"]]
    assert loop_body and all(book.calls(part.id) == BOUND * 2 for part in loop_body)
