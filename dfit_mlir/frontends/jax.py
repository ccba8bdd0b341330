"""JAX (``jax.jit(f).lower(...).as_text(debug_info=True)``; Flax and Keras-on-JAX alike).

Every op of the public function carries a **name stack** and a call-site chain of
file:line ranges, e.g. ``jit(train_step)/transpose(jvp(dense1))/dot_general``. The stack
is ``/``-separated; its first entry is the jitted function, its last the primitive; the
entries between are named scopes (``jax.named_scope``, Flax module names, Keras layer
names) wrapped in the transformations applied to them:

* ``transpose(jvp(X))``: the reverse-mode (backward) pass of scope X → ``backward``;
* ``…/checkpoint/rematted_computation/…`` (a ``rematted_computation`` entry anywhere, also
  in a private function's own stack): the forward ops ``jax.checkpoint``/``jax.remat``
  runs again inside the backward pass → ``recompute``, not ``backward``: they are the
  price of the memory saved, not gradient work;
* ``jvp(X)``: the primal computation under differentiation → ``forward``;
* a scope named ``optimizer``/``loss`` (:data:`PHASE_SCOPES`) → that phase, unless the op
  is in a backward pass;
* ``jit(f)`` entries are calls of jitted helpers, not modules.

The module path is the scopes, ``/``-joined (``dense1``, ``MLP/Dense_0``, ``optimizer``);
scopes named ``forward``/``backward`` only restate the phase and are left out, and so are
the names JAX gives to the sub-computations of its transformations and control flow
(:func:`model_scopes`): ``while/body``, ``while/cond``, ``cond/branch_N_fun``, bare
``checkpoint``/``rematted_computation``/``closed_call``/``vmap()``, and a scope repeated by a
transformation of itself (``transpose(jvp(blk))/jvp(blk)``, as ``remat`` names it).

The body of a ``lax.scan``/``while_loop``/``fori_loop`` (and any ``closed_call``, a
``jax.jit`` helper) is a private function whose ops carry the body's *own* name stack,
relative to the call: ``attn/dot_general`` in the scan body called from
``jit(step)/jvp(layers)/while/body/closed_call``. Such an op sits at the call site's
module path followed by its own scopes (``layers/attn``: :meth:`JaxFrontend.nested_path`),
and takes the call site's phase. JAX emits
helpers (``log_softmax``, ``_one_hot``) as private functions whose ops carry bare names
(``loc("sub")``): they take the module path and phase of their call sites
(:func:`dfit_mlir.frontends.annotate`). A function that is never differentiated (no
``jvp``/``transpose`` anywhere) is an inference function: all its ops are ``forward``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dfit_mlir.frontends import SourceModel

#: Transformations that say the pass: the first one found (outermost first) decides.
TRANSFORM_PHASES = (("transpose", "backward"), ("vjp", "backward"), ("jvp", "forward"), ("linearize", "forward"))
#: The stack entry under which ``jax.checkpoint`` recomputes forward ops in the backward
#: pass, and their phase.
REMATTED, RECOMPUTE = "rematted_computation", "recompute"
#: Named scopes that say the phase (matched case-insensitively, whole scope name).
PHASE_SCOPES = {"optimizer": "optimizer", "optim": "optimizer", "opt_update": "optimizer",
                "loss": "loss", "loss_fn": "loss", "forward": "forward", "backward": "backward",
                "init": "initializer", "initializer": "initializer"}
#: Scope names left out of the module path (they only restate the phase).
PHASE_ONLY_SCOPES = frozenset({"forward", "backward"})
#: Wrappers naming a call of a function, not a scope of the model.
CALL_WRAPPERS = frozenset({"jit", "pjit", "remat", "checkpoint", "custom_jvp_call", "custom_vjp_call",
                           "closed_call", "core_call", "xla_call", "shard_map", "named_call"})
#: Bare stack entries naming a transformation's sub-computation, not a model scope.
TRANSFORM_ENTRIES = frozenset({"checkpoint", "remat", "remat2", "rematted_computation", "closed_call", "core_call",
                               "custom_jvp_call", "custom_vjp_call", "vmap", "pmap", "xmap", "scan"})
#: Control flow followed by the name of the sub-computation an op sits in.
CONTROL_FLOW = {"while": re.compile(r"^(body|cond)$"), "cond": re.compile(r"^branch_\d+(_fun)?$"),
                "switch": re.compile(r"^branch_\d+(_fun)?$")}
_WRAPPED = re.compile(r"^([A-Za-z_][\w.]*)\((.*)\)$")
_IDENTIFIER = re.compile(r"^[A-Za-z_][\w.]*$")
DEFAULT_FLAGS = (
    "--iree-hal-target-device=local",
    "--iree-hal-local-target-device-backends=llvm-cpu",
    "--iree-llvmcpu-target-cpu=host",
)


def split_stack(stack: str) -> list[str]:
    """``jit(f)/transpose(jvp(a/b))/c`` → ``["jit(f)", "transpose(jvp(a/b))", "c"]``."""
    parts, depth, start = [], 0, 0
    for index, char in enumerate(stack):
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "/" and depth == 0:
            parts.append(stack[start:index])
            start = index + 1
    parts.append(stack[start:])
    return parts


def unwrap(entry: str) -> tuple[tuple[str, ...], str]:
    """``transpose(jvp(dense1))`` → (``("transpose", "jvp")``, ``"dense1"``)."""
    wrappers = []
    while (match := _WRAPPED.match(entry)) is not None:
        wrappers.append(match.group(1))
        entry = match.group(2)
    return tuple(wrappers), entry


def is_name_stack(name: str) -> bool:
    return name.startswith(("jit(", "pjit(")) or ("/" in name and "(" in name)


def is_relative_stack(name: str) -> bool:
    """A private function's own name stack (``attn/dot_general``,
    ``checkpoint/rematted_computation/layers/mlp/add``): scopes below its call site."""
    return "/" in name and not name.startswith(("jit(", "pjit(", "/")) and " " not in name


def model_scopes(entries: Sequence[tuple[str, bool]]) -> list[str]:
    """The model's scopes among a stack's (scope, came from inside a transformation
    wrapper) entries: control-flow sub-computations (``while/body``,
    ``cond/branch_1_fun``), transformation entries (:data:`TRANSFORM_ENTRIES`) and a
    scope repeated by a transformation of itself are peeled."""
    scopes: list[str] = []
    last_wrapped = False
    index = 0
    while index < len(entries):
        name, wrapped = entries[index]
        follower = CONTROL_FLOW.get(name)
        if follower is not None and index + 1 < len(entries) and follower.match(entries[index + 1][0]):
            index += 2
            continue
        index += 1
        if name in TRANSFORM_ENTRIES or (wrapped and last_wrapped and scopes and scopes[-1] == name):
            continue
        scopes.append(name)
        last_wrapped = wrapped
    return scopes


def read_stack(stack: str, *, is_function: bool = False) -> tuple[str, str | None, str | None]:
    """(module path, phase or ``None``, primitive or ``None``) of one name stack (rooted at
    the jitted function, or a private function's own: :func:`is_relative_stack`)."""
    entries = split_stack(stack)
    if entries and unwrap(entries[0])[0][:1] in (("jit",), ("pjit",)):
        entries = entries[1:]
    primitive = None
    if entries and not is_function:
        primitive = entries.pop()
    elif entries and is_function:
        entries.pop()  # a private function's own stack ends in the call wrapper's name
    transforms: list[str] = []
    found: list[tuple[str, bool]] = []
    for entry in entries:
        wrappers, inner = unwrap(entry)
        transforms.extend(w for w in wrappers if w not in CALL_WRAPPERS)
        if any(w in CALL_WRAPPERS for w in wrappers):
            continue  # a jitted helper's name, not a scope
        found.extend((part, bool(wrappers)) for part in split_stack(inner) if part)
    scopes = model_scopes(found)
    phase = RECOMPUTE if any(part == REMATTED for part, _ in found) else None
    for transform, transform_phase in TRANSFORM_PHASES if phase is None else ():
        if transform in transforms and transform_phase == "backward":
            phase = "backward"
            break
    if phase is None:
        phase = next((PHASE_SCOPES[s.lower()] for s in reversed(scopes) if s.lower() in PHASE_SCOPES), None)
    if phase is None:
        phase = next((p for t, p in TRANSFORM_PHASES if t in transforms), None)
    path = "/".join(s for s in scopes if s.lower() not in PHASE_ONLY_SCOPES)
    if primitive is not None:
        wrappers, inner = unwrap(primitive)
        primitive = inner if wrappers and wrappers[0] in CALL_WRAPPERS else primitive
    return path, phase, primitive


class JaxFrontend:
    name = "jax"

    def recognizes(self, operators: Sequence[dict[str, Any]]) -> bool:
        return any(op["op"].startswith(("stablehlo.", "chlo.", "mhlo.")) for op in operators) and any(
            is_name_stack(name) for op in operators for name in op.get("name_path") or ())

    @staticmethod
    def _stack(op: dict[str, Any]) -> str | None:
        return next((name for name in op.get("name_path") or ()
                     if is_name_stack(name) and not is_relative_stack(name)), None)

    @staticmethod
    def _relative(op: dict[str, Any]) -> str | None:
        """The op's own relative name stack: the first name of its location (the names
        after it are the frames' function names), for an op, not a function."""
        names = op.get("name_path") or ()
        if not names or op["op"] in ("func.func", "util.func") or not is_relative_stack(names[0]):
            return None
        return names[0]

    def nested_path(self, op: dict[str, Any], outer: str | None) -> str | None:
        """The module path of ``op``, an op of a private function whose call sites sit in
        ``outer``: ``outer`` followed by the scopes of the op's own relative stack."""
        relative = self._relative(op)
        inner = read_stack(relative)[0] if relative is not None else ""
        if outer is None:
            return inner or None
        return f"{outer}/{inner}" if outer and inner else outer or inner

    def source_model(self, op: dict[str, Any]) -> SourceModel:
        names = op.get("name_path") or ()
        stack = self._stack(op)
        is_function = op["op"] in ("func.func", "util.func")
        if stack is None:
            relative = self._relative(op)
            if relative is not None:  # an op of a scan body or another private function
                _, phase, primitive = read_stack(relative)
                return SourceModel(source_op=f"jax.{primitive}" if primitive and _IDENTIFIER.match(primitive) else None,
                                   phase=phase if phase in ("backward", RECOMPUTE) else None)
            # A private helper's op: a bare primitive name (``loc("sub")``).
            primitive = names[0] if names and _IDENTIFIER.match(names[0]) and not is_function else None
            return SourceModel(source_op=f"jax.{primitive}" if primitive else None)
        path, phase, primitive = read_stack(stack, is_function=is_function)
        source_op = f"jax.{primitive}" if primitive and _IDENTIFIER.match(primitive) else None
        return SourceModel(module_path=path, source_op=source_op, phase=phase)

    def finish(self, operators: Sequence[dict[str, Any]]) -> None:
        """A call of a jitted helper inside a private function (``loc("jit(_where)")``)
        looks like a stack of one entry; only the public function's own entry
        (``jit(train_step)``, the first entry of the stacks) is one. The others say
        nothing about the module: they take their call sites'. Then, in an inference
        function (nothing differentiated), every op with a module path is ``forward``."""
        roots = Counter(split_stack(stack)[0] for op in operators
                        if (stack := self._stack(op)) and "/" in stack)
        root = roots.most_common(1)[0][0] if roots else None
        for op in operators:
            stack = self._stack(op)
            if stack and "/" not in stack and stack != root and op["op"] not in ("func.func", "util.func"):
                op["module_path"] = op["phase"] = None
        if any(op.get("phase") in ("backward", "forward") for op in operators):
            return
        for op in operators:
            if op.get("phase") is None and op.get("module_path") is not None:
                op["phase"] = "forward"


    def settle(self, operators: Sequence[dict[str, Any]]) -> None:
        """After the private functions took their call sites' module and phase: the
        model's code that runs outside the transformations of a differentiated function
        (``jnp.sqrt(width)`` in ``attn``: a value that does not depend on the
        differentiated inputs is computed once, outside ``jvp``) is ``forward`` when its
        scopes are all scopes of the forward or backward pass."""
        differentiated = {scope for op in operators if op.get("phase") in ("backward", "forward", RECOMPUTE)
                          for scope in (op.get("module_path") or "").split("/") if scope}
        for op in operators:
            path = op.get("module_path")
            if op.get("phase") is None and path and self._stack(op) and set(path.split("/")) <= differentiated:
                op["phase"] = "forward"

    def module_classes(self, op: dict[str, Any]) -> dict[str, str]:
        return {}


FRONTEND = JaxFrontend()


def lower_text(fn: Any, *args: Any, static_argnums: int | Sequence[int] = (), **kwargs: Any) -> str:
    """StableHLO text of ``jax.jit(fn)`` at these arguments, with debug info; a private
    helper called from several phases is copied once per phase
    (:func:`dfit_mlir.frontends.jax_helpers.specialize_by_phase`)."""
    from dfit_mlir.core.errors import CompileError, ToolchainError

    try:
        import jax
    except ImportError as error:
        raise ToolchainError(f"the JAX frontend needs jax ({error}); pip install 'dfit-mlir[frontends]'") from None
    try:
        lowered = jax.jit(fn, static_argnums=static_argnums).lower(*args, **kwargs)
    except Exception as error:  # tracing errors come in many types; say which function failed
        name = getattr(fn, "__qualname__", type(fn).__name__)
        raise CompileError(f"jax could not lower {name}: {type(error).__name__}: "
                           f"{str(error).splitlines()[0] if str(error) else ''}") from error
    from dfit_mlir.frontends.jax_helpers import specialize_by_phase

    return specialize_by_phase(lowered.as_text(debug_info=True), FRONTEND)


def compile(fn: Any, *args: Any, output: str | Path, mode: str = "full", flags: Sequence[str] | None = None,
            manifest_path: str | Path | None = None, mlir_path: str | Path | None = None,
            static_argnums: int | Sequence[int] = (), trace_tensors: tuple[str, ...] = (),
            lineage_detail: str = "phases", quiet: bool = False, **kwargs: Any) -> Any:
    """Lower ``jax.jit(fn)(*args, **kwargs)`` with debug info and compile it with dfit
    tags. Writes the StableHLO beside ``output`` (``<output stem>.mlir`` unless
    ``mlir_path``), the vmfb and the manifest, and prints the per-stage summary
    ``dfit compile`` prints (``quiet=True``: nothing); returns the
    :class:`~dfit_mlir.passes.instrumented_compile.CompileResult`."""
    from dfit_mlir.frontends.compiling import compile_text

    text = lower_text(fn, *args, static_argnums=static_argnums, **kwargs)
    return compile_text(text, output, default_flags=DEFAULT_FLAGS, mode=mode, flags=flags,
                        manifest_path=manifest_path, mlir_path=mlir_path, trace_tensors=trace_tensors,
                        lineage_detail=lineage_detail, quiet=quiet)
