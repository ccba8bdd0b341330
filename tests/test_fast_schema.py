"""The manifest loader's fast acceptance check (:mod:`dfit_mlir.core.fast_schema`) against
jsonschema itself: on real manifests (the convnet compiled, the reconstructed Edge TPU
and Cerebras bundles) and thousands of single edits of them, it never accepts a
manifest jsonschema refuses, and it accepts every one jsonschema accepts except the few
cases it leaves to jsonschema on purpose (integral floats, non-string enum members)."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from dfit_mlir.core import manifest
from dfit_mlir.core.errors import InvalidInputError
from dfit_mlir.core.fast_schema import compile_schema

EDITS_PER_MANIFEST = 600


def _real_manifests(iree_bundles: dict[str, Path], edgetpu_bundle: Path, cerebras_bundle: Path) -> dict[str, dict]:
    paths = {"convnet": iree_bundles["manifest"], "edgetpu": edgetpu_bundle / "manifest.json",
             "cerebras": cerebras_bundle / "manifest.json"}
    return {name: json.loads(path.read_text()) for name, path in paths.items()}


def _trimmed(value: Any) -> Any:
    """The document with every list cut to its first few items: still valid (the schema
    checks no cross-references), and small enough for jsonschema to judge often."""
    if isinstance(value, dict):
        return {key: _trimmed(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_trimmed(item) for item in value[:6]]
    return value


def _nodes(value: Any, path: tuple = ()) -> list[tuple]:
    """Every (container path) inside ``value``: the places an edit can be made."""
    found = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _nodes(item, path + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _nodes(item, path + (index,))
    return found


REPLACEMENTS = (None, True, False, 0, -1, 7, 2.5, 3.0, "", "x", "preserved", "dispatch", [], [1], {}, {"k": 1})


def _edit(document: dict, rng: random.Random) -> dict:
    """One random edit: a value replaced, a key dropped or an unknown key added."""
    edited = copy.deepcopy(document)
    path = rng.choice(_nodes(edited)[1:])
    parent = edited
    for key in path[:-1]:
        parent = parent[key]
    action = rng.random()
    if action < 0.2 and isinstance(parent, dict):
        parent.pop(path[-1])
    elif action < 0.3 and isinstance(parent, dict):
        parent["unexpected_key"] = rng.choice(REPLACEMENTS)
    else:
        parent[path[-1]] = rng.choice(REPLACEMENTS)
    return edited


def _left_to_jsonschema(document: Any) -> bool:
    """A value the fast check does not decide itself (see its module doc)."""
    if isinstance(document, float) and document.is_integer():
        return True
    if isinstance(document, dict):
        return any(_left_to_jsonschema(v) for v in document.values())
    if isinstance(document, list):
        return any(_left_to_jsonschema(v) for v in document)
    return False


def test_fast_check_agrees_with_jsonschema_on_real_manifests_and_their_edits(
        iree_bundles: dict[str, Path], edgetpu_bundle: Path, cerebras_bundle: Path) -> None:
    validator = jsonschema.Draft202012Validator(manifest.schema())
    accepts = compile_schema(manifest.schema())
    rng = random.Random(21)
    verdicts = {"accepted": 0, "refused": 0, "left": 0}
    for name, whole in _real_manifests(iree_bundles, edgetpu_bundle, cerebras_bundle).items():
        assert validator.is_valid(whole) and accepts(whole), name
        document = _trimmed(whole)
        assert validator.is_valid(document) and accepts(document), name
        for _ in range(EDITS_PER_MANIFEST):
            edited = _edit(document, rng)
            valid, fast = validator.is_valid(edited), accepts(edited)
            assert not (fast and not valid), f"{name}: accepted what jsonschema refuses: " \
                f"{next(validator.iter_errors(edited)).message}"
            if valid and not fast:
                assert _left_to_jsonschema(edited), f"{name}: refused a valid edit it should decide"
                verdicts["left"] += 1
            else:
                verdicts["accepted" if valid else "refused"] += 1
    # The edits exercise both sides (a check that refused or accepted everything would fail here).
    assert verdicts["accepted"] > 200 and verdicts["refused"] > 500, verdicts


def test_unknown_keywords_leave_everything_to_jsonschema() -> None:
    """SYNTHETIC schemas: a keyword the fast check does not know makes it accept nothing."""
    assert compile_schema({"type": "object", "properties": {"a": {"anyOf": [{"type": "string"}]}}})({}) is False
    assert compile_schema({"$ref": "https://example.com/other.json"})({}) is False
    recursive = {"$defs": {"node": {"type": "object", "properties": {"kids": {"type": "array",
                                                                             "items": {"$ref": "#/$defs/node"}}}}},
                 "$ref": "#/$defs/node"}
    check = compile_schema(recursive)
    assert check({"kids": [{"kids": []}, {}]}) is True and check({"kids": [{"kids": [3]}]}) is False


def test_a_refused_manifest_still_gets_jsonschemas_message(tmp_path: Path, edgetpu_bundle: Path) -> None:
    document = json.loads((edgetpu_bundle / "manifest.json").read_text())
    document["operators"][1]["macs"] = -12
    (tmp_path / "bad.json").write_text(json.dumps(document))
    with pytest.raises(InvalidInputError, match=r"bad.json: invalid manifest at operators/1/macs: -12 is less than"):
        manifest.load(tmp_path / "bad.json")
