"""The ledger: what every stable ID, dispatch call site, module path and phase costs —
FLOPs, MACs, bytes crossing the dispatch boundary, and measured time — computed once per
bundle (or manifest without a run). Every tool reads its figures from here; none
re-derives a share. This docstring is the spec.

**Entries.** One row per (partition, compute op): a partition is an IREE dispatch call
site or a reconstruction's group (:attr:`SemanticModel.partitions`); its compute ops are
:meth:`SemanticModel.compute_ops` (top-level ops that consume a value: constants, empty
tensors and region bodies do no work of their own). The row of the partition's root op
has ``role`` ``root``, the others ``fused``.

**Static costs.** ``macs``/``flops`` of an entry are the op's figures (from
:mod:`dfit_mlir.core.costs`) *placed* by :mod:`dfit_mlir.core.site_costs`: an op IREE split over
several dispatches counts once, where it computes (a pack/encoding or copy dispatch gets
0 MACs and keeps its bytes), so entries sum to the model's total. ``bytes_read`` are the
tensors the op consumes that come from outside the partition (through ops that only
reshape, :data:`PASS_THROUGH`: a ``view`` left between a matmul and its GELU does not
make the GELU read the matmul's result from memory), weights (constant tensors)
included even when the constant was fused in, shared evenly by the partition's ops that
consume them; ``bytes_written`` the tensors the partition produces that are consumed
outside it, returned or never consumed (results of ``*.empty`` ops move nothing),
charged to the partition's **root** op: the dispatch writes its result once, and a fused
consumer (a matmul's bias, GELU, residual add) transforms the root's tile in place
before that write, so the write is not what the consumer adds (a partition without a
root among its compute ops charges each producer). A value passed between two fused
ops stays in the dispatch and costs no bytes. Without a tensor
graph in the manifest an op's own operand + result bytes stand in (an upper bound).

**What runs: the dispatch's own types** (:meth:`Ledger.dtype`). A dispatch's element
type is the ops' (the first operand of the op doing most of the MACs placed in it, else of
its root, as the source graph types it: ``ui8`` keeps its sign), unless the dispatch region computes in a narrower one (the
manifest's site ``dtype``: the first operand of the region's lowered op doing most MACs,
``passes/region_costs.py``; for manifests without it, the first type of the export
name's ``…_i8xi8xi32``; never ``i1``, a mask). Then — a QDQ int8 graph whose ``Conv``
carries the float types of its ``DequantizeLinear`` inputs, run as an ``i8 x i8 → i32``
conv, or a graph demoted to bf16 — the dispatch's type is what runs, and the bytes are
the dispatch region's own operands and results (the site's
``bytes_read`` / ``bytes_written``), split over the ops in the proportions the tensor
graph gives (written: to the root), so the partition moves exactly its signature's
bytes (``bytes_rule`` ``dispatch signature``).

**Transcendentals** (``transcendentals`` / ``executed_transcendentals``, columns added
after :data:`ENTRY_COLUMNS`, :data:`TRANSCENDENTAL_COLUMNS`): an elementwise evaluation
of ``exp``, ``expm1``, ``log``, ``log1p``, ``tanh``, ``logistic``, ``sqrt``, ``rsqrt``,
``cbrt``, ``pow``, ``sin``, ``cos``, ``tan``, ``atan2`` or ``erf``, counted per output
element as XLA's ``HloCostAnalysis`` counts its ``transcendentals`` (rules in
:mod:`dfit_mlir.core.costs`); they are **not** FLOPs: an ``exp`` has ``flops`` 0, a GELU its
1 FLOP per element plus 1 transcendental. They are placed over the partitions naming the
op as FLOPs are (in proportion to what each dispatch's own lowered ops evaluate,
``region_transcendentals``, else on the partitions that compute), so partitions sum to
the model's total. The roofline does not weigh them (a transcendental is not a
FLOP's vector slot: what one costs is the target's); the measured time models do.

**Executed work.** Static figures (``macs``, ``flops``, ``transcendentals``) are **per
trip**: each op once per invocation of its call site, as the program text says, however
many times a loop runs it. ``calls`` is the number of the run's dispatch events at the
partition (a dispatch inside a loop runs once per trip, so ``lax.scan`` bodies and
``scf.while`` loops count per trip); ``executed_macs`` / ``executed_flops`` /
``executed_transcendentals`` = static figure × calls: the work the run did, over the whole
run (every recorded invocation, warm-ups excluded). That is what a measured time did, so
every rate derived from time (FLOP/s, % of a roof, efficiency) divides executed figures,
never static ones. :meth:`Ledger.per_invocation` divides an executed figure by
:attr:`Ledger.instances` (the run's invocations): the figure to compare with a count of
one call of the program with its loops unrolled (XLA's ``cost_analysis()`` of the
unrolled step). Executed figures are **unknown** (``None``: empty in a table, never a 0
that looks counted) when nothing counted the executions (:attr:`Ledger.executed_unknown`
says why): a manifest without a run (``calls`` 0; its figures are per trip), a run that
recorded no dispatch events (``--mode none/ids/lite``), or one that kept only some of
them (``--ids``, ``--sample``, events dropped past ``--max-events``: counts would be
short). An op whose static figure is unknown has an unknown executed one on its entry and
adds 0 to sums.

**Executed work from the manifest's trip counts** (:attr:`Ledger.executed_basis`: where
the figures come from, ``run events`` or ``manifest trips``). Where the run did not count
the executions — or nothing ran — but every partition is a dispatch site whose ``trips``
the manifest knows statically (``passes/loop_trips.py``: the product of its enclosing
loops' static trip counts, per call of the model; they equal the run's counts on a
``lax.scan``), each partition runs ``trips`` times an invocation (a load-time site, an
initializer, none: it is no invocation's work, and a run records none of it either) and
``executed_flops_per_invocation`` = static FLOPs × trips. The whole run's executed figures
then need the number of invocations, which only a run says (its events' invocations, else
its summary's ``invocations``): static × trips × invocations, and unknown for a manifest
alone. A site whose trip count is dynamic (a ``while`` whose bound
is a runtime value) or a partition that is no dispatch site (a reconstruction's group)
leaves the figures unknown, and :attr:`Ledger.per_invocation_unknown` names it. Every
entry carries ``executed_flops_per_invocation`` (from run events: static × calls ÷ the
run's invocations), so rollups sum it like the others.

**Time model** (``time_model`` column, :class:`TimeModel`). A partition's measured time
is the summed duration of its dispatch events. Within a partition each op's share is its
*roofline weight* ``max(compute, ridge × (bytes_read + bytes_written))``, where
``compute`` is the op's MACs, else its FLOPs (an elementwise FLOP occupies a vector slot
as a MAC does), and ``ridge`` (MACs per byte) is the target's: the bundled profile's
peak / bandwidth for backends that publish figures, :data:`DEFAULT_CPU_RIDGE` for the
local CPU (its profile is a calibration; a fixed figure keeps every tool's split the
same and reproducible). So a matmul carries its arithmetic and the weights it reads,
and a fused elementwise consumer carries only its own FLOPs and what it reads from
outside (a bias, a residual): the
GELU fused into GPT-2's ``c_fc`` gets a small share: what it adds to the dispatch. A partition whose ops have no
known cost at all splits ``equal`` (named so). An event with no call site that names a
``root_id`` (reconstructions) goes whole to that op (``time_model`` ``root``). Anything
else is unattributed, by (kind, partition), in :attr:`Ledger.unattributed`.

**Measured time models** (:mod:`dfit_mlir.analysis.op_timing`, its docstring is their
spec). Where someone measured the device (``dfit analyze BUNDLE --time-model measured``:
the ops of the hottest dispatches compiled alone and timed on the run's host and driver,
cached by op signature under ``$DFIT_CACHE_DIR``), a ledger built without an explicit
``time_model`` weighs a partition's ops in ns instead: every op timed alone →
``measured-standalone`` (the split is the standalone medians' proportions); else, where
an elementwise or normalisation op has a per-element cost calibrated on the device →
``calibrated-elementwise`` (each op: its standalone time, else elements × that cost,
else its roofline weight over the device's matmul MACs/ns); else the roofline above.
Without a cache for the bundle's device and compiled input, nothing changes.

**Honest totals** (:class:`Totals`). Measured time is the union of the *leaf* intervals
of execution events (kinds :data:`EXECUTION_KINDS`; a leaf encloses no other timed
event: a program encloses its functions, a queue execute its dispatches), so
overlapping asynchronous spans (local-task queue operations in flight together,
dispatches on several threads) count once. ``attributed_pct`` is the union of the leaf
intervals of events attributed to ops over that measured union — never a sum of
durations over a union — and ``kinds`` says which event kinds the measured union
covers.

**Rollups** (:meth:`Ledger.rollup`): per op (``op_id``), per partition, per module path
and per phase, the sums of the entry columns; an op in several partitions sums them.
:meth:`Ledger.op_figures` (per op), :meth:`Ledger.partition_figures`,
:meth:`Ledger.rollup_ops` (per any grouping of ops: a source line, a site) and
:meth:`Ledger.module_tree` (self and inclusive per module path) are what the readers
print; none of them sums entries of its own.

**What readers print, one way each.** Times are whole nanoseconds: a partition's time is
split in proportion to the shares with the largest remainders rounded up, so its entries
sum to its measured time exactly (:func:`whole_split`). Every share of time is a share of
:attr:`Ledger.attributed_time_ns` (:data:`SHARE_BASIS`; :meth:`Ledger.share`); shares of
FLOPs, where nothing ran, of :attr:`Ledger.total_flops`. The runs of the program are
:attr:`Ledger.instances` — distinct invocations of the timed execution events, else
their steps (a reconstruction's training steps), else one run — and
:meth:`Ledger.op_time_by_instance` splits each run's time as the totals are split.
Bytes are the boundary's (``bytes_read`` + ``bytes_written``) in every reader.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from dfit_mlir.analysis import op_timing
from dfit_mlir.analysis.model import Partition, SemanticModel
from dfit_mlir.core import costs
from dfit_mlir.core.errors import InvalidInputError
from dfit_mlir.core.module_paths import EXECUTED_FIGURES, ModuleNode, build_tree
from dfit_mlir.core.perf import exact_median, sorted_distinct

#: Event kinds that time execution; ``compile`` and ``metric`` events do not.
EXECUTION_KINDS = frozenset({"dispatch", "queue", "memory", "tensor", "function", "program"})
#: MACs per byte where the target's profile is a calibration (the local CPU): a core's
#: f32 FMA throughput (~16 MAC/cycle at 3 GHz) over one core's share of DRAM bandwidth
#: (~10 GB/s) is ~5; 4 is the round figure below it.
DEFAULT_CPU_RIDGE = 4.0
#: Ops that only reshape a value: a value they pass on comes from their input's producer.
PASS_THROUGH = frozenset({"view", "reshape", "_unsafe_view", "unsqueeze", "squeeze", "flatten", "expand_shape",
                          "collapse_shape", "bitcast", "Reshape", "Squeeze", "Unsqueeze", "Flatten"})
#: An op's executed FLOPs in one invocation of the program (module doc: executed work).
PER_INVOCATION = "executed_flops_per_invocation"
ENTRY_COLUMNS = ("partition", "site", "op_id", "op", "role", "module_path", "phase", "macs", "flops",
                 "bytes_read", "bytes_written", "weight", "share", "calls", "time_ns", "executed_macs",
                 "executed_flops", PER_INVOCATION, "time_model")
#: Columns a rollup sums (``calls`` is a partition's, repeated on its entries: not summed).
SUM_COLUMNS = ("macs", "flops", "bytes_read", "bytes_written", "time_ns", "executed_macs", "executed_flops",
               PER_INVOCATION, "transcendentals", "executed_transcendentals")
#: :attr:`Ledger.executed_basis`: the run's dispatch events counted the executions, or
#: the manifest's static trip counts stand in for them.
RUN_EVENTS = "run events"
MANIFEST_TRIPS = "manifest trips"
#: Entry columns after :data:`ENTRY_COLUMNS`: an op's placed transcendentals (not FLOPs),
#: and those times its partition's calls.
TRANSCENDENTAL_COLUMNS = ("transcendentals", "executed_transcendentals")
ROLLUP_KEYS = ("op_id", "partition", "module_path", "phase")


@dataclass(frozen=True)
class TimeModel:
    """How a dispatch's measured time is split over its ops (see the module doc)."""

    name: str
    #: MACs that take as long as moving one byte across the dispatch boundary.
    ridge_macs_per_byte: float
    source: str

    @property
    def label(self) -> str:
        return f"{self.name}(ridge {self.ridge_macs_per_byte:.3g} MAC/B)"

    def weight(self, compute: int | None, moved: int | None) -> float:
        return max(float(compute or 0), self.ridge_macs_per_byte * float(moved or 0))


def time_model_for(model: SemanticModel) -> TimeModel:
    """The roofline of the model's device (a GPU run's named part: its vendor peaks) or
    backend: its bundled profile's ridge if the profile publishes figures, else
    :data:`DEFAULT_CPU_RIDGE` (the local CPU, and lavapipe, which runs on it)."""
    import yaml

    from dfit_mlir.analysis import profiles

    gpu = profiles.gpu_device(model.summary.get("device"))
    path = profiles.profile_path_for_device(*gpu) if gpu is not None else profiles.bundled().get(model.backend)
    if path is not None and not (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("calibrate"):
        profile = profiles.read_profile(path)
        return TimeModel("roofline", profile.ridge(None), f"{profile.name} profile ({path.name})")
    return TimeModel("roofline", DEFAULT_CPU_RIDGE, "dfit's default for a CPU (dfit_mlir.analysis.ledger.DEFAULT_CPU_RIDGE)")


@dataclass(frozen=True)
class Totals:
    """What the run measured, each interval once (see the module doc)."""

    #: Union of leaf execution intervals.
    measured_ns: int
    #: Sum of leaf durations (counts overlapping spans once each).
    leaf_sum_ns: int
    #: Union of the leaf intervals of events attributed to an op.
    attributed_union_ns: int
    #: Sum of the durations given to ops (over threads: may exceed the union).
    attributed_ns: int
    #: Leaf events counted, by kind.
    kinds: Mapping[str, int]
    invocations: int

    @property
    def attributed_pct(self) -> float | None:
        return round(100 * self.attributed_union_ns / self.measured_ns, 2) if self.measured_ns else None

    @property
    def covers(self) -> str:
        """``dispatch 120, queue 4``: the event kinds the measured union is made of."""
        return ", ".join(f"{kind} {count}" for kind, count in sorted(self.kinds.items(), key=lambda kv: -kv[1]))


@dataclass(frozen=True)
class Unattributed:
    kind: str
    partition: str | None
    count: int
    time_ns: int


@dataclass(frozen=True)
class _Timing:
    """Per-partition sums of the dispatch events, the rest, and the totals."""

    partition_ns: dict[str, int] = field(default_factory=dict)
    partition_calls: dict[str, int] = field(default_factory=dict)
    root_ns: dict[str, int] = field(default_factory=dict)
    root_calls: dict[str, int] = field(default_factory=dict)
    rest: tuple[Unattributed, ...] = ()
    totals: Totals = field(default_factory=lambda: Totals(0, 0, 0, 0, {}, 0))
    #: Partition ID → (the instances that ran it, its summed ns in each), numpy arrays:
    #: a long run has a pair per call site per invocation, millions, so not a dict entry
    #: each; and (root op ID, instance) → ns (events of a root op at no call site: few).
    partition_instance_ns: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    root_instance_ns: dict[tuple[str, int], int] = field(default_factory=dict)


class Ledger:
    """The figures of one :class:`SemanticModel` (use :func:`of`: one ledger per model)."""

    def __init__(self, model: SemanticModel, events: Iterable[Any] | None = None,
                 time_model: TimeModel | None = None):
        self.model = model
        self.time_model = time_model or time_model_for(model)
        self._measured_allowed = time_model is None
        # The model's events can be read again: a long run's intervals are then taken a
        # time bucket at a time (bounded memory); given events are read once.
        self._timing = _timing(model, (lambda: model.event_batches(columns=list(_TIMING_COLUMNS)))
                               if events is None else events)
        self._rows: dict[str, list[dict[str, Any]]] = {}

    @cached_property
    def events_uncounted(self) -> str | None:
        """Why the run's events did not count every execution of every partition, as a
        reader prints it; ``None`` when they did."""
        timing = self._timing
        if not timing.partition_calls and not timing.root_calls:
            if self.model.events_path is None and not timing.totals.kinds:
                return "nothing ran (a manifest alone: no run counted the executions)"
            mode = self.model.summary.get("mode")
            if mode:
                return (f"the run recorded no dispatch events at partitions (dfit run --mode {mode}): nothing "
                        "counted the trips")
            return "the bundle's events time no partition: nothing counted the trips"
        policy = self.model.summary.get("policy") or {}
        counts = self.model.summary.get("counts") or {}
        if (policy.get("sample_every") or 1) > 1 or counts.get("sampled_out"):
            return (f"the run kept 1 dispatch event in {policy.get('sample_every')} (dfit run --sample): "
                    "counts of executions would be short")
        if policy.get("ids") or counts.get("filtered"):
            return "the run kept only the dispatches of ops matching dfit run --ids: the others were not counted"
        if counts.get("dropped") or self.model.summary.get("dropped_events"):
            dropped = counts.get("dropped") or self.model.summary.get("dropped_events")
            return f"the run dropped {dropped} events past dfit run --max-events: counts of executions would be short"
        return None

    @cached_property
    def _manifest_trips(self) -> tuple[dict[str, tuple[int, bool]] | None, str | None]:
        """(partition ID → (its site's static ``trips`` per invocation, whether it runs
        at load time), None), or (None, why they are not all known) (module doc)."""
        model = self.model
        if not model.partitions:
            return None, "the manifest has no partitions"
        groups = [part.id for part in model.partitions if part.kind != "dispatch"]
        if groups:
            return None, (f"{len(groups)} partition(s) are a reconstruction's groups ({groups[0]}, …), which carry "
                          "no trip count")
        found: dict[str, tuple[int, bool]] = {}
        dynamic: list[str] = []
        for part in model.partitions:
            site = self._site(part)
            if "trips" not in site:
                return None, "the manifest records no trip counts (compiled before dfit counted loop trips)"
            if site["trips"] is None:
                dynamic.append(f"{part.id} (root {part.root_id})")
            else:
                found[part.id] = (int(site["trips"]), site.get("phase") == "load")
        if dynamic:
            return None, (f"the trip count of {len(dynamic)} dispatch site(s) is dynamic (a loop bound known only "
                          f"at run time): {', '.join(dynamic[:3])}{', …' if len(dynamic) > 3 else ''}")
        return found, None

    @cached_property
    def executed_basis(self) -> str | None:
        """Where the executed figures come from: :data:`RUN_EVENTS` (the run counted every
        execution), :data:`MANIFEST_TRIPS` (the manifest's static trip counts), or None
        (unknown: :attr:`per_invocation_unknown` says why)."""
        if self.events_uncounted is None:
            return RUN_EVENTS
        return MANIFEST_TRIPS if self._manifest_trips[0] is not None else None

    @cached_property
    def invocations_run(self) -> int | None:
        """How many invocations the run says ran (the events' :attr:`instances`, else its
        summary's ``invocations``); None for a manifest without a run."""
        return self.instances or self.model.summary.get("invocations") or None

    @cached_property
    def per_invocation_unknown(self) -> str | None:
        """Why executed figures per invocation are unknown; ``None`` where they are known
        (:attr:`executed_basis` is not None)."""
        if self.executed_basis is not None:
            return None
        return f"{self.events_uncounted}; and {self._manifest_trips[1]}"

    @cached_property
    def executed_unknown(self) -> str | None:
        """Why the whole run's executed figures are unknown, as a reader prints it;
        ``None`` when the run counted every execution, or the manifest's trip counts and
        the run's number of invocations give them (module doc: executed work)."""
        if self.executed_basis is None:
            return self.per_invocation_unknown
        if self.executed_basis == MANIFEST_TRIPS and self.invocations_run is None:
            return (f"{self.events_uncounted}; whole-run figures need a run's count of invocations "
                    "(per invocation: the manifest's trip counts)")
        return None

    @cached_property
    def _executions(self) -> dict[str, tuple[int | None, float | None]]:
        """Partition ID → (executions over the whole run, executions per invocation),
        each None where unknown (module doc: executed work)."""
        basis, timing = self.executed_basis, self._timing
        if basis == RUN_EVENTS:
            runs = self.instances
            return {part.id: (calls := timing.partition_calls.get(part.id, 0), calls / runs if runs else None)
                    for part in self.model.partitions}
        if basis == MANIFEST_TRIPS:
            ran = self.invocations_run
            # A load-time site (an initializer) runs at load, in no invocation: a run's
            # recorded invocations do not hold it, and its events do not count it either.
            return {part_id: (None if ran is None else 0 if load else trips * ran, 0 if load else trips)
                    for part_id, (trips, load) in (self._manifest_trips[0] or {}).items()}
        return {}

    def _site(self, part: Partition) -> dict[str, Any]:
        """The manifest's dispatch site of a ``dispatch`` partition ({} for others)."""
        sites = self.model.manifest.get("partitions", {}).get("dispatch_sites", [])
        index = part.attributes.get("site") if part.kind == "dispatch" else None
        return sites[index] if isinstance(index, int) and 0 <= index < len(sites) else {}

    @property
    def executed_known(self) -> bool:
        """Whether the whole run's executed figures are known (:attr:`executed_unknown` is None)."""
        return self.executed_unknown is None

    @property
    def per_invocation_known(self) -> bool:
        """Whether executed figures per invocation are known (:attr:`executed_basis`)."""
        return self.executed_basis is not None

    def per_invocation(self, executed: float | None) -> float | None:
        """An executed figure per run of the program (÷ :attr:`instances`, to 3
        decimals): comparable with a count of one call with its loops unrolled. None where
        the figure is unknown or nothing ran."""
        if executed is None or not self.instances:
            return None
        return round(executed / self.instances, 3)

    @property
    def totals(self) -> Totals:
        return self._timing.totals

    @property
    def unattributed(self) -> tuple[Unattributed, ...]:
        return self._timing.rest

    @cached_property
    def entries(self) -> Any:
        """The entry table (:data:`ENTRY_COLUMNS`), partitions in model order."""
        import pyarrow as pa

        rows = [row for part in self.model.partitions for row in self._rows_of(part)]
        rows += self._root_rows()
        types = {PER_INVOCATION: pa.float64(), "executed_macs": pa.int64(), "executed_flops": pa.int64()}
        table = pa.table({column: pa.array([row[column] for row in rows], types.get(column))
                          for column in ENTRY_COLUMNS})
        return self._with_transcendentals(table, rows)

    def _with_transcendentals(self, table: Any, rows: list[dict[str, Any]]) -> Any:
        """The entries with :data:`TRANSCENDENTAL_COLUMNS` (None on ``root`` rows, which
        carry no static figures, and for an op whose count is unknown)."""
        import pyarrow as pa

        placed = self._placed_transcendentals
        counts: list[int | None] = []
        executed: list[int | None] = []
        executions = self._executions
        for row in rows:
            count = None if row["time_model"] == "root" else placed.get(row["partition"], {}).get(row["op_id"])
            counts.append(count)
            whole = executions.get(row["partition"], (None, None))[0]
            executed.append(None if count is None or whole is None else count * whole)
        return table.append_column("transcendentals", pa.array(counts, pa.int64())) \
            .append_column("executed_transcendentals", pa.array(executed, pa.int64()))

    @cached_property
    def _placed_transcendentals(self) -> dict[str, dict[str, int]]:
        """Partition → op ID → its transcendentals placed there, as FLOPs are placed
        (:mod:`dfit_mlir.core.site_costs`): by the dispatches' ``region_transcendentals``,
        else over the partitions that compute. An op whose figure comes from its
        dispatches (``cost_source`` ``dispatch``) takes theirs."""
        from dfit_mlir.core.site_costs import moves_data_only, op_figures, placed_costs

        model, parts = self.model, self.model.partitions
        sites = model.manifest.get("partitions", {}).get("dispatch_sites", [])
        regional: defaultdict[str, int] = defaultdict(int)
        for site in sites:
            for op_id, amount in (site.get("region_transcendentals") or {}).items():
                regional[op_id] += amount
        raw = {}
        for op_id, op in model.operators.items():
            count = op.raw.get("transcendentals")
            raw[op_id] = regional.get(op_id) if count is None and op.raw.get("cost_source") == "dispatch" else count
        kinds = {op_id: op.raw.get("cost_kind") for op_id, op in model.operators.items()}
        # Manifests written before transcendentals were counted carry none: unknown, not 0.
        costs = op_figures(raw, kinds) if any(v is not None for v in raw.values()) else raw
        by_site = {s["index"]: s.get("region_transcendentals") for s in sites}
        weights = [by_site.get(p.attributes.get("site")) if p.kind == "dispatch" else None for p in parts]
        computes = [p.kind != "dispatch" or not moves_data_only(p.attributes.get("export")) for p in parts]
        placed = placed_costs([p.operator_ids for p in parts], computes, costs, weights)
        return {p.id: share for p, share in zip(parts, placed, strict=True)}

    def _rows_of(self, part: Partition) -> list[dict[str, Any]]:
        found = self._rows.get(part.id)
        if found is None:
            found = self._rows[part.id] = self._partition_rows(part)
        return found

    def partition_ns(self, partition_id: str) -> int:
        """Summed duration of the partition's dispatch events (0 without a run)."""
        return self._timing.partition_ns.get(partition_id, 0)

    def bytes_moved(self, part: Partition) -> tuple[int | None, str]:
        """(Bytes crossing the partition's boundary, the rule that counted them)."""
        moved = self._boundary.of(part, self.model.compute_ops(part))
        sizes = [size for pair in moved.values() for size in pair if size is not None]
        if not sizes:
            return None, "none"
        if part.id in self._boundary.signed:
            return sum(sizes), "dispatch signature"
        return sum(sizes), "boundary tensors" if self._boundary.tensors else "operator bytes (upper bound)"

    def dtype(self, part: Partition) -> str | None:
        """The element type a partition computes in (module doc: what runs)."""
        return self._boundary.dtype(part)

    def calls(self, partition_id: str) -> int:
        """Dispatch events the run recorded at a partition (0 without a run)."""
        return self._timing.partition_calls.get(partition_id, 0)

    def _partition_rows(self, part: Partition) -> list[dict[str, Any]]:
        model, timing = self.model, self._timing
        ops = model.compute_ops(part)
        macs, flops = model.placed_costs(part, "macs"), model.placed_costs(part, "flops")
        moved = self._boundary.of(part, ops)
        weights = [self.time_model.weight(macs.get(i) or flops.get(i), sum(b or 0 for b in moved[i])) for i in ops]
        label = self.time_model.label
        measured = self._measured_weights(ops, weights)
        if measured is not None:
            weights, label = measured
        total = sum(weights)
        label = label if total else "equal"
        shares = [w / total for w in weights] if total else [1 / len(ops)] * len(ops) if ops else []
        time_ns, calls = timing.partition_ns.get(part.id, 0), timing.partition_calls.get(part.id, 0)
        whole = whole_split(time_ns, shares)
        site = part.attributes.get("site") if part.kind == "dispatch" else None
        whole_run, per_invocation = self._executions.get(part.id, (None, None))

        def executed(static: int | None, executions: float | None) -> Any:
            return None if static is None or executions is None else static * executions

        return [{"partition": part.id, "site": site, "op_id": op_id, "op": model.operators[op_id].op,
                 "role": "root" if op_id == part.root_id else "fused", "module_path": model.module_path(op_id),
                 "phase": model.operators[op_id].phase, "macs": macs.get(op_id), "flops": flops.get(op_id),
                 "bytes_read": moved[op_id][0], "bytes_written": moved[op_id][1], "weight": weight, "share": share,
                 "calls": calls, "time_ns": ns, "executed_macs": executed(macs.get(op_id), whole_run),
                 "executed_flops": executed(flops.get(op_id), whole_run),
                 PER_INVOCATION: executed(flops.get(op_id), per_invocation), "time_model": label}
                for op_id, weight, share, ns in zip(ops, weights, shares, whole, strict=True)]

    def _measured_weights(self, ops: tuple[str, ...], roofline: list[float]) -> tuple[list[float], str] | None:
        """Weights in ns from the device's measurements (:mod:`dfit_mlir.analysis.op_timing`):
        every op timed alone (``measured-standalone``), else, where an op has a
        calibrated per-element cost, each op by its standalone time, that cost, or its
        roofline weight over the device's matmul rate (``calibrated-elementwise``); None:
        the roofline's split."""
        found = self._measurements
        if found is None or not ops:
            return None
        standalone = [found.standalone.get(i) for i in ops]
        if all(ns is not None for ns in standalone):
            return [float(ns or 0) for ns in standalone], op_timing.MEASURED
        if not found.macs_per_ns:
            return None
        per_element = [None if ns is not None else found.elementwise_ns(self.model, i)
                       for i, ns in zip(ops, standalone, strict=True)]
        if all(ns is None for ns in per_element):
            return None
        weights = [ns if ns is not None else element if element is not None else weight / found.macs_per_ns
                   for ns, element, weight in zip(standalone, per_element, roofline, strict=True)]
        return weights, op_timing.CALIBRATED

    @cached_property
    def _measurements(self) -> op_timing.Lookup | None:
        """The device's cached op timings for this model, where someone measured them
        (``dfit analyze --time-model measured``) and no time model was given."""
        return op_timing.lookup(self.model) if self._measured_allowed else None

    def _root_rows(self) -> list[dict[str, Any]]:
        """Events naming a ``root_id`` but no call site: the whole time to that op."""
        out = []
        for op_id, ns in self._timing.root_ns.items():
            op = self.model.operators[op_id]
            calls = self._timing.root_calls[op_id]
            out.append({"partition": op.partition, "site": None, "op_id": op_id, "op": op.op, "role": "root",
                        "module_path": self.model.module_path(op_id), "phase": op.phase, "macs": None,
                        "flops": None, "bytes_read": None, "bytes_written": None, "weight": None, "share": 1.0,
                        "calls": calls, "time_ns": int(ns), "executed_macs": None, "executed_flops": None,
                        PER_INVOCATION: None, "time_model": "root"})
        return out

    @cached_property
    def _boundary(self) -> _Boundary:
        return _Boundary(self.model)

    def op_time(self) -> dict[str, float]:
        """Op ID → its measured ns (ops with none left out)."""
        return {k: v for k, v in self.column_by("op_id", "time_ns").items() if v}

    def column_by(self, key: str, column: str) -> dict[Any, float]:
        """``key`` value → the sum of ``column`` over its entries (nulls as 0)."""
        table = self.entries
        found: defaultdict[Any, float] = defaultdict(float)
        for name, value in zip(table.column(key).to_pylist(), table.column(column).to_pylist(), strict=True):
            found[name] += value or 0
        return dict(found)

    def rollup(self, key: str) -> Any:
        """Entries summed by ``key`` (one of :data:`ROLLUP_KEYS`), as an Arrow table."""
        if key not in ROLLUP_KEYS:
            raise ValueError(f"ledger rollup by {key!r}: not one of {', '.join(ROLLUP_KEYS)}")
        grouped = self.entries.group_by(key, use_threads=False).aggregate([(c, "sum") for c in SUM_COLUMNS])
        return grouped.select([key, *(f"{c}_sum" for c in SUM_COLUMNS)]).rename_columns([key, *SUM_COLUMNS])

    def partition_summary(self, part: Partition) -> dict[str, Any]:
        """Root, fused ops and time model of one partition, as a person reads them."""
        rows = self._rows_of(part)
        return {"root": part.root_id, "fused": [r["op_id"] for r in rows if r["role"] == "fused"],
                "time_model": rows[0]["time_model"] if rows else None,
                "shares": {r["op_id"]: r["share"] for r in rows}}

    def time_models_label(self) -> str:
        """Which models split the timed partitions' time, as a reader prints it:
        ``measured-standalone 3, roofline(ridge 4 MAC/B) 5`` (the ledger's own label when
        nothing was timed)."""
        table = self.entries.select(["partition", "time_model", "calls"]).to_pydict()
        timed = {(partition, model) for partition, model, calls in zip(*table.values(), strict=True) if calls}
        found: Counter[str] = Counter(model for _, model in timed)
        if not found:
            return self.time_model.label
        return ", ".join(f"{model} {count}" for model, count in found.most_common()) if len(found) > 1 \
            else next(iter(found))

    # --- what readers print: one denominator, one count of runs, the rollups they need ---

    @cached_property
    def attributed_time_ns(self) -> int:
        """Σ of the entries' ``time_ns``: the time given to ops, the denominator of every
        share of time a reader prints (:data:`SHARE_BASIS`)."""
        return sum(self.entries.column("time_ns").to_pylist())

    def share(self, ns: float | None) -> float | None:
        """``ns`` as a share of :attr:`attributed_time_ns`, to 6 decimals (None without
        a run). Shares of all ops sum to 1."""
        if ns is None or not self.attributed_time_ns:
            return None
        return round(ns / self.attributed_time_ns, 6)

    @property
    def instances(self) -> int:
        """Runs of the program the bundle recorded: distinct invocations (else steps,
        else one run) among its timed execution events — the one count readers divide by."""
        return self.totals.invocations

    def op_time_by_instance(self) -> dict[str, dict[int, float]]:
        """Op ID → {instance: ns}: each partition's time in one run of the program split
        over its ops by the entries' shares (a site inside a loop sums its trips); the
        instances of an op sum to its ``time_ns`` up to the whole-ns rounding."""
        split: defaultdict[str, list[tuple[str, float]]] = defaultdict(list)
        table = self.entries.select(["partition", "op_id", "share", "time_model"]).to_pydict()
        for partition, op_id, share, model in zip(*table.values(), strict=True):
            if model != "root":
                split[partition].append((op_id, share))
        found: defaultdict[str, defaultdict[int, float]] = defaultdict(lambda: defaultdict(float))
        for partition, (instances, times) in self._timing.partition_instance_ns.items():
            for op_id, share in split.get(partition, ()):
                for instance, ns in zip(instances.tolist(), times.tolist(), strict=True):
                    found[op_id][instance] += ns * share
        for (op_id, instance), ns in self._timing.root_instance_ns.items():
            found[op_id][instance] += ns
        return {op_id: dict(by_instance) for op_id, by_instance in found.items()}

    def partition_time_by_instance(self, partition_id: str) -> list[int]:
        """The partition's summed ns in each run of the program that ran it (in instance order)."""
        found = self._timing.partition_instance_ns.get(partition_id)
        return found[1].tolist() if found is not None else []

    def partition_time_spread(self, partition_id: str) -> tuple[int, float, int] | None:
        """(min, median, max) of the partition's summed ns over the runs of the program
        that ran it (:meth:`partition_time_by_instance`), as ``min``, ``statistics.median``
        and ``max`` give them, taken on the array: a long run's list of Python ints is
        ≈30 MiB per partition at 5M events (:func:`~dfit_mlir.core.perf.exact_median`).
        ``None`` where no run ran it."""
        found = self._timing.partition_instance_ns.get(partition_id)
        if found is None or not len(found[1]):
            return None
        times = found[1]
        return int(times.min()), exact_median(times), int(times.max())

    def op_figures(self) -> dict[str, Figures]:
        """Op ID → :data:`OP_FIGURES` summed over its entries: {flops, macs, bytes,
        transcendentals, time_ns, executed_flops, executed_macs, executed_transcendentals},
        ``bytes`` being what crosses its dispatches' boundary (read + written); the
        executed ones ``None`` where they are unknown (:attr:`executed_unknown`)."""
        return self._op_figures

    @property
    def empty_figures(self) -> Figures:
        """The figures of an op (or group) with no entry: 0, executed ones ``None`` where
        they are unknown (a reader's default for :meth:`op_figures`)."""
        return {key: 0 if self._figure_known(key) else None for key in OP_FIGURES}

    def _figure_known(self, key: str) -> bool:
        """Whether figure ``key`` is known: static ones always, whole-run executed ones
        where :attr:`executed_known`, per invocation where :attr:`per_invocation_known`."""
        if key in EXECUTED_FIGURES:
            return self.executed_known
        return self.per_invocation_known if key == PER_INVOCATION else True

    @cached_property
    def _op_figures(self) -> dict[str, Figures]:
        found: dict[str, Figures] = {}
        table = self.entries.select(["op_id", "flops", "macs", "bytes_read", "bytes_written", "transcendentals",
                                     "time_ns", *EXECUTED_FIGURES, PER_INVOCATION]).to_pydict()
        known = {key: self._figure_known(key) for key in (*EXECUTED_FIGURES, PER_INVOCATION)}
        for op_id, flops, macs, read, written, transcendental, ns, *executed in zip(*table.values(), strict=True):
            row = found.setdefault(op_id, self.empty_figures)
            for key, value in (("flops", flops), ("macs", macs), ("bytes", (read or 0) + (written or 0)),
                               ("transcendentals", transcendental), ("time_ns", ns),
                               *((key, value) for key, value in zip((*EXECUTED_FIGURES, PER_INVOCATION), executed,
                                                                    strict=True) if known[key])):
                row[key] = plus(row[key], value or 0)
        return found

    def rollup_ops(self, group_of: Mapping[str, Any]) -> dict[Any, Figures]:
        """Group → :meth:`op_figures` summed over the ops ``group_of`` maps to it (per
        source line, per site, …); ops mapped to ``None`` or absent are left out."""
        figures = self.op_figures()
        found: dict[Any, Figures] = {}
        for op_id, group in group_of.items():
            if group is None or op_id not in figures:
                continue
            row = found.setdefault(group, self.empty_figures)
            for key, value in figures[op_id].items():
                row[key] = plus(row[key], value)
        return found

    @cached_property
    def executed_totals(self) -> dict[str, int | None]:
        """{executed_flops, executed_macs, executed_transcendentals}: the entries' sums,
        the whole run's work (each ``None`` where executed figures are unknown)."""
        if not self.executed_known:
            return dict.fromkeys(EXECUTED_FIGURES)
        return {key: sum(value or 0 for value in self.entries.column(key).to_pylist()) for key in EXECUTED_FIGURES}

    @cached_property
    def flops_per_invocation(self) -> float | None:
        """Executed FLOPs of one invocation of the program (Σ of the entries'
        :data:`PER_INVOCATION`, to 3 decimals), from :attr:`executed_basis`; None where
        unknown (:attr:`per_invocation_unknown`)."""
        if not self.per_invocation_known:
            return None
        return round(sum(value or 0 for value in self.entries.column(PER_INVOCATION).to_pylist()), 3)

    def per_invocation_of(self, figures: Figures) -> float | None:
        """A row of figures' executed FLOPs per invocation, as every reader prints it (to
        3 decimals); None where unknown."""
        value = figures.get(PER_INVOCATION)
        return None if value is None else round(value, 3)

    @cached_property
    def total_flops(self) -> int:
        """Σ of the entries' placed FLOPs: the model's total (the denominator of a share of
        FLOPs, where nothing was timed)."""
        return sum(value or 0 for value in self.entries.column("flops").to_pylist())

    def partition_figures(self, partition_id: str) -> Figures:
        """:data:`OP_FIGURES` summed over the partition's entries: what a roofline places
        it by (program-analyzer and the view alike); executed ones ``None`` where unknown."""
        return self._partition_figures.get(partition_id, self.empty_figures)

    @cached_property
    def _partition_figures(self) -> dict[str, Figures]:
        found: dict[str, Figures] = {}
        for row in self.rollup("partition").to_pylist():
            found[row["partition"]] = {"macs": row["macs"] or 0, "flops": row["flops"] or 0,
                                       "bytes": (row["bytes_read"] or 0) + (row["bytes_written"] or 0),
                                       "transcendentals": row["transcendentals"] or 0, "time_ns": row["time_ns"] or 0,
                                       **{key: (row[key] or 0) if self._figure_known(key) else None
                                          for key in (*EXECUTED_FIGURES, PER_INVOCATION)}}
        return found

    def flop_share(self, flops: float | None) -> float | None:
        if flops is None or not self.total_flops:
            return None
        return round(flops / self.total_flops, 6)

    def module_tree(self, ops: Iterable[str] | None = None,
                    classes: Callable[[str], dict[str, str]] | None = None) -> dict[str, ModuleNode]:
        """Module path → node with self and inclusive sums of :data:`TREE_FIGURES` of
        :meth:`op_figures` (plus ``ops``, the op count; executed figures ``None`` where
        unknown) over ``ops`` (default: every op with a module path), in
        the order the model computes (ops doing no arithmetic last, so importers' hoisted
        constants do not decide it). ``classes(op_id)``: {ancestor path: module class}."""
        figures = self.op_figures()
        model = self.model
        chosen = list(model.operators) if ops is None else list(ops)
        located = [(op_id, path) for op_id in chosen if (path := model.module_path(op_id)) is not None]
        located.sort(key=lambda item: not model.operators[item[0]].flops)
        empty = self.empty_figures
        tree = build_tree((path, model.operators[op_id].module_class, model.operators[op_id].phase,
                           {"ops": 1, **{key: figures.get(op_id, empty)[key] for key in TREE_FIGURES}},
                           classes(op_id) if classes else {})
                          for op_id, path in located)
        # build_tree sums PER_INVOCATION as a static figure (unknown → 0) and gives it no
        # self value on a node holding no op: the ledger says which it is.
        known = self.per_invocation_known
        for node in tree.values():
            for values in (node.values, node.self_values):
                values[PER_INVOCATION] = values.get(PER_INVOCATION, 0) if known else None
        return tree


#: What every share of time a reader prints is a share of (:meth:`Ledger.share`).
SHARE_BASIS = "attributed time"
#: One op's (or group's) :data:`OP_FIGURES`: numbers, executed ones ``float | None``
#: (``None``: unknown), hence values typed ``Any`` for readers that take a static one.
Figures = dict[str, Any]
#: Executed work (static figure × calls, the whole run; module doc) is
#: :data:`~dfit_mlir.core.module_paths.EXECUTED_FIGURES`: ``None`` where unknown.
#: Per-op figures of :meth:`Ledger.op_figures`; the module tree sums :data:`TREE_FIGURES`.
OP_FIGURES = ("flops", "macs", "bytes", "transcendentals", "time_ns", *EXECUTED_FIGURES, PER_INVOCATION)
TREE_FIGURES = ("flops", "bytes", "time_ns", *EXECUTED_FIGURES, PER_INVOCATION)


def plus(a: float | None, b: float | None) -> float | None:
    """``a + b`` where ``None`` is unknown: known if either is."""
    return b if a is None else a if b is None else a + b


def whole_split(amount: int, shares: list[float]) -> list[int]:
    """``amount`` ns in whole ns in proportion to ``shares``: floors, then one more ns to
    the largest remainders (ties: first entry first), so the parts sum to ``amount``."""
    import math

    exact = [amount * share for share in shares]
    parts = [math.floor(value) for value in exact]
    missing = round(sum(exact)) - sum(parts)
    for index in sorted(range(len(parts)), key=lambda i: (parts[i] - exact[i], i))[:max(0, missing)]:
        parts[index] += 1
    return parts


def of(model: SemanticModel) -> Ledger:
    """The model's ledger, built on first use and kept with the model."""
    found = model.__dict__.get("_dfit_ledger")
    if found is None:
        found = model.__dict__["_dfit_ledger"] = Ledger(model)
    return found


# --- boundary bytes ---------------------------------------------------------------------

class _Boundary:
    """Bytes each op of a partition reads from / writes to outside it (module doc)."""

    def __init__(self, model: SemanticModel):
        self.model = model
        self.tensors = [t for t in model.tensors if t.get("bytes") is not None]
        self.sizes = {t["id"]: t["bytes"] for t in self.tensors}  # once: not per partition (971 × 5k tensors)
        self.cache: dict[tuple[str, tuple[str, ...]], dict[str, tuple[int | None, int | None]]] = {}
        #: Partitions whose bytes are their dispatch signature's (:meth:`_signed`).
        self.signed: set[str] = set()
        self.consumed: defaultdict[str, list[dict[str, Any]]] = defaultdict(list)
        self.produced: defaultdict[str, list[dict[str, Any]]] = defaultdict(list)
        for tensor in self.tensors:
            self.produced[tensor.get("producer") or ""].append(tensor)
            for consumer in tensor.get("consumers") or ():
                self.consumed[consumer].append(tensor)

    def _kind(self, op_id: str | None) -> str:
        op = self.model.operator(op_id) if op_id else None
        return op.kind if op is not None else ""

    def _weight(self, tensor: Mapping[str, Any]) -> bool:
        return tensor.get("constant") is True or self._kind(tensor.get("producer")) == "constant"

    def _origin(self, tensor: Mapping[str, Any], inside: set[str]) -> str | None:
        """The producer a value really comes from: through ops that only reshape a value
        (a ``view`` between a matmul and its GELU, outside the dispatch after fusion)."""
        producer = tensor.get("producer")
        for _ in range(16):
            if producer in inside or self._kind(producer) not in PASS_THROUGH:
                return producer
            sources = [t for t in self.consumed.get(producer or "", ()) if not self._weight(t)]
            if len(sources) != 1:
                return producer
            producer = sources[0].get("producer")
        return producer

    def _escapes(self, tensor: Mapping[str, Any], inside: set[str], depth: int = 0) -> bool:
        """Whether a value leaves the partition: a graph output, or a consumer outside
        that is not a reshape feeding only the partition back."""
        consumers = set(tensor.get("consumers") or ())
        if not consumers:
            return True
        for consumer in consumers - inside:
            if self._kind(consumer) not in PASS_THROUGH or depth > 16:
                return True
            if any(self._escapes(t, inside, depth + 1) for t in self.produced.get(consumer, ())):
                return True
        return False

    def of(self, part: Partition, ops: tuple[str, ...]) -> dict[str, tuple[int | None, int | None]]:
        key = (part.id, ops)  # the entries and bytes_moved (program-analyzer, dfit view) ask alike
        found = self.cache.get(key)
        if found is None:
            found = self.cache[key] = self._signed(part, self._of(part, ops))
        return found

    def dtype(self, part: Partition) -> str | None:
        """The element type a partition computes in (:meth:`Ledger.dtype`)."""
        ops = operators_dtype(self.model, part)
        return self._narrowed(part, ops) or ops or dispatch_dtype(self.model, part)

    def _narrowed(self, part: Partition, ops: str | None) -> str | None:
        """The dispatch's element type where it is narrower than the ops' (a quantized or
        demoted dispatch; a bool mask is never what one computes in), else None."""
        site = dispatch_dtype(self.model, part)
        if site is None or ops is None or site == "i1":
            return None
        narrow, wide = costs.dtype_bits(site), costs.dtype_bits(ops)
        return site if narrow is not None and wide is not None and narrow < wide else None

    def _signed(self, part: Partition, moved: dict[str, tuple[int | None, int | None]],
                ) -> dict[str, tuple[int | None, int | None]]:
        """The dispatch region's own bytes where it computes in a narrower type than the
        ops (module doc), split over the ops as the tensor graph splits them; else ``moved``."""
        if not moved or self._narrowed(part, operators_dtype(self.model, part)) is None:
            return moved
        row = _site_row(self.model, part) or {}
        read, written = row.get("bytes_read"), row.get("bytes_written")
        if not isinstance(read, int) or not isinstance(written, int):
            return moved
        ids = list(moved)
        reads = whole_split(read, _proportions([moved[i][0] or 0 for i in ids]))
        writer = part.root_id if part.root_id in moved else None
        writes = whole_split(written, [1.0 if i == writer else 0.0 for i in ids] if writer else
                             _proportions([moved[i][1] or 0 for i in ids]))
        self.signed.add(part.id)
        return {i: (r, w) for i, r, w in zip(ids, reads, writes, strict=True)}

    def _of(self, part: Partition, ops: tuple[str, ...]) -> dict[str, tuple[int | None, int | None]]:
        if not self.tensors:  # an op's own bytes (operands + results), else its values'
            return {i: (op.bytes, 0) if (op := self.model.operators[i]).bytes is not None else
                    (_operand_bytes(self.model, i, "operands"), _operand_bytes(self.model, i, "results")) for i in ops}
        inside = set(part.operator_ids)
        compute = set(ops)
        readers: defaultdict[str, list[str]] = defaultdict(list)
        for op_id in ops:
            for tensor in self.consumed.get(op_id, ()):
                if self._kind(tensor.get("producer")) != "empty" and (
                        self._weight(tensor) or self._origin(tensor, inside) not in inside):
                    readers[tensor["id"]].append(op_id)
        read: Counter[str] = Counter()
        sizes = self.sizes
        for tensor_id, consumers in readers.items():
            for op_id in dict.fromkeys(consumers):
                read[op_id] += sizes[tensor_id] / len(dict.fromkeys(consumers))
        written: Counter[str] = Counter()
        writer = part.root_id if part.root_id in compute else None
        for op_id in compute:
            for tensor in self.produced.get(op_id, ()):
                if not self._weight(tensor) and self._escapes(tensor, inside):
                    written[writer or op_id] += tensor["bytes"]
        return {i: (round(read[i]), written[i]) for i in ops}


def _proportions(amounts: list[float]) -> list[float]:
    """Shares of ``amounts`` (equal where they are all 0)."""
    total = sum(amounts)
    return [a / total for a in amounts] if total else [1 / len(amounts)] * len(amounts)


def _site_row(model: SemanticModel, part: Partition) -> Mapping[str, Any] | None:
    index = part.attributes.get("site") if part.kind == "dispatch" else None
    sites = model.manifest.get("partitions", {}).get("dispatch_sites", [])
    return sites[index] if isinstance(index, int) and 0 <= index < len(sites) else None


#: The element types closing an IREE export name: ``conv_8x16x16x3x3x3_i8xi8xi32``.
_EXPORT_TYPES = re.compile(r"_((?:[a-z]+[0-9]+)(?:x[a-z]+[0-9]+)*)$")


def dispatch_dtype(model: SemanticModel, part: Partition) -> str | None:
    """The element type a dispatch's region computes in: the manifest's site ``dtype``,
    else the first element type of its export name (None: not a dispatch, or neither)."""
    row = _site_row(model, part)
    if row is None:
        return None
    if row.get("dtype"):
        return str(row["dtype"])
    match = _EXPORT_TYPES.search(str(row.get("export") or ""))
    return match.group(1).split("x", 1)[0] if match else None


def operators_dtype(model: SemanticModel, part: Partition) -> str | None:
    """Element type of the first operand of the partition's op doing most MACs there
    (placed: a conv whose padding was fused into another dispatch does not type that
    one), else of its root, else of any op, as the source graph types it."""
    placed = model.placed_costs(part, "macs")
    ops = [model.operators[i] for i in part.operator_ids if i in model.operators]
    for op in sorted(ops, key=lambda o: (-(placed.get(o.id) or 0), o.id != part.root_id)):
        for operand in op.operands:
            if operand.get("dtype"):
                return str(operand["dtype"])
    return None


def _operand_bytes(model: SemanticModel, op_id: str, side: str) -> int | None:
    values = getattr(model.operators[op_id], side)
    known = [v.get("bytes") for v in values if v.get("bytes") is not None]
    return sum(known) if known else None


# --- measured time ----------------------------------------------------------------------

class _StringCodes:
    """Codes of a string column's values that hold across batches (-1: null), read from
    the dictionary the event schema encodes it with: no string per event."""

    def __init__(self) -> None:
        self.values: list[str] = []
        self._code: dict[str, int] = {}

    def codes(self, np: Any, pa: Any, pc: Any, column: Any) -> Any:
        encoded = column if pa.types.is_dictionary(column.type) else pc.dictionary_encode(column)
        lookup = np.array([self._of(value) for value in encoded.dictionary.cast(pa.string()).to_pylist()] + [-1],
                          dtype=np.int64)
        return lookup[encoded.indices.fill_null(len(lookup) - 1).to_numpy(zero_copy_only=False)]

    def _of(self, value: str) -> int:
        code = self._code.get(value)
        if code is None:
            code = self._code[value] = len(self.values)
            self.values.append(value)
        return code


#: Timed events the interval totals hold at once. The leaf rule and the unions take the
#: events in start order, which a long run's file does not keep (a window's families in
#: turn, windows in time order); past this many, the events are read again a time
#: bucket at a time, each bucket sorted alone (a bucket holds at most this many, or the
#: events of one bin of start times).
BUCKET_EVENTS = 1 << 18

#: The event columns the measured time reads.
_TIMING_COLUMNS = ("kind", "duration_ns", "start_ns", "site", "partition", "root_id", "invocation", "step")

#: Bins of the run's start times the buckets are cut from (counted in a second pass).
START_BINS = 1 << 16


@dataclass(frozen=True)
class _Rows:
    """Timed execution events, column-wise: position (index among all of them in reading
    order), start (-1: none), end, kind (index in :data:`KINDS`), at a call site,
    partition and root op (codes, -1: none), duration, instance."""

    position: Any
    start: Any
    end: Any
    kind: Any
    is_site: Any
    site: Any
    partition: Any
    root: Any
    duration: Any
    instance: Any

    def take(self, rows: Any) -> _Rows:
        return _Rows(*(column[rows] for column in (self.position, self.start, self.end, self.kind, self.is_site,
                                                   self.site, self.partition, self.root, self.duration,
                                                   self.instance)))

    @staticmethod
    def joined(np: Any, parts: list[_Rows]) -> _Rows:
        if not parts:
            empty = np.zeros(0, dtype=np.int64)
            return _Rows(empty, empty, empty, empty, np.zeros(0, dtype=bool), empty, empty, empty, empty, empty)
        return _Rows(*(np.concatenate(column) for column in zip(
            *((r.position, r.start, r.end, r.kind, r.is_site, r.site, r.partition, r.root, r.duration, r.instance)
              for r in parts), strict=True)))


@dataclass(frozen=True)
class _Parked:
    """Rows waiting in a time bucket not yet whole (:func:`_routed_buckets`), in about
    half the memory: without their ends (the start plus the duration, as
    :func:`_batch_rows` makes them) and each integer column in 32 bits where its values
    fit; given back as the :class:`_Rows` they were, column types and all. (A 5M-event
    run's routed pass held up to 394k events waiting: its ledger peaked at 246 MiB with
    them as rows, 228-230 parked.)"""

    columns: tuple[Any, ...]  # position, start, kind, is_site, site, partition, root, duration, instance
    types: tuple[Any, ...]

    @staticmethod
    def of(np: Any, rows: _Rows) -> _Parked:
        columns = (rows.position, rows.start, rows.kind, rows.is_site, rows.site, rows.partition, rows.root,
                   rows.duration, rows.instance)
        return _Parked(tuple(_narrowed(np, column) for column in columns), tuple(column.dtype for column in columns))

    @staticmethod
    def joined(np: Any, parts: list[_Parked]) -> _Rows:
        if not parts:
            return _Rows.joined(np, [])
        position, start, kind, is_site, site, partition, root, duration, instance = (
            np.concatenate(column).astype(dtype, copy=False)
            for column, dtype in zip(zip(*(part.columns for part in parts), strict=True), parts[0].types,
                                     strict=True))
        return _Rows(position, start, np.where(start >= 0, start + duration, -1), kind, is_site, site, partition,
                     root, duration, instance)


def _narrowed(np: Any, column: Any) -> Any:
    """An integer ``column`` as int32 where its values fit, else as it is."""
    if column.dtype.kind != "i" or column.dtype.itemsize <= 4 or not len(column):
        return column
    limits = np.iinfo(np.int32)
    return column.astype(np.int32) if limits.min <= int(column.min()) and int(column.max()) <= limits.max else column


def _batch_rows(np: Any, pa: Any, pc: Any, batch: Any, sites: int, partitions: _StringCodes, roots: _StringCodes,
                offset: int) -> _Rows | None:
    """``batch``'s timed execution events (``offset``: how many came before)."""
    codes = _kind_codes(np, pa, batch.column("kind"))
    timed = pc.fill_null(pc.greater(batch.column("duration_ns"), pa.scalar(0)), False) \
        .to_numpy(zero_copy_only=False)
    keep = timed & (codes >= 0)
    if not keep.any():
        return None
    chosen = batch if keep.all() else batch.filter(pa.array(keep))
    kind = codes[keep]
    duration = chosen.column("duration_ns").to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    start = pc.fill_null(chosen.column("start_ns"), -1).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    site = pc.fill_null(chosen.column("site"), -1).to_numpy(zero_copy_only=False).astype(np.int64)
    return _Rows(offset + np.arange(len(kind)), start, np.where(start >= 0, start + duration, -1), kind,
                 (kind == DISPATCH) & (site >= 0) & (site < sites), site,
                 partitions.codes(np, pa, pc, chosen.column("partition")), roots.codes(np, pa, pc, chosen.column("root_id")),
                 duration, _instance_keys(np, pc, chosen))


def _timing(model: SemanticModel, batches: Iterable[Any] | Callable[[], Iterable[Any]]) -> _Timing:
    """Per-partition event sums and the interval totals, vectorised over the batches.
    A dispatch event at a call site is the innermost execution unit and always counts
    (dispatches overlapping on several threads do not enclose one another's work);
    any other event counts only if it is a leaf. ``batches``: the events, or what reads
    them again (then a long run's intervals are taken a time bucket at a time:
    :data:`BUCKET_EVENTS`)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    dispatches = [p for p in model.partitions if p.kind == "dispatch"]
    site_ns = np.zeros(len(dispatches), dtype=np.int64)
    site_calls = np.zeros(len(dispatches), dtype=np.int64)
    partitions, roots = _StringCodes(), _StringCodes()
    instance_sets: list[Any] = []
    # Per call site: the (instances, summed ns) of the batches since the last fold, and
    # their fold (a long run's per-invocation sums: the only part of the pass that grows).
    site_sums = [_SiteSums() for _ in dispatches]
    held: list[_Rows] = []
    held_count = 0
    spilled = False
    low, high = np.iinfo(np.int64).max, -1  # the range of the start times
    offset = 0
    for batch in (batches() if callable(batches) else batches):
        rows = _batch_rows(np, pa, pc, batch, len(dispatches), partitions, roots, offset)
        if rows is None:
            continue
        offset += len(rows.kind)
        at, duration = rows.is_site, rows.duration
        site_ns += np.bincount(rows.site[at], weights=duration[at], minlength=len(dispatches)).astype(np.int64)
        site_calls += np.bincount(rows.site[at], minlength=len(dispatches))
        instance_sets.append(np.unique(rows.instance))
        if len(instance_sets) > _SiteSums.FOLD_BATCHES:  # each batch's: together they grow with the run
            instance_sets = [sorted_distinct(np.concatenate(instance_sets))]
        sites, keys, totals = _pair_sums(np, rows.site[at], rows.instance[at], duration[at])
        bounds = np.searchsorted(sites, np.arange(len(dispatches) + 1))
        for index, sums in enumerate(site_sums):
            if bounds[index] < bounds[index + 1]:
                sums.add(np, keys[bounds[index]:bounds[index + 1]], totals[bounds[index]:bounds[index + 1]])
        started = rows.start[rows.start >= 0]
        if len(started):
            low, high = min(low, int(started.min())), max(high, int(started.max()))
        if not spilled:
            held.append(rows)
            held_count += len(rows.kind)
            if callable(batches) and held_count > BUCKET_EVENTS:
                spilled, held = True, []
    intervals = _Intervals(model, partitions, roots)
    if not spilled:
        intervals.add(np, _Rows.joined(np, held), np.iinfo(np.int64).max)
    else:
        assert callable(batches)
        for bucket, later_min_end in _buckets(np, pa, pc, batches, len(dispatches), partitions, roots, low, high,
                                              source=str(model.events_path or "the events")):
            intervals.add(np, bucket, later_min_end)
    # Load time (invocation -1) and work outside any submission (-2) are not runs of the
    # program: counting them would divide every per-invocation figure by one run too many.
    seen = sorted_distinct(np.concatenate(instance_sets)) if instance_sets else np.zeros(0, dtype=np.int64)
    invocations = int((seen >= 0).sum())
    timing = intervals.timing(np, dispatches, site_ns, site_calls, invocations)
    for partition, sums in zip(dispatches, site_sums, strict=True):
        found = sums.folded(np)
        if found is not None:
            timing.partition_instance_ns[partition.id] = found
    return timing


class _SiteSums:
    """One call site's summed ns per instance of the program, folded every
    :attr:`FOLD_BATCHES` batches: summing all (site, instance) pairs of a long run at the
    end sorted them together (≈100 MiB at 5M events); a site at a time, a few batches at
    a time, holds little more than the sums themselves."""

    FOLD_BATCHES = 8

    def __init__(self) -> None:
        self.parts: list[tuple[Any, Any]] = []

    def add(self, np: Any, keys: Any, totals: Any) -> None:
        self.parts.append((keys, totals))
        if len(self.parts) > self.FOLD_BATCHES:
            self.parts = [self._fold(np)]

    def folded(self, np: Any) -> tuple[Any, Any] | None:
        """(instances in ascending order, their summed ns), or None for a site never run;
        the parts are let go (each site's sums were held twice at the end, folded and
        not: the ledger of a 22M-event bundle peaked 64 MiB higher)."""
        if not self.parts:
            return None
        found, self.parts = self._fold(np), []
        return found

    def _fold(self, np: Any) -> tuple[Any, Any]:
        keys, totals = zip(*self.parts, strict=True)
        return _key_sums(np, np.concatenate(keys), np.concatenate(totals))


def _key_sums(np: Any, keys: Any, values: Any) -> tuple[Any, Any]:
    """(distinct keys in ascending order, the exact integer sum of the values of each)."""
    distinct, inverse = np.unique(keys, return_inverse=True)
    totals = np.zeros(len(distinct), dtype=np.int64)
    np.add.at(totals, inverse.reshape(-1), values.astype(np.int64, copy=False))
    return distinct, totals


def _buckets(np: Any, pa: Any, pc: Any, batches: Callable[[], Iterable[Any]], sites: int, partitions: _StringCodes,
             roots: _StringCodes, low: int, high: int, source: str = "the events") -> Iterator[tuple[_Rows, int]]:
    """The timed events a time bucket at a time, in start order of the buckets, each with
    the earliest end among the events of the later buckets (what the leaf rule needs to
    know of them). A pass counts the events per bin of start times (and the earliest end
    per bin), which cuts the buckets (consecutive bins; events without a start: with the
    first bucket) and says how many events each holds; one more pass hands each event
    to its bucket and gives a bucket as soon as it is whole and those before it are
    given (:func:`_routed_buckets`). Only where that would hold more than
    :data:`ROUTED_EVENTS` events at once (a file far from start order) are the buckets
    left read by a pass each. ``source``: the file the events are read from (errors name it)."""
    span = max(high - low + 1, 1)

    def bins_of(start: Any) -> Any:  # a monotonic function of the start: equal starts share a bin
        return np.clip(((start - low) / span * START_BINS).astype(np.int64), 0, START_BINS - 1)

    def read() -> Iterator[_Rows]:
        offset = 0
        for batch in batches():
            rows = _batch_rows(np, pa, pc, batch, sites, partitions, roots, offset)
            if rows is not None:
                offset += len(rows.kind)
                yield rows

    counts = np.zeros(START_BINS, dtype=np.int64)
    earliest_end = np.full(START_BINS, np.iinfo(np.int64).max)
    unstarted = 0
    for rows in read():
        started = rows.start >= 0
        unstarted += int((~started).sum())
        where = bins_of(rows.start[started])
        counts += np.bincount(where, minlength=START_BINS)
        np.minimum.at(earliest_end, where, rows.end[started])
    after = np.append(np.minimum.accumulate(earliest_end[::-1])[::-1][1:], np.iinfo(np.int64).max)
    # The buckets' last bins: each bucket takes the bins after the one before while they
    # hold at most BUCKET_EVENTS events together (at least one bin).
    so_far = np.cumsum(counts)
    lasts: list[int] = []
    while not lasts or lasts[-1] + 1 < START_BINS:
        first = lasts[-1] + 1 if lasts else 0
        before = int(so_far[first - 1]) if first else 0
        lasts.append(max(first, int(np.searchsorted(so_far, before + BUCKET_EVENTS, side="right")) - 1))
    bucket_of_bin = np.repeat(np.arange(len(lasts)), np.diff(np.array([-1, *lasts])))
    held = np.diff(np.concatenate([[0], so_far[lasts]]))
    held[0] += unstarted

    def bucket_of(rows: _Rows) -> Any:
        started = rows.start >= 0
        bucket = np.zeros(len(rows.start), dtype=np.int64)  # the unstarted: the first bucket
        bucket[started] = bucket_of_bin[bins_of(rows.start[started])]
        return bucket

    given = 0
    for bucket, rows in _routed_buckets(np, read(), bucket_of, held, source):
        yield rows, int(after[lasts[bucket]])
        given = bucket + 1
    for bucket in range(given, len(lasts)):  # what the routed pass did not give: a pass each
        parts = []
        for rows in read():
            mine = bucket_of(rows) == bucket
            if mine.any():
                parts.append(rows.take(mine))
        yield _Rows.joined(np, parts), int(after[lasts[bucket]])


#: Events the routed pass (:func:`_routed_buckets`) holds at most in buckets not yet
#: whole: two buckets' worth. A long run's ``events.parquet`` is in start order but for
#: its families' batches (each family's events written in whole batches as they fill,
#: so a batch reaches a few windows back): 394k events at most for a 5M-event run.
ROUTED_EVENTS = 2 * BUCKET_EVENTS


def _routed_buckets(np: Any, read: Iterable[_Rows], bucket_of: Callable[[_Rows], Any],
                    expected: Any, source: str = "the events") -> Iterator[tuple[int, _Rows]]:
    """(bucket, its events in reading order) for the buckets in order, from one pass over
    ``read``: each batch's events handed to their buckets (``bucket_of``), a bucket given
    once it holds the ``expected`` number of events and every bucket before it is given.
    Stops early, having given the buckets before some bucket, where the buckets not yet
    whole would hold more than :data:`ROUTED_EVENTS` events. Events that do not add up to
    the counts are :class:`InvalidInputError` naming ``source``."""
    parts: dict[int, list[_Parked]] = {}
    have = np.zeros(len(expected), dtype=np.int64)
    waiting = 0  # events held in buckets not yet given
    bucket = 0  # the next bucket to give
    for rows in read:
        of = bucket_of(rows)
        for target in np.unique(of).tolist():
            mine = rows.take(of == target)
            parts.setdefault(target, []).append(_Parked.of(np, mine))
            have[target] += len(mine.kind)
            waiting += len(mine.kind)
        while bucket < len(expected) and have[bucket] == expected[bucket]:
            given = parts.pop(bucket, [])
            waiting -= int(have[bucket])
            yield bucket, _Parked.joined(np, given)
            bucket += 1
        if waiting > ROUTED_EVENTS:
            return
    if bucket < len(expected):  # the events counted before are not the events read now
        raise InvalidInputError(f"{source}: the events changed while they were read: {int(have[bucket])} events "
                                f"in a time bucket where the pass before counted {int(expected[bucket])}")


class _Intervals:
    """The leaf rule and the interval totals over the timed events, given in buckets of
    increasing start times (one bucket: all of them), and the sums of the leaves at no
    call site: per root op, per group, the rest. Memory: a bucket's events and a few
    numbers per root op, group and (kind, partition)."""

    def __init__(self, model: SemanticModel, partitions: _StringCodes, roots: _StringCodes) -> None:
        self.model, self.partitions, self.roots = model, partitions, roots
        #: The latest end of the spans so far (all; attributed ones).
        self.reach: int | None = None
        self.done_reach: int | None = None
        self.measured = self.attributed_union = self.leaf_sum = 0
        self.kind_counts = [0] * len(KINDS)
        #: Per root op / group / (kind, partition): [ns, calls, first position].
        self.root: dict[int, list[int]] = {}
        self.group: dict[str, list[int]] = {}
        self.rest: dict[tuple[int, int], list[int]] = {}
        self.root_instance: dict[tuple[int, int], list[int]] = {}
        self.group_instance: list[tuple[Any, Any, Any]] = []
        self._group_of: dict[tuple[int, int], str | None] = {}

    def add(self, np: Any, rows: _Rows, later_min_end: int) -> None:
        start, end, is_site = rows.start, rows.end, rows.is_site
        timed = start >= 0
        leaf = np.ones(len(start), dtype=bool)  # an event without a start encloses nothing
        order = _start_order(np, start, end, timed)
        if (~is_site).any():  # dispatches at a call site are leaves by rule; only the others are tested
            leaf[order] = _leaves_in_order(np, end[order], later_min_end) | is_site[order]
        done = is_site.copy()
        other = ~is_site & leaf
        if other.any():
            done[other] = self._add_others(np, rows.take(other))
        spans = order[leaf[order]]
        spans_start, spans_end = start[spans], end[spans]
        measured, self.reach = _union_from(np, spans_start, spans_end, self.reach)
        self.measured += measured
        attributed, self.done_reach = _union_from(np, spans_start[done[spans]], spans_end[done[spans]],
                                                  self.done_reach)
        self.attributed_union += attributed
        self.leaf_sum += int((spans_end - spans_start).sum())
        for index, count in enumerate(np.bincount(rows.kind[leaf], minlength=len(KINDS)).tolist()):
            self.kind_counts[index] += count

    def _add_others(self, np: Any, rows: _Rows) -> Any:
        """Sum the leaves at no call site; returns which were attributed (to a root op or group).
        The op an event names is the most precise place for its time; else the group (a
        reconstruction's partition) it ran in, split over its ops like a dispatch."""
        known = np.array([name in self.model.operators for name in self.roots.values] + [False], dtype=bool)
        at_root = known[rows.root]  # root -1: the appended False
        pairs, pair_of_row = np.unique(np.stack([rows.kind, rows.partition], axis=1), axis=0, return_inverse=True)
        group_ids = [self._group((int(k), int(p))) for k, p in pairs.tolist()]
        named = sorted({gid for gid in group_ids if gid is not None})
        group_code = np.array([named.index(gid) if gid is not None else -1 for gid in group_ids],
                              dtype=np.int64)[pair_of_row.reshape(-1)]
        in_group = ~at_root & (group_code >= 0)
        _accumulate(np, self.root, rows.root[at_root][:, None], rows.duration[at_root], rows.position[at_root],
                    lambda key: key[0])
        _accumulate(np, self.root_instance, np.stack([rows.root[at_root], rows.instance[at_root]], axis=1),
                    rows.duration[at_root], rows.position[at_root], lambda key: (key[0], key[1]))
        _accumulate(np, self.group, group_code[in_group][:, None], rows.duration[in_group], rows.position[in_group],
                    lambda key: named[key[0]])
        if in_group.any():
            codes, keys, totals = _pair_sums(np, group_code[in_group], rows.instance[in_group], rows.duration[in_group])
            self.group_instance.append((np.array(named, dtype=object)[codes], keys, totals))
        rest = ~at_root & ~in_group
        _accumulate(np, self.rest, np.stack([rows.kind[rest], rows.partition[rest]], axis=1), rows.duration[rest],
                    rows.position[rest], lambda key: (key[0], key[1]))
        return at_root | in_group

    def _group(self, pair: tuple[int, int]) -> str | None:
        if pair not in self._group_of:
            kind, partition = pair
            group = self.model.partition_of_event({"kind": KINDS[kind], "partition": self.partitions.values[partition]
                                                   if partition >= 0 else None})
            self._group_of[pair] = group.id if group is not None else None
        return self._group_of[pair]

    def timing(self, np: Any, dispatches: list[Partition], site_ns: Any, site_calls: Any, invocations: int) -> _Timing:
        def ordered(sums: dict[Any, list[int]]) -> list[tuple[Any, list[int]]]:  # as they first appeared
            return sorted(sums.items(), key=lambda item: item[1][2])

        roots = self.roots.values
        root_ns = {roots[code]: ns for code, (ns, _, _) in ordered(self.root)}
        root_calls = {roots[code]: calls for code, (_, calls, _) in ordered(self.root)}
        root_instance_ns = {(roots[code], key): ns for (code, key), (ns, _, _) in ordered(self.root_instance)}
        group_ns = {gid: ns for gid, (ns, _, _) in ordered(self.group)}
        group_calls = {gid: calls for gid, (_, calls, _) in ordered(self.group)}
        group_instance_ns: dict[str, tuple[Any, Any]] = {}
        if self.group_instance:
            names, keys, totals = (np.concatenate(column) for column in zip(*self.group_instance, strict=True))
            for gid in sorted(set(names.tolist())):
                mine = names == gid
                group_instance_ns[gid] = _pair_sums(np, np.zeros(int(mine.sum()), dtype=np.int64), keys[mine],
                                                    totals[mine])[1:]
        # Most time first; ties in the order they first appear (Counter.most_common's).
        rest = tuple(Unattributed(KINDS[k], self.partitions.values[p] if p >= 0 else None, calls, ns)
                     for (k, p), (ns, calls, _) in sorted(ordered(self.rest), key=lambda item: -item[1][0]))
        totals = Totals(measured_ns=self.measured, leaf_sum_ns=self.leaf_sum, attributed_union_ns=self.attributed_union,
                        attributed_ns=int(site_ns.sum()) + sum(root_ns.values()) + sum(group_ns.values()),
                        kinds={KINDS[n]: count for n, count in enumerate(self.kind_counts) if count},
                        invocations=invocations)
        return _Timing({**{p.id: int(site_ns[i]) for i, p in enumerate(dispatches) if site_calls[i]}, **group_ns},
                       {**{p.id: int(site_calls[i]) for i, p in enumerate(dispatches) if site_calls[i]}, **group_calls},
                       root_ns, root_calls, rest, totals, group_instance_ns, root_instance_ns)


def _accumulate(np: Any, sums: dict[Any, list[int]], keys: Any, values: Any, positions: Any,
                name: Callable[[Any], Any]) -> None:
    """``sums[name(key)] += [value, 1, first position]`` per distinct row of ``keys``."""
    if not len(values):
        return
    distinct, totals, counts, first = _sums_in_first_order(np, keys, values)
    for key, total, count, at in zip(distinct.tolist(), totals.tolist(), counts.tolist(), positions[first].tolist(),
                                     strict=True):
        found = sums.setdefault(name(key), [0, 0, at])
        found[0] += total
        found[1] += count
        found[2] = min(found[2], at)


def _union_from(np: Any, start: Any, end: Any, reach: int | None) -> tuple[int, int | None]:
    """(length of the union of [start, end) sorted by start, not counting what reaches
    before ``reach``; the new reach) — :func:`_union_sorted` continued over buckets."""
    if not len(start):
        return 0, reach
    floor = np.iinfo(np.int64).min if reach is None else reach
    ahead = np.maximum.accumulate(np.maximum(end, floor))
    before = np.concatenate(([floor], ahead[:-1]))
    return int(np.clip(end - np.maximum(start, before), 0, None).sum()), int(ahead[-1])


def _instance_keys(np: Any, pc: Any, batch: Any) -> Any:
    """Each event's instance of the program: its invocation, else its step (a
    reconstruction's training step), else 0 (one run). The ledger's one count of runs."""
    keys = batch.column("invocation")
    if "step" in batch.column_names:
        keys = pc.coalesce(keys.cast("int64"), batch.column("step").cast("int64"))
    return pc.fill_null(keys.cast("int64"), 0).to_numpy(zero_copy_only=False).astype(np.int64)


def _pair_sums(np: Any, first: Any, second: Any, values: Any) -> tuple[Any, Any, Any]:
    """(first, second, summed values) per distinct (first, second) pair, sorted by pair;
    exact integer sums."""
    if not len(first):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    distinct, _, inverse = _distinct_rows(np, np.stack([first, second], axis=1))
    totals = np.zeros(len(distinct), dtype=np.int64)
    np.add.at(totals, inverse, values.astype(np.int64, copy=False))
    return distinct[:, 0], distinct[:, 1], totals


def _distinct_rows(np: Any, keys: Any) -> tuple[Any, Any, Any]:
    """``np.unique(keys, axis=0, return_index=True, return_inverse=True)`` (rows × columns
    of integers), through one integer per row when the columns' ranges allow: the row-wise
    unique copies and sorts whole rows (≈10x the memory of a long run's pairs)."""
    if len(keys) and keys.min() >= 0:
        spans = keys.max(axis=0).astype(object) + 1
        if int(np.prod(spans)) < 2**62:
            key = np.zeros(len(keys), dtype=np.int64)
            for column, span in enumerate(spans.tolist()):
                key = key * span + keys[:, column]
            _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
            return keys[first], first, inverse.reshape(-1)
    distinct, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    return distinct, first, inverse.reshape(-1)


def _sums_in_first_order(np: Any, keys: Any, values: Any) -> tuple[Any, Any, Any, Any]:
    """Per distinct row of ``keys`` (rows × columns): (the key row, summed values, count,
    first row), distinct rows in the order they first appear (as a Counter filled row by
    row would hold them)."""
    distinct, first, inverse = _distinct_rows(np, keys)
    totals = np.zeros(len(distinct), dtype=np.int64)
    np.add.at(totals, inverse, values)
    counts = np.bincount(inverse, minlength=len(distinct))
    order = np.argsort(first, kind="stable")
    return distinct[order], totals[order], counts[order], first[order]


#: Execution kinds in a fixed order: events carry their index (``-1``: not execution).
KINDS = tuple(sorted(EXECUTION_KINDS))
DISPATCH = KINDS.index("dispatch")


def _kind_codes(np: Any, pa: Any, column: Any) -> Any:
    """Index in :data:`KINDS` of each event's kind, ``-1`` for other kinds; read from the
    dictionary the event schema encodes ``kind`` with, without a string per event."""
    if pa.types.is_dictionary(column.type):
        lookup = np.array([KINDS.index(k) if k in EXECUTION_KINDS else -1 for k in column.dictionary.to_pylist()]
                          + [-1], dtype=np.int64)
        indices = column.indices.fill_null(len(lookup) - 1).to_numpy(zero_copy_only=False)
        return lookup[indices]
    values = column.cast(pa.string()).to_pylist()
    return np.array([KINDS.index(k) if k in EXECUTION_KINDS else -1 for k in values], dtype=np.int64)


def _start_order(np: Any, start: Any, end: Any, timed: Any) -> Any:
    """Indices of the timed intervals by start, then longest first (the leaf rule's tie
    order); a stable argsort when no two starts tie (the usual case: cheaper)."""
    chosen = np.arange(len(start)) if timed.all() else np.flatnonzero(timed)
    starts = start[chosen]
    # Events come in runtime order, mostly sorted by start already: then no sort at all.
    by_start = chosen if (starts[1:] >= starts[:-1]).all() else chosen[np.argsort(starts, kind="stable")]
    starts = start[by_start]
    if not len(starts) or (starts[1:] != starts[:-1]).all():
        return by_start
    return chosen[np.lexsort((start[chosen] - end[chosen], start[chosen]))]


def _leaves_in_order(np: Any, sorted_end: Any, after: int | None = None) -> Any:
    """In that order, which intervals enclose none after them: an interval encloses a
    later one iff the earliest end among the later ones is at or before its own end
    (``after``: the earliest end of those after these, if any)."""
    if not len(sorted_end):
        return np.ones(0, dtype=bool)
    later_min = np.minimum.accumulate(sorted_end[::-1])[::-1]
    later_min = np.append(later_min[1:], np.iinfo(np.int64).max if after is None else after)
    if after is not None:
        later_min = np.minimum(later_min, after)
    return ~(later_min <= sorted_end)


def leaf_mask(np: Any, start: Any, end: Any) -> Any:
    """Which intervals enclose no other interval (ties: the longer one encloses)."""
    order = np.lexsort((start - end, start))  # by start, then longest first
    mask = np.empty(len(start), dtype=bool)
    mask[order] = _leaves_in_order(np, end[order])
    return mask


def _union_sorted(np: Any, start: Any, end: Any) -> int:
    """Length of the union of intervals [start, end) sorted by start."""
    if not len(start):
        return 0
    reach = np.maximum.accumulate(end)
    before = np.concatenate(([start[0]], reach[:-1]))
    return int(np.clip(end - np.maximum(start, before), 0, None).sum())


def union_ns(np: Any, start: Any, end: Any) -> int:
    """Length of the union of intervals [start, end)."""
    order = np.argsort(start, kind="stable")
    return _union_sorted(np, start[order], end[order])
