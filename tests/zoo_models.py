"""The model zoo: real models from registry packages, each of a different family, taken
through the front door (``dfit compile --dfit-tag``, ``dfit run --mode full --repeat 5``
with default inputs, ``dfit analyze --tool all``), for ``tests/test_zoo.py`` and
``benchmarks/zoo.py``.

Sources, built without any download:

* PyTorch and JAX: the model files in ``examples/zoo/`` (``make_model()`` /
  ``make_step()``), random weights from ``transformers`` configs, Flax and plain JAX;
* ONNX: light models of the ``onnx`` wheel (real graphs, weights as constant fills);
* TFLite: real quantized models of ``../shared/fixtures/edgetpu``, converted to TOSA
  bytecode by ``tosa-converter-for-tflite`` (``dfit compile`` takes MLIR).

:func:`run_zoo_model` runs the three commands in this process (click's runner: the
CLI's code, exit statuses and messages, without a Python start per command) and reads
back what a user would look at: the manifest, the run's dispatch events and
``sites.csv``.
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests import realmodels

ZOO = realmodels.REPO_ROOT / "examples" / "zoo"
#: Ops that are no computation of the model (the function frame); constants are left
#: out by :func:`dfit_mlir.core.lineage.is_constant`.
STRUCTURAL = frozenset({"func.func", "func.return", "util.func", "util.return"})
REPEAT = 5


@dataclass(frozen=True)
class ZooModel:
    """One zoo entry: ``source(workdir)`` gives the file ``dfit compile`` takes;
    ``repeat``: invocations ``dfit run`` records."""

    name: str
    frontend: str
    family: str
    source: Callable[[Path], Path] = field(repr=False)
    repeat: int = REPEAT


def _example(name: str) -> Callable[[Path], Path]:
    return lambda workdir: ZOO / f"{name}.py"


def _onnx(name: str) -> Callable[[Path], Path]:
    return lambda workdir: realmodels.onnx_light_path(name)


def _tflite(label: str) -> Callable[[Path], Path]:
    return lambda workdir: realmodels.tflite_model(realmodels.TFLITE_MODELS[label], workdir)


MODELS = (
    ZooModel("gpt2", "PyTorch", "GPT-2 decoder (transformers)", _example("gpt2")),
    ZooModel("llama", "PyTorch", "Llama decode step with a KV cache: RoPE, RMSNorm, SDPA, GQA (transformers)",
             _example("llama")),
    ZooModel("bert", "PyTorch", "BERT encoder (transformers)", _example("bert")),
    ZooModel("vit", "PyTorch", "Vision Transformer (transformers)", _example("vit")),
    ZooModel("resnet", "PyTorch", "ResNet, BatchNorm (transformers)", _example("resnet")),
    ZooModel("mobilenet_v2", "PyTorch", "MobileNetV2, BatchNorm + depthwise (transformers)",
             _example("mobilenet_v2")),
    ZooModel("unet", "PyTorch", "UNet: GroupNorm, upsampling, skips (own module)", _example("unet")),
    ZooModel("shared_weights", "PyTorch", "shared Linear + tied embedding head (own module)",
             _example("shared_weights")),
    ZooModel("jax_flax_cnn_train", "JAX", "Flax CNN training step, optax SGD", _example("jax_flax_cnn_train")),
    ZooModel("jax_scan_transformer", "JAX", "transformer layers under lax.scan", _example("jax_scan_transformer")),
    ZooModel("jax_greedy_decode", "JAX", "greedy decode under lax.while_loop", _example("jax_greedy_decode")),
    ZooModel("jax_mlp_mixer", "JAX", "Flax MLP-Mixer", _example("jax_mlp_mixer")),
    ZooModel("keras_cnn_train", "JAX", "Keras 3 CNN training step: BatchNorm state, plain SGD",
             _example("keras_cnn_train")),
    ZooModel("onnx_squeezenet", "ONNX", "SqueezeNet (onnx wheel light model)", _onnx("squeezenet")),
    ZooModel("onnx_shufflenet", "ONNX", "ShuffleNet (onnx wheel light model)", _onnx("shufflenet")),
    ZooModel("tflite_mobilenet_v1", "TFLite", "MobileNet v1 0.25 quantized (fixtures)",
             _tflite("mobilenet_v1_0.25_128")),
    ZooModel("tflite_franco_fc", "TFLite", "fully-connected MLP, dynamic batch (fixtures)", _tflite("franco_fc")),
)
BY_NAME = {model.name: model for model in MODELS}


@dataclass(frozen=True)
class ZooResult:
    """What the three commands left: paths, outputs, the compile's CPU seconds."""

    model: ZooModel
    vmfb: Path
    manifest: dict[str, Any]
    bundle: Path
    analysis: Path
    compile_s: float
    compile_output: str
    run_output: str
    frontend_mlir: Path | None

    @property
    def sites(self) -> list[dict[str, str]]:
        with (self.analysis / "semantic-attribution" / "sites.csv").open() as handle:
            return list(csv.DictReader(handle))

    def dispatch_events(self) -> list[dict[str, Any]]:
        import pyarrow.parquet as pq

        table = pq.read_table(self.bundle / "events.parquet", columns=["kind", "invocation", "site", "root_id"])
        return [row for row in table.to_pylist() if row["kind"] == "dispatch"]


class ZooCommandFailed(AssertionError):
    """A dfit command exited non-zero (the message has its output)."""


def dfit(*arguments: str) -> str:
    """Run one ``dfit`` command in this process; its output, or :class:`ZooCommandFailed`."""
    from click.testing import CliRunner

    from dfit_mlir.cli.app import main

    result = CliRunner().invoke(main, list(arguments), catch_exceptions=False)
    if result.exit_code != 0:
        raise ZooCommandFailed(f"dfit {' '.join(arguments)} exited {result.exit_code}:\n{result.output[-3000:]}")
    return result.output


def run_zoo_model(model: ZooModel, workdir: Path) -> ZooResult:
    """``dfit compile --dfit-tag``, ``dfit run --mode full --repeat N`` (default inputs),
    ``dfit analyze --tool all``, into ``workdir``."""
    workdir.mkdir(parents=True, exist_ok=True)
    source = model.source(workdir)
    vmfb = workdir / f"{model.name}.vmfb"
    started = cpu_seconds()
    compiled = dfit("compile", str(source), "--dfit-tag", "-o", str(vmfb), "--force")
    return run_and_analyze(model, vmfb, workdir, compiled, cpu_seconds() - started)


def cpu_seconds() -> float:
    """CPU seconds of this process (all threads) and its finished children: on a shared
    machine, wall time measures the neighbours; CPU time, the work."""
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def run_and_analyze(model: ZooModel, vmfb: Path, workdir: Path, compiled: str, compile_s: float) -> ZooResult:
    """The run and analysis steps of :func:`run_zoo_model` for a compiled ``vmfb``."""
    from dfit_mlir.core import manifest as manifest_io

    bundle = workdir / "run"
    ran = dfit("run", str(vmfb), "--mode", "full", "--repeat", str(model.repeat), "-o", str(bundle), "--force")
    analysis = bundle / "analysis"
    dfit("analyze", str(bundle), "--tool", "all", "--force")
    mlir = vmfb.with_suffix(".mlir")
    return ZooResult(model, vmfb, manifest_io.load(manifest_io.default_path(vmfb)), bundle, analysis, compile_s,
                     compiled, ran, mlir if mlir.is_file() else None)


def non_constant_ops(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    from dfit_mlir.core.lineage import is_constant

    return [op for op in manifest["operators"] if not is_constant(op["op"]) and op["op"] not in STRUCTURAL]


def attribution_shares(manifest: dict[str, Any]) -> dict[str, float]:
    """Shares (0–1) of non-constant ops with a module path and with a model-code line."""
    from dfit_mlir.core.locations import model_frame
    from dfit_mlir.frontends import CodeRules

    rules = CodeRules.default()
    ops = non_constant_ops(manifest)
    with_line = sum(1 for op in ops if model_frame([*op["call_stack"], *([op["source"]] if op["source"] else [])],
                                                   rules.is_model_code))
    with_module = sum(1 for op in ops if op.get("module_path") is not None)
    return {"ops": len(ops), "module": with_module / len(ops) if ops else 0.0,
            "line": with_line / len(ops) if ops else 0.0}
