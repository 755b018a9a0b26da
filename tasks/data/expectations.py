"""Stage 3 of validation: the Great Expectations suites over parsed request records.

Three suites, one per record type: the requests (one row each, with helper columns computed
here where GE has no built-in check, e.g. list lengths), their disagreements and their
drafted tokens (both flattened, one row each, carrying what they are checked against from
their request). Each failing row is mapped back to its request (by index), with the
expectation's label as the reason (``disagreement 1: ...``, ``drafted 3: ...`` for the
nested rows); :mod:`tasks.data.validate` quarantines those requests.

Great Expectations is imported lazily (about 6 s), only when a suite runs.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from serving.engine.drafters.kinds import STAGES
from serving.records.schema import SPLITS, RequestRecord, is_failure
from tasks.data.validation_summary import SuiteReport

if TYPE_CHECKING:
    import pandas as pd

# Timestamps must be later than this (2017-07-14) and at most a day in the future.
MIN_TIMESTAMP = 1.5e9
MAX_CLOCK_SKEW_S = 86_400.0

# Helper columns that carry the row back to its request (and disagreement, or drafted
# token) in GE's results.
ROW = "_row"
DISAGREEMENT = "_disagreement"
DRAFTED = "_drafted"

SUITES = ("requests", "disagreements", "drafted")  # in the order they run and are reported


@dataclass(frozen=True)
class _Expectation:
    """One GE expectation: its class name in ``gx.expectations`` and keyword arguments."""

    kind: str  # e.g. "ExpectColumnValuesToBeBetween"
    kwargs: dict[str, Any]

    @property
    def label(self) -> str:
        return _label(re.sub(r"(?<!^)(?=[A-Z])", "_", self.kind).lower(), self.kwargs)


def _label(expectation_type: str, kwargs: dict[str, Any]) -> str:
    """``expect_column_values_to_be_between(acceptance_rate)``: an expectation in reasons."""
    if "column" in kwargs:
        return f"{expectation_type}({kwargs['column']})"
    return f"{expectation_type}({kwargs['column_A']},{kwargs['column_B']})"


def _between(
    column: str, low: float | None = None, high: float | None = None, **extra: object
) -> _Expectation:
    return _Expectation(
        "ExpectColumnValuesToBeBetween",
        {"column": column, "min_value": low, "max_value": high, **extra},
    )


def _in_set(column: str, values: Iterable[object]) -> _Expectation:
    return _Expectation(
        "ExpectColumnValuesToBeInSet", {"column": column, "value_set": list(values)}
    )


def _equal(column_a: str, column_b: str) -> _Expectation:
    return _Expectation(
        "ExpectColumnPairValuesToBeEqual", {"column_A": column_a, "column_B": column_b}
    )


def _greater(column_a: str, column_b: str, *, or_equal: bool) -> _Expectation:
    """``column_a > column_b`` (``>=`` with ``or_equal``) on every row."""
    return _Expectation(
        "ExpectColumnPairValuesAToBeGreaterThanB",
        {"column_A": column_a, "column_B": column_b, "or_equal": or_equal},
    )


def request_expectations(
    known_hardware: Collection[str], known_workloads: Collection[str], now: float
) -> list[_Expectation]:
    """The requests suite; helper columns are built in ``_request_frame``."""
    return [
        _Expectation("ExpectColumnValuesToNotBeNull", {"column": "id"}),
        _Expectation("ExpectColumnValuesToBeUnique", {"column": "id"}),
        _between("prompt_token_count", 1),  # GE has no check for an empty list column
        _between("output_token_count", 1),
        _equal("from_draft_length", "output_token_count"),
        _between("acceptance_rate", 0, 1),  # null (nothing drafted) is allowed
        _between("mean_accepted_length", 1),  # null allowed
        _between("draft_tokens", 0),
        _between("accepted_tokens", 0),
        _greater("draft_tokens", "accepted_tokens", or_equal=True),
        _greater("accepted_tokens", "from_draft_count", or_equal=True),
        _between("checks", 1),
        # steps hold [proposed, accepted] per check; the totals are sums over them.
        _in_set("steps_well_formed", [True]),
        _equal("steps_count", "checks"),
        _equal("steps_proposed", "draft_tokens"),
        _equal("steps_accepted", "accepted_tokens"),
        _in_set("hardware", sorted(known_hardware)),
        _in_set("workload", sorted(known_workloads)),
        _in_set("split", list(SPLITS)),
        _between("timestamp", MIN_TIMESTAMP, now + MAX_CLOCK_SKEW_S, strict_min=True),
        _between("failure_threshold", 0, 1),
        _equal("is_failure", "is_failure_expected"),
        # Drafted tokens: at most one row per proposed draft (only those the target ruled on).
        _greater("draft_tokens", "drafted_count", or_equal=True),
        # Unverified (relaxed) positions lie inside the output, on tokens that came from drafts.
        _greater("output_token_count", "unverified_max", or_equal=False),
        _in_set("unverified_from_draft", [True]),
        # Disagreements redaction removed (a secret touched them), counted, never negative.
        _between("masked_disagreements", 0),
    ]


def disagreement_expectations() -> list[_Expectation]:
    """The disagreements suite: one row per disagreement, with its request's output length."""
    return [
        _between("position", 0),
        _greater("output_length", "position", or_equal=False),
        _between("draft_index", 0),
        # GE has no "pair not equal" check. Redaction removes a disagreement a secret touched
        # (counted in the request's masked_disagreements) rather than mask both tokens.
        _in_set("draft_token_differs", [True]),
        _between("target_prob_of_draft", 0, 1),
        _between("target_prob_of_target", 0, 1),
        _between("draft_prob_of_draft", 0, 1),
        _between("draft_prob_of_target", 0, 1),
        _between("context_length", 1),
    ]


def drafted_expectations() -> list[_Expectation]:
    """The drafted suite: one row per drafted token, with its request's check count.
    Nullable features (confidence, entropy, match length) are checked where present."""
    return [
        _in_set("stage", STAGES),
        _between("stage_index", 0),
        _between("position", 0),
        _between("step", 0),
        _greater("checks", "step", or_equal=False),
        _between("draft_confidence", 0, 1),
        _between("draft_entropy", 0),
        _between("match_len", 0),
        _between("target_entropy", 0),
        _between("recent_logprob", None, 0),
        _between("length_ratio", 0),
        _in_set("kept_if_accepted", [True]),  # accepted implies kept
    ]


# --- Data frames and running the suites ------------------------------------------------------


def _steps_well_formed(steps: list[list[int]]) -> bool:
    return all(len(step) == 2 and 0 <= step[1] <= step[0] for step in steps)


def _request_frame(records: Sequence[RequestRecord]) -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame(
        [
            {
                ROW: row,
                "id": r.id,
                "prompt_token_count": len(r.prompt_token_ids),
                "output_token_count": len(r.output_token_ids),
                "from_draft_length": len(r.from_draft),
                "from_draft_count": sum(r.from_draft),
                "acceptance_rate": r.acceptance_rate,
                "mean_accepted_length": r.mean_accepted_length,
                "draft_tokens": r.draft_tokens,
                "accepted_tokens": r.accepted_tokens,
                "checks": r.checks,
                "steps_well_formed": _steps_well_formed(r.steps),
                "steps_count": len(r.steps),
                "steps_proposed": sum(step[0] for step in r.steps if step),
                "steps_accepted": sum(step[1] for step in r.steps if len(step) > 1),
                "hardware": r.hardware,
                "workload": r.workload,
                "split": r.split,
                "timestamp": r.timestamp,
                "failure_threshold": r.failure_threshold,
                "is_failure": r.is_failure,
                "is_failure_expected": is_failure(r.acceptance_rate, r.failure_threshold),
                "drafted_count": len(r.drafted),
                "unverified_max": max(r.unverified, default=-1),
                "unverified_from_draft": all(
                    0 <= p < len(r.from_draft) and r.from_draft[p] for p in r.unverified
                ),
                "masked_disagreements": r.masked_disagreements,
            }
            for row, r in enumerate(records)
        ]
    )


_DISAGREEMENT_COLUMNS = [
    ROW,
    DISAGREEMENT,
    "position",
    "output_length",
    "draft_index",
    "draft_token_differs",
    "target_prob_of_draft",
    "target_prob_of_target",
    "draft_prob_of_draft",
    "draft_prob_of_target",
    "context_length",
]


def _disagreement_frame(records: Sequence[RequestRecord]) -> pd.DataFrame:
    import pandas as pd

    rows = [
        (
            row,
            index,
            d.position,
            len(r.output_token_ids),
            d.draft_index,
            d.draft_token != d.target_token,
            d.target_prob_of_draft,
            d.target_prob_of_target,
            d.draft_prob_of_draft,
            d.draft_prob_of_target,
            len(d.context),
        )
        for row, r in enumerate(records)
        for index, d in enumerate(r.disagreements)
    ]
    return pd.DataFrame(rows, columns=_DISAGREEMENT_COLUMNS)


_DRAFTED_COLUMNS = [
    ROW,
    DRAFTED,
    "stage",
    "stage_index",
    "position",
    "step",
    "checks",
    "draft_confidence",
    "draft_entropy",
    "match_len",
    "target_entropy",
    "recent_logprob",
    "length_ratio",
    "kept_if_accepted",
]
# Nullable: as floats, so that a column of nulls (a drafter without them) compares as numbers.
_NULLABLE = ["draft_confidence", "draft_entropy", "match_len"]


def _drafted_frame(records: Sequence[RequestRecord]) -> pd.DataFrame:
    import pandas as pd

    rows = [
        (
            row,
            index,
            d.stage,
            d.stage_index,
            d.position,
            d.step,
            r.checks,
            d.draft_confidence,
            d.draft_entropy,
            d.match_len,
            d.target_entropy,
            d.recent_logprob,
            d.length_ratio,
            d.kept or not d.accepted,
        )
        for row, r in enumerate(records)
        for index, d in enumerate(r.drafted)
    ]
    frame = pd.DataFrame(rows, columns=_DRAFTED_COLUMNS)
    return frame.astype({column: "float64" for column in _NULLABLE})


def _suite_report(
    success: bool, frame: pd.DataFrame, unexpected: dict[str, list[dict]]
) -> SuiteReport:
    """``unexpected`` counts the suite's rows (requests, disagreements or drafted tokens) per
    expectation."""
    return SuiteReport(
        ran=True,
        success=success,
        rows=len(frame),
        unexpected={label: len(keys) for label, keys in unexpected.items()},
    )


def _run_suite(
    context, name: str, frame: pd.DataFrame, expectations: Sequence[_Expectation], keys: list[str]
) -> tuple[bool, dict[str, list[dict]]]:
    """Validate ``frame``; return GE's success flag and, per expectation label (in suite
    order), the ``keys`` columns of every failing row."""
    import great_expectations as gx

    labels = [e.label for e in expectations]
    if len(set(labels)) != len(labels):
        raise ValueError(f"expectation labels must be unique in suite {name!r}: {labels}")
    suite = gx.ExpectationSuite(
        name=name,
        expectations=[getattr(gx.expectations, e.kind)(**e.kwargs) for e in expectations],
    )
    batch_definition = (
        context.data_sources.add_pandas(name)
        .add_dataframe_asset(name)
        .add_batch_definition_whole_dataframe(name)
    )
    batch = batch_definition.get_batch(batch_parameters={"dataframe": frame})
    outcome = batch.validate(
        suite,
        result_format={"result_format": "COMPLETE", "unexpected_index_column_names": keys},
    )
    unexpected: dict[str, list[dict]] = {label: [] for label in labels}
    returned = set()
    for result in outcome.results:
        label = _label(result.expectation_config.type, result.expectation_config.kwargs)
        if label not in unexpected or label in returned:
            raise RuntimeError(f"{name}: unexpected result from Great Expectations for {label}")
        returned.add(label)
        info = result.exception_info or {}
        if info.get("raised_exception"):
            raise RuntimeError(f"{name}: {label} raised: {info.get('exception_message')}")
        failing = result.result.get("unexpected_index_list") or []
        if not result.success and not failing:
            # A failure we cannot map to rows must not pass silently.
            raise RuntimeError(f"{name}: {label} failed without naming rows: {result.result}")
        unexpected[label] = [{key: int(item[key]) for key in keys} for item in failing]
    if returned != set(labels):
        raise RuntimeError(f"{name}: no result for {sorted(set(labels) - returned)}")
    return bool(outcome.success), unexpected


def expectation_reasons(
    records: Sequence[RequestRecord],
    *,
    known_hardware: Collection[str],
    known_workloads: Collection[str],
    now: float,
) -> tuple[dict[int, list[str]], dict[str, SuiteReport]]:
    """Run the three suites; return the reasons per failing request (by index) and the
    reports (keyed by the names in ``SUITES``)."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )

    context = gx.get_context(
        mode="ephemeral",
        project_config=DataContextConfig(
            store_backend_defaults=InMemoryStoreBackendDefaults(init_temp_docs_sites=False),
            analytics_enabled=False,
            progress_bars=ProgressBarsConfig(globally=False),
        ),
    )
    reasons: dict[int, list[str]] = {}
    reports: dict[str, SuiteReport] = {}

    requests = _request_frame(records)
    suite = request_expectations(known_hardware, known_workloads, now)
    success, unexpected = _run_suite(context, "requests", requests, suite, [ROW])
    reports["requests"] = _suite_report(success, requests, unexpected)
    for expectation in suite:
        for key in unexpected[expectation.label]:
            reasons.setdefault(key[ROW], []).append(expectation.label)

    disagreements = _disagreement_frame(records)
    suite = disagreement_expectations()
    keys = [ROW, DISAGREEMENT]
    success, unexpected = _run_suite(context, "disagreements", disagreements, suite, keys)
    reports["disagreements"] = _suite_report(success, disagreements, unexpected)
    _add_nested_reasons(reasons, "disagreement", DISAGREEMENT, suite, unexpected)

    drafted = _drafted_frame(records)
    suite = drafted_expectations()
    success, unexpected = _run_suite(context, "drafted", drafted, suite, [ROW, DRAFTED])
    reports["drafted"] = _suite_report(success, drafted, unexpected)
    _add_nested_reasons(reasons, "drafted", DRAFTED, suite, unexpected)
    return reasons, reports


def _add_nested_reasons(
    reasons: dict[int, list[str]],
    noun: str,
    index_key: str,
    suite: Sequence[_Expectation],
    unexpected: dict[str, list[dict]],
) -> None:
    """Add ``"<noun> <index>: <label>"`` to each failing nested row's request, ordered by
    request, then row, then the expectation's place in the suite."""
    failures = sorted(
        (key[ROW], key[index_key], position, expectation.label)
        for position, expectation in enumerate(suite)
        for key in unexpected[expectation.label]
    )
    for row, index, _, label in failures:
        reasons.setdefault(row, []).append(f"{noun} {index}: {label}")


def skipped_suite() -> SuiteReport:
    """The report of a suite that did not run (no row survived stages 1-2)."""
    return SuiteReport(ran=False, success=None, rows=0, unexpected={})


# A reason of a nested row, as _add_nested_reasons words it, and the suite it comes from.
_NESTED_REASON = re.compile(r"(disagreement|drafted) \d+: (.+)")
_NESTED_SUITE = {"disagreement": "disagreements", "drafted": "drafted"}


def reports_from_reasons(
    records: Sequence[Mapping[str, Any]],
    reasons: Sequence[Sequence[str]],
    earlier: Mapping[str, SuiteReport],
) -> dict[str, SuiteReport]:
    """The reports :func:`expectation_reasons` gives for ``records``, some of the requests
    one run of it checked (as dicts), without running the suites again: from the reasons
    that run gave each (``[]`` for one that passed) and its reports ``earlier`` (for the
    expectations' labels). Exact, because every expectation judges one row at a time (the
    one over a whole column, unique ids, has no duplicates left to find after stage 2 of
    validation), and none tolerates a failing row (no ``mostly``)."""
    if not records:
        return {name: skipped_suite() for name in SUITES}
    failing: dict[str, Counter[str]] = {name: Counter() for name in SUITES}
    for record_reasons in reasons:
        for reason in record_reasons:
            nested = _NESTED_REASON.fullmatch(reason)
            if nested:
                failing[_NESTED_SUITE[nested[1]]][nested[2]] += 1
            else:
                failing["requests"][reason] += 1
    rows = {
        "requests": len(records),
        "disagreements": sum(len(r.get("disagreements") or ()) for r in records),
        "drafted": sum(len(r.get("drafted") or ()) for r in records),  # none in version 1
    }
    reports = {}
    for name in SUITES:
        labels = dict.fromkeys([*earlier[name].unexpected, *failing[name]])
        unexpected = {label: failing[name][label] for label in labels}
        success = not any(unexpected.values())
        reports[name] = SuiteReport(
            ran=True, success=success, rows=rows[name], unexpected=unexpected
        )
    return reports
