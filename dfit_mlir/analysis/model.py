"""The normalized semantic model a tool sees: manifest + events + capability descriptor,
the same for every backend (an IREE compile or run, or a reconstructed dump).

Tools never open a backend's artifacts; they ask this model. Where a backend does not
expose something the answer is empty or ``None``, and :meth:`SemanticModel.exposes`
says so up front, so a tool can degrade gracefully.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from dfit_mlir.core import manifest as manifest_io
from dfit_mlir.core.errors import InvalidInputError
from dfit_mlir.core.perf import release_freed_memory


@dataclass(frozen=True)
class Operator:
    id: str
    op: str
    source: dict[str, Any] | None
    name_path: tuple[str, ...]
    call_stack: tuple[dict[str, Any], ...]
    phase: str | None
    macs: int | None
    flops: int | None
    bytes: int | None
    operands: tuple[dict[str, Any], ...]
    results: tuple[dict[str, Any], ...]
    #: Backend partition this op runs in, where the backend says (reconstructions).
    partition: str | None = None
    #: The frontend's source model (``dfit_mlir.frontends``): where in the model the op
    #: sits (``""``: the root), the module's class, the op as the frontend names it.
    #: ``None`` where the manifest does not say (older manifests, reconstructions).
    module_path: str | None = None
    module_class: str | None = None
    source_op: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def kind(self) -> str:
        """The op name without dialect (``matmul``, ``CONV_2D``, ``MatMul``)."""
        return self.op.rsplit(".", 1)[-1]


@dataclass(frozen=True)
class Partition:
    """A unit the backend executes: an IREE dispatch call site, an Edge TPU custom op or
    the CPU remainder, a SambaFlow partition, a Cerebras kernel."""

    id: str
    kind: str
    operator_ids: tuple[str, ...]
    #: The op that names the partition (an IREE dispatch's root op), if any.
    root_id: str | None = None
    attributes: dict[str, Any] = field(default_factory=dict, compare=False)


class SemanticModel:
    """One bundle (a directory with ``manifest.json``) or one compile's manifest."""

    def __init__(self, manifest: dict[str, Any], bundle: Path | None = None, source: str = "<manifest>"):
        self.manifest = manifest
        self.bundle = bundle
        self.source = source
        self._compute_ops: dict[str, tuple[str, ...]] = {}
        self._placed: dict[str, dict[str, dict[str, int]]] = {}

    @classmethod
    def open(cls, path: str | Path) -> SemanticModel:
        """A run/reconstruct bundle directory or a ``*.manifest.json`` file."""
        path = Path(path)
        if path.is_dir():
            manifest_path = path / "manifest.json"
            if not manifest_path.is_file():
                raise InvalidInputError(f"{path}: not a dfit bundle (no manifest.json)")
            model = cls(manifest_io.load(manifest_path), path, str(path))
            model.__dict__["summary"] = check_bundle(path, model.manifest)
            return model
        if not path.exists():
            raise InvalidInputError(f"{path}: no such file or directory")
        return cls(manifest_io.load(path), None, str(path))

    @classmethod
    def from_artifacts(cls, paths: list[str | Path], bundle: str | Path, backend: str = "auto") -> SemanticModel:
        """Reconstruction service: recover the semantic model from a closed backend's
        artifacts (``dfit reconstruct``) into ``bundle`` and open it."""
        from dfit_mlir.adapters.reconstruct import reconstruct_bundle

        reconstruct_bundle([Path(p) for p in paths], Path(bundle), backend)
        return cls.open(bundle)

    # --- capability descriptor ------------------------------------------------------

    @property
    def backend(self) -> str:
        return self.manifest["capabilities"]["backend"]

    @property
    def capabilities(self) -> dict[str, Any]:
        return self.manifest["capabilities"]

    def exposes(self, aspect: str) -> bool:
        """Whether the backend exposes ``aspect`` at all (``per_op_timing``, ...)."""
        fidelity = self.capabilities.get("exposes", {}).get(aspect)
        return bool(fidelity) and fidelity != "none"

    @property
    def reconstructed(self) -> bool:
        return self.manifest.get("compile", {}).get("mode") == "reconstructed"

    # --- semantic services -----------------------------------------------------------

    @cached_property
    def operators(self) -> dict[str, Operator]:
        return {op["id"]: Operator(
            id=op["id"], op=op["op"], source=op.get("source"), name_path=tuple(op.get("name_path") or ()),
            call_stack=tuple(op.get("call_stack") or ()), phase=op.get("phase"), macs=op.get("macs"),
            flops=op.get("flops"), bytes=op.get("bytes"), operands=tuple(op.get("operands") or ()),
            results=tuple(op.get("results") or ()), partition=op.get("partition"),
            module_path=op.get("module_path"), module_class=op.get("module_class"),
            source_op=op.get("source_op"), raw=op,
        ) for op in self.manifest["operators"]}

    def operator(self, op_id: str) -> Operator | None:
        return self.operators.get(op_id)

    @property
    def tensors(self) -> list[dict[str, Any]]:
        return self.manifest.get("tensors", [])

    @property
    def stages(self) -> list[dict[str, Any]]:
        return self.manifest.get("stages", [])

    @cached_property
    def partitions(self) -> list[Partition]:
        """Every partition, uniformly: IREE dispatch call sites (``dispatch``) or the
        groups of a reconstruction."""
        parts = self.manifest["partitions"]
        found = [Partition(id=f"site{site['index']}:{site['export']}", kind="dispatch",
                           operator_ids=tuple(site["fused_ids"] or site["ids"]), root_id=site["root_id"],
                           attributes={"export": site["export"], "site": site["index"],
                                       "function": site["function"],
                                       "shared_ids": tuple(site.get("shared_ids") or ())})
                 for site in parts.get("dispatch_sites", [])]
        found += [Partition(id=group["id"], kind=group["kind"], operator_ids=tuple(group["operator_ids"]),
                            attributes=dict(group.get("attributes") or {}))
                  for group in parts.get("groups", [])]
        return found

    @cached_property
    def _dispatches(self) -> list[Partition]:
        return [p for p in self.partitions if p.kind == "dispatch"]

    def partition_of_site(self, site: int) -> Partition | None:
        dispatches = self._dispatches
        return dispatches[site] if 0 <= site < len(dispatches) else None

    def compute_ops(self, partition: Partition) -> tuple[str, ...]:
        """The ops a partition's measured time is split over, evenly: its top-level ops
        (not a region body of another of its ops) that consume a value — constants and
        empty tensors, which IREE copies into every dispatch using them, do no work —
        or all top-level ops if none qualifies, or all members. Shared materialisation
        (a site's ``shared_ids``, :mod:`dfit_mlir.passes.materialisation`) is not a member. One
        rule for every tool that attributes time to ops."""
        found = self._compute_ops.get(partition.id)
        if found is None:
            members = [i for i in partition.operator_ids if i in self.operators]
            top = [i for i in members if self.operators[i].raw.get("parent") not in members]
            consuming = [i for i in top if self.operators[i].operands]
            found = self._compute_ops[partition.id] = tuple(consuming or top or members)
        return found

    def placed_costs(self, partition: Partition, key: str = "macs") -> dict[str, int]:
        """Op ID → the part of its ``key`` (``macs`` / ``flops``) counted in ``partition``:
        an op split over several partitions counts once, where it computes
        (:mod:`dfit_mlir.core.site_costs`), so partitions sum to the model's total."""
        table = self._placed.get(key)
        if table is None:
            from dfit_mlir.core.site_costs import (
                moves_data_only,
                op_figures,
                placed_costs,
                site_weights,
            )

            parts = self.partitions
            kinds = {op_id: op.raw.get("cost_kind") for op_id, op in self.operators.items()}
            costs = op_figures({op_id: getattr(op, key) for op_id, op in self.operators.items()}, kinds)
            computes = [p.kind != "dispatch" or not moves_data_only(p.attributes.get("export")) for p in parts]
            sites = self.manifest["partitions"].get("dispatch_sites", [])
            by_site = dict(zip((s["index"] for s in sites), site_weights(sites, key, kinds), strict=True))
            weights = [by_site.get(p.attributes.get("site")) if p.kind == "dispatch" else None for p in parts]
            placed = placed_costs([p.operator_ids for p in parts], computes, costs, weights)
            table = self._placed[key] = {p.id: share for p, share in zip(parts, placed, strict=True)}
        return table.get(partition.id, {})

    def partition_of_event(self, event: dict[str, Any]) -> Partition | None:
        """The partition a runtime record ran in: an IREE dispatch by its call site, a
        reconstructed record by the group it names (``None`` for records of no
        partition: program spans, queue and memory operations, run-level metrics)."""
        if event.get("site") is not None and event.get("kind") == "dispatch":
            return self.partition_of_site(event["site"])
        name = event.get("partition")
        return self._groups_by_id.get(name) if name else None

    @cached_property
    def _groups_by_id(self) -> dict[str, Partition]:
        return {p.id: p for p in self.partitions if p.kind != "dispatch"}

    def lineage(self, op_id: str) -> dict[str, str]:
        """Stage → ``preserved``/``fused``/``split``/``erased`` for one source ID."""
        lineage = self.manifest.get("lineage", {})
        letters = lineage.get("classes", {}).get(op_id, "")
        legend = {letter: name for name, letter in (lineage.get("legend") or
                  {"preserved": "p", "fused": "f", "split": "s", "erased": "e"}).items()}
        return {stage: legend.get(letter, letter) for stage, letter in zip(lineage.get("stages", []), letters,
                                                                             strict=False)}

    def source_of(self, op_id: str) -> str | None:
        """``file:line:col`` of an op, if known."""
        op = self.operator(op_id)
        if op is None or not op.source:
            return None
        return f"{op.source['file']}:{op.source['line']}:{op.source['col']}"

    def module_path(self, op_id: str) -> str | None:
        """The op's module path as its frontend wrote it in the manifest (``""``: the
        model's root), else its location names joined with ``.`` (reconstructions,
        manifests older than 1.2), else ``None``."""
        op = self.operator(op_id)
        if op is None:
            return None
        if op.module_path is not None:
            return op.module_path
        return ".".join(op.name_path) if op.name_path else None

    @property
    def frontend(self) -> str | None:
        """The frontend the compiled source came from (``torch``, ``jax``, ``onnx``,
        ``tflite``, ``mlir``), where the manifest says."""
        return self.manifest.get("input", {}).get("frontend")

    def static_cost(self, op_id: str) -> tuple[int | None, int | None, int | None]:
        """(MACs, FLOPs, bytes) of an op, each ``None`` where not derivable."""
        op = self.operator(op_id)
        return (None, None, None) if op is None else (op.macs, op.flops, op.bytes)

    # --- events ------------------------------------------------------------------------

    @property
    def events_path(self) -> Path | None:
        if self.bundle is None:
            return None
        path = self.bundle / "events.parquet"
        return path if path.is_file() else None

    def event_batches(self, batch_size: int = 65_536, columns: list[str] | None = None) -> Iterator[Any]:
        """Record batches of ``events.parquet`` in this dfit's event schema (none for a
        bare manifest), or of its ``columns`` only (a reader that reads the events more
        than once: the rest, a long run's per-event text, is not read). Files of an older
        minor version get the fields added since as nulls; another major version is refused."""
        if self.events_path is None:
            return
        import pyarrow as pa
        import pyarrow.parquet as pq

        from dfit_mlir.core import event_schema

        try:
            # Not pre-buffered: pre-buffering reads a row group's column chunks ahead in
            # buffers the batches do not reuse (≈30 MiB more at peak over all the columns).
            events = pq.ParquetFile(self.events_path, pre_buffer=False)
            conform = _conformer(events.schema_arrow, str(self.events_path), columns)
            read = None if columns is None else [name for name in columns if name in events.schema_arrow.names]
            for batch in event_schema.checked_batches(self.events_path, batch_size=batch_size, handle=events,
                                                      columns=read):
                yield conform(batch)
                # Arrow's allocator keeps what a batch freed and the next one's buffers do
                # not always fit in it: a reader of a 5M-event bundle's attributes grew by
                # ≈70 MiB without this, and stays flat with it.
                release_freed_memory()
        except (pa.ArrowException, OSError) as error:
            first = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
            raise InvalidInputError(f"{self.events_path}: not a readable Parquet file ({first})") from None

    def events(self) -> Any:
        """All events as one Arrow table (an empty one for a bare manifest)."""
        from dfit_mlir.core import event_schema

        schema = event_schema.arrow_schema()
        batches = list(self.event_batches())
        if not batches:
            return schema.empty_table()
        import pyarrow as pa

        return pa.Table.from_batches(batches, schema)

    @cached_property
    def summary(self) -> dict[str, Any]:
        """The bundle's ``summary.json`` (empty for a bare manifest)."""
        if self.bundle is None or not (self.bundle / "summary.json").is_file():
            return {}
        return read_json_object(self.bundle / "summary.json")

    @cached_property
    def coverage(self) -> dict[str, Any]:
        """A reconstruction's ``coverage.json`` (empty otherwise)."""
        if self.bundle is None or not (self.bundle / "coverage.json").is_file():
            return {}
        return read_json_object(self.bundle / "coverage.json")


#: Files every run or reconstruct bundle holds (``dfit_mlir/exporters/bundle.py``).
BUNDLE_FILES = ("manifest.json", "summary.json", "events.parquet", "sites.parquet")


def check_bundle(bundle: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """Refuse a bundle that is incomplete, unreadable, of another version, or whose
    manifest is not the one its events were joined against; returns its summary."""
    from dfit_mlir.exporters.bundle import SUMMARY_SCHEMA

    missing = [name for name in BUNDLE_FILES if not (bundle / name).is_file()]
    if missing:
        raise InvalidInputError(f"{bundle}: incomplete dfit bundle: {', '.join(missing)} missing")
    summary = read_json_object(bundle / "summary.json")
    if summary.get("schema") != SUMMARY_SCHEMA:
        raise InvalidInputError(f"{bundle / 'summary.json'}: not a dfit run summary "
                                f"(schema is {str(summary.get('schema'))[:40]!r})")
    major = str(summary.get("version", "")).split(".", 1)[0]
    if major != "1":
        raise InvalidInputError(f"{bundle / 'summary.json'}: summary version {str(summary.get('version'))[:20]} "
                                "is not supported; this dfit reads 1.x")
    recorded = (summary.get("vmfb") or {}).get("sha256") if isinstance(summary.get("vmfb"), dict) else None
    compiled = (manifest.get("compile") or {}).get("vmfb_sha256")
    if recorded is not None and compiled is not None and recorded != compiled:
        raise InvalidInputError(f"{bundle / 'manifest.json'}: not the manifest of this run (the run's vmfb "
                                "sha256 in summary.json differs from the manifest's)")
    sites = _parquet(bundle / "sites.parquet", ["site", "root_id"])
    dispatch_sites = manifest["partitions"].get("dispatch_sites", [])
    expected = [(site["index"], site["root_id"]) for site in dispatch_sites]
    found = list(zip(sites.column("site").to_pylist(), sites.column("root_id").to_pylist(), strict=True))
    if found != expected:
        raise InvalidInputError(f"{bundle / 'sites.parquet'}: its {len(found)} call sites are not the "
                                f"{len(expected)} of the bundle's manifest.json (another model's files?)")
    from dfit_mlir.core import event_schema

    event_schema.check_events(bundle / "events.parquet")  # its values: as they are read (event_batches)
    rows, backends, site_roots = _event_facts(bundle / "events.parquet")
    backend = (manifest.get("capabilities") or {}).get("backend")
    found_backends = {name for name in backends if name is not None}
    if backend is not None and found_backends - {backend}:
        raise InvalidInputError(f"{bundle / 'events.parquet'}: events of the {', '.join(sorted(found_backends))} "
                                f"backend, but the bundle's manifest.json is an {backend} model's")
    counts = summary.get("counts")
    kept = counts.get("kept") if isinstance(counts, dict) else None
    if isinstance(kept, int) and kept != rows:
        raise InvalidInputError(f"{bundle / 'events.parquet'}: holds {rows} events, summary.json "
                                f"says {kept}")
    _check_event_sites(bundle / "events.parquet", site_roots, dict(expected))
    return summary


def _event_facts(path: Path) -> tuple[int, set[str | None], list[tuple[int | None, str | None]]]:
    """What the bundle check needs of the events: how many, their backends, and the
    distinct (call site, root ID) of the dispatch events; read a batch at a time (a long
    run's columns are not held whole), any way the file is broken being an input error."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from dfit_mlir.core import event_schema

    columns = ["kind", "site", "root_id", "backend"]
    types: dict[str, pa.DataType] = {"site": pa.int64(), "root_id": pa.string()}
    rows = 0
    backends: set[str | None] = set()
    pairs: set[tuple[int | None, str | None]] = set()
    try:
        handle = pq.ParquetFile(path)
        missing = [name for name in columns if name not in handle.schema_arrow.names]
        if missing:
            raise InvalidInputError(f"{path}: not a dfit table (no column {missing[0]!r})")
        for batch in event_schema.row_group_batches(handle, batch_size=262_144, columns=columns):
            rows += batch.num_rows
            backends.update(pc.unique(batch.column("backend").cast(pa.string())).to_pylist())
            dispatches = pa.Table.from_batches([batch]).filter(
                pc.equal(batch.column("kind").cast(pa.string()), pa.scalar("dispatch")))
            found = dispatches.select(["site", "root_id"]).group_by(["site", "root_id"]).aggregate([])
            found = found.cast(pa.schema(types))
            pairs.update(zip(found.column("site").to_pylist(), found.column("root_id").to_pylist(), strict=True))
            release_freed_memory()  # as in event_batches: flat over a long run
    except (pa.ArrowException, OSError, ValueError) as error:
        first = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
        raise InvalidInputError(f"{path}: not a readable Parquet file ({first})") from None
    return rows, backends, sorted(pairs, key=lambda pair: (pair[0] is None, pair[0] or 0, pair[1] or ""))


def _check_event_sites(path: Path, pairs: list[tuple[int | None, str | None]], roots: dict[int, str]) -> None:
    """Every dispatch event names a call site of the manifest, with that site's root ID
    (``pairs``: the distinct (site, root ID) of the dispatch events)."""
    for site, root in pairs:
        if site is None:
            continue
        if site not in roots:
            raise InvalidInputError(f"{path}: dispatch events at call site {site}, which the bundle's manifest "
                                    f"does not have ({len(roots)} sites; another model's manifest?)")
        if root is not None and roots[site] is not None and root != roots[site]:
            raise InvalidInputError(f"{path}: call site {site} ran {root} but the bundle's manifest says "
                                    f"{roots[site]} (another model's manifest?)")


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON object file (a bundle's summary, manifest, coverage), any way it is broken
    being an input error naming it."""
    from dfit_mlir.core import reading

    document = reading.load_json(path)  # a regular file, bounded, strict JSON (no NaN, duplicate key)
    if not isinstance(document, dict):
        raise InvalidInputError(f"{path}: expected a JSON object")
    return document


def _parquet(path: Path, columns: list[str]) -> Any:
    """The ``columns`` of a Parquet file, any way it is broken being an input error."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        handle = pq.ParquetFile(path)
        missing = [name for name in columns if name not in handle.schema_arrow.names]
        if missing:
            raise InvalidInputError(f"{path}: not a dfit table (no column {missing[0]!r})")
        return handle.read(columns=columns)
    except (pa.ArrowException, OSError, ValueError) as error:
        first = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
        raise InvalidInputError(f"{path}: not a readable Parquet file ({first})") from None


def _conformer(written: Any, source: str, columns: list[str] | None = None) -> Any:
    """A function bringing batches written with ``written`` to the current event schema
    (its ``columns`` only, when given)."""
    import pyarrow as pa

    from dfit_mlir.core import event_schema

    version = (written.metadata or {}).get(b"dfit.version", b"1.0").decode()
    if not event_schema.readable(version):
        raise InvalidInputError(f"{source}: event schema {version} is not readable by this dfit "
                                f"(reads {event_schema.MIN_READER_VERSION} to {event_schema.SCHEMA_VERSION.split('.')[0]}.x)")
    current = event_schema.arrow_schema()
    if columns is not None:
        current = pa.schema([current.field(name) for name in columns])
        if all(name in written.names for name in columns):
            return lambda batch: batch
    elif written.names == current.names:
        return lambda batch: batch

    def conform(batch: Any) -> Any:
        columns = [batch.column(field.name) if field.name in written.names else pa.nulls(batch.num_rows, field.type)
                   for field in current]
        return pa.RecordBatch.from_arrays(columns, schema=current)

    return conform


# --- questions every reader of a model asks -------------------------------------------

def tensor_name(op: Operator) -> str | None:
    """The name an op is matched by across backends (see the module docstring)."""
    return op.raw.get("name") or (op.name_path[-1] if op.name_path else None)


def stands_for_partition(model: SemanticModel, op: Operator) -> bool:
    """Whether ``op`` is a partition's stand-in rather than one of its members (an Edge TPU
    custom op of the compiled model: it names the partition it replaces and carries the
    output tensor name of that partition's last op, so matching it by name would pair
    it with that op's counterpart too)."""
    if op.partition is None:
        return False
    partition = next((p for p in model.partitions if p.id == op.partition), None)
    return partition is not None and op.id not in partition.operator_ids


def partitions_by_op(model: SemanticModel) -> dict[str, list[Partition]]:
    """Op ID → the partitions it lands in (members, or the op's own ``partition``)."""
    found: dict[str, list[Partition]] = {}
    by_id = {partition.id: partition for partition in model.partitions}
    for partition in model.partitions:
        for op_id in partition.operator_ids:
            found.setdefault(op_id, []).append(partition)
    for op in model.operators.values():
        if op.partition in by_id and not found.get(op.id):
            found.setdefault(op.id, []).append(by_id[op.partition])
    return dict(found)
