"""What a long ``dfit run --mode full`` pays beyond the profiled run (issue 29): the
device check asks the runtime nothing for the CPU drivers (no ``iree.runtime`` import,
whose ``ml_dtypes`` costs seconds), the bundle's CSVs are grouped batch by batch, and
each dispatch event carries its workgroup shape (count and size per axis) in its
attributes, which program-analyzer prints as ``2x1x1 of 64x1x1``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from dfit_mlir.core.errors import InvalidInputError
from dfit_mlir.exporters import bundle as bundle_writer
from dfit_mlir.passes.instrumented_compile import CompileResult, compile_instrumented
from dfit_mlir.runtime_hooks import drivers
from dfit_mlir.runtime_hooks.run import run_bundle
from tests.conftest import CONVNET, REPO


@pytest.fixture(scope="module")
def convnet(tmp_path_factory: pytest.TempPathFactory) -> tuple[CompileResult, Path]:
    root = tmp_path_factory.mktemp("long-run-costs")
    compiled = compile_instrumented(CONVNET, root / "convnet.vmfb", mode="full")
    bundle = run_bundle(compiled.vmfb, compiled.manifest_path, root / "run", mode="full", repeat=4, warmup=1).bundle
    return compiled, bundle


def test_local_device_check_imports_no_runtime(convnet: tuple[CompileResult, Path]) -> None:
    """The CPU drivers' check: the vmfb's targets only, no ``iree.runtime`` (nor its ml_dtypes)."""
    script = ("import sys; from pathlib import Path; from dfit_mlir.runtime_hooks import drivers; "
              f"d = drivers.choose_device(Path({str(convnet[0].vmfb)!r}), 'local-task'); "
              "print(d.name, d.targets, 'iree.runtime' in sys.modules, 'ml_dtypes' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.split() == ["default", "('local*',)", "False", "False"], out.stdout


def test_device_check_errors_still_name_both_sides(convnet: tuple[CompileResult, Path]) -> None:
    vmfb = convnet[0].vmfb
    assert drivers.choose_device(vmfb, "local-sync").runtime_uri == "local-sync"
    with pytest.raises(InvalidInputError, match=r"the IREE runtime has no driver 'metal' \(it has .*local-task"):
        drivers.choose_device(vmfb, "metal")
    if "vulkan" in drivers.runtime_drivers():
        with pytest.raises(InvalidInputError, match=r"compiled for HAL device local\*, not for --driver vulkan: run "
                                                    r"it with --driver local-task or local-sync"):
            drivers.choose_device(vmfb, "vulkan")


def test_dispatch_events_carry_their_workgroup_shape(convnet: tuple[CompileResult, Path], tmp_path: Path) -> None:
    from dfit_mlir.analysis.tools.session import analyze
    from tests.conftest import read_csv

    _, bundle = convnet
    events = pq.read_table(bundle / "events.parquet", columns=["kind", "site", "workgroups", "attributes"])
    dispatches = events.filter(pc.equal(events.column("kind").cast(pa.string()), "dispatch")).to_pylist()
    assert len(dispatches) == 4 * 6
    shapes: dict[int, str] = {}
    for event in dispatches:
        shape = json.loads(event["attributes"])
        count, size = shape["workgroup_count"], shape["workgroup_size"]
        assert len(count) == len(size) == 3 and min(size) >= 1
        assert count[0] * count[1] * count[2] == event["workgroups"]
        shapes[event["site"]] = f"{'x'.join(map(str, count))} of {'x'.join(map(str, size))}"
    assert '\\"workgroup_size\\": [' in (bundle / "trace.json").read_text()
    analyze(bundle, ["program-analyzer"], tmp_path / "analysis")
    rows = read_csv(tmp_path / "analysis" / "program-analyzer" / "regions.csv")
    assert {row["region"].split(":")[0]: row["workgroups"] for row in rows} == \
        {f"site{site}": text for site, text in shapes.items()}


@pytest.mark.parametrize("kind, keys", [("dispatch", ["site", "partition", "root_id"]), (None, ["kind", "partition"])])
def test_csvs_grouped_batch_by_batch(convnet: tuple[CompileResult, Path], tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch, kind: str | None, keys: list[str]) -> None:
    """Grouped 5 events at a time, the CSV is the whole table's group-by."""
    import pyarrow.csv as pacsv

    _, bundle = convnet
    monkeypatch.setattr(bundle_writer, "GROUP_BATCH_ROWS", 5)
    bundle_writer._grouped_csv(bundle / "events.parquet", tmp_path / "batched.csv", kind=kind, keys=keys)
    table = pq.read_table(bundle / "events.parquet")
    if kind is not None:
        table = table.filter(pc.equal(table.column("kind").cast(pa.string()), kind))
    plain = pa.table({name: (table.column(name).cast(pa.string()) if pa.types.is_dictionary(table.column(name).type)
                             else table.column(name)) for name in [*keys, "duration_ns"]})
    whole = plain.group_by(keys).aggregate(
        [("duration_ns", "count"), ("duration_ns", "min"), ("duration_ns", "mean"), ("duration_ns", "max"),
         ("duration_ns", "sum")]).sort_by([(key, "ascending") for key in keys])
    pacsv.write_csv(whole, tmp_path / "whole.csv")
    assert (tmp_path / "batched.csv").read_text() == (tmp_path / "whole.csv").read_text()
    assert len((tmp_path / "whole.csv").read_text().splitlines()) > 2
