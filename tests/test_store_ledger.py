"""The store's figures are the ledger's (store layout 1.2, ``op_ledger``): on a real run
of a ``transformers`` GPT-2 (config, random weights) collected into a store,
``dfit query top-sites`` gives each module path the time ``dfit_mlir.analysis.ledger`` gives it
(``Ledger.rollup("module_path")``, what ``dfit analyze`` reads), on DuckDB and on Spark;
the GELU fused into each ``c_fc`` dispatch has a share of its own; a dispatch's ops
sum to what its dispatch events took; transcendentals are placed so that partitions sum
to the model's. A bundle an older layout collected is refused with one line, and
``dfit collect`` again adds its table."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from dfit_mlir.fleet import store as bundle_store
from tests import frontend_models

pytestmark = [
    pytest.mark.slow,
    pytest.mark.frontends,
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:While compiling, we found certain side effects:UserWarning"),
]


@pytest.fixture(scope="module")
def gpt2_store(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """GPT-2 (2 layers of 64) compiled with ``--dfit-tag``, run in full mode 3 times, and
    collected into a store."""
    from dfit_mlir.frontends import torch as torch_frontend
    from dfit_mlir.runtime_hooks.run import run_bundle

    root = tmp_path_factory.mktemp("gpt2-store")
    model, args, kwargs = frontend_models.gpt2(2)
    compiled = torch_frontend.compile(model, args, kwargs=kwargs, output=root / "gpt2.vmfb", mode="ids")
    bundle = run_bundle(compiled.vmfb, compiled.manifest_path, root / "run", mode="full",
                        inputs=frontend_models.gpt2_inputs(args, kwargs), repeat=3, warmup=1).bundle
    store = root / "store"
    bundle_store.collect([bundle], store)
    return {"bundle": bundle, "store": store, "manifest": compiled.manifest_path}


def _book(bundle: Path) -> Any:
    from dfit_mlir.analysis.ledger import Ledger
    from dfit_mlir.analysis.model import SemanticModel

    return Ledger(SemanticModel.open(bundle))


def _top_sites(store: Path, engine: str = "duckdb") -> list[dict[str, Any]]:
    return bundle_store.query(store, report="top-sites", parameters={"limit": 100_000}, engine=engine).to_pylist()


def test_top_sites_time_is_the_ledgers_per_module_path(gpt2_store: dict[str, Any]) -> None:
    book = _book(gpt2_store["bundle"])
    expected = book.column_by("module_path", "time_ns")
    counted = book.rollup("module_path").to_pylist()
    entries = defaultdict(int)
    for row in book.entries.to_pylist():
        if row["calls"]:
            entries[row["module_path"]] += 1
    got = _top_sites(gpt2_store["store"])
    assert {r["located_by"] for r in got} == {"module_path"}  # every op of GPT-2 has one
    assert {r["location"] for r in got} == {k for k, n in entries.items() if n}
    for row in got:  # whole ns per entry (apportioned): within 1 ns of the ledger per entry
        assert abs(row["total_ns"] - expected[row["location"]]) <= entries[row["location"]], row
    assert {r["module_path"] for r in counted} >= {r["location"] for r in got}
    by_location = {r["location"]: r for r in got}
    for layer in range(2):
        act, c_fc = by_location[f"h.{layer}.mlp.act"], by_location[f"h.{layer}.mlp.c_fc"]
        # The GELU fused into c_fc's dispatch: a share of its own, smaller than the matmul's.
        assert 0 < act["total_ns"] < c_fc["total_ns"] and act["attributed_share"] > 0
        print(f"top-sites h.{layer}: mlp.c_fc {c_fc['total_ns']} ns ({100 * c_fc['attributed_share']:.2f} %), "
              f"mlp.act {act['total_ns']} ns ({100 * act['attributed_share']:.2f} %)")
    assert sum(r["attributed_share"] for r in got) == pytest.approx(1.0, abs=1e-9)


def test_a_dispatchs_ops_sum_to_its_dispatch_events(gpt2_store: dict[str, Any]) -> None:
    """Per call site, the store's entries sum to the summed duration of that site's
    dispatch events, read here from the bundle's events (exactly: whole ns apportioned)."""
    events = pq.read_table(gpt2_store["bundle"] / "events.parquet", columns=["kind", "site", "duration_ns"])
    per_site: defaultdict[int, int] = defaultdict(int)
    for kind, site, duration in zip(*(events.column(c).to_pylist() for c in ("kind", "site", "duration_ns")),
                                    strict=True):
        if kind == "dispatch" and site is not None and duration is not None:
            per_site[site] += duration
    stored = bundle_store.query(gpt2_store["store"], "SELECT site, CAST(SUM(time_ns) AS BIGINT) AS ns, "
                                "COUNT(*) AS ops FROM op_ledger WHERE calls > 0 GROUP BY site").to_pylist()
    assert {row["site"]: row["ns"] for row in stored} == {s: ns for s, ns in per_site.items() if ns}
    assert any(row["ops"] > 1 for row in stored)  # fused dispatches are split, not given to their root


def test_transcendentals_are_placed_once_and_not_flops(gpt2_store: dict[str, Any]) -> None:
    """GPT-2's GELU (``gelu_new``: tanh) and softmax (exp) evaluate transcendentals; the
    entries sum to the manifest's ops' count, and those ops carry no FLOPs for them."""
    manifest = json.loads(gpt2_store["manifest"].read_text())
    counted = {op["id"]: op.get("transcendentals") or 0 for op in manifest["operators"]}
    book = _book(gpt2_store["bundle"])
    entries = book.entries.to_pylist()
    computing = {row["op_id"] for row in entries}
    assert sum(row["transcendentals"] or 0 for row in entries) == sum(counted[i] for i in computing) > 0
    tanh = [op for op in manifest["operators"] if op["op"].startswith("torch.aten.tanh")]
    assert tanh and all(op["flops"] == 0 and op["transcendentals"] for op in tanh)
    stored = bundle_store.query(gpt2_store["store"], "SELECT CAST(SUM(transcendentals) AS BIGINT) AS t, "
                                "CAST(SUM(executed_transcendentals) AS BIGINT) AS e FROM op_ledger").to_pylist()
    assert stored == [{"t": sum(counted[i] for i in computing),
                       "e": sum(row["executed_transcendentals"] or 0 for row in entries)}]


@pytest.mark.spark
def test_spark_gives_the_ledgers_top_sites_too(gpt2_store: dict[str, Any]) -> None:
    duckdb = _top_sites(gpt2_store["store"])
    assert _top_sites(gpt2_store["store"], engine="spark") == duckdb  # exactly: whole ns, one SQL text


def test_a_bundle_collected_before_the_ledger_table_is_refused_then_upgraded(
        gpt2_store: dict[str, Any], tmp_path: Path) -> None:
    """Layout 1.1 stored no ``op_ledger``: the store cannot compute it (the manifest's
    tensor graph is not kept), so a report that reads it says which bundle to collect
    again (exit 2, one line); collecting it again adds the table in place, label kept."""
    import shutil

    from dfit_mlir.cli.app import main
    from dfit_mlir.fleet.store import Placement, layout

    store = tmp_path / "store"
    bundle_store.collect([gpt2_store["bundle"]], store, Placement(label="nightly"))
    (stored,) = layout.bundle_dirs(store)
    reference = _top_sites(store)
    (stored / "op_ledger.parquet").unlink()  # what layout 1.1 wrote
    before = sorted(p.name for p in stored.iterdir())
    result = CliRunner().invoke(main, ["query", str(store), "top-sites"])
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith(f"dfit: {stored}: collected by an older store layout") and "collect" in line
    assert str(gpt2_store["bundle"].resolve()) in line
    assert sorted(p.name for p in stored.iterdir()) == before  # nothing written by the refusal
    copy = tmp_path / "copy"
    shutil.copytree(gpt2_store["bundle"], copy)  # the same run, from another folder
    (done,) = bundle_store.collect([copy], store)
    assert not done.added and (stored / "op_ledger.parquet").is_file()
    assert _top_sites(store) == reference
    assert bundle_store.query(store, "SELECT label FROM runs").to_pylist() == [{"label": "nightly"}]


def test_analysis_csvs_write_transcendentals_apart(gpt2_store: dict[str, Any], tmp_path: Path) -> None:
    """``sites.csv`` and ``phases.csv`` of ``dfit analyze`` carry the transcendentals
    column: each sums to the manifest's ops (the GELU's tanh and the softmax's exp)."""
    from dfit_mlir.analysis.tools.session import analyze
    from tests.conftest import read_csv

    manifest = json.loads(gpt2_store["manifest"].read_text())
    everything = sum(op.get("transcendentals") or 0 for op in manifest["operators"])
    analyze(gpt2_store["bundle"], ["semantic-attribution"], tmp_path)
    out = tmp_path / "semantic-attribution"
    assert everything > 0
    assert sum(int(row["transcendentals"]) for row in read_csv(out / "phases.csv")) == everything
    sites = read_csv(out / "sites.csv")
    located = sum(op.get("transcendentals") or 0 for op in manifest["operators"] if op.get("source"))
    assert 0 < sum(int(row["transcendentals"]) for row in sites) <= everything and located > 0
