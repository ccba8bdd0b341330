"""Frontend knowledge: how each frontend names modules, marks phases and tells model code
from framework code, in one small module per frontend (``torch``, ``jax``, ``onnx``,
``tflite``), plus the Python entry points that export and compile a model with tags
(:func:`dfit_mlir.frontends.torch.compile`, :func:`dfit_mlir.frontends.jax.compile`).

Every frontend fills the same **source model** on each operator of the manifest:

* ``module_path``: where in the model the op sits, as the frontend shows it
  (``encoder.layer.3.attention.self.query``, ``/model.22/cv3.0/cv3.0.0/conv``,
  ``model_1/model/add_3``, ``dense1``); ``""`` is the model's root (an op of the
  top-level module or function), ``None`` means nothing says;
* ``module_class``: the module's class where the frontend knows it (``BertSelfAttention``);
* ``source_op``: the op as the frontend names it (``torch.aten.linear``, ``onnx.Conv``,
  ``jax.dot_general``, ``tosa.conv2d``);
* ``phase``: one of :data:`PHASES`, or ``None`` when nothing says.

Tools read these fields from the manifest only. The frontend modules import nothing
heavy at import time (torch and JAX are imported by the compile entry points), so the
registry below stays cheap.
"""

from __future__ import annotations

import fnmatch
import functools
import importlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Protocol

from dfit_mlir.core.filters import parse_globs  # noqa: F401  (the frontends' name for it)
from dfit_mlir.core.locations import FrameFilter

#: ``recompute``: forward ops run again inside the backward pass by activation
#: checkpointing (``jax.checkpoint``), apart from ``backward``. PyTorch's
#: ``torch.utils.checkpoint`` gives none: its export has no backward (frontends.torch).
PHASES = ("forward", "backward", "optimizer", "loss", "initializer", "recompute")
#: Op kinds that hold initial values of the model (weights, buffers) rather than
#: computing: their phase is ``initializer``.
INITIALIZER_OPS = frozenset({"util.global", "util.initializer", "ml_program.global"})
FUNCTION_OPS = frozenset({"func.func", "util.func"})
CALL_OPS = frozenset({"func.call", "util.call"})
#: Per-op fields of the source model in the manifest (agreed between tools).
FIELDS = ("module_path", "module_class", "source_op", "phase")


@dataclass(frozen=True, slots=True)
class SourceModel:
    """What a frontend says about one op (see the module docstring)."""

    module_path: str | None = None
    module_class: str | None = None
    source_op: str | None = None
    phase: str | None = None

    def as_fields(self) -> dict[str, str | None]:
        return {name: getattr(self, name) for name in FIELDS}


class Frontend(Protocol):
    name: str

    def recognizes(self, operators: Sequence[dict[str, Any]]) -> bool:
        """Whether the tagged module came from this frontend (read off its operators)."""

    def source_model(self, op: dict[str, Any]) -> SourceModel:
        """The op's source model from its own record (name path, locations, kind)."""

    def finish(self, operators: Sequence[dict[str, Any]]) -> None:
        """Whole-module corrections after every op has its own source model."""

    def module_classes(self, op: dict[str, Any]) -> dict[str, str]:
        """Module path → class of the modules enclosing ``op`` where the frontend's
        locations say (PyTorch: the whole nn.Module stack); may be empty."""


# --- model code vs framework code ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CodeRule:
    """``pattern`` is a glob matched against a frame's package-relative path
    (``transformers/models/bert/modeling_bert.py``). dfit's own rules (``user`` false)
    match nothing else: a user folder named ``torch`` is not PyTorch. A user's rule
    (``--framework-code``/``--model-code``) also matches the absolute path, or any
    trailing part of it (``mylib/*`` matches ``/home/me/mylib/layers.py``)."""

    pattern: str
    model_code: bool
    user: bool = False


@dataclass(frozen=True, slots=True)
class CodeDecision:
    """Whether a frame's file is model code, and why (``sites.csv``'s ``site_rule``)."""

    model_code: bool
    #: ``framework torch/* on torch/nn/modules/linear.py``, ``model code (no rule: a file
    #: outside installed packages)``, ``user framework glob */convnet.py``, ...
    reason: str


#: Model code inside framework packages: the architectures people bring. First match
#: wins, so these come before the framework rules of the same package.
MODEL_CODE_PATTERNS = (
    "transformers/models/*",
    "torchvision/models/*",
    "timm/models/*",
    "diffusers/models/*",
    "keras/src/applications/*",
    "keras/applications/*",
    "flax/examples/*",
)
#: Framework, library and compiler code: a frame here is not the model author's.
FRAMEWORK_PATTERNS = (
    "torch/*", "torchvision/*", "functorch/*", "transformers/*", "timm/*", "diffusers/*", "accelerate/*",
    "jax/*", "jaxlib/*", "flax/*", "optax/*", "equinox/*", "haiku/*", "keras/*", "tf_keras/*", "tensorflow/*",
    "numpy/*", "iree/*", "dfit_mlir/*", "onnx/*", "onnxruntime/*", "cerebras/pytorch/*", "<stdlib>/*",
    "<frozen *", "<string>", "<eval_with_key>*",
    # What launches a model: command-line and test libraries, notebooks (`dfit compile
    # model.py` runs the model's module under click; a JAX trace keeps those frames).
    "click/*", "typer/*", "fire/*", "absl/*", "_pytest/*", "pytest/*", "pluggy/*", "IPython/*", "ipykernel/*",
)
_PACKAGE_DIRS = ("site-packages/", "dist-packages/")
DFIT_PACKAGE = "dfit_mlir"


@dataclass(frozen=True)
class CodeRules:
    """Model code vs framework code, decided by what a frame's file *is* (its package),
    not where it is installed: a user's model in ``site-packages`` is model code,
    ``transformers/models/bert/modeling_bert.py`` is model code, ``transformers/utils``
    and ``torch/nn`` are framework. Rules are data; users put their own in front with
    :meth:`extended` (``--framework-code`` / ``--model-code``)."""

    rules: tuple[CodeRule, ...]

    @classmethod
    def default(cls) -> CodeRules:
        return cls(tuple(CodeRule(p, True) for p in MODEL_CODE_PATTERNS)
                   + tuple(CodeRule(p, False) for p in FRAMEWORK_PATTERNS))

    def extended(self, framework: Iterable[str] = (), model: Iterable[str] = ()) -> CodeRules:
        """User rules first (model-code globs, then framework globs), then these."""
        extra = tuple(CodeRule(p.strip(), True, user=True) for p in model if p.strip())
        extra += tuple(CodeRule(p.strip(), False, user=True) for p in framework if p.strip())
        return CodeRules(extra + self.rules)

    @cached_property
    def _dfit_roots(self) -> tuple[str, ...]:
        """dfit's own source folders, wherever they are installed (a checkout's
        ``passes/`` is dfit code, its ``tests/`` and ``examples/`` are not)."""
        from pathlib import Path

        import dfit_mlir

        roots = [Path(dfit_mlir.__file__).resolve().parent]
        try:
            from dfit_mlir import passes  # noqa: F401  (package-dir mapped)

            for name in ("passes", "adapters", "runtime_hooks", "dialects"):
                module = importlib.import_module(f"dfit_mlir.{name}")
                roots += [Path(p).resolve() for p in getattr(module, "__path__", ())]
        except ImportError:
            pass
        return tuple(str(root) + "/" for root in roots)

    @cached_property
    def _verdicts(self) -> dict[str, CodeDecision]:
        """Per file: a model has a few dozen files and many thousand frames."""
        return {}

    def is_model_code(self, path: str) -> bool:
        return self.explain(path).model_code

    def explain(self, path: str) -> CodeDecision:
        """The decision for a frame's file and the rule that made it."""
        verdict = self._verdicts.get(path)
        if verdict is None:
            verdict = self._verdicts[path] = self._decide(path)
        return verdict

    def _decide(self, path: str) -> CodeDecision:
        if path.startswith(self._dfit_roots) or f"/{DFIT_PACKAGE}/" in path:
            # Also another checkout's (a bundle made elsewhere): dfit is never the model.
            return CodeDecision(False, "framework (dfit's own code)")
        if is_console_script(path):
            # The outermost frames of `dfit compile model.py` (or `pytest`, `jupyter`):
            # a launcher pip wrote, not the model author's code.
            return CodeDecision(False, "framework (a Python environment's console script)")
        relative = package_relative(path)
        # dfit's rules see package-relative paths only: a file under site-packages,
        # dist-packages, the standard library or an installed framework package's
        # folder, or a path given relative to one (reconstructions, traces from
        # elsewhere). An absolute path anywhere else is the user's.
        packaged = relative != path or not path.startswith("/")
        for rule in self.rules:
            if rule.user and _user_glob_matches(rule.pattern, path, relative):
                kind = "model-code" if rule.model_code else "framework"
                return CodeDecision(rule.model_code, f"user {kind} glob {rule.pattern}")
            if not rule.user and packaged and fnmatch.fnmatchcase(relative, rule.pattern):
                kind = "model code" if rule.model_code else "framework"
                return CodeDecision(rule.model_code, f"{kind} {rule.pattern} on {relative}")
        if packaged:
            return CodeDecision(True, f"model code (no rule: {relative} is no framework package)")
        return CodeDecision(True, "model code (no rule: a file outside installed packages)")

    def is_framework(self, path: str) -> bool:
        return not self.is_model_code(path)

    def owner(self, path: str) -> str:
        """Whose a framework frame is, for a message that leaves it out: ``dfit``, a
        package (``click``, ``torch``) or ``the standard library``."""
        if path.startswith(self._dfit_roots) or f"/{DFIT_PACKAGE}/" in path or is_console_script(path):
            return "dfit"
        relative = package_relative(path)
        if relative.startswith("<stdlib>/") or relative.startswith("<frozen"):
            return "the standard library"
        return relative.split("/", 1)[0] if relative != path else path

    def message_frames(self) -> FrameFilter:
        """The frames a compiler message keeps of a location chain: the model's
        (:func:`dfit_mlir.core.locations.cut_location_chains`)."""
        return FrameFilter(keep=self.is_model_code, owner=self.owner)


def site_notes(name_path: Iterable[str]) -> tuple[str, ...]:
    """What a frontend says about an op's frames, from its ``name_path``, for the output
    that explains a site (``--explain-site``): PyTorch's ``torch.export stack cut: …``
    (:func:`dfit_mlir.frontends.torch.fall_back_from_dispatch_calls`: the line torch.export
    stopped at, and why the site is the line running the module instead)."""
    from dfit_mlir.frontends.torch import STACK_CUT_PREFIX

    return tuple(name[len(STACK_CUT_PREFIX):] for name in name_path if name.startswith(STACK_CUT_PREFIX))


def is_console_script(path: str) -> bool:
    """A launcher an installer wrote into an environment's ``bin/`` (``Scripts\\`` on
    Windows): ``.venv/bin/dfit``. dfit's own script is one wherever the bundle was made;
    another ``bin/`` file is one when its folder's parent is a Python environment
    (it holds ``pyvenv.cfg``, or it is this interpreter's prefix)."""
    import sys
    from pathlib import Path

    file = Path(path)
    if file.parent.name not in ("bin", "Scripts"):
        return False
    if file.name in ("dfit", "dfit.exe", "dfit-script.py"):
        return True
    environment = file.parent.parent
    return str(environment) in (sys.prefix, sys.base_prefix) or (environment / "pyvenv.cfg").is_file()


def _user_glob_matches(pattern: str, path: str, relative: str) -> bool:
    """A user's glob on the package-relative path, the absolute path or a trailing part
    of it; ``*/x.py`` also matches a bare ``x.py`` (frames of files given relatively)."""
    bare = pattern[2:] if pattern.startswith("*/") else None
    return (fnmatch.fnmatchcase(relative, pattern) or fnmatch.fnmatchcase(path, pattern)
            or fnmatch.fnmatchcase(path, "*/" + pattern) or (bare is not None and fnmatch.fnmatchcase(path, bare)))


def package_relative(path: str) -> str:
    """``/venv/lib/python3.11/site-packages/torch/nn/linear.py`` → ``torch/nn/linear.py``;
    a file of the standard library → ``<stdlib>/<name>``; a file inside an installed
    framework package's folder wherever it lives (an editable or source install:
    :func:`installed_framework_roots`) → relative to that folder's parent; anything
    else unchanged."""
    for marker in _PACKAGE_DIRS:
        index = path.rfind(marker)
        if index >= 0:
            return path[index + len(marker):]
    import re

    match = re.search(r"/lib/python3\.\d+/(.+)$", path)
    if match:
        return "<stdlib>/" + match.group(1)
    for root in installed_framework_roots():
        if path.startswith(root):
            return path[len(root.rsplit("/", 2)[0]) + 1:]
    return path


@functools.cache
def installed_framework_roots() -> tuple[str, ...]:
    """The folders (``/``-terminated) the framework packages of :data:`FRAMEWORK_PATTERNS`
    are imported from on this machine, found without importing them."""
    import importlib.util
    import os

    roots = []
    for pattern in FRAMEWORK_PATTERNS:
        name = pattern.split("/", 1)[0]
        if not name.isidentifier():
            continue
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        for location in (spec.submodule_search_locations or ()) if spec is not None else ():
            roots += [str(location).rstrip("/") + "/", os.path.realpath(location).rstrip("/") + "/"]
    return tuple(dict.fromkeys(roots))


# --- registry --------------------------------------------------------------------------

#: Frontend name → zero-argument factory importing its module on call. Detection tries
#: them in this order (ONNX imports are torch-dialect modules: ONNX goes before torch).
FRONTENDS: dict[str, Callable[[], Frontend]] = {
    "onnx": lambda: importlib.import_module("dfit_mlir.frontends.onnx").FRONTEND,
    "tflite": lambda: importlib.import_module("dfit_mlir.frontends.tflite").FRONTEND,
    "torch": lambda: importlib.import_module("dfit_mlir.frontends.torch").FRONTEND,
    "jax": lambda: importlib.import_module("dfit_mlir.frontends.jax").FRONTEND,
}


def get(name: str) -> Frontend:
    if name == GENERIC.name:
        return GENERIC
    try:
        return FRONTENDS[name]()
    except KeyError:
        raise ValueError(f"unknown frontend {name!r}; known: {', '.join(FRONTENDS)}") from None


def detect(operators: Sequence[dict[str, Any]]) -> Frontend:
    for factory in FRONTENDS.values():
        frontend = factory()
        if frontend.recognizes(operators):
            return frontend
    return GENERIC


class GenericFrontend:
    """MLIR written by hand or by an unknown producer: location names are the module
    path (``loc("conv1"(...))``), nothing says the phase."""

    name = "mlir"

    def recognizes(self, operators: Sequence[dict[str, Any]]) -> bool:
        return True

    def source_model(self, op: dict[str, Any]) -> SourceModel:
        names = op.get("name_path") or ()
        return SourceModel(module_path=".".join(names) if names else None, source_op=op["op"])

    def finish(self, operators: Sequence[dict[str, Any]]) -> None:
        pass

    def module_classes(self, op: dict[str, Any]) -> dict[str, str]:
        return {}


GENERIC = GenericFrontend()


def module_classes(frontend: str | None, op: dict[str, Any]) -> dict[str, str]:
    """Module path → class of the modules enclosing ``op``, as ``frontend`` reads them
    (tools call this to name the inner nodes of a module tree)."""
    if not frontend:
        return {}
    try:
        found = get(frontend)
    except ValueError:
        return {}
    reader = getattr(found, "module_classes", None)
    return reader(op) if reader is not None else {}


def annotate(operators: list[dict[str, Any]], callees: dict[str, str] | None = None,
             frontend: Frontend | None = None, tensors: Sequence[dict[str, Any]] = ()) -> Frontend:
    """Fill :data:`FIELDS` on every operator record, in place; returns the frontend used.

    ``callees``: call op ID → callee symbol. Ops of a private function whose own
    location says nothing (JAX emits ``log_softmax`` with bare ``loc("sub")`` names)
    take the module path and phase of the function's call sites when those agree, and
    their call stack (as IREE's inliner gives them ``callsite(op at call)``).
    Initial values (``util.global`` and initializer bodies) are ``initializer``.
    ``tensors`` (producer → consumers, the manifest's table) let an update nothing names
    be told by what it is made from (:func:`_updates_of_gradients`).
    """
    frontend = frontend or detect(operators)
    by_id = {op["id"]: op for op in operators}
    for op in operators:
        op.update(frontend.source_model(op).as_fields())
    function_of = _enclosing_functions(operators, by_id)
    for op in operators:
        if op["op"] in INITIALIZER_OPS or by_id.get(function_of.get(op["id"]) or "", {}).get("op") \
                == "util.initializer":
            op["phase"] = "initializer"
    frontend.finish(operators)
    _inherit_from_call_sites(operators, by_id, function_of, callees or {}, getattr(frontend, "nested_path", None))
    _updates_of_gradients(operators, tensors)
    settle = getattr(frontend, "settle", None)  # a frontend's last word, once every op has its context
    if settle is not None:
        settle(operators)
    return frontend


def _updates_of_gradients(operators: Sequence[dict[str, Any]], tensors: Sequence[dict[str, Any]]) -> None:
    """A training step's update that no scope names (``w - lr * g`` written by hand, a
    Keras ``stateless_call`` step) is told by its data flow: an op nothing gave a phase
    that consumes a gradient (a ``backward`` op's result), or the result of such an op,
    is ``optimizer``, and so is an op that feeds nothing but such updates (the learning
    rate's broadcast). Ops that never see a gradient (a metric of the forward outputs)
    and constants keep ``None``; terminators only pass values on."""
    if not any(op.get("phase") == "backward" for op in operators):
        return
    producers: dict[str, set[str]] = {}
    consumers: dict[str, set[str]] = {}
    for tensor in tensors:
        used_by = tensor.get("consumers") or ()
        consumers.setdefault(tensor["producer"], set()).update(used_by)
        for consumer in used_by:
            producers.setdefault(consumer, set()).add(tensor["producer"])
    from_gradients = {op["id"] for op in operators if op.get("phase") == "backward"}
    for op in operators:  # program order: a value's producer comes before its consumers
        if op.get("phase") is not None or op["op"] in FUNCTION_OPS or op["op"].endswith((".return", ".yield")):
            continue
        if producers.get(op["id"], set()) & from_gradients:
            op["phase"] = "optimizer"
            from_gradients.add(op["id"])
    phase_of = {op["id"]: op.get("phase") for op in operators}
    for op in reversed(operators):  # consumers first
        used_by = consumers.get(op["id"])
        if op.get("phase") is None and op["id"] in producers and used_by \
                and all(phase_of.get(user) == "optimizer" for user in used_by):
            op["phase"] = phase_of[op["id"]] = "optimizer"


def common_module(paths: Iterable[str | None]) -> str | None:
    """The innermost module that holds every path (``MLP/block1``, ``MLP/block2`` →
    ``MLP``; the root ``""`` if only that); ``None`` if any path is unknown."""
    from dfit_mlir.core.module_paths import ancestry

    paths = list(paths)
    if not paths or any(p is None for p in paths):
        return None
    chains = [ancestry(p) for p in paths]  # type: ignore[arg-type]
    common = chains[0]
    for chain in chains[1:]:
        common = [a for a, b in zip(common, chain, strict=False) if a == b]
    return common[-1] if common else ""


def _enclosing_functions(operators: list[dict[str, Any]], by_id: dict[str, dict[str, Any]]) -> dict[str, str]:
    found: dict[str, str] = {}
    for op in operators:
        parent = op.get("parent")
        while parent is not None and parent in by_id and by_id[parent]["op"] not in FUNCTION_OPS | INITIALIZER_OPS:
            parent = by_id[parent].get("parent")
        if parent is not None:
            found[op["id"]] = parent
    return found


def _inherit_from_call_sites(operators: list[dict[str, Any]], by_id: dict[str, dict[str, Any]],
                             function_of: dict[str, str], callees: dict[str, str],
                             nested_path: Callable[[dict[str, Any], str | None], str | None] | None = None) -> None:
    """``nested_path(op, outer)``: the frontend's module path for an op of a private
    function called from ``outer`` (JAX: a scan body's own scopes below the call site);
    without one, the op sits at ``outer``. A private function itself sits where its
    call sites do."""
    callers: dict[str, list[str]] = {}
    for call_id, callee in callees.items():
        callers.setdefault(callee, []).append(call_id)
    resolved: dict[str, tuple[str | None, str | None]] = {}

    def context(function: str, seen: frozenset[str]) -> tuple[str | None, str | None]:
        """(module path, phase) every call site of ``function`` agrees on; a caller
        that itself says nothing asks its own function's call sites."""
        if function in resolved:
            return resolved[function]
        values = set()
        for call_id in callers.get(function, ()):
            call = by_id[call_id]
            path, phase = call.get("module_path"), call.get("phase")
            if (path is None or phase is None) and function_of.get(call_id) not in seen | {None}:
                outer = context(function_of[call_id], seen | {function})
                if path is None:
                    path = nested_path(call, outer[0]) if nested_path is not None else outer[0]
                phase = phase or outer[1]
            values.add((path, phase))
        own = by_id.get(function, {})
        if not values:
            values.add((own.get("module_path"), own.get("phase")))
        paths = {v[0] for v in values}
        phases = {v[1] for v in values}
        result = (common_module(paths), phases.pop() if len(phases) == 1 else None)
        resolved[function] = result
        return result

    stacks: dict[str, list[dict[str, Any]]] = {}

    def call_stack(function: str, seen: frozenset[str]) -> list[dict[str, Any]]:
        """The call stack every call site of ``function`` shares (its own op's stack
        continues there, as when IREE inlines it: ``callsite(op at call)``)."""
        if function not in stacks:
            found = []
            for call_id in callers.get(function, ()):
                stack = by_id[call_id].get("call_stack") or []
                if not stack and function_of.get(call_id) not in seen | {None}:
                    stack = call_stack(function_of[call_id], seen | {function})
                found.append(stack)
            stacks[function] = found[0] if found and all(s == found[0] for s in found) else []
        return stacks[function]

    for op in operators:
        if op["op"] in FUNCTION_OPS and op["id"] in callers and op.get("module_path") is None:
            op["module_path"], phase = context(op["id"], frozenset())
            op["phase"] = op.get("phase") or phase
        function = function_of.get(op["id"])
        if function is not None and not op.get("call_stack") and not op.get("source") and function in callers:
            op["call_stack"] = list(call_stack(function, frozenset()))
        if function is None or (op.get("module_path") is not None and op.get("phase") is not None):
            continue
        if function not in callers and by_id.get(function, {}).get("module_path") is None:
            continue
        path, phase = context(function, frozenset())
        if op.get("module_path") is None:
            op["module_path"] = nested_path(op, path) if nested_path is not None else path
        if op.get("phase") is None:
            op["phase"] = phase
