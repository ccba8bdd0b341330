"""Output ownership: dfit replaces only what dfit wrote, and never writes into its inputs.

Two ways of recognising a previous dfit output:

* **directories** (run and reconstruct bundles, analysis folders, diff folders): every one
  holds a marker, ``.dfit-output.json``, naming its kind and the entries dfit wrote
  (``files``; ``paths``: every file in its folders). An existing directory is replaced
  only when it is empty, or when its marker has the same kind and everything in it, at
  any depth, is dfit's (the marked entries, or nested dfit outputs such as
  ``BUNDLE/analysis``, by their own markers) — a user's note dropped into a bundle or
  any folder of it is never deleted.
* **files** (a compile's vmfb and manifest, ``dfit opt -o``, Model Explorer node data):
  a vmfb is dfit's when the manifest beside it records its sha256; a manifest when it is
  a ``dfit.manifest`` document; any file dfit wrote at a path the user named is also
  recorded in a ledger in the cache folder (path, kind, sha256) and stays dfit's while
  its content is what dfit wrote.

Whatever the kind, an output that *is*, *contains* or *lies inside* one of the command's
inputs (symlinks resolved) is refused, ``--force`` or not; ``--force`` only lets dfit
replace an existing output it does not recognise.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dfit_mlir.core.errors import OutputRefusedError
from dfit_mlir.core.paths import CACHE_DIR_ENV, manifest_path

#: The marker inside every directory dfit writes.
MARKER = ".dfit-output.json"
MARKER_SCHEMA = "dfit.output"

#: Resolved paths the user allowed dfit to replace (``--force``) in this process.
_FORCED: set[Path] = set()


def resolve(path: str | os.PathLike[str]) -> Path:
    """Absolute, symlinks of the existing part resolved (``.`` and ``a/..`` too)."""
    # os.path.realpath, unlike Path.resolve, does not raise on a symlink loop.
    return Path(os.path.realpath(os.path.abspath(Path(path).expanduser())))


def check(output: str | os.PathLike[str], kind: str, *, inputs: Iterable[str | os.PathLike[str] | None] = (),
          force: bool = False, directory: bool = True, inside_input_ok: bool = False) -> Path:
    """Refuse ``output`` (one line naming it, exit 2) unless dfit may write it; returns
    the resolved path. ``inside_input_ok``: a new output may go inside a directory input
    (``dfit analyze BUNDLE`` writes ``BUNDLE/analysis``) — never over one of its files."""
    target = check_inputs(output, kind, inputs=inputs, directory=directory, inside_input_ok=inside_input_ok)
    blocker = next((parent for parent in target.parents if parent.exists() and not parent.is_dir()), None)
    if blocker is not None:
        raise OutputRefusedError(f"{output}: cannot write there: {blocker} is a file, not a directory")
    reason = refusal(target, kind, directory=directory)
    if reason is not None:
        if not force or (not directory and target.is_dir()):
            hint = "" if not directory and target.is_dir() else " (use --force to replace it)"
            raise OutputRefusedError(f"{output}: refusing to overwrite: {reason}{hint}")
        _FORCED.add(target)
    return target


def check_inputs(output: str | os.PathLike[str], kind: str, *,
                 inputs: Iterable[str | os.PathLike[str] | None] = (), directory: bool = True,
                 inside_input_ok: bool = False) -> Path:
    """The half of :func:`check` about inputs (an output that is, contains or lies inside
    one of them is refused); alone for an output whose existing content has an owner
    check of its own (a bundle store: its ``dfit-store.json``). Returns the resolved path."""
    target = resolve(output)
    for given in inputs:
        if given is None:
            continue
        source = resolve(given)
        if target == source:
            raise OutputRefusedError(f"{output}: refusing to write an output over the input {given}")
        if target in source.parents:
            raise OutputRefusedError(f"{output}: refusing to write an output that contains the input {given}")
        if source in target.parents and source.is_dir():
            existing_input_file = target.exists() and not (directory and is_marked(target, kind))
            if not inside_input_ok or existing_input_file:
                raise OutputRefusedError(f"{output}: refusing to write an output inside the input {given}")
    return target


def refusal(target: Path, kind: str, *, directory: bool = True) -> str | None:
    """Why dfit may not replace ``target`` with a new ``kind`` output (``None``: it may)."""
    if not (target.exists() or target.is_symlink()):
        return None
    if resolve(target) in _FORCED:
        return None
    if not directory:
        if target.is_dir():
            return "it is a directory"
        return None if is_dfit_file(target, kind) else "it exists and dfit did not write it"
    if not target.is_dir():
        return "it is a file, not a directory dfit wrote"
    entries = sorted(os.listdir(target))
    if not entries:
        return None
    marker = read_marker(target) or _legacy_bundle_marker(target, kind)
    if marker is None:
        return "it is a directory dfit did not write (no dfit marker in it)"
    if marker.get("kind") != kind:
        return f"it is a dfit {marker.get('kind')} output, not a {kind} output"
    foreign = _foreign_entry(target, marker, entries)
    if foreign is not None:
        return f"it holds {foreign!r}, which dfit did not write there"
    return None


def _foreign_entry(directory: Path, marker: dict[str, Any], entries: list[str]) -> str | None:
    """The first thing in ``directory`` (a path relative to it) that dfit did not write,
    by its ``marker``: a top-level entry it does not list (and that is no nested dfit
    output), or a file inside a listed folder that its ``paths`` do not list (a marker
    of an earlier dfit lists no paths: its folders' contents are unknown, so not dfit's)."""
    owned = set(marker.get("files") or ()) | {MARKER}
    paths = marker.get("paths")
    known = set(paths) if isinstance(paths, list) else None
    for name in entries:
        if name == MARKER:
            continue
        entry = directory / name
        if entry.is_dir() and not entry.is_symlink():
            nested = read_marker(entry)
            if nested is not None:  # an output of its own (BUNDLE/analysis): its own rule
                inner = _foreign_entry(entry, nested, sorted(os.listdir(entry)))
                if inner is None:
                    continue
                return f"{name}/{inner}"
            if name not in owned:
                return name
            inside = _files_under(entry, name)
            stray = next((path for path in inside if known is None or path not in known), None)
            if stray is not None:
                return stray
        elif name not in owned and not (entry.is_file() and not entry.is_symlink() and is_dfit_file(entry, None)):
            return name
    return None


def _files_under(folder: Path, prefix: str) -> list[str]:
    """Every entry under ``folder`` but its folders, as ``prefix/relative/path``, sorted
    (links not followed: a link is listed, never walked)."""
    found = []
    for root, folders, files in os.walk(folder):
        relative = Path(prefix) / Path(root).relative_to(folder)
        found += [(relative / name).as_posix() for name in files]
        found += [(relative / name).as_posix() for name in folders if (Path(root) / name).is_symlink()]
    return sorted(found)


#: What a bundle written before markers existed (dfit 0.1) holds.
_LEGACY_BUNDLE_FILES = ("manifest.json", "summary.json", "events.parquet", "sites.parquet", "dispatches.csv",
                        "events.csv", "trace.pftrace", "trace.json", "coverage.json")


def run_summary(directory: Path) -> dict[str, Any] | None:
    """The bundle summary (``summary.json`` of a run, reconstruction or merge) in
    ``directory``; None where there is none or it is not one."""
    try:
        summary = json.loads((directory / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(summary, dict) or summary.get("schema") != "dfit.run-summary":
        return None
    return summary


def _legacy_bundle_marker(directory: Path, kind: str) -> dict[str, Any] | None:
    """The marker a bundle of an earlier dfit would have: recognised by its run summary,
    so that re-running into it works without ``--force`` (its files only, as ever)."""
    if kind != "bundle" or run_summary(directory) is None:
        return None
    return {"schema": MARKER_SCHEMA, "kind": "bundle", "files": list(_LEGACY_BUNDLE_FILES)}


def is_marked(path: Path, kind: str | None = None) -> bool:
    marker = read_marker(path) if path.is_dir() else None
    return marker is not None and (kind is None or marker.get("kind") == kind)


def read_marker(directory: Path) -> dict[str, Any] | None:
    try:
        document = json.loads((directory / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return document if isinstance(document, dict) and document.get("schema") == MARKER_SCHEMA else None


def write_marker(directory: Path, kind: str) -> None:
    from dfit_mlir import __version__

    files = sorted(name for name in os.listdir(directory) if name != MARKER)
    # Every file in its folders too, so that a note dropped into one stops a rewrite.
    paths = sorted(path for name in files if (directory / name).is_dir() and not (directory / name).is_symlink()
                   for path in _files_under(directory / name, name))
    document = {"schema": MARKER_SCHEMA, "kind": kind, "dfit": __version__, "files": files, "paths": paths}
    (directory / MARKER).write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")


# --- files -----------------------------------------------------------------------------

def is_dfit_file(path: Path, kind: str | None) -> bool:
    """Whether ``path`` is a file dfit wrote (of ``kind``, where given) and nobody changed."""
    entry = _ledger_entry(path)
    if entry is not None and (kind is None or entry.get("kind") == kind) and entry.get("sha256") == _sha256(path):
        return True
    if kind in (None, "vmfb") and path.suffix == ".vmfb":
        return _vmfb_of_manifest(path)
    if kind in (None, "manifest") and path.name.endswith(".json"):
        return _is_manifest(path)
    return False


def record_file(path: str | os.PathLike[str], kind: str, content: Path | None = None) -> None:
    """Remember that dfit wrote ``path`` (with the bytes of ``content``, default: of
    ``path`` itself). Best effort: a read-only cache only means the file is not
    recognised later, and replacing it then needs ``--force``."""
    path = resolve(path)
    try:
        folder = _ledger_dir()
        folder.mkdir(parents=True, exist_ok=True)
        entry = {"path": str(path), "kind": kind, "sha256": _sha256(content or path)}
        # Written whole and renamed into place, as atomic.write_text would (which uses this
        # module: calling it here would make the two import each other).
        target = folder / _ledger_name(path)
        partial = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        partial.write_text(json.dumps(entry) + "\n", encoding="utf-8")
        os.replace(partial, target)
    except OSError:
        pass


def _ledger_dir() -> Path:
    base = os.environ.get(CACHE_DIR_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "dfit-mlir")
    return Path(base) / "outputs"


def _ledger_name(path: Path) -> str:
    return hashlib.sha256(str(path).encode("utf-8", "surrogateescape")).hexdigest()[:40] + ".json"


def _ledger_entry(path: Path) -> dict[str, Any] | None:
    path = resolve(path)
    try:
        entry = json.loads((_ledger_dir() / _ledger_name(path)).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return entry if isinstance(entry, dict) and entry.get("path") == str(path) else None


def _sha256(path: Path) -> str | None:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return None
    return digest.hexdigest()


def _vmfb_of_manifest(vmfb: Path) -> bool:
    manifest = manifest_path(vmfb)
    try:
        document = json.loads(manifest.read_text(encoding="utf-8"))
        recorded = document["compile"]["vmfb_sha256"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return False
    return recorded == _sha256(vmfb)


def _is_manifest(path: Path) -> bool:
    try:
        with open(path, "rb") as handle:
            head = handle.read(256)
    except OSError:
        return False
    # A dfit manifest starts with its schema name (json.dumps keeps insertion order).
    return head.startswith(b'{\n "schema": "dfit.manifest"')
