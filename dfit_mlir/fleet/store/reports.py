"""Named reports: SQL files in ``dfit_mlir/fleet/store/sql`` with ``${name}`` parameters, one
text for DuckDB and Spark (see :mod:`dfit_mlir.fleet.store.dialects`)."""

from __future__ import annotations

import string
from dataclasses import dataclass
from importlib import resources
from typing import Any, Final

from dfit_mlir.core.errors import InvalidInputError
from dfit_mlir.fleet.store.dialects import Dialect


@dataclass(frozen=True)
class Parameter:
    name: str
    kind: type  # str, int or float
    default: Any = None  # None: required
    help: str = ""
    low: float | None = None  # numeric parameters: the range a value must lie in
    high: float | None = None

    @property
    def option(self) -> str:
        return "--" + self.name.replace("_", "-")

    def bind(self, report: str, value: Any) -> Any:
        """``value`` as this parameter's kind, checked (finite, in range) before it can
        reach the SQL text: ``nan`` or ``1e400`` would be rendered as a column name or
        ``inf``."""
        import math

        try:
            if self.kind is int and isinstance(value, float) and not value.is_integer():
                raise ValueError
            bound = self.kind(value)
        except (TypeError, ValueError, OverflowError):
            raise InvalidInputError(f"report {report}: {self.option} {value!r} is not "
                                    f"{'an integer' if self.kind is int else 'a number'}") from None
        if self.kind in (int, float):
            if not math.isfinite(bound) or (self.low is not None and bound < self.low) or (
                    self.high is not None and bound > self.high):
                raise InvalidInputError(f"report {report}: {self.option} {value} is not a finite number in "
                                        f"[{self.low:g}, {self.high:g}]")
        return bound


@dataclass(frozen=True)
class Report:
    name: str
    summary: str
    parameters: tuple[Parameter, ...] = ()

    def text(self) -> str:
        return resources.files("dfit_mlir.fleet.store").joinpath(f"sql/{self.name}.sql").read_text()

    def render(self, dialect: Dialect, values: dict[str, Any]) -> str:
        """The report's SQL with ``values`` as literals of ``dialect`` (defaults filled in)."""
        bound = {}
        for parameter in self.parameters:
            value = values.get(parameter.name)
            if value is None:
                value = parameter.default
            if value is None:
                raise InvalidInputError(f"report {self.name} needs {parameter.option}")
            bound[parameter.name] = dialect.literal(parameter.bind(self.name, value))
        unknown = sorted(set(k for k, v in values.items() if v is not None) - {p.name for p in self.parameters})
        if unknown:
            raise InvalidInputError(f"report {self.name} takes no {', '.join('--' + u for u in unknown)}")
        return string.Template(self.text()).substitute(bound)


REPORTS: Final = {report.name: report for report in (
    Report("top-sites", "time by source line / module path across runs",
           (Parameter("limit", int, 20, "rows", 1, 1_000_000_000),)),
    Report("regressions", "per stable ID, candidate vs baseline runs; only changes outside the runs' spread",
           (Parameter("baseline", str, None, "label of the baseline runs"),
            Parameter("candidate", str, None, "label of the candidate runs"),
            Parameter("min_runs", int, 2, "runs needed on each side", 1, 1_000_000_000),
            Parameter("threshold", float, 0.05, "smallest relative change reported", 0, 1e6))),
    Report("rank-skew", "per step (else per run record) of a multi-rank job: slowest rank vs the median rank"),
    Report("coverage", "what each backend exposed (declared) and what its runs hold (observed)"),
)}


def get(name: str) -> Report:
    try:
        return REPORTS[name]
    except KeyError:
        raise InvalidInputError(f"no report {name!r} (reports: {', '.join(sorted(REPORTS))}){_did_you_mean(name)}") \
            from None


def _did_you_mean(name: str) -> str:
    import difflib

    close = difflib.get_close_matches(name.lower(), list(REPORTS), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def check_labels(report: str, values: dict[str, Any], labels: list[str | None]) -> None:
    """A label a report compares must name runs of the store: a mistyped one would give
    no rows, silently."""
    if report != "regressions":
        return
    known = sorted({label for label in labels if label is not None})
    for option in ("baseline", "candidate"):
        label = values.get(option)
        if label is not None and str(label) not in known:
            listed = ", ".join(repr(k) for k in known) if known else "none: collect with --label"
            raise InvalidInputError(f"report regressions: no run has label {str(label)!r} (--{option}); "
                                    f"labels in the store: {listed}")


def why_empty(report: str, values: dict[str, Any], rows_of: Any, dialect: Dialect) -> str | None:
    """Why ``report`` returned no rows, where the store tells (None: no reason to give).
    ``rows_of(sql)``: the rows of ``sql`` as dicts."""
    if report == "rank-skew":
        [counted] = rows_of("SELECT COUNT(*) AS n FROM events "
                            "WHERE (rank IS NOT NULL OR pid IS NOT NULL) AND kind <> 'compile'")
        if not counted["n"]:
            return ("no event in the store names a rank or a task (pid): rank-skew compares the ranks of one job "
                    "(collect each rank's bundle with --rank, or a log whose reader tags its tasks)")
    if report == "regressions" and values.get("baseline") is not None and values.get("candidate") is not None:
        labels = [str(values["baseline"]), str(values["candidate"])]
        min_runs = int(values.get("min_runs") or 2)
        listed = ", ".join(dialect.literal(label) for label in labels)
        runs = {row["label"]: row["n"] for row in rows_of(
            f"SELECT label, COUNT(*) AS n FROM runs WHERE label IN ({listed}) AND kind <> 'compile' GROUP BY label")}
        short = [f"{label!r} has {runs.get(label, 0)}" for label in dict.fromkeys(labels)
                 if runs.get(label, 0) < min_runs]
        if short:
            return (f"{' and '.join(short)} run(s), fewer than --min-runs {min_runs}: the runs' spread is "
                    "unknown, so no change is reported")
        side = ("SELECT o.backend, o.model, o.op_id FROM op_ledger o JOIN runs r ON r.run = o.run "
                "AND r.backend = o.backend AND r.model = o.model WHERE o.calls > 0 AND r.label = {}")
        [common] = rows_of(f"SELECT COUNT(*) AS n FROM ({side.format(dialect.literal(labels[0]))} INTERSECT "
                           f"{side.format(dialect.literal(labels[1]))}) shared")
        if not common["n"]:
            return ("the baseline's and the candidate's runs time no stable ID in common (of the same backend and "
                    "model): nothing to compare")
        return (f"none of the {common['n']} stable IDs timed on both sides changed outside the runs' spread and by "
                "more than --threshold")
    return None
