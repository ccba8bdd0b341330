"""One figure, one place: on real bundles — a transformers GPT-2 decoder run through IREE
and an Edge TPU reconstruction from the vendor's own files — every reader prints the
ledger's figure. The same module's and the same source line's time and share are equal
in ``dfit analyze``, ``dfit query … top-sites``, ``dfit view``'s page data, ``dfit diff``
of the bundle against itself and the flame graph (speedscope); a dispatch's time, calls
and invocations are equal in the ledger, the Perfetto trace, the view and the tables;
bytes mean what crosses the dispatch boundary everywhere."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from dfit_mlir.analysis import ledger
from dfit_mlir.analysis.model import SemanticModel
from dfit_mlir.fleet import diff
from dfit_mlir.views import html
from tests.conftest import read_csv, read_pftrace


def dfit(*args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "dfit_mlir", *args], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def gpt2_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """GPT-2 (transformers config, random weights, 2 layers), run 3 times."""
    from dfit_mlir.frontends import torch as torch_frontend
    from dfit_mlir.runtime_hooks.run import run_bundle
    from tests import frontend_models

    root = tmp_path_factory.mktemp("gpt2-ledger")
    model, args, kwargs = frontend_models.gpt2(2)
    compiled = torch_frontend.compile(model, args, kwargs=kwargs, output=root / "gpt2.vmfb", mode="full", quiet=True)
    return run_bundle(compiled.vmfb, compiled.manifest_path, root / "run", mode="full",
                      inputs=frontend_models.gpt2_inputs(args, kwargs), repeat=3, warmup=1).bundle


@pytest.fixture(params=[pytest.param("gpt2", marks=[pytest.mark.frontends, pytest.mark.slow]), "edgetpu"])
def bundle(request: pytest.FixtureRequest) -> Path:
    if request.param == "gpt2":
        pytest.importorskip("transformers")
        return request.getfixturevalue("gpt2_run")
    return request.getfixturevalue("edgetpu_bundle")


@pytest.fixture
def readers(bundle: Path, tmp_path: Path) -> dict[str, Any]:
    """What each reader printed for ``bundle``, read back from its own output."""
    dfit("analyze", str(bundle), "--tool", "semantic-attribution", "--tool", "program-analyzer",
         "--out", str(tmp_path / "analysis"))
    dfit("collect", str(bundle), "-o", str(tmp_path / "store"))
    dfit("query", str(tmp_path / "store"), "top-sites", "--limit", "100000", "-o", str(tmp_path / "top.csv"))
    dfit("query", str(tmp_path / "store"), "SELECT DISTINCT run_instances FROM op_ledger", "-o",
         str(tmp_path / "instances.csv"))
    model = SemanticModel.open(bundle)
    out = tmp_path / "analysis" / "semantic-attribution"
    return {
        "model": model,
        "book": ledger.of(model),
        "modules": {row["module_path"]: row for row in read_csv(out / "modules.csv")},
        "sites": {row["site"]: row for row in read_csv(out / "sites.csv")},
        "summary": json.loads((out / "summary.json").read_text()),
        "speedscope": json.loads((out / "speedscope.json").read_text()),
        "regions": {row["region"]: row for row in read_csv(tmp_path / "analysis" / "program-analyzer" / "regions.csv")},
        "top": read_csv(tmp_path / "top.csv"),
        "store_instances": [int(row["run_instances"] or 0) for row in read_csv(tmp_path / "instances.csv")],
        "view": html.view_data(model),
        "diff": diff.diff_bundles(bundle, bundle),
    }


def _self_figures(book: ledger.Ledger, model: SemanticModel, key: str) -> dict[str, float]:
    """The ledger's own rollup by the ops' own module paths (non-zero ones)."""
    found: defaultdict[str, float] = defaultdict(float)
    for op_id, figures in book.op_figures().items():
        path = model.module_path(op_id)
        if path is not None:
            found[path] += figures[key]
    return {path: value for path, value in found.items() if value}


def test_a_modules_figures_are_one_figure_everywhere(readers: dict[str, Any]) -> None:
    """FLOPs and bytes on every bundle; time and its share where the bundle timed ops
    (a reconstruction's vendor logs time whole programs: its ops have FLOPs, not time)."""
    book, model, modules, view = readers["book"], readers["model"], readers["modules"], readers["view"]
    strings = view["strings"]
    figures = view["modules"]["figures"][""]
    for column, key in (("flops", "flops"), ("bytes", "bytes"), ("time", "time_ns")):
        own = _self_figures(book, model, key)
        for path, value in own.items():
            assert float(modules[path][f"self_{key}"]) == pytest.approx(value, abs=1e-6), (key, path)
        for row, code in enumerate(view["modules"]["path"]):
            path = strings[code]
            assert figures[column][row] == pytest.approx(float(modules[path][key]), abs=1e-3), (key, path)
    flops = _self_figures(book, model, "flops")
    assert len(flops) >= 3 and sum(flops.values()) == book.total_flops
    # The flame graph (speedscope): a module's sample weighs its self time (else FLOPs).
    timed = _self_figures(book, model, "time_ns")
    profile = readers["speedscope"]["profiles"][0]
    frames = readers["speedscope"]["shared"]["frames"]
    weighed = {frames[stack[-1]]["name"].split(" (")[0]: weight
               for stack, weight in zip(profile["samples"], profile["weights"], strict=True)}
    for path, value in (timed or flops).items():
        assert weighed[path or "(root)"] == value, path
    # One count of runs: the ledger's, in analyze's summary, the diff and the store.
    assert readers["summary"]["instances"] == book.instances == readers["diff"].a.invocations
    assert readers["store_instances"] == ([book.instances] if book.instances else [])  # no timed event: no row


def test_a_modules_time_and_share_are_one_figure_everywhere(readers: dict[str, Any]) -> None:
    book, model, modules = readers["book"], readers["model"], readers["modules"]
    if not book.attributed_time_ns:
        pytest.skip(f"{model.source}: no op was timed (its vendor logs time whole programs)")
    timed = _self_figures(book, model, "time_ns")
    assert len(timed) >= 3
    # dfit analyze: modules.csv.
    for path, ns in timed.items():
        assert float(modules[path]["self_attributed_share"]) == pytest.approx(ns / book.attributed_time_ns, abs=1e-6)
    # dfit query top-sites: a location named by its module path is those ops' time.
    top = {row["location"]: row for row in readers["top"] if row["located_by"] == "module_path"}
    assert len(set(top) & set(timed)) >= 3
    for path, ns in timed.items():
        if path in top:
            assert int(top[path]["total_ns"]) == ns, path
            assert float(top[path]["attributed_share"]) == pytest.approx(float(modules[path]["self_attributed_share"]),
                                                                        abs=1e-6)
    assert sum(int(row["total_ns"]) for row in readers["top"]) == book.attributed_time_ns
    # dfit diff of the bundle against itself: each row's time is the mean per invocation.
    result = readers["diff"]
    runs = result.a.invocations
    assert runs == book.instances == readers["summary"]["instances"] > 1
    by_module: defaultdict[str, float] = defaultdict(float)
    ops_in: defaultdict[str, int] = defaultdict(int)
    for row in result.rows:
        assert "time" not in row.changes and row.a.time_ns == row.b.time_ns
        if len(row.a.ids) == 1 and (path := model.module_path(row.a.ids[0])) is not None:
            by_module[path] += (row.a.time_ns or 0) * runs
            ops_in[path] += 1
    for path, ns in timed.items():
        if path in by_module:  # the ledger's whole-ns split: within 1 ns per op
            assert by_module[path] == pytest.approx(ns, abs=ops_in[path]), path
    total_diff = sum(row.a.time_ns or 0 for row in result.rows) * runs
    assert total_diff == pytest.approx(book.attributed_time_ns, abs=len(result.rows))


def test_a_lines_time_and_share_are_one_figure_everywhere(readers: dict[str, Any]) -> None:
    book, view, sites = readers["book"], readers["view"], readers["sites"]
    strings = view["strings"]
    table = view["sites"]
    if not book.attributed_time_ns:
        pytest.skip("no op was timed")
    checked = 0
    for row in range(len(table["file"])):
        key = (f"{strings[view['files'][table['file'][row]]['name']]}:{table['line'][row]}" if table["file"][row] >= 0
               else strings[table["name"][row]])
        if key not in sites or not float(sites[key]["time_ns"]):
            continue
        assert table["share"][row] == pytest.approx(float(sites[key]["attributed_share"]), abs=1e-6), key
        assert float(sites[key]["attributed_share"]) == pytest.approx(
            float(sites[key]["time_ns"]) / book.attributed_time_ns, abs=1e-6)
        checked += 1
    assert checked >= 3
    assert sum(float(row["attributed_share"] or 0) for row in sites.values()) == pytest.approx(1.0, abs=1e-4)


def test_a_dispatchs_time_calls_invocations_and_bytes_are_one_figure_everywhere(readers: dict[str, Any],
                                                                                 bundle: Path) -> None:
    book, model, view = readers["book"], readers["model"], readers["view"]
    dispatches = view["dispatches"]
    strings = view["strings"]
    by_partition = {row["partition"]: row for row in book.rollup("partition").to_pylist()}
    for index, code in enumerate(dispatches["name"]):
        part_id = strings[code]
        assert dispatches["time"][index] == book.partition_ns(part_id)
        assert dispatches["calls"][index] == book.calls(part_id)
        row = by_partition.get(part_id, {})
        moved = (row.get("bytes_read") or 0) + (row.get("bytes_written") or 0)
        assert dispatches["bytes"][index] == moved
        region = readers["regions"].get(part_id)
        if region is not None and region["bytes_moved"]:
            assert int(float(region["bytes_moved"])) == moved, part_id
    # The bundle's own tables and the Perfetto trace: the run's raw events, summed.
    if model.events_path is not None and (bundle / "dispatches.csv").is_file():
        for row in read_csv(bundle / "dispatches.csv"):
            if row["site"]:
                part = model.partition_of_site(int(row["site"]))
                assert part is not None
                assert int(row["duration_ns_sum"]) == book.partition_ns(part.id)
                assert int(row["duration_ns_count"]) == book.calls(part.id)
    traced_ns: defaultdict[int, int] = defaultdict(int)
    traced_calls: defaultdict[int, int] = defaultdict(int)
    invocations = set()
    for site, start, end, args in _slices(bundle / "trace.pftrace"):
        if site is not None:
            traced_ns[site] += end - start
            traced_calls[site] += 1
        if args.get("invocation") is not None:
            invocations.add(args["invocation"])
    for site, ns in traced_ns.items():
        part = model.partition_of_site(site)
        assert part is not None
        assert ns == book.partition_ns(part.id) and traced_calls[site] == book.calls(part.id)
    # Bytes of an op in dfit diff are the ledger's boundary bytes.
    figures = book.op_figures()
    for row in readers["diff"].rows:
        if row.a.bytes is not None:
            counted = [i for i, computes in zip(row.a.ids, row.a.computing, strict=True) if computes] or list(row.a.ids)
            assert row.a.bytes == sum(figures[i]["bytes"] for i in counted if i in figures)


def _slices(trace: Path) -> list[tuple[int | None, int, int, dict[str, Any]]]:
    """Every dispatch slice of a Perfetto trace: (site, start, end, args), begin and end
    packets paired per track."""
    _, events = read_pftrace(trace)
    open_slices: defaultdict[int, list[tuple[int, dict[str, Any], str]]] = defaultdict(list)
    found = []
    for packet, name, args in events:
        kind = packet.track_event.type
        track = packet.track_event.track_uuid
        if kind == 1:  # TYPE_SLICE_BEGIN
            open_slices[track].append((packet.timestamp, args, name))
        elif kind == 2:  # TYPE_SLICE_END
            start, begun, _ = open_slices[track].pop()
            if "site" in begun:
                found.append((int(begun["site"]), start, packet.timestamp, begun))
    return found


def test_executed_figures_are_one_figure_everywhere(readers: dict[str, Any]) -> None:
    """Executed work (per trip × the run's dispatch events): the sums over sites.csv, the
    module tree's root (modules.csv, the view's icicle), the view's dispatch table and
    header, analyze's summary and the ledger's totals are one figure; where nothing
    counted executions (the Edge TPU's logs time whole programs) every one is empty."""
    book, modules, sites, view = readers["book"], readers["modules"], readers["sites"], readers["view"]
    totals, summary = book.executed_totals, readers["summary"]
    strings = view["strings"]
    root_row = next(row for row, code in enumerate(view["modules"]["path"]) if strings[code] == "")
    if book.executed_unknown is not None:
        assert totals == dict.fromkeys(ledger.EXECUTED_FIGURES) and summary["executed_unknown"] == book.executed_unknown
        assert all(row[column] == "" for row in (*sites.values(), *modules.values())
                   for column in ledger.EXECUTED_FIGURES)
        assert view["executed"]["flops"] is None and view["executed"]["unknown"] == book.executed_unknown
        assert set(view["dispatches"]["executed_flops"]) == {None}
        assert view["modules"]["figures"][""]["executed_flops"][root_row] == 0  # widths: the page says why
        return
    for column in ledger.EXECUTED_FIGURES:
        assert sum(int(row[column]) for row in sites.values()) == int(modules[""][column]) == totals[column] \
            == summary[column], column
    assert totals["executed_flops"] >= book.total_flops > 0
    assert sum(view["dispatches"]["executed_flops"]) == view["executed"]["flops"] == totals["executed_flops"]
    assert view["modules"]["figures"][""]["executed_flops"][root_row] == totals["executed_flops"]
    per_invocation = book.per_invocation(totals["executed_flops"])
    assert float(modules[""]["executed_flops_per_invocation"]) == summary["executed_flops_per_invocation"] \
        == view["executed"]["flops_per_invocation"] == per_invocation
    for path, row in modules.items():
        assert float(row["executed_flops_per_invocation"]) == book.per_invocation(int(row["executed_flops"])), path
