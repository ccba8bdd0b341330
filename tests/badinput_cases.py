"""The bad-input suite's cases (tests/test_bad_input.py runs them): each one builds its
scenario in an empty working folder from the real artifacts of the suite (the convnet
compiled and run once, the Edge TPU fixtures) and says what ``dfit`` must answer.

A case's ``build(work, art)`` returns the command line; ``exit`` is the status it must
end with (a set where either is right, e.g. a reader that may note and go on), ``names``
a text the error must contain (the input at fault, as the user spelled it).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "models"


@dataclass(frozen=True)
class Artifacts:
    """Built once per module: the real inputs every case copies from."""

    mlir: Path
    vmfb: Path
    manifest: Path
    bundle: Path
    edgetpu_dump: Path
    edgetpu_bundle: Path


@dataclass(frozen=True)
class Case:
    id: str
    build: Callable[[Path, Artifacts], list[str]]
    exit: int | frozenset[int] = 2
    names: str | None = None
    #: Only for exit-0 cases: pre-existing paths (relative) the command may replace.
    replaces: tuple[str, ...] = ()
    marks: tuple[Any, ...] = field(default=(), compare=False)
    #: Run ``dfit`` as a child process: a case that may crash the interpreter (a native
    #: fault) must not take the test session down with it.
    isolated: bool = False


# --- helpers ---------------------------------------------------------------------------

def put(art_path: Path, work: Path, name: str | None = None) -> str:
    """Copy an artifact (file or folder) into the working folder; returns its name."""
    target = work / (name or art_path.name)
    if art_path.is_dir():
        shutil.copytree(art_path, target)
    else:
        shutil.copyfile(art_path, target)
    return target.name


def vmfb_pair(work: Path, art: Artifacts) -> str:
    put(art.vmfb, work, "m.vmfb")
    put(art.manifest, work, "m.manifest.json")
    return "m.vmfb"


def user_folder(work: Path, name: str = "mine") -> str:
    """A folder of the user's: notes dfit must never delete."""
    (work / name).mkdir()
    (work / name / "notes.txt").write_text("my notes\n")
    return name


# --- manifest corruptions --------------------------------------------------------------

def _edit_json(edit: Callable[[dict[str, Any]], None]) -> Callable[[bytes], bytes]:
    def apply(data: bytes) -> bytes:
        document = json.loads(data)
        edit(document)
        return json.dumps(document, indent=1).encode()

    return apply


def _set(path: tuple[Any, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(document: dict[str, Any]) -> None:
        node = document
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return edit


def _flip(fraction: float, byte: int) -> Callable[[bytes], bytes]:
    def apply(data: bytes) -> bytes:
        at = int(len(data) * fraction)
        return data[:at] + bytes([byte]) + data[at + 1:]

    return apply


def _flip_breaking_json(fraction: float, byte: int) -> Callable[[bytes], bytes]:
    """Like :func:`_flip`, at the first position from ``fraction`` on where the flipped
    byte breaks the JSON (a flip inside a string value would still be valid JSON)."""
    import json

    def apply(data: bytes) -> bytes:
        for at in range(int(len(data) * fraction), len(data)):
            flipped = data[:at] + bytes([byte]) + data[at + 1:]
            try:
                json.loads(flipped)
            except ValueError:
                return flipped
        raise AssertionError("no position breaks the JSON")

    return apply


def _number_text(text: str) -> Callable[[bytes], bytes]:
    """Replace the first ``"macs": <int>`` value by ``text`` (raw JSON, e.g. NaN)."""
    import re

    def apply(data: bytes) -> bytes:
        return re.sub(rb'"macs": \d+', b'"macs": ' + text.encode(), data, count=1)

    return apply


MANIFEST_CORRUPTIONS: dict[str, Callable[[bytes], bytes]] = {
    "empty": lambda data: b"",
    "whitespace": lambda data: b" \n\t\n",
    "truncated-1": lambda data: data[:1],
    "truncated-10pct": lambda data: data[: len(data) // 10],
    "truncated-half": lambda data: data[: len(data) // 2],
    "truncated-last-byte": lambda data: data[:-2],
    "flip-0xff-early": _flip(0.02, 0xFF),
    "flip-0xff-middle": _flip(0.5, 0xFF),
    "flip-brace-middle": _flip_breaking_json(0.5, ord("}")),
    "latin1-prefix": lambda data: "é".encode("latin-1") + data,
    "utf16": lambda data: data.decode().encode("utf-16"),
    "utf8-bom": lambda data: b"\xef\xbb\xbf" + data,
    "json-array": lambda data: b"[1, 2, 3]",
    "json-string": lambda data: b'"dfit.manifest"',
    "json-null": lambda data: b"null",
    "deep-nesting-100k": lambda data: b"[" * 100_000 + b"]" * 100_000,
    "deep-nesting-in-value": lambda data: data.replace(b'"operators": [', b'"junk": ' + b"[" * 50_000 + b"]" * 50_000
                                                       + b', "operators": [', 1),
    "wrong-schema": _edit_json(_set(("schema",), "dfit.run-summary")),
    "version-2": _edit_json(_set(("version",), "2.0")),
    "version-garbage": _edit_json(_set(("version",), "x" * 10_000)),
    "operators-not-a-list": _edit_json(_set(("operators",), "conv")),
    "operators-a-1mb-string": _edit_json(_set(("operators",), "conv" * 250_000)),
    "no-operators": _edit_json(lambda d: d.pop("operators")),
    "no-partitions": _edit_json(lambda d: d.pop("partitions")),
    "number-5000-digits": _number_text("9" * 5000),
    "number-nan": _number_text("NaN"),
    "number-infinity": _number_text("Infinity"),
    "number-negative": _number_text("-12"),
    "vmfb-bytes": lambda data: b"\x08\x00\x00\x00IREE" + bytes(range(256)) * 8,
    "parquet-bytes": lambda data: b"PAR1" + bytes(300) + b"PAR1",
}


def _manifest_file(kind: str) -> Callable[[Path, Artifacts], str]:
    def make(work: Path, art: Artifacts) -> str:
        target = work / "bad.manifest.json"
        target.write_bytes(MANIFEST_CORRUPTIONS[kind](art.manifest.read_bytes()))
        return target.name

    return make


MANIFEST_COMMANDS: dict[str, Callable[[Path, Artifacts, str], list[str]]] = {
    "show": lambda work, art, m: ["show", m],
    "analyze": lambda work, art, m: ["analyze", m, "--tool", "compile-metrics", "--out", "out"],
    "diff-a": lambda work, art, m: ["diff", m, put(art.manifest, work, "good.manifest.json")],
    "diff-b": lambda work, art, m: ["diff", put(art.manifest, work, "good.manifest.json"), m, "-o", "d"],
    "export-explorer": lambda work, art, m: ["export-explorer", m, "-o", "nodes.json"],
    "view": lambda work, art, m: ["view", m, "-o", "view.html"],
    "run": lambda work, art, m: ["run", put(art.vmfb, work, "m.vmfb"), "--manifest", m, "--mode", "ids",
                                 "-o", "b"],
}


def manifest_cases() -> list[Case]:
    cases = []
    for command, argv in MANIFEST_COMMANDS.items():
        for kind in MANIFEST_CORRUPTIONS:
            def build(work: Path, art: Artifacts, argv: Any = argv, kind: str = kind) -> list[str]:
                return argv(work, art, _manifest_file(kind)(work, art))

            cases.append(Case(f"manifest-{kind}-{command}", build, 2, "bad.manifest.json"))
        # Not a file at all.
        cases.append(Case(f"manifest-missing-{command}", lambda w, a, argv=argv: argv(w, a, "absent.json"), 2,
                          "absent.json"))
        cases.append(Case(f"manifest-directory-{command}", lambda w, a, argv=argv: argv(w, a, user_folder(w, "adir")),
                          2, "adir"))

        def symlink_loop(work: Path, art: Artifacts, argv: Any = argv) -> list[str]:
            (work / "loop.json").symlink_to("loop.json")
            return argv(work, art, "loop.json")

        cases.append(Case(f"manifest-symlink-loop-{command}", symlink_loop, 2, "loop.json"))
    return cases


# --- bundle corruptions ----------------------------------------------------------------

def _bundle(edit: Callable[[Path, Artifacts], None]) -> Callable[[Path, Artifacts], str]:
    def make(work: Path, art: Artifacts) -> str:
        bundle = work / put(art.bundle, work, "run")
        edit(bundle, art)
        return "run"

    return make


def _rm(name: str) -> Callable[[Path, Artifacts], None]:
    return lambda bundle, art: (bundle / name).unlink()


def _write(name: str, data: bytes | Callable[[bytes], bytes]) -> Callable[[Path, Artifacts], None]:
    def edit(bundle: Path, art: Artifacts) -> None:
        target = bundle / name
        target.write_bytes(data(target.read_bytes()) if callable(data) else data)

    return edit


def _from_edgetpu(name: str) -> Callable[[Path, Artifacts], None]:
    return lambda bundle, art: shutil.copyfile(art.edgetpu_bundle / name, bundle / name)


def _summary(edit: Callable[[dict[str, Any]], None]) -> Callable[[Path, Artifacts], None]:
    def apply(bundle: Path, art: Artifacts) -> None:
        document = json.loads((bundle / "summary.json").read_text())
        edit(document)
        (bundle / "summary.json").write_text(json.dumps(document))

    return apply


BUNDLE_CORRUPTIONS: dict[str, tuple[Callable[[Path, Artifacts], None], str]] = {
    "no-events": (_rm("events.parquet"), "events.parquet"),
    "no-sites": (_rm("sites.parquet"), "sites.parquet"),
    "no-summary": (_rm("summary.json"), "summary.json"),
    "no-manifest": (_rm("manifest.json"), "run"),
    "events-empty": (_write("events.parquet", b""), "events.parquet"),
    "events-truncated": (_write("events.parquet", lambda d: d[: len(d) // 2]), "events.parquet"),
    "events-garbage": (_write("events.parquet", bytes(range(256)) * 16), "events.parquet"),
    "events-footer-flipped": (_write("events.parquet", lambda d: d[:-4] + b"PAR0"), "events.parquet"),
    "events-text": (_write("events.parquet", b"kind,site\ndispatch,0\n"), "events.parquet"),
    "events-other-model": (_from_edgetpu("events.parquet"), "events.parquet"),
    "sites-garbage": (_write("sites.parquet", b"\x00" * 100), "sites.parquet"),
    "sites-other-model": (_from_edgetpu("sites.parquet"), "sites.parquet"),
    "summary-truncated": (_write("summary.json", lambda d: d[: len(d) // 2]), "summary.json"),
    "summary-latin1": (_write("summary.json", lambda d: b"\xe9" + d), "summary.json"),
    "summary-array": (_write("summary.json", b"[]"), "summary.json"),
    "summary-wrong-schema": (_summary(_set(("schema",), "dfit.manifest")), "summary.json"),
    "summary-version-9": (_summary(_set(("version",), "9.0")), "summary.json"),
    "summary-counts-lie": (_summary(lambda d: d["counts"].update(kept=d["counts"]["kept"] + 1)), "events.parquet"),
    "manifest-other-model": (_from_edgetpu("manifest.json"), "run"),
    "manifest-latin1": (_write("manifest.json", lambda d: b"\xe9" + d), "manifest.json"),
    "manifest-truncated": (_write("manifest.json", lambda d: d[:100]), "manifest.json"),
}

BUNDLE_COMMANDS: dict[str, Callable[[Path, Artifacts, str], list[str]]] = {
    "analyze": lambda work, art, b: ["analyze", b, "--tool", "semantic-attribution", "--out", "out"],
    "diff": lambda work, art, b: ["diff", put(art.bundle, work, "good"), b],
    "export-explorer": lambda work, art, b: ["export-explorer", b, "--metric", "time", "-o", "nodes.json"],
    "view": lambda work, art, b: ["view", b, "-o", "view.html"],
}


def bundle_cases() -> list[Case]:
    cases = []
    for command, argv in BUNDLE_COMMANDS.items():
        for kind, (edit, names) in BUNDLE_CORRUPTIONS.items():
            def build(work: Path, art: Artifacts, argv: Any = argv, edit: Any = edit) -> list[str]:
                return argv(work, art, _bundle(edit)(work, art))

            cases.append(Case(f"bundle-{kind}-{command}", build, 2, names))
        cases.append(Case(f"bundle-empty-dir-{command}", lambda w, a, argv=argv: argv(w, a, user_folder(w, "run")),
                          2, "run"))
    return cases


# --- hostile output paths --------------------------------------------------------------

#: command → (argv with {IN} for the input and {OUT} for the output, set-up of the input).
WRITERS: dict[str, tuple[list[str], Callable[[Path, Artifacts], str]]] = {
    "compile": (["compile", "{IN}", "-o", "{OUT}"], lambda w, a: put(a.mlir, w, "model.mlir")),
    "compile-manifest": (["compile", "--dfit-tag", "{IN}", "-o", "fresh.vmfb", "--manifest", "{OUT}"],
                         lambda w, a: put(a.mlir, w, "model.mlir")),
    "opt": (["opt", "--dfit-tag", "{IN}", "-o", "{OUT}"], lambda w, a: put(a.mlir, w, "model.mlir")),
    "run": (["run", "{IN}", "--mode", "ids", "-o", "{OUT}"], vmfb_pair),
    "reconstruct": (["reconstruct", "{IN}", "-o", "{OUT}"], lambda w, a: put(a.edgetpu_dump, w, "dump")),
    "analyze": (["analyze", "{IN}", "--tool", "compile-metrics", "--out", "{OUT}"],
                lambda w, a: put(a.bundle, w, "run")),
    "diff": (["diff", "{IN}", "{IN}", "-o", "{OUT}"], lambda w, a: put(a.bundle, w, "run")),
    "export-explorer": (["export-explorer", "{IN}", "-o", "{OUT}"], lambda w, a: put(a.bundle, w, "run")),
    "view": (["view", "{IN}", "-o", "{OUT}"], lambda w, a: put(a.bundle, w, "run")),
}
DIRECTORY_WRITERS = {"run", "reconstruct", "analyze", "diff"}


def _writer_case(command: str, scenario: str, output: Callable[[Path, str], str], names: Callable[[str], str],
                 force: bool = False) -> Case:
    argv, setup = WRITERS[command]

    def build(work: Path, art: Artifacts) -> list[str]:
        source = setup(work, art)
        out = output(work, source)
        line = [part.replace("{IN}", source).replace("{OUT}", out) for part in argv]
        return line + (["--force"] if force else [])

    return Case(f"output-{scenario}-{command}", build, 2, names("{IN}"))


def _inside(work: Path, source: str) -> str:
    """A path inside the input: one of its files for a folder (a bundle, a dump)."""
    if (work / source).is_dir():
        return f"{source}/{sorted(p.name for p in (work / source).iterdir() if not p.name.startswith('.'))[0]}"
    return f"{source}/x"


OUTPUT_SCENARIOS: dict[str, tuple[Callable[[Path, str], str], Callable[[str], str]]] = {
    "is-the-input": (lambda w, s: s, lambda s: "input"),
    "is-the-input-forced": (lambda w, s: s, lambda s: "input"),
    "contains-the-input": (lambda w, s: ".", lambda s: "contains the input"),
    "parent-of-the-input": (lambda w, s: "..", lambda s: "contains the input"),
    "inside-the-input": (_inside, lambda s: "input"),
    "symlink-to-the-input": (lambda w, s: (w / "link").symlink_to(s) or "link", lambda s: "link"),
    "user-folder": (lambda w, s: user_folder(w), lambda s: "mine"),
    "user-folder-by-symlink": (lambda w, s: (w / "alias").symlink_to(user_folder(w)) or "alias", lambda s: "alias"),
    "user-file": (lambda w, s: (w / "notes.txt").write_text("mine\n") and "notes.txt", lambda s: "notes.txt"),
    "through-a-file": (lambda w, s: (w / "notes.txt").write_text("mine\n") and "notes.txt/out",
                       lambda s: "notes.txt"),
    "other-dfit-kind": (lambda w, s: _analysis_folder(w), lambda s: "ana"),
}


def _analysis_folder(work: Path) -> str:
    """A dfit output of another kind than most writers produce (an analysis folder)."""
    from dfit_mlir.core import outputs

    folder = work / "ana"
    folder.mkdir()
    (folder / "report.txt").write_text("analysis\n")
    outputs.write_marker(folder, "analysis")
    return "ana"


def output_cases() -> list[Case]:
    cases = []
    for command in WRITERS:
        for scenario, (output, names) in OUTPUT_SCENARIOS.items():
            if scenario == "other-dfit-kind" and command == "analyze":
                continue  # an analysis folder is analyze's own kind
            force = scenario.endswith("-forced")
            cases.append(_writer_case(command, scenario, output, names, force))
    return cases


# --- numeric and option values ---------------------------------------------------------

RUN_OPTION_VALUES = [
    ("--repeat", "1e20"), ("--repeat", "100000000000000000000"), ("--repeat", "-1"), ("--repeat", "0"),
    ("--warmup", "-1"), ("--warmup", "99999999999"), ("--sample", "nan"), ("--sample", "inf"),
    ("--sample", "1e-300"), ("--sample", "0"), ("--sample", "2"), ("--sample", "-0.5"), ("--sample", "abc"),
    ("--tensor-values", "-1"), ("--tensor-values", "1000000000000"), ("--max-events", "-1"),
    ("--max-events", "1e3"), ("--mode", "fast"), ("--driver", "cuda"),
]


def option_cases() -> list[Case]:
    cases = []
    for option, value in RUN_OPTION_VALUES:
        cases.append(Case(f"run-option{option}={value}",
                          lambda w, a, o=option, v=value: ["run", vmfb_pair(w, a), o, v, "-o", "b"], 2, option))
    analyze_options = [
        ("misspelt-tool", ["--tool", "program-analyzer", "--option", "program-analyser.profile=x.yaml"],
         "program-analyser"),
        ("tool-not-running", ["--tool", "compile-metrics", "--option", "memory-proxy.profile=x.yaml"], "memory-proxy"),
        ("no-dot", ["--tool", "compile-metrics", "--option", "top=3"], "top=3"),
        ("no-value", ["--tool", "compile-metrics", "--option", "compile-metrics.top"], "compile-metrics.top"),
        ("given-twice", ["--tool", "overhead", "--option", "overhead.compare=a", "--option", "overhead.compare=b"],
         "overhead.compare is given twice"),
        ("unknown-key", ["--tool", "compile-metrics", "--option", "compile-metrics.bogus=1"], "bogus"),
        ("unknown-tool", ["--tool", "no-such-tool"], "no-such-tool"),
        ("empty-tool", ["--tool", ""], "''"),
    ]
    for name, extra, names in analyze_options:
        cases.append(Case(f"analyze-option-{name}",
                          lambda w, a, e=extra: ["analyze", put(a.bundle, w, "run"), *e, "--out", "out"], 2, names))
    for name, argv, names in [("backends-extra-argument", ["backends", "edgetpu"], "edgetpu"),
                              ("tools-unknown-option", ["tools", "--all"], "--all"),
                              ("unknown-command", ["analyse", "run"], "analyse"),
                              ("show-no-argument", ["show"], "MANIFEST_PATH")]:
        cases.append(Case(f"usage-{name}", lambda w, a, argv=argv: list(argv), 2, names))
    explorer = [("metric-unknown", ["--metric", "speed"], "speed"), ("metric-empty", ["--metric", ","], "metric"),
                ("key-unknown", ["--key", "hash"], "hash")]
    for name, extra, names in explorer:
        cases.append(Case(f"export-explorer-{name}",
                          lambda w, a, e=extra: ["export-explorer", put(a.bundle, w, "run"), *e, "-o", "n.json"],
                          2, names))
    return cases


# --- model inputs of `dfit run` ----------------------------------------------------------

def _npy(array: Any, name: str = "x.npy") -> Callable[[Path], str]:
    def make(work: Path) -> str:
        np.save(work / name, array)
        return name

    return make


def _raw(data: bytes, name: str = "x.npy") -> Callable[[Path], str]:
    def make(work: Path) -> str:
        (work / name).write_bytes(data)
        return name

    return make


def _truncated_npy(work: Path) -> str:
    np.save(work / "x.npy", np.zeros((1, 32, 32, 3), np.float32))
    data = (work / "x.npy").read_bytes()
    (work / "x.npy").write_bytes(data[: len(data) // 2])
    return "x.npy"


def _npz(work: Path) -> str:
    np.savez(work / "x.npz", a=np.zeros((1, 32, 32, 3), np.float32))
    return "x.npz"


def _pickled(work: Path) -> str:
    np.save(work / "x.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    return "x.npy"


NPY_INPUTS: dict[str, Callable[[Path], str]] = {
    "wrong-shape": _npy(np.zeros((1, 32, 32, 4), np.float32)),
    "wrong-rank": _npy(np.zeros((32, 32, 3), np.float32)),
    "wrong-dtype": _npy(np.zeros((1, 32, 32, 3), np.float64)),
    "int-dtype": _npy(np.zeros((1, 32, 32, 3), np.int8)),
    "scalar": _npy(np.float32(1.0)),
    "truncated": _truncated_npy,
    "text-file": _raw(b"1,2,3\n"),
    "empty-file": _raw(b""),
    "npz": _npz,
    "pickled-object": _pickled,
    "fortran-order": _npy(np.asfortranarray(np.zeros((1, 32, 32, 3), np.float32))),
    "missing": lambda work: "absent.npy",
}


def input_cases() -> list[Case]:
    cases = []
    for kind, make in NPY_INPUTS.items():
        cases.append(Case(f"run-npy-{kind}",
                          lambda w, a, m=make: ["run", vmfb_pair(w, a), "--mode", "ids", f"--input=@{m(w)}", "-o", "b"],
                          2, None))
    splats = [("splat-shape", "1x32x32x4xf32=1", "input 0"), ("splat-dtype", "1x32x32x3xi8=1", "input 0"),
              ("splat-syntax", "f32:1", "f32:1"), ("splat-value", "1x32x32x3xf32=one", "one"),
              ("values-too-few", "1x32x32x3xf32=1 2 3", "3 values"), ("values-bracketed", "1x32x32x3xf32=[1 2][x]", "x")]
    for name, text, names in splats:
        for mode in ("ids", "full"):  # checked by dfit in both: the IREE tools failed with exit 3 on them
            cases.append(Case(f"run-{name}" if mode == "ids" else f"run-{name}-{mode}",
                              lambda w, a, t=text, m=mode: ["run", vmfb_pair(w, a), "--mode", m, f"--input={t}",
                                                            "-o", "b"],
                              2, names))
    cases.append(Case("run-too-many-inputs", lambda w, a: ["run", vmfb_pair(w, a), "--mode", "ids",
                                                           "--input=1x32x32x3xf32=1", "--input=1xf32=1", "-o", "b"],
                      2, "2 given"))
    cases.append(Case("run-inputs-from-empty", lambda w, a: ["run", vmfb_pair(w, a), "--inputs-from",
                                                             user_folder(w, "ins"), "-o", "b"], 2, "ins"))
    cases.append(Case("run-inputs-from-missing", lambda w, a: ["run", vmfb_pair(w, a), "--inputs-from", "nowhere",
                                                               "-o", "b"], 2, "nowhere"))
    return cases


# --- compiled modules given to `dfit run` ----------------------------------------------

def _vmfb(edit: Callable[[bytes], bytes]) -> Callable[[Path, Artifacts], list[str]]:
    def build(work: Path, art: Artifacts) -> list[str]:
        name = vmfb_pair(work, art)
        (work / name).write_bytes(edit((work / name).read_bytes()))
        return ["run", name, "--mode", "ids", "-o", "b"]

    return build


def vmfb_cases() -> list[Case]:
    return [
        Case("run-vmfb-truncated", _vmfb(lambda d: d[: len(d) // 3]), 2, "m.vmfb"),
        Case("run-vmfb-byte-flipped", _vmfb(lambda d: d[:100] + bytes([d[100] ^ 0xFF]) + d[101:]), 2, "m.vmfb"),
        Case("run-vmfb-empty", _vmfb(lambda d: b""), 2, "m.vmfb"),
        Case("run-vmfb-is-mlir", _vmfb(lambda d: (EXAMPLES / "convnet.mlir").read_bytes()), 2, "m.vmfb"),
        Case("run-vmfb-missing", lambda w, a: ["run", "none.vmfb", "-o", "b"], 2, "none.vmfb"),
        Case("run-vmfb-directory", lambda w, a: ["run", user_folder(w, "v.vmfb"), "-o", "b"], 2, "v.vmfb"),
        Case("run-vmfb-no-manifest", lambda w, a: ["run", put(a.vmfb, w, "m.vmfb"), "-o", "b"], 2,
             "m.manifest.json"),
        Case("run-vmfb-manifest-of-another", lambda w, a: ["run", put(a.vmfb, w, "m.vmfb"), "--manifest",
                                                           _other_compile_manifest(w, a), "-o", "b"], 2, "m.vmfb"),
        Case("run-function-unknown", lambda w, a: ["run", vmfb_pair(w, a), "--function", "nope", "-o", "b"], 2,
             "nope"),
    ]


def _other_compile_manifest(work: Path, art: Artifacts) -> str:
    document = json.loads(art.manifest.read_text())
    document["compile"]["vmfb_sha256"] = "0" * 64
    (work / "other.manifest.json").write_text(json.dumps(document, indent=1))
    return "other.manifest.json"


# --- MLIR sources of `dfit compile` / `dfit opt` --------------------------------------------

def _deep_mlir(depth: int) -> str:
    lines = ["func.func @f(%a: f32) -> f32 {"]
    lines += [f"%r{i} = scf.execute_region -> f32 {{" for i in range(depth)]
    lines += ["%x = arith.addf %a, %a : f32", "scf.yield %x : f32"]
    for i in reversed(range(depth)):
        lines.append("}")
        if i:
            lines.append(f"scf.yield %r{i} : f32")
    return "\n".join([*lines, "return %r0 : f32", "}"]) + "\n"


def _source(make: Callable[[bytes], bytes], name: str = "bad.mlir") -> Callable[[Path, Artifacts], str]:
    def build(work: Path, art: Artifacts) -> str:
        (work / name).write_bytes(make(art.mlir.read_bytes()))
        return name

    return build


MLIR_SOURCES: dict[str, tuple[Callable[[Path, Artifacts], str], str]] = {
    "empty": (_source(lambda d: b""), "bad.mlir"),
    "empty-module": (_source(lambda d: b"module {}\n"), "bad.mlir"),
    "only-a-comment": (_source(lambda d: b"// nothing here\n"), "bad.mlir"),
    "truncated-quarter": (_source(lambda d: d[: len(d) // 4]), "bad.mlir"),
    "truncated-half": (_source(lambda d: d[: len(d) // 2]), "bad.mlir"),
    "truncated-end": (_source(lambda d: d.rstrip()[:-1]), "bad.mlir"),
    "flip-0xff": (_source(lambda d: d.replace(b"func.func", b"func.\xff\xfe", 1)), "bad.mlir"),
    "latin1-comment": (_source(lambda d: b"// caf\xe9\n" + d), None),
    "utf16": (_source(lambda d: d.decode().encode("utf-16")), "bad.mlir"),
    "undefined-value": (_source(lambda d: d.replace(b"%image", b"%nope").replace(b"%nope:", b"%image:", 1)),
                        "bad.mlir"),
    "long-line": (_source(lambda d: b"x" * 1_000_000 + b"\n" + d), "bad.mlir"),
    "binary-garbage": (_source(lambda d: bytes(range(256)) * 64), "bad.mlir"),
    "a-vmfb": (lambda w, a: put(a.vmfb, w, "bad.mlir"), "bad.mlir"),
    "onnx-suffix": (_source(lambda d: b"\x08\x07", "model.onnx"), "model.onnx"),
    "tflite-suffix": (lambda w, a: put(a.edgetpu_dump / "model.tflite", w, "model.tflite"), "model.tflite"),
    "missing": (lambda w, a: "absent.mlir", "absent.mlir"),
    "directory": (lambda w, a: user_folder(w, "src.mlir"), "src.mlir"),
}


def source_cases() -> list[Case]:
    cases = []
    commands = {"compile": ["compile", "{IN}", "-o", "out.vmfb"],
                "compile-tagged": ["compile", "--dfit-tag", "{IN}", "-o", "out.vmfb"],
                "opt": ["opt", "--dfit-tag", "{IN}", "-o", "out.mlir"]}
    for command, argv in commands.items():
        for kind, (make, names) in MLIR_SOURCES.items():
            if kind == "latin1-comment":
                continue  # valid MLIR (a comment's bytes are not decoded): a success case below
            # An empty module is fine to tag (nothing to do); compiling it is refused.
            status = 0 if command == "opt" and kind in ("empty-module", "only-a-comment") else 2

            def build(work: Path, art: Artifacts, argv: Any = argv, make: Any = make) -> list[str]:
                source = make(work, art)
                return [part.replace("{IN}", source) for part in argv]

            cases.append(Case(f"source-{kind}-{command}", build, status, names))
    import pytest

    for depth in (500, 1000):  # deeper than Python's recursion limit; iree-compile takes 2000
        cases.append(Case(f"source-nested-{depth}-opt",
                          lambda w, a, d=depth: (w.joinpath("deep.mlir").write_text(_deep_mlir(d)) and None) or
                          ["opt", "--dfit-tag", "deep.mlir", "-o", "deep.tagged.mlir"], 0,
                          marks=(pytest.mark.slow,) if depth > 500 else ()))
    cases.append(Case("compile-flag-unknown", lambda w, a: ["compile", put(a.mlir, w), "-o", "o.vmfb",
                                                            "--iree-no-such-flag"], 2, "no-such-flag"))
    cases.append(Case("compile-bad-target-triple",
                      lambda w, a: ["compile", "--dfit-tag", put(a.mlir, w), "-o", "o.vmfb",
                                    "--iree-llvmcpu-target-triple=bogus"], 3, "target-triple=bogus"))
    cases.append(Case("compile-tensors-without-tag", lambda w, a: ["compile", put(a.mlir, w), "-o", "o.vmfb",
                                                                   "--tensors", "*"], 2, "--tensors"))
    cases.append(Case("opt-bad-pipeline", lambda w, a: ["opt", put(a.mlir, w), "--pass-pipeline",
                                                        "builtin.module(no-such-pass)"], 2, "no-such-pass"))
    return cases


# --- vendor artifacts given to `dfit reconstruct` ----------------------------------------

def _tflite(edit: Callable[[bytes], bytes], alone: bool = True) -> Callable[[Path, Artifacts], list[str]]:
    def build(work: Path, art: Artifacts) -> list[str]:
        dump = work / "dump"
        dump.mkdir()
        data = (art.edgetpu_dump / "model_edgetpu.tflite").read_bytes()
        (dump / "model_edgetpu.tflite").write_bytes(edit(data))
        return ["reconstruct", str(dump / "model_edgetpu.tflite"), "--backend", "edgetpu", "-o", "b"]

    return build


def _tflite_tensor_index(data: bytes) -> bytes:
    """The compiled model with its first operator's first input index set past the end."""
    from tflite.Model import Model

    model = Model.GetRootAs(data, 0)
    graph = model.Subgraphs(0)
    op = graph.Operators(0)
    vector = op._tab.Vector(op._tab.Offset(8))  # Operator.inputs
    position = vector  # first element
    patched = bytearray(data)
    patched[position:position + 4] = (graph.TensorsLength() + 1000).to_bytes(4, "little", signed=True)
    return bytes(patched)


def _tflite_graph_output(data: bytes) -> bytes:
    """The compiled model with its subgraph output index set to -7."""
    from tflite.Model import Model

    graph = Model.GetRootAs(data, 0).Subgraphs(0)
    position = graph._tab.Vector(graph._tab.Offset(8))  # SubGraph.outputs
    patched = bytearray(data)
    patched[position:position + 4] = (-7).to_bytes(4, "little", signed=True)
    return bytes(patched)


def reconstruct_cases() -> list[Case]:
    cases = [
        Case("tflite-truncated-header", _tflite(lambda d: d[:6]), 2, "model_edgetpu.tflite"),
        Case("tflite-truncated-half", _tflite(lambda d: d[: len(d) // 2]), 2, "model_edgetpu.tflite"),
        Case("tflite-truncated-tenth", _tflite(lambda d: d[: len(d) // 10]), 2, "model_edgetpu.tflite"),
        Case("tflite-root-offset-flipped", _tflite(lambda d: b"\xff\xff\xff\x7f" + d[4:]), 2, "model_edgetpu.tflite"),
        Case("tflite-zero-filled", _tflite(lambda d: d[:8] + bytes(len(d) - 8)), 2, "model_edgetpu.tflite"),
        Case("tflite-tensor-index-out-of-range", _tflite(_tflite_tensor_index), 2, "tensor index"),
        Case("tflite-graph-output-negative", _tflite(_tflite_graph_output), 2, "output tensor index"),
        Case("reconstruct-empty-folder", lambda w, a: ["reconstruct", user_folder(w, "dump"), "-o", "b"], 2, "dump"),
        Case("reconstruct-missing", lambda w, a: ["reconstruct", "nowhere", "-o", "b"], 2, "nowhere"),
        Case("reconstruct-binary-garbage",
             lambda w, a: (w.joinpath("junk.bin").write_bytes(bytes(range(256)) * 40) and None) or
             ["reconstruct", "junk.bin", "-o", "b"], 2, "junk.bin"),
        Case("reconstruct-unknown-backend", lambda w, a: ["reconstruct", put(a.edgetpu_dump, w, "dump"),
                                                          "--backend", "tpu9", "-o", "b"], 2, "tpu9"),
        Case("reconstruct-wrong-backend", lambda w, a: ["reconstruct", put(a.edgetpu_dump, w, "dump"),
                                                        "--backend", "sambanova", "-o", "b"], 2, "dump"),
        Case("reconstruct-a-bundle", lambda w, a: ["reconstruct", put(a.bundle, w, "run"), "-o", "b"], 2, "run"),
        Case("reconstruct-unrelated-tflite-pair", _unrelated_pair, 2, "model_edgetpu.tflite"),
        # issue 17: a .tflite it cannot read was passed over (a smaller model, exit 0).
        Case("reconstruct-vmfb-as-tflite", _spoiled_original(lambda d, a: d.write_bytes(a.vmfb.read_bytes())), 2,
             "dump/model.tflite: not a TFLite model"),
        Case("reconstruct-zero-byte-tflite", _spoiled_original(lambda d, a: d.write_bytes(b"")), 2,
             "dump/model.tflite: not a TFLite model"),
        Case("reconstruct-folder-named-tflite", _spoiled_original(lambda d, a: (d.unlink(), d.mkdir())), 2,
             "dump/model.tflite: is a directory"),
        Case("reconstruct-tflite-identifier-swapped",
             _spoiled_original(lambda d, a: d.write_bytes(d.read_bytes()[:4] + b"3LFT" + d.read_bytes()[8:])), 2,
             "dump/model.tflite: not a TFLite model"),
        Case("reconstruct-tflite-pair-swapped", _spoiled_original(_swap_pair), 2, "looks swapped"),
        Case("analyze-second-tool-fails", _analysis_fails_late, 2, "bad.yaml"),
    ]
    return cases


def _spoiled_original(spoil: Callable[[Path, Artifacts], Any]) -> Callable[[Path, Artifacts], list[str]]:
    """franco's dump with its original ``model.tflite`` spoiled by ``spoil(path, art)``."""
    def build(work: Path, art: Artifacts) -> list[str]:
        put(art.edgetpu_dump, work, "dump")
        spoil(work / "dump" / "model.tflite", art)
        return ["reconstruct", "dump", "-o", "b"]

    return build


def _swap_pair(original: Path, art: Artifacts) -> None:
    compiled = original.with_name("model_edgetpu.tflite")
    data = original.read_bytes()
    original.write_bytes(compiled.read_bytes())
    compiled.write_bytes(data)


def _unrelated_pair(work: Path, art: Artifacts) -> list[str]:
    """franco's compiled model beside another model's original under the paired name."""
    from tests.conftest import vendor_fixture

    dump = work / "dump"
    dump.mkdir()
    put(art.edgetpu_dump / "model_edgetpu.tflite", dump)
    put(vendor_fixture("edgetpu/coral_transfer_mobilenet_v2_v16/mobilenet_v2_1.0_224_quant.tflite"), dump,
        "model.tflite")
    return ["reconstruct", "dump", "-o", "b"]


# --- what must work: reruns over dfit's own outputs, and --force ---------------------------

def _rerun_run(work: Path, art: Artifacts) -> list[str]:
    from dfit_mlir.core import outputs

    name = vmfb_pair(work, art)
    shutil.copytree(art.bundle, work / "b")
    assert outputs.is_marked(work / "b", "bundle")
    return ["run", name, "--mode", "ids", "-o", "b"]


def _rerun_analyze(work: Path, art: Artifacts) -> list[str]:
    from dfit_mlir.core import outputs

    put(art.bundle, work, "run")
    (work / "run" / "analysis").mkdir()
    (work / "run" / "analysis" / "compile-metrics").mkdir()
    outputs.write_marker(work / "run" / "analysis", "analysis")
    return ["analyze", "run", "--tool", "compile-metrics"]


def _user_folder_forced(work: Path, art: Artifacts) -> list[str]:
    user_folder(work, "b")
    return ["run", vmfb_pair(work, art), "--mode", "ids", "-o", "b", "--force"]


def _explorer_twice(work: Path, art: Artifacts) -> list[str]:
    from dfit_mlir.core import atomic

    put(art.bundle, work, "run")
    atomic.write_text(work / "n.json", "{}\n", kind="node-data")
    return ["export-explorer", "run", "-o", "n.json"]


def _diff_folder_twice(work: Path, art: Artifacts) -> list[str]:
    from dfit_mlir.core import outputs

    put(art.bundle, work, "run")
    (work / "d").mkdir()
    (work / "d" / "diff.csv").write_text("old\n")
    outputs.write_marker(work / "d", "diff")
    return ["diff", "run", "run", "-o", "d"]


def _analysis_fails_late(work: Path, art: Artifacts) -> list[str]:
    """A previous analysis in the bundle; now the first tool runs and the second fails
    on its (bad) profile: nothing of the first may be written, the old one stays."""
    from dfit_mlir.core import outputs

    put(art.bundle, work, "run")
    analysis = work / "run" / "analysis"
    (analysis / "compile-metrics").mkdir(parents=True)
    (analysis / "compile-metrics" / "stages.csv").write_text("old,analysis\n")
    outputs.write_marker(analysis, "analysis")
    (work / "bad.yaml").write_text("name: x\nbackend: x\n")
    return ["analyze", "run", "--tool", "compile-metrics", "--tool", "program-analyzer",
            "--option", "program-analyzer.profile=bad.yaml"]


def success_cases() -> list[Case]:
    return [
        Case("ok-run-over-its-own-bundle", _rerun_run, 0, replaces=("b",)),
        Case("ok-analyze-over-its-own-analysis", _rerun_analyze, 0, replaces=("run/analysis",)),
        Case("ok-run-forced-over-a-user-folder", _user_folder_forced, 0, replaces=("b",)),
        Case("ok-export-explorer-over-its-own-file", _explorer_twice, 0, replaces=("n.json",)),
        Case("ok-diff-over-its-own-folder", _diff_folder_twice, 0, replaces=("d",)),
        Case("ok-opt-latin1-comment", lambda w, a: ["opt", MLIR_SOURCES["latin1-comment"][0](w, a), "-o", "o.mlir"], 0),
        Case("ok-show-vmfb-manifest", lambda w, a: ["show", put(a.manifest, w)], 0),
    ]


def all_cases() -> list[Case]:
    # Issue 17's cases: bundle contents, stores, run inputs, model files.
    from tests.badinput_bundles import all_cases as contents_and_stores

    return [*manifest_cases(), *bundle_cases(), *output_cases(), *option_cases(), *input_cases(), *vmfb_cases(),
            *source_cases(), *reconstruct_cases(), *success_cases(), *contents_and_stores()]


# --- cases whose fix belongs to another part of dfit ------------------------------------------
# (kept here so the suite covers every command; xfail until the owner's change is merged)

def _log_edit(relative: str, edit: Callable[[str], str], backend: str) -> Callable[[Path, Artifacts], list[str]]:
    def build(work: Path, art: Artifacts) -> list[str]:
        import re  # noqa: F401 — edits use it

        from tests.conftest import vendor_fixture

        source = vendor_fixture(relative)
        target = work / "dump"
        shutil.copytree(source, target) if source.is_dir() else (target.mkdir(), shutil.copy(source, target))
        for path in sorted(p for p in target.rglob("*") if p.is_file()):
            path.write_text(edit(path.read_text(errors="surrogateescape")), errors="surrogateescape")
        return ["reconstruct", "dump", "--backend", backend, "-o", "b"]

    return build


def _first_rate(value: str) -> Callable[[str], str]:
    import re

    return lambda text: re.sub(r"Rate=[0-9.]+", f"Rate={value}", text, count=1)


def _deep_cirh(work: Path, art: Artifacts) -> list[str]:
    dump = work / "dump" / "cs_1"
    dump.mkdir(parents=True)
    (dump / "cirh.mlir").write_text(_deep_mlir(5000))
    return ["reconstruct", "dump", "--backend", "cerebras", "-o", "b"]


def _long_line(work: Path, art: Artifacts) -> list[str]:
    from tests.conftest import vendor_fixture

    (work / "dump").mkdir()
    text = vendor_fixture("cerebras/alcf_bert_large_bs512_r2x/mytest.log").read_text()
    lines = text.splitlines()
    lines.insert(80, "2024-04-08 04:34:04,249 INFO:   | " + "Rate=1 " * 150_000)
    (work / "dump" / "mytest.log").write_text("\n".join(lines) + "\n")
    return ["reconstruct", "dump", "--backend", "cerebras", "-o", "b"]


EMBEDDING_MLIR = """
func.func @lookup(%ids: tensor<4xi64>, %table: tensor<8x3xf32>) -> tensor<4x3xf32> {
  %empty = tensor.empty() : tensor<4x3xf32>
  %out = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i)>, affine_map<(i, j) -> (i, j)>],
      iterator_types = ["parallel", "parallel"]} ins(%ids : tensor<4xi64>) outs(%empty : tensor<4x3xf32>) {
  ^bb0(%id: i64, %o: f32):
    %row = arith.index_cast %id : i64 to index
    %col = linalg.index 1 : index
    %v = tensor.extract %table[%row, %col] : tensor<8x3xf32>
    linalg.yield %v : f32
  } -> tensor<4x3xf32>
  return %out : tensor<4x3xf32>
}
"""


def _embedding_default_inputs(work: Path, art: Artifacts) -> list[str]:
    from dfit_mlir.passes.instrumented_compile import compile_instrumented

    (work / "emb.mlir").write_text(EMBEDDING_MLIR)
    compile_instrumented(work / "emb.mlir", work / "emb.vmfb", mode="full")
    return ["run", "emb.vmfb", "--mode", "ids", "-o", "b"]


def owned_elsewhere() -> list[tuple[Case, str]]:
    """(case, owner): the readers' numbers and line lengths, runtime isolation, filters."""
    either = frozenset({0, 2})
    cases = [
        (Case("log-rate-inf", _log_edit("cerebras/alcf_bert_large_bs512_r2x", _first_rate("inf"), "cerebras"),
              either, "mytest.log"), "readers"),
        (Case("log-rate-nan", _log_edit("cerebras/alcf_bert_large_bs512_r2x", _first_rate("nan"), "cerebras"),
              either, "mytest.log"), "readers"),
        (Case("log-rate-5000-digits", _log_edit("cerebras/alcf_bert_large_bs512_r2x", _first_rate("9" * 5000),
                                                "cerebras"), either, "mytest.log"), "readers"),
        (Case("log-1mb-line", _long_line, either, "mytest.log"), "readers"),
        (Case("cirh-5000-deep", _deep_cirh, either, "cirh.mlir"), "readers"),
        (Case("run-embedding-default-inputs", _embedding_default_inputs, frozenset({0, 2, 3}), None), "join"),
        (Case("compile-tensors-match-nothing",
              lambda w, a: ["compile", "--dfit-tag", put(a.mlir, w), "--mode", "ids", "--tensors", "nomatch*",
                            "-o", "o.vmfb"], 2, "nomatch"), "diffux"),
        (Case("run-ids-match-nothing", lambda w, a: ["run", vmfb_pair(w, a), "--mode", "ids", "--ids", "nomatch*",
                                                     "-o", "b"], 2, "nomatch"), "diffux"),
    ]
    return [(dataclasses.replace(case, isolated=True), owner) for case, owner in cases]
