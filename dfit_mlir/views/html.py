"""``dfit view``: one self-contained HTML file that links a model's source lines, module
tree, IREE phases and dispatches (all script and style inline, no network, opens from disk).

Figures come only from the ledger (:mod:`dfit_mlir.analysis.ledger`): per-op rollups for source
lines and modules, per-partition rollups for dispatches. A line's figure is its share of
the ledger's attributed time (:meth:`~dfit_mlir.analysis.ledger.Ledger.share`, the share
every tool prints), or of the model's FLOPs when no time reached an op (nothing was run,
or a reconstructed run log timed whole steps only); the icicle's widths are
the ledger's module tree, per phase. Per-invocation min/median/max of a dispatch are the
ledger's per-instance sums. FLOPs are per trip (each op once, as the program says); a
run's **executed** FLOPs (per trip × the run's dispatch events, so a loop body counts
every trip) are the ledger's too: a column of the dispatch table (over the run, and per
invocation), a width of the icicle ("executed FLOPs", per module) and the header's total
per invocation; ``None`` (shown "-", with the reason) where no run counted executions
(:attr:`~dfit_mlir.analysis.ledger.Ledger.executed_unknown`). Where only the manifest's
static trip counts give them (a manifest alone, a run without dispatch events), the
per-invocation figures are those and ``executed.basis`` says so (``manifest trips``). The attained FLOP/s of the
roofline is executed work over time. The page's script sums nothing but a collapsed group's rows. An op's *site* is
:func:`~dfit_mlir.analysis.tools.builtin.semantic_attribution.op_site`: a model-code line whose
file exists is shown in its file's text; anything else (ONNX/TFLite node names,
reconstructions) is a row of the node-name tree.

The page opens on the answer: the hottest site (``hottest``, the largest share) selected and
scrolled into view, its file listed first (each file's ``share``); ``#line=``/``#op=`` links
scroll to what they select; the dispatch table is sorted by time (FLOPs when nothing ran),
load-time work (``load``: dispatches only initializers run) last. A bundle's named
measurements (a reconstructed run log's losses, rates, step windows, compile phases:
:func:`measurement_table`) are a timeline and a table; a run log without ops shows only those.

The page data is a set of column tables; every string is stored once in ``strings`` and
referred to by index (see :class:`Interner`), so repeated module paths, op kinds and
export names cost one entry each.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from dfit_mlir.analysis import ledger
from dfit_mlir.analysis.model import SemanticModel
from dfit_mlir.analysis.tools.builtin.semantic_attribution import op_site
from dfit_mlir.core import module_paths, reading
from dfit_mlir.frontends import CodeRules

OUTPUT_KIND = "view"
#: Files above this size are not embedded (a generated file is not the model's code).
MAX_SOURCE_BYTES = reading.MAX_SOURCE_BYTES
TEMPLATE = "view_template.html"
DATA_MARK = "/*DFIT_VIEW_DATA*/null"


@dataclass
class Interner:
    """Strings stored once; tables hold their indices (``-1``: none)."""

    strings: list[str] = field(default_factory=list)
    index: dict[str, int] = field(default_factory=dict)

    def __call__(self, text: str | None) -> int:
        if text is None:
            return -1
        found = self.index.get(text)
        if found is None:
            found = self.index[text] = len(self.strings)
            self.strings.append(text)
        return found


def render(path: str | Path, rules: CodeRules | None = None) -> str:
    """The HTML text of the view of a bundle or manifest at ``path``."""
    model = SemanticModel.open(path)
    data = view_data(model, rules)
    page = resources.files("dfit_mlir.views").joinpath(TEMPLATE).read_text(encoding="utf-8")
    return page.replace(DATA_MARK, script_json(data), 1)


#: Characters that could change the HTML parser's state inside a <script> (``</script``,
#: ``<!--``, ``<script``) or end a JS line: written as JSON escapes, which mean the same.
_INERT = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028",
                        "\u2029": "\\u2029"})


def script_json(data: Any) -> str:
    """``data`` as JSON that is inert inside an inline <script>: every ``<``, ``>``, ``&``
    and U+2028/2029 escaped (the standard way; strings read back the same)."""
    return json.dumps(data, separators=(",", ":"), allow_nan=False).translate(_INERT)


def view_data(model: SemanticModel, rules: CodeRules | None = None) -> dict[str, Any]:
    """The page's tables (see the module doc); every figure from ``ledger.of(model)``."""
    book = ledger.of(model)
    strings = Interner()
    ops = list(model.operators.values())
    op_index = {op.id: n for n, op in enumerate(ops)}
    by_op = _rollup(book, "op_id")
    measured = book.totals.measured_ns
    # FLOPs where no time reached an op: nothing ran, or a run log timed whole steps only.
    weight = "time" if measured and book.attributed_time_ns else "flops"
    sites = _sites(model, ops, rules or CodeRules.default())
    files, site_rows, op_site_index = _site_table(model, ops, sites, strings)
    refused = site_rows.pop("refused")
    site_rows["share"] = _site_shares(book, ops, op_site_index, len(site_rows["file"]), weight)
    _file_shares(book, ops, op_site_index, site_rows, files, weight)
    modules, op_module = _module_table(model, ops, strings)
    modules["figures"] = _module_figures(book, ops, modules, strings)
    lineage = model.manifest.get("lineage") or {}
    data: dict[str, Any] = {
        "title": str(model.manifest.get("input", {}).get("path") or model.source),
        "source": model.source, "backend": model.backend,
        "mode": model.manifest.get("compile", {}).get("mode"), "run": model.events_path is not None,
        "measured_ns": measured, "attributed_pct": book.totals.attributed_pct,
        "attributed_ns": book.attributed_time_ns, "share_basis": ledger.SHARE_BASIS if weight == "time" else "FLOPs",
        "time_model": book.time_models_label(), "weight": weight,
        "executed": {"flops": _maybe(book.executed_totals["executed_flops"]),
                     "flops_per_invocation": _maybe(book.flops_per_invocation),
                     "instances": book.instances, "unknown": book.executed_unknown, "basis": book.executed_basis,
                     "per_invocation_unknown": book.per_invocation_unknown},
        "stages": list(lineage.get("stages") or []),
        "legend": {letter: name for name, letter in (lineage.get("legend") or
                   {"preserved": "p", "fused": "f", "split": "s", "erased": "e"}).items()},
        "ops": {
            "id": [strings(op.id) for op in ops], "kind": [strings(op.op) for op in ops],
            "module": op_module, "phase": [strings(op.phase) for op in ops], "site": op_site_index,
            "time": [_num(by_op.get(op.id, {}).get("time_ns")) for op in ops],
            "flops": [_num(by_op.get(op.id, {}).get("flops")) for op in ops],
            "bytes": [_bytes(by_op.get(op.id, {})) for op in ops],
            "lineage": [strings((lineage.get("classes") or {}).get(op.id, "")) for op in ops],
        },
        "files": files, "source_refused": refused, "sites": site_rows, "modules": modules,
        "hottest": _hottest(site_rows["share"]),
        "dispatches": _dispatch_table(model, book, op_index, strings),
        "measurements": measurement_table(model, strings),
        **_roofline(model, book, strings),
        "passes": _pass_table(model, op_index, strings),
        "stage_ir": _stage_ir_table(model, ops, strings),
    }
    data["total_flops"] = _num(book.total_flops)
    data["strings"] = strings.strings
    return data


def _num(value: Any) -> float:
    return 0 if value is None else round(float(value), 3)


def _maybe(value: Any) -> float | None:
    """A figure that may be unknown (an executed one without a run): ``None`` stays."""
    return None if value is None else _num(value)


def _bytes(row: dict[str, Any]) -> float:
    return _num((row.get("bytes_read") or 0) + (row.get("bytes_written") or 0))


def _site_shares(book: ledger.Ledger, ops: list, op_site_index: list[int], count: int,
                 weight: str) -> list[float]:
    """Each site row's share of attributed time (FLOPs when nothing ran), the ledger's."""
    rolled = book.rollup_ops({op.id: site for op, site in zip(ops, op_site_index, strict=True) if site >= 0})
    share = book.share if weight == "time" else book.flop_share
    key = "time_ns" if weight == "time" else "flops"
    return [(share(rolled[site][key]) or 0) if site in rolled else 0 for site in range(count)]


def _file_shares(book: ledger.Ledger, ops: list, op_site_index: list[int], site_rows: dict[str, list],
                 files: list[dict[str, Any]], weight: str) -> None:
    """Each embedded file's ``share`` (the ledger's, as a line's): the page lists the
    hottest file first and says its share in the file's heading."""
    file_of = {op.id: site_rows["file"][site] for op, site in zip(ops, op_site_index, strict=True)
               if site >= 0 and site_rows["file"][site] >= 0}
    rolled = book.rollup_ops(file_of)
    share = book.share if weight == "time" else book.flop_share
    key = "time_ns" if weight == "time" else "flops"
    for index, entry in enumerate(files):
        entry["share"] = (share(rolled[index][key]) or 0) if index in rolled else 0


def _hottest(shares: list[float]) -> int:
    """The site row the page opens on: the largest share (the first of equals), -1 when
    no site has any."""
    best = max(range(len(shares)), key=lambda row: (shares[row], -row), default=-1)
    return best if best >= 0 and shares[best] > 0 else -1


#: The icicle's widths: page name → the ledger's module-tree figure (``executed_flops``:
#: over the whole run, 0 on every module where no run counted executions; the page
#: says why, ``executed.unknown``).
MODULE_FIGURES = (("time", "time_ns"), ("flops", "flops"), ("executed_flops", "executed_flops"),
                  ("bytes", "bytes"), ("ops", "ops"))


def _module_figures(book: ledger.Ledger, ops: list, modules: dict[str, list],
                    strings: Interner) -> dict[str, dict[str, list[float]]]:
    """Phase (``""``: all) → figure → inclusive value per module row, from the ledger's
    module tree (the icicle's widths; the page sums nothing)."""
    index = {strings.strings[code]: row for row, code in enumerate(modules["path"]) if code >= 0}
    phases = [""] + sorted({op.phase for op in ops if op.phase})
    found = {}
    for phase in phases:
        tree = book.module_tree([op.id for op in ops if not phase or op.phase == phase])
        columns = {name: [0.0] * len(index) for name, _ in MODULE_FIGURES}
        for path, node in tree.items():
            if path in index:
                for name, key in MODULE_FIGURES:
                    columns[name][index[path]] = _num(node.values[key])
        found[phase] = columns
    return found


def _rollup(book: ledger.Ledger, key: str) -> dict[Any, dict[str, Any]]:
    table = book.rollup(key)
    return {row[key]: row for row in table.to_pylist()}


def _sites(model: SemanticModel, ops: list, rules: CodeRules) -> list[tuple[str, str] | None]:
    return [op_site(model, op, rules) for op in ops]


def _source_roots(model: SemanticModel) -> reading.SourceRoots:
    """The folders whose files the page may show (:func:`dfit_mlir.core.reading.source_roots`)."""
    return reading.source_roots(model.bundle, None if model.bundle else Path(model.source), model.manifest)


def _site_table(model: SemanticModel, ops: list, sites: list, strings: Interner) -> tuple[list, dict, list[int]]:
    """(files, site rows, op → site row): a site is a line of an embedded file
    (``file`` ≥ 0, ``line``) or a node-name row (``file`` -1, ``name``)."""
    files: list[dict[str, Any]] = []
    refused: list[dict[str, Any]] = []  # "source not embedded: why", shown in the page
    roots = _source_roots(model)
    file_index: dict[str, int] = {}
    rows: dict[tuple[int, int | str], int] = {}
    table: dict[str, list] = {"file": [], "line": [], "name": []}
    op_site_index: list[int] = []
    for site in sites:
        key: tuple[int, int | str] | None = None
        if site is not None and site[1] == "source":
            name, line = site[0].rsplit(":", 1)
            if name not in file_index:
                found = reading.source_file(name, roots)
                file_index[name] = -1 if found.text is None else len(files)
                if found.text is not None:
                    files.append({"name": strings(name), "text": found.text})
                else:
                    refused.append({"name": strings(name), "why": found.why})
            key = (file_index[name], int(line)) if file_index[name] >= 0 else (-1, site[0])
        elif site is not None:
            key = (-1, site[0])
        if key is None:
            op_site_index.append(-1)
            continue
        if key not in rows:
            rows[key] = len(table["file"])
            table["file"].append(key[0])
            table["line"].append(key[1] if key[0] >= 0 else 0)
            table["name"].append(strings(key[1]) if key[0] < 0 else -1)
        op_site_index.append(rows[key])
    table["refused"] = refused
    return files, table, op_site_index


def _module_table(model: SemanticModel, ops: list, strings: Interner) -> tuple[dict[str, list], list[int]]:
    """Every module path and its ancestors (``parent`` index, -1 for the root) and each
    op's own module (-1: none said)."""
    index: dict[str, int] = {}
    table: dict[str, list] = {"path": [], "name": [], "parent": []}

    def add(path: str) -> int:
        found = index.get(path)
        if found is None:
            chain = module_paths.ancestry(path)
            parent = add(chain[-2]) if len(chain) > 1 else -1
            found = index[path] = len(table["path"])
            table["path"].append(strings(path))
            table["name"].append(strings(module_paths.leaf_name(path)))
            table["parent"].append(parent)
        return found

    op_module = []
    for op in ops:
        path = model.module_path(op.id)
        op_module.append(-1 if path is None else add(path))
    return table, op_module


def _dispatch_table(model: SemanticModel, book: ledger.Ledger, op_index: dict[str, int],
                    strings: Interner) -> dict[str, list]:
    from dfit_mlir.analysis.tools.builtin.program_analyzer import dispatch_workgroups

    by_part = _rollup(book, "partition")
    groups = dispatch_workgroups(model)
    load_time = _load_time_sites(model)
    table: dict[str, list] = {key: [] for key in ("name", "export", "kind", "root", "ops", "calls", "time", "flops",
                                                  "executed_flops", "executed_flops_per_invocation", "bytes", "min",
                                                  "median", "max", "workgroups", "load")}
    for part in model.partitions:
        table["load"].append(part.attributes.get("site") in load_time)
        row = by_part.get(part.id, {})
        spread = book.partition_time_spread(part.id)
        table["name"].append(strings(part.id))
        table["export"].append(strings(part.attributes.get("export")))
        table["kind"].append(strings(part.kind))
        table["root"].append(op_index.get(part.root_id or "", -1))
        table["ops"].append([op_index[i] for i in part.operator_ids if i in op_index])
        table["calls"].append(book.calls(part.id))
        table["time"].append(_num(book.partition_ns(part.id)))
        table["flops"].append(_num(row.get("flops")))
        work = book.partition_figures(part.id)
        table["executed_flops"].append(_maybe(work["executed_flops"]))
        table["executed_flops_per_invocation"].append(_maybe(book.per_invocation_of(work)))
        table["bytes"].append(_bytes(row))
        table["workgroups"].append(strings(groups.get(part.id)))
        for key, value in zip(("min", "median", "max"), spread or (None,) * 3, strict=True):
            table[key].append(None if spread is None else _num(value))
    return table


def _load_time_sites(model: SemanticModel) -> set[int]:
    """Dispatch sites only initializers run (the manifest's ``phase: load``): the
    dispatch table lists them after the invocation's own work."""
    sites = (model.manifest.get("partitions") or {}).get("dispatch_sites") or []
    return {site.get("index") for site in sites if isinstance(site, dict) and site.get("phase") == "load"}


#: Measurements the page lists at most (a run log holds hundreds; a bundle holding more
#: says how many it left out).
MAX_MEASUREMENTS = 5000
#: Event attributes the measurement table shows besides the event's own fields.
MEASUREMENT_ATTRIBUTES = ("unit", "origin", "run_scope", "phase")


def measurement_table(model: SemanticModel, strings: Interner) -> dict[str, Any]:
    """The bundle's named measurements (events with a ``name``: a reconstructed run log's
    losses, rates, step windows, compile phases): one row each, in the order of their
    start (undated ones last). ``start`` is ns after ``t0`` (the earliest start, epoch
    ns), ``None`` where the log gave no time; values are the events' own."""
    import pyarrow as pa
    import pyarrow.compute as pc

    columns = ("kind", "name", "value", "step", "start_ns", "duration_ns", "attributes")
    found: list[Any] = []
    total = 0
    for batch in model.event_batches():
        if "name" not in batch.column_names:
            continue
        named = batch.filter(pc.is_valid(batch.column("name")))
        total += named.num_rows
        if named.num_rows and sum(t.num_rows for t in found) < MAX_MEASUREMENTS:
            found.append(pa.Table.from_batches([named]).select(list(columns)))
    rows = pa.concat_tables(found).to_pylist()[:MAX_MEASUREMENTS] if found else []
    starts = [row["start_ns"] for row in rows if row["start_ns"] is not None]
    t0 = min(starts) if starts else None
    order = sorted(range(len(rows)), key=lambda n: (rows[n]["start_ns"] is None, rows[n]["start_ns"] or 0, n))
    table: dict[str, Any] = {key: [] for key in ("kind", "name", "value", "step", "start", "duration",
                                                 *MEASUREMENT_ATTRIBUTES)}
    for n in order:
        row = rows[n]
        attributes = _attributes(row["attributes"])
        table["kind"].append(strings(str(row["kind"])))
        table["name"].append(strings(str(row["name"])))
        table["value"].append(_figure(row["value"]))
        table["step"].append(row["step"])
        table["start"].append(None if row["start_ns"] is None or t0 is None else row["start_ns"] - t0)
        table["duration"].append(row["duration_ns"])
        for key in MEASUREMENT_ATTRIBUTES:
            value = attributes.get(key)
            table[key].append(strings(str(value)) if value is not None else -1)
    return {"t0": t0, "total": total, **table}


def _attributes(text: str | None) -> dict[str, Any]:
    try:
        found = json.loads(text) if text else {}
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def _figure(value: float | None) -> float | None:
    """A measured value to 6 significant digits (a loss keeps its decimals); non-finite
    values are ``None`` (JSON has no NaN)."""
    import math

    if value is None or not math.isfinite(value):
        return None
    return float(f"{value:.6g}")


def _roofline(model: SemanticModel, book: ledger.Ledger, strings: Interner) -> dict[str, Any]:
    """The roof (``None`` without a profile, and why) and each partition's position."""
    from dfit_mlir.views import roofline

    profile, why = roofline.profile_of(model)
    columns = roofline.table(model, book, profile)
    for key in ("intensity", "flops_per_s", "bytes_per_s", "roof", "pct"):
        columns[key] = [None if value is None else _num(value) for value in columns[key]]
    for key in ("bound", "bandwidth_roof"):
        columns[key] = [strings(value) for value in columns[key]]
    return {"roof": None if profile is None else roofline.roof(profile).as_dict(), "roof_note": why,
            "roofline": columns}


def _pass_table(model: SemanticModel, op_index: dict[str, int], strings: Interner) -> dict[str, list]:
    """The passes that changed an op's lineage class, where the compile recorded them."""
    table: dict[str, list] = {"op": [], "phase": [], "pass": [], "from": [], "to": []}
    history = model.manifest.get("pass_history")
    if not history:
        return table
    from dfit_mlir.passes.pass_history import from_table

    for change in from_table(history, model.source):
        if change.id in op_index:
            table["op"].append(op_index[change.id])
            table["phase"].append(strings(change.phase))
            table["pass"].append(strings(change.pass_name))
            table["from"].append(change.before)
            table["to"].append(change.after)
    return table


def _stage_ir_table(model: SemanticModel, ops: list, strings: Interner) -> dict[str, Any] | None:
    """The printed IR of each op's carriers at each lineage stage, from the manifest's
    ``stage_ir`` table (``passes/stage_ir.py``); None where the compile did not record it
    (older manifests, reconstructions: the panel says "IR not recorded").

    ``carriers``: distinct ``[ops carrying the ID, text string index...]``; ``ops[i]``:
    for op ``i``, one carrier index per lineage stage (-1: no op carries it; -2: that
    stage was not recorded), or None for an op the table does not list."""
    table = model.manifest.get("stage_ir")
    if not table:
        return None
    from dfit_mlir.core.errors import InvalidInputError
    from dfit_mlir.core.stage_ir_table import read_table

    try:
        decoded = read_table(table)
    except ValueError as error:
        raise InvalidInputError(f"{model.source}: {error}") from None
    stages = list((model.manifest.get("lineage") or {}).get("stages") or [])
    columns = [decoded.stages.get(stage) for stage in stages]
    position = {source_id: k for k, source_id in enumerate(decoded.ids)}
    carriers: list[list[int]] = []
    remapped: dict[int, int] = {}

    def carrier(entry: int) -> int:
        if entry < 0:
            return entry
        found = remapped.get(entry)
        if found is None:
            count, *indices = decoded.carriers[entry]
            found = remapped[entry] = len(carriers)
            carriers.append([count, *(strings(decoded.texts[t]) for t in indices)])
        return found

    by_op: list[list[int] | None] = []
    for op in ops:
        k = position.get(op.id)
        by_op.append(None if k is None else [-2 if column is None else carrier(column[k]) for column in columns])
    return {"carriers": carriers, "ops": by_op}
