"""Grounded traffic: edit/rewrite/annotate requests whose answer copies large spans of input.

The source texts are ShareGPT replies (to fix or repeat) and HumanEval code (to annotate):
the traffic where n-gram / prompt-lookup drafting pays. A grounded prompt inherits the split
of the prompt whose reference text it reuses, so the same text never lands in both splits.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Literal

from serving.errors import BadInputError
from tasks.data.humaneval import humaneval_problems
from tasks.data.prompts import (
    Prompt,
    SplitSelector,
    check_n,
    check_split,
    in_split,
    normalised,
    seeded_order,
    split_of,
)
from tasks.data.sharegpt import sharegpt_id, unique_sharegpt_pairs

# ShareGPT replies reused as grounded source texts: long enough to be worth copying, short
# enough that the prompt plus the copied answer fit a small model's context.
GROUNDED_TEXT_MIN_CHARS = 300
GROUNDED_TEXT_MAX_CHARS = 1500


@dataclass(frozen=True)
class _Template:
    name: str
    kind: Literal["text", "code"]
    instruction: str  # formatted with {source}


# Cycled in this order. Each answer copies most of its input.
GROUNDED_TEMPLATES = (
    _Template(
        "fix-grammar",
        "text",
        "Rewrite the following text, fixing grammar and spelling mistakes and keeping "
        "everything else unchanged:\n\n{source}",
    ),
    _Template(
        "docstring-types",
        "code",
        "Add a docstring and type hints to this function, repeating the code:\n\n"
        "```python\n{source}\n```",
    ),
    _Template(
        "repeat-summarise",
        "text",
        "Repeat the following text exactly, then summarise it in one sentence:\n\n{source}",
    ),
    _Template(
        "comment-code",
        "code",
        "Repeat this Python code exactly, adding a short comment above each line that is "
        "not obvious:\n\n```python\n{source}\n```",
    ),
)


@dataclass(frozen=True)
class _Source:
    id: str  # the prompt whose reference text this is; its split is inherited
    text: str


def _text_sources(split: SplitSelector) -> list[_Source]:
    seen: set[str] = set()
    sources = []
    for pair in unique_sharegpt_pairs():
        source_id = sharegpt_id(pair)
        key = normalised(pair.gpt)
        if (
            GROUNDED_TEXT_MIN_CHARS <= len(pair.gpt) <= GROUNDED_TEXT_MAX_CHARS
            and key not in seen
            and in_split(source_id, split)
        ):
            seen.add(key)
            sources.append(_Source(source_id, pair.gpt))
    return sources


def _code_sources(split: SplitSelector) -> list[_Source]:
    sources = []
    for problem in humaneval_problems():
        source_id = f"humaneval:{problem['task_id']}"
        if in_split(source_id, split):
            code = (problem["prompt"] + problem["canonical_solution"]).strip("\n")
            sources.append(_Source(source_id, code))
    return sources


def strip_docstrings(code: str) -> str:
    """``code`` with every function's docstring removed (left as is if it does not parse)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return code
    drop: set[int] = set()  # 0-based line numbers
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and len(node.body) > 1:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
                and first.end_lineno is not None
            ):
                drop.update(range(first.lineno - 1, first.end_lineno))
    lines = code.splitlines()
    return "\n".join(line for number, line in enumerate(lines) if number not in drop)


def grounded_prompts(n: int, *, seed: int, split: SplitSelector = "heldout") -> list[Prompt]:
    """``n`` input-grounded edit prompts cycling through :data:`GROUNDED_TEMPLATES`.

    Text templates use ShareGPT replies of moderate length, code templates HumanEval
    prompt + canonical solution; each source text is used at most once per workload. When
    one kind runs out (HumanEval has 164 problems) the cycle continues with the other.
    """
    check_n(n)
    check_split(split)
    pools = {"text": _text_sources(split), "code": _code_sources(split)}
    available = sum(len(pool) for pool in pools.values())
    if n > available:
        raise BadInputError(
            f"asked for n={n} grounded prompts but split {split!r} has only {available} "
            "source texts; ask for fewer or choose another split"
        )
    queues = {
        kind: [pool[i] for i in reversed(seeded_order([s.id for s in pool], seed, kind))]
        for kind, pool in pools.items()
    }  # reversed so that pop() yields the best-ranked first
    prompts: list[Prompt] = []
    templates = list(GROUNDED_TEMPLATES)
    slot = 0
    while len(prompts) < n:
        template = templates[slot % len(templates)]
        queue = queues[template.kind]
        if not queue:
            templates = [t for t in templates if t.kind != template.kind]
            continue
        source = queue.pop()
        text = strip_docstrings(source.text) if template.name == "docstring-types" else source.text
        prompts.append(
            Prompt(
                id=f"grounded-{template.name}:{source.id}",
                workload="grounded",
                messages=[{"role": "user", "content": template.instruction.format(source=text)}],
                reference=text,
                split=split_of(source.id),
            )
        )
        slot += 1
    return prompts
