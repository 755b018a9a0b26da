"""``specops teacher ...``: teacher caches, the target's own answers that drafts train on.

Thin: options are checked before any model loads; the work is in
:mod:`tasks.train.teacher_build` and :mod:`tasks.train.teacher_answers`. The learning curves
of the draft designs, which train on these caches, are a study outside the product:
``python -m benchmarks.draft_curves`` (docs/learning-curves.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from serving.defaults import DEFAULT_TARGET
from serving.hardware import DEFAULT_HARDWARE
from specops.exit import fail
from specops.load import tokenizer_of
from specops.options import Hardware, Target, Threads

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from tasks.train.teacher_build import TeacherPrompt

teacher_app = typer.Typer(
    help="Teacher caches: the target's own greedy answers with features and top-k log-probs.",
    no_args_is_help=True,
)


def _sharegpt(
    tokenizer: PreTrainedTokenizerBase,
    n: int | None,
    split: str,
    max_prompt_tokens: int,
    seed: int,
    reserved: set[str] | None = None,
) -> list[TeacherPrompt]:
    """ShareGPT first turns of ``split`` that fit ``max_prompt_tokens``, chat-templated, in
    the seeded order (the first ``n``, or all), less those made from ``reserved`` sources
    (:mod:`tasks.train.base_corpus`)."""
    from tasks.data.prompts import as_split
    from tasks.data.sharegpt import sharegpt_available, sharegpt_prompts
    from tasks.train.teacher_build import encode_traffic

    selector = as_split(split)
    if max_prompt_tokens < 1:
        raise _bad(f"--max-prompt-tokens must be >= 1, got {max_prompt_tokens}")
    chars = 4 * max_prompt_tokens  # a token rarely holds more than ~4 characters
    available = sharegpt_available(selector, chars)
    if not available:
        raise _bad(f"no ShareGPT {split} prompt fits --max-prompt-tokens {max_prompt_tokens}")
    candidates = sharegpt_prompts(available, seed=seed, split=selector, max_prompt_chars=chars)
    if reserved:
        from tasks.train.base_corpus import corpus_prompts

        candidates = corpus_prompts(candidates, reserved)
    picked = encode_traffic(tokenizer, candidates, max_prompt_tokens=max_prompt_tokens)
    if n is not None and n > len(picked):
        raise _bad(f"asked for {n} prompts but only {len(picked)} ShareGPT {split} prompts fit")
    return picked if n is None else picked[:n]


def _bad(message: str):
    from serving.errors import BadInputError

    return BadInputError(message)


@teacher_app.command("prompts")
def teacher_prompts(
    out: Annotated[Path, typer.Option(help="JSONL of {id, token_ids} to write.")],
    prompts: Annotated[int | None, typer.Option(help="How many (default: all that fit).")] = None,
    split: Annotated[str, typer.Option(help="ShareGPT split: train | heldout.")] = "train",
    max_prompt_tokens: Annotated[int, typer.Option(help="Longest prompt kept.")] = 128,
    seed: Annotated[int, typer.Option(help="Prompt-order seed.")] = 0,
    reserve: Annotated[
        int,
        typer.Option(
            help="Leave out the first N training prompts the product draws (sharegpt and "
            "grounded, under each --reserve-seed): a base head's corpus."
        ),
    ] = 0,
    reserve_seed: Annotated[
        list[int] | None, typer.Option(help="A seed the product draws with (default 0 and 7).")
    ] = None,
    target: Annotated[
        str, typer.Option(help="smollm2 or a local HF model folder.")
    ] = DEFAULT_TARGET,
) -> None:
    """Write chat-templated ShareGPT prompts for `specops teacher answers` or `python -m
    tasks.train.teacher_answers` (which can run on any machine with torch and
    transformers, a GPU box included)."""
    from serving.atomic import write_jsonl_atomic
    from serving.errors import SpecOpsError
    from serving.hardware import engine_target
    from serving.loader import load_target
    from tasks.train.base_corpus import reserved_sources

    try:
        reserved = reserved_sources(reserve, reserve_seed or [0, 7])
        tokenizer = tokenizer_of(load_target(target, engine_target("cpu-stock")))
        picked = _sharegpt(tokenizer, prompts, split, max_prompt_tokens, seed, reserved)
    except SpecOpsError as error:
        fail(str(error))
    count = write_jsonl_atomic(out, ({"id": p.id, "token_ids": p.token_ids} for p in picked))
    kept_out = f", {len(reserved)} sources reserved" if reserved else ""
    typer.echo(
        f"{count} prompts ({sum(len(p.token_ids) for p in picked)} tokens{kept_out}) -> {out}"
    )


@teacher_app.command("answers")
def teacher_answers(
    prompts: Annotated[Path, typer.Option(help="JSONL of {id, token_ids} (teacher prompts).")],
    out: Annotated[Path, typer.Option(help="JSONL of {id, answer_ids} to write.")],
    hardware: Hardware = "cpu-int4",
    threads: Threads = 2,
    max_new_tokens: Annotated[int, typer.Option(help="Answer length (or EOS).")] = 256,
    sequences: Annotated[int, typer.Option(help="Requests sharing a packed pass.")] = 32,
    batch: Annotated[int, typer.Option(help="Prompts per appended chunk.")] = 256,
    resume: Annotated[
        bool, typer.Option(help="Keep the answers an interrupted run appended.")
    ] = True,
    target: Target = DEFAULT_TARGET,
) -> None:
    """The serving target's greedy answers on HARDWARE, in the lean step's packed batches
    (equal to what it serves, token for token), appended as they come: an interrupted run
    resumes where it stopped."""
    import functools
    import hashlib
    import time

    from serving.curves import BatchLimits
    from serving.errors import SpecOpsError
    from serving.hardware import engine_target
    from serving.loader import load_target, set_threads
    from tasks.train.lean_answers import lean_answers
    from tasks.train.teacher_answers import write_answers

    try:
        for name, value in (("--max-new-tokens", max_new_tokens), ("--sequences", sequences)):
            if value < 1:
                raise _bad(f"{name} must be >= 1, got {value}")
        if batch < 1:
            raise _bad(f"--batch must be >= 1, got {batch}")
        rows = _rows(prompts, ("id", "token_ids"))
        if not rows:
            raise _bad(f"{prompts} holds no prompts")
        set_threads(threads)
        loaded = load_target(target, engine_target(hardware))
        limits = BatchLimits(max_sequences=sequences, max_tokens_per_pass=max(512, 16 * sequences))
        answer = functools.partial(
            lean_answers, loaded, max_new_tokens=max_new_tokens, limits=limits
        )
        started = time.perf_counter()
        # Answers depend on the target, its hardware and the length: nothing else resumes.
        key = hashlib.sha256(f"{target}|{hardware}|{max_new_tokens}".encode()).hexdigest()[:12]
        generated = write_answers(answer, rows, out, batch_size=batch, resume=resume, key=key)
    except SpecOpsError as error:
        fail(str(error))
    seconds = time.perf_counter() - started
    typer.echo(
        f"{generated} answer tokens in this run for {len(rows)} prompts on {hardware} in "
        f"{seconds:.0f} s ({generated / max(seconds, 1e-9):.0f} tok/s) -> {out}"
    )


@teacher_app.command("build")
def teacher_build(
    out: Annotated[Path, typer.Option(help="The teacher cache folder (resumable).")],
    prompts: Annotated[
        Path | None, typer.Option(help="JSONL of {id, token_ids} (default: ShareGPT).")
    ] = None,
    answers: Annotated[
        Path | None,
        typer.Option(
            help="JSONL of {id, answer_ids} from tasks.train.teacher_answers: skip generating."
        ),
    ] = None,
    count: Annotated[
        int | None, typer.Option("--count", help="Use only the first N prompts.")
    ] = None,
    split: Annotated[str, typer.Option(help="ShareGPT split without --prompts.")] = "train",
    max_prompt_tokens: Annotated[int, typer.Option(help="Longest ShareGPT prompt kept.")] = 128,
    max_new_tokens: Annotated[int, typer.Option(help="Answer length (or EOS).")] = 256,
    seed: Annotated[int, typer.Option(help="Prompt-order seed.")] = 0,
    threads: Annotated[int, typer.Option(help="torch threads.")] = 2,
    hardware: Hardware = DEFAULT_HARDWARE,
    target: Annotated[
        str, typer.Option(help="smollm2 or a local HF model folder.")
    ] = DEFAULT_TARGET,
) -> None:
    """Build (or resume) a teacher cache: the target's greedy answers, then one
    teacher-forced pass recording features and top-k log-probabilities, on HARDWARE's lean
    step where it has one (the features the head drafter reads there), recorded in the
    cache's manifest."""
    from serving.errors import SpecOpsError
    from serving.hardware import engine_target
    from serving.loader import load_target, set_threads
    from tasks.train.teacher import TeacherConfig
    from tasks.train.teacher_build import TeacherPrompt, build_teacher_cache

    try:
        if count is not None and count < 1:
            raise _bad(f"--count must be >= 1, got {count}")
        config = TeacherConfig(max_new_tokens=max_new_tokens)
        given = None
        if answers is not None:
            given = {row["id"]: row["answer_ids"] for row in _rows(answers, ("id", "answer_ids"))}
        set_threads(threads)
        loaded = load_target(target, engine_target(hardware))
        tokenizer = tokenizer_of(loaded)
        if prompts is not None:
            chosen = [
                TeacherPrompt(row["id"], list(row["token_ids"]))
                for row in _rows(prompts, ("id", "token_ids"))
            ]
        else:
            chosen = _sharegpt(tokenizer, None, split, max_prompt_tokens, seed)
        chosen = chosen[:count] if count is not None else chosen
        report = build_teacher_cache(
            loaded,
            chosen,
            out,
            eos_token_ids=list(loaded.eos_token_ids),
            pad_token_id=tokenizer.pad_token_id,
            config=config,
            answers=given,
        )
    except SpecOpsError as error:
        fail(str(error))
    typer.echo(
        f"teacher cache {out}: {report.sequences} sequences, {report.tokens} tokens "
        f"({report.shards_written} shards written, {report.shards_skipped} kept); "
        f"generate {report.generate_tokens_per_s or 0:.0f} tok/s, teacher-forced "
        f"{report.forward_tokens_per_s or 0:.0f} tok/s"
    )


def _rows(path: Path, keys: tuple[str, ...]) -> list[dict]:
    from tasks.train.teacher_answers import read_jsonl

    if not path.is_file():
        raise _bad(f"{path} does not exist")
    try:
        return read_jsonl(path, keys)
    except ValueError as error:
        raise _bad(str(error)) from None


@teacher_app.command("score")
def teacher_score(
    head: Annotated[Path, typer.Option(help="A head folder or a head draft package.")],
    teacher: Annotated[Path, typer.Option(help="A teacher cache of held-out prompts.")],
    k: Annotated[int, typer.Option("--k", help="Drafts per step in the replay.")] = 4,
    out: Annotated[Path | None, typer.Option(help="Write the score as JSON here.")] = None,
    hardware: Annotated[
        str | None,
        typer.Option(
            help="Draft on this target's lean head step (default: the one whose features "
            "the cache holds; cpu-stock: the float head)."
        ),
    ] = None,
    threads: Threads = 2,
    target: Target = DEFAULT_TARGET,
) -> None:
    """Score a head on a teacher cache: top-1 agreement with the target's greedy answers and
    the mean accepted length replayed at K drafts a step."""
    from serving.atomic import write_text_atomic
    from serving.errors import SpecOpsError
    from serving.hardware import engine_target
    from serving.loader import load_target, set_threads
    from tasks.evaluate.head_score import head_folder, score_head
    from tasks.train.teacher import read_manifest

    try:
        head_folder(head)  # a wrong path fails before the model loads
        manifest = read_manifest(teacher) if teacher.is_dir() else None
        if manifest is None:
            raise _bad(f"no teacher cache at {teacher}; build it with `specops teacher build`")
        chosen = hardware or str(manifest.target.get("hardware", "cpu-stock"))
        set_threads(threads)
        score = score_head(head, teacher, load_target(target, engine_target(chosen)), k=k)
    except SpecOpsError as error:
        fail(str(error))
    if out is not None:
        write_text_atomic(out, score.model_dump_json(indent=2) + "\n")
    typer.echo(
        f"{head}: agreement {_share(score.agreement)}, mean accepted length "
        f"{_share(score.mean_accepted_length)} at k = {k} over {score.positions} answer "
        f"positions of {score.sequences} sequences ({score.drafted_by}; features from "
        f"{score.features_from})"
    )


@teacher_app.command("ship")
def teacher_ship(
    package: Annotated[Path, typer.Option(help="The base-head stage's head draft package.")],
    teacher: Annotated[Path, typer.Option(help="The teacher cache it trained on.")],
    score: Annotated[Path, typer.Option(help="Its held-out score (specops teacher score).")],
    out: Annotated[Path, typer.Option(help="The shipped folder to write (heads/base-HW).")],
) -> None:
    """Write a trained head as a shipped folder: its weights in bfloat16 and a manifest of
    their sha256, the corpus, its steps and seconds, the commit and its held-out score."""
    from serving.errors import SpecOpsError
    from tasks.evaluate.ship_head import WEIGHTS_FILE, ship_head

    try:
        shipped = ship_head(package, teacher, score, out)
    except SpecOpsError as error:
        fail(str(error))
    size = (out / "head" / WEIGHTS_FILE).stat().st_size / 1e6
    typer.echo(
        f"shipped {out}: {size:.1f} MB of weights, {shipped.steps} steps on "
        f"{shipped.corpus.tokens} tokens, held-out agreement "
        f"{_share(shipped.heldout.agreement)}, mean accepted length "
        f"{_share(shipped.heldout.mean_accepted_length)} at k = {shipped.heldout.k}"
    )


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"
