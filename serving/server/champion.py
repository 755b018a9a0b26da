"""Which draft serves, and swapping to a newly promoted one without downtime.

A :class:`ChampionSource` says which draft is the champion now (cheaply: it is polled). A
:class:`LoadedDraft` is that draft loaded once, handing every request a drafter of its own
(:meth:`serving.drafters.base.Drafter.fork`), so requests in flight keep the draft they
started with while new requests get the new one. :class:`ChampionWatcher` polls, loads a
new champion off the request path, and swaps one reference: nothing is dropped, and a
champion that fails to load leaves the current one serving (the error is reported).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from serving.drafters.base import Drafter
from serving.drafters.factory import DrafterSpec, build_drafter, parse_drafter_spec
from serving.drafters.package import read_manifest
from serving.errors import ModelSourceError
from serving.policy import DraftLengthPolicy, make_policy

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ChampionRef:
    """What the source names as champion: a drafter spec, or a draft package folder."""

    version: str  # changes whenever the champion does
    source: str  # "static", "local", "registry"
    drafter: str | None = None  # static: a drafter spec
    package: Path | None = None  # a draft package folder (draft.json inside)
    policy: str = "cost"
    k: int = 10
    evaluated_acceptance: float | None = None  # registry: what its evaluation accepted


class ChampionSource(ABC):
    name = "source"

    @abstractmethod
    def current(self) -> ChampionRef:
        """The champion now. Raises :class:`ModelSourceError` when it cannot be read."""


class StaticChampion(ChampionSource):
    """A fixed drafter spec from the config (no promotion: never changes)."""

    name = "static"

    def __init__(self, drafter: str, *, policy: str = "cost", k: int = 10) -> None:
        parse_drafter_spec(drafter)
        self._ref = ChampionRef(
            version=f"static:{drafter}", source="static", drafter=drafter, policy=policy, k=k
        )

    def current(self) -> ChampionRef:
        return self._ref


class LocalChampion(ChampionSource):
    """A pointer file that promotion rewrites atomically:
    ``{"package": "<draft package folder>", "version": "<label>"}`` (a relative package
    path is taken from the pointer's folder)."""

    name = "local"

    def __init__(self, pointer: str | Path) -> None:
        self.pointer = Path(pointer)

    def current(self) -> ChampionRef:
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
        manifest = read_manifest(package)
        version = str(raw.get("version") or package.resolve())
        return ChampionRef(
            version=version,
            source="local",
            package=package,
            policy=manifest.policy,
            k=manifest.k,
        )


class RegistryChampion(ChampionSource):
    """The MLflow champion alias of a hardware target (through ``registry/``, the only
    code that talks to MLflow); its package is downloaded once into ``cache``."""

    name = "registry"
    NO_CHAMPION = "none (no champion yet)"

    def __init__(self, hardware: str, *, cache: Path, registry=None, missing: str = "fail") -> None:
        """``missing="plain"``: while the target has no champion, serve plain decoding
        (version :attr:`NO_CHAMPION`) instead of failing."""
        from registry.champion import ChampionLookup

        self._lookup = ChampionLookup(hardware, cache=cache, registry=registry)
        self._missing = missing

    def current(self) -> ChampionRef:
        champion = self._lookup.find() if self._missing == "plain" else self._lookup.current()
        if champion is None:
            return ChampionRef(version=self.NO_CHAMPION, source="registry", drafter="none", k=1)
        manifest = read_manifest(champion.package)
        return ChampionRef(
            version=champion.label,
            source="registry",
            package=champion.package,
            policy=manifest.policy,
            k=manifest.k,
            evaluated_acceptance=champion.evaluated_acceptance,
        )


@dataclass
class LoadedDraft:
    """A champion loaded once; every request gets its own drafter and policy from it."""

    ref: ChampionRef
    spec: DrafterSpec
    prototype: Drafter | None  # None: plain decoding
    verify_curve: tuple[float, ...]
    loaded_at: float = field(default_factory=time.time)

    def new_drafter(self) -> Drafter | None:
        return None if self.prototype is None else self.prototype.fork()

    def new_policy(self, *, policy: str | None = None, k: int | None = None) -> DraftLengthPolicy:
        return make_policy(
            policy or self.ref.policy, k or self.ref.k, verify_curve=self.verify_curve
        )

    def describe(self) -> dict[str, object]:
        return {
            "version": self.ref.version,
            "source": self.ref.source,
            "drafter": str(self.spec),
            "package": None if self.ref.package is None else str(self.ref.package),
            "policy": self.ref.policy,
            "k": self.ref.k,
            "loaded_at": self.loaded_at,
        }


def load_draft(
    ref: ChampionRef, target, tokenizer, *, verify_curve: tuple[float, ...]
) -> LoadedDraft:
    """Build the champion's drafter once (weights loaded, compatibility checked)."""
    if ref.package is not None:
        spec = read_manifest(ref.package).spec(ref.package)
    elif ref.drafter is not None:
        spec = parse_drafter_spec(ref.drafter)
    else:
        raise ModelSourceError(f"champion {ref.version!r} names neither a package nor a drafter")
    make_policy(ref.policy, ref.k)  # a bad policy or k fails here, not in a request
    prototype = build_drafter(spec, target, tokenizer)
    return LoadedDraft(ref=ref, spec=spec, prototype=prototype, verify_curve=verify_curve)


class ChampionWatcher:
    """Holds the serving draft; :meth:`poll` swaps to a new champion once it has loaded."""

    def __init__(
        self, source: ChampionSource, loader: Callable[[ChampionRef], LoadedDraft]
    ) -> None:
        self.source = source
        self._loader = loader
        self._lock = threading.Lock()  # one poll at a time
        self.current: LoadedDraft = loader(source.current())  # fails loudly at start-up
        self.swaps = 0
        self.last_error: str | None = None
        self.last_poll: float = time.time()

    def poll(self) -> bool:
        """Check the source; load and swap to a new champion. True if it swapped."""
        with self._lock:
            self.last_poll = time.time()
            try:
                ref = self.source.current()
                if ref.version == self.current.ref.version:
                    self.last_error = None
                    return False
                log.info("new champion %s (was %s): loading", ref.version, self.current.ref)
                loaded = self._loader(ref)
            except Exception as error:  # any failure (MLflow, disk, a bad package)
                # Keep serving the current champion; report why the new one did not load.
                self.last_error = str(error)
                log.error("champion poll failed, keeping %s: %s", self.current.ref.version, error)
                return False
            self.current = loaded  # one reference swap: requests in flight keep their drafter
            self.swaps += 1
            self.last_error = None
            log.info("serving champion %s", loaded.ref.version)
            return True
