"""The manifest: versioned JSON describing one compile (operators, tensors, per-stage
lineage and attribution, partitions, backend capabilities).

The JSON Schema lives beside this module in ``schemas/manifest.schema.json``. Readers
accept any minor version of a major version they know and refuse other majors with a
message that says which versions they read.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from dfit_mlir.core import atomic, reading
from dfit_mlir.core.errors import InvalidInputError
from dfit_mlir.core.paths import manifest_path

SCHEMA_NAME = "dfit.manifest"
MANIFEST_VERSION = "1.2"
SUPPORTED_MAJORS = frozenset({1})


def schema() -> dict[str, Any]:
    text = resources.files("dfit_mlir.core").joinpath("schemas/manifest.schema.json").read_text()
    return json.loads(text)


@lru_cache(maxsize=1)
def _accepts() -> Any:
    """The schema's compiled acceptance check, built once per process."""
    from dfit_mlir.core.fast_schema import compile_schema

    return compile_schema(schema())


def validate(manifest: dict[str, Any], source: str = "<manifest>") -> None:
    """Check the version first (a clear message for unknown majors), then the schema."""
    if manifest.get("schema") != SCHEMA_NAME:
        raise InvalidInputError(f"{source}: not a dfit manifest (schema is {str(manifest.get('schema'))[:60]!r})")
    version = str(manifest.get("version", ""))
    major = version.split(".", 1)[0]
    if not major.isdigit() or int(major) not in SUPPORTED_MAJORS:
        readable = ", ".join(f"{m}.x" for m in sorted(SUPPORTED_MAJORS))
        raise InvalidInputError(
            f"{source}: manifest version {version[:40] or '(none)'} is not supported; this dfit reads {readable}"
        )
    try:
        surely_valid = _accepts()(manifest)  # dfit_mlir.core.fast_schema: then jsonschema would find nothing
    except RecursionError:
        surely_valid = False  # values nested deeper than Python's stack: jsonschema says so
    if surely_valid:
        _check_references(manifest, source)
        return
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema())
    error = next(iter(sorted(validator.iter_errors(manifest), key=lambda e: list(e.path))), None)
    if error is not None:
        where = "/".join(str(part) for part in error.absolute_path) or "(top level)"
        raise InvalidInputError(f"{source}: invalid manifest at {where[:200]}: {error.message[:300]}")
    _check_references(manifest, source)


def _check_references(manifest: dict[str, Any], source: str) -> None:
    """Indices one table of the manifest holds into another, which the schema cannot say:
    a ``pass_history`` row names one of the table's passes and has one value per column."""
    history = manifest.get("pass_history")
    if not isinstance(history, dict):
        return
    passes, columns = len(history.get("passes") or ()), list(history.get("columns") or ())
    at = columns.index("pass") if "pass" in columns else None
    for number, row in enumerate(history.get("rows") or ()):
        if len(row) != len(columns):
            raise InvalidInputError(f"{source}: invalid manifest at pass_history/rows/{number}: {len(row)} values "
                                    f"for {len(columns)} columns")
        if at is not None and not (isinstance(row[at], int) and 0 <= row[at] < passes):
            raise InvalidInputError(f"{source}: invalid manifest at pass_history/rows/{number}: names pass "
                                    f"{str(row[at])[:40]}, the table lists {passes} passes")


def load(path: str | Path) -> dict[str, Any]:
    """Read and validate a manifest; every way it can be wrong is one
    :class:`InvalidInputError` naming the file (and line:column for JSON errors)."""
    path = Path(path)
    if path.is_dir():
        hint = " (a bundle directory: give it to analyze/diff, or its manifest.json)" \
            if (path / "manifest.json").is_file() else ""
        raise InvalidInputError(f"{path}: is a directory, not a manifest{hint}")
    data = reading.read_bytes(path, what="manifest")  # a regular file, bounded (core/reading.py)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InvalidInputError(f"{path}: not a dfit manifest (not UTF-8 text: byte {error.start} is "
                                f"0x{data[error.start]:02x}){_kind_hint(path, data)}") from None
    if not text.strip():
        raise InvalidInputError(f"{path}: not a dfit manifest (the file is empty)")
    manifest = reading.parse_json(text, path)  # depth-limited, no duplicate key, no NaN
    if not isinstance(manifest, dict):
        raise InvalidInputError(f"{path}: not a dfit manifest (a manifest is a JSON object, "
                                f"this is a JSON {type(manifest).__name__})")
    try:
        validate(manifest, str(path))
    except RecursionError:
        raise InvalidInputError(f"{path}: invalid manifest (values nested too deeply)") from None
    return manifest


def _kind_hint(path: Path, data: bytes) -> str:
    """What a binary file given as a manifest probably is, and what to give instead."""
    if data[4:8] == b"IREE" or path.suffix == ".vmfb":
        return f"; it looks like a compiled module: its manifest is {default_path(path)}"
    if data[:4] == b"PAR1":
        return "; it is a Parquet file"
    if data[4:8] == b"TFL3":
        return "; it is a .tflite model"
    return ""


def save(manifest: dict[str, Any], path: str | Path, *, check: bool = False, kind: str | None = None) -> None:
    """Write atomically. ``check`` validates against the schema first; producers leave it
    off on the hot path (it costs ~0.5 s on a 250-op model) and the tests validate every
    manifest they produce through :func:`load`. ``kind``: ``"manifest"`` for a manifest
    at a path the user named (recorded as dfit's, see :mod:`dfit_mlir.core.outputs`)."""
    if check:
        validate(manifest, str(path))
    atomic.write_text(path, json.dumps(manifest, indent=1) + "\n", kind=kind)


def default_path(vmfb: str | Path) -> Path:
    """``out/model.vmfb`` → ``out/model.manifest.json``."""
    return manifest_path(vmfb)


def check_belongs(manifest: dict[str, Any], vmfb: str | Path, source: str = "the manifest") -> None:
    """The manifest records the sha256 of the vmfb it describes; refuse any other vmfb
    (its call sites, probes and traces would not be this module's)."""
    import hashlib

    vmfb = Path(vmfb)
    recorded = manifest.get("compile", {}).get("vmfb_sha256")
    actual = hashlib.sha256(vmfb.read_bytes()).hexdigest()
    if recorded != actual:
        raise InvalidInputError(f"{source} was not written for {vmfb} (the vmfb's sha256 differs)")
