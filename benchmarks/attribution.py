"""Semantic correctness of attribution on the open stack (the DFIT paper's figure):
per model, ops per phase and the share of ops attributed to a module path, a source line
and a phase, for models from all four frontends, compiled with ``dfit compile --dfit-tag
--mode ids`` through ``dfit_mlir.frontends``.

Shares are over **non-constant ops** of the source module (constants, ``util.global``
declarations, and the function/return structure are left out, as the paper leaves out
compiler-materialised constants); what is left without a phase or a module path is listed
by op kind. "Source line" counts ops whose call stack holds a model-code line
(:class:`dfit_mlir.frontends.CodeRules`); ONNX and TFLite carry no line by nature.

    .venv/bin/python -m benchmarks.attribution [--out build/attribution] [--only bert,jax-train-step]
        [--flamegraph docs/flamegraph_bert.png]

Prints a Markdown table (paste into ``benchmarks/RESULTS.md``) and writes
``attribution.json`` beside the compiled models.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dfit_mlir.core.lineage import is_constant
from dfit_mlir.core.locations import model_frame
from dfit_mlir.frontends import CodeRules
from dfit_mlir.passes.instrumented_compile import CompileResult, compile_instrumented
from tests import frontend_models, realmodels

STRUCTURAL = frozenset({"func.func", "func.return", "util.func", "util.return"})


def _torch(build: Callable[[], tuple[Any, tuple[Any, ...]]]) -> Callable[[Path], CompileResult]:
    def compile_(out: Path) -> CompileResult:
        from dfit_mlir.frontends import torch as torch_frontend

        model, args = build()
        return torch_frontend.compile(model, args, output=out / "model.vmfb", mode="ids")
    return compile_


def _jax(build: Callable[[], tuple[Any, tuple[Any, ...]]]) -> Callable[[Path], CompileResult]:
    def compile_(out: Path) -> CompileResult:
        from dfit_mlir.frontends import jax as jax_frontend

        fn, args = build()
        return jax_frontend.compile(fn, *args, output=out / "model.vmfb", mode="ids")
    return compile_


def _onnx_from_torch(out: Path) -> CompileResult:
    import torch

    model, args = frontend_models.convnext()
    torch.onnx.export(model, args, str(out / "convnext.onnx"), dynamo=False, opset_version=17)
    source = realmodels.import_onnx(out / "convnext.onnx", out / "convnext.mlir")
    return compile_instrumented(source, out / "model.vmfb", mode="ids", flags=realmodels.IREE_CPU_FLAGS)


def _onnx_wheel(name: str) -> Callable[[Path], CompileResult]:
    def compile_(out: Path) -> CompileResult:
        source = realmodels.onnx_model(name, out)
        return compile_instrumented(source, out / "model.vmfb", mode="ids", flags=realmodels.IREE_CPU_FLAGS)
    return compile_


def _tflite(label: str) -> Callable[[Path], CompileResult]:
    def compile_(out: Path) -> CompileResult:
        source = realmodels.tflite_model(realmodels.TFLITE_MODELS[label], out)
        return compile_instrumented(source, out / "model.vmfb", mode="ids", flags=realmodels.IREE_CPU_FLAGS)
    return compile_


#: label → (frontend, what it is, compile into a folder).
MODELS: dict[str, tuple[str, str, Callable[[Path], CompileResult]]] = {
    "bert": ("PyTorch", "transformers BERT, 3 layers, hidden 64", _torch(frontend_models.bert)),
    "convnext": ("PyTorch", "transformers ConvNext, 2 stages", _torch(frontend_models.convnext)),
    "jax-train-step": ("JAX", "MLP + LN training step: value_and_grad + optax Adam", _jax(frontend_models.jax_train_step)),
    "flax-mlp": ("JAX", "Flax linen MLP (2 blocks + head)", _jax(frontend_models.flax_mlp)),
    "onnx-convnext": ("ONNX", "the ConvNext above via torch.onnx.export", _onnx_from_torch),
    "onnx-squeezenet": ("ONNX", "onnx wheel light_squeezenet (flat node names)", _onnx_wheel("squeezenet")),
    "tflite-mobilenet": ("TFLite", "MobileNet v1 0.25 128 quant (fixtures)", _tflite("mobilenet_v1_0.25_128")),
}


def figures(manifest: dict[str, Any], rules: CodeRules) -> dict[str, Any]:
    ops = [op for op in manifest["operators"] if not is_constant(op["op"]) and op["op"] not in STRUCTURAL]
    n = len(ops)

    def pct(count: int) -> float:
        return round(100 * count / n, 2) if n else 0.0

    with_line = sum(1 for op in ops
                    if model_frame([*op["call_stack"], *([op["source"]] if op["source"] else [])],
                                   rules.is_model_code))
    return {
        "frontend": manifest["input"].get("frontend"),
        "operators": len(manifest["operators"]),
        "non_constant_ops": n,
        "by_phase": dict(Counter(op["phase"] or "(none)" for op in ops).most_common()),
        "module_pct": pct(sum(1 for op in ops if op.get("module_path") is not None)),
        "named_module_pct": pct(sum(1 for op in ops if op.get("module_path"))),
        "line_pct": pct(with_line),
        "phase_pct": pct(sum(1 for op in ops if op.get("phase"))),
        "without_phase": dict(Counter(op["op"] for op in ops if not op.get("phase")).most_common()),
        "without_module": dict(Counter(op["op"] for op in ops if op.get("module_path") is None).most_common()),
        "modules": len({op["module_path"] for op in ops if op.get("module_path") is not None}),
    }


def markdown(rows: dict[str, dict[str, Any]]) -> str:
    phases = ("forward", "loss", "backward", "optimizer", "initializer", "(none)")
    lines = ["| model | frontend | non-const ops | " + " | ".join(phases) + " | module path % | (non-root) % | "
             "model-code line % | phase % | modules | compile s |",
             "|---|---|---:|" + "---:|" * len(phases) + "---:|---:|---:|---:|---:|---:|"]
    for label, row in rows.items():
        counts = " | ".join(str(row["by_phase"].get(p, 0)) for p in phases)
        lines.append(f"| {label} | {row['frontend']} | {row['non_constant_ops']} | {counts} | {row['module_pct']} | "
                     f"{row['named_module_pct']} | {row['line_pct']} | {row['phase_pct']} | {row['modules']} | "
                     f"{row['compile_s']} |")
    left = [f"- {label}: without phase {row['without_phase'] or 'none'}; without module path "
            f"{row['without_module'] or 'none'}" for label, row in rows.items()]
    return "\n".join(lines) + "\n\nLeft unattributed, by op kind:\n" + "\n".join(left) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("build/attribution"))
    parser.add_argument("--only", default="", help="comma-separated model labels")
    parser.add_argument("--flamegraph", type=Path, default=None,
                        help="also write the first model's module-tree flame graph as PNG here")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    labels = [label for label in MODELS if not args.only or label in args.only.split(",")]
    rules = CodeRules.default()
    rows: dict[str, dict[str, Any]] = {}
    for label in labels:
        frontend, what, compile_ = MODELS[label]
        out = args.out / label
        out.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        try:
            result = compile_(out)
        except realmodels.FixtureUnavailable as reason:
            print(f"{label}: skipped ({reason})")
            continue
        row = {"what": what, **figures(result.manifest, rules),
               "compile_s": round(time.perf_counter() - started, 1)}
        row["frontend"] = f"{frontend} ({row['frontend']})"
        rows[label] = row
        print(f"{label}: {row['non_constant_ops']} non-constant ops, module {row['module_pct']}%, "
              f"line {row['line_pct']}%, phase {row['phase_pct']}%", flush=True)
        if args.flamegraph and label == labels[0]:
            from dfit_mlir.analysis.tools.session import analyze

            analyze(result.manifest_path, ["semantic-attribution"], out / "analysis")
            _png_from_analysis(result.manifest, out / "analysis" / "semantic-attribution", args.flamegraph, label)
    (args.out / "attribution.json").write_text(json.dumps(rows, indent=1) + "\n")
    print()
    print(markdown(rows))


def _png_from_analysis(manifest: dict[str, Any], analysis: Path, target: Path, label: str) -> None:
    """The flame graph of the model's module tree as a PNG (docs)."""
    from dfit_mlir.analysis import ledger
    from dfit_mlir.analysis.model import SemanticModel
    from dfit_mlir.exporters import flamegraph
    from dfit_mlir.frontends import module_classes

    model = SemanticModel(manifest)
    # Computing ops only: hoisted constants, loads and shape lists would reorder the tree.
    computing = [op_id for op_id, op in model.operators.items() if op.flops]
    tree = ledger.of(model).module_tree(computing, lambda op_id: module_classes(model.frontend,
                                                                                model.operators[op_id].raw))
    flamegraph.write_png(tree, target, f"{label}: module tree (dfit semantic-attribution)", "flops")
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
