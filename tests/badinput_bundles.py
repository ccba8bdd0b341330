"""Bad-input cases of issue 17 beyond the query (tests/test_bad_input.py runs them with the
rest of the suite): bundle contents that were trusted, stores that read what is not
theirs, run inputs and model files that hung or ended dfit, integer options past int64.

Every case starts from the suite's real artifacts (the convnet compiled and run once) and
corrupts a copy; the suite asserts the exit status, one ``dfit`` line naming the file (and
column and row), no traceback, and nothing created or changed on an error — a collect
refused leaves no store behind.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.badinput_cases import Artifacts, Case, put, vmfb_pair

# --- events.parquet corruptions: the right file, contents dfit must not trust -------------


def _events_edit(edit: Callable[[Any], Any]) -> Callable[[Path], None]:
    """Rewrite ``bundle/events.parquet`` with ``edit(table)`` (schema metadata kept unless
    the edit replaces it)."""
    def apply(bundle: Path) -> None:
        import pyarrow.parquet as pq

        path = bundle / "events.parquet"
        pq.write_table(edit(pq.read_table(path)), path)

    return apply


def _column(name: str, make: Callable[[int], Any]) -> Callable[[Path], None]:
    """Replace column ``name`` by ``make(rows)`` (an Arrow array of any type)."""
    def edit(table: Any) -> Any:
        import pyarrow as pa

        array = make(table.num_rows)
        index = table.column_names.index(name)
        return table.set_column(index, pa.field(name, array.type), array).replace_schema_metadata(
            table.schema.metadata)

    return _events_edit(edit)


def _one_value(name: str, row: int, value: Any) -> Callable[[Path], None]:
    """Set one row of an integer column (the others stay as the run wrote them)."""
    def edit(table: Any) -> Any:
        import pyarrow as pa

        values = table.column(name).to_pylist()
        values[row] = value
        index = table.column_names.index(name)
        return table.set_column(index, table.schema.field(index), pa.array(values, table.schema.field(index).type))

    return _events_edit(edit)


def _metadata(edit: Callable[[dict[bytes, bytes]], dict[bytes, bytes] | None]) -> Callable[[Path], None]:
    return _events_edit(lambda table: table.replace_schema_metadata(edit(dict(table.schema.metadata or {}))))


def _array(values: Callable[[int], list[Any]], kind: Any = None) -> Callable[[int], Any]:
    def make(rows: int) -> Any:
        import pyarrow as pa

        return pa.array(values(rows), kind)

    return make


def _events_directory(bundle: Path) -> None:
    """events.parquet replaced by a directory holding the real file (a dataset folder)."""
    path = bundle / "events.parquet"
    data = path.read_bytes()
    path.unlink()
    path.mkdir()
    (path / "part-0.parquet").write_bytes(data)


def _attribute_rank(bundle: Path) -> None:
    """Row 1's attributes name a rank past int32 (the store's rank column)."""
    def edit(table: Any) -> Any:
        import pyarrow as pa

        values = table.column("attributes").to_pylist()
        values[1] = json.dumps({"rank": 10**30})
        index = table.column_names.index("attributes")
        return table.set_column(index, table.schema.field(index), pa.array(values, pa.string()))

    _events_edit(edit)(bundle)


def _int(kind: str) -> Any:
    import pyarrow as pa

    return getattr(pa, kind)()


#: name → (edit of a copied bundle, what the error must say).
EVENT_CORRUPTIONS: dict[str, tuple[Callable[[Path], None], str]] = {
    "duration-string": (_column("duration_ns", _array(lambda n: ["12"] * n)), "column 'duration_ns' is string"),
    "duration-nan": (_column("duration_ns", _array(lambda n: [float("nan")] * n)), "column 'duration_ns' is double"),
    "duration-negative": (_one_value("duration_ns", 1, -1000), "column 'duration_ns', row 1: -1000 is negative"),
    "start-negative": (_one_value("start_ns", 1, -1), "column 'start_ns', row 1: -1 is negative"),
    "start-past-int64": (_column("start_ns", lambda n: _array(lambda m: [2**64 - 1] * m, _int("uint64"))(n)),
                         "column 'start_ns' is uint64"),
    "start-huge": (_one_value("start_ns", 1, 2**63 - 1), "column 'start_ns', row 1"),
    "invocation-negative": (_one_value("invocation", 1, -3), "column 'invocation', row 1"),
    "kind-garbage": (_column("kind", lambda n: _array(lambda m: ["dispatch"] * (m - 1) + ["zzz"])(n)
                             .dictionary_encode()), "column 'kind', row"),
    "kind-null": (_column("kind", _array(lambda n: [None] * n, _int("string"))), "column 'kind', row 0: null"),
    "column-dropped": (_events_edit(lambda table: table.drop(["duration_ns"])), "column 'duration_ns' is missing"),
    "no-schema-metadata": (_metadata(lambda meta: None), "no dfit.events schema metadata"),
    "schema-version-9": (_metadata(lambda meta: {**meta, b"dfit.version": b"9.0"}), "event schema '9.0'"),
    "events-a-directory": (_events_directory, "events.parquet"),
}

#: Commands that read a bundle's events: (argv for the bad bundle ``run``).
EVENT_READERS: dict[str, Callable[[Path, Artifacts], list[str]]] = {
    "analyze": lambda work, art: ["analyze", "run", "--tool", "semantic-attribution", "--out", "out"],
    "diff": lambda work, art: ["diff", put(art.bundle, work, "good"), "run"],
    "merge": lambda work, art: ["merge", put(art.bundle, work, "good"), "run", "-o", "merged"],
    "collect": lambda work, art: ["collect", "run", "-o", "store"],
}


def _bad_bundle(edit: Callable[[Path], None], argv: Callable[[Path, Artifacts], list[str]]
                ) -> Callable[[Path, Artifacts], list[str]]:
    def build(work: Path, art: Artifacts) -> list[str]:
        put(art.bundle, work, "run")
        edit(work / "run")
        return argv(work, art)

    return build


def _summary_edit(key: str, value: Any) -> Callable[[Path], None]:
    def edit(bundle: Path) -> None:
        document = json.loads((bundle / "summary.json").read_text())
        document[key] = value
        (bundle / "summary.json").write_text(json.dumps(document))

    return edit


#: summary.json placement fields merge and collect read: name → (edit, what the error says).
SUMMARY_CORRUPTIONS: dict[str, tuple[Callable[[Path], None], str]] = {
    "rank-past-int32": (_summary_edit("rank", 2**40), "summary.json: rank"),
    "rank-a-string": (_summary_edit("rank", "3"), "summary.json: rank"),
    "clock-offset-past-int64": (_summary_edit("clock_offset_ns", 2**70), "summary.json: clock_offset_ns"),
    "clock-offset-a-float": (_summary_edit("clock_offset_ns", 1.5), "summary.json: clock_offset_ns"),
}


def bundle_content_cases() -> list[Case]:
    cases = []
    for kind, (edit, names) in EVENT_CORRUPTIONS.items():
        for command, argv in EVENT_READERS.items():
            cases.append(Case(f"events-{kind}-{command}", _bad_bundle(edit, argv), 2, names))
    for kind, (edit, names) in SUMMARY_CORRUPTIONS.items():
        for command in ("merge", "collect"):
            cases.append(Case(f"summary-{kind}-{command}", _bad_bundle(edit, EVENT_READERS[command]), 2, names))
    for command in ("merge", "collect"):
        cases.append(Case(f"events-attribute-rank-past-int32-{command}",
                          _bad_bundle(_attribute_rank, EVENT_READERS[command]), 2,
                          "column 'attributes', row 1: rank"))
    cases.append(Case("merge-a-bundle-and-its-copy",
                      lambda w, a: ["merge", put(a.bundle, w, "run"), put(a.bundle, w, "copy"), "-o", "m"], 2,
                      "copy: the same run as run"))
    return cases


# --- stores that hold what is not theirs ---------------------------------------------------

def _store(work: Path, art: Artifacts, name: str = "store") -> Path:
    """The suite's bundle collected into a store of the working folder."""
    from dfit_mlir.fleet.store import collect

    collect([art.bundle], work / name)
    return work / name


def _stored_run(store: Path) -> Path:
    return next((store / "bundles").glob("backend=*/model=*/run=*"))


def _linked_bundle(work: Path, art: Artifacts) -> Path:
    """A second store's bundle linked into this one under another run name."""
    store, other = _store(work, art), _store(work, art, "other")
    os.symlink(_stored_run(other), _stored_run(store).parent / "run=linked")
    return store


def _linked_table(work: Path, art: Artifacts) -> Path:
    """The run's events.parquet replaced by a symlink to another store's."""
    store, other = _store(work, art), _store(work, art, "other")
    events = _stored_run(store) / "events.parquet"
    events.unlink()
    events.symlink_to(_stored_run(other) / "events.parquet")
    return store


def _foreign_run(work: Path, art: Artifacts) -> Path:
    """A folder named like a run, holding a Parquet file dfit did not write there."""
    store = _store(work, art)
    stored = _stored_run(store)
    foreign = stored.parent / "run=foreign"
    foreign.mkdir()
    shutil.copyfile(stored / "events.parquet", foreign / "events.parquet")
    return store


def _events_dir_in_store(work: Path, art: Artifacts) -> Path:
    store = _store(work, art)
    _events_directory(_stored_run(store))
    return store


def _meta(data: Callable[[bytes], bytes]) -> Callable[[Path, Artifacts], Path]:
    def make(work: Path, art: Artifacts) -> Path:
        store = _store(work, art)
        meta = store / "dfit-store.json"
        meta.write_bytes(data(meta.read_bytes()))
        return store

    return make


def _meta_field(key: str, value: Any) -> Callable[[bytes], bytes]:
    return lambda data: json.dumps({**json.loads(data), key: value}).encode()


def _truncated_events(work: Path, art: Artifacts) -> Path:
    store = _store(work, art)
    events = _stored_run(store) / "events.parquet"
    events.write_bytes(events.read_bytes()[: events.stat().st_size // 2])
    return store


#: name → (make the store, what the error says).
STORES: dict[str, tuple[Callable[[Path, Artifacts], Path], str]] = {
    "bundle-symlinked-in": (_linked_bundle, "run=linked: a symlink"),
    "table-symlinked-in": (_linked_table, "events.parquet: a symlink"),
    "foreign-run-folder": (_foreign_run, "run=foreign: not a bundle dfit collect wrote"),
    "events-a-directory": (_events_dir_in_store, "events.parquet: not a regular file"),
    "meta-a-list": (_meta(lambda data: b"[1, 2]"), "dfit-store.json: not a dfit store description"),
    "meta-utf16": (_meta(lambda data: data.decode().encode("utf-16")), "dfit-store.json: not a dfit store description"),
    "meta-event-schema-9": (_meta(_meta_field("event_schema", "9.0")), "event schema 9.0"),
}

STORE_COMMANDS: dict[str, Callable[[Path, Artifacts, Path], list[str]]] = {
    "query": lambda work, art, store: ["query", store.name, "SELECT count(*) FROM events"],
    "collect": lambda work, art, store: ["collect", put(art.edgetpu_bundle, work, "tpu"), "-o", store.name],
    "compact": lambda work, art, store: ["store", "compact", store.name],
}


def _store_case(make: Callable[[Path, Artifacts], Path],
                argv: Callable[[Path, Artifacts, Path], list[str]]) -> Callable[[Path, Artifacts], list[str]]:
    return lambda work, art: argv(work, art, make(work, art))


def store_cases() -> list[Case]:
    cases = []
    for kind, (make, names) in STORES.items():
        for command, argv in STORE_COMMANDS.items():
            cases.append(Case(f"store-{kind}-{command}", _store_case(make, argv), 2, names))
    cases.append(Case("store-compact-truncated-events", _store_case(_truncated_events, STORE_COMMANDS["compact"]),
                      2, "events.parquet: unreadable"))
    return cases


# --- run inputs, model files, pass pipelines, integer options --------------------------------

def _npy_header(header: bytes, version: tuple[int, int] = (1, 0), data: bytes = b"") -> Callable[[Path], str]:
    """An .npy file with this raw header (padded as numpy pads it) and data."""
    def make(work: Path) -> str:
        padded = header + b" " * ((64 - (10 + len(header) + 1) % 64) % 64) + b"\n"
        size = len(padded).to_bytes(2 if version == (1, 0) else 4, "little")
        (work / "x.npy").write_bytes(b"\x93NUMPY" + bytes(version) + size + padded + data)
        return "x.npy"

    return make


def _fifo(work: Path) -> str:
    os.mkfifo(work / "x.npy")
    return "x.npy"


GOOD_HEADER = b"{'descr': '<f4', 'fortran_order': False, 'shape': (1, 32, 32, 3), }"
RUN_INPUTS: dict[str, Callable[[Path], str]] = {
    "fifo": _fifo,
    "header-unterminated": _npy_header(b"{'descr': '<f4', 'shape': (1,"),
    "header-not-a-dict": _npy_header(b"[1, 2, 3]"),
    "header-negative-shape": _npy_header(b"{'descr': '<f4', 'fortran_order': False, 'shape': (-1, 32, 32, 3), }"),
    "version-9": _npy_header(GOOD_HEADER, (9, 0), bytes(4 * 32 * 32 * 3)),
}


def _model_file(body: str) -> Callable[[Path, Artifacts], list[str]]:
    def build(work: Path, art: Artifacts) -> list[str]:
        (work / "m.py").write_text(body)
        return ["compile", "m.py", "-o", "m.vmfb"]

    return build


MODEL_FILES = {
    "sys-exit-0": "import sys\nsys.exit(0)\n",
    "sys-exit-3": "import sys\nsys.exit(3)\n",
    "os-exit-0": "import os\nos._exit(0)\n",
    "factory-os-exit": "def make_model():\n    import os\n    os._exit(0)\n",
}

INT_OPTIONS: dict[str, Callable[[Path, Artifacts], list[str]]] = {
    "run-rank-past-int32": lambda w, a: ["run", vmfb_pair(w, a), "--mode", "ids", "--rank", str(2**31), "-o", "b"],
    "run-clock-offset-past-int64": lambda w, a: ["run", vmfb_pair(w, a), "--mode", "ids", "--clock-offset-ns",
                                                 str(2**63), "-o", "b"],
    "collect-rank-past-int32": lambda w, a: ["collect", put(a.bundle, w, "run"), "--rank", str(2**40), "-o", "s"],
    "diff-limit-past-int64": lambda w, a: ["diff", put(a.bundle, w, "run"), "run", "--limit", str(10**20)],
    "query-rows-past-int64": lambda w, a: ["query", _store(w, a).name, "SELECT 1", "--rows", str(10**20)],
    "compact-small-events-past-int64": lambda w, a: ["store", "compact", _store(w, a).name, "--small-events",
                                                     str(2**64)],
}
INT_OPTION_NAMES = {"run-rank-past-int32": "--rank", "run-clock-offset-past-int64": "--clock-offset-ns",
                    "collect-rank-past-int32": "--rank", "diff-limit-past-int64": "--limit",
                    "query-rows-past-int64": "--rows", "compact-small-events-past-int64": "--small-events"}


def run_compile_cases() -> list[Case]:
    cases = [Case(f"run-npy-{kind}", lambda w, a, m=make: ["run", vmfb_pair(w, a), "--mode", "ids",
                                                             f"--input=@{m(w)}", "-o", "b"], 2, "x.npy",
                  isolated=kind == "fifo")  # a regression would hang: its own process, under a timeout
             for kind, make in RUN_INPUTS.items()]
    # The model file's exit would end the test session itself were the guard to regress.
    cases += [Case(f"compile-model-file-{kind}", _model_file(body), 3, "m.py", isolated=kind.startswith(("os", "f")))
              for kind, body in MODEL_FILES.items()]
    cases.append(Case("opt-pipeline-anchored-on-func", lambda w, a: ["opt", put(a.mlir, w), "--pass-pipeline",
                                                                     "func.func(cse)", "-o", "o.mlir"],
                      2, "anchored on func.func"))
    cases += [Case(f"option-{name}", build, 2, INT_OPTION_NAMES[name]) for name, build in INT_OPTIONS.items()]
    return cases


def all_cases() -> list[Case]:
    return [*bundle_content_cases(), *store_cases(), *run_compile_cases()]
