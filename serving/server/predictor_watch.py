"""The served cascade's acceptance predictor, swapped without downtime.

A :class:`PredictorSource` names the predictor to serve (cheaply: it is polled): a local
folder (its version is the file's modification time) or the registry's
``specops-predictor`` champion for this hardware target. :class:`PredictorWatcher` loads a
new one off the request path and swaps one reference; a predictor that fails to load
(damaged, made for another feature set or target) leaves the previous one serving - or,
when none ever loaded, the cascade's running per-stage acceptance - and the error is
reported in ``last_error``.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING

from serving.hardware import HardwareTarget

if TYPE_CHECKING:  # the registry is imported only where the predictor comes from it
    from registry.client import Registry
from serving.engine.predictor import PREDICTOR_FILE, AcceptancePredictor, load_predictor
from serving.errors import ModelSourceError

log = logging.getLogger(__name__)


class PredictorSource(ABC):
    @abstractmethod
    def current(self) -> tuple[str, Path] | None:
        """``(version, folder)`` of the predictor to serve, or None for none."""


class LocalPredictor(PredictorSource):
    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)

    def current(self) -> tuple[str, Path] | None:
        meta = self.folder / PREDICTOR_FILE
        if not meta.is_file():
            raise ModelSourceError(f"no predictor at {str(self.folder)!r} (no {PREDICTOR_FILE})")
        return f"local:{meta.stat().st_mtime_ns}", self.folder


class RegistryPredictor(PredictorSource):
    """The ``specops-predictor`` version holding ``champion-<hardware>``."""

    def __init__(
        self, hardware: HardwareTarget, cache: Path, registry: Registry | None = None
    ) -> None:
        from registry import predictor  # the registry layer (MLflow), only when asked for

        if registry is None:
            from registry.client import Registry

            registry = Registry()
        self._predictor = predictor
        self._registry = registry
        self.hardware = hardware
        self.cache = cache

    def current(self) -> tuple[str, Path] | None:
        champion = self._predictor.champion_predictor(self._registry, self.hardware.name)
        if champion is None:
            return None
        folder = self._predictor.download_predictor(self._registry, champion, self.cache)
        return f"registry:{champion.version}", Path(folder)


class PredictorWatcher:
    def __init__(self, source: PredictorSource, *, hardware: HardwareTarget) -> None:
        self.source = source
        self.hardware = hardware
        self._lock = threading.Lock()
        self.current: AcceptancePredictor | None = None
        self.version: str | None = None
        self.swaps = 0
        self.last_error: str | None = None
        self.last_poll = time.time()
        self.poll()

    def poll(self) -> bool:
        """Load and swap to a new predictor; True if it swapped."""
        with self._lock:
            self.last_poll = time.time()
            try:
                found = self.source.current()
                if found is None or found[0] == self.version:
                    self.last_error = None
                    return False
                version, folder = found
                loaded = load_predictor(folder, hardware=self.hardware)
            except Exception as error:  # any failure keeps what serves now
                self.last_error = str(error)
                log.error("predictor poll failed, keeping %s: %s", self.version, error)
                return False
            self.current, self.version = loaded, version
            self.swaps += 1
            self.last_error = None
            log.info("serving predictor %s", version)
            return True
