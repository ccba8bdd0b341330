"""``dfit run --trace-all`` (issue 29): the traces' default size limit, as ``--help``
states it, and the flag's choice recorded in the run's summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from dfit_mlir.cli.app import main
from dfit_mlir.exporters import trace_plan


def test_run_help_states_the_default_trace_limit() -> None:
    text = " ".join(CliRunner().invoke(main, ["run", "--help"]).output.split())
    assert "--trace-all" in text
    assert f"more than {trace_plan.TRACE_MAX_EVENTS:,} events" in text
    assert f"hold {trace_plan.TRACE_MAX_EVENTS // 2:,} events" in text


@pytest.mark.slow
def test_trace_all_is_in_the_summary(tmp_path: Path, iree_bundles: dict[str, Path]) -> None:
    manifest = iree_bundles["manifest"]
    vmfb = manifest.parent / manifest.name.replace(".manifest.json", ".vmfb")
    for flags, limit in (([], trace_plan.TRACE_MAX_EVENTS), (["--trace-all"], None)):
        out = tmp_path / f"run{len(flags)}"
        result = CliRunner().invoke(main, ["run", str(vmfb), "--repeat", "2", *flags, "-o", str(out)])
        assert result.exit_code == 0, result.output
        summary = json.loads((out / "summary.json").read_text())
        assert summary["policy"]["trace_all"] is bool(flags)
        assert summary["trace"]["max_events"] == limit and summary["trace"]["kept"] == "all"
