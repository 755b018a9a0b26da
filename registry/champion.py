"""The one call serving makes into the registry: which draft package serves on a hardware
target, downloaded into a local cache."""

from __future__ import annotations

from pathlib import Path

from registry.acceptance import evaluated_acceptance
from registry.client import Registry, RegistryError
from serving.engine.drafters.champion import Champion
from serving.records.schema import LIVE_WORKLOAD


class ChampionLookup:
    """Keeps one registry connection for repeated polls."""

    def __init__(self, hardware: str, *, cache: Path, registry: Registry | None = None) -> None:
        self.hardware = hardware
        self.cache = Path(cache)
        self.registry = registry or Registry()

    def find(self) -> Champion | None:
        """The champion, downloaded, or None while the target has none. Its evaluated
        acceptance is what it accepted when evaluated on this target, on live traffic
        where it was judged on some (:mod:`registry.acceptance`)."""
        draft = self.registry.champion(self.hardware)
        if draft is None:
            return None
        evaluated = evaluated_acceptance(draft.tags, self.hardware, LIVE_WORKLOAD)
        return Champion.of_package(
            self.registry.download(draft, self.cache),
            version=draft.label,
            source="registry",
            evaluated_acceptance=evaluated[0] if evaluated else None,
        )

    def current(self) -> Champion:
        """The champion, downloaded; :class:`RegistryError` while the target has none."""
        champion = self.find()
        if champion is None:
            raise RegistryError(
                f"the registry at {self.registry.shown_uri!r} has no champion for hardware "
                f"target {self.hardware!r}; promote a draft first (or serve with --drafter)"
            )
        return champion
