"""The ``dfit`` group: every command, one module per family (``compile``, ``run``,
``analyze``, ``fleet``), under the contract of :mod:`dfit_mlir.cli.contract`."""

from __future__ import annotations

import click

from dfit_mlir.cli import analyze, compile, fleet, run
from dfit_mlir.cli.contract import EPILOG, DfitGroup


@click.group(cls=DfitGroup, context_settings={"help_option_names": ["-h", "--help"]}, epilog=EPILOG)
@click.version_option(package_name="dfit-mlir")
def main() -> None:
    """dfit-mlir: stable semantic IDs and lineage for ML compilers."""



main.add_command(compile.compile)
main.add_command(compile.opt)
main.add_command(run.run)
main.add_command(run.reconstruct)
main.add_command(run.backends)
main.add_command(analyze.analyze)
main.add_command(analyze.tools)
main.add_command(analyze.diff)
main.add_command(analyze.export_explorer)
main.add_command(analyze.view)
main.add_command(analyze.show)
main.add_command(fleet.collect)
main.add_command(fleet.query)
main.add_command(fleet.store_group)
main.add_command(fleet.merge)
