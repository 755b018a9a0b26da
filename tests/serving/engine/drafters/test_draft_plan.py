"""Draft plans (serving/engine/drafters/plan.py): one parser for a drafter, its policy and
its k, with the messages the separate checks give; draft.json's fields; paths resolved
inside a package; cascade plans."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from serving.engine.drafters.factory import SPEC_HELP, parse_drafter_spec
from serving.engine.drafters.kinds import KIND_BY_NAME, DrafterSpec
from serving.engine.drafters.package import DraftManifest, read_manifest, write_package
from serving.engine.drafters.plan import (
    DEFAULT_CASCADE_K,
    DEFAULT_K,
    DEFAULT_POLICY,
    PLAIN,
    CascadePlan,
    DraftPlan,
)
from serving.engine.policy import MAX_DRAFT_TOKENS, POLICIES, check_k, make_policy
from serving.errors import BadInputError, ModelSourceError


def _message(call) -> str:
    with pytest.raises(BadInputError) as excinfo:
        call()
    return str(excinfo.value)


# ------------------------------------------------------------------------------ parsing


def test_a_plan_parses_its_drafter_policy_and_k():
    plan = DraftPlan.parse("pld:3", policy="fixed", k=4)
    assert plan == DraftPlan(DrafterSpec("pld", "3"), "fixed", 4)
    assert plan.kind is KIND_BY_NAME["pld"] and plan.drafts
    assert DraftPlan.parse("NGRAM:5").drafter == DrafterSpec("ngram", "5")
    default = DraftPlan.parse("pld")
    assert (default.policy, default.k) == (DEFAULT_POLICY, DEFAULT_K) == ("cost", 10)
    assert DEFAULT_CASCADE_K == 8
    assert DraftPlan.parse("none") == PLAIN and not PLAIN.drafts
    assert PLAIN.kind is KIND_BY_NAME["none"]


@pytest.mark.parametrize(
    "spec",
    ["", "  ", "warp:3", "eagle", "layers", "layers:x", "layers:0", "pld:0", "none:3", "model:"],
)
def test_a_bad_drafter_is_refused_with_the_specs_own_message(spec):
    assert _message(lambda: DraftPlan.parse(spec)) == _message(lambda: parse_drafter_spec(spec))


def test_an_unknown_kind_is_named_with_every_kind():
    assert _message(lambda: DraftPlan.parse("warp:3", policy="fixed", k=4)) == (
        f"unknown drafter 'warp:3'; use one of: {SPEC_HELP}"
    )


@pytest.mark.parametrize("policy", ["x", "fastest", "", "COST"])
def test_a_bad_policy_is_refused_with_the_policies_message(policy):
    message = _message(lambda: DraftPlan.parse("pld", policy=policy))
    assert message == _message(lambda: make_policy(policy, 4))
    assert message == f"unknown policy {policy!r}; choose one of {POLICIES}"


@pytest.mark.parametrize("k", [0, -1, MAX_DRAFT_TOKENS + 1, 2.5, True, "4"])
def test_a_bad_k_is_refused_with_the_policies_message(k):
    message = _message(lambda: DraftPlan.parse("pld", policy="fixed", k=k))
    assert message == _message(lambda: make_policy("fixed", k))
    assert message == _message(lambda: check_k(k))
    assert repr(k) in message or str(k) in message


def test_every_part_is_checked_however_a_plan_is_made():
    with pytest.raises(BadInputError, match="unknown policy 'x'"):
        DraftPlan(DrafterSpec("pld"), "x", 4)  # type: ignore[arg-type]
    with pytest.raises(BadInputError, match="k must be between"):
        DraftPlan(DrafterSpec("pld"), "fixed", 0)


def test_a_request_overrides_the_policy_and_k_checked():
    plan = DraftPlan.parse("ngram:4", policy="cost", k=10)
    assert plan.with_limits() == plan
    assert plan.with_limits(policy="fixed") == DraftPlan(plan.drafter, "fixed", 10)
    assert plan.with_limits(k=3) == DraftPlan(plan.drafter, "cost", 3)
    with pytest.raises(BadInputError, match="unknown policy 'fastest'"):
        plan.with_limits(policy="fastest")
    with pytest.raises(BadInputError, match="k must be between"):
        plan.with_limits(k=0)


# ------------------------------------------------------------------ draft.json's fields


@pytest.mark.parametrize(
    ("spec", "policy", "k"),
    [
        ("pld:3", "fixed", 5),
        ("ngram:4", "cost", 10),
        ("layers:2", "adaptive", 6),
        ("none", "cost", 1),
    ],
)
def test_fields_round_trip_through_draft_json(tmp_path, spec, policy, k):
    plan = DraftPlan.parse(spec, policy=policy, k=k)
    assert plan.fields() == {"drafter": spec, "policy": policy, "k": k}
    folder = write_package(tmp_path / "pkg", DraftManifest.of(plan, description="a test"))
    stored = json.loads((folder / "draft.json").read_text())
    assert {key: stored[key] for key in ("drafter", "policy", "k")} == plan.fields()
    assert stored["family"] == plan.kind.family and stored["description"] == "a test"
    manifest = read_manifest(folder)
    assert manifest.plan(folder) == plan
    assert DraftPlan.parse(stored["drafter"], policy=stored["policy"], k=stored["k"]) == plan


def test_a_manifest_takes_its_kinds_family_unless_told():
    plan = DraftPlan.parse("pld:3")
    assert DraftManifest.of(plan).family == "ngram"
    assert DraftManifest.of(plan, family="builtin").family == "builtin"
    assert DraftManifest.of(PLAIN).family == "none"


# ----------------------------------------------------------------- package-relative paths


def _model_folder(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    return path


def test_relocated_resolves_paths_inside_the_package(tmp_path):
    folder = tmp_path / "pkg"
    _model_folder(folder / "weights")
    (folder / "store.json").write_text("{}")
    model = DraftPlan(DrafterSpec("model", "weights"), "fixed", 4)
    assert model.relocated(folder) == DraftPlan(
        DrafterSpec("model", str(folder / "weights")), "fixed", 4
    )
    ngram = DraftPlan(DrafterSpec("ngram", "3,fallback=shared,store=store.json"))
    assert ngram.relocated(folder).drafter == DrafterSpec(
        "ngram", f"3,fallback=shared,store={folder / 'store.json'}"
    )
    pld = DraftPlan.parse("pld:3")
    assert pld.relocated(folder) is pld  # no path: as it was
    assert DraftPlan(DrafterSpec("suffix")).relocated(folder).drafter == DrafterSpec("suffix")


@pytest.mark.parametrize("arg", ["../elsewhere", "/abs/path", "weights/../../out"])
def test_relocated_refuses_a_path_leaving_the_package(tmp_path, arg):
    plan = DraftPlan(DrafterSpec("model", arg), "fixed", 4)
    with pytest.raises(ModelSourceError, match="must stay inside the package") as excinfo:
        plan.relocated(tmp_path / "pkg")
    assert repr(arg) in str(excinfo.value) and repr(str(tmp_path / "pkg")) in str(excinfo.value)
    ngram = DraftPlan(DrafterSpec("ngram", f"3,fallback=shared,store={arg}"))
    with pytest.raises(ModelSourceError, match="must stay inside the package"):
        ngram.relocated(tmp_path / "pkg")


def test_a_package_plan_has_its_paths_resolved(tmp_path):
    weights = _model_folder(tmp_path / "weights")
    plan = DraftPlan(DrafterSpec("model", "weights"), "fixed", 4)
    folder = write_package(tmp_path / "pkg", DraftManifest.of(plan), files={"weights": weights})
    assert json.loads((folder / "draft.json").read_text())["drafter"] == "model:weights"
    assert DraftManifest.of(plan).family == "full"
    assert read_manifest(folder).plan(folder) == plan.relocated(folder)


# ------------------------------------------------------------------------- cascade plans


def test_a_cascade_plan_parses_its_stages_in_order():
    plan = CascadePlan.parse("suffix, pld:3,ngram:4", k=6)
    assert [str(spec) for spec in plan.stages] == ["suffix", "pld:3", "ngram:4"]
    assert (plan.k, plan.predictor, plan.name) == (6, None, "suffix,pld:3,ngram:4")
    assert CascadePlan.parse(["suffix", "pld:3"]) == CascadePlan.parse("suffix,pld:3")
    assert CascadePlan.parse("pld").k == DEFAULT_CASCADE_K
    assert CascadePlan.parse("pld", predictor="p").predictor == Path("p")


@pytest.mark.parametrize(
    ("stages", "message"),
    [
        ("", "the cascade's stage list '' is empty"),
        ([], r"the cascade's stage list \[\] is empty"),
        (" , ", "is empty; give drafters in order, e.g. suffix,pld:3,head:PATH"),
        ("pld,none", "'none' is not a cascade stage: the target is always the last stage"),
        ("none", "'none' is not a cascade stage"),
        ("pld:3,pld:3", "cascade stage 'pld:3' appears twice in 'pld:3,pld:3'"),
        ("PLD:3,pld:3", "cascade stage 'pld:3' appears twice"),
        ("suffix,warp:3", "unknown drafter 'warp:3'"),
    ],
)
def test_a_bad_cascade_plan_is_refused(stages, message):
    with pytest.raises(BadInputError, match=message):
        CascadePlan.parse(stages)


def test_a_cascade_plan_is_checked_however_it_is_made():
    with pytest.raises(BadInputError, match="stage list is empty"):
        CascadePlan(())
    with pytest.raises(BadInputError, match="'none' is not a cascade stage"):
        CascadePlan((DrafterSpec("pld"), DrafterSpec("none")))
    with pytest.raises(BadInputError, match="cascade stage 'pld' appears twice"):
        CascadePlan((DrafterSpec("pld"), DrafterSpec("pld")))
    with pytest.raises(BadInputError, match="the cascade's k must be between"):
        CascadePlan.parse("pld", k=0)
