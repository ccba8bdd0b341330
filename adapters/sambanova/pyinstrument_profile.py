"""pyinstrument session (``window.profileSession`` JSON) of a SambaFlow host program →
:class:`Recovery`.

SambaTune's "Execute pyinstrument" step profiles the host side of a run (``uno_full.py
run``): the call tree shows where host time goes, ``sambaruntime.run`` (the time spent
waiting for the RDU graph) and ``set_tensors`` (host → device copies) among it. The file
is the JSON pyinstrument's HTML report embeds as ``window.profileSession = {...}``; the
reader takes the bare JSON or the HTML page.

The tree is the one pyinstrument's renderer kept: it already dropped frames below its
time threshold, so a frame's self time here is its time not spent in any *kept* child.
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

from dfit_mlir.adapters.recovery import (
    ArtifactError,
    Coverage,
    CoverageNote,
    Measurement,
    Recovery,
    source_artifact,
)

from .compile_log import BACKEND, pef_stem

_HTML_MARK = "window.profileSession"
#: pyinstrument's pseudo-frame for a frame's own time when it also has children.
_SELF_FRAME = "[self]"


def qualified_name(frame: dict[str, Any]) -> str:
    """``run`` in ``sambaruntime/sambaruntime.py`` → ``sambaruntime.sambaruntime.run``;
    built-ins and ``<string>`` code keep the bare function name."""
    short = str(frame.get("file_path_short") or "")
    function = str(frame["function"])
    if not short or short.startswith("<"):
        return function
    parts = [p for p in PurePosixPath(short).with_suffix("").parts if p not in ("..", ".")]
    return ".".join([*parts, function])


class PyinstrumentProfileReader:
    """One pyinstrument profile session."""

    format: ClassVar[str] = "pyinstrument-profile"

    @classmethod
    def recognises(cls, path: Path, head: bytes) -> bool:
        if _HTML_MARK.encode() in head:
            return True
        text = head.lstrip()
        return text.startswith(b"{") and b'"root_frame"' in head and b'"start_time"' in head

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def read(self) -> Recovery:
        session = self.session()
        root = session.get("root_frame")
        if not isinstance(root, dict):
            raise ArtifactError.at(self.path, None, "profile session without a root_frame object")
        duration = self.number(session, "duration", "/")
        start = self.number(session, "start_time", "/")
        program = str(session.get("program", ""))
        measurements = [
            Measurement(
                kind="program",
                name="pyinstrument.session",
                value=duration,
                unit="s",
                start_s=start,
                duration_s=duration,
                origin=f"{self.path}#/",
                attributes={
                    "program": program,
                    "sample_count": session.get("sample_count"),
                    "cpu_time_s": session.get("cpu_time"),
                },
            ),
            *self.frames(root),
        ]
        attributes: dict[str, Any] = {"profiled_program": program}
        for argument in program.split():
            if argument.startswith("--pef="):
                attributes["pef_path"] = argument.removeprefix("--pef=")
                attributes["pef_name"] = pef_stem(attributes["pef_path"])
        return Recovery(
            backend=BACKEND,
            sources=(source_artifact(self.path, self.format),),
            measurements=tuple(measurements),
            coverage=(
                CoverageNote(
                    "per_program_timing",
                    Coverage.PARTIAL,
                    f"{self.path}: host call tree as pyinstrument kept it "
                    "(frames under its threshold dropped)",
                ),
            ),
            attributes=attributes,
        )

    def session(self) -> dict[str, Any]:
        text = self.path.read_text(encoding="utf-8", errors="replace")
        begin = 0
        if _HTML_MARK in text:
            begin = text.index("{", text.index(_HTML_MARK))
        try:
            session, _ = json.JSONDecoder().raw_decode(text, begin)
        except json.JSONDecodeError as error:
            raise ArtifactError.at(
                self.path,
                error.lineno,
                f"not a JSON profile session: {error.msg} (column {error.colno})",
            ) from None
        if not isinstance(session, dict):
            raise ArtifactError.at(self.path, 1, "profile session is not a JSON object")
        return session

    def number(self, record: dict[str, Any], key: str, where: str) -> float:
        value = record.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ArtifactError.at(
                self.path, None, f"{where}: {key!r} should be a number, found {value!r}"
            )
        return float(value)

    def frames(self, root: dict[str, Any]) -> list[Measurement]:
        """Every kept frame, depth first in tree order, walked with a stack (call trees can
        be deeper than Python's recursion limit)."""
        built: list[Measurement] = []
        stack: list[tuple[dict[str, Any], str, int, str | None]] = [(root, "/root_frame", 0, None)]
        while stack:
            frame, pointer, depth, parent = stack.pop()
            if "function" not in frame:
                raise ArtifactError.at(self.path, None, f"{pointer}: frame without 'function'")
            total = self.number(frame, "time", pointer)
            children = frame.get("children") or []
            if not isinstance(children, list):
                raise ArtifactError.at(self.path, None, f"{pointer}: 'children' is not a list")
            kept = 0.0
            for child in children:
                if not isinstance(child, dict):
                    raise ArtifactError.at(
                        self.path, None, f"{pointer}: a child frame is not an object"
                    )
                if child.get("function") != _SELF_FRAME:
                    kept += self.number(child, "time", pointer)
            name = qualified_name(frame)
            built.append(
                Measurement(
                    kind="function",
                    name=name,
                    value=total,
                    unit="s",
                    duration_s=total,
                    origin=f"{self.path}#{pointer}",
                    attributes={
                        "function": frame["function"],
                        "code": f"{frame.get('file_path', '')}:{frame.get('line_no', 0)}",
                        "self_time_s": max(total - kept, 0.0),
                        "depth": depth,
                        "caller": parent,
                        "application_code": bool(frame.get("is_application_code", False)),
                    },
                )
            )
            for index in range(len(children) - 1, -1, -1):
                child = children[index]
                if child.get("function") != _SELF_FRAME:
                    stack.append((child, f"{pointer}/children/{index}", depth + 1, name))
        return built
