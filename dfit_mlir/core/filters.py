"""One filter for every option that selects ops: ``dfit compile --tensors``, ``dfit run
--tensors`` and ``--ids``, and the tools' op queries.

A filter is a comma-separated list of globs. Each glob is matched, case-insensitively,
against every name a user may know an op by (:func:`op_names`):

* its stable ID (``main_graph/onnx.Softmax#0``, ``main/linalg.matmul#*``);
* its op name in the manifest and as the frontend shows it (``source_op``):
  ``onnx.Softmax`` (an ONNX import's ``torch.operator "onnx.Softmax"``),
  ``torch.aten.softmax``, ``tosa.conv2d``, and that name without its dialect
  (``Softmax``);
* the lowered op it became, where the caller knows it (``linalg.softmax`` when
  ``--tensors`` inserts traces after IREE's input phase);
* its module path (``encoder.layer.3.attention.self.query``, ``/model.22/cv3.0/conv``)
  and the names of its location (an ONNX node name, a TFLite tensor name).

So ``*softmax*`` selects the softmax whatever the frontend, and ``Conv`` every
convolution. A glob that selects nothing is an error (exit 2) that names the closest
names the model has, so a typo never silently traces or keeps nothing.
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dfit_mlir.core.errors import EXIT_INVALID_INPUT, DfitError
from dfit_mlir.core.ids import op_name_of

_GLOB_CHARACTERS = "*?[]"


def parse_globs(text: str | Iterable[str] | None) -> tuple[str, ...]:
    """``"a/*,b/*"`` (or a list of such strings) → globs."""
    if not text:
        return ()
    items = [text] if isinstance(text, str) else list(text)
    return tuple(g.strip() for item in items for g in item.split(",") if g.strip())


class FilterMatchesNothing(DfitError):
    """A glob of a filter option selects no op of the model; the message names the
    closest names it has."""

    exit_code = EXIT_INVALID_INPUT


def op_names(op: Mapping[str, Any]) -> tuple[str, ...]:
    """Every name of one manifest operator a glob is matched against (module docstring)."""
    names: list[str] = [op["id"]]
    for kind in (op.get("op"), op.get("source_op"), op_name_of(op["id"])):
        if kind:
            names += [kind, kind.rsplit(".", 1)[-1]]
    for path in (op.get("module_path"), op.get("module_class")):
        if path:
            names.append(path)
    name_path = [str(part) for part in op.get("name_path") or ()]
    if name_path:
        names += name_path
        names.append("/".join(name_path))
    return tuple(dict.fromkeys(names))


def names_by_id(operators: Iterable[Mapping[str, Any]]) -> dict[str, tuple[str, ...]]:
    return {op["id"]: op_names(op) for op in operators}


def id_names(op_id: str) -> tuple[str, ...]:
    """The names of an ID known without the manifest: the ID and its op name."""
    kind = op_name_of(op_id)
    return (op_id, kind, kind.rsplit(".", 1)[-1]) if kind else (op_id,)


@dataclass(frozen=True)
class NameFilter:
    """Globs over op names (module docstring); ``option`` names the option in errors."""

    patterns: tuple[str, ...]
    option: str = "the filter"

    @classmethod
    def parse(cls, text: str | Iterable[str], option: str) -> NameFilter:
        """``"a,b"`` or several values (``--ids a --ids b``), each possibly comma-separated."""
        patterns = parse_globs(text)
        if not patterns:
            raise FilterMatchesNothing(f"{option} needs at least one glob: an ID such as 'main/*', an op name such "
                                       f"as 'onnx.Softmax' or '*softmax*', or a module path")
        return cls(patterns, option)

    @property
    def _folded(self) -> tuple[str, ...]:
        return tuple(p.casefold() for p in self.patterns)

    def matches(self, names: Iterable[str]) -> bool:
        """Whether any glob matches any of ``names``."""
        folded = [name.casefold() for name in names if name]
        return any(fnmatch.fnmatchcase(name, pattern) for pattern in self._folded for name in folded)

    def patterns_matching(self, names: Iterable[str]) -> set[str]:
        folded = [name.casefold() for name in names if name]
        return {original for original, pattern in zip(self.patterns, self._folded, strict=True)
                if any(fnmatch.fnmatchcase(name, pattern) for name in folded)}

    def select(self, candidates: Mapping[str, Iterable[str]], where: str, note: str = "") -> list[str]:
        """The keys of ``candidates`` (ID → names) that some glob matches, in order;
        :class:`FilterMatchesNothing` if a glob matches none of them."""
        selected, used = [], set()
        for key, names in candidates.items():
            hit = self.patterns_matching(names)
            if hit:
                selected.append(key)
                used |= hit
        self.require_all_used(used, candidates.values(), where, note)
        return selected

    def require_all_used(self, used: set[str], vocabulary: Iterable[Iterable[str]], where: str,
                         note: str = "") -> None:
        """Raise for the globs not in ``used``, naming the closest of ``vocabulary``;
        ``note`` says what the option never selects."""
        unused = [p for p in self.patterns if p not in used]
        if not unused:
            return
        names = sorted({name for group in vocabulary for name in group if name})
        lines = []
        for pattern in unused:
            close = closest(pattern, names)
            hint = f"closest names: {', '.join(close)}" if close else "no name is close"
            lines.append(f"{self.option} {pattern!r} matches no op of {where}; {hint} (globs match IDs, op names "
                         f"such as onnx.Softmax or torch.aten.softmax, and module paths, ignoring case"
                         + (f"; {note})" if note else ")"))
        raise FilterMatchesNothing("\n".join(f"dfit: {line}" for line in lines) if len(lines) > 1 else lines[0])


def closest(pattern: str, names: Iterable[str], count: int = 5) -> list[str]:
    """Up to ``count`` names nearest to ``pattern`` without its glob characters."""
    core = pattern.strip(_GLOB_CHARACTERS).casefold()
    for character in _GLOB_CHARACTERS:
        core = core.replace(character, "")
    by_folded: dict[str, str] = {}
    for name in names:
        by_folded.setdefault(name.casefold(), name)
    # Compare with the whole name and with its last segment, so 'sofmax' finds 'onnx.Softmax'.
    scored: dict[str, float] = {}
    for folded, name in by_folded.items():
        tails = {folded, folded.rsplit(".", 1)[-1], folded.rsplit("/", 1)[-1]}
        score = max(difflib.SequenceMatcher(None, core, tail).ratio() for tail in tails)
        if score >= 0.6:
            scored[name] = max(score, scored.get(name, 0.0))
    return sorted(scored, key=lambda name: (-scored[name], len(name), name))[:count]
