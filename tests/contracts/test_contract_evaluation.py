"""The evaluation file (tests/fixtures/contracts/evaluation.json), as today's
``write_evaluation_file`` wrote it for a tiny evaluation: today's readers take it, and
today's evaluation and writer give the same file after the same normalisation."""

from __future__ import annotations

import pytest

from tasks.evaluate.evaluation_file import (
    LOGGED_METRICS,
    read_evaluation_file,
    read_report,
    write_evaluation_file,
)
from tests.fixtures.cpu_kind import require_recorded_cpu_kind

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see tests/conftest.py


@pytest.fixture(scope="module")
def regenerated(gen, fixtures):
    return gen.build_evaluation(fixtures / "packages")


def test_todays_reader_takes_the_file(fixtures, gen):
    evaluation = read_evaluation_file(fixtures / "evaluation.json")
    assert evaluation.contenders == {n: label for n, (_, label) in gen.EVALUATED.items()}
    assert set(evaluation.report.results) == {"plain", *gen.EVALUATED}
    for name in gen.EVALUATED:
        assert set(evaluation.metrics_of(name)) <= {*LOGGED_METRICS, "lossless"}
        assert evaluation.report_of(name)["contender"] == name
    assert read_report(fixtures / "evaluation.json") == evaluation.report


def test_todays_writer_writes_what_it_read(fixtures, tmp_path, gen):
    evaluation = read_evaluation_file(fixtures / "evaluation.json")
    write_evaluation_file(tmp_path / "again.json", evaluation)
    assert gen.read_json(tmp_path / "again.json") == gen.read_json(fixtures / "evaluation.json")


def test_todays_evaluation_uses_the_same_names(regenerated, fixtures, gen):
    stored = gen.read_json(fixtures / "evaluation.json")
    assert gen.name_paths(regenerated) == gen.name_paths(stored)


def test_todays_evaluation_gives_the_same_file(regenerated, fixtures, gen):
    # The packages draft under a fixed policy, so every count repeats (timings normalised).
    require_recorded_cpu_kind()
    assert regenerated == gen.read_json(fixtures / "evaluation.json")
