"""The tool API: hooks in order (live and replayed sessions alike), the session's state
machine, the tool registry with its entry points, table export, and the rule that tools
see only the semantic model (no adapter imports)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from dfit_mlir.adapters.base import UnsupportedStep
from dfit_mlir.analysis.tools import HOOKS, SemanticModel, Session, Tool, ToolContext
from dfit_mlir.analysis.tools import registry as tool_registry
from dfit_mlir.analysis.tools.session import SessionError
from dfit_mlir.core.errors import InvalidInputError
from tests.conftest import CONVNET, REPO, vendor_fixture

DFIT = [sys.executable, "-m", "dfit_mlir"]


class Recorder(Tool):
    """Records every hook it sees (a test tool)."""

    name = "recorder"

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.events = 0

    def on_register(self, registry: Any) -> None:
        self.calls.append("on_register")

    def on_init(self, ctx: ToolContext) -> None:
        self.calls.append("on_init")
        ctx.state["seen_model_at_init"] = ctx.model is not None

    def on_compile_begin(self, ctx: ToolContext) -> None:
        self.calls.append("on_compile_begin")

    def on_compile_end(self, ctx: ToolContext) -> None:
        self.calls.append("on_compile_end")
        ctx.state["operators"] = len(ctx.require_model().operators)

    def on_load(self, ctx: ToolContext) -> None:
        self.calls.append("on_load")

    def on_run_begin(self, ctx: ToolContext) -> None:
        self.calls.append("on_run_begin")

    def on_event(self, ctx: ToolContext, batch: Any) -> None:
        if self.calls[-1] != "on_event":
            self.calls.append("on_event")
        self.events += batch.num_rows

    def on_run_end(self, ctx: ToolContext) -> None:
        self.calls.append("on_run_end")

    def on_shutdown(self, ctx: ToolContext) -> None:
        self.calls.append("on_shutdown")
        ctx.export_table("summary", [{"operators": ctx.state["operators"], "events": self.events}],
                         formats=("csv", "parquet", "json"))

    def report(self, ctx: ToolContext) -> str:
        return f"{self.events} events"


def test_replayed_bundle_calls_every_hook_in_order(iree_bundles: dict[str, Path], tmp_path: Path) -> None:
    tool = Recorder()
    with Session([tool], tmp_path) as session:
        model = session.analyze(iree_bundles["full"])
    assert tool.calls == list(HOOKS)
    assert tool.events == model.events().num_rows > 0
    out = tmp_path / "recorder"
    assert pq.read_table(out / "summary.parquet").to_pylist() == [{"operators": 60, "events": tool.events}]
    assert json.loads((out / "summary.json").read_text()) == [{"operators": 60, "events": tool.events}]
    assert (out / "summary.csv").read_text().splitlines() == ["operators,events", f"60,{tool.events}"]
    assert session.state == "closed" and session.contexts["recorder"].state["seen_model_at_init"] is False


def test_live_session_compiles_runs_and_streams_events(tmp_path: Path) -> None:
    tool = Recorder()
    session = Session([tool], tmp_path / "out", backend="iree")
    compiled = session.compile(CONVNET, tmp_path / "m.vmfb", mode="ids")
    assert tool.calls[-1] == "on_compile_end" and session.state == "compiled"
    model = session.run(compiled.vmfb, tmp_path / "bundle", mode="full", repeat=2)
    reports = session.close()
    assert tool.calls == [h for h in HOOKS if h != "on_load"]
    assert tool.events == model.events().num_rows and reports == {"recorder": f"{tool.events} events"}


def test_discovered_session_reconstructs_and_replays(tmp_path: Path) -> None:
    tool = Recorder()
    session = Session.for_inputs([vendor_fixture("edgetpu/franco_fc_v15")], [tool], tmp_path / "out")
    assert session.adapter.name == "edgetpu"
    model = session.reconstruct([vendor_fixture("edgetpu/franco_fc_v15")], tmp_path / "bundle")
    session.close()
    assert model.backend == "edgetpu" and tool.calls == list(HOOKS)
    assert session.contexts["recorder"].state["operators"] == len(model.operators) > 0


def test_session_state_machine(tmp_path: Path) -> None:
    session = Session([], tmp_path)
    with pytest.raises(SessionError, match="no backend adapter"):
        session.load(tmp_path / "x.vmfb")
    closed = Session([], tmp_path)
    closed.close()
    with pytest.raises(SessionError, match="cannot go from closed to ran"):
        closed._move("ran")
    with pytest.raises(UnsupportedStep, match="the edgetpu backend cannot compile here"):
        Session([], tmp_path, backend="edgetpu").compile(Path("m.tflite"), tmp_path / "m.out")


def test_every_backend_bundle_replays(iree_bundles: dict[str, Path], edgetpu_bundle: Path, sambanova_bundle: Path,
                                      cerebras_bundle: Path, tmp_path: Path) -> None:
    for index, bundle in enumerate([*iree_bundles.values(), edgetpu_bundle, sambanova_bundle, cerebras_bundle]):
        tool = Recorder()
        with Session([tool], tmp_path / str(index)) as session:
            model = session.analyze(bundle)
        events = model.events().num_rows
        assert tool.calls == [h for h in HOOKS if events or h != "on_event"], bundle
        assert tool.events == events


def test_runtime_records_join_to_partitions(iree_bundles: dict[str, Path], tmp_path: Path) -> None:
    model = SemanticModel.open(iree_bundles["full"])
    events = model.events().to_pylist()
    dispatches = [e for e in events if e["kind"] == "dispatch"]
    assert all(model.partition_of_event(e).root_id == e["root_id"] for e in dispatches)
    assert all(model.partition_of_event(e) is None for e in events if e["kind"] in ("queue", "memory"))
    # Reconstruction service: artifacts in, the same model out; a record naming a group
    # joins to it.
    cerebras = SemanticModel.from_artifacts(
        [REPO / "tests" / "inputs" / "cerebras"], tmp_path / "cerebras", backend="cerebras")
    assert cerebras.reconstructed and cerebras.backend == "cerebras"
    kernel = next(p for p in cerebras.partitions if p.kind == "kernel")
    assert cerebras.partition_of_event({"kind": "metric", "site": None, "partition": kernel.id}) == kernel
    assert cerebras.partition_of_event({"kind": "metric", "site": None, "partition": "no-such-group"}) is None


def test_semantic_model_services(iree_bundles: dict[str, Path], edgetpu_bundle: Path) -> None:
    model = SemanticModel.open(iree_bundles["full"])
    assert model.backend == "iree" and not model.reconstructed and model.exposes("per_op_timing")
    first = model.partitions[0]
    assert first.kind == "dispatch" and first.root_id == "main/linalg.conv_2d_nhwc_hwcf#0"
    assert "main/linalg.generic#0" in first.operator_ids
    assert model.source_of("main/linalg.conv_2d_nhwc_hwcf#0") == "convnet.py:21:16"
    assert model.static_cost("main/linalg.matmul#0")[0] == 3136 * 32
    assert model.lineage("main/linalg.matmul#0")["source"] == "preserved"
    edge = SemanticModel.open(edgetpu_bundle)
    assert edge.reconstructed and not edge.exposes("per_op_timing")
    assert sorted({p.kind for p in edge.partitions}) == ["cpu", "edgetpu-custom-op"]


# --- registry -------------------------------------------------------------------------

def test_tool_registry_entry_points() -> None:
    toy = metadata.EntryPoint(name="toy-tool", value="tests.test_tools_api:Recorder", group=tool_registry.ENTRY_POINT_GROUP)
    assert isinstance(tool_registry.create("toy-tool", [toy]), Recorder)
    clash = metadata.EntryPoint(name="overhead", value="tests.test_tools_api:Recorder",
                                group=tool_registry.ENTRY_POINT_GROUP)
    with pytest.raises(tool_registry.ToolRegistryError, match="'overhead' is provided twice: by built-in"):
        tool_registry.providers([clash])
    not_a_tool = metadata.EntryPoint(name="nat", value="tests.test_tools_api:test_tool_registry_entry_points",
                                     group=tool_registry.ENTRY_POINT_GROUP)
    with pytest.raises(tool_registry.ToolRegistryError, match="is not a dfit Tool"):
        tool_registry.create("nat", [not_a_tool])
    with pytest.raises(InvalidInputError, match="unknown tool 'nope'; known: compile-metrics"):
        tool_registry.create("nope", [])


def test_tools_never_import_backend_code() -> None:
    """Tools see the semantic model only: no adapter, pass or runtime-hook imports."""
    forbidden = ("dfit_mlir.adapters", "dfit_mlir.passes", "dfit_mlir.runtime_hooks", "adapters", "passes",
                 "runtime_hooks", "iree")
    modules = sorted((REPO / "dfit_mlir" / "analysis" / "tools" / "builtin").glob("*.py"))
    modules += sorted((REPO / "examples" / "external_tool").rglob("*.py"))
    assert len(modules) >= 2
    for path in modules:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for name in names:
                assert not any(name == f or name.startswith(f + ".") for f in forbidden), f"{path}: imports {name}"


def test_table_export_rejects_unknown_formats(tmp_path: Path) -> None:
    ctx = ToolContext(Recorder(), tmp_path, {}, "iree", {"backend": "iree"})
    with pytest.raises(ValueError, match="table format 'xlsx'"):
        ctx.export_table("t", [{"a": 1}], formats=("xlsx",))
    ctx.export_table("empty", [], formats=("csv",))
    assert (tmp_path / "empty.csv").read_text() == "\n"


@pytest.mark.parametrize("args, message", [
    (["--tool", "nope"], "unknown tool 'nope'"),
    (["--tool", "overhead", "--option", "overhead"], "expected TOOL.KEY=VALUE"),
])
def test_analyze_cli_errors(iree_bundles: dict[str, Path], tmp_path: Path, args: list[str], message: str) -> None:
    result = subprocess.run([*DFIT, "analyze", str(iree_bundles["full"]), *args, "--out", str(tmp_path / "o")],
                            capture_output=True, text=True)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr
