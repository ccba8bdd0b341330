"""What a bundle may make dfit read: the one rule every reader of a bundle, manifest,
store index or marker goes through (issue 26: a bundle is safe to open, whoever made it).

Bundles, manifests and stores are shared (CI artifacts, bug reports), so whatever they
name is data from a stranger. The rule, in four parts:

* **Files dfit is given or a bundle names are opened only if they are regular files**
  (:func:`open_regular`): a device, FIFO or socket is refused before anything is read (it
  is opened non-blocking and checked with ``fstat``, so a FIFO never blocks), and so is
  anything under ``/proc``, ``/sys`` or ``/dev`` (their "regular" files are the machine's
  state: ``/proc/self/environ``). Reads are bounded (:data:`MAX_DOCUMENT_BYTES` for JSON
  documents).
* **JSON is parsed strictly** (:func:`parse_json`): nesting deeper than
  :data:`MAX_JSON_DEPTH` is refused before parsing (no RecursionError anywhere after),
  a duplicate key in an object is refused (which copy would win is a reader's accident),
  ``NaN``/``Infinity`` are refused (JSON has no such numbers).
* **Decompression is bounded** (:func:`inflate`): at most :data:`INFLATE_RATIO` times the
  compressed size and never more than :data:`INFLATE_CEILING`, streaming, so a bomb is
  refused after reading at most that much.
* **Paths read from an index, manifest or marker stay inside their root**
  (:func:`inside`): relative, no ``..``, and inside the root once symlinks are resolved.
* **Source files a location names** (:func:`source_file`, what ``dfit view`` embeds) are
  shown only from the bundle's own folder or the folder of the compile's recorded input
  — that one only while the input file there still has the sha256 the manifest records,
  and never a system, shared or home folder (:func:`source_roots`) — resolved inside
  that root (no symlink out of it), not a hidden path (``.env``, ``.ssh/…``), a regular
  UTF-8 text file of at most :data:`MAX_SOURCE_BYTES`. Anything else is named in the page
  as "source not embedded: why".
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from dfit_mlir.core.errors import InvalidInputError

#: A JSON document dfit reads (manifest, summary, index, marker) is at most this large.
MAX_DOCUMENT_BYTES: Final = 1 << 30
#: Objects and arrays nest at most this deep in a JSON document dfit reads (a manifest
#: nests about 8 deep).
MAX_JSON_DEPTH: Final = 256
#: A decompressed payload is at most this many times its compressed size ...
INFLATE_RATIO: Final = 100
#: ... and never more than this many bytes.
INFLATE_CEILING: Final = 256 << 20
#: A source file larger than this is not embedded (a generated file is not the model's code).
MAX_SOURCE_BYTES: Final = 2_000_000
#: Never read from these trees, whatever names them: their files are the machine's state.
SPECIAL_TREES: Final = ("/proc", "/sys", "/dev")
#: Never a root for source files, nor inside one of these trees: a recorded input there
#: vouches for nothing of the user's.
SYSTEM_TREES: Final = ("/etc", "/usr", "/var", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/boot",
                       "/root", "/run", "/snap", *SPECIAL_TREES)
#: Never a root for source files themselves (folders that hold everyone's or everything).
SHARED_FOLDERS: Final = ("/", "/home", "/tmp", "/mnt", "/media", "/opt", "/srv", "/var/tmp")


def resolve(path: str | os.PathLike[str]) -> Path:
    """Absolute, symlinks resolved (a loop does not raise)."""
    return Path(os.path.realpath(os.path.abspath(os.path.expanduser(os.fspath(path)))))


def _under(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def special_tree(path: str | os.PathLike[str]) -> str | None:
    """The special tree (``/proc``, ``/sys``, ``/dev``) ``path`` lies in once resolved, if any."""
    resolved = resolve(path)
    return next((tree for tree in SPECIAL_TREES if _under(resolved, Path(tree))), None)


def file_kind(mode: int) -> str:
    return ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else
            "a socket" if stat.S_ISSOCK(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else
            "not a regular file")


def refusal(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` may not be read as a file dfit was given (None: it may): it is under
    ``/proc``, ``/sys`` or ``/dev``, or not a regular file. Checked without opening it."""
    tree = special_tree(path)
    if tree is not None:
        return f"it is under {tree} (dfit reads no machine state)"
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "no such file"
    except OSError as error:
        return f"cannot read: {error.strerror}"
    return None if stat.S_ISREG(mode) else f"{file_kind(mode)}, not a file"


def open_regular(path: str | os.PathLike[str], what: str = "file") -> int:
    """A read-only descriptor of ``path``, refused (one :class:`InvalidInputError` naming
    it) unless it is a regular file outside ``/proc``, ``/sys`` and ``/dev``. Opened
    non-blocking, so a FIFO is refused by ``fstat``, not waited on."""
    tree = special_tree(path)
    if tree is not None:
        raise InvalidInputError(f"{path}: refusing to read a {what} under {tree} (dfit reads no machine state)")
    try:
        mode = os.stat(path).st_mode
    except OSError:
        mode = stat.S_IFREG  # the open below says why
    if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):  # a socket cannot even be opened
        raise InvalidInputError(f"{path}: refusing to read {file_kind(mode)} as a {what}")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise InvalidInputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InvalidInputError(f"{path}: is a directory, not a {what}") from None
    except OSError as error:
        raise InvalidInputError(f"{path}: cannot read: {error.strerror}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = file_kind(mode)
        raise InvalidInputError(f"{path}: is {kind}, not a {what}" if stat.S_ISDIR(mode)
                                else f"{path}: refusing to read {kind} as a {what}")
    os.set_blocking(fd, True)
    return fd


def read_bytes(path: str | os.PathLike[str], *, limit: int = MAX_DOCUMENT_BYTES, what: str = "file") -> bytes:
    """The bytes of a regular file (:func:`open_regular`), refused past ``limit`` bytes."""
    fd = open_regular(path, what)
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise InvalidInputError(f"{path}: larger than {size_text(limit)}, the most dfit reads as a {what}")
    return data


def size_text(count: int) -> str:
    return f"{count >> 20} MiB" if count >= 1 << 20 else f"{count} bytes"


# --- JSON ------------------------------------------------------------------------------

#: A JSON string (escapes included), to blank out before counting brackets.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)


def json_depth(text: str) -> int:
    """How deep objects and arrays nest in ``text`` (strings skipped), without recursion."""
    import numpy as np

    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH:
        return text.count("[") + text.count("{")
    brackets = re.sub(r"[^\[\]{}]+", "", _STRING.sub("", text)).encode("ascii")
    codes = np.frombuffer(brackets, dtype=np.uint8)
    steps = np.where((codes == ord("[")) | (codes == ord("{")), 1, -1).astype(np.int64)
    return int(np.cumsum(steps).max()) if len(steps) else 0


class _DuplicateKey(ValueError):
    pass


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    document = dict(pairs)
    if len(document) != len(pairs):
        seen: set[str] = set()
        duplicate = next(key for key, _ in pairs if key in seen or seen.add(key))  # type: ignore[func-returns-value]
        raise _DuplicateKey(f"duplicate key {duplicate[:80]!r} in an object")
    return document


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(text: str, source: str | os.PathLike[str]) -> Any:
    """``text`` parsed as strict JSON: nesting at most :data:`MAX_JSON_DEPTH`, no duplicate
    key, no ``NaN``/``Infinity``; every way it is wrong one :class:`InvalidInputError`
    naming ``source`` (and line:column for syntax errors)."""
    depth = json_depth(text)
    if depth > MAX_JSON_DEPTH:
        raise InvalidInputError(f"{source}: JSON nested {depth} deep (dfit reads at most {MAX_JSON_DEPTH})")
    try:
        return json.loads(text, object_pairs_hook=_unique_object, parse_constant=_refuse_constant)
    except json.JSONDecodeError as error:
        raise InvalidInputError(f"{source}:{error.lineno}:{error.colno}: invalid JSON: {error.msg}") from None
    except RecursionError:
        raise InvalidInputError(f"{source}: JSON nested too deeply") from None
    except ValueError as error:  # a duplicate key, NaN / Infinity, a number of thousands of digits
        raise InvalidInputError(f"{source}: invalid JSON: {str(error).split(';')[0][:200]}") from None


def load_json(path: str | os.PathLike[str], *, what: str = "JSON file", limit: int = MAX_DOCUMENT_BYTES) -> Any:
    """A JSON file read by the rule (:func:`read_bytes`, UTF-8, :func:`parse_json`)."""
    data = read_bytes(path, limit=limit, what=what)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InvalidInputError(f"{path}: not UTF-8 JSON (byte {error.start} is 0x{data[error.start]:02x})") from None
    return parse_json(text, path)


# --- decompression ---------------------------------------------------------------------

def inflate_limit(compressed: int) -> int:
    """The most bytes ``compressed`` bytes may inflate to."""
    return min(INFLATE_CEILING, max(1 << 16, INFLATE_RATIO * compressed))


def inflate(data: bytes, source: str = "data") -> bytes:
    """zlib-inflate ``data``, streaming, refused (ValueError naming ``source``) past
    :func:`inflate_limit` bytes: a bomb costs at most that much memory."""
    limit = inflate_limit(len(data))
    engine = zlib.decompressobj()
    out = engine.decompress(data, limit + 1)
    if len(out) > limit or engine.unconsumed_tail:
        raise ValueError(f"{source} inflates past {size_text(limit)} (at most {INFLATE_RATIO}x its "
                         f"{len(data)} compressed bytes, and never past {size_text(INFLATE_CEILING)})")
    if not engine.eof:
        raise ValueError(f"{source}: compressed data is truncated")
    return out


# --- paths named by an index, manifest or marker ---------------------------------------

def inside(root: str | os.PathLike[str], name: str, what: str = "path") -> Path:
    """``root / name`` for a ``name`` read from an index, manifest or marker under
    ``root``: refused (InvalidInputError) if it is absolute, climbs with ``..``, or leaves
    ``root`` once symlinks are resolved. Use before reading, writing or deleting it."""
    if not isinstance(name, str) or not name or "\0" in name:
        raise InvalidInputError(f"{root}: a {what} that is not a path ({str(name)[:80]!r})")
    parts = name.replace("\\", "/").split("/")
    if name.startswith("/") or os.path.isabs(name) or ".." in parts:
        raise InvalidInputError(f"{root}: the {what} {name[:200]!r} leaves its folder (absolute or `..`)")
    base = resolve(root)
    target = Path(root) / name
    if not _under(resolve(target), base):
        raise InvalidInputError(f"{root}: the {what} {name[:200]!r} leads out of its folder (a symlink)")
    return target


def simple_name(name: Any, what: str, where: str | os.PathLike[str]) -> str:
    """A single path component read from an index (no ``/``, not ``.``/``..``, no NUL)."""
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise InvalidInputError(f"{where}: {what} {str(name)[:80]!r} is not a plain name")
    return name


# --- source files a location names -----------------------------------------------------

@dataclass(frozen=True)
class Source:
    """A source file the view may embed (``text``), or why not (``why``)."""

    name: str
    path: Path | None = None
    text: str | None = None
    why: str | None = None


@dataclass(frozen=True)
class SourceRoots:
    """Where a bundle's source files may come from: ``folders`` (the files must resolve
    inside one), and ``base``, the folder a relative recorded input was found under —
    the compile's working directory, which relative location names are relative to too
    (``dfit compile examples/models/convnet.mlir`` names ``examples/models/convnet.mlir``)."""

    folders: tuple[Path, ...]
    base: Path | None = None
    #: Location name → (the file's absolute path at compile time, its sha256): the files
    #: the compile vouched for (:func:`source_digests`), shown wherever they live while
    #: their content is still what the compile read.
    vouched: tuple[tuple[str, str, str], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.folders)

    def __iter__(self) -> Iterator[Path]:
        return iter(self.folders)


def source_roots(bundle: Path | None, manifest_file: Path | None, manifest: dict[str, Any]) -> SourceRoots:
    """The folders whose files a bundle may show: the bundle's own folder (what it
    carries), and the folder of the compile's recorded input while that file still has
    the recorded sha256 (a relative input path is taken from the manifest's folder or the
    working directory) — never a system folder, a shared one or the home folder itself.
    A bare manifest's own folder is not a root: it is wherever the manifest was saved."""
    roots = [resolve(bundle)] if bundle is not None else []
    vouched = _vouched(manifest.get("sources"))
    given = manifest.get("input")
    recorded: dict[str, Any] = given if isinstance(given, dict) else {}
    path, digest = recorded.get("path"), recorded.get("sha256")
    if not (isinstance(path, str) and isinstance(digest, str) and path and "\0" not in path):
        return SourceRoots(tuple(roots), vouched=vouched)
    bases = [Path.cwd()] + ([manifest_file.parent] if manifest_file is not None else []) + \
        ([bundle.parent] if bundle is not None else [])
    found_base = None
    for base, candidate in [(None, Path(path))] if os.path.isabs(path) else [(b, b / path) for b in bases]:
        folder = resolve(candidate).parent
        if _vouched_folder(folder) and _digest(candidate) == digest:
            roots.append(folder)
            found_base = None if base is None else resolve(base)
            break
    return SourceRoots(tuple(dict.fromkeys(roots)), found_base, vouched)


def _vouched(given: Any) -> tuple[tuple[str, str, str], ...]:
    """The manifest's ``sources`` table, as far as it is well formed (anything else in it
    vouches for nothing)."""
    if not isinstance(given, dict):
        return ()
    return tuple((name, entry["path"], entry["sha256"]) for name, entry in given.items()
                 if isinstance(name, str) and isinstance(entry, dict) and isinstance(entry.get("path"), str)
                 and isinstance(entry.get("sha256"), str) and os.path.isabs(entry["path"]) and "\0" not in name
                 and "\0" not in entry["path"])


#: At most this many source files, and this many bytes of them, are hashed per compile.
MAX_VOUCHED_FILES: Final = 2_000
MAX_VOUCHED_BYTES: Final = 256 * 1_000_000


def source_digests(names: Iterable[str], base: Path | None = None) -> dict[str, dict[str, str]]:
    """What a compile vouches for (the manifest's ``sources``): for each file a location
    names that is a regular file here (not under ``/proc``, ``/sys``, ``/dev``) of at most
    :data:`MAX_SOURCE_BYTES`, its absolute path and sha256. ``dfit view`` shows such a file
    wherever it lives (a model in ``site-packages/transformers``) while its content is
    still what was compiled; a bundle made elsewhere cannot vouch for a file of the
    viewer's machine without knowing its content."""
    found: dict[str, dict[str, str]] = {}
    spent = 0
    for name in dict.fromkeys(names):
        if len(found) >= MAX_VOUCHED_FILES or spent >= MAX_VOUCHED_BYTES or not name or "\0" in name:
            continue
        path = Path(name) if os.path.isabs(name) else (base or Path.cwd()) / name
        if refusal(path) is not None:
            continue
        try:
            data = read_bytes(path, limit=MAX_SOURCE_BYTES, what="source file")
        except InvalidInputError:
            continue
        spent += len(data)
        found[name] = {"path": str(resolve(path)), "sha256": hashlib.sha256(data).hexdigest()}
    return found


def _vouched_folder(folder: Path) -> bool:
    home = resolve(Path.home()) if os.environ.get("HOME") else None
    return (str(folder) not in SHARED_FOLDERS and folder != home
            and not any(_under(folder, Path(tree)) for tree in SYSTEM_TREES))


def _digest(path: Path) -> str | None:
    try:
        fd = open_regular(path)
    except InvalidInputError:
        return None
    digest = hashlib.sha256()
    with os.fdopen(fd, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _vouched_source(name: str, vouched: tuple[tuple[str, str, str], ...]) -> Source | None:
    """The file the compile vouched for under ``name``, if its content is still the one
    the compile read (``None``: not vouched for, or changed since: the folder rule decides)."""
    for recorded, path, digest in vouched:
        if recorded != name or refusal(path) is not None:
            continue
        try:
            data = read_bytes(path, limit=MAX_SOURCE_BYTES, what="source file")
        except InvalidInputError:
            return None
        if hashlib.sha256(data).hexdigest() != digest or b"\0" in data:
            return None
        try:
            return Source(name, Path(path), data.decode("utf-8"))
        except UnicodeDecodeError:
            return None
    return None


def source_file(name: str, given: SourceRoots | Iterable[Path]) -> Source:
    """The source file a location names, if the rule (module doc) lets it be shown: a
    relative name is looked up under each folder and under the compile's base; wherever
    it is found, it must resolve inside one of the folders."""
    roots = list(given)
    base = given.base if isinstance(given, SourceRoots) else None
    vouched = _vouched_source(name, given.vouched) if isinstance(given, SourceRoots) else None
    if vouched is not None:
        return vouched
    if not roots:
        return Source(name, why="no folder of this bundle holds source files")
    if "\0" in name:
        return Source(name, why="not a file name")
    candidates = [Path(name)] if os.path.isabs(name) else \
        [root / name for root in roots] + ([base / name] if base is not None else [])
    reasons = set()
    for candidate in candidates:
        resolved = resolve(candidate)
        root = next((r for r in roots if _under(resolved, r)), None)
        if root is None:
            reasons.add("a symlink out of its folder" if any(
                _under(Path(os.path.normpath(os.path.abspath(candidate))), r) for r in roots) else "outside")
            continue
        if any(part.startswith(".") for part in resolved.relative_to(root).parts):
            return Source(name, why="a hidden file or folder")
        problem = refusal(resolved)
        if problem == "no such file":
            reasons.add(problem)
            continue
        if problem is not None:
            return Source(name, why=problem)
        try:
            data = read_bytes(resolved, limit=MAX_SOURCE_BYTES, what="source file")
        except InvalidInputError as error:
            return Source(name, why=str(error).split(": ", 1)[-1])
        if b"\0" in data:
            return Source(name, why="not a text file")
        try:
            return Source(name, resolved, data.decode("utf-8"))
        except UnicodeDecodeError:
            return Source(name, why="not UTF-8 text")
    for why in ("a symlink out of its folder", "no such file"):
        if why in reasons:
            return Source(name, why=why)
    return Source(name, why="not inside the bundle's folder or the recorded input's folder")
