"""The command line's contract: one exit-status table, one line per error, no traceback;
the options and bounds the commands share."""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any, Callable

import click

from dfit_mlir.core import atomic
from dfit_mlir.core.errors import (
    EXIT_INTERNAL_ERROR,
    EXIT_INTERRUPTED,
    EXIT_INVALID_INPUT,
    EXIT_TABLE,
    DfitError,
)

# --- the CLI contract: one exit-status table, one line per error, no traceback ---------

#: Parameters naming a command's main input, in the order the internal-error line looks.
_INPUT_PARAMETERS = ("source", "vmfb", "dumps", "bundle", "bundle_a", "manifest_path", "bundles", "store_path")


def user_errors(command: Callable[..., Any]) -> Callable[..., Any]:
    """Every way a command ends, mapped to the exit-status table of ``dfit --help``:
    :class:`DfitError` → its one-line message and status; SIGINT/SIGTERM → 130 with
    temporaries removed; anything unexpected → one line naming the command and the
    input plus a traceback file, status 70."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        name = click.get_current_context().info_name or command.__name__
        previous = _route_sigterm()
        atomic.forget_signals()
        try:
            atomic.require_usable_temp_dir()  # before anything falls back to /tmp in silence
            result = command(*args, **kwargs)
            atomic.check_not_interrupted()  # a signal whose exception a finalizer dropped
            return result
        except DfitError as error:
            # One `dfit:` line says what failed; a toolchain's own diagnostics follow it.
            click.echo(_capped(f"dfit: {error}"), err=True)
            sys.exit(error.exit_code)
        except KeyboardInterrupt:
            atomic.remove_temporaries()
            atomic.forget_caught_interrupt()  # else `python -m dfit_mlir` may die by SIGINT, not 130
            click.echo(f"dfit {name}: interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except BrokenPipeError:  # `dfit backends | head`
            sys.exit(0)
        except click.exceptions.Exit:
            raise
        except OSError as error:
            where = error.filename or _main_input(kwargs) or ""
            click.echo(f"dfit: {where}: {error.strerror or error}", err=True)
            sys.exit(EXIT_INVALID_INPUT)
        except (SystemExit, click.ClickException):
            raise
        except Exception as error:  # noqa: BLE001 — the catch-all of the exit-status table
            atomic.remove_temporaries()
            saved = _save_traceback(name)
            message = " ".join(str(error).split())[:300]
            click.echo(f"dfit {name}: internal error on {_main_input(kwargs) or '(no input)'}: "
                       f"{type(error).__name__}: {message} (traceback: {saved})", err=True)
            sys.exit(EXIT_INTERNAL_ERROR)
        finally:
            _restore_sigterm(previous)

    return wrapper


#: What an error message may echo of a pathological input: characters per line, lines.
MAX_LINE_CHARS = 1000
MAX_LINES = 60


def _capped(message: str) -> str:
    """``message`` with each line and the line count bounded (a 1 MB line in an input
    must not come back whole in the error about it)."""
    lines = message.splitlines() or [""]
    shown = [line if len(line) <= MAX_LINE_CHARS else
             f"{line[:MAX_LINE_CHARS]}… ({len(line) - MAX_LINE_CHARS} more characters)" for line in lines[:MAX_LINES]]
    if len(lines) > MAX_LINES:
        shown.append(f"… ({len(lines) - MAX_LINES} more lines)")
    return "\n".join(shown)


def _main_input(kwargs: dict[str, Any]) -> str | None:
    for parameter in _INPUT_PARAMETERS:
        value = kwargs.get(parameter)
        if isinstance(value, (tuple, list)):
            return ", ".join(map(str, value)) if value else None
        if value is not None:
            return str(value)
    return None


def _save_traceback(command: str) -> str:
    """Write the current exception's traceback to a file; returns its path."""
    import os
    import tempfile
    import time
    import traceback

    from dfit_mlir.core.paths import CACHE_DIR_ENV, private_dir, write_private

    text = f"dfit {command} ({' '.join(sys.argv)})\n" + traceback.format_exc()
    try:
        # $TMPDIR/dfit-UID is a predictable name: it must be this user's, mode 0700
        # (a folder or symlink someone else planted is refused), and the file is new.
        chosen = os.environ.get(CACHE_DIR_ENV)
        base = Path(chosen) if chosen else private_dir(Path(tempfile.gettempdir()) / f"dfit-{os.getuid()}")
        folder = private_dir(base / "tracebacks")
        name = f"{command}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{os.urandom(4).hex()}.txt"
        return str(write_private(folder, name, text))
    except OSError:
        handle, name = tempfile.mkstemp(prefix=f"dfit-{command}-", suffix=".txt")  # O_EXCL, 0600, a random name
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        return name


def _route_sigterm() -> Any:
    """SIGINT and SIGTERM raise in the main thread (KeyboardInterrupt, :class:`Interrupted`)
    so that every ``finally`` removes its temporaries, except while an output's temporary
    is being created or swapped into place, which the signal waits for."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None
    wanted = [sig for sig in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(sig) != signal.SIG_IGN]
    return {sig: signal.signal(sig, atomic.on_signal) for sig in wanted}


def _restore_sigterm(previous: Any) -> None:
    import signal

    for sig, handler in (previous or {}).items():
        signal.signal(sig, handler)


def force_option(command: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--force", is_flag=True,
                        help="Replace an existing output dfit does not recognise as its own (never an input).")(command)


class FiniteFloat(click.ParamType):
    """A finite float in [low, high] (``nan``, ``inf`` and out-of-range values refused)."""

    name = "float"

    def __init__(self, low: float, high: float, *, low_open: bool = False):
        self.low, self.high, self.low_open = low, high, low_open

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        import math

        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(number) or number > self.high or number < self.low or (
                self.low_open and number == self.low):
            low = f"({self.low}" if self.low_open else f"[{self.low}"
            self.fail(f"{value} is not in {low}, {self.high}]", param, ctx)
        return number


#: Bounds of the numeric options of `dfit run` (beyond them a run would not end, or
#: would keep nothing).
MAX_REPEAT = 1_000_000
MIN_SAMPLE = 1e-6
MAX_TENSOR_VALUES = 1 << 20
#: Bounds of the integer options that end up in the store's int64 columns or an engine's
#: row counts (beyond them a later command would fail, not this one); --rank and
#: --clock-offset-ns: dfit_mlir.fleet.placement's.
MAX_INT64 = (1 << 63) - 1
MAX_ROWS = 1_000_000_000

EPILOG = "\b\nExit status (every command):\n" + "\n".join(
    f"  {status:<4} {meaning}" for status, meaning in EXIT_TABLE)


class DfitGroup(click.Group):
    """Usage errors as one ``dfit <command>: ...`` line (exit 2), like every other error,
    with the pointer to ``--help`` after it; Ctrl-C while click parses → 130."""

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            return super().main(*args, standalone_mode=False, **kwargs)
        except click.exceptions.NoArgsIsHelpError as error:
            error.show()
            sys.exit(error.exit_code)
        except click.UsageError as error:
            command = error.ctx.command_path if error.ctx is not None else "dfit"
            click.echo(f"{command}: {' '.join(error.format_message().split())}", err=True)
            click.echo(f"  (see `{command} --help`)", err=True)
            sys.exit(error.exit_code)
        except click.ClickException as error:
            click.echo(f"dfit: {error.format_message()}", err=True)
            sys.exit(error.exit_code)
        except click.exceptions.Abort:
            click.echo("dfit: interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except click.exceptions.Exit as error:
            sys.exit(error.exit_code)


def require_file(path: Path, what: str) -> None:
    """An input that must be a regular, readable, non-empty file."""
    from dfit_mlir.core.errors import InvalidInputError

    if not path.exists():
        raise InvalidInputError(f"{path}: no such file")
    if path.is_dir():
        raise InvalidInputError(f"{path}: is a directory, not a {what} file")
    if path.stat().st_size == 0:
        raise InvalidInputError(f"{path}: the {what} file is empty")
