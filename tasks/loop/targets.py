"""The target model the loop's steps run on: loaded once per process and hardware target."""

from __future__ import annotations

from serving.errors import BadInputError
from serving.hardware import HardwareTarget, engine_target
from serving.loader import load_target
from serving.target import LoadedTarget
from tasks.settings import loop_settings

# The targets this process loaded, by hardware target's name and source.
_LOADED: dict[tuple[str, str], LoadedTarget] = {}


def engine_of(hardware: HardwareTarget) -> HardwareTarget:
    """``hardware`` where the specops engine serves it, with its measured verify curve;
    else the :class:`BadInputError` :func:`serving.hardware.engine_target` gives for it."""
    if hardware.backend == "transformers" and hardware.verify_curve:
        return hardware
    engine_target(hardware.name)  # raises, saying which of the two it lacks
    raise BadInputError(f"hardware target {hardware.name!r} is not served by the specops engine")


def target_for(hardware: HardwareTarget, source: str | None = None) -> LoadedTarget:
    """The target model ``source`` (default: ``SPECOPS_TARGET``, :mod:`tasks.settings`)
    loaded for ``hardware``, once per process."""
    source = source or loop_settings().target
    key = (hardware.name, source)
    loaded = _LOADED.get(key)
    if loaded is None or loaded.hardware != hardware:
        loaded = _LOADED[key] = load_target(source, hardware)
    return loaded
