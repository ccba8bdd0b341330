"""PyTorch through iree-turbine (``aot.export``).

The FX graph ``torch.export`` produces has, per node, ``nn_module_stack`` (every module
the node runs in, outermost first, with its path and class) and ``stack_trace`` (the
Python frames). The importer turns the stack trace into a call-site location chain
(``callsite(modeling_bert.py:179 at ... )``) and drops the module stack. :func:`compile`
carries it over: while importing, each node's location is wrapped in one NameLoc naming
the module stack, outermost first, ``path:Class`` entries joined by ``;``:
``loc("nn.Module::BertModel;encoder:BertEncoder;...;encoder.layer.0.attention.self.query:Linear"(<call sites>))``. A name
location is debug information only: IDs (assigned afterwards, over op structure) and the
code IREE generates do not change (``tests/test_frontend_torch.py`` checks that the
executables equal a plain compile's).

The importer gives every op it makes for no FX node (hoisted parameters and buffers:
``torch.vtensor.literal``, ``util.global.load``, ``torch_c.from_builtin_tensor``,
``util.global``; the function and its ``func.return``) the location of the graph's
*first* node, so all of a model's weights would land on its first submodule.
:func:`relocate_scaffolding` fixes that after import: a parameter takes the location of
the ops that use it when they all sit in one module; a parameter used from several
modules (tied embeddings) or from none goes to the root module; the function and its
return go to the root module.

Per op: module path and short class from that name (``""``: the root module), source op
= the torch op (``torch.aten.linear``), phase ``forward`` (an exported inference graph),
except a parameter at the root (no single module uses it), whose phase is
``initializer``.

What torch.export does silently, the export says (one stderr line each):

* a Python ``int``/``float``/``bool`` argument is folded into the graph as a constant
  (:func:`baked_scalar_arguments`);
* ``torch.utils.checkpoint`` regions are inlined once: the graph recomputes nothing, so
  there is no ``recompute`` (nor ``backward``) op; a forward that computes gradients does
  not export, and the error says why (:func:`training_calls`);
* the stack stops at a call into a callable object a module holds (diffusers'
  ``return self.processor(``): those ops take the line that runs the module instead
  (:func:`fall_back_from_dispatch_calls`).
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dfit_mlir.core.errors import EXIT_TOOLCHAIN_FAILED, DfitError
from dfit_mlir.frontends import SourceModel
from dfit_mlir.frontends.torch_caches import register_cache_pytrees

#: Prefix of the NameLoc carrying a node's innermost nn.Module: ``nn.Module:<path>:<Class>``.
MODULE_NAME_PREFIX = "nn.Module:"
#: Ops the importer emits to materialise a parameter or buffer (not an FX node's op).
PARAMETER_OPS = frozenset({"torch.vtensor.literal", "util.global.load", "torch_c.from_builtin_tensor"})
#: Default target when the caller gives no iree-compile flags: this machine's CPU.
DEFAULT_FLAGS = (
    "--iree-hal-target-device=local",
    "--iree-hal-local-target-device-backends=llvm-cpu",
    "--iree-llvmcpu-target-cpu=host",
)


def module_name(stack: Sequence[tuple[str, str]]) -> str:
    """``nn.Module:<path>:<Class>;...`` for a module stack, outermost first."""
    return MODULE_NAME_PREFIX + ";".join(f"{path}:{module_class}" for path, module_class in stack)


def parse_module_name(name: str) -> list[tuple[str, str]] | None:
    """``nn.Module::BertModel;encoder:BertEncoder`` → ``[("", "BertModel"), ("encoder",
    "BertEncoder")]`` (outermost first); ``None`` for any other name."""
    if not name.startswith(MODULE_NAME_PREFIX):
        return None
    stack = []
    for entry in name[len(MODULE_NAME_PREFIX):].split(";"):
        path, _, module_class = entry.rpartition(":")
        stack.append((path, module_class))
    return stack


def module_stack(node: Any) -> list[tuple[str, str]]:
    """(path, short class name) of every module an FX node runs in, outermost first."""
    stack = node.meta.get("nn_module_stack") or {}
    found = []
    for path, module_type in stack.values():
        name = module_type if isinstance(module_type, str) else getattr(module_type, "__qualname__", str(module_type))
        found.append((_clean_path(str(path)), name.rsplit(".", 1)[-1]))
    return found


def _clean_path(path: str) -> str:
    """Dynamo spells some paths as attribute accesses (``L['self'].encoder.layer[0]``);
    the module path is ``encoder.layer.0``."""
    import re

    path = re.sub(r"^L\['self'\]\.?", "", path)
    path = re.sub(r"\._modules\['([^']+)'\]", r".\1", path)
    return re.sub(r"\[(\d+)\]", r".\1", path).strip(".")


class TorchFrontend:
    name = "torch"

    def recognizes(self, operators: Sequence[dict[str, Any]]) -> bool:
        return any(op["op"].startswith(("torch.aten.", "torch.prim.")) for op in operators)

    def source_model(self, op: dict[str, Any]) -> SourceModel:
        source_op = op["op"] if op["op"].startswith("torch.") else None
        stack = self.module_classes(op)
        if stack:
            path, module_class = list(stack.items())[-1]
            # A parameter no single module uses was put at the root: an initial value.
            phase = "initializer" if path == "" and op["op"] in PARAMETER_OPS else "forward"
            return SourceModel(module_path=path, module_class=module_class, source_op=source_op, phase=phase)
        return SourceModel(source_op=source_op)

    def module_classes(self, op: dict[str, Any]) -> dict[str, str]:
        """Module path → class of every module the op runs in, outermost first."""
        for name in op.get("name_path") or ():
            found = parse_module_name(name)
            if found:
                return dict(found)
        return {}

    def finish(self, operators: Sequence[dict[str, Any]]) -> None:
        pass


FRONTEND = TorchFrontend()


@contextlib.contextmanager
def module_locations() -> Iterator[None]:
    """While active, the FX importer wraps each node's location in a NameLoc naming the
    node's innermost nn.Module (see the module docstring). Restores the importer on exit."""
    from iree.compiler import ir
    from iree.compiler.extras import fx_importer

    original = fx_importer.ContextCache.get_node_location

    def located(self: Any, node: Any) -> Any:
        loc = original(self, node)
        note = node.meta.get(STACK_CUT_META)
        if note is not None:  # said beside the frames (name_path), inside the module name
            child = loc if loc is not None else ir.Location.unknown(context=self._c)
            loc = ir.Location.name(STACK_CUT_PREFIX + note, childLoc=child, context=self._c)
        stack = module_stack(node)
        if not stack:
            return loc
        child = loc if loc is not None else ir.Location.unknown(context=self._c)
        return ir.Location.name(module_name(stack), childLoc=child, context=self._c)

    fx_importer.ContextCache.get_node_location = located
    try:
        yield
    finally:
        fx_importer.ContextCache.get_node_location = original


# --- where torch.export cuts the stack -------------------------------------------------

#: Node meta key (set by :func:`fall_back_from_dispatch_calls`) holding the note of a node
#: whose stack torch.export cut at a call into a callable object.
STACK_CUT_META = "dfit_stack_cut"
#: Prefix of the NameLoc carrying that note (an op's ``name_path`` entry).
STACK_CUT_PREFIX = "torch.export stack cut: "
#: One frame of an FX node's ``stack_trace``: file, line, function, then the code line.
_STACK_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)')
#: A frame line that hands its work to an attribute of the module: ``return self.processor(``.
_SELF_CALL = re.compile(r"^(?:return\s+|[\w\s,.\[\]]+=\s*)?self\.(\w+)\(")


@dataclass(frozen=True, slots=True)
class StackCut:
    """Where torch.export stopped a node's stack: the model's ``forward`` line ``where``
    (``attention_processor.py:607``, ``code``: ``return self.processor(``) calls the
    module's callable ``attribute`` (an ``AttnProcessor2_0``), whose own frames torch.export
    does not keep (it keeps ``forward`` frames only), so the ops the callable runs all
    end on that one line, whatever they are."""

    where: str
    code: str
    module_path: str
    attribute: str
    callee: str

    def note(self) -> str:
        return (f"{self.where} `{self.code}` calls {self.callee} (self.{self.attribute} of {self.module_path or '<root>'}),"
                f" whose lines torch.export does not keep; site: the line that runs {self.module_path or 'the model'}")


def fall_back_from_dispatch_calls(graph_module: Any, model: Any, rules: Any = None) -> list[StackCut]:
    """Give each node whose innermost model frame is a call into a callable object held
    by its module (diffusers' ``Attention.forward``: ``return self.processor(attn, ...)``)
    the line that runs that module instead, and a note saying so; in place, the cuts
    found (one per distinct line).

    torch.export keeps only the ``forward`` frames of a stack; the callable's
    ``__call__`` is not one, so every op it runs (the projections, the attention, the
    output projection: 96 ops of a small UNet) had ``return self.processor(`` as its
    deepest line, one line for self- and cross-attention of every block. The frame is
    dropped from the node's stack trace, so its site becomes the line in the parent's
    ``forward`` that runs the module (``attn_output = self.attn1(``); the note
    (``name_path``: ``torch.export stack cut: …``) says which line was cut and why. A call
    of a method or a function (``self._conv_forward(``, ``get_timestep_embedding(``)
    names what it calls and is kept."""
    from dfit_mlir.frontends import CodeRules

    rules = rules or CodeRules.default()
    found: dict[str, StackCut] = {}
    for node in graph_module.graph.nodes:
        trace = node.meta.get("stack_trace")
        if not trace or node.op != "call_function":
            continue
        frames = list(_STACK_FRAME.finditer(trace))
        model_frames = [frame for frame in frames if rules.is_model_code(frame.group(1))]
        if not model_frames:
            continue
        frame = model_frames[-1]
        cut = _dispatch_call(frame, node, model)
        if cut is None:
            continue
        found.setdefault(cut.where, cut)
        node.meta["stack_trace"] = trace[:frame.start()] + trace[frame.end():].lstrip("\n ")
        node.meta[STACK_CUT_META] = cut.note()
    return list(found.values())


def _dispatch_call(frame: Any, node: Any, model: Any) -> StackCut | None:
    """The cut at ``frame`` (a ``forward`` line calling ``self.<attribute>(``, where the
    attribute is a callable object, not a module, a method or a function), else ``None``."""
    import inspect

    import torch

    file, line, function, code = frame.group(1), frame.group(2), frame.group(3), frame.group(4).strip()
    call = _SELF_CALL.match(code)
    if function != "forward" or call is None:
        return None
    for path, _ in reversed(module_stack(node)):
        try:
            module = model.get_submodule(path)
        except AttributeError:
            continue
        try:
            defined_in = inspect.getsourcefile(type(module).forward)
        except (TypeError, OSError):  # a forward with no Python source (a builtin, a C extension)
            continue
        if defined_in is None or Path(defined_in).resolve() != Path(file).resolve():
            continue
        callee = getattr(module, call.group(1), None)
        if callee is None or isinstance(callee, torch.nn.Module) or inspect.isroutine(callee) or \
                not callable(callee) or isinstance(callee, type):
            return None
        return StackCut(where=f"{file}:{line}", code=code, module_path=path, attribute=call.group(1),
                        callee=f"{type(callee).__qualname__}.__call__")
    return None


def _location_name(location: Any) -> str | None:
    """The name of a NameLoc (``loc("name"(child))`` or ``loc("name")``), else ``None``."""
    import re

    match = re.match(r'loc\("((?:[^"\\]|\\.)*)"([()])', str(location))
    return match.group(1) if match else None


def relocate_scaffolding(module: Any) -> None:
    """Give hoisted parameters the location of the module that uses them, and the
    function and its return the root module's (see the module docstring). In place."""
    from iree.compiler import ir

    operation = getattr(module, "operation", module)  # an ir.Module or its module op
    context = operation.context
    body = operation.regions[0].blocks[0].operations
    root = None
    for function in body:
        for op in _block_ops(function):
            stack = parse_module_name(_location_name(op.location) or "")
            if stack:
                root = module_name(stack[:1])
                break
        if root:
            break
    if root is None:  # no module names at all: nothing to correct
        return
    root_location = ir.Location.name(root, context=context)
    global_loads: dict[str, list[Any]] = {}
    for function in body:
        if _op_name(function) not in ("func.func", "util.func"):
            continue
        function.location = root_location
        for op in reversed(list(_block_ops(function))):
            if _op_name(op) in ("func.return", "util.return"):
                op.location = root_location
            elif _op_name(op) in PARAMETER_OPS:
                users = [use.owner for result in op.results for use in result.uses]
                names = {_location_name(user.location) for user in users}
                single = len(names) == 1 and parse_module_name(next(iter(names)) or "")
                op.location = users[0].location if single else root_location
                if _op_name(op) == "util.global.load":
                    global_loads.setdefault(str(op.attributes["global"]).lstrip("@"), []).append(op)
    for declaration in body:
        if _op_name(declaration) != "util.global":
            continue
        loads = global_loads.get(str(declaration.attributes["sym_name"]).strip('"'), [])
        names = {_location_name(load.location) for load in loads}
        declaration.location = loads[0].location if len(names) == 1 else root_location


def _op_name(op: Any) -> str:
    """The op's kind (an OpView's ``.name`` can be its symbol: ``func.func``'s is ``main``)."""
    return op.operation.name


def _block_ops(function: Any) -> list[Any]:
    return [op for region in function.regions for block in region.blocks for op in block.operations]


def export_mlir(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None, *,
                strict: bool = False) -> str:
    """The model as torch-dialect MLIR text with locations and module names."""
    from dfit_mlir.core.errors import ToolchainError

    try:
        import torch
        from iree.turbine import aot  # noqa: F401  (used by _export_mlir; missing = not installed)
    except ImportError as error:
        raise ToolchainError(f"the PyTorch frontend needs torch and iree-turbine ({error}); "
                             "pip install 'dfit-mlir[frontends]'") from None

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"dfit_mlir.frontends.torch.compile takes an nn.Module, not {type(model).__name__}")
    warnings: list[str] = []
    with quiet_export():  # which drops what is printed to stderr meanwhile: warnings wait
        text = _export_mlir(model, args, kwargs, strict=strict, warnings=warnings)
    for warning in warnings:
        print(warning, file=sys.stderr)
    return text


# --- training code in an export --------------------------------------------------------


@dataclass
class TrainingCalls:
    """What the model's code did while torch.export traced it that an exported forward
    graph cannot hold: the functions ``torch.utils.checkpoint`` wrapped (by name, in call
    order) and the gradient calls (``torch.autograd.grad``, ``Tensor.backward``)."""

    checkpointed: list[str]
    gradients: list[str]


@contextlib.contextmanager
def training_calls() -> Iterator[TrainingCalls]:
    """While active, record the model's activation-checkpoint regions and gradient calls
    (see :class:`TrainingCalls`). The hooks sit where every spelling arrives:
    ``torch.utils.checkpoint``'s own internals (``checkpoint`` looks them up when called,
    however the model imported it), ``torch.autograd.grad`` and ``Tensor.backward``."""
    import torch
    import torch.utils.checkpoint as checkpointing

    seen = TrainingCalls([], [])

    def callable_name(function: Any) -> str:
        return type(function).__name__ if isinstance(function, torch.nn.Module) else \
            getattr(function, "__qualname__", type(function).__name__)

    generator = getattr(checkpointing, "_checkpoint_without_reentrant_generator", None)
    function_class = getattr(checkpointing, "CheckpointFunction", None)
    if generator is None or function_class is None:  # another torch's internals: nothing is hooked
        yield seen
        return
    reentrant = function_class.__dict__.get("apply")
    grad, backward = torch.autograd.grad, torch.Tensor.backward

    def non_reentrant(function: Any, *args: Any, **kwargs: Any) -> Any:
        seen.checkpointed.append(callable_name(function))
        return generator(function, *args, **kwargs)

    def reentrant_apply(function: Any, *args: Any) -> Any:
        seen.checkpointed.append(callable_name(function))
        return torch.autograd.Function.apply.__func__(function_class, function, *args)

    def recorded_grad(*args: Any, **kwargs: Any) -> Any:
        seen.gradients.append("torch.autograd.grad")
        return grad(*args, **kwargs)

    def recorded_backward(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        seen.gradients.append("Tensor.backward")
        return backward(tensor, *args, **kwargs)

    checkpointing._checkpoint_without_reentrant_generator = non_reentrant  # type: ignore[assignment]
    function_class.apply = staticmethod(reentrant_apply)
    torch.autograd.grad, torch.Tensor.backward = recorded_grad, recorded_backward  # type: ignore[assignment]
    try:
        yield seen
    finally:
        checkpointing._checkpoint_without_reentrant_generator = generator
        if reentrant is None:
            del function_class.apply
        else:
            function_class.apply = reentrant
        torch.autograd.grad, torch.Tensor.backward = grad, backward  # type: ignore[assignment]


#: Why a PyTorch model gets no ``backward``/``recompute`` phase from dfit: said once in the
#: note and in the error below.
FORWARD_ONLY = ("dfit's PyTorch path exports forward graphs (torch.export), with no backward pass, so no op is "
                "`backward` or `recompute`; for those phases write the step in JAX (jax.grad, jax.checkpoint)")


def checkpoint_note(model_name: str, calls: TrainingCalls) -> str | None:
    """The note for a model that ran ``torch.utils.checkpoint`` regions and exported."""
    if not calls.checkpointed:
        return None
    names = ", ".join(dict.fromkeys(calls.checkpointed))
    return (f"dfit: note: {model_name} ran {len(calls.checkpointed)} torch.utils.checkpoint region(s) ({names}) "
            f"while exporting: torch.export inlines them into the forward graph, which recomputes nothing, so "
            f"their ops are `forward`; {FORWARD_ONLY}")


def gradient_failure(model_name: str, calls: TrainingCalls, error: BaseException) -> str | None:
    """The error of a model whose forward computes gradients (a training step) and
    whose export failed on it (torch 2.13: ``AssertionError: Unexpected key …``)."""
    if not calls.gradients:
        return None
    detail = str(error).splitlines()[0] if str(error) else ""
    return (f"torch.export failed on {model_name}: its forward computes gradients "
            f"({', '.join(dict.fromkeys(calls.gradients))}), which an exported graph cannot hold; {FORWARD_ONLY}; "
            f"or compile the model's forward alone (torch said: {type(error).__name__}: {detail[:200]})")


#: Warnings torch 2.13 gives on every export that say nothing about the user's model.
EXPORT_WARNINGS = (r"`isinstance\(treespec, LeafSpec\)` is deprecated",)


@contextlib.contextmanager
def quiet_export() -> Iterator[None]:
    """While exporting: torch's own deprecation warnings about its internals are ignored,
    torch's loggers are raised to CRITICAL (a failing export logs multi-line ``E1201 …
    fake_tensor.py`` records) and what torch prints straight to stderr (its export
    wrapper prints the partial FX graph of a failed export) is dropped, so that a failure
    is dfit's one line naming the model and the error. All restored on exit."""
    import io
    import logging
    import warnings

    loggers = [logger for name, logger in list(logging.root.manager.loggerDict.items())
               if isinstance(logger, logging.Logger) and name.split(".")[0] in ("torch", "torch_mlir", "iree")]
    levels = [logger.level for logger in loggers]
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        for message in EXPORT_WARNINGS:
            warnings.filterwarnings("ignore", message=message, category=FutureWarning)
        for logger in loggers:
            logger.setLevel(logging.CRITICAL)
        try:
            yield
        finally:
            for logger, level in zip(loggers, levels, strict=True):
                logger.setLevel(level)


def _export_mlir(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None, *, strict: bool,
                 warnings: list[str]) -> str:
    import torch
    from iree.turbine import aot

    from dfit_mlir.core.errors import CompileError

    # A transformers KV cache among the inputs or outputs passes as its tensors.
    register_cache_pytrees()
    try:
        with training_calls() as calls:
            program = torch.export.export(model, tuple(args), kwargs or None, strict=strict)
        # torch.export gives training IR, with in-place ops (``x += residual``) that the
        # importer rejects, and ops IREE 3.13 does not legalize (the eval-mode
        # ``_native_batch_norm_legit_no_training`` of every BatchNorm): decompose with the
        # table iree-turbine's own ``aot.export(nn.Module)`` applies, which also
        # functionalizes. Decomposed nodes keep their ``nn_module_stack`` and stack trace.
        program = program.run_decompositions(export_decompositions())
        drop_true_conjunctions(program.graph_module)
        guard_fully_masked_rows(program.graph_module, program.graph_signature.user_inputs)
    except Exception as error:  # torch.export raises many kinds; say which model failed
        training = gradient_failure(type(model).__name__, calls, error)
        raise CompileError(training or f"torch.export failed on {type(model).__name__}: {type(error).__name__}: "
                           f"{str(error).splitlines()[0] if str(error) else ''}") from error
    cuts = fall_back_from_dispatch_calls(program.graph_module, model)
    note = checkpoint_note(type(model).__name__, calls)
    if note is not None:
        warnings.append(note)
    warnings.extend(baked_scalar_warning(type(model).__name__, name, value)
                    for name, value in baked_scalar_arguments(program))
    warnings.extend(f"dfit: note: {type(model).__name__}: torch.export cut the stack at {cut.where} `{cut.code}` "
                    f"(a call into {cut.callee}, whose lines it does not keep): those ops' site is the line that "
                    f"runs their module" for cut in cuts)
    with module_locations():
        try:
            output = aot.export(program)
        except Exception as error:  # the importer's verifier names the op it rejects
            raise CompileError(f"iree-turbine could not import {type(model).__name__}: {type(error).__name__}: "
                               f"{str(error).splitlines()[0] if str(error) else ''}") from error
        relocate_scaffolding(output.mlir_module)
        unknown_operator(output.mlir_module, type(model).__name__)
        return output.mlir_module.operation.get_asm(enable_debug_info=True)


#: Python scalars torch.export turns into constants of the graph (a ``str`` or ``None``
#: is one too, but has no tensor to become instead).
BAKED_SCALAR_TYPES = (bool, int, float)


def baked_scalar_arguments(program: Any) -> list[tuple[str, Any]]:
    """(name, value) of every user argument that ``torch.export`` specialised into a
    constant: a Python ``int``/``float``/``bool`` among the example arguments is read
    once while tracing and its value is folded into the ops (``x * 0.5``); the compiled
    function has no input for it and computes with that value whatever the caller means.
    The exported program's signature says so: such an input is a ``ConstantArgument``."""
    from torch.export.graph_signature import ConstantArgument, InputKind

    return [(spec.arg.name, spec.arg.value) for spec in program.graph_signature.input_specs
            if spec.kind == InputKind.USER_INPUT and isinstance(spec.arg, ConstantArgument)
            and isinstance(spec.arg.value, BAKED_SCALAR_TYPES)]


def baked_scalar_warning(model_name: str, name: str, value: Any) -> str:
    """The one line :func:`export_mlir` prints per baked-in argument."""
    kind = type(value).__name__
    tensor = f"torch.tensor({value!r})"
    return (f"dfit: warning: {model_name} argument '{name}' = {value!r} (a Python {kind}) is baked into the "
            f"compiled graph as a constant: the compiled function takes no input for it; to make it an input, "
            f"pass a 0-d tensor ({tensor})")


def unknown_operator(module: Any, model_name: str) -> None:
    """Stop at the first ``torch.operator`` (an op torch-mlir does not know, which IREE
    3.13 always rejects with ``failed to legalize operation 'torch.operator'`` after
    minutes of compiling) with one line naming the op, its module and a workaround."""
    operation = getattr(module, "operation", module)
    for function in operation.regions[0].blocks[0].operations:
        for op in _block_ops(function):
            if _op_name(op) != "torch.operator":
                continue
            name = str(op.attributes["name"]).strip('"')
            if not name.startswith(("torch.aten.", "torch.prim.")):
                continue  # other namespaces (custom ops) may have their own lowering
            stack = parse_module_name(_location_name(op.location) or "") or [("", model_name)]
            path, module_class = stack[-1]
            raise UnloweredOpError(
                f"IREE 3.13 cannot lower {name} (in {path or '<root>'}: {module_class} of {model_name}); "
                f"workaround: decompose it before the export (add its decomposition to "
                f"iree.turbine.aot.extend_aot_decompositions(add_ops=[...]) around the compile) or replace "
                f"that module's code")


class UnloweredOpError(DfitError):
    """The export holds an op IREE cannot lower: the model's toolchain fails (exit 3)."""

    exit_code = EXIT_TOOLCHAIN_FAILED


def export_decompositions() -> dict[Any, Any]:
    """The decomposition table iree-turbine's ``aot.export`` applies to an ``nn.Module``
    (``iree.turbine.aot.current_aot_decompositions()``: BatchNorm, layer/group norm,
    ``addmm``, ``_to_copy``, ``masked_fill`` …), so that an exported program reaches IREE
    in the same ops as a plain turbine export of the module; plus the ops of transformers
    5.x decoders' mask code IREE 3.13 does not lower: ``aten.diff`` (the packed-sequence
    check, ``masking_utils.find_packed_sequence_indices``, with token ids only) and
    ``aten.__and__``/``__or__`` of boolean masks."""
    import torch
    from iree.turbine.aot import current_aot_decompositions

    table = current_aot_decompositions()
    aten = torch.ops.aten
    # turbine's table (torch's reference) writes ``addmm`` as ``beta * bias + alpha * mm``
    # even where beta = alpha = 1: two multiplications by one that IREE folds away, but
    # that the source program would count as FLOPs no dispatch performs.
    table[aten.addmm.default] = _addmm
    table.setdefault(aten.diff.default, _diff)
    # ``mask_a & mask_b`` (transformers' ``and_masks``/``or_masks``) exports as
    # ``aten.__and__``/``__or__``, which IREE 3.13 does not legalize; the bitwise ops are
    # the same function and lower.
    table.setdefault(aten.__and__.Tensor, aten.bitwise_and.Tensor)
    table.setdefault(aten.__or__.Tensor, aten.bitwise_or.Tensor)
    return table


def drop_true_conjunctions(graph_module: Any) -> int:
    """Rewrite ``ones(bool) & mask`` to ``mask`` in place; the number rewritten.

    transformers 5.x builds every attention mask by and-ing mask functions onto a 0-d
    ``new_ones(..., dtype=bool)``; torch-mlir folds that to ``torch.vtensor.literal
    dense<true> : tensor<i1>``, which IREE 3.13 fails to legalize (GPT-2, Llama, any
    decoder with or without a 2-D attention mask). ``True & m`` is ``m`` when ``m`` has the
    result's shape, so the rewrite changes no value and leaves the other ops (and their
    module paths) as they were."""
    import torch

    aten = torch.ops.aten
    conjunctions = (aten.__and__.Tensor, aten.bitwise_and.Tensor, aten.logical_and.default)
    rewritten = 0
    for node in list(graph_module.graph.nodes):
        if node.op != "call_function" or node.target not in conjunctions or len(node.args) != 2:
            continue
        for constant, other in (node.args, node.args[::-1]):
            if _is_true_scalar(constant) and _same_shape(other, node):
                node.replace_all_uses_with(other)
                graph_module.graph.erase_node(node)
                rewritten += 1
                break
    if rewritten:
        graph_module.graph.eliminate_dead_code()
        graph_module.recompile()
    return rewritten


def guard_fully_masked_rows(graph_module: Any, inputs: Iterable[str] | None = None) -> int:
    """Give every masked ``scaled_dot_product_attention`` PyTorch's result on a query row
    whose keys are all masked; in place, the number of attentions guarded.

    PyTorch (2.5+) returns zeros for such a row (its math kernel's ``_safe_softmax``);
    IREE 3.13 lowers ``torch.aten.scaled_dot_product_attention`` to an online softmax
    that gives NaN there (``max = -inf``, ``exp(-inf - -inf)``). A left-padded batch has
    such rows (the padding positions' queries see no key: transformers 5.x passes
    the boolean mask straight to SDPA), and the next layer's ``P·V`` spreads the NaN from
    the padded positions' keys and values to every logit. The guard unmasks a fully
    masked row (it attends to every key: finite) and zeroes its output:
    ``where(any(m), sdpa(q, k, v, m | ~any(m)), 0)`` for a boolean mask, ``-inf`` entries
    for an additive one. Other rows are unchanged, bit for bit. The new nodes keep the
    attention's module stack and source line.

    With ``inputs`` (the program's user-input placeholder names), only masks computed
    from an input are guarded: a mask from the model's own buffers and constants alone
    (a hand-built causal mask) is the same at every call, and guarding it would add ops
    (and FLOPs to the source program's count) that IREE folds away."""
    import torch

    guarded = 0
    inputs = None if inputs is None else set(inputs)
    for node in list(graph_module.graph.nodes):
        if node.op != "call_function" or node.target != torch.ops.aten.scaled_dot_product_attention.default:
            continue
        mask = node.args[3] if len(node.args) > 3 else node.kwargs.get("attn_mask")
        value = getattr(mask, "meta", {}).get("val")
        if value is not None and value.ndim > 0 and (inputs is None or _reaches_from(mask, inputs)):
            _guard_attention(graph_module.graph, node, mask, value.dtype == torch.bool)
            guarded += 1
    if guarded:
        graph_module.graph.lint()
        graph_module.recompile()
    return guarded


def _guard_attention(graph: Any, attention: Any, mask: Any, boolean: bool) -> None:
    """The guard of :func:`guard_fully_masked_rows` around one attention node."""
    import functools

    import torch

    aten = torch.ops.aten
    add = functools.partial(_node_like, graph, attention)
    with graph.inserting_before(attention):
        if boolean:  # True: attend
            keep = add(aten.any.dim, mask, -1, True)
            safe_mask = add(aten.bitwise_or.Tensor, mask, add(aten.logical_not.default, keep))
        else:  # additive: -inf masks
            keep = add(aten.any.dim, add(aten.ne.Scalar, mask, float("-inf")), -1, True)
            safe_mask = add(aten.where.ScalarOther, keep, mask, 0.0)
    if len(attention.args) > 3:
        attention.args = (*attention.args[:3], safe_mask, *attention.args[4:])
    else:
        attention.kwargs = {**attention.kwargs, "attn_mask": safe_mask}
    with graph.inserting_after(attention):
        output = add(aten.where.ScalarOther, keep, attention, 0.0)
    attention.replace_all_uses_with(output, delete_user_cb=lambda user: user is not output)


def _reaches_from(node: Any, placeholders: set[str]) -> bool:
    """Whether ``node`` is computed from one of the named placeholders."""
    seen, pending = set(), [node]
    while pending:
        current = pending.pop()
        if current.op == "placeholder" and current.name in placeholders:
            return True
        for source in current.all_input_nodes:
            if source not in seen:
                seen.add(source)
                pending.append(source)
    return False


def _node_like(graph: Any, template: Any, target: Any, *args: Any) -> Any:
    """A ``call_function`` node with ``template``'s module stack and stack trace, and its
    ``val`` computed on the arguments' fake tensors (the importer types it from that)."""
    import torch

    node = graph.call_function(target, args)
    for key in ("nn_module_stack", "stack_trace", "source_fn_stack", "from_node", "seq_nr"):
        if key in template.meta:
            node.meta[key] = template.meta[key]
    fake = [arg.meta["val"] if isinstance(arg, torch.fx.Node) else arg for arg in args]
    mode = next(value.fake_mode for value in fake if hasattr(value, "fake_mode"))
    with mode:
        node.meta["val"] = target(*fake)
    return node


def _is_true_scalar(node: Any) -> bool:
    """A 0-d (or one-element) boolean ``ones``/``new_ones``/``full(True)`` FX node."""
    import torch

    aten = torch.ops.aten
    if getattr(node, "op", None) != "call_function":
        return False
    value = node.meta.get("val")
    if value is None or value.dtype != torch.bool or value.numel() != 1:
        return False
    if node.target in (aten.new_ones.default, aten.ones.default):
        return True
    return node.target in (aten.full.default, aten.new_full.default) and node.args[-1] is True


def _same_shape(node: Any, result: Any) -> bool:
    value, expected = getattr(node, "meta", {}).get("val"), result.meta.get("val")
    return value is not None and expected is not None and tuple(value.shape) == tuple(expected.shape) \
        and value.dtype == expected.dtype


def _addmm(bias: Any, mat1: Any, mat2: Any, *, beta: Any = 1, alpha: Any = 1) -> Any:
    """``aten.addmm`` as ``mm`` plus the bias, scaled only where a factor is not one."""
    import torch

    product = torch.mm(mat1, mat2)
    if alpha != 1:
        product = product * alpha
    if beta == 0:
        return product
    return product + (bias if beta == 1 else bias * beta)


def _diff(x: Any, n: int = 1, dim: int = -1, prepend: Any = None, append: Any = None) -> Any:
    """``aten.diff`` in slices and a subtraction (``!=`` for booleans), which IREE lowers."""
    import torch

    parts = [part for part in (prepend, x, append) if part is not None]
    x = torch.cat(parts, dim) if len(parts) > 1 else x
    for _ in range(n):
        length = x.shape[dim] - 1
        later, earlier = x.narrow(dim, 1, length), x.narrow(dim, 0, length)
        x = later != earlier if x.dtype == torch.bool else later - earlier
    return x


def compile(model: Any, args: tuple[Any, ...] | Any, *, output: str | Path, mode: str = "full",
            kwargs: dict[str, Any] | None = None, flags: Sequence[str] | None = None,
            manifest_path: str | Path | None = None, mlir_path: str | Path | None = None,
            trace_tensors: tuple[str, ...] = (), strict: bool = False, lineage_detail: str = "phases",
            quiet: bool = False) -> Any:
    """Export ``model(*args, **kwargs)`` with iree-turbine and compile it with dfit tags.

    Writes the torch-dialect MLIR beside ``output`` (``<output stem>.mlir`` unless
    ``mlir_path``), the vmfb and the manifest, and prints the per-stage summary
    ``dfit compile`` prints (``quiet=True``: nothing); returns the
    :class:`~dfit_mlir.passes.instrumented_compile.CompileResult`. ``flags``: extra
    iree-compile flags (default: this machine's CPU).
    """
    from dfit_mlir.frontends.compiling import compile_text

    if not isinstance(args, tuple):
        args = (args,)
    text = export_mlir(model, args, kwargs, strict=strict)
    return compile_text(text, output, default_flags=DEFAULT_FLAGS, mode=mode, flags=flags,
                        manifest_path=manifest_path, mlir_path=mlir_path, trace_tensors=trace_tensors,
                        lineage_detail=lineage_detail, quiet=quiet)


class ModelCodeError(DfitError):
    """The user's model file raised while dfit imported it or called its factory: the
    model failed (exit 3), not dfit; the message names the file and line that raised."""

    exit_code = EXIT_TOOLCHAIN_FAILED


def _model_code_failure(path: Path, what: str, error: BaseException) -> str:
    """``model.py:12: make_model() raised ValueError: ...`` (the innermost frame in the
    model file; the file alone when the error came from elsewhere)."""
    import traceback

    where = str(path)
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        if Path(frame.filename).resolve() == path.resolve():
            where = f"{path}:{frame.lineno}"
            break
    detail = str(error).splitlines()[0] if str(error) else ""
    return f"{where}: {what} raised {type(error).__name__}" + (f": {detail}" if detail else "")


class ModelExit(BaseException):
    """The model file asked to end the process (``sys.exit``, ``os._exit``) while dfit ran it."""

    def __init__(self, call: str, where: str):
        super().__init__(call)
        self.call, self.where = call, where


@contextlib.contextmanager
def _exits_raise(path: Path) -> Iterator[None]:
    """While the model file runs, ``sys.exit(n)`` and ``os._exit(n)`` raise :class:`ModelExit`
    (dfit would otherwise end with the model's status and no word). ``os._exit`` cannot
    be caught once called (no ``finally``, no ``atexit`` runs), so it is replaced for the
    duration by a function that raises. A native extension calling ``exit()`` itself is
    beyond any in-process guard: only importing the file in a child process would see it."""
    import os
    import traceback

    def line_of(frames: Any) -> str:
        lines = [f.lineno for f in frames if Path(f.filename).resolve() == path.resolve()]
        return f"{path}:{lines[-1]}" if lines else str(path)

    def raise_instead(status: int = 0) -> None:
        raise ModelExit(f"os._exit({status})", line_of(traceback.extract_stack()))

    real_exit = os._exit
    os._exit = raise_instead  # type: ignore[assignment]
    try:
        yield
    except SystemExit as error:
        raise ModelExit(f"sys.exit({error.code!r})", line_of(traceback.extract_tb(error.__traceback__))) from None
    finally:
        os._exit = real_exit


def load_module_file(path: str | Path, factory: str | None = None) -> tuple[Any, tuple[Any, ...]]:
    """A PyTorch model file for ``dfit compile model.py``: the file defines
    ``make_model()`` (or ``factory``) returning ``(module, example_args)``."""
    import importlib.util

    from dfit_mlir.core.errors import InvalidInputError

    path = Path(path)
    name = factory or "make_model"
    spec = importlib.util.spec_from_file_location(f"dfit_user_model_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise InvalidInputError(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    try:
        with _exits_raise(path):
            spec.loader.exec_module(module)
    except ModelExit as error:
        raise ModelCodeError(f"{error.where}: running the file called {error.call}: a model file must define "
                             f"{name}() and return, not end the process") from None
    except FileNotFoundError:
        raise InvalidInputError(f"{path}: no such file") from None
    except SyntaxError as error:
        raise InvalidInputError(f"{path}:{error.lineno}: {error.msg}") from None
    except Exception as error:  # the user's code failed, not dfit: exit 3 with where
        raise ModelCodeError(_model_code_failure(path, "running the file", error)) from None
    make = getattr(module, name, None)
    if not callable(make):
        raise InvalidInputError(f"{path}: defines no {name}() returning (nn.Module, example args)")
    try:
        with _exits_raise(path):
            made = make()
    except ModelExit as error:
        raise ModelCodeError(f"{error.where}: {name}() called {error.call}: it must return (nn.Module, example "
                             "args), not end the process") from None
    except Exception as error:
        raise ModelCodeError(_model_code_failure(path, f"{name}()", error)) from None
    if not (isinstance(made, tuple) and len(made) == 2):
        raise InvalidInputError(f"{path}: {name}() must return (nn.Module, example args), got {type(made).__name__}")
    model, args = made
    return model, args if isinstance(args, tuple) else (args,)
