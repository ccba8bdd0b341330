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
from typing import Any, Generic, Hashable, Iterable, Iterator, Protocol, Sequence, TypeVar

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
        """The op's node, or None for a transparent op (:data:`TRANSPARENT_PREFIX`).

        Iterative (an explicit stack of open ops): the nesting depth of the IR is the
        input's, and must not be bounded by Python's recursion limit. Tokens are set in
        the order a recursive post-order walk would set them, so hashes do not depend
        on how the walk is written."""
        root = self._open(op)
        if root is None:
            return None
        stack = [root]
        while True:
            frame = stack[-1]
            child = frame.next_op(self)
            if child is not None:
                opened = self._open(child)
                if opened is not None:
                    stack.append(opened)
                continue
            stack.pop()
            node = self._close(frame)
            if not stack:
                return node
            stack[-1].children.append(node)

    def _open(self, op: OpT) -> _OpenOp[OpT] | None:
        engine = self.engine
        name = engine.op_name(op)
        operand_keys = [self.aliases.get(key, key) for key in engine.operand_keys(op)]
        if name.startswith(TRANSPARENT_PREFIX):
            for key, operand in zip(engine.result_keys(op), operand_keys, strict=False):
                self.aliases[key] = operand
            return None
        operand_tokens = [self.tokens.get(key, "?") for key in operand_keys]
        return _OpenOp(op, name, operand_tokens, set(operand_keys), iter(engine.blocks(op)))

    def _close(self, frame: _OpenOp[OpT]) -> _Node[OpT]:
        engine = self.engine
        op_hash = _digest(frame.name, engine.signature(frame.op), ",".join(frame.operand_tokens),
                          "".join(frame.region_parts))
        for number, key in enumerate(engine.result_keys(frame.op)):
            self.tokens[key] = f"{op_hash}.{number}"
        return _Node(frame.op, frame.name, engine.symbol_name(frame.op), op_hash, frame.uses, frame.blocks)


class _OpenOp(Generic[OpT]):
    """An op whose nested ops are being hashed: where in its blocks the walk is."""

    def __init__(self, op: OpT, name: str, operand_tokens: list[str], uses: set[Hashable],
                 blocks: Iterator[tuple[Sequence[tuple[Hashable, str]], Sequence[OpT]]]):
        self.op, self.name, self.operand_tokens, self.uses = op, name, operand_tokens, uses
        self.block_iter = blocks
        self.block_index = -1
        self.ops: Sequence[OpT] | None = None
        self.position = 0
        self.children: list[_Node[OpT]] = []
        self.blocks: list[list[_Node[OpT]]] = []
        self.region_parts: list[str] = []

    def next_op(self, hasher: _Hasher[OpT]) -> OpT | None:
        """The next nested op to hash, entering and closing blocks on the way (``None``:
        every block is done)."""
        while True:
            if self.ops is not None:
                if self.position < len(self.ops):
                    self.position += 1
                    return self.ops[self.position - 1]
                for child in self.children:
                    self.uses |= child.uses
                self.blocks.append(self.children)
                # Sorted: each child hash already encodes its use-def cone, and printing
                # order of independent ops must not matter.
                self.region_parts.append("{" + ";".join(sorted(child.hash for child in self.children)) + "}")
                self.ops = None
            entered = next(self.block_iter, None)
            if entered is None:
                return None
            self.block_index += 1
            arguments, ops = entered
            for arg_index, (key, type_text) in enumerate(arguments):
                hasher.tokens[key] = f"arg{self.block_index}.{arg_index}:{type_text}"
            self.ops, self.position, self.children = list(ops), 0, []


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

    def visit(blocks: list[list[_Node[OpT]]], scope: str, symbol_scope: str | None) -> Iterator[tuple[Any, ...]]:
        """Tag the ops of ``blocks``; yields each op's own (blocks, scope, symbol scope)
        for the driver below to visit before going on (a pre-order walk without Python
        recursion: the nesting depth is the input's)."""
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
                    yield node.blocks, op_id, op_id
                    continue
                op_id = f"{scope}/{node.name}#{counters[node.name]}"
                counters[node.name] += 1
                tagged.append(TaggedOp(node.op, op_id, node.hash))
                yield node.blocks, op_id, symbol_scope

    walks = [visit(root.blocks, MODULE_SCOPE, None)]
    while walks:
        nested = next(walks[-1], None)
        if nested is None:
            walks.pop()
        else:
            walks.append(visit(*nested))
    return tagged
