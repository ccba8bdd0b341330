"""The model zoo through the front door (``tests/zoo_models.py``): 17 real models of
different families from the four frontends, each compiled with ``dfit compile
--dfit-tag``, run with ``dfit run --mode full --repeat 5`` on default inputs and
analyzed with ``dfit analyze --tool all``, once per session (every test of a model reads
the same artifacts).

Per model: every dispatch event resolves to a site and an ID, in each of the 5
invocations the same number of dispatches ran (the inputs do not change between
invocations), ≥ 99 % of the non-constant ops carry a module path, and the top of
``sites.csv`` is the model's own code (a model-code source line for PyTorch and JAX, a
node / tensor name for ONNX and TFLite, which carry no source lines).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests import realmodels, zoo_models

pytestmark = [
    pytest.mark.zoo,
    pytest.mark.frontends,
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:While compiling, we found certain side effects:UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]


@pytest.fixture(scope="session")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``zoo(name)``: that model's :class:`~tests.zoo_models.ZooResult`, made on first use."""
    root = tmp_path_factory.mktemp("zoo")
    done: dict[str, zoo_models.ZooResult] = {}

    def result(name: str) -> zoo_models.ZooResult:
        if name not in done:
            try:
                done[name] = zoo_models.run_zoo_model(zoo_models.BY_NAME[name], root / name)
            except realmodels.FixtureUnavailable as reason:
                pytest.skip(str(reason))
        return done[name]
    return result


NAMES = [model.name for model in zoo_models.MODELS]


def test_the_zoo_has_sixteen_families_from_four_frontends() -> None:
    assert len(zoo_models.MODELS) >= 16
    assert len({model.family for model in zoo_models.MODELS}) == len(zoo_models.MODELS)
    assert {model.frontend for model in zoo_models.MODELS} == {"PyTorch", "JAX", "ONNX", "TFLite"}


@pytest.mark.parametrize("name", NAMES)
def test_every_dispatch_of_every_invocation_is_resolved(zoo: Any, name: str) -> None:
    result = zoo(name)
    events = result.dispatch_events()
    assert events, result.run_output
    assert all(event["site"] is not None and event["root_id"] for event in events)
    per_invocation = Counter(event["invocation"] for event in events)
    assert sorted(per_invocation) == list(range(result.model.repeat))
    assert len(set(per_invocation.values())) == 1, per_invocation  # same inputs, same dispatches
    summary = json.loads((result.bundle / "summary.json").read_text())
    assert summary["repeat"] == result.model.repeat and summary["dropped_events"] == 0
    assert "dispatches: " in result.compile_output and "attributed to source IDs" in result.compile_output


@pytest.mark.parametrize("name", NAMES)
def test_ops_carry_module_paths(zoo: Any, name: str) -> None:
    shares = zoo_models.attribution_shares(zoo(name).manifest)
    assert shares["ops"] > 0 and shares["module"] >= 0.99, shares


#: Model code where a PyTorch or JAX model's lines are (its own file, or the
#: architecture's ``modeling_*.py`` of transformers).
MODEL_CODE = ("/examples/zoo/", "/transformers/models/")


@pytest.mark.parametrize("name", NAMES)
def test_model_code_tops_the_sites(zoo: Any, name: str) -> None:
    result = zoo(name)
    sites = result.sites
    assert sites, result.analysis
    top = sites[:3]
    if result.model.frontend in ("PyTorch", "JAX"):
        assert all(row["site_kind"] == "source" for row in top), top
        assert all(any(part in row["site"] for part in MODEL_CODE) for row in top), top
        assert not any("/torch/" in row["site"] or "/jax/" in row["site"] or "/flax/" in row["site"]
                       for row in top), top
    else:  # ONNX node names and TFLite tensor names: the model's own graph
        assert all(row["site_kind"] == "module" and row["site"] for row in top), top
        names = {op["module_path"] for op in result.manifest["operators"] if op.get("module_path")}
        # The root is the model's own only where its tensors carry flat names (franco_fc's
        # are `tfl.fully_connected`, `StatefulPartitionedCall:0_int8`: no layer path).
        root_ops = [op for op in zoo_models.non_constant_ops(result.manifest) if op.get("module_path") == ""]
        flat = bool(root_ops) and all(op["name_path"] and "/" not in op["name_path"][-1] for op in root_ops)
        assert all(row["site"] in names or (row["site"] == "(root)" and flat) for row in top), top


def test_every_analysis_tool_wrote_its_outputs(zoo: Any) -> None:
    result = zoo("gpt2")
    written = {path.name for path in result.analysis.iterdir()}
    assert {"semantic-attribution", "memory-proxy", "program-analyzer", "compile-metrics", "overhead"} <= written
    verdicts = [line for line in (result.analysis / "memory-proxy" / "report.txt").read_text().splitlines()
                if "fit" in line]
    assert len(verdicts) == 1 and verdicts[0].startswith("main: fits: ")


def test_jax_training_step_reports_memory_for_its_entry_point_only(zoo: Any) -> None:
    """A Flax training step has private JAX helpers; memory-proxy gives one verdict, main's."""
    result = zoo("jax_flax_cnn_train")
    private = [op["id"] for op in result.manifest["operators"]
               if op["parent"] is None and op["op"] == "func.func" and op["id"] != "main"]
    assert private  # the helpers exist
    lines = [line for line in (result.analysis / "memory-proxy" / "report.txt").read_text().splitlines()
             if ": fits" in line or "does not fit" in line]
    assert [line.split(":")[0] for line in lines] == ["main"]


def test_dynamic_batch_records_the_size_used(zoo: Any) -> None:
    """franco_fc's batch is dynamic: the run says which size it used, and how to choose it."""
    result = zoo("tflite_franco_fc")
    summary = json.loads((result.bundle / "summary.json").read_text())
    made = summary["inputs"][0]
    assert None in made["declared_shape"] and None not in made["shape"]
    assert made["shape"][made["declared_shape"].index(None)] == 1
    assert "ran with 1x" in made["dynamic"] and "--input" in made["dynamic"]


def test_gpt2_logits_equal_torch(zoo: Any, tmp_path: Path) -> None:
    """The decoder's mask rewrites (diff, ``True & mask``, bool and/or) change no value:
    IREE's logits for the example tokens equal eager PyTorch's."""
    import numpy as np
    import torch

    from dfit_mlir.frontends.model_file import default_factory
    from dfit_mlir.frontends.torch import load_module_file

    result = zoo("gpt2")
    source = zoo_models.ZOO / "gpt2.py"
    model, args = load_module_file(source, default_factory(source))
    with torch.no_grad():
        expected = model(*args).logits.numpy()
    np.save(tmp_path / "ids.npy", args[0].numpy())
    got = _run_once(result.vmfb, tmp_path / "ids.npy")
    assert np.allclose(got, expected, atol=1e-4), float(np.abs(got - expected).max())


def test_llama_decode_step_with_a_kv_cache_equals_torch(zoo: Any) -> None:
    """The zoo's Llama takes one decode step with a ``DynamicCache`` filled by a 7-token
    prompt: IREE's logits and grown cache, for the cache and token of the model file,
    equal eager PyTorch's (atol 1e-5; measured 6e-8). The cache crosses the export as
    the keys of every layer, then the values, in and out; the grown cache's ``cat`` runs
    in each layer's attention module, on the model's ``cache.update`` line."""
    import copy
    import inspect

    import numpy as np
    import torch
    from iree import runtime

    from dfit_mlir.frontends.torch import load_module_file

    result = zoo("llama")
    model, args = load_module_file(zoo_models.ZOO / "llama.py")
    token, _, _, cache = args
    flat = [token, *(layer.keys for layer in cache.layers), *(layer.values for layer in cache.layers)]
    with torch.no_grad():
        eager = model(token, None, None, copy.deepcopy(cache))
    grown = eager.past_key_values.layers
    expected = [eager.logits, *(layer.keys for layer in grown), *(layer.values for layer in grown)]
    module = runtime.load_vm_flatbuffer_file(str(result.vmfb), driver="local-sync")
    got = [np.asarray(tensor) for tensor in module.main(*(tensor.numpy() for tensor in flat))]
    assert [g.shape for g in got] == [tuple(e.shape) for e in expected] == [(1, 1, 64), *[(1, 2, 8, 8)] * 4]
    for have, want in zip(got, expected, strict=True):
        assert np.allclose(have, want.numpy(), atol=1e-5), float(np.abs(have - want.numpy()).max())
    # The cache's ``cat``s: two per layer (keys, values), on the model's ``cache.update`` line.
    update_line = next(number for number, line in enumerate(Path(inspect.getsourcefile(type(model.model.layers[0]
                       .self_attn))).read_text().splitlines(), 1) if "cache.update(key_states" in line)
    concats = Counter(op["module_path"] for op in result.manifest["operators"] if op["op"] == "torch.aten.cat"
                      and op["source"] and op["source"]["line"] == update_line
                      and op["source"]["file"].endswith("modeling_llama.py"))
    assert concats == {f"model.layers.{n}.self_attn": 2 for n in range(2)}, concats


def _run_once(vmfb: Path, ids: Path) -> Any:
    import numpy as np
    from iree import runtime

    module = runtime.load_vm_flatbuffer_file(str(vmfb), driver="local-sync")
    return np.asarray(module.main(np.load(ids)))


def test_index_outside_the_vocabulary_is_refused_with_its_size(zoo: Any, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from dfit_mlir.cli.app import main

    result = zoo("gpt2")
    refused = CliRunner().invoke(main, ["run", str(result.vmfb), "--mode", "ids", "--input", "1x8xi64=64",
                                        "-o", str(tmp_path / "run")])
    assert refused.exit_code == 2
    assert "holds the index 64" in refused.output and "valid indices 0..63" in refused.output
    assert not (tmp_path / "run").exists()


def test_greedy_decode_start_token_defaults_inside_the_vocabulary(zoo: Any, tmp_path: Path) -> None:
    """The decoder's start token reaches ``params["embed"][token]`` through the
    ``while_loop``'s state, a ``select`` and a ``dynamic_slice``: it is drawn below the
    vocabulary (it was 0, the end token), and the run of 5 invocations is resolved."""
    result = zoo("jax_greedy_decode")
    start = json.loads((result.bundle / "summary.json").read_text())["inputs"][3]
    assert start["made"] == "integers-below" and start["bound"] == 32, start
    assert "dynamic_slice" in start["reason"] and "32x16 table" in start["reason"], start
    # The run's own draw (seed 0), made again from the manifest: not the end token 0.
    from dfit_mlir.runtime_hooks import inputs

    made, _ = inputs.default_inputs(inputs.signature(result.manifest, "main"), tmp_path, manifest=result.manifest,
                                    function="main")
    assert 0 < int(np.load(made[3][1:])) < 32


def test_jax_token_ids_reaching_a_gather_through_a_select_index_the_table(zoo: Any) -> None:
    """``params["embed"][ids]`` lowers to ``select(ids < 0, ids + V, ids)`` before the
    gather: the default ids are drawn below the table's size, not left at zeros."""
    result = zoo("jax_scan_transformer")
    ids = json.loads((result.bundle / "summary.json").read_text())["inputs"][-1]
    assert ids["made"] == "integers-below" and "through a select" in ids["reason"], ids
    assert 0 < ids["bound"] <= 64
