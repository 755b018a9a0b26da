"""The evaluation file a remote machine writes: a real evaluate() report round-trips, and
a corrupt or inconsistent file is refused with the bad field named."""

import copy
import json

import pytest

from serving.engine.drafters.package import DraftManifest, write_package
from serving.errors import BadInputError
from tasks.evaluate.evaluate import Contender, evaluate
from tasks.evaluate.evaluation_file import (
    evaluation_of,
    machine_info,
    read_evaluation_file,
    read_report,
    write_evaluation_file,
)

LABELS = {"champion": "ngram/1", "challenger-0": "specops-draft-head/2"}


@pytest.fixture(scope="module")
def report(tmp_path_factory, evaluation_target, make_prompts):
    folder = tmp_path_factory.mktemp("packages")
    contenders = [
        Contender("champion", write_package(folder / "a", DraftManifest(drafter="pld:3", k=4))),
        Contender(
            "challenger-0", write_package(folder / "b", DraftManifest(drafter="ngram:3", k=4))
        ),
    ]
    return evaluate(
        contenders, make_prompts()[:3], target=evaluation_target, max_new_tokens=8,
        progress=False,
    )  # fmt: skip


@pytest.fixture
def produced_by():
    return machine_info(
        device="cpu", started="2025-01-01T00:00:00Z", finished="2025-01-01T00:01:00Z"
    )


@pytest.fixture
def written(tmp_path, report, produced_by):
    path = tmp_path / "evaluation.json"
    write_evaluation_file(path, evaluation_of(report, contenders=LABELS, produced_by=produced_by))
    return path


def test_a_real_report_round_trips(written, report):
    evaluation = read_evaluation_file(written)
    assert (evaluation.format, evaluation.hardware, evaluation.prompts) == (1, "cpu", 3)
    assert evaluation.contenders == LABELS
    assert set(evaluation.produced_by) >= {"host", "device", "started", "finished", "torch"}
    champion = report["results"]["champion"]
    assert evaluation.metrics_of("champion") == {
        "acceptance_rate": champion["acceptance_rate"],
        "mean_accepted_length": champion["mean_accepted_length"],
        "tokens_per_s": champion["tokens_per_s"],
        "speedup": champion["speedup"],
        "lossless": 1.0,
    }
    kept = evaluation.report_of("challenger-0")
    assert kept["contender"] == "challenger-0" and "per_prompt" not in kept
    assert kept["results"] == report["results"]


def _edit(path, change):
    payload = json.loads(path.read_text())
    change(payload)
    path.write_text(json.dumps(payload))


def _results(payload):
    return payload["report"]["results"]


def _set(path, value):
    """A change that sets ``payload[path[0]][path[1]]... = value``."""

    def change(payload):
        node = payload
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return change


def _twice_as_fast(payload):
    _results(payload)["challenger-0"]["speedup"] *= 2


def _workload_speedup(payload):
    group = next(iter(payload["report"]["by_workload"].values()))
    group["champion"]["speedup"] += 0.5


def _drop(*path):
    def change(payload):
        node = payload
        for key in path[:-1]:
            node = node[key]
        del node[path[-1]]

    return change


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        (_twice_as_fast, "report.results.challenger-0.speedup: "),
        (_workload_speedup, "report.by_workload.grounded.champion.speedup: "),
        (_set(("report", "results", "champion", "speedup"), None), "champion.speedup: None is"),
        (_set(("report", "results", "champion", "tokens_per_s"), -1.0), "greater than or equal"),
        (_set(("report", "results", "champion", "tokens_per_s"), float("nan")), "finite number"),
        (_set(("report", "results", "champion", "total_s"), "1.5"), "total_s: Input should be a"),
        (_set(("report", "results", "champion", "lossless"), False), "lossless is False but"),
        (_set(("report", "results", "champion", "requests"), 2), "requests: 2, but the eval"),
        (_set(("report", "results", "champion", "extra"), 1), "Extra inputs are not permitted"),
        (_drop("report", "results", "challenger-0"), "report.results: has ['champion', 'plain']"),
        (_drop("report", "results", "plain"), "needs exactly ['challenger-0', 'champion', 'pl"),
        (_set(("contenders", "champion"), "ngram"), "contenders: champion: 'ngram' does not name"),
        (_set(("contenders", "plain"), "ngram/1"), "contenders: 'plain' is the reference"),
        (_set(("hardware",), "tpu"), "hardware: unknown hardware target 'tpu'"),
        (_set(("prompts",), 4), "report.prompts: 3 differs from the file's prompts 4"),
        (_set(("format",), 2), "format 2 is not 1"),
        (_drop("produced_by", "host"), "produced_by: missing ['host']"),
        (
            _drop(
                "report",
            ),
            "report: Field required",
        ),
    ],
)
def test_a_bad_file_is_refused_naming_the_field(written, change, fragment):
    _edit(written, change)
    with pytest.raises(BadInputError, match="evaluation file") as refused:
        read_evaluation_file(written)
    assert fragment in str(refused.value)


def test_a_file_that_is_not_json_is_refused(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"format": 1, "hardware": ')
    with pytest.raises(BadInputError, match="is not JSON"):
        read_evaluation_file(path)
    with pytest.raises(BadInputError, match="cannot read evaluation file"):
        read_evaluation_file(tmp_path / "missing.json")
    path.write_text("[1]")
    with pytest.raises(BadInputError, match="must be a JSON object, not list"):
        read_evaluation_file(path)


def test_an_inconsistent_report_is_never_written(tmp_path, report, produced_by):
    bad = copy.deepcopy(report)
    bad["results"]["champion"]["speedup"] = 9.0
    path = tmp_path / "evaluation.json"
    with pytest.raises(BadInputError, match=r"cannot write evaluation file: .*champion\.speedup"):
        write_evaluation_file(path, evaluation_of(bad, contenders=LABELS, produced_by=produced_by))
    assert not path.exists() and list(tmp_path.iterdir()) == []


def test_a_report_is_read_from_an_evaluation_file_or_bare(tmp_path, written, report):
    assert read_report(written).model_dump(mode="json") == report
    bare = tmp_path / "report.json"
    bare.write_text(json.dumps(report))
    assert read_report(bare).evaluated_curve == report["evaluated_curve"]
    kept = tmp_path / "evaluation-cpu.json"  # as an evaluation run keeps it in the registry
    kept.write_text(json.dumps(read_evaluation_file(written).report_of("challenger-0")))
    assert read_report(kept).evaluated_curve == report["evaluated_curve"]
    bare.write_text(json.dumps({"hardware": "cpu"}))  # not a report: missing fields named
    with pytest.raises(BadInputError, match=r"evaluation report '.*report.json': prompts"):
        read_report(bare)
    with pytest.raises(BadInputError, match="cannot read evaluation report"):
        read_report(tmp_path / "missing.json")
