"""``specops registry ...`` through the Typer app (promote, log-evaluation, show, describe,
register, rollback, export), against a real MLflow SQLite store in a temporary folder
(``SPECOPS_MLFLOW_URI``)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from registry.client import Registry
from registry.config import load_registry_config
from serving.engine.drafters.package import DraftManifest, write_package
from serving.hardware import engine_target
from serving.target import LoadedTarget, eos_ids
from specops.cli import app
from tasks.evaluate.evaluate import Contender, evaluate
from tasks.evaluate.evaluation_file import evaluation_of, machine_info, write_evaluation_file

runner = CliRunner()


@pytest.fixture
def registry(registry_env):
    """The registry the commands open (the environment points them at it)."""
    return Registry(load_registry_config())


@pytest.fixture
def draft(registry, tmp_path):
    def register(drafter: str = "pld:3", family: str = "head"):
        package = write_package(
            tmp_path / drafter.replace(":", "-"), DraftManifest(drafter=drafter)
        )
        return registry.log_draft(package, family=family)

    return register


@pytest.fixture(scope="module")
def report(tmp_path_factory, target, char_tokenizer, make_prompts):
    """A real evaluation on the tiny target: a champion and one challenger."""
    folder = tmp_path_factory.mktemp("packages")
    contenders = [
        Contender("champion", write_package(folder / "a", DraftManifest(drafter="pld:3", k=4))),
        Contender(
            "challenger-0", write_package(folder / "b", DraftManifest(drafter="ngram:3", k=4))
        ),
    ]
    loaded = LoadedTarget.of(
        target,
        char_tokenizer,
        hardware=engine_target("cpu"),
        eos_token_ids=eos_ids(target, char_tokenizer),
    )
    return evaluate(contenders, make_prompts()[:3], target=loaded, max_new_tokens=8, progress=False)


def _evaluation_file(path, report, contenders):
    produced_by = machine_info(
        device="cuda:0", started="2025-01-01T00:00Z", finished="2025-01-01T00:01Z"
    )
    write_evaluation_file(
        path, evaluation_of(report, contenders=contenders, produced_by=produced_by)
    )
    return path


def _invoke(*args: object):
    return runner.invoke(app, ["registry", *map(str, args)])


def _evaluation_runs(registry):
    return registry.client.search_runs(
        [registry.experiment_id], filter_string="tags.kind = 'evaluation'"
    )


def _refused(result, code: int, fragment: str) -> None:
    assert result.exit_code == code, result.output
    assert fragment in result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


# --- promote -------------------------------------------------------------------------------
def test_promote_moves_the_champion(registry, draft):
    head = draft()
    registry.log_evaluation(head, "cpu", {"speedup": 1.4})
    result = _invoke("promote", f"head/{head.version}", "--hardware", "cpu", "--reason", "faster")
    assert result.exit_code == 0, result.output
    assert f"champion-cpu -> {head.label} (was none (plain decoding)" in result.output
    assert registry.champion("cpu").label == head.label

    second = draft("ngram:3", family="ngram")
    registry.log_evaluation(second, "cpu", {"speedup": 1.6})
    result = _invoke("promote", second.label, "--hardware", "cpu")  # the full label works too
    assert result.exit_code == 0, result.output
    assert f"champion-cpu -> {second.label} (was {head.label};" in result.output
    assert registry.champion("cpu").label == second.label
    runs = registry.client.search_runs([registry.promotions_id])
    assert sorted(r.data.tags["reason"] for r in runs) == ["faster", "manual promotion"]


def test_promote_refuses_a_version_not_evaluated_on_that_target(registry, draft):
    head = draft()
    registry.log_evaluation(head, "cpu-stock", {"speedup": 1.4})  # another target
    result = _invoke("promote", f"head/{head.version}", "--hardware", "cpu")
    _refused(result, 1, f"{head.label} has not been evaluated on 'cpu'; evaluate it there")
    assert registry.champion("cpu") is None


@pytest.mark.parametrize(
    ("args", "code", "fragment"),
    [
        (["head/7", "--hardware", "cpu"], 1, "specops-draft-head has no version '7'"),
        (["head", "--hardware", "cpu"], 2, "'head' does not name a draft version; write FAMILY"),
        (["head/x", "--hardware", "cpu"], 2, "'head/x' does not name a draft version"),
        (["head/1", "--hardware", "tpu"], 2, "unknown hardware target 'tpu'"),
    ],
)
def test_promote_refuses_bad_versions_and_targets(registry, draft, args, code, fragment):
    head = draft()
    registry.log_evaluation(head, "cpu", {"speedup": 1.4})
    _refused(_invoke("promote", *args), code, fragment)
    assert registry.champion("cpu") is None


def test_describe_shows_a_versions_lineage(registry, tmp_path):
    package = write_package(tmp_path / "pkg", DraftManifest(drafter="pld:3"))
    head = registry.log_draft(
        package, family="head", tags={"data_version": "d1"}, curves={"loss": [(0, 2.0), (5, 1.0)]}
    )
    result = _invoke("describe", f"head/{head.version}")
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert shown["label"] == head.label and shown["tags"]["data_version"] == "d1"
    assert shown["metrics"] == {"loss": 1.0} and shown["params"]["drafter"] == "pld:3"


# --- register, rollback --------------------------------------------------------------------
def test_register_adds_a_version_and_promotes_nothing(registry, tmp_path):
    package = write_package(tmp_path / "pkg", DraftManifest(drafter="ngram:3", k=4))
    result = _invoke("register", package, "--family", "ngram")
    assert result.exit_code == 0, result.output
    (version,) = registry.client.search_model_versions(f"name = '{registry.model_name('ngram')}'")
    draft = registry.get("ngram", version.version)
    assert result.output == f"registered {draft.label} (run {draft.run_id})\n"
    assert registry.champion("cpu") is None
    second = _invoke("register", package, "--family", "ngram")
    assert second.exit_code == 0 and second.output.startswith("registered specops-draft-ngram/2")


def test_register_refuses_a_folder_that_is_not_a_package(registry, tmp_path):
    (tmp_path / "empty").mkdir()
    result = _invoke("register", tmp_path / "empty", "--family", "ngram")
    _refused(result, 2, "is not a draft package: draft.json is missing")
    assert registry.families() == []


def test_rollback_gives_the_champion_back(registry, draft):
    first, second = draft("pld:3", family="ngram"), draft("ngram:3", family="head")
    for version in (first, second):
        registry.log_evaluation(version, "cpu", {"speedup": 1.2})
        registry.promote(registry.get(version.family, version.version), "cpu", reason="setup")
    result = _invoke("rollback", "--hardware", "cpu", "--reason", "too slow")
    assert result.exit_code == 0, result.output
    assert result.output == f"champion-cpu -> {first.label}\n"
    assert registry.champion("cpu").label == first.label
    (audit,) = [
        r
        for r in registry.client.search_runs([registry.promotions_id])
        if r.data.tags.get("reason") == "too slow"
    ]
    assert audit.data.tags["hardware"] == "cpu"


def test_a_held_version_is_promoted_only_after_clear_rollback(registry, draft):
    first, second = draft("pld:3", family="ngram"), draft("ngram:3", family="head")
    for version in (first, second):
        registry.log_evaluation(version, "cpu", {"speedup": 1.2})
        registry.promote(registry.get(version.family, version.version), "cpu", reason="setup")
    registry.rollback("cpu", reason="watch: collapsed", expected_champion=second.label, hold=True)
    held = f"head/{second.version}"
    _refused(_invoke("promote", held, "--hardware", "cpu"), 1, "clear-rollback")
    result = _invoke("clear-rollback", held, "--hardware", "cpu")
    assert result.exit_code == 0 and "may be promoted on cpu again" in result.output
    again = _invoke("clear-rollback", held, "--hardware", "cpu")
    assert again.exit_code == 0 and "nothing to clear" in again.output
    assert _invoke("promote", held, "--hardware", "cpu").exit_code == 0
    assert registry.champion("cpu").label == second.label


def test_rollback_without_a_promotion_is_refused(registry, draft):
    draft()
    # exit 2 (specops.exit.fail), unlike promote's refusals (exit 1): as the command does today
    _refused(_invoke("rollback", "--hardware", "cpu"), 2, "no promotion on 'cpu' to roll back")
    assert registry.champion("cpu") is None


# --- export ---------------------------------------------------------------------------------
def test_export_writes_the_vllm_speculative_config(registry, draft, tmp_path):
    version = draft("pld:3", family="ngram")
    out = tmp_path / "export"
    result = runner.invoke(
        app,
        ["registry", "export", f"ngram/{version.version}", "--hardware", "cpu-vllm",
         "--out", str(out), "--cache", str(tmp_path / "cache")],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    config = json.loads(result.stdout)
    assert config == {
        "method": "ngram",
        "num_speculative_tokens": 3,  # cpu-vllm's num_speculative_tokens
        "prompt_lookup_max": 3,
        "prompt_lookup_min": 1,
    }
    assert json.loads((out / "speculative_config.json").read_text()) == config
    assert f"# {version.label} for cpu-vllm (vllm) in {out}" in result.stderr
    assert "export.vllm" in registry.get("ngram", version.version).tags  # logged once


def test_export_refuses_the_engines_own_targets_and_unknown_versions(registry, draft, tmp_path):
    version = draft("pld:3", family="ngram")
    out = tmp_path / "export"
    _refused(
        _invoke("export", version.label, "--hardware", "cpu", "--out", out),
        2,
        "hardware target 'cpu' runs on the specops engine",
    )
    _refused(
        _invoke("export", "ngram/9", "--hardware", "cpu-vllm", "--out", out),
        1,
        "specops-draft-ngram has no version '9'",
    )
    _refused(_invoke("export", "ngram/1", "--hardware", "tpu"), 2, "unknown hardware target 'tpu'")
    assert not out.exists()


# --- log-evaluation ------------------------------------------------------------------------
def test_log_evaluation_marks_every_contender_evaluated(registry, draft, report, tmp_path):
    champion, challenger = draft("pld:3", family="ngram"), draft("ngram:3", family="head")
    path = _evaluation_file(
        tmp_path / "evaluation.json",
        report,
        {"champion": f"ngram/{champion.version}", "challenger-0": challenger.label},
    )
    result = _invoke("log-evaluation", path)
    assert result.exit_code == 0, result.output
    assert f"challenger-0: {challenger.label} evaluated on cpu: " in result.output
    for name, version in (("champion", champion), ("challenger-0", challenger)):
        fresh = registry.get(version.family, version.version)
        assert fresh.evaluated_on("cpu")
        run = registry.client.get_run(fresh.tags["evaluated.cpu"])
        measured = report["results"][name]
        assert run.data.metrics["cpu/speedup"] == pytest.approx(measured["speedup"])
        assert run.data.metrics["cpu/lossless"] == 1.0
        assert run.data.params["produced_by.device"] == "cuda:0"
        assert run.data.tags["draft"] == version.label
    # Evaluated on cpu, the challenger can now be promoted there.
    result = _invoke("promote", challenger.label, "--hardware", "cpu")
    assert result.exit_code == 0, result.output


def _as_is(path):
    pass


def _twice_as_fast(path):
    payload = json.loads(path.read_text())
    payload["report"]["results"]["challenger-0"]["speedup"] *= 2
    path.write_text(json.dumps(payload))


def _cut_short(path):
    path.write_text(path.read_text()[:-40])


@pytest.mark.parametrize(
    ("challenger", "change", "code", "fragment"),
    [
        ("head/9", _as_is, 1, "specops-draft-head has no version '9'"),
        ("head/1", _twice_as_fast, 2, "report.results.challenger-0.speedup: "),
        ("head/1", _cut_short, 2, "is not JSON"),
    ],
    ids=["unknown-label", "inconsistent-speedup", "corrupt-json"],
)
def test_log_evaluation_refuses_and_logs_nothing(
    registry, draft, report, tmp_path, challenger, change, code, fragment
):
    champion, head = draft("pld:3", family="ngram"), draft("ngram:3", family="head")
    assert head.version == "1"
    labels = {"champion": f"ngram/{champion.version}", "challenger-0": challenger}
    path = _evaluation_file(tmp_path / "evaluation.json", report, labels)
    change(path)
    _refused(_invoke("log-evaluation", path), code, fragment)
    assert _evaluation_runs(registry) == []
    assert not registry.get("ngram", champion.version).evaluated_on("cpu")
    assert not registry.get("head", head.version).evaluated_on("cpu")


def test_log_evaluation_promote_gates_and_refuses_a_champion_that_moved(
    registry, draft, report, tmp_path, monkeypatch
):
    import tasks.evaluate.gates as gates
    import tasks.loop.target_promotion as target_promotion

    monkeypatch.setattr(target_promotion, "export_for_targets", lambda *args: {})
    # The report below is made to pass by raising its measured speeds: judged by them (the
    # modelled speed left as measured: the report carries no checks to price).
    config = gates.GateConfig(min_prompts=3, wall_clock_confidence=0)
    monkeypatch.setattr(gates, "modelled_report", lambda report, curve="profiled": report)
    monkeypatch.setattr(gates, "load_gates", lambda: config)
    champion, challenger = draft("pld:3", family="ngram"), draft("ngram:3", family="head")
    registry.log_evaluation(champion, "cpu", {"speedup": 1.0})
    registry.promote(registry.get("ngram", champion.version), "cpu", reason="setup")
    labels = {"champion": champion.label, "challenger-0": challenger.label}
    # Make the challenger pass: the same report, with its speed raised consistently.
    faster = json.loads(json.dumps(report))
    for group in [faster["results"], *faster["by_workload"].values(),
                  *faster.get("by_source", {}).values()]:  # fmt: skip
        plain, old = group["plain"]["tokens_per_s"], group["champion"]["tokens_per_s"]
        group["challenger-0"].update(tokens_per_s=old * 1.5, speedup=old * 1.5 / plain)
        group["challenger-0"]["mean_accepted_length"] = group["champion"]["mean_accepted_length"]
    path = _evaluation_file(tmp_path / "evaluation.json", faster, labels)
    # Another promotion lands between the evaluation and its logging: refused, not promoted.
    other = draft("pld:5", family="suffix")
    registry.log_evaluation(other, "cpu", {"speedup": 1.0})
    registry.promote(registry.get("suffix", other.version), "cpu", reason="meanwhile")
    result = _invoke("log-evaluation", path, "--promote")
    assert result.exit_code == 1, result.output
    assert "moved" in result.output and registry.champion("cpu").label == other.label
    # Against the champion it was measured with, the passing challenger is promoted.
    registry.rollback("cpu")
    result = _invoke("log-evaluation", path, "--promote")
    assert result.exit_code == 0, result.output
    assert f"champion-cpu -> {challenger.label}" in result.output
    assert registry.champion("cpu").label == challenger.label


# --- show VERSION: lineage -----------------------------------------------------------------
LINEAGE = {"data_version": "dvc:abc parts:123", "git_commit": "0f1e2d"}


def test_show_version_prints_its_lineage(registry, tmp_path):
    package = write_package(tmp_path / "pkg", DraftManifest(drafter="pld:3"))
    head = registry.log_draft(package, family="head", tags=LINEAGE)
    evaluation = registry.log_evaluation(head, "cpu", {"speedup": 1.4}, tags=LINEAGE)
    registry.log_evaluation(head, "cpu-stock", {"speedup": 1.1})  # logged without lineage
    promotion = registry.promote(registry.get("head", head.version), "cpu", reason="faster")
    result = _invoke("show", f"head/{head.version}")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith(f"{head.label} (family head) in sqlite:///")
    assert lines[1] == "lineage: data_version dvc:abc parts:123, git_commit 0f1e2d"
    assert lines[2].startswith(f"produced by: run {head.run_id} 'draft-head' (FINISHED, ")
    assert f"  cpu: run {evaluation} " in result.output
    assert "data_version dvc:abc parts:123, git_commit 0f1e2d" in lines[4]
    assert lines[5].startswith("  cpu-stock: run ") and lines[5].endswith("no lineage recorded")
    assert "aliases: champion-cpu" in lines
    assert lines[-1].endswith(f" promote on cpu: faster [run {promotion}]")

    shown = json.loads(_invoke("show", head.label, "--json").output)  # the full label works too
    assert shown["lineage"] == LINEAGE and shown["evaluations"]["cpu"]["run_id"] == evaluation
    assert shown["promotions"][0]["run_id"] == promotion


def test_show_version_without_lineage_says_so(registry, draft):
    head = draft()
    result = _invoke("show", head.label)
    assert result.exit_code == 0, result.output
    assert "lineage: no lineage recorded" in result.output
    assert "evaluations: none" in result.output and "promotions: none" in result.output


@pytest.mark.parametrize(
    ("label", "code", "fragment"),
    [("head/9", 1, "specops-draft-head has no version '9'"), ("head", 2, "does not name")],
)
def test_show_version_refuses_unknown_versions(registry, label, code, fragment):
    _refused(_invoke("show", label), code, fragment)


def test_show_without_version_is_unchanged(registry, draft):
    head = draft()
    shown = json.loads(_invoke("show", "--hardware", "cpu").output)
    assert shown["families"]["head"]["versions"] == [int(head.version)]
    assert shown["champions"] == {"cpu": None}


# --- the top-level flags ---------------------------------------------------------------------
def test_tracking_uri_flag_wins_over_the_environment(registry, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECOPS_MLFLOW_URI", "http://127.0.0.1:9")  # unreachable
    store = f"sqlite:///{tmp_path}/mlflow.db"
    result = runner.invoke(app, ["--tracking-uri", store, "registry", "show", "--hardware", "cpu"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["tracking_uri"] == store


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--tracking-uri", "htp://x"], "tracking_uri (from flag --tracking-uri): 'htp://x'"),
        (["--registry-uri", "ftp://x"], "registry_uri (from flag --registry-uri)"),
        (["--registry-config", "/nonexistent.yaml"], "named by flag --registry-config"),
    ],
)
def test_bad_flags_fail_before_any_command(flags, fragment):
    result = runner.invoke(app, [*flags, "registry", "show"])
    _refused(result, 2, fragment)


def test_registry_config_flag_names_the_file(registry, tmp_path, draft):
    draft()  # specops-draft-head/1
    path = tmp_path / "other.yaml"
    path.write_text(f"tracking_uri: sqlite:///{tmp_path}/other.db\nmodel_prefix: other\n")
    result = runner.invoke(
        app, ["--registry-config", str(path), "registry", "show", "--hardware", "cpu"]
    )
    assert result.exit_code == 0, result.output
    # The environment's store wins over the file's tracking_uri; the prefix is the file's.
    shown = json.loads(result.output)
    assert shown["tracking_uri"] == registry.tracking_uri and "registry_uri" not in shown
    assert shown["families"] == {}  # no "other-*" model there
