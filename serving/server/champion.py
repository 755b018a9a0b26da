"""Which draft serves, and swapping to a newly promoted one without downtime.

A :class:`ChampionSource` says which draft is the champion now (cheaply: it is polled), as
a :class:`~serving.engine.drafters.champion.Champion`; loaded once, it hands every request a
drafter of its own (:meth:`serving.engine.drafters.base.Drafter.fork`), so requests in
flight keep the draft they started with while new requests get the new one.
:class:`ChampionWatcher` polls, loads a new champion off the request path, and swaps one
reference: nothing is dropped, and a champion that fails to load leaves the current one
serving (the error is reported).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING

from serving.engine.drafters.champion import Champion
from serving.engine.drafters.plan import DraftPlan
from serving.errors import ModelSourceError
from serving.hardware import HardwareTarget
from serving.target import LoadedTarget

if TYPE_CHECKING:  # the registry is imported only where the champion comes from it
    from registry.client import Registry

log = logging.getLogger(__name__)


class ChampionSource(ABC):
    name = "source"

    @abstractmethod
    def current(self) -> Champion:
        """The champion now. Raises :class:`ModelSourceError` when it cannot be read."""


class StaticChampion(ChampionSource):
    """A fixed drafter spec from the config (no promotion: never changes)."""

    name = "static"

    def __init__(self, plan: DraftPlan) -> None:
        self._champion = Champion(f"static:{plan.drafter}", "static", plan)

    def current(self) -> Champion:
        return self._champion


class LocalChampion(ChampionSource):
    """A pointer file that promotion rewrites atomically:
    ``{"package": "<draft package folder>", "version": "<label>"}`` (a relative package
    path is taken from the pointer's folder)."""

    name = "local"

    def __init__(self, pointer: str | Path) -> None:
        self.pointer = Path(pointer)

    def current(self) -> Champion:
        try:
            raw = json.loads(self.pointer.read_text())
        except FileNotFoundError:
            raise ModelSourceError(
                f"champion pointer {str(self.pointer)!r} does not exist; write "
                '{"package": "<draft package folder>", "version": "1"} there'
            ) from None
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ModelSourceError(
                f"champion pointer {str(self.pointer)!r} is unreadable: {error}"
            ) from None
        if not isinstance(raw, dict) or not isinstance(raw.get("package"), str):
            raise ModelSourceError(
                f"champion pointer {str(self.pointer)!r} needs a string 'package', got {raw!r}"
            )
        package = Path(raw["package"])
        if not package.is_absolute():
            package = self.pointer.parent / package
        version = str(raw.get("version") or package.resolve())
        return Champion.of_package(package, version=version, source="local")


class RegistryChampion(ChampionSource):
    """The MLflow champion alias of a hardware target (through ``registry/``, the only
    code that talks to MLflow); its package is downloaded once into ``cache``."""

    name = "registry"
    NO_CHAMPION = "none (no champion yet)"

    def __init__(
        self,
        hardware: HardwareTarget,
        *,
        cache: Path,
        registry: Registry | None = None,
        missing: str = "fail",
    ) -> None:
        """``missing="plain"``: while the target has no champion, serve plain decoding
        (version :attr:`NO_CHAMPION`) instead of failing."""
        from registry.champion import ChampionLookup

        self._lookup = ChampionLookup(hardware.name, cache=cache, registry=registry)
        self._missing = missing

    def current(self) -> Champion:
        champion = self._lookup.find() if self._missing == "plain" else self._lookup.current()
        if champion is None:
            return Champion(self.NO_CHAMPION, "registry", DraftPlan(k=1))
        return champion


class ChampionWatcher:
    """Holds the serving draft; :meth:`poll` swaps to a new champion once it has loaded."""

    def __init__(self, source: ChampionSource, target: LoadedTarget) -> None:
        self.source = source
        self._target = target
        self._lock = threading.Lock()  # one poll at a time
        self.current: Champion = source.current().loaded(target)  # fails loudly at start-up
        self.swaps = 0
        self.last_error: str | None = None
        self.last_poll: float = time.time()

    def poll(self) -> bool:
        """Check the source; load and swap to a new champion. True if it swapped."""
        with self._lock:
            self.last_poll = time.time()
            try:
                named = self.source.current()
                if named.version == self.current.version:
                    self.last_error = None
                    return False
                log.info("new champion %s (was %s): loading", named.version, self.current.version)
                loaded = named.loaded(self._target)
            except Exception as error:  # any failure (MLflow, disk, a bad package)
                # Keep serving the current champion; report why the new one did not load.
                self.last_error = str(error)
                log.error("champion poll failed, keeping %s: %s", self.current.version, error)
                return False
            self.current = loaded  # one reference swap: requests in flight keep their drafter
            self.swaps += 1
            self.last_error = None
            log.info("serving champion %s", loaded.version)
            return True
