"""``dfit merge``: the runs of one job (ranks, hosts, devices, or the tasks of one
data-parallel log) on one timeline.

Ranks: a bundle's ``summary.rank``/``host`` where it records them; else the events'
``rank`` attribute (a data-parallel log's tasks, as the readers tag them), else their
``pid`` attribute (one task per process); else one rank per bundle, in the order given.

Clocks: offsets the bundles recorded (``summary.clock_offset_ns``: add it to the bundle's
times to get the job's clock) when every bundle has one; else an anchor common to every
rank: the first step (a training step, else a program invocation) every rank has, or the
first event of ``--anchor KIND[:NAME]``. Each rank is shifted so its anchor starts with
the reference rank's (the lowest). The residual is what the anchor cannot explain: over
the other steps every rank has, the median distance between a step's start on a rank
and on the reference after the shift (rank skew and clock drift together).

Out: a bundle with ``events.parquet`` (times shifted), ``manifest.json`` (the first
bundle's), ``trace.pftrace`` (a track group per rank; every rank's start of a common step
linked by one Perfetto flow, so the straggler is the flow's last slice), ``steps.csv``
(per common step: earliest and latest rank and the spread), ``summary.json``.

One job: bundles of different backends, or of different models (the compiled source's
hash; for a reconstruction without one, its operators), are refused unless
``allow_mixed`` (``--allow-mixed``): their steps and clocks have nothing in common.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dfit_mlir.core import atomic
from dfit_mlir.core import event_schema as es
from dfit_mlir.core.errors import InvalidInputError
from dfit_mlir.fleet.placement import bundle_backend, check_summary, placement_columns

#: Flow IDs of linked steps: this base plus the step (kept clear of small numbers other tools use).
_FLOW_BASE = 0xDF17_0000_0000


@dataclass(frozen=True)
class Rank:
    """One rank of the merged job."""

    group: str  # the track group's name
    source: str
    host: str | None
    rank: int | None
    pid: int | None
    ranked_by: str  # summary | attribute | pid | bundle order
    events: int
    offset_ns: int = 0
    anchor_ns: int | None = None


@dataclass
class _Bundle:
    path: Path
    summary: dict[str, Any]
    manifest: dict[str, Any]
    events: Any  # pyarrow Table
    rank_keys: np.ndarray  # index into ranks, per event


def _load(path: Path) -> tuple[dict[str, Any], dict[str, Any], Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dfit_mlir.analysis.model import read_json_object

    for name in ("summary.json", "manifest.json", "events.parquet"):
        if not (path / name).is_file():
            raise InvalidInputError(f"{path}: not a dfit run or reconstruct bundle (no {name})")
    summary = read_json_object(path / "summary.json")
    check_summary(summary, path / "summary.json")
    manifest = read_json_object(path / "manifest.json")
    events = path / "events.parquet"
    es.check_events(events)  # before opening it plainly: an unreadable file is one line
    handle = pq.ParquetFile(events)
    return summary, manifest, pa.Table.from_batches(list(es.checked_batches(events, handle=handle)),
                                                    schema=handle.schema_arrow)


def _assign_ranks(index: int, path: Path, summary: dict[str, Any], events: Any,
                  ranks: list[Rank], by_key: dict[tuple[Any, ...], int]) -> np.ndarray:
    count = events.num_rows
    host = summary.get("host")
    attributes = events.column(es.ATTRIBUTES).combine_chunks() if es.ATTRIBUTES in events.column_names else None
    placed = placement_columns(attributes, count, host, summary.get("rank"), str(path / "events.parquet"))
    rank_values = placed["rank"].to_pylist()
    pids = placed["pid"].to_pylist()
    keys = np.zeros(count, dtype=np.int64)
    # A log whose tasks tag their lines also has lines of no task (the job's compile, its setup).
    tagged = any(value is not None for value in rank_values) or any(value is not None for value in pids)
    for row in range(count):
        rank, pid = rank_values[row], pids[row]
        if summary.get("rank") is not None:
            key, ranked_by = ("rank", host, rank), "summary"
        elif rank is not None:
            key, ranked_by = ("rank", host, rank), "attribute"
        elif pid is not None:
            key, ranked_by = ("pid", host, pid), "pid"
        else:
            key, ranked_by = ("bundle", host, index), "bundle order"
        found = by_key.get(key)
        if found is None:
            found = by_key[key] = len(ranks)
            label = {"rank": f"rank {key[2]}", "pid": f"task pid {key[2]}",
                     "bundle": f"{path.name}: no task" if tagged else f"rank {key[2]}"}[key[0]]
            ranks.append(Rank(group=(f"host {host} · " if host else "") + label, source=str(path), host=host,
                              rank=key[2] if key[0] == "rank" or (key[0] == "bundle" and not tagged) else None,
                              pid=key[2] if key[0] == "pid" else None, ranked_by=ranked_by, events=0))
        keys[row] = found
    return keys


def _step_starts(bundles: list[_Bundle], rank_count: int) -> list[dict[int, tuple[int, int, int]]]:
    """Per rank: step → (earliest start, bundle index, row of that event)."""
    starts: list[dict[int, tuple[int, int, int]]] = [{} for _ in range(rank_count)]
    for bundle_index, bundle in enumerate(bundles):
        table = bundle.events
        start = table.column(es.START_NS).to_pylist()
        step = table.column(es.STEP).to_pylist() if es.STEP in table.column_names else [None] * table.num_rows
        invocation = table.column(es.INVOCATION).to_pylist()
        for row in range(table.num_rows):
            if start[row] is None:
                continue
            key = step[row] if step[row] is not None else invocation[row]
            if key is None:
                continue
            rank = int(bundle.rank_keys[row])
            value = start[row]
            found = starts[rank].get(key)
            if found is None or value < found[0]:
                starts[rank][key] = (value, bundle_index, row)
    return starts


def _anchor_starts(bundles: list[_Bundle], rank_count: int, anchor: str) -> list[int | None]:
    kind, _, name = anchor.partition(":")
    if kind not in es.EVENT_KINDS:
        raise InvalidInputError(f"--anchor {anchor!r}: KIND is one of {', '.join(es.EVENT_KINDS)}")
    found: list[int | None] = [None] * rank_count
    for bundle in bundles:
        table = bundle.events
        kinds = table.column(es.KIND).to_pylist()
        names = table.column(es.NAME).to_pylist() if es.NAME in table.column_names else [None] * table.num_rows
        partitions = table.column(es.PARTITION).to_pylist()
        start = table.column(es.START_NS).to_pylist()
        for row in range(table.num_rows):
            if kinds[row] != kind or start[row] is None or (name and name not in (names[row], partitions[row])):
                continue
            rank = int(bundle.rank_keys[row])
            if found[rank] is None or start[row] < found[rank]:
                found[rank] = start[row]
    return found


def _model(manifest: dict[str, Any]) -> tuple[str, str]:
    """(what the user knows the model by, a fingerprint equal for every run of it): the
    compiled source's hash where the manifest records one (every run of one compile, on
    any host), else the operators themselves (a reconstruction from one rank's log has
    the same operators as one from another rank's)."""
    source = manifest.get("input") or {}
    name = str(source.get("path") or "an unnamed model")
    if source.get("sha256"):
        return name, f"sha256:{source['sha256']}"
    operators = sorted(f"{op.get('id')}={op.get('op')}" for op in manifest.get("operators") or ())
    return name, "operators:" + hashlib.sha256("\n".join(operators).encode()).hexdigest()


def _check_one_job(bundles: list[_Bundle]) -> None:
    """Refuse bundles of different backends or models: their "ranks" share no clock or
    step, and an anchor found between them aligns nothing."""
    first = bundles[0]
    first_backend, (first_name, first_print) = bundle_backend(first.summary, first.manifest), _model(first.manifest)
    for other in bundles[1:]:
        backend, (name, fingerprint) = bundle_backend(other.summary, other.manifest), _model(other.manifest)
        if backend != first_backend:
            why = f"different backends ({first_backend}, {backend})"
        elif fingerprint != first_print:
            why = f"different models ({first_name}, {name})"
        else:
            continue
        raise InvalidInputError(f"{first.path} and {other.path} are not runs of one job: {why}; "
                                "give --allow-mixed to merge them anyway")


def merge_bundles(paths: Sequence[Path], output: Path, anchor: str | None = None,
                  allow_mixed: bool = False) -> dict[str, Any]:
    """Merge ``paths`` into the bundle ``output``; returns its summary. Bundles of
    different backends or models are refused unless ``allow_mixed``."""
    import pyarrow as pa

    _check_paths(paths, output)
    bundles, ranks = _read_ranks(paths)
    _check_distinct_runs(bundles)
    if not allow_mixed:
        _check_one_job(bundles)
    steps = _step_starts(bundles, len(ranks))
    common = sorted(set.intersection(*(set(s) for s in steps))) if steps else []
    offsets, anchors, alignment = _align(bundles, ranks, steps, common, anchor)
    ranks = [_with(rank, offset_ns=offsets[k], anchor_ns=anchors[k]) for k, rank in enumerate(ranks)]
    flows, step_rows = _link_steps(ranks, steps, common, offsets)
    merged, groups, sources, session = _shifted_events(bundles, ranks, offsets)
    summary = {
        "mode": "merged",
        "backend": bundles[0].summary.get("backend") or "iree",
        "session": session,
        "sources": [str(b.path) for b in bundles],
        "source_sessions": sources,
        "mixed": allow_mixed and len({(bundle_backend(b.summary, b.manifest), _model(b.manifest)[1]) for b in bundles}) > 1,
        "ranks": [asdict(rank) for rank in ranks],
        "alignment": alignment,
        "linked_steps": len(common),
        "events": merged.num_rows,
    }
    flow_ids: list[int | None] = [None] * merged.num_rows
    starts = np.cumsum([0] + [b.events.num_rows for b in bundles])
    for (bundle_index, row), flow in flows.items():
        flow_ids[int(starts[bundle_index]) + row] = flow
    group_names = pa.array([rank.group for rank in ranks], pa.string())
    traced = merged.append_column("track_group", group_names.take(pa.array(groups))) \
                   .append_column("flow_id", pa.array(flow_ids, pa.uint64()))
    return _write(output, bundles[0].manifest, merged, traced, step_rows, summary)


def _check_paths(paths: Sequence[Path], output: Path) -> None:
    """Each input exists, is given once, and is not the output."""
    if not paths:
        raise InvalidInputError("give the bundles of one job to merge")
    for path in paths:
        if not Path(path).exists():
            raise InvalidInputError(f"{path}: no such file or directory")
        if Path(path).resolve() == Path(output).resolve():
            raise InvalidInputError(f"{output}: is one of the inputs; write the merged bundle elsewhere")
    seen: dict[Path, Path] = {}
    for path in paths:
        first = seen.setdefault(Path(path).resolve(), Path(path))
        if first != Path(path) or list(paths).count(path) > 1:
            raise InvalidInputError(f"{path}: given twice (as {first}); each bundle is one rank or job part")


def _read_ranks(paths: Sequence[Path]) -> tuple[list[_Bundle], list[Rank]]:
    """The bundles, and the ranks their events ran on (with each rank's event count)."""
    ranks: list[Rank] = []
    by_key: dict[tuple[Any, ...], int] = {}
    bundles = []
    for index, path in enumerate(paths):
        summary, manifest, events = _load(Path(path))
        keys = _assign_ranks(index, Path(path), summary, events, ranks, by_key)
        bundles.append(_Bundle(Path(path), summary, manifest, events, keys))
    for rank_index in range(len(ranks)):
        ranks[rank_index] = _with(ranks[rank_index],
                                  events=int(sum((b.rank_keys == rank_index).sum() for b in bundles)))
    return bundles, ranks


def _align(bundles: list[_Bundle], ranks: list[Rank], steps: list[dict[Any, Any]], common: list[Any],
           anchor: str | None) -> tuple[list[int], list[int | None], dict[str, Any]]:
    """(clock offset per rank, its anchor time, how they were found): recorded offsets
    win, then ``--anchor``, then the first common step, then each rank's first step."""
    offsets = [0] * len(ranks)
    alignment: dict[str, Any]
    recorded = [b.summary.get("clock_offset_ns") for b in bundles]
    anchors: list[int | None]
    if all(value is not None for value in recorded):
        for rank_index, rank in enumerate(ranks):
            offsets[rank_index] = int(recorded[[str(b.path) for b in bundles].index(rank.source)])
        alignment = {"method": "recorded offsets (summary.clock_offset_ns)"}
        anchors = [None] * len(ranks)
    elif anchor is not None:
        anchors = _anchor_starts(bundles, len(ranks), anchor)
        missing = [ranks[k].group for k, value in enumerate(anchors) if value is None]
        if missing:
            raise InvalidInputError(f"--anchor {anchor}: no such event on {', '.join(missing[:3])}")
        alignment = {"method": f"anchor: first {anchor} event of every rank"}
    elif common:
        anchors = [steps[k][common[0]][0] for k in range(len(ranks))]
        alignment = {"method": f"anchor: first common step ({common[0]})"}
    else:
        anchors = [min((v[0] for v in steps[k].values()), default=None) for k in range(len(ranks))]
        if any(value is None for value in anchors):
            anchors = [None] * len(ranks)
            alignment = {"method": "none (no step, invocation or recorded offset common to every rank)"}
        else:
            alignment = {"method": "anchor: first step of every rank (no step is common to all)"}
    reference = anchors[0]
    if reference is not None and all(value is not None for value in anchors):
        offsets = [int(reference - value) for value in anchors if value is not None]
    offsets = _no_negative_times(bundles, offsets)
    alignment.update(_residual(ranks, steps, common, offsets, anchors, alignment["method"]))
    return offsets, anchors, alignment


def _residual(ranks: list[Rank], steps: list[dict[Any, Any]], common: list[Any], offsets: list[int],
              anchors: list[int | None], method: str) -> dict[str, Any]:
    """How well the clocks line up: the median distance of the later common steps."""
    deviations = [abs((steps[k][s][0] + offsets[k]) - (steps[0][s][0] + offsets[0]))
                  for s in common[1:] for k in range(1, len(ranks))]
    found: dict[str, Any] = {
        "reference": ranks[0].group, "common_steps": len(common),
        "aligned": any(value is not None for value in anchors) or method.startswith("recorded"),
        "residual_ns": int(statistics.median(deviations)) if deviations else None}
    if len(ranks) == 1:
        found["aligned"] = True
        found["residual_note"] = "one rank: nothing to align it with"
    elif not found["aligned"]:
        found["residual_note"] = "clocks not aligned: each rank keeps its own clock"
    elif not deviations:
        found["residual_note"] = "no second common step: the residual is not measurable"
    return found


def _link_steps(ranks: list[Rank], steps: list[dict[Any, Any]], common: list[Any],
                offsets: list[int]) -> tuple[dict[tuple[int, int], int], list[dict[str, Any]]]:
    """Every rank's start of each common step linked by one flow (in time order), and a
    ``steps.csv`` row per step; one rank: nothing to link."""
    flows: dict[tuple[int, int], int] = {}
    step_rows = []
    for step in common if len(ranks) > 1 else []:
        arrivals = sorted((steps[k][step][0] + offsets[k], k) for k in range(len(ranks)))
        for k in range(len(ranks)):
            _, bundle_index, row = steps[k][step]
            flows[(bundle_index, row)] = _FLOW_BASE + int(step)
        step_rows.append({"step": step, "ranks": len(ranks), "first_rank": ranks[arrivals[0][1]].group,
                          "last_rank": ranks[arrivals[-1][1]].group,
                          "spread_ns": arrivals[-1][0] - arrivals[0][0]})
    return flows, step_rows


def _shifted_events(bundles: list[_Bundle], ranks: list[Rank],
                    offsets: list[int]) -> tuple[Any, Any, list[str], str]:
    """(every event on the common clock, each event's rank, the source sessions, the
    merged bundle's own session)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    shifted = []
    for bundle in bundles:
        table = bundle.events
        shift = pa.array(np.array(offsets, dtype=np.int64)[bundle.rank_keys])
        try:
            start = pc.add_checked(table.column(es.START_NS), shift)
        except pa.ArrowInvalid:  # an overflow: times near 2^62 and an offset as large
            raise InvalidInputError(f"{bundle.path}: its times shifted by the clock offset leave int64 (offsets "
                                    f"{sorted(set(offsets))[:4]})") from None
        table = table.set_column(table.column_names.index(es.START_NS), es.START_NS, start)
        shifted.append(table)
    merged = pa.concat_tables([t.cast(es.arrow_schema()) if t.schema != es.arrow_schema() else t for t in shifted],
                              promote_options="default")
    groups = np.concatenate([b.rank_keys for b in bundles])
    # The merged bundle is a bundle of its own (a store keeps it apart from its sources),
    # and its events say which rank they ran on, as a data-parallel log's tasks do.
    sources = sorted({_session(b) for b in bundles})
    session = "merge-" + hashlib.sha256("\n".join(sources).encode()).hexdigest()[:12]
    merged = merged.set_column(merged.column_names.index(es.SESSION), es.arrow_schema().field(es.SESSION),
                               pa.DictionaryArray.from_arrays(pa.array(np.zeros(merged.num_rows, np.int32)),
                                                              pa.array([session])))
    merged = _with_rank_attributes(merged, np.array([-1 if r.rank is None else r.rank for r in ranks])[groups])
    return merged, groups, sources, session


def _write(output: Path, manifest: dict[str, Any], merged: Any, traced: Any, step_rows: list[dict[str, Any]],
           summary: dict[str, Any]) -> dict[str, Any]:
    """The merged bundle, through the writer every bundle goes through (its traces drawn
    from ``traced``: the events with their rank's track group and the steps' flows), with
    ``steps.csv`` beside it; returns its summary."""
    import io

    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    from dfit_mlir.exporters.bundle import BUNDLE_KIND, write_files

    steps = io.BytesIO()
    pacsv.write_csv(pa.Table.from_pylist(step_rows, schema=pa.schema([
        ("step", pa.int64()), ("ranks", pa.int64()), ("first_rank", pa.string()), ("last_rank", pa.string()),
        ("spread_ns", pa.int64())])), steps)
    with atomic.atomic_directory(output, kind=BUNDLE_KIND) as tmp:
        pq.write_table(merged, tmp / "events.parquet", compression="zstd")
        document = write_files(tmp, manifest, summary, trace_batches=lambda: traced.to_batches(max_chunksize=65_536),
                               extra_files={"steps.csv": steps.getvalue().decode()})
    return document


def _check_distinct_runs(bundles: list[_Bundle]) -> None:
    """Refuse two bundles of one run (a bundle and a copy of it: the same session): they
    are not two ranks, and merged they would count every event twice."""
    seen: dict[str, Path] = {}
    for bundle in bundles:
        session = _session(bundle)
        first = seen.setdefault(session, bundle.path)
        if first != bundle.path:
            raise InvalidInputError(f"{bundle.path}: the same run as {first} (session {session[:40]}; a copy?); "
                                    "each bundle given to merge is one rank or part of the job")


def _no_negative_times(bundles: list[_Bundle], offsets: list[int]) -> list[int]:
    """``offsets`` moved together so that no shifted start is negative (a rank whose
    clock runs ahead is shifted back; the alignment between ranks is unchanged)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    earliest = None
    for bundle in bundles:
        starts = bundle.events.column(es.START_NS)
        for rank in np.unique(bundle.rank_keys).tolist():
            mine = starts.filter(pa.array(bundle.rank_keys == rank))
            low = pc.min(mine).as_py()
            if low is not None and (earliest is None or low + offsets[rank] < earliest):
                earliest = low + offsets[rank]
    if earliest is None or earliest >= 0:
        return offsets
    return [offset - earliest for offset in offsets]


def _session(bundle: _Bundle) -> str:
    """A source bundle's session, found as ``dfit collect`` finds it (its run ID there):
    its events', else its summary's (a run with no events)."""
    if es.SESSION in bundle.events.column_names and bundle.events.num_rows:
        return str(bundle.events.column(es.SESSION)[0].as_py())
    if bundle.summary.get("session"):
        return str(bundle.summary["session"])
    return str(bundle.path)


def _with_rank_attributes(events: Any, ranks: np.ndarray) -> Any:
    """``events`` with a ``rank`` attribute on each event of a known rank (``ranks``: per
    event, -1 for none) that does not name one yet."""
    import pyarrow as pa

    attributes = events.column(es.ATTRIBUTES).to_pylist()
    changed = False
    for row, rank in enumerate(ranks.tolist()):
        if rank < 0:
            continue
        text = attributes[row]
        if not text:
            attributes[row] = f'{{"rank": {rank}}}'
        elif '"rank"' not in text:
            try:
                values = json.loads(text)
            except json.JSONDecodeError:
                continue
            if not isinstance(values, dict):
                continue
            attributes[row] = json.dumps({**values, "rank": rank})
        else:
            continue
        changed = True
    if not changed:
        return events
    index = events.column_names.index(es.ATTRIBUTES)
    return events.set_column(index, events.schema.field(index), pa.array(attributes, events.schema.field(index).type))


def _with(rank: Rank, **changes: Any) -> Rank:
    from dataclasses import replace

    return replace(rank, **changes)
