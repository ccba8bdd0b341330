"""A fast acceptance check for the manifest's JSON Schema: the schema compiled once into
Python closures, so a large valid manifest is checked in a fraction of jsonschema's time
(jsonschema 4.26 builds a validator object per value it descends into: 11 s for a
5,000-op manifest, about 0.3 s here).

It only ever *accepts*: :func:`compile_schema` returns a predicate that is ``True`` only
where ``jsonschema.Draft202012Validator`` would report no error, and ``False`` both for
invalid values and for anything it does not decide itself (a float where an integer is
allowed, an ``enum`` member that is not a string or an int, a keyword it does not know).
:func:`dfit_mlir.core.manifest.validate` runs jsonschema whenever the predicate says ``False``,
so every refusal and its message are jsonschema's: this module can make a good manifest
load faster, never a bad one load.

Keywords decided here (the ones ``schemas/manifest.schema.json`` uses): ``type``,
``properties``, ``additionalProperties``, ``required``, ``items`` (2020-12: every item),
``enum``, ``const``, ``minimum``, ``maximum``, ``minLength``, ``pattern``, ``$ref`` to a
pointer inside the same document, and the annotations ``$id``, ``$schema``, ``$defs``,
``title``, ``description``. A schema using any other keyword compiles to a predicate
that always says ``False`` (jsonschema then decides everything).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

Check = Callable[[Any], bool]
ANNOTATIONS = frozenset({"$id", "$schema", "$defs", "title", "description"})
DECIDED = frozenset({"type", "properties", "additionalProperties", "required", "items", "enum", "const", "minimum",
                     "maximum", "minLength", "pattern", "$ref"}) | ANNOTATIONS


class Undecided(Exception):
    """The schema uses something this module does not decide."""


def _bound(bound: float, lower: bool) -> Check:
    """``minimum``/``maximum``: only numbers are bounded (a bool is not one)."""
    if lower:
        return lambda v: not (type(v) is int or type(v) is float) or v >= bound
    return lambda v: not (type(v) is int or type(v) is float) or v <= bound


def _never(_: Any) -> bool:
    return False


def _always(_: Any) -> bool:
    return True


def compile_schema(root: Any) -> Check:
    """The acceptance predicate of ``root`` (see the module doc)."""
    try:
        return _Compiler(root).compile(root)
    except Undecided:
        return _never


def _is_number(value: Any) -> bool:
    return type(value) is int or type(value) is float


#: JSON type name → the Python types surely of it (an integral float is left to
#: jsonschema, which counts it as an integer; a bool is no number here or there).
TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,), "array": (list,), "string": (str,), "integer": (int,), "number": (int, float),
    "boolean": (bool,), "null": (type(None),),
}


class _Compiler:
    """One closure per schema node, dispatching on the value's Python type, so a value
    costs one call however many keywords its schema has."""

    def __init__(self, root: Any):
        self.root = root
        self.refs: dict[str, Check] = {}

    def compile(self, schema: Any) -> Check:
        if schema is True:
            return _always
        if schema is False:
            return _never
        if not isinstance(schema, dict) or not set(schema) <= DECIDED:
            raise Undecided
        allowed = self._type(schema["type"]) if "type" in schema else None
        obj = self._object(schema)
        items = self.compile(schema["items"]) if "items" in schema else None
        scalar = self._scalars(schema)
        ref = self._ref(schema["$ref"]) if "$ref" in schema else None
        if obj is None and items is None and scalar is None and ref is None:  # the common leaf: a type
            return _always if allowed is None else lambda value: type(value) in allowed

        def check(value: Any) -> bool:
            kind = type(value)
            if allowed is not None and kind not in allowed:
                return False
            if kind is dict:
                if obj is not None and not obj(value):
                    return False
            elif kind is list:
                if items is not None and not all(map(items, value)):
                    return False
            if scalar is not None and not scalar(value):
                return False
            return ref is None or ref(value)

        return check

    def _type(self, names: Any) -> frozenset[type]:
        names = [names] if isinstance(names, str) else list(names)
        if not all(name in TYPES for name in names):
            raise Undecided
        return frozenset(kind for name in names for kind in TYPES[name])

    def _object(self, schema: dict[str, Any]) -> Check | None:
        """``properties``, ``additionalProperties`` and ``required`` of an object value."""
        if not {"properties", "additionalProperties", "required"} & set(schema):
            return None
        compiled = {name: self.compile(sub) for name, sub in schema.get("properties", {}).items()}
        extra = self.compile(schema.get("additionalProperties", True))
        required = tuple(schema.get("required", ()))

        def check(value: dict[str, Any]) -> bool:
            for name in required:
                if name not in value:
                    return False
            for name, item in value.items():
                sub = compiled.get(name, extra)
                if sub is not _always and not sub(item):
                    return False
            return True

        return check

    def _scalars(self, schema: dict[str, Any]) -> Check | None:
        checks = []
        for key in ("enum", "const"):
            if key in schema:
                checks.append(self._members(schema[key] if key == "enum" else [schema[key]]))
        for key in ("minimum", "maximum"):
            if key in schema:
                bound = schema[key]
                if not _is_number(bound):
                    raise Undecided
                checks.append(_bound(bound, key == "minimum"))
        if "minLength" in schema:
            length = int(schema["minLength"])
            checks.append(lambda v: type(v) is not str or len(v) >= length)
        if "pattern" in schema:
            search = re.compile(schema["pattern"]).search
            checks.append(lambda v: type(v) is not str or search(v) is not None)
        if not checks:
            return None
        if len(checks) == 1:
            return checks[0]
        return lambda value: all(check(value) for check in checks)

    def _members(self, values: list[Any]) -> Check:
        """``enum``/``const``: decided for strings, ints (not bools) and null; any other
        member leaves the value to jsonschema's own equality (1 == 1.0, True != 1)."""
        strings = frozenset(v for v in values if type(v) is str)
        ints = frozenset(v for v in values if type(v) is int)
        null = any(v is None for v in values)
        return lambda v: ((type(v) is str and v in strings) or (type(v) is int and v in ints)
                          or (v is None and null))

    def _ref(self, pointer: Any) -> Check:
        if not isinstance(pointer, str) or not pointer.startswith("#"):
            raise Undecided
        found = self.refs.get(pointer)
        if found is not None:
            return found
        target: Check | None = None

        def forward(value: Any) -> bool:  # a recursive $ref: compiled once, used lazily
            return target(value)  # type: ignore[misc]

        self.refs[pointer] = forward
        target = self.compile(self._resolve(pointer))
        self.refs[pointer] = target
        return target

    def _resolve(self, pointer: str) -> Any:
        node = self.root
        for part in [p for p in pointer[1:].split("/") if p]:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise Undecided
        return node
