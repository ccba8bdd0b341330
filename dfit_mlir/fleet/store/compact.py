"""``dfit store compact``: merge the tables of many bundles into a few larger files per
partition, so queries open a few files instead of thousands (each bundle is one
directory of small files: at fleet scale the engines spend their time opening them).

The compacted layout (:mod:`dfit_mlir.fleet.store.layout`)::

    STORE/compacted/TABLE/backend=B/model=M/part-ID.parquet   rows of many runs; run is a column
    STORE/compacted/index.json                                 the commit

Crash safety: parts are written first (each atomically, under a fresh name), then the
index listing them and their runs replaces the old one in one rename — the commit — and
only then are the compacted bundles' files removed. Readers take a run from the parts
if the index lists it, else from its bundle directory, so at every moment each run is
read exactly once: a crash before the commit leaves unlisted parts (ignored, removed by
the next compaction), a crash after it leaves bundle files that are ignored (removed by
the next compaction). A compaction killed outright (SIGKILL) leaves its temporaries
(``compacted/**/.NAME.XXXX.tmp``): no reader lists them, and the next compaction removes
them, under its lock (only a compaction writes under ``compacted/``, one at a time). A
collect killed so leaves a ``bundles/backend=B/model=M/.run=R.XXXX.tmp`` folder: readers
skip dot-named entries, and it is left alone (a live collect may be writing it). Each bundle directory keeps its ownership marker, so ``dfit
collect`` still knows the run (idempotent by session). One compaction at a time (a lock
file); ``dfit collect`` may run meanwhile: bundles it adds are left for the next one.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dfit_mlir.core import atomic, reading
from dfit_mlir.core.errors import DfitError
from dfit_mlir.fleet.store import layout, rollup
from dfit_mlir.fleet.store.collect import open_store, require_reader

#: A bundle's events join a part only below this many: a file of a few thousand events
#: costs the engines more to open than to read, one of 100k+ does not, and in a part
#: ``run`` becomes a column (grouping by it is slower than by a path's partition value).
SMALL_BUNDLE_EVENTS = 1 << 16
#: Rows per row group in a part: large enough for the engines' scans, small enough to
#: prune by run (parts are written run after run, so each row group spans few runs).
_ROW_GROUP_ROWS = 1 << 20
_BATCH_ROWS = 262_144


#: The store layout that introduced compaction: readers of older ones must refuse a compacted store.
COMPACTED_LAYOUT = "1.1"


class StoreBusyError(DfitError):
    """Another ``dfit store compact`` holds the store."""

    exit_code = 2


@dataclass(frozen=True)
class Compacted:
    """What one compaction did."""

    runs: int  # bundles merged into parts by this compaction (their events too if small)
    parts: int  # part files written
    removed_files: int  # bundle files (and unlisted parts) removed after the commit
    compacted_runs: int  # runs in compacted parts in all, after it


def compact(store: Path, *, small_events: int = SMALL_BUNDLE_EVENTS) -> Compacted:
    """Merge every bundle of ``store`` not yet compacted into new parts, one per table and
    (backend, model) — its events only if it has fewer than ``small_events`` — then
    commit, then remove the bundles' files now read from the parts."""
    open_store(store, create=False)
    for path in _pending(store):  # before the lock (its file): a store refused is left as it was
        _events(path)
    with _locked(store):
        _remove_dead_temporaries(store)
        index = layout.read_index(store)
        pending = _pending(store, index)
        by_partition: dict[tuple[str, str], list[Path]] = defaultdict(list)
        for path in pending:
            by_partition[(_key(path.parent.parent), _key(path.parent))].append(path)
        parts: dict[str, list[str]] = {table: list(index["parts"].get(table, [])) for table in layout.TABLES}
        written = 0
        runs = dict(index["runs"])
        for (backend, model), bundles in sorted(by_partition.items()):
            events = {path: _events(path) for path in bundles}
            # A bundle an older layout collected has no ledger table: not listed as in parts,
            # so readers still refuse it and `dfit collect` of it again adds its file.
            tables = {path: [t for t in layout.TABLES if (t != "events" or events[path] < small_events)
                             and (t != layout.LEDGER_TABLE or (path / f"{t}.parquet").is_file())] for path in bundles}
            for table in layout.TABLES:
                chosen = [path for path in bundles if table in tables[path]]
                relative = f"backend={backend}/model={model}/part-{uuid.uuid4().hex[:16]}.parquet"
                if chosen and _write_part(store, table, relative, chosen):
                    parts[table].append(relative)
                    written += 1
            for path in bundles:
                runs[_run(path)] = {"backend": backend, "model": model, "events": events[path], "tables": tables[path]}
        if pending:
            # Before the commit: a dfit reading only bundle directories must refuse the store
            # from now on (it would miss the compacted runs), not read part of it.
            require_reader(store, COMPACTED_LAYOUT)
            document = {"schema": layout.INDEX_SCHEMA, "store_version": layout.STORE_VERSION,
                        "parts": {table: names for table, names in parts.items() if names}, "runs": runs}
            atomic.write_text(store / layout.COMPACTED / layout.INDEX_FILE, json.dumps(document, indent=1) + "\n")
        removed = _remove_superseded(store, layout.read_index(store))
    return Compacted(len(pending), written, removed, len(runs))


def _pending(store: Path, index: dict[str, Any] | None = None) -> list[Path]:
    """The store's bundle directories not compacted yet (their files checked: layout.bundle_dirs)."""
    index = layout.read_index(store) if index is None else index
    return [path for path in layout.bundle_dirs(store)
            if (path / f"{layout.RUNS_TABLE}.parquet").is_file() and _run(path) not in index["runs"]]


def _run(bundle: Path) -> str:
    return _key(bundle)


def _key(directory: Path) -> str:
    return directory.name.split("=", 1)[1]


def _events(bundle: Path) -> int:
    return _table_file(bundle / "events.parquet").metadata.num_rows


def _table_file(path: Path) -> Any:
    """A stored table file opened, any way it is broken an input error naming it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dfit_mlir.core.errors import InvalidInputError

    try:
        return pq.ParquetFile(path)
    except (pa.ArrowException, OSError, ValueError) as error:
        first = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
        raise InvalidInputError(f"{path}: unreadable ({first}); the store is damaged: remove this bundle's "
                                "directory and collect the bundle again") from None


def _remove_dead_temporaries(store: Path) -> None:
    """Temporaries of compactions that were killed (held under the lock, so none is live)."""
    for path in sorted((store / layout.COMPACTED).rglob(".*.tmp")):
        if path.is_file() and not path.is_symlink():
            path.unlink()


def _write_part(store: Path, table: str, relative: str, bundles: list[Path]) -> bool:
    """One part: ``table``'s rows of ``bundles`` (all of one backend and model), each run's
    after the other, with a ``run`` column. A rollup a 1.0 bundle lacks is computed from
    its events. False when no bundle has rows of ``table``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    base = layout.arrow_schema(table)
    schema = pa.schema([pa.field("run", pa.string()), *base], metadata=base.metadata)
    target = reading.inside(store, f"{layout.COMPACTED}/{table}/{relative}", "part")  # no symlink out of the store
    rows = 0
    try:
        with atomic.atomic_path(target) as tmp:
            with pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
                pending: list[Any] = []  # small bundles' rows, gathered into full row groups
                for bundle in bundles:
                    for batch in _batches(bundle, table):
                        if not batch.num_rows:
                            continue
                        batch = layout.conform(batch, base)
                        run = pa.array([_run(bundle)] * batch.num_rows, pa.string())
                        pending.append(pa.Table.from_batches([batch]).add_column(0, "run", run))
                        rows += batch.num_rows
                        if sum(t.num_rows for t in pending) >= _ROW_GROUP_ROWS:
                            writer.write_table(pa.concat_tables(pending), row_group_size=_ROW_GROUP_ROWS)
                            pending = []
                if pending:
                    writer.write_table(pa.concat_tables(pending), row_group_size=_ROW_GROUP_ROWS)
            if not rows:
                raise _NoRows
    except _NoRows:
        return False
    return True


class _NoRows(Exception):
    """Raised inside the atomic write so that an empty part is not put in place."""


def _batches(bundle: Path, table: str) -> Iterator[Any]:
    import pyarrow as pa

    from dfit_mlir.core.errors import InvalidInputError

    path = bundle / f"{table}.parquet"
    if path.is_file():
        try:
            yield from _table_file(path).iter_batches(batch_size=_BATCH_ROWS)
        except (pa.ArrowException, OSError) as error:  # a page damaged past the footer
            raise InvalidInputError(f"{path}: unreadable ({str(error).strip()[:200]}); the store is damaged: "
                                    "remove this bundle's directory and collect the bundle again") from None
    elif table in layout.ROLLUP_TABLES:  # a bundle written by layout 1.0
        yield from rollup.compute(table, bundle / "events.parquet").to_batches()


def _remove_superseded(store: Path, index: dict[str, Any]) -> int:
    """After the commit: the table files of compacted runs' bundle directories (each keeps
    its ownership marker) and parts the index does not list (a crashed compaction's)."""
    removed = 0
    for run, placed in index["runs"].items():
        # Every name checked (layout.check_index) and the path kept inside the store (core/reading.py).
        relative = f"{layout.BUNDLES}/backend={placed['backend']}/model={placed['model']}/run={run}"
        for table in placed["tables"]:
            path = reading.inside(store, f"{relative}/{table}.parquet", "compacted run's table")
            if path.is_file() and not path.is_symlink():
                path.unlink()
                removed += 1
    listed = {(table, name) for table, names in index["parts"].items() for name in names}
    for table in layout.TABLES:
        for path in sorted((store / layout.COMPACTED / table).glob("backend=*/model=*/part-*.parquet")):
            relative = str(path.relative_to(store / layout.COMPACTED / table))
            if (table, relative) not in listed and not path.is_symlink():
                reading.inside(store / layout.COMPACTED / table, relative, "part").unlink()
                removed += 1
    return removed


@contextlib.contextmanager
def _locked(store: Path) -> Iterator[None]:
    (store / layout.COMPACTED).mkdir(exist_ok=True)
    for table in ("", *layout.TABLES):  # every folder written under, inside the store (a symlink planted there is not)
        reading.inside(store, f"{layout.COMPACTED}/{table}".rstrip("/"), "compacted folder")
    with open(store / layout.COMPACTED / ".lock", "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StoreBusyError(f"{store}: another `dfit store compact` is compacting this store") from None
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
