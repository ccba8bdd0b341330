"""Scale of the Cerebras reconstruction: ``reconstruct()`` over a synthetic compile dump
of N CIRH operators (default 150,000; the DFIT paper's largest evaluated model has
152,682), with its compile report, written into a temporary directory.

The dump is synthetic (written by this script) and shaped like the CIRH of a BERT-style
training step as the printer writes it with debug info: one ``func.func @train_step``
whose arguments are the hidden states, the labels and every layer's parameters; per
layer the forward ops (matmuls, reshapes, softmax, layer norm, gelu, adds), their
gradients in reverse layer order, then one ``cirh.AdamUpdate`` per parameter; every op
carries a location alias (name locations with the module path around call sites into
``torch/nn``, autograd and optimizer frames, a few unknown) defined at the end of the
file; ``compile_report.txt`` lists one row per kernel the ops name.

Wall time is the median of ``--runs`` untraced runs, each in a fresh process; peak
memory is the largest peak resident set of those processes (``ru_maxrss``, interpreter
and imports included); ``--traced`` adds the peak of Python allocations
(``tracemalloc``) from one more, traced run. This script
replaces its section of ``benchmarks/RESULTS.md`` (and prints it).

    python benchmarks/reconstruct_scale.py [--ops 150000] [--runs 3] [--traced] [--keep DIR]

``--run-log-gb G`` measures the text-log side instead: a synthetic SambaFlow run log of
G GiB (and one of G/10 GiB, to show how time and memory scale) with many data-parallel
tasks is written to a temporary file and read by the SambaFlow run-log reader on the
line-reader engine, each in a fresh process; the section ``reconstruct_runlog`` of
``RESULTS.md`` gets its time and peak RSS. The log is never committed.

    python benchmarks/reconstruct_scale.py --run-log-gb 1
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

BEGIN = "<!-- reconstruct_scale:begin -->"
END = "<!-- reconstruct_scale:end -->"
RUN_LOG_BEGIN = "<!-- reconstruct_runlog:begin -->"
RUN_LOG_END = "<!-- reconstruct_runlog:end -->"
#: Tasks of the synthetic data-parallel run, and tqdm redraws per step line (tqdm's
#: default ``mininterval`` of 0.1 s redraws a bar ~40 times over a 4 s step; each
#: redraw is ``\r`` + the bar, on the line the step record then ends).
RUN_LOG_TASKS = 8
RUN_LOG_REDRAWS = 40
TARGET_S = 10.0
COMPILE_HASH = "cs_1527682024040800001"

X = "tensor<8x128x1024xbf16>"
W = "tensor<1024x1024xbf16>"
I4 = "tensor<8x128x4096xbf16>"
WI = "tensor<1024x4096xbf16>"
WO = "tensor<4096x1024xbf16>"
H4 = "tensor<8x16x128x64xbf16>"
KT = "tensor<8x16x64x128xbf16>"
S = "tensor<8x16x128x128xbf16>"
G = "tensor<1024xbf16>"
LABELS = "tensor<8x128xi32>"
LOSS = "tensor<f32>"
ADAM = (
    "beta1 = 0.899999976 : f32, beta2 = 9.990000e-01 : f32, eps = 9.99999997E-7 : f32, "
    "lr = 9.99999974E-5 : f32, weight_decay = 0.00999999977 : f32"
)
MODEL_FILE = "transformers/models/bert/modeling_bert.py"
#: (parameter suffix, type) of each layer's parameters, in argument order.
PARAMETERS = (
    ("attention.self.query.weight", W),
    ("attention.self.key.weight", W),
    ("attention.self.value.weight", W),
    ("attention.output.dense.weight", W),
    ("attention.output.LayerNorm.weight", G),
    ("attention.output.LayerNorm.bias", G),
    ("intermediate.dense.weight", WI),
    ("output.dense.weight", WO),
)
#: Forward, backward and optimizer ops per layer (the loss and its gradient come once).
OPS_PER_LAYER = 17 + 16 + 8


def block_kernel(prefix: str, name: str) -> str:
    """The kernel an op of a layer maps to: one per block of the layer and direction
    (``...attention.self``, ``...attention.self.grad``), as kernel matching covers
    several ops with one kernel."""
    parts = name.split(".")
    block = ".".join(parts[:2]) if parts[0] == "attention" else parts[0]
    return f"{prefix}.{block}" + (".grad" if name.endswith(".grad") else "")


class _TrainStep:
    """Writes the ops of one function and the location aliases they use, numbered as the
    printer numbers them (``#loc``, ``#loc1``, ...), layer by layer."""

    def __init__(self) -> None:
        self.ops: list[str] = []
        self.aliases: list[str] = ["#loc = loc(unknown)"]
        self.kernels: list[str] = []
        self.args: list[str] = []
        self.next_value = 0
        self.files = {
            name: self.alias(f'"{path}":{line}:0')
            for name, path, line in (
                ("linear", "torch/nn/modules/linear.py", 116),
                ("softmax", "torch/nn/functional.py", 1843),
                ("layer_norm", "torch/nn/functional.py", 2543),
                ("gelu", "torch/nn/functional.py", 2243),
                ("cross_entropy", "torch/nn/functional.py", 3059),
                ("autograd", "torch/autograd/__init__.py", 266),
                ("adamw", "cerebras/pytorch/optim/AdamW.py", 178),
            )
        }
        self.trainer = {
            line: self.alias(f'"cerebras/modelzoo/trainer/trainer.py":{line}:0') for line in (388, 395, 402)
        }
        self.autograd = self.alias(f"callsite({self.files['autograd']} at {self.trainer[395]})")
        self.step = self.alias(f"callsite({self.files['adamw']} at {self.trainer[402]})")
        self.model_lines = {
            line: self.alias(f'"{MODEL_FILE}":{line}:0')
            for line in (245, 246, 247, 275, 300, 326, 336, 350, 362, 363, 425, 426, 439, 441)
        }

    def alias(self, text: str) -> str:
        name = f"#loc{len(self.aliases)}"
        self.aliases.append(f"{name} = loc({text})")
        return name

    def arg(self, typ: str, name: str) -> str:
        value = f"%arg{len(self.args)}"
        self.args.append(f'{value}: {typ} loc("{name}")')
        return value

    def op(
        self, name: str, operands: list[str], attrs: str, ins: list[str], outs: list[str], loc: str
    ) -> str:
        result = f"%{self.next_value}"
        self.next_value += 1
        head = f"{result}:{len(outs)}" if len(outs) > 1 else result
        attr_text = f" {{{attrs}}}" if attrs else ""
        out_text = outs[0] if len(outs) == 1 else "(" + ", ".join(outs) + ")"
        self.ops.append(
            f'    {head} = "{name}"({", ".join(operands)}){attr_text} : ({", ".join(ins)}) -> '
            f"{out_text} loc({loc})"
        )
        return result

    def kernel(self, prefix: str, name: str) -> str:
        self.kernels.append(block_kernel(prefix, name))
        return f'cs.kernel = "{self.kernels[-1]}"'

    def forward_layer(self, layer: int, hidden: str) -> dict[str, str]:
        """The forward ops of one encoder layer; returns what its backward needs."""
        prefix = f"bert.encoder.layer.{layer}"
        p = [self.arg(typ, f"{prefix}.{suffix}") for suffix, typ in PARAMETERS]

        def scope(module: str, line: int, inner: str | None = None) -> str:
            named = self.alias(f'"{prefix}.{module}"({self.model_lines[line]})')
            return self.alias(f"callsite({self.files[inner]} at {named})") if inner else named

        loc = {
            "q": scope("attention.self.query", 245, "linear"),
            "k": scope("attention.self.key", 246, "linear"),
            "v": scope("attention.self.value", 247, "linear"),
            "self": scope("attention.self", 275),
            "scores": scope("attention.self", 300),
            "softmax": scope("attention.self", 326, "softmax"),
            "ctx": scope("attention.self", 336),
            "ctxr": scope("attention.self", 350),
            "aod": scope("attention.output.dense", 362, "linear"),
            "aoadd": scope("attention.output", 363),
            "ln": scope("attention.output.LayerNorm", 363, "layer_norm"),
            "inter": scope("intermediate.dense", 425, "linear"),
            "gelu": scope("intermediate.intermediate_act_fn", 426, "gelu"),
            "outd": scope("output.dense", 439, "linear"),
            "outadd": scope("output", 441),
        }

        def matmul(name: str, module: str, a: str, b: str, ins: list[str], out: str, at: str) -> str:
            return self.op(
                "cirh.MatMul",
                [a, b],
                f'{self.kernel(prefix, name)}, cs.layer = "{prefix}.{module}"',
                ins,
                [out],
                at,
            )

        q = matmul("attention.self.query.fc", "attention.self.query", hidden, p[0], [X, W], X, loc["q"])
        k = matmul("attention.self.key.fc", "attention.self.key", hidden, p[1], [X, W], X, loc["k"])
        v = matmul("attention.self.value.fc", "attention.self.value", hidden, p[2], [X, W], X, loc["v"])
        q4 = self.op("cirh.Reshape", [q], "", [X], [H4], loc["self"])
        v4 = self.op("cirh.Reshape", [v], "", [X], [H4], loc["self"])
        kt = self.op("cirh.Transpose", [k], "perm = array<i64: 0, 2, 3, 1>", [X], [KT], "#loc")
        scores = matmul("attention.self.scores", "attention.self", q4, kt, [H4, KT], S, loc["scores"])
        probs = self.op(
            "cirh.Softmax",
            [scores],
            f"{self.kernel(prefix, 'attention.self.softmax')}, dim = -1 : i64",
            [S],
            [S],
            loc["softmax"],
        )
        ctx = matmul("attention.self.context", "attention.self", probs, v4, [S, H4], H4, loc["ctx"])
        ctx3 = self.op("cirh.Reshape", [ctx], "", [H4], [X], loc["ctxr"])
        attn = matmul(
            "attention.output.dense.fc", "attention.output.dense", ctx3, p[3], [X, W], X, loc["aod"]
        )
        res = self.op("cirh.Add", [attn, hidden], "", [X, X], [X], loc["aoadd"])
        normed = self.op(
            "cirh.LayerNorm",
            [res, p[4], p[5]],
            f"{self.kernel(prefix, 'attention.output.LayerNorm')}, epsilon = 9.9999999999999998E-13 : f64",
            [X, G, G],
            [X],
            loc["ln"],
        )
        inter = matmul("intermediate.dense.fc", "intermediate.dense", normed, p[6], [X, WI], I4, loc["inter"])
        act = self.op(
            "cirh.Gelu",
            [inter],
            f'approximate = "none", {self.kernel(prefix, "intermediate.gelu")}',
            [I4],
            [I4],
            loc["gelu"],
        )
        out = matmul("output.dense.fc", "output.dense", act, p[7], [I4, WO], X, loc["outd"])
        output = self.op("cirh.Add", [out, normed], "", [X, X], [X], loc["outadd"])
        return {
            "prefix": prefix,
            "input": hidden,
            "output": output,
            "q4": q4,
            "v4": v4,
            "kt": kt,
            "probs": probs,
            "ctx3": ctx3,
            "res": res,
            "normed": normed,
            "inter": inter,
            "act": act,
            **{f"p{i}": value for i, value in enumerate(p)},
            **{f"loc_{key}": value for key, value in loc.items()},
        }

    def backward_layer(self, state: dict[str, str], grad: str) -> tuple[str, list[tuple[str, str, str, str]]]:
        """The gradient ops of one layer; returns the input gradient and, per parameter,
        (parameter, gradient, type, parameter name)."""
        prefix = state["prefix"]
        p = [state[f"p{i}"] for i in range(len(PARAMETERS))]

        def grad_op(op: str, name: str, operands: list[str], ins: list[str], outs: list[str], at: str) -> str:
            return self.op(op, operands, self.kernel(prefix, name), ins, outs, at)

        g_out = grad_op(
            "cirh.MatMulGrad",
            "output.dense.fc.grad",
            [grad, state["act"], p[7]],
            [X, I4, WO],
            [I4, WO],
            state["loc_outd"],
        )
        g_act = grad_op(
            "cirh.GeluGrad",
            "intermediate.gelu.grad",
            [f"{g_out}#0", state["inter"]],
            [I4, I4],
            [I4],
            state["loc_gelu"],
        )
        g_inter = grad_op(
            "cirh.MatMulGrad",
            "intermediate.dense.fc.grad",
            [g_act, state["normed"], p[6]],
            [I4, X, WI],
            [X, WI],
            state["loc_inter"],
        )
        g_sum = self.op("cirh.Add", [f"{g_inter}#0", grad], "", [X, X], [X], self.autograd)
        g_ln = grad_op(
            "cirh.LayerNormGrad",
            "attention.output.LayerNorm.grad",
            [g_sum, state["res"], p[4]],
            [X, X, G],
            [X, G, G],
            state["loc_ln"],
        )
        g_aod = grad_op(
            "cirh.MatMulGrad",
            "attention.output.dense.fc.grad",
            [f"{g_ln}#0", state["ctx3"], p[3]],
            [X, X, W],
            [X, W],
            state["loc_aod"],
        )
        g_ctx4 = self.op("cirh.Reshape", [f"{g_aod}#0"], "", [X], [H4], "#loc")
        g_ctx = grad_op(
            "cirh.MatMulGrad",
            "attention.self.context.grad",
            [g_ctx4, state["probs"], state["v4"]],
            [H4, S, H4],
            [S, H4],
            state["loc_ctx"],
        )
        g_probs = grad_op(
            "cirh.SoftmaxGrad",
            "attention.self.softmax.grad",
            [f"{g_ctx}#0", state["probs"]],
            [S, S],
            [S],
            state["loc_softmax"],
        )
        g_scores = grad_op(
            "cirh.MatMulGrad",
            "attention.self.scores.grad",
            [g_probs, state["q4"], state["kt"]],
            [S, H4, KT],
            [H4, KT],
            state["loc_scores"],
        )
        g_q = self.op("cirh.Reshape", [f"{g_scores}#0"], "", [H4], [X], "#loc")
        g_k = self.op("cirh.Transpose", [f"{g_scores}#1"], "perm = array<i64: 0, 3, 1, 2>", [KT], [X], "#loc")
        g_v = self.op("cirh.Reshape", [f"{g_ctx}#1"], "", [H4], [X], "#loc")
        g_wq = grad_op(
            "cirh.MatMulGrad",
            "attention.self.query.fc.grad",
            [g_q, state["input"], p[0]],
            [X, X, W],
            [X, W],
            state["loc_q"],
        )
        g_wk = grad_op(
            "cirh.MatMulGrad",
            "attention.self.key.fc.grad",
            [g_k, state["input"], p[1]],
            [X, X, W],
            [X, W],
            state["loc_k"],
        )
        g_wv = grad_op(
            "cirh.MatMulGrad",
            "attention.self.value.fc.grad",
            [g_v, state["input"], p[2]],
            [X, X, W],
            [X, W],
            state["loc_v"],
        )
        grads = [
            f"{g_wq}#1",
            f"{g_wk}#1",
            f"{g_wv}#1",
            f"{g_aod}#1",
            f"{g_ln}#1",
            f"{g_ln}#2",
            f"{g_inter}#1",
            f"{g_out}#1",
        ]
        updates = [(p[i], grads[i], typ, f"{prefix}.{suffix}") for i, (suffix, typ) in enumerate(PARAMETERS)]
        return f"{g_wq}#0", updates


def synthetic_cirh(ops: int) -> tuple[str, list[str]]:
    """(module text, kernel names) of a train step with about ``ops`` operators."""
    step = _TrainStep()
    hidden = step.arg(X, "hidden_states")
    layers = []
    for layer in range(max(1, (ops - 2) // OPS_PER_LAYER)):
        layers.append(step.forward_layer(layer, hidden))
        hidden = layers[-1]["output"]
    labels = step.arg(LABELS, "labels")
    loss_loc = step.alias(f"callsite({step.files['cross_entropy']} at {step.trainer[388]})")
    loss = step.op(
        "cirh.CrossEntropyLoss", [hidden, labels], 'cs.kernel = "loss"', [X, LABELS], [LOSS], loss_loc
    )
    grad = step.op(
        "cirh.CrossEntropyLossGrad",
        [hidden, labels],
        'cs.kernel = "loss.grad"',
        [X, LABELS],
        [X],
        step.autograd,
    )
    step.kernels += ["loss", "loss.grad", "optimizer.adamw"]
    updates: list[tuple[str, str, str, str]] = []
    for state in reversed(layers):
        grad, layer_updates = step.backward_layer(state, grad)
        updates += layer_updates
    results = [loss]
    for parameter, gradient, typ, parameter_name in updates:
        loc = step.alias(f'"{parameter_name.rsplit(".", 1)[0]}"({step.step})')
        results.append(
            step.op(
                "cirh.AdamUpdate",
                [parameter, gradient],
                f'{ADAM}, cs.kernel = "optimizer.adamw", cs.param = "{parameter_name}"',
                [typ, typ],
                [typ],
                loc,
            )
        )
    result_types = [LOSS] + [typ for _, _, typ, _ in updates]
    lines = [
        "// SYNTHETIC: a CIRH-shaped train step written by benchmarks/reconstruct_scale.py "
        "(not a vendor file).",
        "module {",
        f"  func.func @train_step({', '.join(step.args)}) -> ({', '.join(result_types)}) {{",
        *step.ops,
        f"    return {', '.join(results)} : {', '.join(result_types)} loc({step.trainer[402]})",
        f"  }} loc({step.trainer[388]})",
        "} loc(#loc)",
        *step.aliases,
    ]
    return "\n".join(lines) + "\n", list(dict.fromkeys(step.kernels))


def compile_report(kernels: list[str]) -> str:
    width = max(len("Kernel Name"), *(len(name) for name in kernels)) + 2
    columns = (
        "Samples/s",
        "Compute Samples/s",
        "Transmission Samples/s",
        "Active PEs",
        "Compute Utilization",
    )
    border = "+" + "-" * width + "+" + "+".join("-" * (len(c) + 2) for c in columns) + "+"
    lines = [
        "# SYNTHETIC: compile report written by benchmarks/reconstruct_scale.py (not a vendor file).",
        "Estimated Overall Performance",
        "-------------------------------",
        "Samples/s:                    2321.9",
        "Compute Samples/s:            2321.9",
        "Transmission Samples/s:       2430.7",
        "Active PEs:                   93%",
        "Compute Utilization:          80%",
        border,
        "| " + "Kernel Name".ljust(width - 1) + "|" + "|".join(f" {c} " for c in columns) + "|",
        border,
    ]
    for index, name in enumerate(kernels):
        cells = ("2321.9", "2321.9", "14311.7", str(100 + index % 5000), f"{60 + index % 40}%")
        lines.append(
            "| "
            + name.ljust(width - 1)
            + "|"
            + "|".join(f" {v.rjust(len(c))} " for v, c in zip(cells, columns, strict=True))
            + "|"
        )
    lines.append(border)
    return "\n".join(lines) + "\n"


def write_dump(directory: Path, ops: int) -> Path:
    """A compile directory ``cs_<hash>/`` with ``cirh.mlir`` and ``compile_report.txt``."""
    dump = directory / COMPILE_HASH
    dump.mkdir(parents=True, exist_ok=True)
    text, kernels = synthetic_cirh(ops)
    (dump / "cirh.mlir").write_text(text)
    (dump / "compile_report.txt").write_text(compile_report(kernels))
    return dump


def measure(dump: Path, *, traced: bool = False) -> dict[str, Any]:
    """Reconstruct ``dump`` once; wall seconds, what was recovered and, when ``traced``,
    the peak of Python allocations (tracing slows the run several times)."""
    from dfit_mlir.adapters.cerebras import reconstruct

    if traced:
        tracemalloc.start()
    started = time.perf_counter()
    recovery = reconstruct([dump])
    elapsed = time.perf_counter() - started
    result: dict[str, Any] = {"seconds": elapsed}
    if traced:
        result["traced_peak_mib"] = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
    phases: dict[str, int] = {}
    for op in recovery.operators:
        phases[str(op.phase)] = phases.get(str(op.phase), 0) + 1
    joins = {join["join"]: join for join in recovery.attributes["joins"]}
    result.update(
        operators=len(recovery.operators),
        tensors=len(recovery.tensors),
        kernels=len(recovery.partitions),
        joined_kernels=joins.get("cirh cs.kernel = compile_report kernel row", {}).get("kernels", 0),
        parsers=sorted({source.parser for source in recovery.sources if source.parser}),
        phases=phases,
        peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    )
    return result


def measure_in_child(dump: Path, traced: bool) -> dict[str, Any]:
    """:func:`measure` in a fresh interpreter, so that its peak RSS is the
    reconstruction's (plus the interpreter and its imports), not the generator's."""
    command = [sys.executable, __file__, "--measure", str(dump), *(["--traced"] if traced else [])]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(done.stdout)


def write_run_log(path: Path, size: int) -> dict[str, int]:
    """A SambaFlow 1.17-style run log of about ``size`` bytes: the job header and SLURM
    environment, then steps of ``RUN_LOG_TASKS`` interleaved tasks, each step line a run
    of tqdm redraws ending in the app logger's step record, a Python warning with its
    source echo now and then, and per task the final throughput dictionary."""
    header = (
        "Model:  BertLarge\nDate:  04/07/24\nTime:  09:52\n\n"
        "sambaflow/focal,focal,now 1.17.7-27 amd64 [installed]\nMachine State Before: \n"
        "Platform: DataScale SN30-8\n\nRUN\nSLURM_NTASKS=8\nSLURM_JOB_ID=40123\n"
        "RUN COMMAND: srun --ntasks=8 python hook.py run --pef=/home/u/bertlrg/bertlrg.pef\n"
    )
    total_steps = 0
    records = 0
    with path.open("w", encoding="utf-8") as stream:
        stream.write(header)
        written = len(header)
        step = 0
        while written < size:
            step += 1
            chunk = []
            for task in range(RUN_LOG_TASKS):
                pid = 3613040 + task
                bars = "".join(
                    f"\rIteration:  {step * 100 // 2549 % 100:2d}%|██▍       | {step - 1}/2549 "
                    f"[{step // 60:02d}:{step % 60:02d}<34:20,  {1.18 + r / 1000:.2f}it/s]"
                    for r in range(RUN_LOG_REDRAWS)
                )
                second = step % 60
                chunk.append(
                    f"{bars}2024-04-07 10:{step // 60 % 60:02d}:{second:02d},226 - apps.trainer - "
                    f"Process ID {pid} - info     - epoch:0|local_step:{step}|global_step:{step}|"
                    f"average_loss:{9 + task / 10:.5f}|step_loss:{9 + step % 7 / 10:.5f}|step_ns_loss:0.66190\n"
                )
                records += 1
            if step % 500 == 0:
                chunk.append(
                    "/usr/local/lib/python3.8/site-packages/torch/overrides.py:1349: DeprecationWarning: "
                    "Defining your `__torch_function__ as a plain method is deprecated\n"
                    '  warnings.warn("Defining your `__torch_function__ as a plain method is deprecated")\n'
                )
            text = "".join(chunk)
            stream.write(text)
            written += len(text.encode())
            total_steps = step
        tail = "".join(
            f"2024-04-07 11:00:00,000 - apps.trainer - Process ID {3613040 + task} - info     - "
            "{'e2e_train_time': 4403.3, 'training_sequences_per_second': 1234.5}\n"
            for task in range(RUN_LOG_TASKS)
        )
        stream.write(tail)
    return {"steps": total_steps, "step_records": records, "bytes": path.stat().st_size}


def measure_run_log(path: Path) -> dict[str, Any]:
    """Read the run log once (in this process): first the engine alone (every line
    decoded, cleaned and accounted for, nothing kept), then the run-log reader."""
    from dfit_mlir.adapters.lines import read_file
    from dfit_mlir.adapters.sambanova.run_log import SambaFlowRunLogReader

    started = time.perf_counter()
    engine_cpu = time.process_time()
    read_file(path, lambda line: True)
    engine_s, engine_cpu = time.perf_counter() - started, time.process_time() - engine_cpu
    engine_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    started = time.perf_counter()
    cpu = time.process_time()
    recovery = SambaFlowRunLogReader(path).read()
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    [source] = recovery.sources
    assert source.lines is not None
    return {
        "seconds": elapsed,
        "cpu_seconds": cpu,
        "engine_seconds": engine_s,
        "engine_cpu_seconds": engine_cpu,
        "engine_peak_rss_mib": engine_rss,
        "lines": source.lines.total,
        "unparsed": source.lines.unparsed,
        "measurements": len(recovery.measurements),
        "tasks": len(recovery.attributes.get("task_pids", [])),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def run_log_section(gigabytes: float, command: str) -> list[str]:
    started = dt.datetime.now(dt.timezone.utc)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in (gigabytes / 10, gigabytes):
            path = Path(tmp) / "BertLarge.out"
            t0 = time.perf_counter()
            shape = write_run_log(path, int(size * 2**30))
            generate_s = time.perf_counter() - t0
            done = subprocess.run(
                [sys.executable, __file__, "--measure-run-log", str(path)], check=True, capture_output=True, text=True
            )
            rows.append({**shape, **json.loads(done.stdout), "generate_s": generate_s})
            path.unlink()
    lines = [
        RUN_LOG_BEGIN,
        "## SambaFlow run log scale: a synthetic 1 GB data-parallel run log, streamed",
        "",
        f"Measured {started.strftime('%Y-%m-%d %H:%M UTC')} on {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}. The log (written by the script to a temporary file, then "
        f"deleted) has the SN30 job header, {RUN_LOG_TASKS} data-parallel tasks interleaving their step "
        f"records, each behind {RUN_LOG_REDRAWS} tqdm redraws on its line, a Python warning every 500 steps "
        "and the tasks' throughput dictionaries. In a fresh process it is read first by the line-reader "
        "engine alone (each line read in a bounded piece, decoded, cleaned and accounted for; nothing kept: "
        "the streaming bound), then by `SambaFlowRunLogReader` (the engine plus its rules, keeping every "
        "figure). Wall and CPU seconds are given (the machine is shared); peak memory is the process's peak "
        "resident set (interpreter and imports included). Command:",
        "",
        "```",
        command,
        "```",
        "",
        "| log (MiB) | lines | step records | engine alone: s (CPU s) | peak RSS (MiB) "
        "| run-log reader: s (CPU s) | MiB/s (CPU) | measurements | unparsed | peak RSS (MiB) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        mib = row["bytes"] / 2**20
        lines.append(
            f"| {mib:,.0f} | {row['lines']:,} | {row['step_records']:,} | "
            f"{row['engine_seconds']:.1f} ({row['engine_cpu_seconds']:.1f}) | {row['engine_peak_rss_mib']:,.0f} | "
            f"{row['seconds']:.1f} ({row['cpu_seconds']:.1f}) | {mib / row['cpu_seconds']:,.0f} | "
            f"{row['measurements']:,} | {row['unparsed']:,} | {row['peak_rss_mib']:,.0f} |"
        )
    small, large = rows
    lines += [
        "",
        f"10x the log: the engine alone {large['engine_cpu_seconds'] / small['engine_cpu_seconds']:.1f}x the CPU "
        f"time at a peak RSS of {small['engine_peak_rss_mib']:,.0f} → {large['engine_peak_rss_mib']:,.0f} MiB "
        f"(bounded); the reader {large['cpu_seconds'] / small['cpu_seconds']:.1f}x the CPU time, its peak RSS "
        f"{small['peak_rss_mib']:,.0f} → {large['peak_rss_mib']:,.0f} MiB following the figures it keeps "
        "(two per step record), not the size of the file.",
        "",
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=150_000, help="operators in the dump (default 150000)")
    parser.add_argument("--keep", type=Path, default=None, help="write the dump here and keep it")
    parser.add_argument("--runs", type=int, default=3, help="timed runs, each in a fresh process (default 3)")
    parser.add_argument("--traced", action="store_true", help="also measure tracemalloc's peak (slower)")
    parser.add_argument("--measure", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--run-log-gb", type=float, default=None,
                        help="measure the run-log reader on a synthetic log of this many GiB instead")
    parser.add_argument("--measure-run-log", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure is not None:
        print(json.dumps(measure(args.measure, traced=args.traced)))
        return 0
    if args.measure_run_log is not None:
        print(json.dumps(measure_run_log(args.measure_run_log)))
        return 0
    if args.run_log_gb is not None:
        if args.run_log_gb <= 0:
            parser.error("--run-log-gb must be positive")
        from benchmarks.compile_overhead import command_line, publish

        command = command_line(__file__, argv)

        publish(run_log_section(args.run_log_gb, command), begin=RUN_LOG_BEGIN, end=RUN_LOG_END)
        return 0
    if args.ops < OPS_PER_LAYER + 2:
        parser.error(f"--ops must be at least {OPS_PER_LAYER + 2}")
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    from benchmarks.compile_overhead import command_line, publish

    command = command_line(__file__, argv)
    started = dt.datetime.now(dt.timezone.utc)
    with tempfile.TemporaryDirectory() as tmp:
        directory = args.keep or Path(tmp)
        t0 = time.perf_counter()
        dump = write_dump(directory, args.ops)
        generate_s = time.perf_counter() - t0
        size = sum(path.stat().st_size for path in dump.iterdir()) / 2**20
        runs = [measure_in_child(dump, traced=False) for _ in range(args.runs)]
        traced = measure_in_child(dump, traced=True) if args.traced else None
    seconds = sorted(run["seconds"] for run in runs)
    run = runs[0]
    median = statistics.median(seconds)
    rss = max(item["peak_rss_mib"] for item in runs)
    lines = [
        BEGIN,
        "## Cerebras reconstruction scale: a synthetic CIRH dump",
        "",
        f"Measured {started.strftime('%Y-%m-%d %H:%M UTC')} on {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}. The dump (written by the script in {generate_s:.1f} s, "
        f"{size:.1f} MiB: `cirh.mlir` + `compile_report.txt`) is reconstructed by "
        f"`dfit_mlir.adapters.cerebras.reconstruct`, {len(runs)} times, each in a fresh process: the time is "
        "the median (all runs listed); peak memory is the largest peak resident set of those processes "
        "(`ru_maxrss`, interpreter and imports included)"
        + (
            ", peak traced the peak of Python allocations (`tracemalloc`) in one more, traced run"
            if traced
            else ""
        )
        + ". Command:",
        "",
        "```",
        command,
        "```",
        "",
        "| operators | tensors | kernels (joined to report rows) | parser | reconstruct (s), median "
        "| runs (s) | ops/s | peak RSS (MiB) |" + (" peak traced (MiB) |" if traced else "") + " ≤ 10 s |",
        "|---:|---:|---:|---|---:|---|---:|---:|" + ("---:|" if traced else "") + ":-:|",
        f"| {run['operators']:,} | {run['tensors']:,} | {run['kernels']:,} ({run['joined_kernels']:,}) | "
        f"{', '.join(run['parsers'])} | {median:.2f} | {', '.join(f'{value:.2f}' for value in seconds)} | "
        f"{run['operators'] / median:,.0f} | {rss:,.0f} |"
        + (f" {traced['traced_peak_mib']:,.0f} |" if traced else "")
        + f" {'yes' if median <= TARGET_S else '**no**'} |",
        "",
        "Operators by phase: "
        + ", ".join(f"{key} {value:,}" for key, value in sorted(run["phases"].items()))
        + ".",
    ]
    publish(lines, begin=BEGIN, end=END)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
