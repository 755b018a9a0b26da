"""An evaluation prepared here, run "elsewhere" (the remote runner, on the tiny target in a
model folder), written as an evaluation file that the registry side reads back."""

import json
import subprocess
import sys

import pytest

from serving.errors import BadInputError
from tasks.evaluate.evaluation_file import read_evaluation_file
from tasks.evaluate.remote import main, read_bundle
from tests.tasks.evaluate.bundles import pld_bundle

pytestmark = pytest.mark.slow  # evaluation bundles run in fresh Python processes

MLOPS = ("mlflow", "prefect", "dvc", "great_expectations")


def test_the_remote_runner_imports_no_mlops_stack():
    code = (
        "import sys, tasks.evaluate.remote, tasks.evaluate.evaluation_file\n"
        f"print([m for m in {MLOPS!r} if any(k == m or k.startswith(m + '.') "
        "for k in sys.modules)])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_bundle_runs_elsewhere_and_comes_back_as_an_evaluation_file(
    registry, tmp_path, model_folder
):
    bundle, draft, prompts = pld_bundle(registry, model_folder, tmp_path, prompts=4)
    request, read = read_bundle(bundle)
    assert request["contenders"] == {"challenger-0": f"ngram/{draft.version}"}
    assert [p.token_ids for p in read] == [p.token_ids for p in prompts]
    out = tmp_path / "evaluation.json"
    assert (
        main([str(bundle), "--target", str(model_folder), "--out", str(out), "--threads", "1"]) == 0
    )
    evaluation = read_evaluation_file(out)
    assert evaluation.hardware == "cpu" and evaluation.prompts == 4
    assert evaluation.report.results["challenger-0"].lossless


def test_a_broken_bundle_is_refused_before_any_model_loads(tmp_path):
    (tmp_path / "request.json").write_text(json.dumps({"format": 9}))
    (tmp_path / "prompts.json").write_text("[]")
    with pytest.raises(BadInputError, match="format 9"):
        read_bundle(tmp_path)
    (tmp_path / "request.json").write_text(json.dumps({"format": 1, "contenders": {"x": "a/1"}}))
    with pytest.raises(BadInputError, match="lacks the draft package"):
        read_bundle(tmp_path)
