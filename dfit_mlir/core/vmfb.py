"""What an IREE ``.vmfb`` holds, read with the shipped ``iree-dump-module``: exported
functions, the rodata segments (dispatch export names, executable binaries) and the
bytecode function table. Used to show that an instrumented compile generated the same
executables as a plain one."""

from __future__ import annotations

import hashlib
import re
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

from dfit_mlir.core.errors import InvalidInputError
from dfit_mlir.core.toolchain import runtime_tool

_RODATA_RE = re.compile(
    r"^\s*\.rodata\[\s*(?P<index>\d+)\]\s+(?P<kind>embedded|external)\s+(?P<size>\d+) bytes"
    r"(?: \(offset (?P<offset>\d+) /[^)]*\))?(?: `(?P<text>[^`]*)`)?"
)
_FUNCTION_RE = re.compile(r"^\s*\d+ \| [0-9A-F]{8} \|\s+(?P<length>\d+) \|.*\| (?P<name>\S+)\s*$")
_ELF_MAGIC = b"\x7fELF"


@dataclass(frozen=True)
class ModuleContents:
    embedded_strings: tuple[str, ...]
    """Embedded rodata shown as text (export names appear here, possibly truncated)."""
    executables: tuple[str, ...]
    """sha256 of each external rodata segment (the executable binaries), in order."""
    executable_sizes: tuple[int, ...]
    executable_sections: tuple[dict[str, str], ...]
    """Per external segment that is an ELF: sha256 of each section by name (empty for
    constants), so a difference can be pinned to code, data or metadata."""
    function_bytecode: tuple[tuple[str, int], ...]
    """(function, bytecode length) of each VM function."""


def read_module(path: Path) -> ModuleContents:
    dump = subprocess.run([runtime_tool("iree-dump-module"), str(path)], capture_output=True, text=True)
    if dump.returncode != 0:
        raise InvalidInputError(f"{path}: iree-dump-module failed: {dump.stderr.strip()}")
    data = path.read_bytes()
    strings, externals, functions = [], [], []
    for line in dump.stdout.splitlines():
        match = _RODATA_RE.match(line)
        if match:
            if match["kind"] == "embedded":
                strings.append(match["text"] or "")
            else:
                externals.append((int(match["offset"]), int(match["size"])))
            continue
        match = _FUNCTION_RE.match(line)
        if match:
            functions.append((match["name"], int(match["length"])))
    blobs = _external_blobs(data, externals, path)
    return ModuleContents(
        tuple(strings),
        tuple(hashlib.sha256(blob).hexdigest() for blob in blobs),
        tuple(len(blob) for blob in blobs),
        tuple(elf_sections(blob) for blob in blobs),
        tuple(functions),
    )


def _external_blobs(data: bytes, externals: list[tuple[int, int]], path: Path) -> list[bytes]:
    """External segments live after the FlatBuffer at offsets relative to a base the dump
    does not print. Segments hold executables (ELF for llvm-cpu) and large constants in
    any order, so the base is the one that puts an ELF header at the start of the most
    segments while keeping every segment inside the file."""
    if not externals:
        return []
    best: tuple[int, int] | None = None  # (ELF-headed segments, base)
    position = data.find(_ELF_MAGIC)
    while position != -1:
        for offset, _ in externals:
            base = position - offset
            if base < 0 or any(base + o + size > len(data) for o, size in externals):
                continue
            headed = sum(data.startswith(_ELF_MAGIC, base + o) for o, _ in externals)
            if best is None or headed > best[0]:
                best = (headed, base)
        position = data.find(_ELF_MAGIC, position + 1)
    if best is None:
        raise InvalidInputError(f"{path}: no embedded ELF executable found (only llvm-cpu is supported)")
    base = best[1]
    return [data[base + offset : base + offset + size] for offset, size in externals]


def elf_sections(blob: bytes) -> dict[str, str]:
    """sha256 of each named section of a little-endian ELF64 image; {} if not an ELF."""
    if not blob.startswith(_ELF_MAGIC) or blob[4] != 2 or blob[5] != 1:
        return {}
    shoff, = struct.unpack_from("<Q", blob, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", blob, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", blob, shoff + i * shentsize) for i in range(shnum)]
    names_offset = headers[shstrndx][4]
    sections = {}
    for name_offset, kind, _flags, _addr, offset, size in headers:
        if kind == 8:  # SHT_NOBITS: no bytes in the file
            continue
        start = names_offset + name_offset
        name = blob[start : blob.index(b"\0", start)].decode()
        if name:
            sections[name] = hashlib.sha256(blob[offset : offset + size]).hexdigest()
    return sections


#: ``[  0] main(!vm.ref<?>) -> (!vm.ref<?>)``: the name is all before the argument list,
#: which holds no parenthesis (a function may be named ``my fn`` or ``f(x)``).
_EXPORT_RE = re.compile(r"^\s*\[\s*\d+\]\s(?P<name>.+?)\([^()]*\)\s*->\s*\([^()]*\)\s*$")
_DECLARATION_RE = re.compile(r"^\s*iree\.abi\.declaration:\s*(?P<text>.*)$")
_MODEL_RE = re.compile(r"^\s*iree\.abi\.model:\s*(?P<text>\S+)")
_TENSOR_RE = re.compile(r"tensor<(?P<body>[^>]*)>")
_SCALAR_RE = re.compile(r"^\s*%[\w.$-]+\s*:\s*(?P<dtype>index|[su]?i\d+|bf16|f\d+)\s*$")


@dataclass(frozen=True)
class ExportedFunction:
    """A function of the vmfb's export table (what ``iree-run-module --function`` takes)."""

    name: str
    #: ``iree.abi.declaration`` reflection (``sync func @main(%input0: tensor<…>) -> …``).
    declaration: str | None
    #: ``iree.abi.model`` reflection: ``coarse-fences`` for async functions (they take a
    #: wait and a signal fence after their arguments).
    abi_model: str | None = None

    @property
    def arguments(self) -> list[dict[str, object]] | None:
        """Arguments (``shape`` with ``None`` for dynamic dims, ``dtype``; scalars with
        ``scalar: True`` and shape ``[]``) from the declaration; ``None`` when there is
        none or an argument is neither a tensor nor an integer/float/index scalar."""
        if not self.declaration or "(" not in self.declaration:
            return None
        head = self.declaration.split("->", 1)[0]
        inside = head[head.index("(") + 1: head.rindex(")")] if ")" in head else ""
        if not inside.strip():
            return []
        arguments: list[dict[str, object]] = []
        for part in re.split(r",\s*(?=%)", inside):
            match = _TENSOR_RE.search(part)
            if match is None:
                scalar = _SCALAR_RE.match(part)
                if scalar is None:
                    return None
                # A scalar (``%n: index``, ``%flag: i32``): the tools take it bare (``3``).
                arguments.append({"shape": [], "dtype": scalar["dtype"], "scalar": True})
                continue
            *dims, dtype = match["body"].split("x") if "x" in match["body"] else ["", match["body"]]
            arguments.append({"shape": [None if d == "?" else int(d) for d in dims if d != ""], "dtype": dtype})
        return arguments


def exported_functions(path: Path) -> list[ExportedFunction]:
    """The functions a caller can run: the export table, without IREE's internal ones
    (``__init`` and other ``__``-prefixed entries)."""
    dump = subprocess.run([runtime_tool("iree-dump-module"), str(path)], capture_output=True, text=True)
    if dump.returncode != 0:
        raise InvalidInputError(f"{path}: not an IREE module (iree-dump-module: "
                                f"{(dump.stderr.strip().splitlines() or ['failed'])[-1]})")
    functions: list[ExportedFunction] = []
    in_table = False
    for line in dump.stdout.splitlines():
        if line.startswith("Exported Functions:"):
            in_table = True
            continue
        if in_table:
            match = _EXPORT_RE.match(line)
            if match:
                functions.append(ExportedFunction(match["name"], None))
                continue
            match = _DECLARATION_RE.match(line)
            if match and functions:
                functions[-1] = ExportedFunction(functions[-1].name, match["text"].strip(), functions[-1].abi_model)
                continue
            match = _MODEL_RE.match(line)
            if match and functions:
                functions[-1] = ExportedFunction(functions[-1].name, functions[-1].declaration, match["text"])
                continue
            if not line.strip() or line.startswith("//"):
                if functions or line.startswith("//"):
                    break
    return [f for f in functions if not f.name.startswith("__")]


#: Flags that choose what code IREE generates for, by name in ``codegen.target``.
TARGET_FLAGS = {
    "--iree-hal-target-device": "device",
    "--iree-hal-target-backends": "backends",
    "--iree-hal-local-target-device-backends": "backends",
    "--iree-llvmcpu-target-cpu": "cpu",
    "--iree-llvmcpu-target-cpu-features": "cpu_features",
    "--iree-llvmcpu-target-triple": "triple",
    "--iree-opt-level": "opt_level",
    "--iree-opt-data-tiling": "data_tiling",
}


def embedded_elfs(data: bytes) -> list[bytes]:
    """The ELF64 images a vmfb embeds (llvm-cpu executables), found by their headers: an
    image ends where its section header table does. Needs no tool, so a compile can
    record it for nothing."""
    found = []
    position = data.find(_ELF_MAGIC)
    while position != -1:
        header = data[position:position + 64]
        if len(header) == 64 and header[4] == 2 and header[5] == 1:
            phoff, shoff = struct.unpack_from("<QQ", header, 0x20)
            ehsize, phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHHH", header, 0x34)
            end = max(shoff + shentsize * shnum, phoff + phentsize * phnum)
            if ehsize == 64 and shentsize == 64 and shnum and position + end <= len(data):
                found.append(data[position:position + end])
                position = data.find(_ELF_MAGIC, position + end)
                continue
        position = data.find(_ELF_MAGIC, position + 1)
    return found


def codegen_facts(path: Path, flags: list[str] | tuple[str, ...]) -> dict:
    """What the code generator was asked for and what it produced: the target flags,
    and per embedded executable its size and hashes (whole image, ``.text``). Two
    compiles with the same dispatch structure but another CPU differ here."""
    target: dict[str, str] = {}
    for flag in flags:
        name, _, value = flag.partition("=")
        if name in TARGET_FLAGS:
            target[TARGET_FLAGS[name]] = value
    executables = []
    for blob in embedded_elfs(path.read_bytes()):
        text = elf_sections(blob).get(".text")
        executables.append({"bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest(), "text_sha256": text})
    return {"target": target, "executables": executables}
