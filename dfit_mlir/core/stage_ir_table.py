"""The manifest's ``stage_ir`` table: the printed IR of each source ID's carrier ops at
every lineage stage, as ``dfit compile --mode full`` records it
(:mod:`dfit_mlir.passes.stage_ir` writes it; its docstring says what is printed). This
module encodes and reads the table without the compiler, so ``dfit view`` does not
import it.

Layout (``TABLE_VERSION`` 1): ``ids`` the source IDs; ``texts`` every distinct op text,
NUL-joined, deflated and base64-encoded (:func:`pack_texts`); ``carriers`` the distinct
carrier lists, each ``"count,text,text…"`` (count: ops carrying the ID at that stage,
texts: the outermost ones shown); ``stages[name]`` one carrier-list index per ID, ``-1``
where no op carries it. Integer rows are comma-separated strings: the manifest is
indented JSON, which would give every list item a line of its own.
"""

from __future__ import annotations

import base64
import binascii
import zlib
from dataclasses import dataclass
from typing import Any, Iterable

from dfit_mlir.core.reading import inflate

TABLE_VERSION = 1
TEXT_ENCODING = "zlib+base64"


def pack_texts(texts: list[str]) -> dict[str, Any]:
    """The texts as one deflated, base64 string (NUL-separated: MLIR prints a NUL in a
    string as ``\\00``). Op texts repeat their types and attributes from phase to phase,
    so this is about 7x smaller than a JSON list of them."""
    data = zlib.compress("\0".join(texts).encode("utf-8"), 9)
    return {"encoding": TEXT_ENCODING, "count": len(texts), "data": base64.b64encode(data).decode("ascii")}


def unpack_texts(packed: dict[str, Any]) -> list[str]:
    if packed.get("encoding") != TEXT_ENCODING:
        raise ValueError(f"stage_ir texts: unknown encoding {packed.get('encoding')!r}")
    if not packed["count"]:
        return []
    # Bounded (core/reading.py): a table's texts inflate at most INFLATE_RATIO times, and
    # never past INFLATE_CEILING, whatever the manifest holds.
    texts = inflate(base64.b64decode(packed["data"], validate=True), "stage_ir texts").decode("utf-8").split("\0")
    if len(texts) != packed["count"]:
        raise ValueError(f"stage_ir texts: {len(texts)} texts, the table says {packed['count']}")
    return texts


def ints(values: Iterable[int]) -> str:
    return ",".join(map(str, values))


def read_ints(text: str) -> list[int]:
    return [int(value) for value in text.split(",")] if text else []


@dataclass(frozen=True)
class StageIRTable:
    """A manifest's ``stage_ir`` table, decoded."""

    ids: tuple[str, ...]
    texts: tuple[str, ...]
    carriers: tuple[tuple[int, ...], ...]
    stages: dict[str, list[int]]
    unrecorded: dict[str, str]

    def carriers_of(self, source_id: str, stage: str) -> tuple[int, list[str]] | None:
        """(how many ops carry ``source_id`` at ``stage``, the texts of the outermost
        ones); None where the table does not record the stage or the ID."""
        if stage not in self.stages or source_id not in self.ids:
            return None
        entry = self.stages[stage][self.ids.index(source_id)]
        if entry < 0:
            return 0, []
        count, *texts = self.carriers[entry]
        return count, [self.texts[t] for t in texts]


def read_table(table: dict[str, Any]) -> StageIRTable:
    """Decode a manifest's ``stage_ir`` table (:meth:`dfit_mlir.passes.stage_ir.StageIR.table`); a table that does
    not decode, or whose indices point outside it, raises ValueError saying where."""
    try:
        ids = tuple(table["ids"])
        texts = tuple(unpack_texts(table["texts"]))
        carriers = tuple(tuple(read_ints(c)) for c in table["carriers"])
        stages = {stage: read_ints(row) for stage, row in table["stages"].items()}
    except (KeyError, TypeError, ValueError, binascii.Error, zlib.error, UnicodeDecodeError) as error:
        raise ValueError(f"stage_ir table does not decode ({type(error).__name__}: {error})") from None
    for stage, row in stages.items():
        if len(row) != len(ids):
            raise ValueError(f"stage_ir stage {stage}: {len(row)} entries for {len(ids)} ids")
        if any(entry >= len(carriers) for entry in row):
            raise ValueError(f"stage_ir stage {stage}: a carrier index past the {len(carriers)} carrier lists")
    for number, carrier in enumerate(carriers):
        if len(carrier) < 1 or any(t >= len(texts) for t in carrier[1:]):
            raise ValueError(f"stage_ir carrier list {number}: a text index past the {len(texts)} texts")
    return StageIRTable(ids, texts, carriers, stages, dict(table.get("unrecorded") or {}))
