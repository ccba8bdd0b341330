"""``dfit collect``: bundles (runs, reconstructions, compile manifests) → the store.

Each bundle becomes one directory of Parquet files (see :mod:`dfit_mlir.fleet.store.layout`),
written beside its final place and renamed in whole: a store never holds half a bundle.
A bundle already in the store (same run ID, whatever its label) is skipped, so
collecting a nightly directory again adds only what is new. :func:`bundle_writer` is
the one way a bundle's directory is written (``benchmarks/store_scale.py`` writes its
synthetic bundles through it too): the tables, then the rollups computed from the
events just written, then the rename.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dfit_mlir.core import atomic, reading
from dfit_mlir.core import event_schema as es
from dfit_mlir.core.errors import InvalidInputError
from dfit_mlir.core.perf import release_freed_memory
from dfit_mlir.fleet.placement import bundle_backend, check_summary, placement_columns
from dfit_mlir.fleet.store import layout, ledger_rows, rollup

#: Events copied at a time. Their temporaries (the batch, its placement columns, the cast
#: to the store's schema) are most of collect's memory: 262,144 took a 5M-event bundle to
#: 419 MiB, 65,536 to 312 (with the row-group readers of event_schema.checked_batches).
_BATCH_ROWS = 65_536
#: Output-ownership kind of one bundle's directory in a store (``dfit_mlir.core.outputs``).
STORE_BUNDLE_KIND = "store-bundle"


@dataclass(frozen=True)
class Collected:
    """What ``collect`` did with one bundle."""

    source: Path
    run: str
    backend: str
    model: str
    events: int
    added: bool  # False: the run was already in the store


@dataclass(frozen=True)
class Placement:
    """Where the bundle ran, as given on the command line (None: from the bundle, if it says)."""

    label: str | None = None
    host: str | None = None
    rank: int | None = None
    model: str | None = None


def open_store(store: Path, *, create: bool) -> dict[str, Any]:
    """The store's metadata; with ``create``, a new store is set up in an empty or absent directory."""
    meta = store / layout.META_FILE
    if meta.exists() or meta.is_symlink():
        return _read_meta(meta)
    if not create:
        raise InvalidInputError(f"{store}: not a dfit store (no {layout.META_FILE}; create one with `dfit collect`)")
    if store.exists() and (not store.is_dir() or any(store.iterdir())):
        raise InvalidInputError(f"{store}: exists and is not a dfit store; refusing to write into it")
    document = {"schema": layout.STORE_SCHEMA, "version": layout.STORE_VERSION,
                "event_schema": es.SCHEMA_VERSION}
    atomic.write_text(meta, json.dumps(document, indent=1) + "\n")
    return document


def _read_meta(meta: Path) -> dict[str, Any]:
    """A store's ``dfit-store.json``, refused (one line naming it) unless it is a UTF-8 JSON
    object of the store schema, of a layout and event schema this dfit reads."""
    if meta.is_symlink() or not meta.is_file():
        raise InvalidInputError(f"{meta}: not a dfit store description (not a regular file)")
    try:
        document = reading.load_json(meta, what="store description", limit=1 << 20)
    except InvalidInputError as error:
        raise InvalidInputError(f"{meta}: not a dfit store description ({str(error).split(': ', 1)[-1][:200]})") \
            from None
    if not isinstance(document, dict):
        raise InvalidInputError(f"{meta}: not a dfit store description (a JSON {type(document).__name__}, "
                                "not an object)")
    if document.get("schema") != layout.STORE_SCHEMA:
        raise InvalidInputError(f"{meta}: not a dfit store (schema {str(document.get('schema'))[:40]!r})")
    if str(document.get("version", "")).split(".")[0] != layout.STORE_VERSION.split(".")[0]:
        raise InvalidInputError(f"{meta}: store layout {str(document.get('version'))[:20]} is not readable by this "
                                f"dfit (reads {layout.STORE_VERSION.split('.')[0]}.x)")
    needed = str(document.get("min_reader_version") or "1.0")
    if _version(needed) > _version(layout.STORE_VERSION):
        raise InvalidInputError(f"{meta}: this store needs a dfit that reads store layout {needed[:20]} or later "
                                f"(this one reads up to {layout.STORE_VERSION})")
    events = str(document.get("event_schema") or es.SCHEMA_VERSION)
    if not es.readable(events):
        raise InvalidInputError(f"{meta}: the store's event schema {events[:20]} is not readable by this dfit "
                                f"(reads {es.MIN_READER_VERSION} to {es.SCHEMA_VERSION.split('.')[0]}.x)")
    return document


def _version(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split("."))
    except ValueError:
        raise InvalidInputError(f"store layout version {text!r} is not MAJOR.MINOR") from None


def require_reader(store: Path, version: str) -> None:
    """Record in the store's description that reading it now takes layout ``version``
    (compaction moves rows where an older reader would not look for them)."""
    meta = store / layout.META_FILE
    document = _read_meta(meta)
    if _version(str(document.get("min_reader_version") or "1.0")) < _version(version):
        document.update(version=version, min_reader_version=version)
        atomic.write_text(meta, json.dumps(document, indent=1) + "\n")


def collect(bundles: Sequence[Path], store: Path, placement: Placement = Placement()) -> list[Collected]:
    """Add ``bundles`` to ``store`` (created when absent); returns one record per bundle.
    Every bundle's files (events schema and columns, summary) are checked before any is
    written, each one's event values as they are copied: a refused bundle leaves no part
    of itself, and a store this call created is removed again if nothing went into it."""
    sources = [_read_source(Path(bundle)) for bundle in bundles]
    existed, created = store.exists(), not (store / layout.META_FILE).exists()
    open_store(store, create=True)
    results = []
    try:
        stored = {path.name: path for path in layout.bundle_dirs(store)}  # run=R → its directory
        for source in sources:
            results.append(_collect_one(source, store, placement, stored))
    except BaseException:
        if created and not any(done.added for done in results):
            _remove_new_store(store, existed)
        raise
    return results


def _remove_new_store(store: Path, existed: bool) -> None:
    """Undo the creation of a store nothing was added to: its description, and the
    folders (empty) collect made; anything else found there is left."""
    (store / layout.META_FILE).unlink(missing_ok=True)
    for folder in sorted((p for p in store.rglob("*") if p.is_dir() and not p.is_symlink()), reverse=True):
        with contextlib.suppress(OSError):
            folder.rmdir()
    if not existed:
        with contextlib.suppress(OSError):
            store.rmdir()


# --- one bundle -------------------------------------------------------------------------

@dataclass(frozen=True)
class _Source:
    path: Path
    kind: str  # run | reconstruction | compile
    manifest: dict[str, Any]
    summary: dict[str, Any]
    events: Path | None


def _read_source(path: Path) -> _Source:
    if not path.exists():
        raise InvalidInputError(f"{path}: no such file or directory")
    if path.is_dir():
        manifest_path, summary_path, events = path / "manifest.json", path / "summary.json", path / "events.parquet"
        for needed in (manifest_path, summary_path, events):
            if not needed.is_file():
                raise InvalidInputError(f"{path}: not a dfit bundle (no {needed.name}); give run or reconstruct "
                                        "bundles or compile manifests")
        summary = _json(summary_path)
        check_summary(summary, summary_path)
        es.check_events(events)
        kind = "reconstruction" if summary.get("mode") == "reconstructed" else "run"
        return _Source(path, kind, _json(manifest_path), summary, events)
    manifest = _manifest_file(path)
    if manifest.get("schema") != "dfit.manifest":
        raise InvalidInputError(f"{path}: not a dfit manifest (schema {manifest.get('schema')!r})")
    return _Source(path, "compile", manifest, {}, None)


#: What a file given to collect may be instead of a manifest, by its suffix: what to do.
_NOT_MANIFESTS = {".vmfb": "an IREE module: `dfit run` it and collect the bundle",
                  ".tflite": "a TFLite model: `dfit compile` it and collect the manifest",
                  ".onnx": "an ONNX model: `dfit compile` it and collect the manifest",
                  ".mlir": "MLIR: `dfit compile` it and collect the manifest",
                  ".parquet": "a Parquet file: collect the bundle directory it is in"}


def _manifest_file(path: Path) -> dict[str, Any]:
    """A file given to collect: a compile manifest, else one line saying what it is."""
    what = _NOT_MANIFESTS.get(path.suffix.lower())
    with os.fdopen(reading.open_regular(path, "bundle or manifest"), "rb") as handle:  # no FIFO, no /proc
        head = handle.read(4096)
    if what is None:
        try:
            head.decode("utf-8")
        except UnicodeDecodeError as error:
            if error.start < len(head) - 4:  # not just a character cut at the 4096th byte
                what = "a binary file"
        if what is None and not head.lstrip().startswith(b"{"):
            what = "not JSON"
    if what is not None:
        raise InvalidInputError(f"{path}: not a dfit bundle or manifest ({what}); give run or reconstruct "
                                "bundles or compile manifests")
    try:
        return _json(path)
    except UnicodeDecodeError:
        raise InvalidInputError(f"{path}: not a dfit bundle or manifest (a binary file)") from None


def _json(path: Path) -> dict[str, Any]:
    document = reading.load_json(path)  # a regular file, bounded, strict JSON (core/reading.py)
    if not isinstance(document, dict):
        raise InvalidInputError(f"{path}: expected a JSON object")
    return document


def _run_id(source: _Source) -> str:
    """The bundle's session (every event of one run carries it, and summary.json names
    it when there are none); a compile manifest's content hash."""
    if source.events is not None:
        import pyarrow.parquet as pq

        try:
            events = pq.ParquetFile(source.events)
            sessions = events.read_row_group(0, columns=[es.SESSION]).column(es.SESSION) if events.num_row_groups else []
        except (OSError, ValueError) as error:  # pyarrow's ArrowInvalid is a ValueError
            raise InvalidInputError(f"{source.events}: unreadable events ({str(error).splitlines()[0]})") from None
        if len(sessions):
            first = sessions[0].as_py()
            return layout.partition_value(first)
        # A run with no events (``--mode none``: timing only) still has its own session;
        # the manifest hash would make it the compile's run and every such run the same.
        if source.summary.get("session"):
            return layout.partition_value(str(source.summary["session"]))
    digest = hashlib.sha256(json.dumps(source.manifest, sort_keys=True).encode()).hexdigest()[:12]
    return f"m{digest}"


def _backend(source: _Source) -> str:
    return layout.partition_value(bundle_backend(source.summary, source.manifest))


def model_name(manifest: dict[str, Any]) -> str:
    """The model a manifest is of: its input's name without suffixes (``convnet.mlir`` →
    ``convnet``, a fixture directory → its name)."""
    raw = (manifest.get("input") or {}).get("path") or "unknown"
    name = Path(raw).name
    for suffix in (".mlir", ".mlirbc", ".onnx", ".tflite", ".json", ".out", ".log"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name


def _collect_one(source: _Source, store: Path, placement: Placement, stored: dict[str, Path]) -> Collected:
    path = source.path
    run = _run_id(source)
    backend = _backend(source)
    model = layout.partition_value(placement.model or model_name(source.manifest))
    existing = [stored[f"run={run}"]] if f"run={run}" in stored else []
    if existing:
        compacted = layout.read_index(store)["runs"].get(run)  # compacted: its files are in parts
        if not (existing[0] / "events.parquet").is_file() and compacted is None:
            raise InvalidInputError(f"{existing[0]}: this stored bundle is damaged (its events.parquet is missing); "
                                    f"remove that directory, then collect {path} again")
        count = _event_count(existing[0] / "events.parquet") if (existing[0] / "events.parquet").is_file() \
            else compacted.get("events", 0)
        if needs_ledger(existing[0], compacted):
            _add_ledger(source, existing[0])
        return Collected(path, run, existing[0].parent.parent.name.split("=", 1)[1],
                         existing[0].parent.name.split("=", 1)[1], count, added=False)
    host = placement.host if placement.host is not None else source.summary.get("host")
    rank = placement.rank if placement.rank is not None else source.summary.get("rank")
    with bundle_writer(store, backend, model, run, ledger_of=path) as tmp:
        try:
            events, version = _write_events(source, run, tmp / "events.parquet", host, rank)
        except (OSError, ValueError) as error:  # pyarrow's ArrowInvalid is a ValueError
            raise InvalidInputError(f"{source.events}: unreadable events ({str(error).splitlines()[0]})") from None
        write_table(tmp / "sites.parquet", "sites", _site_rows(source.manifest))
        write_table(tmp / "operators.parquet", "operators", _operator_rows(source.manifest))
        write_table(tmp / "partitions.parquet", "partitions", _partition_rows(source.manifest))
        write_table(tmp / "coverage.parquet", "coverage", _coverage_rows(source.manifest))
        write_table(tmp / "runs.parquet", "runs", [_run_row(source, placement, host, rank, events, version)])
    stored[f"run={run}"] = layout.bundle_dir(store, backend, model, run)
    return Collected(path, run, backend, model, events, added=True)


@contextlib.contextmanager
def bundle_writer(store: Path, backend: str, model: str, run: str, *,
                  ledger_of: Path | None = None) -> Iterator[Path]:
    """A temporary directory for one bundle's tables: the caller writes ``events.parquet``
    (:func:`events_writer`) and the small tables (:func:`write_table`) into it; on exit
    the rollup tables are computed from those events, the ledger table (computed first,
    from the bundle ``ledger_of``: its manifest and events,
    :mod:`dfit_mlir.fleet.store.ledger_rows`; None: the caller writes
    ``op_ledger.parquet`` itself) is written, and the directory is renamed into place
    whole (an error or a crash leaves no part of it in the store)."""
    target = layout.bundle_dir(store, backend, model, run)
    # The ledger first (a few rows an op), while the process holds least: computed after
    # the events' copy and the rollups (DuckDB's and Arrow's buffers kept by then), a
    # 5M-event bundle's collect peaked at 310-314 MiB, the ledger alone adding 128.
    ledger = None if ledger_of is None else ledger_rows.ledger_table(ledger_of, None)
    release_freed_memory(now=True)
    with atomic.atomic_directory(target, kind=STORE_BUNDLE_KIND) as tmp:
        yield tmp
        for table in layout.ROLLUP_TABLES:
            rollup.write(table, tmp / "events.parquet", tmp / f"{table}.parquet")
            release_freed_memory()
        if ledger is not None:
            ledger_rows.write_table(ledger_rows.with_run_instances(ledger, ledger_rows.run_instances(
                tmp / "op_totals.parquet")), tmp / f"{layout.LEDGER_TABLE}.parquet")


def needs_ledger(bundle: Path, compacted: dict[str, Any] | None) -> bool:
    """Whether a stored bundle lacks the ledger table (collected by layout 1.1 or older)."""
    in_parts = compacted is not None and layout.LEDGER_TABLE in compacted.get("tables", ())
    return not in_parts and not (bundle / f"{layout.LEDGER_TABLE}.parquet").is_file()


def _add_ledger(source: _Source, bundle: Path) -> None:
    """Give a bundle an older layout collected its ledger table, in place: the file is
    written whole beside the others, then the ownership marker lists it (the bundle's
    other tables, label, host and rank stay as they were)."""
    from dfit_mlir.core import outputs

    totals = bundle / "op_totals.parquet"
    events = bundle / "events.parquet" if (bundle / "events.parquet").is_file() else source.events
    if totals.is_file():
        instances = ledger_rows.run_instances(totals)
    elif events is not None:
        column = rollup.compute("op_totals", events).column("run_instances")
        instances = column[0].as_py() if len(column) else None
    else:
        instances = None
    name = f"{layout.LEDGER_TABLE}.parquet"
    marker = outputs.read_marker(bundle) or {}
    with atomic.atomic_path(bundle / name) as tmp:
        ledger_rows.write(source.path, tmp, instances)
    # The marker lists its own files and this one, not whatever else is in the folder.
    marker["files"] = sorted({*marker.get("files", ()), name})
    atomic.write_text(bundle / outputs.MARKER, json.dumps(marker, indent=1) + "\n")


def events_writer(path: Path) -> Any:
    """A Parquet writer of the store's ``events`` table (zstd; one row group per batch written)."""
    import pyarrow.parquet as pq

    return pq.ParquetWriter(path, layout.arrow_schema("events"), compression="zstd")


def _event_count(path: Path) -> int:
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).metadata.num_rows if path.is_file() else 0


def write_table(path: Path, table: str, rows: list[dict[str, Any]]) -> None:
    """One of the store's small tables (``rows``: column name → value; absent names are null)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = layout.arrow_schema(table)
    columns = {field.name: pa.array([row.get(field.name) for row in rows], field.type) for field in schema}
    pq.write_table(pa.table(columns, schema=schema), path, compression="zstd")


def _write_events(source: _Source, run: str, path: Path, host: str | None, rank: int | None) -> tuple[int, str]:
    """Copy the bundle's events batch by batch (memory bounded by the batch), adding where
    each ran; a compile manifest contributes one ``compile`` event per timed phase.
    Returns (events, the event schema version they were written with)."""
    import pyarrow.parquet as pq

    schema = layout.arrow_schema("events")
    written = 0
    with events_writer(path) as writer:
        if source.events is None:
            batch = _compile_events(source.manifest, run, schema, host, rank)
            writer.write_batch(batch)
            return batch.num_rows, es.SCHEMA_VERSION
        events = pq.ParquetFile(source.events, pre_buffer=False)  # pre-buffered chunks: ≈30 MiB more at peak
        version = (events.schema_arrow.metadata or {}).get(b"dfit.version", b"1.0").decode()
        present = set(events.schema_arrow.names)
        for batch in es.checked_batches(source.events, batch_size=_BATCH_ROWS, handle=events):
            count = batch.num_rows
            placed = placement_columns(batch.column(es.ATTRIBUTES) if es.ATTRIBUTES in present else None,
                                       count, host, rank, str(source.events), written)
            for name, column in placed.items():
                index = batch.schema.get_field_index(name)
                batch = batch.set_column(index, name, column) if index >= 0 else batch.append_column(name, column)
            writer.write_batch(layout.conform(batch, schema))
            written += count
            release_freed_memory()
    return written, version


def _compile_events(manifest: dict[str, Any], run: str, schema: Any, host: str | None, rank: int | None) -> Any:
    """One ``compile`` event per phase the manifest timed (``stages[].phase_s``)."""
    import pyarrow as pa

    timed = [stage for stage in manifest.get("stages", []) if stage.get("phase_s") is not None]
    given = {
        es.SESSION: [run] * len(timed), es.STAGE: [stage["name"] for stage in timed],
        es.KIND: ["compile"] * len(timed), es.NAME: ["compile.phase"] * len(timed),
        es.DURATION_NS: [round(stage["phase_s"] * 1e9) for stage in timed],
        es.VALUE: [float(stage["phase_s"]) for stage in timed],
        "host": [host] * len(timed), "rank": [rank] * len(timed),
    }
    arrays = [pa.array(given[f.name], f.type) if f.name in given else pa.nulls(len(timed), f.type) for f in schema]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _site_rows(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"site": s["index"], "function": s.get("function"), "partition": s.get("export"),
             "root_id": s.get("root_id"), "ids": s.get("fused_ids") or s.get("ids") or []}
            for s in (manifest.get("partitions") or {}).get("dispatch_sites", [])]


def _operator_rows(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for op in manifest.get("operators", []):
        source = op.get("source") or {}
        rows.append({"id": op["id"], "op": op.get("op"), "source_file": source.get("file"),
                     "source_line": source.get("line"), "source_col": source.get("col"),
                     "module_path": op.get("module_path"), "module_class": op.get("module_class"),
                     "source_op": op.get("source_op"), "phase": op.get("phase"), "macs": op.get("macs"),
                     "flops": op.get("flops"), "bytes": op.get("bytes")})
    return rows


def _partition_rows(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    partitions = manifest.get("partitions") or {}
    rows = [{"name": e.get("name"), "kind": "dispatch", "root_id": e.get("root_id"),
             "operators": len(e.get("fused_ids") or e.get("ids") or []),
             "operator_ids": e.get("fused_ids") or e.get("ids") or []} for e in partitions.get("exports", [])]
    rows += [{"name": g.get("id"), "kind": g.get("kind"), "root_id": None, "operators": len(g.get("operator_ids", [])),
              "operator_ids": list(g.get("operator_ids", []))} for g in partitions.get("groups", [])]
    return rows


def _coverage_rows(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """What the backend exposed for this bundle: the reconstruction's coverage notes
    (recovered / partial / not-exposed); for compiler-visible backends, what the
    capability descriptor declares (status ``exposed``)."""
    capabilities = manifest.get("capabilities") or {}
    notes = capabilities.get("coverage")
    if notes:
        return [{"aspect": n["aspect"], "status": n["status"], "detail": n.get("detail")} for n in notes]
    return [{"aspect": aspect, "status": "exposed", "detail": detail}
            for aspect, detail in (capabilities.get("exposes") or {}).items()]


def _run_row(source: _Source, placement: Placement, host: str | None, rank: int | None, events: int,
             version: str) -> dict[str, Any]:
    toolchain = source.summary.get("toolchain") or (source.manifest.get("producer") or {}).get("toolchain") or {}
    stamp_file = source.path / "summary.json" if source.path.is_dir() else source.path
    recorded = dt.datetime.fromtimestamp(stamp_file.stat().st_mtime, dt.timezone.utc)
    mode = source.summary.get("mode") or (source.manifest.get("compile") or {}).get("mode")
    return {
        "kind": source.kind, "mode": mode, "label": placement.label, "host": host, "rank": rank,
        "toolchain": ", ".join(f"{name} {version}" for name, version in sorted(toolchain.items())),
        "recorded_at": recorded.isoformat(timespec="seconds"),
        "collected_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "source": str(source.path.resolve()), "model_input": (source.manifest.get("input") or {}).get("path"),
        "events": events, "event_schema": version,
        "clock_offset_ns": source.summary.get("clock_offset_ns"),
    }
