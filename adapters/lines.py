"""The line-reader engine every text-log reader runs on.

A text format declares what its lines mean (:class:`Rule`: a compiled, anchored pattern
→ a record builder, with the unit, the meaning and the timing semantics of the record
documented next to it) and keeps whatever state joins lines into records; this module
does the rest once, the same way for every format:

* **decoding**: bytes are read in bounded pieces and split on ``\\n`` only (as an editor
  numbers lines), UTF-8 with replacement characters, a leading BOM dropped, ``\\r\\n``
  endings accepted;
* **terminal noise**: ANSI escape sequences and other control characters are dropped; a
  carriage return inside a line (a ``tqdm`` bar redrawn in place, or the literal ``^M``
  a paste shows for it) keeps only what the terminal showed last, so a record written
  after a bar on the same line is read like any other;
* **continuation lines**: a rule may say its record goes on over the following lines
  (``args: Namespace(...`` printed over many lines) and gets them joined;
* **origins**: every line carries its number; ``origin(line)`` is ``path:line``;
* **leniency and errors**: a line no rule takes is *unparsed*; a line a rule took but
  cannot read (a truncated record, a figure that is not a finite number) raises
  :class:`~.recovery.ArtifactError` inside the rule, which the engine turns into a
  *problem* of that line (unparsed, with the reason) instead of an abort. A file is an
  error only when nothing in it was recognisable; error messages echo at most
  :data:`MAX_ECHO` characters of the offending text;
* **line accounting**: :class:`LineAccount`: every line is consumed or listed unparsed;
  ``dfit reconstruct`` writes it into ``coverage.json``;
* **scopes**: :class:`Scopes`, one per run/compile/task in a file holding several, so
  every record can carry ``run_scope``;
* **repeated records**: :class:`RecordSet` keeps each distinct record once with the
  number of times it was read, so a log that repeats a line a million times is read in
  the memory of one record.

Lines longer than :data:`MAX_LINE_BYTES` are not handed to the rules (no real record is
that long; they are listed unparsed) and are read in bounded pieces, so a file is read
in bounded memory whatever its shape. Every pattern a rule uses must be linear-time on
a line (anchored; no nested unbounded quantifiers; no lazy ``.*?`` before an optional
tail): a 1 MB line is read in time proportional to its length.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .recovery import ArtifactError, LineAccount

#: How much of an offending line an error message or an example echoes.
MAX_ECHO = 160
#: Lines longer than this are listed unparsed without running the rules on them.
MAX_LINE_BYTES = 4 << 20
#: How many unparsed lines (and problems) a file's account keeps as examples.
EXAMPLES = 8
#: A record continued over the following lines is cut at this many lines / characters.
MAX_CONTINUATION_LINES = 2000
MAX_CONTINUATION_CHARS = 1 << 20

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
#: A tqdm bar: ``Iteration:  20%|█▉   | 500/2549 [02:11<09:01,  3.78it/s]`` (its bracket
#: may be cut, ``[…]``); every quantifier bounded, so it is linear on any line.
PROGRESS_BAR = re.compile(
    r"^(?P<label>[^|\r\n]{0,200}?):?\s{0,8}(?P<percent>\d{1,3})%\|(?P<bar>[^|]{0,400})\|"
    r"\s{0,8}(?P<done>[\d.]{1,20}[kMGTP]?)/(?P<total>[\d.]{1,20}[kMGTP]?|\?)\s{0,8}"
    r"(?P<bracket>\[[^\]\[]{0,200}\]|\[…\])?"
)


def echo(text: str, limit: int = MAX_ECHO) -> str:
    """``repr`` of ``text`` cut to ``limit`` characters (a pathological line must not
    flood an error message)."""
    if len(text) <= limit:
        return repr(text)
    return repr(text[:limit]) + f"… ({len(text)} characters)"


@dataclass(frozen=True, slots=True)
class Line:
    number: int
    #: What the terminal showed last on this line, control characters removed.
    text: str
    #: What a carriage return overwrote on this line (progress-bar frames), or "".
    overwritten: str = ""
    #: Longer than :data:`MAX_LINE_BYTES`: ``text`` is empty and no rule sees it.
    oversized: bool = False
    #: The raw line held NUL bytes (dropped from ``text``; see :class:`LineAccount`).
    nul: bool = False


def clean(text: str) -> tuple[str, str]:
    """(shown text, overwritten text) of one decoded line without its ending."""
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    if "^M" in text:
        text = text.replace("^M", "\r")
    overwritten = ""
    if "\r" in text:
        pieces = text.split("\r")
        last = len(pieces) - 1
        while last > 0 and not pieces[last].strip():
            last -= 1
        overwritten = "\r".join(pieces[:last])
        text = pieces[last]
    if _CONTROL.search(text):
        text = _CONTROL.sub("", text)
    return text, overwritten


def iter_lines(path: Path) -> Iterator[Line]:
    """The file's lines, cleaned, in bounded memory."""
    try:
        stream = path.open("rb")
    except OSError as error:
        raise ArtifactError.at(path, None, f"cannot read: {error.strerror or error}") from None
    with stream:
        number = 0
        while True:
            raw = stream.readline(MAX_LINE_BYTES + 1)
            if not raw:
                return
            number += 1
            if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                # Skip the rest of the oversized line in bounded pieces.
                while True:
                    rest = stream.readline(1 << 20)
                    if not rest or rest.endswith(b"\n"):
                        break
                yield Line(number, "", oversized=True)
                continue
            text = raw.decode("utf-8", "replace")
            if number == 1 and text.startswith("\ufeff"):
                text = text[1:]
            text = text.rstrip("\n").rstrip("\r")
            shown, overwritten = clean(text)
            yield Line(number, shown, overwritten, nul=b"\0" in raw)


# --- rules --------------------------------------------------------------------------

#: Timing semantics a rule declares for the records it builds.
INSTANT = "instant: the record's time is its line's timestamp"
NO_TIME = "no time: a fact or a figure without a moment"
DECORATION = "decoration: carries nothing (banner, rule line, table frame, blank)"


@dataclass(frozen=True, slots=True)
class Rule:
    """One kind of line of a format: ``pattern`` (anchored, linear-time) → ``build``
    (``build(state, match, line)``; returning ``False`` gives the line back as not
    this rule's). ``build=None`` is a decoration rule: the line is consumed and carries
    nothing. ``meaning`` says what the record is and its unit; ``timing`` is one of
    :data:`INSTANT`, :data:`NO_TIME`, :data:`DECORATION` or an ``interval: ...``
    sentence saying where the interval starts and ends."""

    pattern: re.Pattern[str]
    build: Callable[[Any, re.Match[str], Line], object] | None
    meaning: str
    timing: str = NO_TIME
    #: ``search`` instead of ``match`` (the pattern must still be linear-time).
    search: bool = False

    def apply(self, state: Any, line: Line, text: str | None = None) -> bool:
        subject = line.text if text is None else text
        found = self.pattern.search(subject) if self.search else self.pattern.match(subject)
        if found is None:
            return False
        if self.build is None:
            return True
        return self.build(state, found, line) is not False


def apply_rules(rules: Sequence[Rule], state: Any, line: Line, text: str | None = None) -> bool:
    """The first rule that takes the line builds its record; False when none does."""
    return any(rule.apply(state, line, text) for rule in rules)


BLANK = Rule(re.compile(r"^\s*$"), None, "blank line", DECORATION)


@dataclass(frozen=True, slots=True)
class Continue:
    """What a reader's ``feed`` returns to take the following lines into its record:
    they are joined (with ``\\n``) until ``complete(joined)`` is true, a line for which
    ``belongs(line)`` is false, or the size caps, and then ``finish(joined, first)``
    builds the record. Every joined line counts as consumed."""

    first: Line
    text: str
    complete: Callable[[str], bool]
    finish: Callable[[str, Line], object]
    belongs: Callable[[Line], bool] = lambda line: True


def balanced(opening: str = "(", closing: str = ")") -> Callable[[str], bool]:
    """A ``complete`` test for :class:`Continue`: brackets balanced (outside quotes)."""

    def complete(text: str) -> bool:
        depth = 0
        quote = ""
        escaped = False
        for char in text:
            if quote:
                if escaped:
                    escaped = False
                elif char == "\\":
                    escaped = True
                elif char == quote:
                    quote = ""
            elif char in "'\"":
                quote = char
            elif char == opening:
                depth += 1
            elif char == closing:
                depth -= 1
        return depth <= 0

    return complete


# --- the pass -----------------------------------------------------------------------


@dataclass
class _Tally:
    total: int = 0
    consumed: int = 0
    recognised: int = 0
    unparsed: list[tuple[int, int]] = field(default_factory=list)
    examples: list[tuple[int, str]] = field(default_factory=list)
    problems: list[tuple[int, str]] = field(default_factory=list)
    problem_count: int = 0
    nul_lines: int = 0
    first_nul_line: int | None = None

    def saw(self, line: Line) -> None:
        self.total += 1
        if line.nul:
            self.nul_lines += 1
            if self.first_nul_line is None:
                self.first_nul_line = line.number

    def unparsed_line(self, line: Line, why: str | None = None) -> None:
        ranges = self.unparsed
        if ranges and ranges[-1][1] == line.number - 1:
            ranges[-1] = (ranges[-1][0], line.number)
        else:
            ranges.append((line.number, line.number))
        if len(self.examples) < EXAMPLES:
            text = "<line longer than {} bytes>".format(MAX_LINE_BYTES) if line.oversized else line.text
            self.examples.append((line.number, text[:MAX_ECHO]))
        if why is not None:
            self.problem_count += 1
            if len(self.problems) < EXAMPLES:
                self.problems.append((line.number, why))

    def account(self) -> LineAccount:
        unparsed = sum(last - first + 1 for first, last in self.unparsed)
        return LineAccount(
            total=self.total,
            consumed=self.total - unparsed,
            unparsed=unparsed,
            examples=tuple(self.examples),
            problems=tuple(self.problems),
            problem_count=self.problem_count,
            unparsed_ranges=tuple(self.unparsed),
            nul_lines=self.nul_lines,
            first_nul_line=self.first_nul_line,
        )


Feed = Callable[[Line], "bool | Continue | None"]


def read_file(path: Path, feed: Feed, *, blank_consumed: bool = True, required: bool = True) -> LineAccount:
    """One pass over ``path``: ``feed(line)`` returns True when the line was consumed
    (a :class:`Continue` to take the next lines too, False/None when it is not the
    reader's). An :class:`ArtifactError` raised by ``feed`` makes that line a problem.
    With ``required``, a file in which no line other than blanks was consumed is an
    error (the first problem's, when there was one)."""
    tally = _Tally()
    pending: Continue | None = None
    joined: list[str] = []
    joined_chars = 0

    def close() -> None:
        nonlocal pending, joined, joined_chars
        assert pending is not None
        job, text = pending, "\n".join(joined)
        pending, joined, joined_chars = None, [], 0
        try:
            job.finish(text, job.first)
        except ArtifactError as error:
            tally.problem_count += 1
            if len(tally.problems) < EXAMPLES:
                tally.problems.append((job.first.number, _reason(error)))

    for line in iter_lines(path):
        tally.saw(line)
        if pending is not None:
            if pending.belongs(line) and len(joined) < MAX_CONTINUATION_LINES and joined_chars < MAX_CONTINUATION_CHARS:
                joined.append(line.text)
                joined_chars += len(line.text)
                tally.consumed += 1
                if pending.complete("\n".join(joined)):
                    close()
                continue
            close()
        if line.oversized:
            tally.unparsed_line(line)
            continue
        if blank_consumed and not line.text.strip():
            tally.consumed += 1
            continue
        try:
            taken = feed(line)
        except ArtifactError as error:
            tally.unparsed_line(line, _reason(error))
            continue
        if isinstance(taken, Continue):
            tally.consumed += 1
            tally.recognised += 1
            pending, joined, joined_chars = taken, [taken.text], len(taken.text)
            if taken.complete(taken.text):
                close()
        elif taken:
            tally.consumed += 1
            tally.recognised += 1
        else:
            tally.unparsed_line(line)
    if pending is not None:
        close()
    if required and tally.recognised == 0:
        if tally.problems:
            number, why = tally.problems[0]
            raise ArtifactError.at(path, number, why)
        raise ArtifactError.at(path, None, "no line of this file is recognisable")
    return tally.account()


def _reason(error: ArtifactError) -> str:
    """The message of an error raised for one line, without its ``path:line:`` prefix."""
    return str(getattr(error, "reason", None) or error)[:MAX_ECHO * 3]


# --- scopes -------------------------------------------------------------------------


@dataclass
class RunScope:
    """One run, compile or task within a file: its id (``run0``, ``run1``, ...), the
    line it starts at, and the facts only it has (job id, batch size, compile hash)."""

    id: str
    first_line: int
    facts: dict[str, Any] = field(default_factory=dict)


class Scopes:
    """The runs of one file, in order. ``current`` is the run the next record belongs
    to (a first run is opened at line 1 when a record comes before any start line)."""

    def __init__(self, prefix: str = "run") -> None:
        self.prefix = prefix
        self.all: list[RunScope] = []

    def open(self, line: int, **facts: Any) -> RunScope:
        scope = RunScope(f"{self.prefix}{len(self.all)}", line, dict(facts))
        self.all.append(scope)
        return scope

    @property
    def current(self) -> RunScope:
        return self.all[-1] if self.all else self.open(1)

    def as_attribute(self) -> list[dict[str, Any]]:
        return [{"run_scope": s.id, "first_line": s.first_line, **s.facts} for s in self.all]

    def tagged(self, record: Any) -> Any:
        """``record`` (a dataclass with ``attributes``) carrying the current run's id as
        ``run_scope``."""
        return replace(record, attributes={**record.attributes, "run_scope": self.current.id})


# --- repeated records ---------------------------------------------------------------


class RecordSet:
    """The records (:class:`~.recovery.Measurement`) a reader builds, each distinct one
    kept once: a record equal to one kept before in everything but its ``origin`` (the
    same line written again: a retry loop, a logger attached twice, a paste) is counted
    on the kept one, so memory follows the distinct records, not the file's length.
    :meth:`records` gives them in first-seen order; a repeated one carries
    ``attributes["repeats"]`` (times read) and ``attributes["last_origin"]``."""

    def __init__(self) -> None:
        self._kept: list[Any] = []
        self._index: dict[str, int] = {}
        #: position -> (times read, origin of the last one), for repeated records only.
        self._repeats: dict[int, tuple[int, str | None]] = {}

    @staticmethod
    def identity(record: Any) -> str:
        return repr(replace(record, origin=None))

    def add(self, record: Any) -> None:
        key = self.identity(record)
        at = self._index.get(key)
        if at is None:
            self._index[key] = len(self._kept)
            self._kept.append(record)
            return
        times, _ = self._repeats.get(at, (1, None))
        self._repeats[at] = (times + 1, record.origin)

    def __len__(self) -> int:
        return len(self._kept)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._kept)

    def records(self) -> tuple[Any, ...]:
        found = list(self._kept)
        for at, (times, last) in self._repeats.items():
            record = found[at]
            found[at] = replace(record, attributes={**record.attributes, "repeats": times, "last_origin": last})
        return tuple(found)


# --- numbers ------------------------------------------------------------------------

#: Figures beyond this magnitude are not believed (a float that overflowed, a garbled
#: field): a rule raises instead of storing them.
MAX_MAGNITUDE = 1e300
_MAX_DIGITS = 40


def finite(text: str, what: str, path: Path | str, line: int | None) -> float:
    """``text`` as a finite float; ``inf``/``nan``, thousands of digits and magnitudes
    beyond :data:`MAX_MAGNITUDE` raise :class:`ArtifactError` naming the line."""
    stripped = text.strip()
    if len(stripped) > _MAX_DIGITS:
        raise ArtifactError.at(path, line, f"{what}: {echo(stripped, 40)} is not a believable number")
    try:
        value = float(stripped)
    except ValueError:
        raise ArtifactError.at(path, line, f"{what}: expected a number, found {echo(stripped)}") from None
    if not math.isfinite(value) or abs(value) > MAX_MAGNITUDE:
        raise ArtifactError.at(path, line, f"{what}: {echo(stripped)} is not a finite number")
    return value


def count(text: str, what: str, path: Path | str, line: int | None) -> int:
    """``text`` as a non-negative integer of at most 18 digits."""
    stripped = text.strip()
    if not stripped.isdigit() or not stripped.isascii():
        raise ArtifactError.at(path, line, f"{what}: expected an integer, found {echo(stripped)}")
    if len(stripped) > 18:
        raise ArtifactError.at(path, line, f"{what}: {echo(stripped, 40)} is not a believable count")
    return int(stripped)

