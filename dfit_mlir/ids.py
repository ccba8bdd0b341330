"""Stable semantic IDs: the spec and the one implementation both IR engines share.

Spec (ID scheme version 1)
==========================

Every op below a module gets two values:

* a **readable ID**, ``<scope>/<op name>#<k>`` — e.g. ``main/linalg.matmul#3``:

  - ``<scope>`` is the symbol path of the nearest enclosing symbol op (``main``, or
    ``outer/inner`` for nested symbol tables); ops nested in the regions of a non-symbol
    op are scoped under that op's ID (``main/linalg.generic#0/arith.maximumf#0``); ops at
    module level outside any symbol use the scope ``module``.
  - a symbol op's own ID is its symbol path (``main``).
  - ``<op name>`` is the op's registered name, except for generic importer ops that
    stand for another op: ``torch.operator "onnx.Conv"`` is named ``onnx.Conv``
    (:data:`GENERIC_OPS`).
  - ``k`` counts the ops of that name within the scope, in **canonical order**: a
    topological order of each block's def-use graph (an op comes after every op of the
    block whose results it, or any op nested in it, uses) that, among the ops ready at
    each step, takes the smallest structural hash first and falls back to printing
    order only between ops whose structural hashes are equal. Blocks are visited in
    order.

* a **structural hash**, 16 hex digits of BLAKE2b over: the op name; its attributes and
  properties sorted by name (``dfit.*`` and operand/result segment sizes left out; the
  printed value with whitespace removed; elements attributes of more than
  :data:`MAX_HASHED_ELEMENTS` elements — weights — by their type only); its result types; for each operand, the hash of the op producing it and the
  result number, or the block argument's position and type; and, per block of its
  regions, the sorted hashes of the ops nested in it.

Why these properties hold:

* deterministic: nothing depends on memory addresses, Python hash seeds or dict order;
* independent of SSA value names and whitespace: neither enters the hash or the order;
* independent of the printing order of independent ops: the canonical order depends on
  def-use edges and hashes only;
* local: an op's hash only sees its own use-def cone inside its function (values from
  other functions are reached by symbol name, never by content), and ordinals are
  counted per scope, so editing one function changes no ID in another;
* matchable across compiles: equal structure gives equal hashes whatever the IDs.

The arguments of a symbol op's entry block (a function's inputs) are tagged too, in
their locations only: ``main/arg0``. IREE builds the ABI ops that import an input from
the argument's location, so those ops trace back to the input they handle.

dfit's own ops (``dfit.probe``, ``dfit.probe_tensor``) are transparent: they get no ID,
and inserting them changes no other op's ID or hash.

Ties between structurally identical independent ops (e.g. two equal constants) are
broken by printing order; swapping two such ops swaps two IDs whose hashes are equal, so
nothing that matches by hash is affected.

The engines (MLIR bindings in :mod:`dfit_mlir.passes.mlir_engine`, xDSL in
:mod:`dfit_mlir.passes.xdsl_engine`) only answer the questions of :class:`IREngine`.
"""

from __future__ import annotations

import hashlib
import heapq
from collections import defaultdict
from dataclasses import dataclass
from typing import Generic, Hashable, Iterable, Protocol, Sequence, TypeVar

ID_SCHEME_VERSION = 1
ID_ATTR = "dfit.id"
HASH_ATTR = "dfit.hash"
MODULE_SCOPE = "module"
HASH_HEX_DIGITS = 16
#: Elements attributes larger than this enter the hash by type only: printing weights
#: would cost more than the whole tag pass, and a weight update is still "the same op".
MAX_HASHED_ELEMENTS = 16

#: Generic ops whose ``name`` attribute says which op they stand for (the ONNX importer
#: emits every ONNX node as ``torch.operator "onnx.<Op>"``).
GENERIC_OPS = frozenset({"torch.operator"})


def op_name_of(op_id: str) -> str | None:
    """``main/linalg.matmul#3`` → ``linalg.matmul``; None for symbol and argument IDs."""
    last = op_id.rsplit("/", 1)[-1]
    return last.split("#", 1)[0] if "#" in last else None


def argument_id(symbol_id: str, index: int) -> str:
    """ID of the ``index``-th entry-block argument of the symbol op ``symbol_id``."""
    return f"{symbol_id}/arg{index}"


def display_name(op_name: str, name_attr: str | None) -> str:
    """The name used in IDs: ``name_attr`` for :data:`GENERIC_OPS`, else ``op_name``."""
    return name_attr if op_name in GENERIC_OPS and name_attr else op_name


#: Attributes that never enter the structural hash: dfit's own, segment sizes that MLIR
#: shows as attributes and xDSL keeps as properties (they follow from the operands), and
#: the indexing-map cache MLIR's verifier stores on conv/pooling ops (xDSL never does).
IGNORED_ATTRS = frozenset({"operandSegmentSizes", "resultSegmentSizes", "linalg.memoized_indexing_maps"})
#: dfit's own ops (probes) are instrumentation: they get no ID and are invisible to the
#: hash — a ``dfit.probe_tensor`` result hashes as the tensor it passes through.
TRANSPARENT_PREFIX = "dfit."

OpT = TypeVar("OpT")


class IREngine(Protocol[OpT]):
    """What the ID algorithm asks of an IR engine (MLIR bindings or xDSL)."""

    def op_name(self, op: OpT) -> str: ...

    def symbol_name(self, op: OpT) -> str | None:
        """The op's ``sym_name`` if it defines a symbol."""

    def signature(self, op: OpT) -> str:
        """Attributes and result types in the normalized form of :func:`signature`."""

    def operand_keys(self, op: OpT) -> Sequence[Hashable]: ...

    def result_keys(self, op: OpT) -> Sequence[Hashable]: ...

    def blocks(self, op: OpT) -> Iterable[tuple[Sequence[tuple[Hashable, str]], Sequence[OpT]]]:
        """For each block of each region: (block arguments as (key, type), ops)."""


def signature(attributes: Iterable[tuple[str, str]], result_types: Iterable[str]) -> str:
    """Normalized signature text from (name, printed value) pairs; engines pass
    ``elements<TYPE>`` as the value of an elements attribute too large to hash."""
    parts = []
    for name, value in sorted(attributes):
        if name.startswith("dfit.") or name in IGNORED_ATTRS:
            continue
        parts.append(f"{name}={value}")
    text = ",".join(parts) + "->" + ",".join(result_types)
    return "".join(text.split())


@dataclass(frozen=True, slots=True)
class TaggedOp(Generic[OpT]):
    op: OpT
    id: str
    hash: str


@dataclass(slots=True)
class _Node(Generic[OpT]):
    op: OpT
    name: str
    symbol: str | None
    hash: str
    uses: set[Hashable]
    blocks: list[list["_Node[OpT]"]]


def _digest(*parts: str) -> str:
    h = hashlib.blake2b(digest_size=HASH_HEX_DIGITS // 2)
    for part in parts:
        h.update(part.encode())
        h.update(b"\x1f")
    return h.hexdigest()


class _Hasher(Generic[OpT]):
    def __init__(self, engine: IREngine[OpT]):
        self.engine = engine
        self.tokens: dict[Hashable, str] = {}
        # Results of transparent (dfit's own) ops stand for the operand they pass through.
        self.aliases: dict[Hashable, Hashable] = {}

    def node(self, op: OpT) -> _Node[OpT] | None:
        """The op's node, or None for a transparent op (:data:`TRANSPARENT_PREFIX`)."""
        engine = self.engine
        name = engine.op_name(op)
        operand_keys = [self.aliases.get(key, key) for key in engine.operand_keys(op)]
        if name.startswith(TRANSPARENT_PREFIX):
            for key, operand in zip(engine.result_keys(op), operand_keys, strict=False):
                self.aliases[key] = operand
            return None
        operand_tokens = [self.tokens.get(key, "?") for key in operand_keys]
        uses = set(operand_keys)
        blocks: list[list[_Node[OpT]]] = []
        region_parts: list[str] = []
        for block_index, (arguments, ops) in enumerate(engine.blocks(op)):
            for arg_index, (key, type_text) in enumerate(arguments):
                self.tokens[key] = f"arg{block_index}.{arg_index}:{type_text}"
            children = [node for node in map(self.node, ops) if node is not None]
            for child in children:
                uses |= child.uses
            blocks.append(children)
            # Sorted: each child hash already encodes its use-def cone, and printing order
            # of independent ops must not matter.
            region_parts.append("{" + ";".join(sorted(child.hash for child in children)) + "}")
        op_hash = _digest(name, engine.signature(op), ",".join(operand_tokens), "".join(region_parts))
        for number, key in enumerate(engine.result_keys(op)):
            self.tokens[key] = f"{op_hash}.{number}"
        return _Node(op, name, engine.symbol_name(op), op_hash, uses, blocks)


def canonical_order(nodes: Sequence[_Node[OpT]], produced: dict[Hashable, int]) -> list[int]:
    """Indices of ``nodes`` (one block) in canonical order; ``produced`` maps each value
    key defined in the block to the index of its producer."""
    successors: list[list[int]] = [[] for _ in nodes]
    pending = [0] * len(nodes)
    for index, node in enumerate(nodes):
        for producer in {produced[key] for key in node.uses if key in produced}:
            if producer != index:
                successors[producer].append(index)
                pending[index] += 1
    ready = [(node.hash, index) for index, node in enumerate(nodes) if not pending[index]]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        _, index = heapq.heappop(ready)
        order.append(index)
        for succ in successors[index]:
            pending[succ] -= 1
            if not pending[succ]:
                heapq.heappush(ready, (nodes[succ].hash, succ))
    if len(order) < len(nodes):  # a graph region with a use-def cycle: printing order
        seen = set(order)
        order.extend(index for index in range(len(nodes)) if index not in seen)
    return order


def assign_ids(engine: IREngine[OpT], module: OpT) -> list[TaggedOp[OpT]]:
    """IDs and structural hashes for every op nested in ``module`` (not the module)."""
    hasher = _Hasher(engine)
    root = hasher.node(module)
    assert root is not None, "the root must not be a dfit op"
    tagged: list[TaggedOp[OpT]] = []

    def visit(blocks: list[list[_Node[OpT]]], scope: str, symbol_scope: str | None) -> None:
        counters: dict[str, int] = defaultdict(int)
        for nodes in blocks:
            produced = {}
            for index, node in enumerate(nodes):
                for key in engine.result_keys(node.op):
                    produced[key] = index
            for index in canonical_order(nodes, produced):
                node = nodes[index]
                if node.symbol is not None:
                    op_id = node.symbol if symbol_scope is None else f"{symbol_scope}/{node.symbol}"
                    tagged.append(TaggedOp(node.op, op_id, node.hash))
                    visit(node.blocks, op_id, op_id)
                    continue
                op_id = f"{scope}/{node.name}#{counters[node.name]}"
                counters[node.name] += 1
                tagged.append(TaggedOp(node.op, op_id, node.hash))
                visit(node.blocks, op_id, symbol_scope)

    visit(root.blocks, MODULE_SCOPE, None)
    return tagged
