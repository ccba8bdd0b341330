"""IREE's HAL drivers as ``dfit run`` sees them: one table of what each driver can record
(:data:`CAPABILITIES`: profiling families per mode, the family that carries per-dispatch
records, the clock its times are in), which device a run may use (:func:`choose_device`:
a driver the runtime has, a device present, a driver the vmfb was compiled for), and
:func:`ask`, which asks a driver which families it records.

The join and the ledger never branch on the driver: what differs between drivers is
only which families a run asks for and which clock the decoded times come from
(``hal_profile`` puts every time on the host's clock).
"""

from __future__ import annotations

import fnmatch
import functools
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from dfit_mlir.core import atomic, children
from dfit_mlir.core.errors import InvalidInputError
from dfit_mlir.core.toolchain import runtime_tool

#: Time domains, as ``iree-profile export`` names them.
HOST_CLOCK = "iree_host_time_ns"
DEVICE_CLOCK = "device_tick"
#: Every family a driver can be asked about (``--device_profiling_mode``).
FAMILIES = ("queue-events", "device-queue-events", "host-execution", "dispatch-events", "memory-events",
            "command-region-events")


@dataclass(frozen=True)
class DriverCapabilities:
    """What one HAL driver records under ``dfit run``."""

    driver: str
    #: Families a ``full`` run asks for.
    full: tuple[str, ...]
    #: Families a ``lite`` run's queue pass asks for (the dispatch family places the
    #: queue records in their invocations).
    lite: tuple[str, ...]
    #: The family whose records are one per dispatch (what the structural join reads).
    dispatch_family: str
    #: The clock of those records: :data:`HOST_CLOCK` (CLOCK_MONOTONIC, as
    #: ``time.perf_counter_ns``) or :data:`DEVICE_CLOCK` (ticks, fitted to the host
    #: clock with the profile's clock-correlation samples).
    dispatch_clock: str
    #: Families the driver answers UNIMPLEMENTED.
    unimplemented: tuple[str, ...]
    #: ``measured``: checked against the driver (tests/test_gpu_vulkan.py asks it);
    #: ``asked``: no such device here, so a run asks the driver (:func:`ask`) and keeps
    #: the families it grants.
    source: str


_LOCAL_FULL = ("host-execution", "queue-events", "memory-events")
_GPU_FULL = ("dispatch-events", "device-queue-events", "queue-events", "memory-events")
#: IREE 3.13, measured on this machine (DESIGN.md "Runtime", RUNTIME-NOTES.md).
CAPABILITIES = {row.driver: row for row in (
    DriverCapabilities("local-task", _LOCAL_FULL, ("host-execution", "queue-events"), "host-execution", HOST_CLOCK,
                       ("dispatch-events", "device-queue-events"), "measured"),
    DriverCapabilities("local-sync", _LOCAL_FULL, ("host-execution", "queue-events"), "host-execution", HOST_CLOCK,
                       ("dispatch-events", "device-queue-events"), "measured"),
    # Lavapipe (Mesa's software Vulkan) gives device timestamps per dispatch; host-side
    # dispatch spans and command regions are not implemented by IREE's Vulkan driver.
    DriverCapabilities("vulkan", _GPU_FULL, ("dispatch-events", "queue-events"), "dispatch-events", DEVICE_CLOCK,
                       ("host-execution", "command-region-events"), "measured"),
    DriverCapabilities("cuda", _GPU_FULL, ("dispatch-events", "queue-events"), "dispatch-events", DEVICE_CLOCK,
                       (), "asked"),
    DriverCapabilities("hip", _GPU_FULL, ("dispatch-events", "queue-events"), "dispatch-events", DEVICE_CLOCK,
                       (), "asked"),
)}


def capabilities(driver: str) -> DriverCapabilities:
    """The row of ``driver`` (a driver name or a device URI such as ``vulkan://0``)."""
    name = driver_name(driver)
    if name not in CAPABILITIES:
        raise InvalidInputError(f"--driver {driver}: dfit knows no profiling capabilities of driver {name!r} "
                                f"(it knows {', '.join(CAPABILITIES)})")
    return CAPABILITIES[name]


#: ``--iree-hal-target-device`` of a driver whose name is not its target device's.
TARGET_DEVICE = {"local-task": "local", "local-sync": "local"}


def driver_name(device: str) -> str:
    """``vulkan`` of ``vulkan://0``; a plain driver name is itself."""
    return device.split("://", 1)[0]


@dataclass(frozen=True)
class Device:
    """The device a run uses: the URI given, the one the runtime is given (IREE 3.13's
    Vulkan driver takes a device path, not an ordinal: ``vulkan://0`` becomes
    ``vulkan://GPU-<uuid>``), its driver, the device's name as the driver reports it,
    and the HAL device ids the vmfb was compiled for."""

    uri: str
    runtime_uri: str
    driver: str
    name: str
    targets: tuple[str, ...]

    def summary(self) -> dict[str, object]:
        return {"uri": self.uri, "runtime_uri": self.runtime_uri, "driver": self.driver, "name": self.name,
                "compiled_for": list(self.targets)}


def vmfb_targets(vmfb: Path) -> tuple[str, ...]:
    """The HAL device ids (glob patterns: ``local*``, ``vulkan``, ``cuda``, ``hip``) the
    vmfb's executables were compiled for, from its rodata (``hal.device.id`` is followed
    by the id); empty for a module with no device work."""
    import re

    dump = subprocess.run([runtime_tool("iree-dump-module"), str(vmfb)], capture_output=True, text=True)
    if dump.returncode != 0:
        raise InvalidInputError(f"{vmfb}: iree-dump-module failed: {dump.stderr.strip()}")
    strings = re.findall(r"^\s*\.rodata\[\s*\d+\]\s+embedded\s+\d+ bytes `([^`]*)`", dump.stdout, re.MULTILINE)
    return tuple(dict.fromkeys(strings[i + 1] for i, text in enumerate(strings[:-1]) if text == "hal.device.id"))


def choose_device(vmfb: Path, device: str) -> Device:
    """Check that ``device`` (a driver or device URI) can run ``vmfb`` here: the runtime
    has the driver, the driver finds the device, and the vmfb was compiled for it. Each
    failure is one line naming both sides (exit 2). The CPU drivers need no question to
    the runtime (:data:`LOCAL_DEVICES`); the others are asked once per process
    (:func:`runtime_drivers`, :func:`driver_devices`)."""
    driver = driver_name(device)
    available = runtime_drivers() if driver not in LOCAL_DEVICES else (driver,)
    if driver not in available:
        raise InvalidInputError(f"--driver {device}: the IREE runtime has no driver {driver!r} "
                                f"(it has {', '.join(available)})")
    targets = vmfb_targets(vmfb)
    if targets and not any(fnmatch.fnmatchcase(driver, target) for target in targets):
        fitting = [name for name in (*LOCAL_DEVICES, *runtime_drivers())
                   if any(fnmatch.fnmatchcase(name, t) for t in targets)]
        raise InvalidInputError(f"{vmfb} was compiled for HAL device {' and '.join(targets)}, not for --driver "
                                f"{device}: run it with --driver {' or '.join(dict.fromkeys(fitting)) or '?'}, or "
                                f"recompile with --iree-hal-target-device={TARGET_DEVICE.get(driver, driver)}")
    try:
        found = LOCAL_DEVICES.get(driver) or driver_devices(driver)
    except Exception as error:  # the driver's library is missing: no such device here
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        reason = reason.split("; ", 1)[-1].rstrip(": ")
        raise InvalidInputError(f"--driver {device}: no {driver} device here ({reason}); "
                                f"{vmfb} needs one") from None
    chosen = _pick(found, device)
    if chosen is None:
        listed = ", ".join(f"{driver}://{d['path'] or i}" for i, d in enumerate(found)) or "none"
        raise InvalidInputError(f"--driver {device}: the {driver} driver has no such device (it has {listed}); "
                                f"{vmfb} needs one")
    path = str(chosen.get("path") or "")
    runtime_uri = f"{driver}://{path}" if "://" in device and path else device
    return Device(device, runtime_uri, driver, str(chosen.get("name") or ""), targets)


#: The CPU drivers' one device, as ``query_available_devices`` lists it: every IREE
#: runtime wheel has both drivers, and asking costs the import of the runtime bindings.
LOCAL_DEVICES: dict[str, tuple[dict[str, object], ...]] = {
    name: ({"device_id": 0, "path": "", "name": "default"},) for name in ("local-task", "local-sync")}


def _runtime_module() -> Any:
    """The IREE runtime's native module. ``iree.runtime`` imports ``ml_dtypes`` (about
    1.5 s on this machine) for its array interop, which a device query does not use; the
    native module alone is what ``iree.runtime._binding`` re-exports (through the same
    ``iree._runtime`` trampoline, so ``IREE_PY_RUNTIME`` still picks the variant)."""
    try:
        from iree._runtime.libs import _runtime  # type: ignore[import-not-found]
    except ImportError:  # another packaging of the runtime: the public module
        import iree.runtime as _runtime
    return _runtime


@functools.lru_cache(maxsize=None)
def runtime_drivers() -> tuple[str, ...]:
    """The HAL drivers the IREE runtime has (asked once per process)."""
    return tuple(_runtime_module().HalDriver.query())


@functools.lru_cache(maxsize=None)
def driver_devices(driver: str) -> tuple[dict[str, object], ...]:
    """The devices ``driver`` finds here (asked once per process and driver; an error if
    the driver cannot be created)."""
    return tuple(_runtime_module().get_cached_hal_driver(driver).query_available_devices())


def _pick(found: Sequence[dict[str, object]], device: str) -> dict[str, object] | None:
    """The device ``device`` names among ``found``: the first for a bare driver, by
    ordinal (``vulkan://0``) or by path (``cuda://GPU-…``) otherwise."""
    if not found:
        return None
    _, _, rest = device.partition("://")
    if not rest:
        return found[0]
    if rest.isdigit():
        return found[int(rest)] if int(rest) < len(found) else None
    return next((d for d in found if d.get("path") == rest), None)


def ask(vmfb: Path, device: str, function: str, arity: int,
        families: Sequence[str] = FAMILIES) -> dict[str, bool] | None:
    """Ask the driver which of ``families`` it records: ``iree-run-module`` begins
    profiling after it has parsed the inputs and before it calls ``function``, so calling
    a function of ``arity`` > 0 arguments with none answers UNIMPLEMENTED (not recorded)
    or the argument-count error (recorded) without running the module (about 0.1 s per
    family). ``None`` for a function without arguments: it would run."""
    if arity == 0:
        return None
    answers = {}
    with atomic.scratch_directory("dfit-ask-") as scratch:
        for family in families:
            run = subprocess.run(
                [runtime_tool("iree-run-module"), f"--module={vmfb}", f"--device={device}", f"--function={function}",
                 f"--device_profiling_mode={family}", f"--device_profiling_output={scratch}/ask.ireeprof"],
                capture_output=True, text=True, preexec_fn=children.tied_to_dfit())
            if "input list and function mismatch" not in run.stderr and "beginning device profiling" not in run.stderr:
                reason = (run.stderr.strip().splitlines() or [f"exit {run.returncode}"])[-1]
                raise InvalidInputError(f"asking {device} whether it records {family} failed: {reason}")
            answers[family] = "beginning device profiling" not in run.stderr
    return answers


def run_families(caps: DriverCapabilities, mode: str, granted: dict[str, bool] | None = None) -> tuple[str, ...]:
    """The families a ``mode`` run asks for: the table's, less what an ``asked`` driver
    refused (``granted``, from :func:`ask`)."""
    wanted = caps.full if mode == "full" else caps.lite
    if granted is None:
        return wanted
    kept = tuple(family for family in wanted if granted.get(family, False))
    if caps.dispatch_family not in kept:
        raise InvalidInputError(f"driver {caps.driver} does not record {caps.dispatch_family} (asked of the driver: "
                                f"{', '.join(f for f, ok in granted.items() if ok) or 'nothing'}), so no dispatch "
                                f"can be joined; run with --mode ids")
    return kept
