"""The import layers of dfit-mlir, as data, and the check that keeps them apart.

Each layer may import the layers below it and never one above. A layer written
``a | b`` holds independent packages that may not import each other; a layer written
``a + b`` holds packages that work together and may (the compiler: passes read the
frontends' facts, the frontends' entry points call the passes). Every import counts: at
module level, inside a function, under ``TYPE_CHECKING``, relative or absolute.

The root module ``dfit_mlir`` (``__init__``: the version and the lazy ``instrument``
facade) stands outside the layers: anyone may read its version, and it imports only on
call.

Run ``python -m tests.import_layers [ROOT]`` (``make lint`` does); it prints one line per
upward import and exits 1 if there is one.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: Top to bottom. The picture ``ls dfit_mlir`` shows, plus the four folders setuptools
#: maps into the namespace (``passes``, ``dialects``, ``adapters``, ``runtime_hooks``).
LAYERS: tuple[str, ...] = (
    "dfit_mlir.cli + dfit_mlir.__main__",
    "dfit_mlir.fleet",
    "dfit_mlir.views",
    "dfit_mlir.analysis",
    "dfit_mlir.adapters",
    "dfit_mlir.runtime_hooks",
    "dfit_mlir.exporters",
    "dfit_mlir.passes + dfit_mlir.dialects + dfit_mlir.frontends",
    "dfit_mlir.core",
)

#: Layers inside one package (same notation): the ledger below every tool that reads it,
#: the semantic model below the ledger.
INNER_LAYERS: dict[str, tuple[str, ...]] = {
    "dfit_mlir.analysis": (
        "dfit_mlir.analysis.tools",
        "dfit_mlir.analysis.ledger",
        "dfit_mlir.analysis.op_timing",
        "dfit_mlir.analysis.model | dfit_mlir.analysis.profiles",
        "dfit_mlir.analysis.calibration",
    ),
}

ROOT_MODULE = "dfit_mlir"


@dataclass(frozen=True)
class Violation:
    path: Path
    line: int
    importer: str
    imported: str
    why: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.importer} imports {self.imported}: {self.why}"


def package_dirs(root: Path) -> dict[str, Path]:
    """Dotted package → folder, from ``[tool.setuptools] package-dir`` (the same mapping
    the installed package uses)."""
    setuptools = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    return {name: root / folder for name, folder in setuptools["package-dir"].items()}


def modules(root: Path) -> Iterator[tuple[str, Path]]:
    """Every module of the package, by its dotted name."""
    mapping = package_dirs(root)
    mapped = {folder.resolve() for name, folder in mapping.items() if name != ROOT_MODULE}
    for package, folder in mapping.items():
        for path in sorted(folder.rglob("*.py")):
            # A mapped folder is walked under its own name, not also under the root's.
            if package == ROOT_MODULE and any(parent.resolve() in mapped for parent in path.parents):
                continue
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            yield ".".join([package, *parts]), path


def imports_of(name: str, path: Path) -> Iterator[tuple[int, str]]:
    """``(line, dotted name)`` of every import in the module, wherever it stands."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            for alias in node.names:
                # ``from pkg import mod`` imports ``pkg.mod`` when it is a module.
                yield node.lineno, f"{module}.{alias.name}" if alias.name != "*" else module


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


@dataclass(frozen=True)
class _Layer:
    packages: tuple[str, ...]
    independent: bool

    @classmethod
    def parse(cls, text: str) -> _Layer:
        if "|" in text and "+" in text:
            raise ValueError(f"layer {text!r} mixes | and +")
        separator = "|" if "|" in text else "+"
        return cls(tuple(part.strip() for part in text.split(separator)), separator == "|")

    def member(self, name: str) -> str | None:
        return next((package for package in self.packages if _within(name, package)), None)


def _place(name: str, layers: list[_Layer]) -> tuple[int, str] | None:
    for index, layer in enumerate(layers):
        package = layer.member(name)
        if package is not None:
            return index, package
    return None


def check_contract(found: list[tuple[str, Path, int, str]], spec: tuple[str, ...], scope: str) -> list[Violation]:
    layers = [_Layer.parse(text) for text in spec]
    violations = []
    for importer, path, line, imported in found:
        if imported == ROOT_MODULE or imported.startswith(ROOT_MODULE + ".__version__"):
            continue
        source, target = _place(importer, layers), _place(imported, layers)
        if source is None or target is None:
            continue
        (source_index, source_package), (target_index, target_package) = source, target
        if target_index < source_index:
            violations.append(Violation(path, line, importer, imported,
                                        f"{target_package} is above {source_package} ({scope})"))
        elif (target_index == source_index and layers[source_index].independent
              and source_package != target_package):
            violations.append(Violation(path, line, importer, imported,
                                        f"{source_package} and {target_package} are independent ({scope})"))
    return violations


def check(root: Path = REPO) -> list[Violation]:
    """Every upward (or sideways, between independent packages) import under ``root``."""
    found = []
    known = dict(modules(root))
    for name, path in known.items():
        for line, imported in imports_of(name, path):
            if _within(imported, ROOT_MODULE):
                found.append((name, path, line, imported))
    unplaced = sorted({name for name, *_ in found if name != ROOT_MODULE and _place(name, [_Layer.parse(t) for t in LAYERS]) is None})
    violations = [Violation(known[name], 1, name, "-", "the module belongs to no layer: add its package to LAYERS")
                  for name in unplaced]
    violations += check_contract(found, LAYERS, "dfit_mlir layers")
    for package, spec in INNER_LAYERS.items():
        inner = [entry for entry in found if _within(entry[0], package) and _within(entry[3], package)]
        violations += check_contract(inner, spec, f"{package} layers")
    return violations


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else REPO
    violations = check(root)
    for violation in violations:
        print(violation)
    if violations:
        print(f"import layers: {len(violations)} upward import(s); the layers are in tests/import_layers.py")
        return 1
    print(f"import layers: kept ({len(LAYERS)} layers)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
