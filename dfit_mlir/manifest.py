"""The manifest: versioned JSON describing one compile (operators, tensors, per-stage
lineage and attribution, partitions, backend capabilities).

The JSON Schema lives beside this module in ``schemas/manifest.schema.json``. Readers
accept any minor version of a major version they know and refuse other majors with a
message that says which versions they read.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from dfit_mlir import atomic
from dfit_mlir.errors import InvalidInputError

SCHEMA_NAME = "dfit.manifest"
MANIFEST_VERSION = "1.2"
SUPPORTED_MAJORS = frozenset({1})


def schema() -> dict[str, Any]:
    text = resources.files("dfit_mlir").joinpath("schemas/manifest.schema.json").read_text()
    return json.loads(text)


def validate(manifest: dict[str, Any], source: str = "<manifest>") -> None:
    """Check the version first (a clear message for unknown majors), then the schema."""
    import jsonschema

    if manifest.get("schema") != SCHEMA_NAME:
        raise InvalidInputError(f"{source}: not a dfit manifest (schema is {manifest.get('schema')!r})")
    version = str(manifest.get("version", ""))
    major = version.split(".", 1)[0]
    if not major.isdigit() or int(major) not in SUPPORTED_MAJORS:
        readable = ", ".join(f"{m}.x" for m in sorted(SUPPORTED_MAJORS))
        raise InvalidInputError(
            f"{source}: manifest version {version or '(none)'} is not supported; this dfit reads {readable}"
        )
    validator = jsonschema.Draft202012Validator(schema())
    error = next(iter(sorted(validator.iter_errors(manifest), key=lambda e: list(e.path))), None)
    if error is not None:
        where = "/".join(str(part) for part in error.absolute_path) or "(top level)"
        raise InvalidInputError(f"{source}: invalid manifest at {where}: {error.message}")


def load(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InvalidInputError(f"{path}: no such file") from None
    except json.JSONDecodeError as error:
        raise InvalidInputError(f"{path}:{error.lineno}:{error.colno}: invalid JSON: {error.msg}") from None
    if not isinstance(manifest, dict):
        raise InvalidInputError(f"{path}: a manifest is a JSON object")
    validate(manifest, str(path))
    return manifest


def save(manifest: dict[str, Any], path: str | Path, *, check: bool = False) -> None:
    """Write atomically. ``check`` validates against the schema first; producers leave it
    off on the hot path (it costs ~0.5 s on a 250-op model) and the tests validate every
    manifest they produce through :func:`load`."""
    if check:
        validate(manifest, str(path))
    atomic.write_text(path, json.dumps(manifest, indent=1) + "\n")


def default_path(vmfb: str | Path) -> Path:
    """``out/model.vmfb`` → ``out/model.manifest.json``."""
    vmfb = Path(vmfb)
    return vmfb.with_name(vmfb.stem + ".manifest.json")


def check_belongs(manifest: dict[str, Any], vmfb: str | Path, source: str = "the manifest") -> None:
    """The manifest records the sha256 of the vmfb it describes; refuse any other vmfb
    (its call sites, probes and traces would not be this module's)."""
    import hashlib

    vmfb = Path(vmfb)
    recorded = manifest.get("compile", {}).get("vmfb_sha256")
    actual = hashlib.sha256(vmfb.read_bytes()).hexdigest()
    if recorded != actual:
        raise InvalidInputError(f"{source} was not written for {vmfb} (the vmfb's sha256 differs)")
