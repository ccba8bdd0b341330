"""Plain-text summaries of a manifest for the terminal (``dfit show``, ``dfit compile``)."""

from __future__ import annotations

from typing import Any

from dfit_mlir.core.ids import op_name_of
from dfit_mlir.core.lineage import is_constant


def compile_report(result: Any) -> str:
    """What a tagged compile prints, whichever way it was started (``dfit compile``, the
    frontends' ``compile``): the files written, then :func:`attribution_summary`."""
    return f"wrote {result.vmfb}\nwrote {result.manifest_path}\n{attribution_summary(result.manifest)}"


def attribution_summary(manifest: dict[str, Any]) -> str:
    """One row per stage: ops, tagged share of non-constant ops, lineage classes, and
    the most common compiler-materialised kinds."""
    header = f"{'stage':<26}{'ops':>7}{'non-const':>10}{'tagged':>9}{'+nested':>9}{'pres':>6}{'fused':>6}{'split':>6}{'erased':>7}{'+const':>7}  untagged (top kinds)"
    lines = [f"per-stage attribution ({len(manifest['operators'])} source ops, mode {manifest.get('compile', {}).get('mode', '?')}):", header]
    in_dispatch = dispatch_fused(manifest)
    for stage in manifest["stages"]:
        lineage = _with_dispatch_fusion(stage["name"], stage["lineage"], manifest, in_dispatch)
        top = ", ".join(f"{kind} {count}" for kind, count in list(stage["materialised_by_kind"].items())[:3])
        lines.append(
            f"{stage['name']:<26}{stage['ops']:>7}{stage['non_constant_ops']:>10}{100 * stage['coverage']:>8.2f}%"
            f"{100 * stage.get('attributed', stage['coverage']):>8.2f}%"
            f"{lineage['preserved']:>6}{lineage['fused']:>6}{lineage['split']:>6}{lineage['erased']:>7}"
            f"{lineage.get('erased_constants', 0):>7}  {top}"
        )
    if in_dispatch:
        lines[0] += (f" fused from {DISPATCH_STAGE} on: the {len(in_dispatch)} IDs whose pieces share a dispatch "
                     "with another ID's (split over several ops or not)")
    partitions = manifest["partitions"]
    sites = partitions["dispatch_sites"]
    exports = partitions["exports"]
    attributed_sites = sum(1 for site in sites if site["ids"] or site["fused_ids"])
    attributed_exports = sum(1 for export in exports if export["ids"] or export["fused_ids"])
    lines.append(
        f"dispatches: {attributed_sites}/{len(sites)} call sites and {attributed_exports}/{len(exports)} exports attributed to source IDs"
    )
    shared = partitions.get("shared_materialisation") or []
    if shared:
        named = sum(1 for site in sites if site.get("shared_ids"))
        top = ", ".join(f"{row['id']} ({len(row['sites'])})" for row in shared[:3])
        lines.append(f"shared materialisation (merged empties/fills/constants, not fused): {len(shared)} IDs in "
                     f"{named} call sites, e.g. {top}")
    return "\n".join(lines)


#: The phase after which IREE's dispatches exist (``flow.dispatch.region``s).
DISPATCH_STAGE = "dispatch-creation"


def dispatch_fused(manifest: dict[str, Any]) -> set[str]:
    """IDs that compute in a dispatch together with another ID's computing op: each
    call site's root and its fused compute ops (:func:`_fused_compute`), where there are
    two or more. An ID lowered to several ``linalg`` ops is fused when any of them shares
    a dispatch (a torch ``gelu`` split in four generics, one fused into the matmul's)."""
    operators = {op["id"]: op for op in manifest.get("operators", [])}
    found: set[str] = set()
    for site in manifest.get("partitions", {}).get("dispatch_sites", []):
        members = [site["root_id"], *_fused_compute(site, operators)] if site.get("root_id") else []
        if len(members) > 1:
            found.update(members)
    return found


def _with_dispatch_fusion(stage: str, counts: dict[str, int], manifest: dict[str, Any],
                          in_dispatch: set[str]) -> dict[str, int]:
    """A stage's lineage counts with the IDs of :func:`dispatch_fused` moved to ``fused``
    from the stage where dispatches exist on (where the ID is not erased), out of the
    class their letter gives (``split`` takes precedence over ``fused`` in the lineage
    letters, :mod:`dfit_mlir.core.lineage`)."""
    lineage = manifest.get("lineage") or {}
    stages = list(lineage.get("stages") or [])
    if not in_dispatch or DISPATCH_STAGE not in stages or stage not in stages \
            or stages.index(stage) < stages.index(DISPATCH_STAGE):
        return counts
    position = stages.index(stage)
    names = {letter: name for name, letter in (lineage.get("legend") or {}).items()}
    moved = dict(counts)
    for op_id in in_dispatch:
        letters = (lineage.get("classes") or {}).get(op_id, "")
        name = names.get(letters[position]) if position < len(letters) else None
        if name in ("preserved", "split"):
            moved[name] -= 1
            moved["fused"] += 1
    return moved


def _fused_compute(site: dict[str, Any], operators: dict[str, dict[str, Any]]) -> list[str]:
    """The site's fused ops other than its root that compute: not a constant or an empty
    tensor (ops consuming no value), and not in the region body of another op of the site (an op inside an ``scf.while``/``scf.if``/
    ``scf.for`` is top level in its dispatch although its ID's scope has a ``#``)."""
    members = set(site["fused_ids"])
    found = []
    for op_id in site["fused_ids"]:
        kind = op_name_of(op_id)
        if op_id == site["root_id"] or kind is None or is_constant(kind):
            continue
        op = operators.get(op_id)
        if op is not None and not op.get("operands"):
            continue
        parent = op.get("parent") if op is not None else op_id.rpartition("/")[0]
        if parent not in members:
            found.append(op_id)
    return found


def dispatch_summary(manifest: dict[str, Any]) -> str:
    """Each call site: export, root ID, the other top-level compute ops fused in, and the
    shared materialisation it names (listed apart: not fusion)."""
    operators = {op["id"]: op for op in manifest.get("operators", [])}
    lines = ["dispatch call sites in program order:"]
    for site in manifest["partitions"]["dispatch_sites"]:
        fused = _fused_compute(site, operators)
        shared = site.get("shared_ids") or []
        lines.append(f"  #{site['index']:<3} {site['export']:<52} root {site['root_id']}; fused: {', '.join(fused) or '-'}"
                     + (f"; shared: {', '.join(shared)}" if shared else ""))
    return "\n".join(lines)


def pass_histories(manifest: dict[str, Any], patterns: tuple[str, ...], source: object = "manifest") -> str:
    """Each matching ID's class per phase and the passes that changed it (``dfit show
    --passes``)."""
    from fnmatch import fnmatchcase

    from dfit_mlir.core.errors import InvalidInputError
    from dfit_mlir.passes.pass_history import class_name, from_table

    table = manifest.get("pass_history")
    if table is None:
        raise InvalidInputError(f"{source}: no pass history; compile with `dfit compile --dfit-tag --mode full "
                                "--lineage passes`")
    classes = manifest["lineage"]["classes"]
    stages = manifest["lineage"]["stages"]
    chosen = [item for item in classes if any(fnmatchcase(item, pattern) for pattern in patterns)]
    if not chosen:
        raise InvalidInputError(f"{source}: no source ID matches {', '.join(patterns)}")
    by_id: dict[str, list] = {}
    for change in from_table(table):
        by_id.setdefault(change.id, []).append(change)
    lines = []
    for item in chosen:
        letters = classes[item]
        lines += _wrapped(f"{item}: " + " ".join(f"{stage}={class_name(letter)}"
                                                for stage, letter in zip(stages, letters, strict=True)), "", "    ")
        changes = by_id.get(item, [])
        if not changes:
            lines.append("  no pass changed its class")
        for change in changes:
            what = (f"{class_name(change.before)} → {class_name(change.after)}" if change.before != change.after
                    else class_name(change.after))
            region = f"; into the dispatch region of {_first(change.dispatch)}" if change.dispatch else ""
            # One line per pass (what it did, where); what it did it with, wrapped below it.
            lines.append(f"  #{change.pass_index:<5} {change.phase:<26} {change.pass_name} {what}{region}")
            if change.with_ids:
                lines += _wrapped(f"with {_first(change.with_ids)}", "          ")
            lines += _wrapped(f"ops: {_counted(change.kinds_before)} → {_counted(change.kinds_after)}", "          ")
    return "\n".join(lines)


#: Width ``show --passes`` wraps its lines at (a pass that fuses hundreds of ops names them all).
PASS_TEXT_WIDTH = 100


def _wrapped(text: str, indent: str, more: str | None = None) -> list[str]:
    """``text`` broken at spaces into lines of at most :data:`PASS_TEXT_WIDTH`: the first
    starts with ``indent``, the others with ``more`` (default: two spaces deeper); a word
    longer than the width stays whole."""
    import textwrap

    return textwrap.wrap(text, PASS_TEXT_WIDTH, initial_indent=indent,
                         subsequent_indent=indent + "  " if more is None else more,
                         break_long_words=False, break_on_hyphens=False) or [indent.rstrip()]


def _first(ids: tuple[str, ...], shown: int = 4) -> str:
    """The first ``shown`` IDs, and how many more."""
    return ", ".join(ids[:shown]) + (f" … (+{len(ids) - shown})" if len(ids) > shown else "")


def _counted(kinds: tuple[str, ...]) -> str:
    """Op kinds with repeats counted, in first-seen order: ``linalg.generic ×12, arith.addf``."""
    from collections import Counter

    counts = Counter(kinds)
    return ", ".join(kind if counts[kind] == 1 else f"{kind} ×{counts[kind]}" for kind in counts) or "-"
