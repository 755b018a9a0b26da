"""The one call serving makes into the registry: which draft package serves on a hardware
target, downloaded into a local cache."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from registry.acceptance import evaluated_acceptance
from registry.client import Registry, RegistryError
from serving.records.schema import LIVE_WORKLOAD


@dataclass(frozen=True)
class ServingChampion:
    label: str  # <registered model>/<version>
    package: Path  # the local copy of its draft package
    # What it accepted when evaluated on this target, on live traffic where it was judged on
    # some (registry.acceptance): the yardstick of the server's acceptance alert.
    evaluated_acceptance: float | None = None


class ChampionLookup:
    """Keeps one registry connection for repeated polls."""

    def __init__(self, hardware: str, *, cache: Path, registry: Registry | None = None) -> None:
        self.hardware = hardware
        self.cache = Path(cache)
        self.registry = registry or Registry()

    def find(self) -> ServingChampion | None:
        """The champion, downloaded, or None while the target has none."""
        draft = self.registry.champion(self.hardware)
        if draft is None:
            return None
        evaluated = evaluated_acceptance(draft.tags, self.hardware, LIVE_WORKLOAD)
        return ServingChampion(
            draft.label,
            self.registry.download(draft, self.cache),
            evaluated_acceptance=evaluated[0] if evaluated else None,
        )

    def current(self) -> ServingChampion:
        """The champion, downloaded; :class:`RegistryError` while the target has none."""
        champion = self.find()
        if champion is None:
            raise RegistryError(
                f"the registry at {self.registry.shown_uri!r} has no champion for hardware "
                f"target {self.hardware!r}; promote a draft first (or serve with --drafter)"
            )
        return champion
