"""The Model Explorer adapter extension (dfit_mlir.views.explorer_adapter) on real bundles:
the convnet compiled and run by IREE (its compile manifest and its full run bundle) and
the reconstructed Edge TPU yolov8n.

Expected values come from the manifest's own JSON (tensors, operators) and from the
ledger's rollup per op (``Ledger.rollup("op_id")``, Arrow group-by), read from a freshly
opened model — not from the adapter's per-row sums. The server test starts Model
Explorer's real server on 127.0.0.1 with the extension and converts the bundle through
the HTTP API the web app uses (``/api/v1/send_command``).
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dfit_mlir.analysis import ledger
from dfit_mlir.analysis.model import SemanticModel, stands_for_partition

pytest.importorskip("model_explorer", reason="ai-edge-model-explorer is not installed (pip install "
                                             "ai-edge-model-explorer==0.1.34)")

from dfit_mlir.views import explorer_adapter  # noqa: E402

FUNCTIONS = {"func.func", "util.func", "builtin.module"}
NUMBERS = ("macs", "flops", "bytes_read", "bytes_written")


def converted(path: Path) -> dict[str, Any]:
    """The adapter's answer as the server sends it (dataclasses → JSON)."""
    from model_explorer.utils import convert_adapter_response

    from dfit_mlir.views.explorer_adapter.main import DfitSemanticModelAdapter

    answer = convert_adapter_response(DfitSemanticModelAdapter().convert(str(path), {}))
    return json.loads(json.dumps(answer))


def expected_nodes(manifest: dict[str, Any], model: SemanticModel) -> set[str]:
    """Every manifest op but functions, ops nested in another op's region and partition
    stand-ins (an Edge TPU custom op)."""
    ops = {op["id"]: op for op in manifest["operators"]}
    return {i for i, op in ops.items() if op["op"] not in FUNCTIONS
            and (op.get("parent") is None or ops[op["parent"]]["op"] in FUNCTIONS)
            and not stands_for_partition(model, model.operators[i])}


def ledger_by_op(path: Path) -> tuple[dict[str, dict[str, Any]], dict[str, set[str]], Any]:
    """(op → its rollup row, op → its partitions, the ledger) of a freshly opened model."""
    book = ledger.of(SemanticModel.open(path))
    rollup = {row["op_id"]: row for row in book.rollup("op_id").to_pylist()}
    partitions: dict[str, set[str]] = {}
    for op_id, part in zip(book.entries.column("op_id").to_pylist(), book.entries.column("partition").to_pylist(),
                           strict=True):
        partitions.setdefault(op_id, set()).add(part)
    return rollup, partitions, book


def attrs_of(node: dict[str, Any]) -> dict[str, str]:
    return {a["key"]: a["value"] for a in node["attrs"]}


def check_graph(graph: dict[str, Any], opened: Path, manifest_path: Path, timed: bool) -> None:
    manifest = json.loads(manifest_path.read_text())
    model = SemanticModel.open(opened)
    nodes = {n["id"]: n for n in graph["nodes"]}
    assert len(graph["nodes"]) == len(nodes) == len(expected_nodes(manifest, model))
    assert set(nodes) == expected_nodes(manifest, model)
    # Namespaces: the module path, one group per component.
    for op in manifest["operators"]:
        if op["id"] in nodes:
            path = model.module_path(op["id"]) or ""
            assert nodes[op["id"]]["namespace"].replace("/", ".") == path.replace("/", "."), op["id"]
    # Edges: exactly the manifest's producer → consumer pairs between drawn ops, each
    # leaving through the producer output that carries that tensor.
    pairs = {(t["producer"], c) for t in manifest.get("tensors", []) for c in t.get("consumers") or ()
             if t.get("producer") in nodes and c in nodes}
    drawn = {(e["sourceNodeId"], n["id"]) for n in graph["nodes"] for e in n["incomingEdges"]}
    assert drawn == pairs
    assert pairs or not manifest.get("tensors")  # a backend without a tensor graph has no edges
    tensors = {(t["producer"], t.get("name") or t["id"]): t for t in manifest["tensors"]}
    for node in graph["nodes"]:
        for edge in node["incomingEdges"]:
            source = nodes[edge["sourceNodeId"]]
            output = next(m for m in source["outputsMetadata"] if m["id"] == edge["sourceNodeOutputId"])
            name = attrs_of(output)["tensor_name"]
            assert node["id"] in tensors[(source["id"], name)]["consumers"]
    # Node data: the ledger's figures on the op's own node.
    rollup, partitions, book = ledger_by_op(opened)
    assert set(rollup) - set(nodes) <= {op.id for op in model.operators.values()
                                        if stands_for_partition(model, op)}
    for op_id, row in rollup.items():
        if op_id not in nodes:
            continue
        attrs = attrs_of(nodes[op_id])
        for name in NUMBERS:
            assert attrs.get(name) == (None if row[name] is None else str(row[name])), (op_id, name)
        # Executed FLOPs: the ledger's, where it knows them (over the run: a run said how
        # many invocations ran; per invocation: its events or the manifest's trip counts).
        assert attrs.get("executed_flops") == (str(row["executed_flops"] or 0) if book.executed_known else None)
        assert attrs.get(ledger.PER_INVOCATION) == (str(round(row[ledger.PER_INVOCATION] or 0, 3))
                                                    if book.per_invocation_known else None), op_id
        assert set(attrs["dispatch"].split("; ")) == partitions[op_id]
        if timed:
            assert math.isclose(float(attrs["time_ns"]), row["time_ns"], abs_tol=0.051), op_id
        else:
            assert "time_ns" not in attrs
    if timed:  # the ops' times add up to what the run attributed
        total = sum(float(attrs_of(n).get("time_ns", 0)) for n in graph["nodes"])
        assert math.isclose(total, book.totals.attributed_ns, rel_tol=1e-4, abs_tol=1)


def test_iree_run_bundle(iree_bundles: dict[str, Path]) -> None:
    bundle = iree_bundles["full"]
    answer = converted(bundle / "manifest.json")
    graph = answer["graphs"][0]
    check_graph(graph, bundle, bundle / "manifest.json", timed=True)
    assert graph["id"] == bundle.name
    assert any(float(attrs_of(n).get("time_ns", 0)) > 0 for n in graph["nodes"])
    namespaces = {n["namespace"] for n in graph["nodes"]}
    assert len(namespaces) > 1  # the convnet's location names are its modules


def test_iree_compile_manifest(iree_bundles: dict[str, Path]) -> None:
    manifest = iree_bundles["manifest"]
    graph = converted(manifest)["graphs"][0]
    check_graph(graph, manifest, manifest, timed=False)
    # No run: executed FLOPs per invocation from the manifest's trip counts (the convnet
    # has no loop: = per trip), none over the whole run.
    attrs = [attrs_of(n) for n in graph["nodes"] if "flops" in attrs_of(n)]
    assert attrs and all("executed_flops" not in a for a in attrs)
    assert all(float(a[ledger.PER_INVOCATION]) == int(a["flops"]) for a in attrs)


def test_edgetpu_bundle(edgetpu_bundle: Path) -> None:
    graph = converted(edgetpu_bundle / "manifest.json")["graphs"][0]
    check_graph(graph, edgetpu_bundle, edgetpu_bundle / "manifest.json",
                timed=ledger.of(SemanticModel.open(edgetpu_bundle)).totals.measured_ns > 0)
    # The 256 ops of the original .tflite are drawn; the custom op standing for 233 of them is not.
    assert len(graph["nodes"]) == 256
    assert not any("edgetpu-custom-op" in n["id"] for n in graph["nodes"])


@pytest.mark.parametrize("backend", ["sambanova", "cerebras"])
def test_other_reconstructed_bundles(request: pytest.FixtureRequest, backend: str) -> None:
    bundle = request.getfixturevalue(f"{backend}_bundle")
    graph = converted(bundle / "manifest.json")["graphs"][0]
    check_graph(graph, bundle, bundle / "manifest.json",
                timed=ledger.of(SemanticModel.open(bundle)).totals.measured_ns > 0)
    assert len({n["namespace"] for n in graph["nodes"]}) > 10  # BERT's module tree


def test_not_a_dfit_model(tmp_path: Path) -> None:
    """Another JSON file given to the adapter, or a path that is not there: one message
    naming the file (Model Explorer shows an adapter's error in the page)."""
    from dfit_mlir.core.errors import InvalidInputError

    other = tmp_path / "graphs.json"
    other.write_text(json.dumps({"label": "not dfit", "subgraphs": []}))
    with pytest.raises(InvalidInputError, match="graphs.json"):
        converted(other)
    with pytest.raises(InvalidInputError, match="nowhere"):
        explorer_adapter.serve(tmp_path / "nowhere", open_browser=False)


def test_node_data_keyed_by_node_id(iree_bundles: dict[str, Path]) -> None:
    """The overlays serve() hands Model Explorer: GraphNodeData documents on node ids,
    loadable by Model Explorer's own builder."""
    from model_explorer.node_data_builder import GraphNodeData, NodeDataResult

    bundle = iree_bundles["full"]
    documents = explorer_adapter.node_data(explorer_adapter.open_model(bundle))
    rollup, _, book = ledger_by_op(bundle)
    assert {"time_ns", "macs", "flops", "bytes", "dispatch", "executed_flops", ledger.PER_INVOCATION} <= set(documents)
    # The executed figure of the whole run beside its time, per trip and per invocation
    # named as such, the source stated.
    assert [documents[f]["name"] for f in ("flops", ledger.PER_INVOCATION, "executed_flops", "time_ns")] == [
        "dfit flops (per trip)", "dfit executed flops (per invocation, from run events)",
        "dfit executed flops (whole run, from run events)", "dfit time (ns, whole run)"]
    assert list(documents)[-2:] == ["executed_flops", "time_ns"]
    for figure, document in documents.items():
        GraphNodeData(results={k: NodeDataResult(**v) for k, v in document["results"].items()},
                      name=document["name"], gradient=document.get("gradient", []))
        for op_id, result in document["results"].items():
            row = rollup[op_id]
            if figure == "time_ns":
                assert math.isclose(result["value"], row["time_ns"], abs_tol=0.051)
            elif figure == "bytes":
                assert result["value"] == (row["bytes_read"] or 0) + (row["bytes_written"] or 0)
            elif figure in ("macs", "flops"):
                assert result["value"] == row[figure]
            elif figure == "executed_flops":  # the convnet runs each op once an invocation
                assert result["value"] == row["executed_flops"] == (row["flops"] or 0) * book.instances
            elif figure == ledger.PER_INVOCATION:
                assert result["value"] == book.per_invocation(row["executed_flops"]) == (row["flops"] or 0)
    static = explorer_adapter.node_data(explorer_adapter.open_model(iree_bundles["manifest"]))
    assert "executed_flops" not in static and "time_ns" not in static
    assert static[ledger.PER_INVOCATION]["name"] == "dfit executed flops (per invocation, from manifest trips)"
    assert static[ledger.PER_INVOCATION]["results"] == documents[ledger.PER_INVOCATION]["results"]


def test_serve_refuses_a_host_other_machines_reach(iree_bundles: dict[str, Path]) -> None:
    from dfit_mlir.core.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match="127.0.0.1"):
        explorer_adapter.serve(iree_bundles["full"], host="0.0.0.0")
    with socket.socket() as taken:  # a port in use: refused before Model Explorer starts
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(InvalidInputError, match=f"--port {port}"):
            explorer_adapter.serve(iree_bundles["full"], port=port, open_browser=False)


def http_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=60) as response:
        return json.loads(response.read().decode())


def wait_until_up(process: subprocess.Popen, base: str, log: Path, deadline_s: float = 180) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"Model Explorer exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{base}/check_health", timeout=5) as response:
                if response.read().decode() == "model_explorer_ok" and "Starting Model Explorer" in log.read_text():
                    return
        except OSError:
            pass
        time.sleep(0.5)
    pytest.fail(f"Model Explorer did not answer within {deadline_s} s:\n{log.read_text()[-3000:]}")


@contextlib.contextmanager
def served(bundle: Path, log: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """``explorer_adapter.serve(bundle)`` in a subprocess on a free 127.0.0.1 port:
    yields (base URL, the ``data`` of the page URL it prints); always stopped."""
    port = explorer_adapter.free_port("127.0.0.1")
    base = f"http://127.0.0.1:{port}"
    script = ("import sys; from dfit_mlir.views.explorer_adapter import serve; "
              "serve(sys.argv[1], port=int(sys.argv[2]), open_browser=False)")
    with log.open("w") as out:
        process = subprocess.Popen([sys.executable, "-u", "-c", script, str(bundle), str(port)],
                                   stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until_up(process, base, log)
        url = next(line for line in log.read_text().splitlines() if line.startswith(base))
        query = urllib.parse.parse_qs(urllib.parse.urlparse(url).query)
        yield base, json.loads(urllib.parse.unquote(query["data"][0]))
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=15)


@pytest.mark.slow
def test_real_server_converts_the_bundle(iree_bundles: dict[str, Path], tmp_path: Path) -> None:
    bundle = iree_bundles["full"]
    with served(bundle, tmp_path / "model-explorer.log") as (base, data):
        extensions = http_json(f"{base}/api/v1/get_extensions")
        assert explorer_adapter.ADAPTER_ID in {e["id"] for e in extensions}
        # The page URL the server prints: the model goes to dfit's adapter, with the overlays.
        assert data["models"] == [{"url": str((bundle / "manifest.json").resolve()),
                                   "adapterId": explorer_adapter.ADAPTER_ID}]
        # What the web app sends to convert a model with an adapter extension.
        command = {"extensionId": explorer_adapter.ADAPTER_ID, "cmdId": "convert",
                   "modelPath": data["models"][0]["url"], "settings": {}, "deleteAfterConversion": False}
        answer = http_json(f"{base}/api/v1/send_command?" + urllib.parse.urlencode({"json": json.dumps(command)}))
        assert "error" not in answer, answer
        graph = answer["graphs"][0]
        check_graph(graph, bundle, bundle / "manifest.json", timed=True)
        nodes = {n["id"] for n in graph["nodes"]}
        rollup, _, _ = ledger_by_op(bundle)
        served_data = [json.loads(http_json(f"{base}/api/v1/load_node_data?node_data_index={i}")["content"])
                       for i in range(len(data["nodeData"]))]
        by_name = {document["name"]: document for document in served_data}
        time_overlay = by_name[explorer_adapter.OVERLAYS["time_ns"]]["results"]
        assert time_overlay and set(time_overlay) <= nodes
        for op_id, result in time_overlay.items():
            assert math.isclose(result["value"], rollup[op_id]["time_ns"], abs_tol=0.051)
        macs_overlay = by_name[explorer_adapter.OVERLAYS["macs"]]["results"]
        assert {k: v["value"] for k, v in macs_overlay.items()} == {
            k: r["macs"] for k, r in rollup.items() if r["macs"] is not None and k in nodes}


def headless_chromium() -> Any:
    """Debian's chromium through its chromedriver (skips, saying why, where absent)."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
    from selenium.webdriver.chrome.service import Service

    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if binary is None or driver is None:
        pytest.skip("Debian's chromium and chromium-driver are not installed")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--use-angle=swiftshader",
                     "--enable-unsafe-swiftshader", "--window-size=1400,900"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(driver), options=options)


@pytest.mark.slow
def test_web_app_draws_the_bundle_with_its_node_data(iree_bundles: dict[str, Path], tmp_path: Path) -> None:
    """Model Explorer's own web app, in headless Chromium: the graph's op count and the
    time overlay's sum over the nodes (its aggregated stats table) are the ledger's."""
    bundle = iree_bundles["full"]
    expected = len(expected_nodes(json.loads((bundle / "manifest.json").read_text()), SemanticModel.open(bundle)))
    rollup, _, _ = ledger_by_op(bundle)
    time_sum = sum(row["time_ns"] for row in rollup.values())
    macs_sum = sum(row["macs"] or 0 for row in rollup.values())
    with served(bundle, tmp_path / "model-explorer.log") as (base, data):
        browser = headless_chromium()
        try:
            browser.get(f"{base}/?data={urllib.parse.quote(json.dumps(data))}")
            deadline, text = time.monotonic() + 90, ""
            while time.monotonic() < deadline and not ("op node count" in text and "Aggregated stats" in text):
                time.sleep(1)
                text = browser.find_element("tag name", "body").text
            browser.save_screenshot(str(tmp_path / "model-explorer.png"))
            print(f"screenshot: {tmp_path / 'model-explorer.png'}")
            lines = text.splitlines()
            assert lines[lines.index("op node count") + 1] == str(expected)
            assert f"{expected} nodes" in lines
            sums = [float(v) for v in next(line for line in lines if line.startswith("Sum ")).split()[1:] if v != "-"]
            assert any(math.isclose(value, time_sum, abs_tol=1) for value in sums), (sums, time_sum)
            assert any(value == macs_sum for value in sums), (sums, macs_sum)
            # The only console errors allowed: the web app's Google Fonts, which this machine cannot reach.
            errors = [e["message"] for e in browser.get_log("browser")
                      if e["level"] == "SEVERE" and "fonts.gstatic.com" not in e["message"]]
            assert not errors, errors
        finally:
            browser.quit()
