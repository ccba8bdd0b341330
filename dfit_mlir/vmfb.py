"""What an IREE ``.vmfb`` holds, read with the shipped ``iree-dump-module``: exported
functions, the rodata segments (dispatch export names, executable binaries) and the
bytecode function table. Used to show that an instrumented compile generated the same
executables as a plain one."""

from __future__ import annotations

import hashlib
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from dfit_mlir.errors import InvalidInputError
from dfit_mlir.toolchain import runtime_tool

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
        tuple(functions),
    )


def _external_blobs(data: bytes, externals: list[tuple[int, int]], path: Path) -> list[bytes]:
    """External segments live after the FlatBuffer at offsets relative to a base the dump
    does not print; the base is found from the first segment, an ELF for llvm-cpu."""
    if not externals:
        return []
    first_offset = externals[0][0]
    elf_at = data.find(_ELF_MAGIC)
    if elf_at < first_offset:
        raise InvalidInputError(f"{path}: no embedded ELF executable found (only llvm-cpu is supported)")
    base = elf_at - first_offset
    return [data[base + offset : base + offset + size] for offset, size in externals]
