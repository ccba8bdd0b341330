"""The IREE phase driver: run ``iree-compile``'s pipeline one phase at a time so that a
snapshot can be taken between phases.

Two drivers with one interface:

* :class:`InProcessDriver` — one compiler session in this process: the module stays in
  memory between phases. It calls ``ireeCompilerInvocationSetCompileFromPhase`` /
  ``SetCompileToPhase`` of the compiler's C API through ctypes on the library that
  ``iree.compiler.api`` already loaded; ``iree.compiler.api`` does not wrap them, so this
  is a private entry point and is gated on the pinned compiler version.
* :class:`SubprocessDriver` — the public fallback: ``iree-compile --compile-from=<prev>
  --compile-to=<phase>`` per phase, with MLIR text and its locations in between (see
  ``OUTPUT_FLAGS`` for why not bytecode). Slower: each phase re-parses the module.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Protocol, Sequence

from iree.compiler import ir
from iree.compiler.api import Output, Session, ctypes_dl

from dfit_mlir.core import atomic, paths, toolchain
from dfit_mlir.core.errors import CompileError, InvalidInputError, ToolchainError

#: Used when the user's flags name no target; a plain ``iree-compile`` needs one too.
DEFAULT_TARGET_FLAGS = (
    "--iree-hal-target-device=local",
    "--iree-hal-local-target-device-backends=llvm-cpu",
    "--iree-llvmcpu-target-cpu=host",
)
_TARGET_FLAG_PREFIXES = ("--iree-hal-target-device", "--iree-hal-target-backends", "--iree-hal-local-target-device-backends")
_PHASE_SETTERS = ("ireeCompilerInvocationSetCompileFromPhase", "ireeCompilerInvocationSetCompileToPhase")
FORCE_DRIVER_ENV = "DFIT_PHASE_DRIVER"


def with_default_target(flags: Sequence[str]) -> list[str]:
    """The user's flags, plus the local CPU target when they name none."""
    flags = list(flags)
    if not any(flag.startswith(_TARGET_FLAG_PREFIXES) for flag in flags):
        flags.extend(DEFAULT_TARGET_FLAGS)
    return flags


class PhaseDriver(Protocol):
    name: str

    def parse(self, path: Path) -> ir.Operation: ...

    def run(self, module: ir.Operation, after: str | None, to: str) -> ir.Operation: ...

    def write_vmfb(self, module: ir.Operation, after: str, target: Path) -> None: ...

    def mark_changed(self, module: ir.Operation) -> None:
        """dfit changed ``module`` between phases (probes, tensor traces)."""

    def close(self) -> None: ...


class _SessionDriver:
    """What both drivers share: a compiler session whose context has every dialect IREE
    knows registered, the user's flags validated by the compiler itself."""

    name = "session"

    def __init__(self, flags: Sequence[str]):
        remove_stale_folders()  # what compiles killed before this one left
        self.flags = with_default_target(flags)
        self.session = _new_session()
        try:
            self.session.set_flags(*self.flags)
        except ValueError as error:
            message = " ".join(str(error).split())
            raise InvalidInputError(f"iree-compile rejected the flags: {message}") from None
        self.context = self.session.context
        self.context.allow_unregistered_dialects = False

    def mark_changed(self, module: ir.Operation) -> None:
        """Nothing to do where the module never leaves memory."""

    def parse(self, path: Path) -> ir.Operation:
        return parse_file(self.context, path)

    def close(self) -> None:
        # Called from a `finally`: the exception on its way out, if any.
        pending = sys.exc_info()[1]
        try:
            self.session.close()
        except AttributeError:
            # A signal that lands inside iree.compiler's Invocation.__init__ (SIGTERM or
            # Ctrl-C while a phase starts) leaves a half-built invocation among the
            # session's dependents, whose close() then fails on its missing handle: the
            # interrupt on its way out (exit 130) is what the user must get, not this.
            if pending is None:
                raise


#: Model formats people hand to a compiler, and how to bring each into MLIR first.
MODEL_IMPORTERS = {
    ".onnx": "compile it with `dfit compile model.onnx` or import it with dfit_mlir.frontends.onnx.import_model "
             "(keeps node names; the iree-import-onnx CLI drops them)",
    ".tflite": "convert it with tosa-converter-for-tflite --bytecode --emit-debug-info",
    ".pt": "export it to MLIR with iree-turbine (torch==2.13.0)",
    ".pb": "export it to StableHLO (e.g. jax.export or tf's MLIR export) first",
}


def parse_file(context: ir.Context, path: Path) -> ir.Operation:
    """Parse and verify an MLIR text or bytecode file; errors become one
    :class:`InvalidInputError` holding the MLIR diagnostics with file:line:col."""
    if not path.is_file():
        raise InvalidInputError(f"{path}: no such file")
    importer = MODEL_IMPORTERS.get(path.suffix.lower())
    if importer is not None:
        raise InvalidInputError(f"{path}: a {path.suffix} model is not MLIR; {importer}")
    with context, _Diagnostics(context) as diagnostics:
        try:
            module = ir.Module.parseFile(str(path))
        except ir.MLIRError as error:
            raise InvalidInputError(diagnostics.render(error, path)) from None
        try:
            module.operation.verify()
        except ir.MLIRError as error:
            raise InvalidInputError(diagnostics.render(error, path)) from None
    return module.operation


def require_functions(module: ir.Operation, path: Path) -> None:
    """A module with no function compiles to a module that does nothing: refuse it."""
    body = module.regions[0].blocks[0] if module.regions and len(module.regions[0].blocks) else None
    names = [op.operation.name for op in body.operations] if body is not None else []
    if not any(name in ("func.func", "util.func") for name in names):
        what = "holds no operations" if not names else f"holds no function (only {', '.join(sorted(set(names)))})"
        raise InvalidInputError(f"{path}: the module {what}: nothing to compile")


#: LLVM target flags that LLVM checks by aborting (or crashing) the process it runs in.
_LLVM_TARGET_FLAGS = ("--iree-llvmcpu-target-triple", "--iree-llvmcpu-target-cpu", "--iree-llvmcpu-target-abi")
_PREFLIGHT_MODULE = "func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> { return %a : tensor<4xf32> }\n"


def preflight_target_flags(flags: Sequence[str]) -> None:
    """Try the user's LLVM target flags on a one-op module in a child ``iree-compile``
    first: a bad triple or CPU aborts or crashes the compiler, which in-process would
    take dfit down with no message."""
    risky = [flag for flag in flags if flag.startswith(_LLVM_TARGET_FLAGS) and not flag.endswith("=host")]
    if not risky:
        return
    from iree.compiler.tools.binaries import find_tool

    with atomic.scratch_directory("dfit-preflight-") as scratch:
        command = [find_tool("iree-compile"), "-", "-o", os.path.join(scratch, "probe.vmfb"),
                   *with_default_target(flags)]
        result = subprocess.run(command, input=_PREFLIGHT_MODULE, capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        raise CompileError(f"iree-compile {toolchain_failure(result.returncode)} with {' '.join(risky)} "
                           f"(tried on a one-op module):\n{trim_diagnostics(result.stderr)}")


def toolchain_failure(returncode: int) -> str:
    """``failed (exit 1)`` or ``crashed (SIGSEGV)``: how a child tool ended."""
    import signal

    if returncode < 0:
        try:
            return f"crashed ({signal.Signals(-returncode).name})"
        except ValueError:
            return f"crashed (signal {-returncode})"
    return f"failed (exit {returncode})"


def trim_diagnostics(stderr: str, limit: int = 40) -> str:
    """A tool's diagnostics, without the stack dump of a crash, with call-site chains cut
    to the model's frames (a JAX model lowered by ``dfit compile model.py`` carries every
    frame down to dfit's CLI, click and the interpreter: ~2,000 characters per op) and at
    most ``limit`` lines."""
    from dfit_mlir.core.locations import cut_location_chains
    from dfit_mlir.frontends import CodeRules

    stderr = cut_location_chains(stderr, CodeRules.default().message_frames())
    lines = stderr.strip().splitlines()
    if "Stack dump:" in lines:
        lines = lines[:lines.index("Stack dump:")]
    lines = [line[:500] for line in lines if "Please report issues to" not in line]
    return "\n".join(lines[:limit] + ([f"... ({len(lines) - limit} more lines)"] if len(lines) > limit else []))


def _new_session() -> Session:
    """``Session()``, built with the signals held (:func:`atomic.signals_held`; the
    interrupt is raised once it is whole): an object of ``iree.compiler.api`` that a
    SIGINT/SIGTERM leaves half-built prints an AttributeError traceback when collected
    (its ``__del__`` reads the handle ``__init__`` had not set yet)."""
    with atomic.signals_held():
        return Session()


def compiler_context(allow_unregistered: bool = False) -> tuple[Session, ir.Context]:
    """A compiler session and its context, with every dialect IREE knows registered."""
    session = _new_session()
    session.context.allow_unregistered_dialects = allow_unregistered
    return session, session.context


class _Diagnostics:
    """Collects MLIR diagnostics so they can be shown as ``file:line:col: error: ...``."""

    def __init__(self, context: ir.Context):
        self.context = context
        self.messages: list[str] = []

    def __enter__(self) -> "_Diagnostics":
        self.handler = self.context.attach_diagnostic_handler(self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        self.handler.detach()

    def _handle(self, diagnostic: ir.DiagnosticInfo) -> bool:
        self.messages.append(_format_diagnostic(diagnostic))
        return True

    def render(self, error: ir.MLIRError | None, path: Path) -> str:
        lines = list(self.messages)
        if error is not None:
            lines.extend(_format_diagnostic(d) for d in error.error_diagnostics)
        if not lines:
            lines.append(f"{path}: error: {error}" if error else f"{path}: error: invalid module")
        return "\n".join(dict.fromkeys(lines))


def _format_diagnostic(diagnostic: object) -> str:
    location = str(diagnostic.location)  # type: ignore[attr-defined]
    if location.startswith("loc(") and location.endswith(")"):
        location = location[4:-1].replace('"', "")
    severity = str(diagnostic.severity).rsplit(".", 1)[-1].lower()  # type: ignore[attr-defined]
    text = f"{location}: {severity}: {diagnostic.message}"  # type: ignore[attr-defined]
    for note in getattr(diagnostic, "notes", ()):
        text += "\n" + _format_diagnostic(note)
    return text


class InProcessDriver(_SessionDriver):
    name = "in-process"

    def __init__(self, flags: Sequence[str]):
        require_phase_setters()
        super().__init__(flags)
        preflight_target_flags(self.flags)
        self._dylib = ctypes_dl._dylib

    def _invocation(self, module: ir.Operation, after: str | None, to: str):
        with atomic.signals_held():  # whole before an interrupt is raised (see _new_session)
            invocation = self.session.invocation()
        diagnostics = _CollectedDiagnostics(self._dylib, invocation._inv_p)
        invocation.import_module(module)
        if after is not None:
            self._dylib.ireeCompilerInvocationSetCompileFromPhase(invocation._inv_p, after.encode())
        self._dylib.ireeCompilerInvocationSetCompileToPhase(invocation._inv_p, to.encode())
        succeeded = invocation.execute()
        said = "\n".join(diagnostics.messages)
        if not succeeded:
            raise CompileError(f"iree-compile failed in phase '{to}':\n{trim_diagnostics(said)}")
        if said:  # warnings and remarks, as iree-compile would print them
            print(trim_diagnostics(said, limit=200), file=sys.stderr)
        return invocation

    def run(self, module: ir.Operation, after: str | None, to: str) -> ir.Operation:
        return self._invocation(module, after, to).export_module()

    def write_vmfb(self, module: ir.Operation, after: str, target: Path) -> None:
        invocation = self._invocation(module, after, "end")
        with atomic.signals_held():  # whole before an interrupt is raised (see _new_session)
            output = Output.open_file(str(target))
        invocation.output_vm_bytecode(output)
        output.keep()
        output.close()


#: ``iree_compiler_diagnostic_severity_t`` of the compiler's C API.
_SEVERITIES = {0: "note", 1: "warning", 2: "error", 3: "remark"}
_DIAGNOSTIC_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_void_p)


class _CollectedDiagnostics:
    """An invocation's diagnostics, collected through the C API's callback (a crash still
    prints to the terminal, as with console diagnostics) and rendered as ``iree-compile``
    prints them: ``<loc>: error: <message>`` then one ``<loc>: note: ...`` per note."""

    def __init__(self, dylib: ctypes.CDLL, invocation_pointer: object):
        self.messages: list[str] = []
        self._callback = _DIAGNOSTIC_CALLBACK(self._collect)  # kept alive as long as the invocation
        enable = dylib.ireeCompilerInvocationEnableCallbackDiagnostics
        enable.argtypes = [ctypes.c_void_p, ctypes.c_int, _DIAGNOSTIC_CALLBACK, ctypes.c_void_p]
        enable.restype = None
        enable(invocation_pointer, 0, self._callback, None)

    def _collect(self, severity: int, message: bytes, size: int, user_data: object) -> None:
        text = ctypes.string_at(message, size).decode("utf-8", "replace")
        # The callback's text: "<loc>: <message>", then "\n\n<loc>: <note>" per note.
        first, *notes = text.split("\n\n")
        rendered = [_with_severity(first, _SEVERITIES.get(severity, "error"))]
        rendered += [_with_severity(note, "note") for note in notes]
        self.messages.append("\n".join(rendered))


def _with_severity(diagnostic: str, severity: str) -> str:
    """``<loc>: <message>`` → ``<loc>: <severity>: <message>`` (the location is a printed
    ``loc(...)`` or ``file:line:col``)."""
    import re

    from dfit_mlir.core.locations import closing_paren

    if diagnostic.startswith("loc("):
        end = closing_paren(diagnostic, 3)
        split = end + 1 if end >= 0 and diagnostic[end + 1:end + 3] == ": " else -1
    else:
        match = re.match(r"\S.*?:\d+:\d+(?=: )", diagnostic)
        split = match.end() if match else -1
    if split < 0:
        return f"{severity}: {diagnostic}"
    return f"{diagnostic[:split]}: {severity}: {diagnostic[split + 2:]}"


class SubprocessDriver(_SessionDriver):
    name = "subprocess"

    def __init__(self, flags: Sequence[str]):
        super().__init__(flags)
        from iree.compiler.tools.binaries import find_tool

        self.iree_compile = find_tool("iree-compile")
        self.workdir = Path(tempfile.mkdtemp(prefix=paths.private_prefix(WORKDIR_PREFIX)))
        atomic.LIVE_TEMPORARIES.add(self.workdir)  # removed on SIGINT/SIGTERM too
        # The module the last phase returned and the bytecode iree-compile wrote for it.
        self._written: tuple[ir.Operation, Path] | None = None

    def mark_changed(self, module: ir.Operation) -> None:
        self._written = None

    def _input(self, module: ir.Operation) -> Path:
        """The file to start a phase from: iree-compile's own output of the last phase when
        dfit did not change the module since (no second serialisation), else bytecode."""
        if self._written is not None and self._written[0] is module:
            return self._written[1]
        source = self.workdir / "in.mlirbc"
        with open(source, "wb") as handle:
            module.write_bytecode(handle)
        return source

    def _compile(self, module: ir.Operation, after: str | None, extra: list[str], out: Path) -> str:
        """Run one phase; iree-compile's stderr (warnings, and the lines of dump files it
        could not write, which do not fail it)."""
        source = self._input(module)
        command = [self.iree_compile, str(source), "-o", str(out), *self.flags, *extra]
        if after is not None:
            command.append(f"--compile-from={after}")
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0:
            raise CompileError(f"iree-compile {toolchain_failure(result.returncode)} ({' '.join(extra)}):\n"
                               f"{trim_diagnostics(result.stderr)}")
        return result.stderr

    #: Each phase's output is text with locations, not bytecode: IREE 3.13 writes the
    #: bytecode of a module past its stream phase without the data of the resources it
    #: renamed (``--compile-to=stream --emit-mlir-bytecode`` then ``--compile-from=stream``
    #: fails with "resource data missing in input IR" on a transformers BERT); text keeps it.
    #: Generic form: custom forms elide implicit terminators, which would come back from the
    #: parser with other locations.
    OUTPUT_FLAGS = ("--mlir-print-debuginfo", "--mlir-print-op-generic")

    def run(self, module: ir.Operation, after: str | None, to: str) -> ir.Operation:
        out = self.workdir / f"{to}.mlir"
        self._compile(module, after, [f"--compile-to={to}", *self.OUTPUT_FLAGS], out)
        return self._parse_output(out)

    def _parse_output(self, out: Path) -> ir.Operation:
        if self._written is not None and self._written[1] != out:
            self._written[1].unlink(missing_ok=True)  # the phase before: read, no longer needed
        with self.context:
            module = ir.Module.parseFile(str(out)).operation
        self._written = (module, out)
        return module

    def write_vmfb(self, module: ir.Operation, after: str, target: Path) -> None:
        self._compile(module, after, [], target)

    def close(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)
        atomic.LIVE_TEMPORARIES.discard(self.workdir)
        super().close()


#: The temporary folders a compile makes: ``<prefix><pid>-<random>`` (the PID of the dfit
#: process that made it, so that a later compile can remove what a killed one left).
WORKDIR_PREFIX = "dfit-phases-"
DUMPS_PREFIX = "dfit-pass-dumps-"


def remove_stale_folders() -> list[Path]:
    """Remove what compiles and runs killed before this one left (no ``finally`` ran): in
    ``$TMPDIR`` the phase outputs and the scratch folders (:data:`atomic.SCRATCH_PREFIXES`),
    in ``/dev/shm`` the pass dumps (held in memory), of dfit processes that are gone
    (:func:`paths.remove_stale_folders`). The folders removed."""
    return [*paths.remove_stale_folders(Path(tempfile.gettempdir()), (WORKDIR_PREFIX, *atomic.SCRATCH_PREFIXES)),
            *paths.remove_stale_folders(Path("/dev/shm"), (DUMPS_PREFIX,))]


def require_phase_setters() -> None:
    """Gate for the private C API phase setters: pinned compiler and symbols present."""
    toolchain.require_pinned("iree-base-compiler", "The in-process phased compile")
    dylib = ctypes_dl._dylib
    missing = [name for name in _PHASE_SETTERS if not hasattr(dylib, name)]
    if missing:
        raise ToolchainError(f"libIREECompiler lacks {', '.join(missing)}; use the subprocess driver")
    for name in _PHASE_SETTERS:
        getattr(dylib, name).argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        getattr(dylib, name).restype = None


def open_driver(flags: Sequence[str], prefer: str | None = None) -> PhaseDriver:
    """The in-process driver when its gate passes, else the subprocess fallback (with a
    one-line note on why). ``prefer`` (or ``$DFIT_PHASE_DRIVER``) forces one."""
    prefer = prefer or os.environ.get(FORCE_DRIVER_ENV)
    if prefer == "subprocess":
        return SubprocessDriver(flags)
    try:
        return InProcessDriver(flags)
    except ToolchainError as error:
        if prefer == "in-process":
            raise
        import sys

        print(f"dfit: note: {error}; falling back to iree-compile per phase", file=sys.stderr)
        return SubprocessDriver(flags)
