"""Real-model smoke run of the feature-level draft head (writes results/head/smoke.json).

Teacher data from SmolLM2-135M-Instruct's own greedy answers to real ShareGPT prompts
(train split; a second, small cache from held-out prompts for evaluation), a short training
run, held-out top-1 agreement, the head's draft cost relative to a target step, and a short
end-to-end speculative run. Every stage is resumable (re-running skips finished work).

    .venv/bin/python scripts/head_smoke.py --prompts 20 --new-tokens 64 --steps 200
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch


def _median_s(run, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


@torch.inference_mode()
def draft_cost(target, head, prompt: list[int], repeats: int = 30) -> dict[str, float]:
    """Median seconds of one target step (one token, warm cache) and of one head draft
    step (feed one pair + output layer), and their ratio."""
    from serving.drafters.base import DraftRequest
    from serving.drafters.head import HeadDrafter
    from serving.kv import cache_length, new_cache, rewind
    from serving.sampling import make_sampler

    cache = new_cache(target)
    out = target(
        input_ids=torch.tensor([prompt[:-1]]),
        past_key_values=cache,
        use_cache=True,
        output_hidden_states=True,
    )
    base = cache_length(cache)
    last = torch.tensor([[prompt[-1]]])

    def target_step() -> None:
        target(input_ids=last, past_key_values=cache, use_cache=True)
        rewind(cache, base)

    drafter = HeadDrafter(head, target)
    drafter.begin(prompt)
    drafter.prefill(out.hidden_states[-1][0])
    assert drafter._cache is not None and drafter._tail is not None
    fed = drafter._fed
    token = torch.tensor([prompt[-1]])

    def head_step() -> None:
        feature = drafter._feed(drafter._tail[None], token)[0]  # type: ignore[index]
        drafter._full_logits(drafter._logits_layer(feature)).argmax()
        rewind(drafter._cache, fed)  # type: ignore[arg-type]

    def propose(k: int):
        def run() -> None:
            drafter.propose(DraftRequest(prompt, k, greedy))
            rewind(drafter._cache, fed)  # type: ignore[arg-type]

        return run

    greedy = make_sampler()
    for _ in range(5):  # warm-up
        target_step()
        head_step()
        propose(5)()
    target_s = _median_s(target_step, repeats)
    head_s = _median_s(head_step, repeats)
    # The marginal cost of one more draft through propose() (feed + logits + softmax).
    marginal_s = (_median_s(propose(5), repeats) - _median_s(propose(1), repeats)) / 4
    return {
        "target_step_s": target_s,
        "head_step_s": head_s,
        "ratio": head_s / target_s,
        "propose_marginal_s": marginal_s,
        "propose_ratio": marginal_s / target_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--heldout-prompts", type=int, default=6)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--max-seq-len", type=int, default=128)
    parser.add_argument("--draft-vocab", type=int, default=8192)
    parser.add_argument("--intermediate-size", type=int, default=1536)
    parser.add_argument("--second-step-weight", type=float, default=0.5)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("results/head"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from serving.drafters.head import HeadDrafter
    from serving.engine import SpeculativeDecoder
    from serving.loader import eos_ids, load_target
    from serving.models.head import DraftHead, head_config_for, load_head
    from serving.policy import FixedK
    from tasks.teacher import (
        TeacherConfig,
        build_teacher_cache,
        encode_traffic,
        sharegpt_teacher_prompts,
    )
    from tasks.traffic import sharegpt_prompts
    from tasks.train_head import TrainHeadConfig, evaluate_head, train_head

    timings: dict[str, float] = {}
    started = time.perf_counter()
    target, tokenizer = load_target()  # oneDNN-packed, as served
    eos = eos_ids(target, tokenizer)
    timings["load_s"] = time.perf_counter() - started

    teacher_config = TeacherConfig(max_new_tokens=args.new_tokens, shard_size=8)
    started = time.perf_counter()
    train_prompts = sharegpt_teacher_prompts(tokenizer, args.prompts, max_prompt_tokens=256)
    train_report = build_teacher_cache(
        target, train_prompts, args.out / "teacher-train", eos_token_ids=eos, config=teacher_config
    )
    heldout = encode_traffic(
        tokenizer,
        sharegpt_prompts(args.heldout_prompts * 2, seed=0, split="heldout", max_prompt_chars=1000),
        max_prompt_tokens=256,
    )[: args.heldout_prompts]
    heldout_report = build_teacher_cache(
        target, heldout, args.out / "teacher-heldout", eos_token_ids=eos, config=teacher_config
    )
    timings["teacher_s"] = time.perf_counter() - started

    config = TrainHeadConfig(
        teacher_dir=args.out / "teacher-train",
        output_dir=args.out / "run",
        max_steps=args.steps,
        batch_size=args.batch_size,
        max_seq_len=args.max_seq_len,
        learning_rate=args.learning_rate,
        intermediate_size=args.intermediate_size,
        draft_vocab_size=args.draft_vocab or None,
        second_step_weight=args.second_step_weight,
        eval_fraction=0.1,
        eval_every=50,
        checkpoint_every=50,
    )
    started = time.perf_counter()
    result = train_head(config, target)
    timings["train_s"] = time.perf_counter() - started
    head = load_head(result.head_dir, target)
    heldout_metrics = evaluate_head(head, target, args.out / "teacher-heldout")

    prompt = heldout[0].token_ids
    torch.manual_seed(0)
    full_head = DraftHead(head_config_for(target, intermediate_size=args.intermediate_size))
    cost = {
        "trained_head": {"draft_vocab": args.draft_vocab, **draft_cost(target, head, prompt)},
        "full_vocab_head_untrained": {"draft_vocab": None, **draft_cost(target, full_head, prompt)},
    }

    started = time.perf_counter()
    end_to_end = {}
    for name, drafter, policy in (
        ("plain", None, None),
        ("head-k3", HeadDrafter(head, target), FixedK(3)),
    ):
        decoder = SpeculativeDecoder(target, drafter=drafter, policy=policy, eos_token_ids=eos)
        runs = [decoder.generate(p.token_ids, max_new_tokens=args.new_tokens) for p in heldout[:3]]
        tokens = sum(len(r.token_ids) for r in runs)
        seconds = sum(r.stats.total_s for r in runs)
        end_to_end[name] = {
            "tokens": tokens,
            "tokens_per_s": tokens / seconds,
            "draft_tokens": sum(r.stats.draft_tokens for r in runs),
            "accepted_tokens": sum(r.stats.accepted_tokens for r in runs),
            "outputs": [r.token_ids for r in runs],
        }
    same = end_to_end["plain"]["outputs"] == end_to_end["head-k3"]["outputs"]
    timings["end_to_end_s"] = time.perf_counter() - started

    summary = {
        "command": "scripts/head_smoke.py " + " ".join(f"--{k}={v}" for k, v in vars(args).items()),
        "threads": torch.get_num_threads(),
        "teacher_train": {
            "prompts": train_report.sequences,
            "tokens": train_report.tokens,
            "generate_tokens_per_s": train_report.generate_tokens_per_s,
            "forward_tokens_per_s": train_report.forward_tokens_per_s,
        },
        "teacher_heldout": {"prompts": heldout_report.sequences, "tokens": heldout_report.tokens},
        "train": {
            "steps": result.steps,
            "train_sequences": result.train_sequences,
            "in_cache_heldout_sequences": result.heldout_sequences,
            "tokens_per_s": result.train_tokens_per_s,
            "history": [vars(m) for m in result.history],
        },
        "heldout_sharegpt": vars(heldout_metrics),
        "draft_cost": cost,
        "end_to_end": {
            name: {k: v for k, v in run.items() if k != "outputs"}
            for name, run in end_to_end.items()
        },
        "greedy_outputs_identical": same,
        "timings": timings,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "smoke.json").write_text(json.dumps(summary, indent=2, default=str))
    print(json.dumps({k: summary[k] for k in ("heldout_sharegpt", "draft_cost")}, indent=2))
    print("greedy outputs identical:", same, "end to end:", summary["end_to_end"])


if __name__ == "__main__":
    main()
