"""The target's greedy answers to chat-templated prompts: the slow, sequential half of
teacher data, kept apart so it can run wherever decoding is cheap.

It needs only torch and transformers (no specops settings or stores), so the same module
runs on a bare GPU box: ``python -m tasks.train.teacher_answers PROMPTS.jsonl ANSWERS.jsonl
--model DIR [--gguf-file NAME]``. ``PROMPTS.jsonl`` holds ``{"id", "token_ids"}`` lines (see
``specops teacher prompts``); each output line is ``{"id", "answer_ids"}``, the greedy answer
cut after the first EOS (kept). :func:`tasks.train.teacher_build.build_teacher_cache` takes
these answers instead of generating its own, and then only runs the teacher-forced pass.

Prompts are answered shortest first (similar lengths share a batch), each batch appended to
a hidden partial file that is renamed into place at the end; a re-run with ``--resume``
keeps the answers already in an interrupted run's partial file.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel


@torch.inference_mode()
def greedy_answers(
    target: PreTrainedModel,
    prompts: Sequence[list[int]],
    *,
    max_new_tokens: int,
    eos_token_ids: Sequence[int],
    pad_token_id: int,
) -> list[list[int]]:
    """The target's greedy answers to ``prompts`` in one left-padded batch, cut after the
    first EOS (kept)."""
    from transformers import GenerationConfig

    device = next(target.parameters()).device
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.int64)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.int64)
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt) :] = torch.tensor(prompt)
        attention_mask[row, width - len(prompt) :] = 1
    generation = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=list(eos_token_ids) or None,
        pad_token_id=pad_token_id,
    )
    out = target.generate(  # type: ignore[operator]  # transformers' GenerationMixin
        input_ids.to(device),
        attention_mask=attention_mask.to(device),
        generation_config=generation,
    )  # [batch, width + new]
    eos = set(eos_token_ids)
    answers = []
    for row in out[:, width:].tolist():
        cut = next((i + 1 for i, token in enumerate(row) if token in eos), len(row))
        answers.append(row[:cut])
    return answers


def read_jsonl(path: Path, keys: tuple[str, ...]) -> list[dict]:
    """Lines of ``path`` as dicts holding ``keys``; a ``ValueError`` names the first bad line."""
    rows = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number} is not JSON ({exc})") from exc
            missing = [k for k in keys if k not in row]
            if missing:
                raise ValueError(f"{path}:{number} lacks {missing}")
            rows.append(row)
    return rows


def write_answers(
    answer: Callable[[list[list[int]]], list[list[int]]],
    prompts: Sequence[dict],
    out: Path,
    *,
    batch_size: int,
    resume: bool = False,
    key: str = "",
    progress: bool = True,
) -> int:
    """Answer every prompt (``{"id", "token_ids"}``) into the JSONL file ``out``, ``answer``
    taking ``batch_size`` prompts' token ids at a time (:func:`greedy_answers` here, the lean
    step's packed batches in :mod:`tasks.train.lean_answers`); the number of answer tokens
    generated in this run. ``key`` names the settings the answers depend on: an interrupted
    run's partial file is resumed only by a run with the same key."""
    from tqdm.auto import tqdm

    partial = out.with_name(f".{out.name}{'.' + key if key else ''}.partial")
    done: set[str] = set()
    if resume and partial.is_file():
        done = {row["id"] for row in read_jsonl(partial, ("id", "answer_ids"))}
    todo = [p for p in prompts if p["id"] not in done]
    # Similar lengths share a batch: less padding, and the answers do not depend on it.
    todo.sort(key=lambda p: len(p["token_ids"]))
    generated = 0
    with (
        partial.open("a" if done else "w", encoding="utf-8") as handle,
        tqdm(total=len(prompts), initial=len(done), desc="answers", disable=not progress) as bar,
    ):
        for start in range(0, len(todo), batch_size):
            batch = todo[start : start + batch_size]
            answers = answer([list(p["token_ids"]) for p in batch])
            for prompt, answer_ids in zip(batch, answers, strict=True):
                handle.write(json.dumps({"id": prompt["id"], "answer_ids": answer_ids}) + "\n")
            handle.flush()
            generated += sum(map(len, answers))
            bar.update(len(batch))
        os.fsync(handle.fileno())
    # Appended to as it goes (a killed run resumes from it), so not serving.atomic's
    # write-then-rename; renamed whole once every answer is in.
    os.replace(partial, out)
    return generated


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tasks.train.teacher_answers", description=__doc__
    )
    parser.add_argument("prompts", type=Path, help="JSONL of {id, token_ids}")
    parser.add_argument("out", type=Path, help="JSONL of {id, answer_ids} to write")
    parser.add_argument("--model", type=Path, required=True, help="a local HF model folder")
    parser.add_argument("--gguf-file", default=None, help="a GGUF file inside --model")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--eos", type=int, action="append", required=True, help="EOS id(s)")
    parser.add_argument("--pad", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--resume", action="store_true")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    from accelerate import PartialState
    from transformers import AutoModelForCausalLM

    args = _parse(argv)
    if args.max_new_tokens < 1 or args.batch_size < 1:
        print("--max-new-tokens and --batch-size must be >= 1", file=sys.stderr)
        return 2
    prompts = read_jsonl(args.prompts, ("id", "token_ids"))
    if not prompts:
        print(f"{args.prompts} holds no prompts", file=sys.stderr)
        return 2
    # Exact fp32 on every device: the answers must be the target's own greedy ones.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = PartialState().device
    model = AutoModelForCausalLM.from_pretrained(
        args.model, gguf_file=args.gguf_file, dtype=torch.float32
    ).to(device)
    model.eval()
    started = time.perf_counter()
    answer = functools.partial(
        greedy_answers,
        model,
        max_new_tokens=args.max_new_tokens,
        eos_token_ids=args.eos,
        pad_token_id=args.pad,
    )
    generated = write_answers(
        answer, prompts, args.out, batch_size=args.batch_size, resume=args.resume
    )
    seconds = time.perf_counter() - started
    print(
        f"{generated} answer tokens for {len(prompts)} prompts on {device} in {seconds:.0f} s "
        f"({generated / max(seconds, 1e-9):.0f} tok/s) -> {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
