"""``specops generate``: one prompt decoded speculatively, streamed, then its statistics
(with ``--skeleton``, answered skeleton-of-thought: :mod:`tasks.bench.skeleton`)."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from serving.defaults import DEFAULT_K, DEFAULT_POLICY, DEFAULT_TARGET
from serving.hardware import DEFAULT_HARDWARE
from specops.exit import fail, failing
from specops.load import decode_text, draft_plan, load_engine_target, tokenizer_of
from specops.options import Drafter, Hardware, Policy, Target, Threads

if TYPE_CHECKING:
    from serving.engine.drafters.plan import Plan
    from serving.engine.sampling import SamplingParams
    from serving.target import LoadedTarget


def format_stats(stats: dict[str, Any]) -> str:
    """A request's statistics (``GenerationStats.to_dict()``) as three lines."""

    def fmt(value: float | None, spec: str = ".3f") -> str:
        return "n/a" if value is None else format(value, spec)

    by_position = ", ".join(fmt(v, ".2f") for v in stats["acceptance_by_position"]) or "n/a"
    return (
        f"tokens: {stats['generated_tokens']} in {stats['checks']} target passes | "
        f"{fmt(stats['tokens_per_s'], '.1f')} tok/s | acceptance {fmt(stats['acceptance_rate'])}"
        f" | mean accepted length {fmt(stats['mean_accepted_length'], '.2f')}\n"
        f"acceptance by position: [{by_position}]\n"
        f"time: prefill {stats['prefill_s']:.3f}s, draft {stats['draft_s']:.3f}s, "
        f"verify {stats['verify_s']:.3f}s, total {stats['total_s']:.3f}s"
    )


def generate(
    prompt: Annotated[str, typer.Argument(help="The prompt text.")],
    drafter: Drafter = "pld",
    k: Annotated[
        int,
        typer.Option("--k", help="Draft tokens per step (fixed), start (adaptive), max (cost)."),
    ] = DEFAULT_K,
    policy: Policy = DEFAULT_POLICY,
    max_new_tokens: Annotated[int, typer.Option(help="Token budget.")] = 128,
    temperature: Annotated[float, typer.Option(help="0 = greedy.")] = 0.0,
    top_k: Annotated[int, typer.Option(help="0 disables.")] = 0,
    top_p: Annotated[float, typer.Option(help="1.0 disables.")] = 1.0,
    seed: Annotated[int | None, typer.Option(help="Seed for sampling.")] = None,
    mode: Annotated[str, typer.Option(help="fast | detailed (records disagreements).")] = "fast",
    chat: Annotated[bool, typer.Option("--chat/--no-chat", help="Apply the chat template.")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    threads: Threads = 2,
    target: Target = DEFAULT_TARGET,
    hardware: Hardware = DEFAULT_HARDWARE,
    cascade: Annotated[
        str | None,
        typer.Option(
            help="A draft cascade instead of --drafter: stages in order, e.g. suffix,pld:3."
        ),
    ] = None,
    predictor: Annotated[
        str | None, typer.Option(help="The cascade's acceptance predictor folder.")
    ] = None,
    relax_lambda: Annotated[
        float | None,
        typer.Option(
            "--lambda",
            help="Relaxed verification (opt-in, greedy): keep a disagreeing draft when λ x its "
            "log-probability gap < the passes it saves. Default: lossless.",
        ),
    ] = None,
    skeleton: Annotated[
        bool,
        typer.Option(
            "--skeleton",
            help="Skeleton-of-thought: a constrained plan, then its points decoded as one "
            "batch and merged (docs/skeleton.md); --max-new-tokens bounds each point.",
        ),
    ] = False,
) -> None:
    """Generate text for PROMPT with speculative decoding; print the text and the stats."""
    from serving.engine.build import build_decoder
    from serving.engine.decoder import MODES
    from serving.engine.relaxed import check_lambda
    from serving.engine.sampling import SamplingParams
    from serving.hardware import engine_target
    from serving.loader import encode_prompt

    with failing():
        # Every option is checked before any model is loaded.
        if not prompt.strip():
            fail("the prompt is empty; give some text")
        if mode not in MODES:
            fail(f"unknown mode {mode!r}; choose one of {MODES}")
        if max_new_tokens < 1:
            fail(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
        check_lambda(relax_lambda)
        engine = engine_target(hardware)
        plan = draft_plan(
            drafter, policy=policy, k=k, hardware=engine, cascade=cascade, predictor=predictor
        )
        if skeleton and not chat:
            fail("--skeleton needs the chat template (drop --no-chat)")
        loaded = load_engine_target(target, engine, threads)
        if skeleton:
            _generate_skeleton(
                loaded, plan, relax_lambda, prompt, max_new_tokens, sampling, as_json
            )
            return
        tokenizer = tokenizer_of(loaded)
        prompt_ids = encode_prompt(tokenizer, prompt, chat=chat)
        decoder = build_decoder(loaded, plan, relax_lambda=relax_lambda)
        generation = decoder.stream(
            prompt_ids, max_new_tokens=max_new_tokens, sampling=sampling, mode=mode
        )
        shown = ""
        ids: list[int] = []
        for event in generation:
            ids.append(event.token_id)
            if not as_json:
                text = decode_text(tokenizer, ids)
                sys.stdout.write(text[len(shown) :])
                sys.stdout.flush()
                shown = text
        result = generation.result
    assert result is not None
    text = decode_text(tokenizer, result.token_ids)
    stats = result.stats.to_dict()
    if as_json:
        payload = {
            "text": text,
            "token_ids": result.token_ids,
            "from_draft": result.from_draft,
            "unverified": result.unverified,
            "stop_reason": result.stop_reason,
            "stats": stats,
            "drafter": decoder.describe(),
            "threads": threads,
        }
        if result.record is not None:
            payload["record"] = result.record.to_dict()
        typer.echo(json.dumps(payload))
        return
    typer.echo("")
    typer.echo("---", err=True)
    typer.echo(format_stats(stats), err=True)
    if result.unverified:
        typer.echo(
            f"kept unverified (relaxed, λ={relax_lambda}): {len(result.unverified)} tokens at "
            f"positions {result.unverified[:20]}",
            err=True,
        )
    if result.record is not None:
        typer.echo(f"disagreements recorded: {len(result.record.disagreements)}", err=True)


def _generate_skeleton(
    target: LoadedTarget,
    plan: Plan,
    relax_lambda: float | None,
    prompt: str,
    max_new_tokens: int,
    sampling: SamplingParams,
    as_json: bool,
) -> None:
    from serving.engine.build import build_decoder
    from tasks.bench.skeleton import answer_question, answer_summary, truncated_points

    answer = answer_question(
        target,
        lambda: build_decoder(target, plan, relax_lambda=relax_lambda),
        prompt,
        max_tokens=max_new_tokens,
        sampling=sampling,
    )
    if as_json:
        typer.echo(json.dumps(answer_summary(answer)))
        return
    typer.echo(answer.text)
    typer.echo("---", err=True)
    typer.echo(f"skeleton: {answer.skeleton_text!r}", err=True)
    cut = truncated_points(answer)
    typer.echo(
        f"{answer.completion_tokens} tokens; skeleton {answer.skeleton_s:.2f} s, answer "
        f"{answer.answer_s:.2f} s" + (f"; points {cut} hit --max-new-tokens" if cut else ""),
        err=True,
    )
