"""The champion: the draft a server serves, as its source names it and once it has loaded.

A :class:`Champion` holds its version label (it changes whenever the champion does),
where it came from (``static``: a drafter spec in the config; ``local``: a pointer file to a
draft package; ``registry``: the MLflow champion alias of a hardware target), its draft
plan (:class:`~serving.engine.drafters.plan.DraftPlan`, from the package's ``draft.json``
or the config), its package folder if it has one, and what it accepted when it was
evaluated. :meth:`Champion.loaded` gives the same champion with its drafter built once;
every request then gets a fork of it (:meth:`Champion.new_drafter`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from serving.engine.drafters.factory import build_drafter
from serving.engine.drafters.package import read_manifest
from serving.engine.drafters.plan import DraftPlan
from serving.engine.policy import make_policy

if TYPE_CHECKING:
    from serving.engine.drafters.base import Drafter
    from serving.target import LoadedTarget


@dataclass(frozen=True)
class Champion:
    version: str  # changes whenever the champion does
    source: str  # "static", "local", "registry"
    plan: DraftPlan
    package: Path | None = None  # its draft package folder (draft.json inside), if any
    # What it accepted when evaluated on this target, on live traffic where it was judged
    # on some (registry.acceptance): the yardstick of the server's acceptance alert.
    evaluated_acceptance: float | None = None
    prototype: Drafter | None = None  # its drafter, once loaded (None: plain decoding)
    loaded_at: float | None = None  # when it loaded (None: not yet)

    @classmethod
    def of_package(
        cls,
        package: Path,
        *,
        version: str,
        source: str,
        evaluated_acceptance: float | None = None,
    ) -> Champion:
        """The champion a draft package names (its manifest checked, no weights read)."""
        plan = read_manifest(package).plan(package)
        return cls(version, source, plan, package, evaluated_acceptance)

    def loaded(self, target: LoadedTarget) -> Champion:
        """This champion with its drafter built against ``target`` (weights loaded,
        compatibility checked)."""
        make_policy(self.plan.policy, self.plan.k)  # a bad policy or k fails here
        prototype = build_drafter(self.plan.drafter, target)
        return replace(self, prototype=prototype, loaded_at=time.time())

    def new_drafter(self) -> Drafter | None:
        """A drafter of its own for one request (requests in flight keep theirs)."""
        return None if self.prototype is None else self.prototype.fork()

    def describe(self) -> dict[str, object]:
        return {
            "version": self.version,
            "source": self.source,
            "drafter": str(self.plan.drafter),
            "package": None if self.package is None else str(self.package),
            "policy": self.plan.policy,
            "k": self.plan.k,
            "loaded_at": self.loaded_at,
        }
