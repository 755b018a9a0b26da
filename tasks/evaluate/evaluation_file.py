"""An evaluation that ran on another machine, as one JSON file the registry can take in.

A GPU box without the MLOps stack runs :func:`tasks.evaluate.evaluate.evaluate` on drafts
it was given (:mod:`tasks.evaluate.remote`), writes the report with
:func:`write_evaluation_file`, and the file comes back to be logged
(``specops registry log-evaluation FILE``). The file (``format: 1``):

- ``hardware``: the hardware target it ran on (a target of ``configs/hardware.yaml``);
- ``produced_by``: where and when, strings: ``host``, ``device``, ``started`` and
  ``finished`` (ISO 8601) at least, usually the torch and transformers versions too
  (:func:`machine_info`);
- ``prompts``, ``max_new_tokens``: as the report has them;
- ``contenders``: contender name (``champion``, ``challenger-0``, ...) -> the registry
  version it evaluated (``head/3`` or ``specops-draft-head/3``); plain decoding, the
  reference, has no version;
- ``report``: what ``evaluate()`` returned (``results`` and ``by_workload`` per
  contender, ``by_source`` when it replayed traffic, ``per_prompt`` optionally).

Reading is strict, so a corrupt or inconsistent file is refused before anything reaches
the registry, with the bad field named: no unknown keys, no type coercion, every number
finite and >= 0, every contender (and plain decoding) with results over every prompt,
``lossless`` agreeing with ``mismatched_prompts``, and every ``speedup`` equal to its
``tokens_per_s`` over plain decoding's in the same group (to 1e-6, relative).
"""

from __future__ import annotations

import json
import math
import platform
import re
import socket
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from registry.labels import LABEL_PATTERN
from serving.atomic import write_json_atomic
from serving.errors import BadInputError
from serving.hardware import hardware_target
from tasks.evaluate.evaluate import REFERENCE
from tasks.evaluate.report import EvaluationReport, Group

FORMAT = 1
PRODUCED_BY_KEYS = ("host", "device", "started", "finished")
# The per-contender numbers logged to the registry (``lossless`` is added as 0.0 / 1.0).
LOGGED_METRICS = ("acceptance_rate", "mean_accepted_length", "tokens_per_s", "speedup")
SPEEDUP_TOLERANCE = 1e-6  # relative

_STRICT = ConfigDict(extra="forbid", strict=True)


class EvaluationFile(BaseModel):
    model_config = _STRICT

    format: Literal[1]
    hardware: str
    produced_by: dict[str, str]
    prompts: int = Field(ge=1)
    max_new_tokens: int = Field(ge=1)
    contenders: dict[str, str]  # contender name -> registry version
    report: EvaluationReport

    @field_validator("hardware")
    @classmethod
    def _known_target(cls, hardware: str) -> str:
        try:
            hardware_target(hardware)
        except BadInputError as error:
            raise ValueError(str(error)) from None
        return hardware

    @field_validator("produced_by")
    @classmethod
    def _says_where(cls, produced_by: dict[str, str]) -> dict[str, str]:
        missing = [key for key in PRODUCED_BY_KEYS if not produced_by.get(key)]
        if missing:
            raise ValueError(f"missing {missing}; give at least {list(PRODUCED_BY_KEYS)}")
        return produced_by

    @field_validator("contenders")
    @classmethod
    def _named(cls, contenders: dict[str, str]) -> dict[str, str]:
        if not contenders:
            raise ValueError("no contender: name at least one evaluated draft version")
        if REFERENCE in contenders:
            raise ValueError(f"{REFERENCE!r} is the reference (plain decoding), not a draft")
        for name, label in contenders.items():
            if not re.fullmatch(LABEL_PATTERN, label):
                raise ValueError(
                    f"{name}: {label!r} does not name a draft version; write FAMILY/VERSION "
                    "(head/3) or the full label (specops-draft-head/3)"
                )
        return contenders

    @model_validator(mode="after")
    def _consistent(self) -> EvaluationFile:
        report = self.report
        for key in ("hardware", "prompts", "max_new_tokens"):
            if getattr(report, key) != getattr(self, key):
                raise ValueError(
                    f"report.{key}: {getattr(report, key)!r} differs from the file's "
                    f"{key} {getattr(self, key)!r}"
                )
        if set(report.contenders) != set(self.contenders):
            raise ValueError(
                f"report.contenders: {sorted(report.contenders)} are not the file's "
                f"contenders {sorted(self.contenders)}"
            )
        expected = {REFERENCE, *self.contenders}
        if set(report.results) != expected:
            raise ValueError(
                f"report.results: has {sorted(report.results)}, needs exactly {sorted(expected)}"
            )
        for name, result in report.results.items():
            if result.requests != self.prompts:
                raise ValueError(
                    f"report.results.{name}.requests: {result.requests}, but the evaluation "
                    f"had {self.prompts} prompts"
                )
        groups = {"report.results": report.results}
        for field in ("by_workload", "by_source"):
            for key, group in getattr(report, field).items():
                groups[f"report.{field}.{key}"] = group
        for where, group in groups.items():
            _check_speedups(where, group, expected)
        return self

    def metrics_of(self, name: str) -> dict[str, float]:
        """What the registry logs for contender ``name`` (numbers that were measured)."""
        result = self.report.results[name]
        metrics = {k: float(v) for k in LOGGED_METRICS if (v := getattr(result, k)) is not None}
        return {**metrics, "lossless": float(result.lossless)}

    def report_of(self, name: str) -> dict[str, Any]:
        """The report kept with contender ``name``'s evaluation run (no per-prompt rows)."""
        return {
            "contender": name,
            **self.report.model_dump(mode="json", exclude={"per_prompt"}),
        }


def _check_speedups(where: str, group: Group, expected: set[str]) -> None:
    if set(group) != expected:
        raise ValueError(f"{where}: has {sorted(group)}, needs exactly {sorted(expected)}")
    plain = group[REFERENCE].tokens_per_s
    for name, result in group.items():
        tps, speedup = result.tokens_per_s, result.speedup
        wanted = tps / plain if tps and plain else None  # as evaluate() computes it
        if wanted is None or speedup is None:
            consistent = wanted is None and speedup is None
        else:
            consistent = math.isclose(speedup, wanted, rel_tol=SPEEDUP_TOLERANCE, abs_tol=0.0)
        if not consistent:
            raise ValueError(
                f"{where}.{name}.speedup: {speedup!r} is not tokens_per_s {tps!r} / plain "
                f"tokens_per_s {plain!r} = {wanted!r}"
            )


def _message(error: ValidationError) -> str:
    """Each bad field, one after another on one line."""
    parts = []
    for item in error.errors():
        where = ".".join(str(part) for part in item["loc"])
        message = str(item["msg"]).removeprefix("Value error, ")
        parts.append(f"{where}: {message}" if where else message)
    return "; ".join(parts)


def _json_object(path: Path, what: str) -> dict[str, Any]:
    """The JSON object in ``path``; :class:`BadInputError` naming ``what`` it should be."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise BadInputError(f"cannot read {what} {str(path)!r}: {error}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BadInputError(f"{what} {str(path)!r} is not JSON: {error}") from None
    if not isinstance(raw, dict):
        raise BadInputError(f"{what} {str(path)!r} must be a JSON object, not {type(raw).__name__}")
    return raw


def read_evaluation_file(path: str | Path) -> EvaluationFile:
    """Read and validate an evaluation file; :class:`BadInputError` names what is wrong."""
    path = Path(path)
    raw = _json_object(path, "evaluation file")
    if raw.get("format") != FORMAT:
        raise BadInputError(
            f"evaluation file {str(path)!r}: format {raw.get('format')!r} is not {FORMAT}; "
            "write it with this version of specops (tasks.evaluate.evaluation_file)"
        )
    try:
        return EvaluationFile.model_validate(raw)
    except ValidationError as error:
        raise BadInputError(f"evaluation file {str(path)!r}: {_message(error)}") from None


def write_evaluation_file(
    path: str | Path, evaluation: EvaluationFile | dict[str, Any]
) -> EvaluationFile:
    """Write an evaluation file atomically, after the same checks the reader makes: a file
    that would be refused is never written. ``evaluation`` is the file's content; build it
    with :func:`evaluation_of` from what ``evaluate()`` returned."""
    if not isinstance(evaluation, EvaluationFile):
        try:
            evaluation = EvaluationFile.model_validate(evaluation)
        except ValidationError as error:
            raise BadInputError(f"cannot write evaluation file: {_message(error)}") from None
    write_json_atomic(path, evaluation.model_dump(mode="json"))
    return evaluation


def evaluation_of(
    report: dict[str, Any], *, contenders: dict[str, str], produced_by: dict[str, str]
) -> dict[str, Any]:
    """The content of an evaluation file for ``report`` (from ``evaluate()``);
    ``contenders`` maps each contender's name to the registry version it evaluated."""
    return {
        "format": FORMAT,
        "hardware": report.get("hardware"),
        "produced_by": produced_by,
        "prompts": report.get("prompts"),
        "max_new_tokens": report.get("max_new_tokens"),
        "contenders": contenders,
        "report": report,
    }


def machine_info(*, device: str, started: str, finished: str) -> dict[str, str]:
    """``produced_by`` for this machine: host, device, the evaluation's start and end (ISO
    8601), and the Python, torch and transformers versions."""
    info = {
        "host": socket.gethostname(),
        "device": device,
        "started": started,
        "finished": finished,
        "python": platform.python_version(),
    }
    for package in ("torch", "transformers"):
        try:
            info[package] = version(package)
        except PackageNotFoundError:
            info[package] = "not installed"
    return info


def read_report(path: str | Path) -> EvaluationReport:
    """An evaluation report from ``path``: an evaluation file's (``format`` set), the one an
    evaluation run keeps in the registry (``evaluation-<target>.json``: one contender's
    view, its ``contender`` named), or a bare report as ``--report`` options write it;
    :class:`BadInputError` names what is wrong."""
    path = Path(path)
    raw = _json_object(path, "evaluation report")
    if "format" in raw:
        return read_evaluation_file(path).report
    raw.pop("contender", None)
    try:
        return EvaluationReport.model_validate(raw)
    except ValidationError as error:
        raise BadInputError(f"evaluation report {str(path)!r}: {_message(error)}") from None
