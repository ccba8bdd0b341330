"""Coverage notes as data: what a reconstruction says about each aspect it reports.

A backend lists its aspects in report order, each either a fixed :class:`CoverageNote`
(what the backend never exposes reads the same in every reconstruction) or a rule over
the facts of one reconstruction; :func:`assess` applies the list. Every backend grades
an aspect the same way (:func:`graded`), so "partial" means one thing in every report.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from dfit_mlir.adapters.recovery import Coverage, CoverageNote

Facts = TypeVar("Facts")

#: What a rule gives for its aspect: one note, several (a note per disagreement found),
#: or none (an aspect the inputs say nothing about is left out of the report).
Notes = CoverageNote | Iterable[CoverageNote] | None


def graded(aspect: str, detail: str, *, recovered: bool = False, partial: bool = False) -> CoverageNote:
    """Recovered when ``recovered``, else partial when ``partial``, else not exposed."""
    if recovered:
        status = Coverage.RECOVERED
    elif partial:
        status = Coverage.PARTIAL
    else:
        status = Coverage.NOT_EXPOSED
    return CoverageNote(aspect, status, detail)


def assess(
    facts: Facts, rules: Sequence[CoverageNote | Callable[[Facts], Notes]]
) -> tuple[CoverageNote, ...]:
    """The notes of ``rules`` in their order: a fixed note as it is, a rule's for ``facts``."""
    notes: list[CoverageNote] = []
    for rule in rules:
        found = rule if isinstance(rule, CoverageNote) else rule(facts)
        if isinstance(found, CoverageNote):
            notes.append(found)
        elif found is not None:
            notes.extend(found)
    return tuple(notes)
