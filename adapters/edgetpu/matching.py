"""Matching the files of one Edge TPU compile: original ``.tflite``, compiled
``*_edgetpu.tflite``, operation log and console summary, into one reconstruction.

How files are grouped (one group per compiled model, named by the original model's stem):

* compiled ``X_edgetpu.tflite`` (or ``X_cocompiled_with_Y_edgetpu.tflite``) and original
  ``X.tflite`` in the same directory; the operation log ``X_edgetpu.log`` next to them, or
  a log in that directory whose ``Input:``/``Output:`` lines name those files. A compiled
  model whose original is elsewhere (a co-compile written to its own directory) takes
  the one given ``X.tflite`` that no other compiled model took;
* a log and an original without a compiled model form a group too, as does any file
  left alone;
* a console summary block attaches to the group whose compiled model, log or original
  has the file name the block prints (the printed paths are relative to where the
  compiler ran, so only the file name is compared; an ambiguous name attaches nowhere).

How ops are matched (original <-> compiled), per subgraph index:

* an ``edgetpu-custom-op`` keeps the NAMES of the original tensors at its boundary: its
  inputs are the original tensors it reads, its outputs the original tensors it writes.
  The original ops it absorbed are found by walking the original graph backwards from
  the producers of its output tensors, stopping at its input tensors (and at graph inputs
  and constants);
* every other op of the compiled model runs on the CPU and is the original op that
  produces the tensor of the same name (it must have the same op type).

Records of a matched group: the original model's ops (IDs scoped by the original file's
stem) with ``partition`` and ``status`` set, plus each custom op (scoped by the compiled
file's stem) listing the absorbed ops in ``attributes["absorbed_operator_ids"]``. A
compiled CPU op matched to an original op is folded into it (the original record gets
``attributes["compiled_op"]``), and compiled tensors are folded into the original tensors
of the same name; anything that does not match is kept as it is and reported in a
coverage note, as is every disagreement with the operation log's counts.

IDs in a reconstruction are always scoped by the model file's stem
(``yolov8n_full_integer_quant/subgraph0/CONV_2D#3``) so that the ops of the original and
of the compiled model, or of several models, never collide; a stem shared by two files
gets its directory name in front.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dfit_mlir.adapters.coverage import Notes, assess, graded
from dfit_mlir.adapters.recovery import (
    ArtifactError,
    Coverage,
    CoverageNote,
    Measurement,
    RecoveredOperator,
    RecoveredPartition,
    RecoveredTensor,
    Recovery,
    SourceArtifact,
    files_of,
    readers_of,
    source_artifact,
)

from .console import (
    ConsoleModel,
    ConsoleSummary,
    ConsoleSummaryReader,
    console_attributes,
    console_measurements,
)
from .oplog import (
    MAPPED,
    OperationLog,
    OperationLogReader,
    RowLinks,
    log_attributes,
    log_measurements,
)
from .tflite_model import (
    BACKEND,
    EDGETPU_CUSTOM_OP,
    TFLiteModel,
    TFLiteModelReader,
    TFLiteOperator,
    TFLiteSubgraph,
    build_operator,
    build_tensors,
    cpu_partition_id,
    edgetpu_partition_id,
    model_attributes,
    operator_macs,
    scoped,
    to_recovery,
)

#: Status of a CPU op when the log does not say which of its type's statuses it got.
CPU = "cpu"

#: One reader per format, the most specific first.
READERS = (TFLiteModelReader, OperationLogReader, ConsoleSummaryReader)


def original_stem(compiled_stem: str) -> str:
    """``x_edgetpu`` -> ``x``; ``a_cocompiled_with_b_edgetpu`` -> ``a``."""
    stem = compiled_stem.removesuffix("_edgetpu")
    return stem.split("_cocompiled_with_", 1)[0]


# ---------------------------------------------------------------------------- op matching


@dataclass(frozen=True)
class CustomOpMatch:
    """One ``edgetpu-custom-op`` and the original ops (indices in its subgraph) it holds."""

    ordinal: int
    op: TFLiteOperator
    absorbed: tuple[int, ...]
    #: Boundary tensor names the original model does not have.
    unknown_boundaries: tuple[str, ...]


@dataclass(frozen=True)
class ModelMatch:
    custom_ops: tuple[CustomOpMatch, ...]
    #: (subgraph, compiled op index) -> original op index, for compiled CPU ops.
    cpu: dict[tuple[int, int], int]
    #: Compiled CPU ops without an original op of the same output name and type.
    unmatched_cpu: tuple[TFLiteOperator, ...]
    problems: tuple[str, ...]


def match_models(original: TFLiteModel, compiled: TFLiteModel) -> ModelMatch:
    """Which original ops each custom op absorbed and which run on the CPU."""
    custom_ops: list[CustomOpMatch] = []
    cpu: dict[tuple[int, int], int] = {}
    unmatched: list[TFLiteOperator] = []
    problems: list[str] = []
    absorbed_by: dict[tuple[int, int], str] = {}
    for compiled_graph in compiled.subgraphs:
        if compiled_graph.index >= len(original.subgraphs):
            problems.append(f"compiled subgraph {compiled_graph.index} has no original counterpart")
            unmatched.extend(op for op in compiled_graph.operators if not op.is_edgetpu)
            continue
        graph = original.subgraphs[compiled_graph.index]
        by_name, duplicated = _tensors_by_name(graph)
        if duplicated:
            problems.append(
                f"subgraph {graph.index}: tensor names used twice in the original, matched to the "
                f"first: {sorted(duplicated)[:5]}"
            )
        producer = {t: op.index for op in graph.operators for t in op.outputs}
        for op in compiled_graph.operators:
            outputs = [compiled_graph.tensors[i].name for i in op.outputs]
            if op.is_edgetpu:
                inputs = [compiled_graph.tensors[i].name for i in op.inputs if i >= 0]
                match = _absorbed(graph, producer, by_name, len(custom_ops), op, inputs, outputs)
                for index in match.absorbed:
                    if (graph.index, index) in absorbed_by:
                        problems.append(
                            f"{graph.operators[index].id} is inside both "
                            f"{absorbed_by[graph.index, index]} and {op.id}"
                        )
                    absorbed_by[graph.index, index] = op.id
                custom_ops.append(match)
                continue
            found = {
                producer[by_name[name]] for name in outputs if name in by_name and by_name[name] in producer
            }
            original_op = graph.operators[found.pop()] if len(found) == 1 else None
            if original_op is None or original_op.op_type != op.op_type:
                unmatched.append(op)
            else:
                cpu[graph.index, op.index] = original_op.index
    for (s, _), index in cpu.items():
        if (s, index) in absorbed_by:
            problems.append(
                f"{original.subgraphs[s].operators[index].id} runs on the CPU and is also inside "
                f"{absorbed_by[s, index]}"
            )
    for graph in original.subgraphs:
        placed = {i for (s, i) in absorbed_by if s == graph.index} | {
            i for (s, _), i in cpu.items() if s == graph.index
        }
        lost = [op.id for op in graph.operators if op.index not in placed]
        if lost:
            problems.append(
                f"{len(lost)} original op(s) neither inside a custom op nor on the CPU: {lost[:5]}"
            )
    if unmatched:
        problems.append(
            f"{len(unmatched)} compiled CPU op(s) match no original op by output name and type: "
            f"{[op.id for op in unmatched[:5]]}"
        )
    for custom in custom_ops:
        if custom.unknown_boundaries:
            problems.append(
                f"{custom.op.id}: boundary tensors not in the original model: "
                f"{list(custom.unknown_boundaries[:5])}"
            )
    return ModelMatch(tuple(custom_ops), cpu, tuple(unmatched), tuple(problems))


def check_same_model(original: TFLiteModel, compiled: TFLiteModel) -> None:
    """Refuse an original/compiled pair that cannot be one model: ``edgetpu_compiler``
    keeps the names of the tensors at every custom op's and CPU op's boundary, so a
    compiled model sharing no tensor name with its supposed original was compiled from
    another model (a renamed or mixed-up file) and matching it would report nonsense."""
    original_names = {t.name for graph in original.subgraphs for t in graph.tensors if t.name}
    compiled_names = {t.name for graph in compiled.subgraphs for t in graph.tensors if t.name}
    if compiled_names and not compiled_names & original_names:
        raise ArtifactError.at(
            compiled.path, None,
            f"not compiled from {original.path} (paired by file name): none of its {len(compiled_names)} "
            "tensor names is in that model; give the original it was compiled from, or the compiled model alone")


def _tensors_by_name(graph: TFLiteSubgraph) -> tuple[dict[str, int], set[str]]:
    by_name: dict[str, int] = {}
    duplicated = set()
    for tensor in graph.tensors:
        if tensor.name is None:
            continue
        if tensor.name in by_name:
            duplicated.add(tensor.name)
        else:
            by_name[tensor.name] = tensor.index
    return by_name, duplicated


def _absorbed(
    graph: TFLiteSubgraph,
    producer: dict[int, int],
    by_name: dict[str, int],
    ordinal: int,
    op: TFLiteOperator,
    inputs: Sequence[str | None],
    outputs: Sequence[str | None],
) -> CustomOpMatch:
    unknown = tuple(name or "<unnamed>" for name in (*inputs, *outputs) if name not in by_name)
    stop = {by_name[name] for name in inputs if name in by_name}
    pending = [producer[by_name[name]] for name in outputs if name in by_name and by_name[name] in producer]
    absorbed: set[int] = set()
    while pending:
        index = pending.pop()
        if index in absorbed:
            continue
        absorbed.add(index)
        for tensor in graph.operators[index].inputs:
            if tensor >= 0 and tensor not in stop and tensor in producer:
                pending.append(producer[tensor])
    return CustomOpMatch(ordinal, op, tuple(sorted(absorbed)), unknown)


# ---------------------------------------------------------------------------- grouping


@dataclass
class ModelGroup:
    """The files of one model's compile (filled while grouping, read-only after)."""

    #: The original model's stem.
    name: str
    compiled: TFLiteModel | None = None
    original: TFLiteModel | None = None
    log: OperationLog | None = None
    console: list[tuple[ConsoleSummary, int]] = field(default_factory=list)
    #: Unique among the groups of one reconstruction (``name`` unless two groups share it).
    key: str = ""

    def directory(self) -> Path:
        first = self.compiled or self.original or self.log
        assert first is not None
        return first.path.parent

    def file_names(self) -> dict[str, str]:
        """The group's file names, under the console summary's key for each."""
        names = {}
        if self.compiled:
            names["output_model"] = self.compiled.path.name
        if self.log:
            names["operation_log"] = self.log.path.name
        if self.original:
            names["input_model"] = self.original.path.name
        return names


@dataclass
class _Inputs:
    models: list[TFLiteModel] = field(default_factory=list)
    logs: list[OperationLog] = field(default_factory=list)
    consoles: list[ConsoleSummary] = field(default_factory=list)
    sources: list[SourceArtifact] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)



def _read_all(paths: Iterable[Path | str]) -> _Inputs:
    inputs = _Inputs()
    for path in files_of(paths, READERS):
        reader = next(iter(readers_of(READERS, path)), None)
        if reader is None:
            inputs.ignored.append(str(path))
        elif reader is TFLiteModelReader:
            inputs.models.append(TFLiteModelReader(path).model())
            inputs.sources.append(source_artifact(path, reader.format, TFLiteModelReader.parser))
        elif reader is OperationLogReader:
            logs = OperationLogReader(path).logs()  # one per compile pasted into the file
            inputs.logs.extend(logs)
            inputs.sources.append(source_artifact(path, reader.format, lines=logs[0].lines))
        elif reader is ConsoleSummaryReader:
            inputs.consoles.append(ConsoleSummaryReader(path).summary())
            inputs.sources.append(source_artifact(path, reader.format, lines=inputs.consoles[-1].lines))
    return inputs


def check_roles(models: Sequence[TFLiteModel]) -> None:
    """Refuse a pair whose names contradict their contents: ``edgetpu_compiler`` writes
    ``X_edgetpu.tflite`` (holding an ``edgetpu-custom-op``) from ``X.tflite``, and even a
    compile that maps nothing keeps the custom op of a model compiled before. So a
    compiled ``X.tflite`` beside an uncompiled ``X_edgetpu.tflite`` is a swapped pair;
    matched by name it would give the wrong ops on the wrong side, read apart two models."""
    by_place = {(m.path.parent, m.path.name): m for m in models}
    for model in models:
        if not model.is_compiled or model.path.stem.endswith("_edgetpu"):
            continue
        partner = by_place.get((model.path.parent, f"{model.path.stem}_edgetpu{model.path.suffix}"))
        if partner is not None and not partner.is_compiled:
            raise ArtifactError.at(
                model.path, None,
                f"holds an Edge TPU compiled model (edgetpu-custom-op) while {partner.path.name} beside it holds "
                "an uncompiled one: the original/compiled pair looks swapped (edgetpu_compiler writes "
                f"{partner.path.name} from {model.path.name}); give each file its own name back")


def _group(inputs: _Inputs, scopes: dict[Path, str]) -> tuple[list[ModelGroup], list[str]]:
    """Groups of files of one model; and the console blocks that attach to none."""
    originals = [m for m in inputs.models if not m.is_compiled]
    logs = list(inputs.logs)
    groups: list[ModelGroup] = []

    def take_log(compiled: TFLiteModel) -> OperationLog | None:
        # The log that names this output first: a file of several pasted logs has one
        # file name for all of them.
        for by_name in (True, False):
            for log in logs:
                names = {Path(log.output_model or "").name} if by_name else {log.path.stem + ".tflite"}
                if log.path.parent == compiled.path.parent and compiled.path.name in names:
                    logs.remove(log)
                    return log
        return None

    def take_original(directory: Path | None, names: set[str]) -> TFLiteModel | None:
        candidates = [m for m in originals if m.path.name in names and directory in (None, m.path.parent)]
        if len(candidates) != 1:
            return None
        originals.remove(candidates[0])
        return candidates[0]

    for compiled in (m for m in inputs.models if m.is_compiled):
        base = original_stem(compiled.path.stem)
        log = take_log(compiled)
        names = {base + ".tflite"} | ({Path(log.input_model).name} if log and log.input_model else set())
        groups.append(ModelGroup(base, compiled, take_original(compiled.path.parent, names), log))
    for group in groups:
        if group.original is None:
            group.original = take_original(None, {group.name + ".tflite"})
    for log in logs:
        names = {Path(log.input_model or "").name, log.path.stem.removesuffix("_edgetpu") + ".tflite"}
        groups.append(ModelGroup(log.model, None, take_original(log.path.parent, names), log))
    groups.extend(ModelGroup(model.path.stem, None, model, None) for model in originals)

    taken: set[str] = set()
    for group in sorted(groups, key=lambda g: not (g.compiled and g.original)):  # matched groups first
        group.key = group.name
        if group.key in taken:  # e.g. one model compiled alone and co-compiled: name by the output
            group.key = (
                scopes[group.compiled.path] if group.compiled else f"{group.name} ({group.directory()})"
            )
        if group.key in taken and group.log is not None:  # one model's log pasted twice into a file
            group.key = f"{group.key} [{group.log.run_scope}]"
        taken.add(group.key)

    unattached = []
    for summary in inputs.consoles:
        for position, block in enumerate(summary.models):
            group = _group_of_block(groups, block)
            if group is None:
                unattached.append(f"{summary.path}:{block.line} ({block.input_model})")
            else:
                group.console.append((summary, position))
    return groups, unattached


def _group_of_block(groups: Sequence[ModelGroup], block: ConsoleModel) -> ModelGroup | None:
    for key in ("output_model", "operation_log", "input_model"):
        printed = getattr(block, key)
        if not printed:
            continue
        candidates = [g for g in groups if g.file_names().get(key) == Path(printed).name]
        if len(candidates) > 1:  # prefer the file whose path ends with the printed one
            candidates = [
                g for g in candidates if (g.directory() / Path(printed).name).as_posix().endswith(printed)
            ]
        if len(candidates) == 1:
            return candidates[0]
    return None


def _scopes(models: Sequence[TFLiteModel]) -> dict[Path, str]:
    stems = Counter(m.path.stem for m in models)
    scopes = {
        m.path: m.path.stem if stems[m.path.stem] == 1 else f"{m.path.parent.name}/{m.path.stem}"
        for m in models
    }
    if len(set(scopes.values())) < len(scopes):
        scopes = {m.path: m.path.with_suffix("").as_posix() for m in models}
    return scopes


# ---------------------------------------------------------------------------- rendering


@dataclass
class _Parts:
    """The records a reconstruction collects, group by group."""

    operators: list[RecoveredOperator] = field(default_factory=list)
    tensors: list[RecoveredTensor] = field(default_factory=list)
    partitions: list[RecoveredPartition] = field(default_factory=list)
    measurements: list[Measurement] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _cpu_status(log: OperationLog | None, op_type: str) -> tuple[str | None, dict[str, Any]]:
    """The status of a CPU op: its type's one non-mapped status in the log when there is
    one. When the log gives the type several, the counts cannot tell which op got which:
    no status, and the candidates with their counts in the attributes."""
    if log is None:
        return CPU, {}
    candidates = log.cpu_status_counts(op_type)
    if len(candidates) == 1:
        return next(iter(candidates)), {"status_source": "operation log (the only non-mapped status of this op type)"}
    if not candidates:
        return CPU, {}
    return None, {"status_candidates": candidates,
                  "status_source": "operation log: several non-mapped statuses for this op type; "
                                   "which op got which is not in the log"}


def _compare_with_log(
    log: OperationLog, mapped: Counter[str] | None, cpu: Counter[str] | None, total: Counter[str] | None
) -> list[str]:
    """Per op type disagreements between the log and what the models say."""
    problems = []
    checks = (
        ("ops", total, log.counts_by_type()),
        ("mapped ops", mapped, log.mapped_by_type()),
        ("CPU ops", cpu, log.not_mapped_by_type()),
    )
    for what, derived, logged in checks:
        if derived is None:
            continue
        for op_type in sorted(set(derived) | set(logged)):
            if derived.get(op_type, 0) != logged.get(op_type, 0):
                problems.append(
                    f"{op_type}: the models give {derived.get(op_type, 0)} {what}, "
                    f"the operation log {logged.get(op_type, 0)}"
                )
    return problems


def _row_links(
    log: OperationLog,
    mapped: dict[str, list[str]] | None,
    cpu: dict[str, list[str]],
    edgetpu_partitions: Sequence[str],
    cpu_partition: str,
) -> RowLinks:
    """The ops each table row of ``log`` counts, where the matching tells: a mapped row
    holds the absorbed ops of its type; a not-mapped row the CPU ops of its type when the
    type has no other not-mapped row."""
    links: dict[int, tuple[tuple[str, ...], str | None]] = {}
    rows_per_key = Counter((row.op_type, row.mapped) for row in log.rows)
    for row in log.rows:
        # Several rows of one type on one side: the ops are known, not which row counts which.
        known = rows_per_key[row.op_type, row.mapped] == 1
        if row.mapped:
            partition = edgetpu_partitions[0] if len(edgetpu_partitions) == 1 else None
            ids = (mapped or {}).get(row.op_type, []) if known else []
        else:
            partition, ids = cpu_partition, cpu.get(row.op_type, []) if known else []
        links[row.line] = (tuple(ids), partition)
    return links


def _ids_by_type(pairs: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    table: dict[str, list[str]] = {}
    for op_type, op_id in pairs:
        table.setdefault(op_type, []).append(op_id)
    return table


@dataclass(frozen=True)
class _MatchedPair:
    """A group's original and compiled model with the matching of their ops: what each
    step of :func:`_render_matched` reads."""

    group: ModelGroup
    original: TFLiteModel
    compiled: TFLiteModel
    log: OperationLog | None
    #: The scopes of the original's and of the compiled model's IDs.
    oscope: str
    cscope: str
    match: ModelMatch
    #: The Edge TPU partition of each custom op, by its ordinal.
    partition_ids: tuple[str, ...]

    def absorbed_ops(self) -> list[TFLiteOperator]:
        """The original ops inside a custom op, custom op by custom op."""
        return [
            self.original.subgraphs[custom.op.subgraph].operators[index]
            for custom in self.match.custom_ops
            for index in custom.absorbed
        ]

    def cpu_ops(self) -> list[TFLiteOperator]:
        """The original ops a compiled CPU op matched, in (subgraph, compiled op) order."""
        return [self.original.subgraphs[s].operators[index] for (s, _), index in sorted(self.match.cpu.items())]


#: Where an original op runs: (partition, status, extra attributes of its record).
_Placement = tuple[str, str | None, dict[str, Any]]


def _render_matched(group: ModelGroup, scopes: dict[Path, str], parts: _Parts) -> tuple[str, ...]:
    """Original + compiled model: ops placed by matching. Returns the Edge TPU partition IDs."""
    original, compiled = group.original, group.compiled
    assert original is not None and compiled is not None
    cscope = scopes[compiled.path]
    check_same_model(original, compiled)
    match = match_models(original, compiled)
    parts.problems.extend(f"{group.key}: {problem}" for problem in match.problems)
    partition_ids = tuple(edgetpu_partition_id(cscope, custom.ordinal) for custom in match.custom_ops)
    pair = _MatchedPair(group, original, compiled, group.log, scopes[original.path], cscope, match, partition_ids)

    on_cpu, became = _render_placed_originals(pair, parts)
    _render_custom_ops(pair, parts)
    unmatched = _render_unmatched_cpu(pair, parts)
    _render_compiled_tensors(pair, parts)
    if on_cpu or unmatched:
        parts.partitions.append(
            RecoveredPartition(
                id=cpu_partition_id(cscope),
                kind="cpu",
                operator_ids=tuple(on_cpu + unmatched),
                attributes={"model": group.name, "compiled_operator_ids": became + unmatched},
            )
        )
    if pair.log is not None:
        _render_matched_log(pair, pair.log, parts)
    return partition_ids


def _placements(pair: _MatchedPair) -> tuple[dict[tuple[int, int], _Placement], dict[tuple[int, int], str]]:
    """Where each matched original op runs, by (subgraph, op index); and the ID of the
    compiled CPU op each original CPU op became."""
    placement: dict[tuple[int, int], _Placement] = {}
    for custom in pair.match.custom_ops:
        for index in custom.absorbed:
            placement[custom.op.subgraph, index] = (
                pair.partition_ids[custom.ordinal],
                MAPPED,
                {"custom_op": scoped(pair.cscope, custom.op.id)},
            )
    compiled_ids: dict[tuple[int, int], str] = {}
    for (s, compiled_index), index in pair.match.cpu.items():
        status, extra = _cpu_status(pair.log, pair.original.subgraphs[s].operators[index].op_type)
        compiled_ids[s, index] = scoped(pair.cscope, pair.compiled.subgraphs[s].operators[compiled_index].id)
        placement[s, index] = (
            cpu_partition_id(pair.cscope),
            status,
            {"compiled_op": compiled_ids[s, index], **extra},
        )
    return placement, compiled_ids


def _render_placed_originals(pair: _MatchedPair, parts: _Parts) -> tuple[list[str], list[str]]:
    """The original model's ops and tensors, each op where the matching placed it.
    Returns the IDs of the original ops on the CPU and of the compiled ops they became."""
    placement, compiled_ids = _placements(pair)
    on_cpu: list[str] = []
    became: list[str] = []
    for graph in pair.original.subgraphs:
        for op in graph.operators:
            partition, status, extra = placement.get((graph.index, op.index), (None, None, {}))
            parts.operators.append(
                build_operator(op, graph, pair.oscope, partition=partition, status=status, attributes=extra)
            )
            if (graph.index, op.index) in compiled_ids:
                on_cpu.append(scoped(pair.oscope, op.id))
                became.append(compiled_ids[graph.index, op.index])
        parts.tensors.extend(build_tensors(graph, pair.oscope))
    return on_cpu, became


def _render_custom_ops(pair: _MatchedPair, parts: _Parts) -> None:
    """Each custom op (scoped by the compiled model) and its Edge TPU partition, both
    naming the original ops it absorbed."""
    for custom in pair.match.custom_ops:
        graph = pair.original.subgraphs[custom.op.subgraph]
        absorbed_ids = [scoped(pair.oscope, graph.operators[i].id) for i in custom.absorbed]
        parts.operators.append(
            build_operator(
                custom.op,
                pair.compiled.subgraphs[custom.op.subgraph],
                pair.cscope,
                partition=pair.partition_ids[custom.ordinal],
                status=MAPPED,
                attributes={"absorbed_operator_ids": absorbed_ids},
            )
        )
        parts.partitions.append(
            RecoveredPartition(
                id=pair.partition_ids[custom.ordinal],
                kind=EDGETPU_CUSTOM_OP,
                operator_ids=tuple(absorbed_ids),
                attributes=_custom_op_attributes(pair, custom, absorbed_ids),
            )
        )


def _custom_op_attributes(pair: _MatchedPair, custom: CustomOpMatch, absorbed_ids: list[str]) -> dict[str, Any]:
    graph = pair.original.subgraphs[custom.op.subgraph]
    compiled_graph = pair.compiled.subgraphs[custom.op.subgraph]
    macs = [operator_macs(graph.operators[i], graph) for i in custom.absorbed]
    return {
        "model": pair.group.name,
        "custom_op": scoped(pair.cscope, custom.op.id),
        "absorbed_op_count": len(absorbed_ids),
        "absorbed_op_types": dict(Counter(graph.operators[i].op_type for i in custom.absorbed)),
        # Summed over the ops whose MACs the shapes give; the others are counted.
        "absorbed_macs": sum(m for m in macs if m is not None),
        "absorbed_ops_without_macs": sum(m is None for m in macs),
        "executable_bytes": custom.op.custom_options_bytes,
        "boundary_inputs": [compiled_graph.tensors[i].name for i in custom.op.inputs if i >= 0],
        "boundary_outputs": [compiled_graph.tensors[i].name for i in custom.op.outputs],
    }


def _render_unmatched_cpu(pair: _MatchedPair, parts: _Parts) -> list[str]:
    """Compiled CPU ops that match no original op stay as they are, in the CPU partition.
    Returns their IDs."""
    ids = []
    for op in pair.match.unmatched_cpu:
        status, extra = _cpu_status(pair.log, op.op_type)
        parts.operators.append(
            build_operator(
                op,
                pair.compiled.subgraphs[op.subgraph],
                pair.cscope,
                partition=cpu_partition_id(pair.cscope),
                status=status,
                attributes={**extra, "unmatched": True},
            )
        )
        ids.append(scoped(pair.cscope, op.id))
    return ids


def _render_compiled_tensors(pair: _MatchedPair, parts: _Parts) -> None:
    """The compiled model's tensors that the original has no tensor of the same name for
    (the others are folded into the original's)."""
    original = pair.original
    for compiled_graph in pair.compiled.subgraphs:
        known = (
            {t.name for t in original.subgraphs[compiled_graph.index].tensors}
            if compiled_graph.index < len(original.subgraphs)
            else set()
        )
        parts.tensors.extend(t for t in build_tensors(compiled_graph, pair.cscope) if t.name not in known)


def _render_matched_log(pair: _MatchedPair, log: OperationLog, parts: _Parts) -> None:
    """The log's per-type counts checked against the matching, and its measurements with
    the ops each of its table rows counts."""
    unmatched = pair.match.unmatched_cpu
    mapped = Counter(op.op_type for op in pair.absorbed_ops())
    cpu = Counter(op.op_type for op in pair.cpu_ops())
    cpu.update(op.op_type for op in unmatched)
    total = Counter(op.op_type for op in pair.original.operators)
    parts.problems.extend(f"{pair.group.key}: {p}" for p in _compare_with_log(log, mapped, cpu, total))
    absorbed_ids = _ids_by_type((op.op_type, scoped(pair.oscope, op.id)) for op in pair.absorbed_ops())
    cpu_ids = _ids_by_type((op.op_type, scoped(pair.oscope, op.id)) for op in pair.cpu_ops())
    for op in unmatched:
        cpu_ids.setdefault(op.op_type, []).append(scoped(pair.cscope, op.id))
    links = _row_links(log, absorbed_ids, cpu_ids, pair.partition_ids, cpu_partition_id(pair.cscope))
    parts.measurements.extend(log_measurements(log, links))


def _render_compiled(group: ModelGroup, scopes: dict[Path, str], parts: _Parts) -> tuple[str, ...]:
    """A compiled model without its original: the custom op(s) and the CPU ops."""
    compiled, log = group.compiled, group.log
    assert compiled is not None
    scope = scopes[compiled.path]
    recovery = to_recovery(compiled, scope=scope)
    for op in recovery.operators:
        if op.partition == cpu_partition_id(scope):
            status, extra = _cpu_status(log, op.op.removeprefix("tflite."))
            op = dataclasses.replace(op, status=status, attributes={**op.attributes, **extra})
        parts.operators.append(op)
    parts.tensors.extend(recovery.tensors)
    edgetpu = [p.id for p in recovery.partitions if p.kind == EDGETPU_CUSTOM_OP]
    for partition in recovery.partitions:
        extra: dict[str, Any] = {"model": group.name}
        if log is not None and len(edgetpu) == 1 and partition.kind == EDGETPU_CUSTOM_OP:
            extra["absorbed_op_count_from_log"] = log.mapped  # the ops themselves are in the original
        parts.partitions.append(dataclasses.replace(partition, attributes={**partition.attributes, **extra}))
    if log is not None:
        cpu = Counter(op.op_type for op in compiled.operators if not op.is_edgetpu)
        parts.problems.extend(f"{group.key}: {p}" for p in _compare_with_log(log, None, cpu, None))
        cpu_ids = _ids_by_type(
            (op.op_type, scoped(scope, op.id)) for op in compiled.operators if not op.is_edgetpu
        )
        parts.measurements.extend(
            log_measurements(log, _row_links(log, None, cpu_ids, edgetpu, cpu_partition_id(scope)))
        )
    return tuple(edgetpu)


def _render_original(group: ModelGroup, scopes: dict[Path, str], parts: _Parts) -> None:
    """An original model, with a per-op status where its log gives the op's type one status."""
    original, log = group.original, group.log
    assert original is not None
    scope = scopes[original.path]
    counts = log.counts() if log else {}
    for graph in original.subgraphs:
        for op in graph.operators:
            statuses = counts.get(op.op_type, {})
            status = next(iter(statuses)) if len(statuses) == 1 else None
            extra: dict[str, Any] = {}
            if status is not None:
                extra["status_source"] = "operation log (the only status of this op type)"
            elif len(statuses) > 1:
                extra["status_candidates"] = dict(statuses)
            parts.operators.append(build_operator(op, graph, scope, status=status, attributes=extra))
        parts.tensors.extend(build_tensors(graph, scope))
    if log is not None:
        total = Counter(op.op_type for op in original.operators)
        parts.problems.extend(f"{group.key}: {p}" for p in _compare_with_log(log, None, None, total))


def _compare_with_console(group: ModelGroup, summary: ConsoleSummary, position: int) -> list[str]:
    """Op counts of a console block that the group's models contradict."""
    block = summary.models[position]
    where = f"{summary.path}:{block.line}"
    problems = []
    if group.original is not None and block.operations_total is not None:
        if block.operations_total != len(group.original.operators):
            problems.append(
                f"the console summary ({where}) gives {block.operations_total} ops, "
                f"the original model has {len(group.original.operators)}"
            )
    if group.compiled is not None and block.operations_on_cpu is not None:
        cpu_ops = sum(not op.is_edgetpu for op in group.compiled.operators)
        if cpu_ops != block.operations_on_cpu:
            problems.append(
                f"the console summary ({where}) gives {block.operations_on_cpu} CPU ops, "
                f"the compiled model has {cpu_ops}"
            )
    return problems


def _group_attributes(group: ModelGroup, scopes: dict[Path, str]) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "model": group.name,
        "matched": group.compiled is not None and group.original is not None,
    }
    for role in ("original", "compiled"):
        model: TFLiteModel | None = getattr(group, role)
        if model is not None:
            attributes[role] = str(model.path)
            attributes[f"{role}_scope"] = scopes[model.path]
            attributes[f"{role}_model"] = model_attributes(model)
    if group.log is not None:
        attributes["operation_log"] = str(group.log.path)
        attributes.update(log_attributes(group.log))
    if group.console:
        attributes["console"] = [summary.models[position].as_dict() for summary, position in group.console]
    return attributes


def reconstruct(paths: Sequence[Path | str]) -> Recovery:
    """See :func:`dfit_mlir.adapters.edgetpu.reconstruct`."""
    inputs = _read_all(paths)
    check_roles(inputs.models)
    scopes = _scopes(inputs.models)
    groups, unattached = _group(inputs, scopes)
    parts = _Parts()
    console_partitions: dict[tuple[Path, int], str] = {}
    for group in groups:
        partition_ids: tuple[str, ...] = ()
        if group.compiled is not None and group.original is not None:
            partition_ids = _render_matched(group, scopes, parts)
        elif group.compiled is not None:
            partition_ids = _render_compiled(group, scopes, parts)
        elif group.original is not None:
            _render_original(group, scopes, parts)
        if group.log is not None and group.compiled is None:  # else rendered with its links
            parts.measurements.extend(log_measurements(group.log))
        for summary, position in group.console:
            if len(partition_ids) == 1:  # the block's figures are that one custom op's
                console_partitions[summary.path, position] = partition_ids[0]
            parts.problems.extend(
                f"{group.key}: {p}" for p in _compare_with_console(group, summary, position)
            )
    for summary in inputs.consoles:
        blocks = {p: partition for (path, p), partition in console_partitions.items() if path == summary.path}
        parts.measurements.extend(console_measurements(summary, blocks))

    versions = sorted(
        {log.compiler_version for log in inputs.logs}
        | {s.compiler_version for s in inputs.consoles if s.compiler_version}
    )
    return Recovery(
        backend=BACKEND,
        sources=tuple(inputs.sources),
        operators=tuple(parts.operators),
        tensors=tuple(parts.tensors),
        partitions=tuple(parts.partitions),
        measurements=tuple(parts.measurements),
        coverage=_coverage(inputs, groups, parts.problems, unattached),
        attributes={
            "compiler_versions": versions,
            "models": {group.key: _group_attributes(group, scopes) for group in groups},
            "console": [console_attributes(summary) for summary in inputs.consoles],
            "ignored_files": inputs.ignored,
        },
    )


# ---------------------------------------------------------------------------- coverage


def _coverage(
    inputs: _Inputs, groups: Sequence[ModelGroup], problems: Sequence[str], unattached: Sequence[str]
) -> tuple[CoverageNote, ...]:
    return assess(_Grouped.of(inputs, groups, problems, unattached), _RULES)


@dataclass(frozen=True)
class _Grouped:
    """What the coverage notes of an Edge TPU reconstruction look at: the files read,
    how their groups came out, the disagreements the matching found and the console
    blocks that attached to no group."""

    inputs: _Inputs
    problems: Sequence[str]
    unattached: Sequence[str]
    #: Keys of the groups with both models, with the compiled model only, with a log only.
    matched: list[str]
    compiled_only: list[str]
    logs_only: list[str]
    any_compiled: bool

    @classmethod
    def of(
        cls, inputs: _Inputs, groups: Sequence[ModelGroup], problems: Sequence[str], unattached: Sequence[str]
    ) -> _Grouped:
        return cls(
            inputs,
            problems,
            unattached,
            matched=[g.key for g in groups if g.compiled and g.original],
            compiled_only=[g.key for g in groups if g.compiled and not g.original],
            logs_only=[g.key for g in groups if g.log and not g.compiled and not g.original],
            any_compiled=any(g.compiled for g in groups),
        )


def _operators_note(grouped: _Grouped) -> CoverageNote:
    inputs, compiled_only, logs_only = grouped.inputs, grouped.compiled_only, grouped.logs_only
    if not inputs.models:
        return graded(
            "operators",
            "no .tflite given" + (": ops are only counted per type by the operation logs" if inputs.logs else ""),
            partial=bool(inputs.logs),
        )
    if compiled_only or logs_only:
        gaps = (
            [f"ops inside the Edge TPU custom op are unknown without the original model for {compiled_only}"]
            if compiled_only
            else []
        ) + ([f"only per-type counts for {logs_only}"] if logs_only else [])
        return CoverageNote("operators", Coverage.PARTIAL, "; ".join(gaps))
    return CoverageNote(
        "operators", Coverage.RECOVERED, "every original op with operands, results, shapes and dtypes"
    )


#: What a .tflite gives whenever one is among the inputs.
_MODEL_NOTES = (
    CoverageNote(
        "tensor_shapes",
        Coverage.RECOVERED,
        "every tensor's shape, dtype and size (concrete shapes, as compiled)",
    ),
    CoverageNote(
        "static_cost",
        Coverage.PARTIAL,
        "MACs of CONV_2D, DEPTHWISE_CONV_2D and FULLY_CONNECTED from shapes; bytes of every op",
    ),
    CoverageNote(
        "source_locations",
        Coverage.PARTIAL,
        "tensor names only (an op's output tensor name is its name and module path)",
    ),
)


def _model_notes(grouped: _Grouped) -> Notes:
    if grouped.inputs.models:
        return _MODEL_NOTES
    return CoverageNote("tensor_shapes", Coverage.NOT_EXPOSED, "the logs carry no tensors")


def _lineage_note(grouped: _Grouped) -> CoverageNote:
    matched, compiled_only = grouped.matched, grouped.compiled_only
    if matched and not compiled_only:
        return CoverageNote(
            "lineage",
            # Disagreements (ops placed nowhere, boundaries the original lacks) mean
            # the lineage is only as good as the matches that held.
            Coverage.PARTIAL if grouped.problems else Coverage.RECOVERED,
            f"per original op to its Edge TPU custom op or the CPU, matched through boundary "
            f"tensor names ({matched}); compiled CPU ops and tensors are folded into the "
            "original records of the same name",
        )
    if matched:
        return CoverageNote(
            "lineage",
            Coverage.PARTIAL,
            f"per op to partition for {matched}; not for {compiled_only} (original missing)",
        )
    return CoverageNote(
        "lineage",
        Coverage.NOT_EXPOSED,
        "needs the original and the compiled .tflite of the same model",
    )


def _partition_notes(grouped: _Grouped) -> list[CoverageNote]:
    """How partitions were recovered, then one note per disagreement the matching found."""
    problems = grouped.problems
    notes = []
    if grouped.any_compiled:
        notes.append(
            CoverageNote(
                "partitions",
                Coverage.PARTIAL if problems or grouped.compiled_only else Coverage.RECOVERED,
                "one edgetpu-custom-op partition per custom op and a cpu partition"
                + (f"; {len(problems)} disagreement(s) in the notes that follow" if problems else ""),
            )
        )
    elif grouped.inputs.logs:
        notes.append(
            CoverageNote(
                "partitions",
                Coverage.PARTIAL,
                "mapped / not mapped counts per op type from the operation log",
            )
        )
    notes.extend(CoverageNote("partitions", Coverage.PARTIAL, problem) for problem in problems)
    return notes


def _compiler_ir_note(grouped: _Grouped) -> CoverageNote:
    models = grouped.inputs.models
    executable = sum(op.custom_options_bytes for m in models for op in m.operators if op.is_edgetpu)
    return CoverageNote(
        "compiler_ir",
        Coverage.NOT_EXPOSED,
        f"the Edge TPU executable inside edgetpu-custom-op is an opaque binary "
        f"({executable} bytes in the given models)",
    )


def _memory_notes(grouped: _Grouped) -> list[CoverageNote]:
    """The console summary's memory figures (and blocks tied to no model), and its
    compile times; without one, what the models' sizes give."""
    inputs = grouped.inputs
    if not inputs.consoles:
        return [
            CoverageNote(
                "memory",
                Coverage.PARTIAL if inputs.models else Coverage.NOT_EXPOSED,
                "static tensor and weight sizes only; the on-chip / off-chip parameter split "
                "is in the compiler's console summary, which was not given",
            )
        ]
    timed = any(s.compile_time_s is not None for s in inputs.consoles)
    return [
        CoverageNote(
            "memory",
            Coverage.PARTIAL,
            "on-chip cached / remaining and off-chip streamed parameter bytes per model "
            "from the console summary (two decimals as printed); static tensor sizes",
        ),
        *(
            CoverageNote(
                "memory",
                Coverage.PARTIAL,
                f"console block tied to no given model file (figures kept, no partition): {where}",
            )
            for where in grouped.unattached
        ),
        CoverageNote(
            "compile_timing",
            Coverage.RECOVERED if timed else Coverage.NOT_EXPOSED,
            "total time of each compiler run (no phases)",
        ),
    ]


#: The aspects an Edge TPU reconstruction reports, in order; run timing is never in
#: compile artifacts.
_RULES = (
    _operators_note,
    _model_notes,
    _lineage_note,
    _partition_notes,
    _compiler_ir_note,
    CoverageNote(
        "per_op_timing",
        Coverage.NOT_EXPOSED,
        "the Edge TPU runtime exposes per-invoke latency only; ops inside a custom op are never timed",
    ),
    CoverageNote(
        "per_partition_timing",
        Coverage.NOT_EXPOSED,
        "compile artifacts hold no run timing (a TFLite op profiler at run time would "
        "time the custom op as a whole)",
    ),
    CoverageNote("per_program_timing", Coverage.NOT_EXPOSED, "compile artifacts hold no run timing"),
    _memory_notes,
)
