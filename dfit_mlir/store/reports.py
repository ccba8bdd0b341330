"""Named reports: SQL files in ``dfit_mlir/store/sql`` with ``${name}`` parameters, one
text for DuckDB and Spark (see :mod:`dfit_mlir.store.dialects`)."""

from __future__ import annotations

import string
from dataclasses import dataclass
from importlib import resources
from typing import Any, Final

from dfit_mlir.errors import InvalidInputError
from dfit_mlir.store.dialects import Dialect


@dataclass(frozen=True)
class Parameter:
    name: str
    kind: type  # str, int or float
    default: Any = None  # None: required
    help: str = ""


@dataclass(frozen=True)
class Report:
    name: str
    summary: str
    parameters: tuple[Parameter, ...] = ()

    def text(self) -> str:
        return resources.files("dfit_mlir.store").joinpath(f"sql/{self.name}.sql").read_text()

    def render(self, dialect: Dialect, values: dict[str, Any]) -> str:
        """The report's SQL with ``values`` as literals of ``dialect`` (defaults filled in)."""
        bound = {}
        for parameter in self.parameters:
            value = values.get(parameter.name)
            if value is None:
                value = parameter.default
            if value is None:
                raise InvalidInputError(f"report {self.name} needs --{parameter.name.replace('_', '-')}")
            try:
                value = parameter.kind(value)
            except (TypeError, ValueError):
                raise InvalidInputError(f"report {self.name}: --{parameter.name.replace('_', '-')} "
                                        f"{value!r} is not a {parameter.kind.__name__}") from None
            bound[parameter.name] = dialect.literal(value)
        unknown = sorted(set(k for k, v in values.items() if v is not None) - {p.name for p in self.parameters})
        if unknown:
            raise InvalidInputError(f"report {self.name} takes no {', '.join('--' + u for u in unknown)}")
        return string.Template(self.text()).substitute(bound)


REPORTS: Final = {report.name: report for report in (
    Report("top-sites", "time by source line / module path across runs",
           (Parameter("limit", int, 20, "rows"),)),
    Report("regressions", "per stable ID, candidate vs baseline runs; only changes outside the runs' spread",
           (Parameter("baseline", str, None, "label of the baseline runs"),
            Parameter("candidate", str, None, "label of the candidate runs"),
            Parameter("min_runs", int, 2, "runs needed on each side"),
            Parameter("threshold", float, 0.05, "smallest relative change reported"))),
    Report("rank-skew", "per step (else per run record) of a multi-rank job: slowest rank vs the median rank"),
    Report("coverage", "what each backend exposed (declared) and what its runs hold (observed)"),
)}


def get(name: str) -> Report:
    try:
        return REPORTS[name]
    except KeyError:
        raise InvalidInputError(f"unknown report {name!r} (reports: {', '.join(sorted(REPORTS))})") from None
