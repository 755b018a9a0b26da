"""What the loop's flows hand each other and return: typed, and written as JSON where they
go (Prefect's flow-run parameters and results, the main job's ``loop.json``).

``model_dump(mode="json")`` gives the keys in the order declared here, which is the order
the flows have always written them in.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SerializationInfo, model_serializer

from tasks.data.collect import CollectSummary
from tasks.data.curate import CurateSummary
from tasks.data.retention import RetentionReport
from tasks.evaluate.gates import GateResult
from tasks.evaluate.report import Group
from tasks.loop.learned import Trained
from tasks.loop.predictor_step import PredictorOutcome
from tasks.loop.shadow import Shadow
from tasks.loop.triggers import ChampionTrigger
from tasks.loop.watch import Watch


class _Result(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Decision(_Result):
    """What one evaluate-and-promote decided on a hardware target (the flows' result).

    ``results``, ``by_workload`` and ``by_source`` are the evaluation's measured numbers;
    the gates judged the report :func:`~tasks.evaluate.gates.judged_report` gives (the
    same, unless the gates' config prices speed by a fixed profile)."""

    hardware: str
    labels: dict[str, str] = Field(default_factory=dict)  # contender name -> registry label
    champion: str | None
    promoted: str | None  # the new champion's label, or None (champion kept)
    # Export on promotion: backend -> what happened (exported, or why the backend can't
    # load this draft). Each other target then evaluates it (`specops targets evaluate`).
    exports: dict[str, str] = Field(default_factory=dict)
    gates: dict[str, GateResult]  # challenger label -> gate result
    results: Group
    by_workload: dict[str, Group]
    by_source: dict[str, Group] = Field(default_factory=dict)
    # The evaluation's phases in wall seconds (profile, pregate, timed) and the pre-gate's
    # predicted modelled speedups, by contender label.
    phase_s: dict[str, float] = Field(default_factory=dict)
    predicted: dict[str, float | None] = Field(default_factory=dict)


class DraftRef(_Result):
    """A registered draft version: as ``evaluate-and-promote`` takes its challengers (a
    deployment's parameters, or ``specops loop run --challenger``: family and version), and
    as ``retrain`` reports the versions it registered (with their registry label). The
    draft's plan is in its package (``DraftManifest``), which the evaluation downloads."""

    family: str
    version: str
    label: str | None = None  # the registry label, once registered (left out when unset)

    @model_serializer(mode="wrap")
    def _without_unset_label(self, handler: Any, info: SerializationInfo) -> dict[str, Any]:
        data = handler(self)
        if self.label is None:
            data.pop("label", None)
        return data


class Replayed(CollectSummary):
    """Traffic replayed through a champion, in detailed mode."""

    champion: str  # the label of the champion that served it


class Bootstrapped(_Result):
    """``bootstrap``: the target's first champion, or the one it already had."""

    champion: str | None
    bootstrapped: Decision | None  # None: the target had a champion, nothing was done


class Retrained(_Result):
    """``retrain``: the challengers it trained and registered, and what was decided."""

    validation: CurateSummary
    slot: str
    challengers: list[DraftRef]
    trained: list[Trained]
    decision: Decision
    predictor: PredictorOutcome
    # The main job's: a retrain it ran because no drift alarm did (None elsewhere, and
    # then left out of the JSON).
    scheduled: bool | None = None

    @model_serializer(mode="wrap")
    def _without_unset_schedule(self, handler: Any, info: SerializationInfo) -> dict[str, Any]:
        data = handler(self)
        if self.scheduled is None:
            data.pop("scheduled", None)
        return data


class DeploymentRun(_Result):
    """A retrain handed to its deployment (it runs on that deployment's work pool)."""

    deployment: str
    flow_run: str
    name: str
    state: str


class Collected(_Result):
    """``collect``: what was replayed, removed, validated and versioned, and whether it
    retrained."""

    replayed: Replayed | None
    retention: RetentionReport
    validation: CurateSummary
    data_version: str | None
    trigger: ChampionTrigger
    retrained: Retrained | DeploymentRun | None
    watch: Watch | None = None  # the watched champion (tasks/loop/watch.py), judged first
    shadow: Shadow | None = None  # shadow scores on the newest traffic (tasks/loop/shadow.py)


class Drill(_Result):
    """The main job's drill (:func:`flows.demo.damaged_champion_drill`): a draft with
    weights is evaluated and promoted by hand, its weights are scrambled on the serving
    machine's disk, and the next ``collect``'s watch must restore the champion it
    displaced."""

    skipped: str | None = None  # why the drill did not run (then nothing else is set)
    draft: str | None = None  # the damaged champion's label
    displaced: str | None = None  # the champion it displaced: what the watch should restore
    evaluated: Decision | None = None  # the draft's evaluation before its promotion
    scrambled: list[str] = Field(default_factory=list)  # the files damaged
    collected: Collected | None = None  # the collect after the damage (its watch)

    @property
    def restored(self) -> bool:
        """The watch rolled the damaged draft back to the champion it displaced."""
        watch = None if self.collected is None else self.collected.watch
        restored = None if watch is None else watch.rolled_back_to
        return restored is not None and restored == self.displaced


class DemoResult(_Result):
    """The main job's flow (:mod:`flows.demo`)."""

    bootstrap: Decision | None
    phases: list[Collected] = Field(min_length=2, max_length=2)  # before, after the drift
    daily_retrain: Retrained | None
    retrained: Retrained
    drill: Drill | None = None  # the damaged champion and its rollback (None: not run)
