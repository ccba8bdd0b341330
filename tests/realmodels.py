"""Real models as IREE inputs, built without any download (tests and benchmarks).

* ONNX: the ``onnx`` wheel ships real architectures (``light_<name>.onnx``: the real
  graph, weights replaced by ``ConstantOfShape`` fills). They are at opset 9, so they
  are upgraded to opset 17 (BatchNormalization does not legalize otherwise), given
  static input dims, and imported with IREE's ONNX importer *Python API*, which puts each
  node's name in its ops' locations (``loc("gpu_0/res2_0_branch2a_1")``); the
  ``iree-import-onnx`` CLI prints without debug info and so drops them. The weight-fill
  nodes have no name in these files; they get their output tensor's name, so that every
  op of the import names the ONNX value it stands for.
* TFLite: real quantized models from ``../shared/fixtures/edgetpu`` converted with
  ``tosa-converter-for-tflite --bytecode --emit-debug-info``; every op then carries its
  TFLite tensor name, ``loc("<tensor name>"("<file>.tflite":0:0))``.

Outputs are cached in a caller-given directory (tests: a session tmp dir; benchmarks:
``build/models``) and written atomically, so parallel or aborted runs never leave a
half-written input behind.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from dfit_mlir.frontends.onnx import IMPORT_OPSET

REPO_ROOT = Path(__file__).resolve().parents[1]
#: The project's shared directory (``../shared`` next to the repository); real TFLite
#: models live in its ``fixtures/edgetpu``.
SHARED_FIXTURES = Path(os.environ.get("DFIT_SHARED_DIR") or REPO_ROOT.parent / "shared")  # a worktree elsewhere
EDGETPU_FIXTURES = SHARED_FIXTURES / "fixtures" / "edgetpu"

#: Models chosen for the tests and the benchmark. Plain ``iree-compile`` (llvm-cpu, host)
#: on a 2-core machine: squeezenet 3.4 s, resnet50 9.4 s, mobilenet_v1_0.25_128 18 s,
#: franco_fc 2.3 s. Left out: shufflenet 7.4 s, inception_v1 13 s, densenet121 21 s
#: (compile, but add time and nothing new); mobilenet_v2_1.0_224_quant fails in IREE 3.13
#: ("'func.func' op exceeded stack allocation limit of 32768 bytes for function. Got
#: 72057594037927936 bytes"); yolov8n compiles but takes 64 s; keras_lstm_mnist_ptq
#: crashes iree-compile (SIGSEGV).
ONNX_MODELS = ("squeezenet", "resnet50")
#: label -> path under ../shared/fixtures/edgetpu
TFLITE_MODELS = {
    "mobilenet_v1_0.25_128": "coral_test_data/mobilenet_v1_0.25_128_quant.tflite",  # CNN: conv, depthwise, softmax
    "franco_fc": "franco_fc_v15/model.tflite",  # MLP: two fully-connected layers, dynamic batch
}

ONNX_OPSET = IMPORT_OPSET
IREE_CPU_FLAGS = (
    "--iree-hal-target-device=local",
    "--iree-hal-local-target-device-backends=llvm-cpu",
    "--iree-llvmcpu-target-cpu=host",
)


class FixtureUnavailable(RuntimeError):
    """A model's source is not on this machine; the message says why (pass it to
    ``pytest.skip``)."""


def shared_fixture(relative: str | os.PathLike[str]) -> Path:
    """``../shared/fixtures/edgetpu/<relative>``, or :class:`FixtureUnavailable`."""
    if not SHARED_FIXTURES.is_dir():
        raise FixtureUnavailable(
            f"{SHARED_FIXTURES} (the repository's ../shared) is absent; "
            "the real TFLite models come from its fixtures/edgetpu"
        )
    path = EDGETPU_FIXTURES / relative
    if not path.is_file():
        raise FixtureUnavailable(f"fixture {path} is missing")
    return path


def skip_unavailable(relative: str | os.PathLike[str]) -> Path:
    """:func:`shared_fixture` for tests: ``pytest.skip`` with the reason when absent."""
    import pytest

    try:
        return shared_fixture(relative)
    except FixtureUnavailable as reason:
        pytest.skip(str(reason))


def onnx_light_path(name: str) -> Path:
    import onnx

    path = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / f"light_{name}.onnx"
    if not path.is_file():
        raise FixtureUnavailable(f"the installed onnx package has no {path.name}")
    return path


def _atomic_target(target: Path) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    return Path(name)


def _publish(tmp: Path, target: Path) -> None:
    with open(tmp, "rb+") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, target)


def prepare_onnx(onnx_path: Path, opset: int = ONNX_OPSET):
    """The model as it is imported (the frontend's :func:`dfit_mlir.frontends.onnx.prepare`)."""
    from dfit_mlir.frontends import onnx as onnx_frontend

    return onnx_frontend.prepare(onnx_path, opset)


def onnx_source_names(name: str) -> set[str]:
    """Every name the import of ``light_<name>.onnx`` can put in a location: node,
    initializer and graph input/output names, and the graph's ``graph:<name>``."""
    graph = prepare_onnx(onnx_light_path(name)).graph
    names = {node.name for node in graph.node}
    names.update(init.name for init in graph.initializer)
    names.update(value.name for value in (*graph.input, *graph.output))
    names.add(f"graph:{graph.name}")
    return names


def import_onnx(onnx_path: Path, target: Path, opset: int = ONNX_OPSET) -> Path:
    """Import ``onnx_path`` into torch-dialect MLIR text at ``target`` with the frontend's
    :func:`dfit_mlir.frontends.onnx.import_model` (node names kept as locations)."""
    from dfit_mlir.frontends import onnx as onnx_frontend

    text = onnx_frontend.import_model(onnx_path, opset)
    tmp = _atomic_target(target)
    try:
        tmp.write_text(text, encoding="utf-8")
        _publish(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def onnx_model(name: str, workdir: str | os.PathLike[str]) -> Path:
    """``light_<name>.onnx`` from the onnx wheel as IREE input MLIR (cached in workdir)."""
    target = Path(workdir) / f"onnx_{name}.mlir"
    if not target.is_file():
        import_onnx(onnx_light_path(name), target)
    return target


def tosa_converter() -> str:
    found = shutil.which("tosa-converter-for-tflite") or str(Path(sys.executable).parent / "tosa-converter-for-tflite")
    if not Path(found).is_file():
        raise FixtureUnavailable("tosa-converter-for-tflite is not installed (pip install tosa-converter-for-tflite)")
    return found


def convert_tflite(tflite_path: Path, target: Path) -> Path:
    tmp = _atomic_target(target)
    try:
        done = subprocess.run(
            [tosa_converter(), str(tflite_path), "--bytecode", "--emit-debug-info", "-o", str(tmp)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0 or tmp.stat().st_size == 0:
            raise RuntimeError(
                f"tosa-converter-for-tflite failed on {tflite_path} (exit {done.returncode}):\n{done.stderr.strip()}"
            )
        _publish(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def tflite_model(path: str | os.PathLike[str], workdir: str | os.PathLike[str]) -> Path:
    """A real ``.tflite`` (absolute, or relative to ``../shared/fixtures/edgetpu``) as
    TOSA bytecode with debug info (cached in workdir)."""
    source = Path(path) if Path(path).is_absolute() else shared_fixture(path)
    if not source.is_file():
        raise FixtureUnavailable(f"fixture {source} is missing")
    target = Path(workdir) / f"tflite_{source.parent.name}_{source.stem}.mlirbc"
    if not target.is_file():
        convert_tflite(source, target)
    return target


def iree_compile(source: Path, output: Path, flags: tuple[str, ...] = IREE_CPU_FLAGS) -> subprocess.CompletedProcess:
    """Plain ``iree-compile`` (no dfit), for timing and as a baseline."""
    from iree.compiler.tools.binaries import find_tool

    return subprocess.run([find_tool("iree-compile"), str(source), *flags, "-o", str(output)],
                          capture_output=True, text=True)
