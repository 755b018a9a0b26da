"""Does a traffic-trained suffix corpus beat prompt lookup? Train on one split, measure on the
other.

1. Collect the target's own greedy outputs (drafter ``none``) on train-split prompts of a
   workload into a store (:func:`tasks.data.collect.collect`, the loop's collection path), in
   chunks until a time budget runs out; a re-run resumes where it stopped.
2. Build the suffix corpus from that store
   (:func:`tasks.train.suffix_index.build_suffix_index_from_store`).
3. On held-out prompts, interleaved per prompt (the order rotates, after one warm-up
   generation per method: :func:`tasks.evaluate.interleave.interleave`): plain greedy,
   prompt lookup, the suffix drafter without and with the corpus. Every output must equal
   plain greedy's token for token.

The result (per-method pooled acceptance, mean accepted length, tokens/s and its ratio to
plain greedy; every run) is written atomically as JSON; docs/training.md keeps it. Run it
from the repository root as ``python -m benchmarks.suffix_eval --help``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from benchmarks.cli import run_study
from serving.atomic import write_json_atomic
from serving.engine.build import build_decoder
from serving.engine.drafters.base import Drafter, DraftProposal, DraftRequest, StepFeedback
from serving.engine.drafters.plan import DEFAULT_K, DEFAULT_POLICY, DraftPlan
from serving.engine.metrics import RequestStats, pool
from serving.errors import BadInputError
from serving.hardware import DEFAULT_HARDWARE, engine_target
from serving.loader import encode_messages, set_threads
from serving.target import DEFAULT_TARGET, LoadedTarget
from tasks.evaluate.interleave import interleave

log = logging.getLogger(__name__)

BASELINE = "none"


@dataclass(frozen=True)
class SuffixEvalConfig:
    workload: str = "humaneval"
    train_prompts: int = 80
    heldout_prompts: int = 29  # every held-out HumanEval problem
    seed: int = 0
    max_new_tokens: int = 128
    k: int = DEFAULT_K  # the largest block the policy may ask for
    policy: str = DEFAULT_POLICY
    hardware: str = DEFAULT_HARDWARE
    threads: int = 1
    collect_budget_s: float = 600.0  # stop collecting train outputs after this long
    include_prompts: bool = False  # index each train prompt together with its output
    chunk_size: int = 8
    # name -> drafter spec; "{corpus}" is replaced by the corpus file
    methods: dict[str, str] = field(
        default_factory=lambda: {
            BASELINE: "none",
            "pld": "pld",
            "suffix-request": "suffix",
            "suffix-corpus": "suffix:{corpus}",
        }
    )


def collect_train_outputs(
    config: SuffixEvalConfig, *, target: LoadedTarget, store_root: Path, progress: bool = True
) -> dict[str, object]:
    """Greedy outputs of ``target`` on train prompts into ``store_root``; chunk by chunk
    until ``collect_budget_s`` runs out (finished chunks stay: a re-run skips them)."""
    from tasks.data.collect import collect
    from tasks.data.traffic import build_workload

    prompts = build_workload(config.workload, config.train_prompts, seed=config.seed, split="train")
    decoder = build_decoder(target)  # plain decoding
    started = time.perf_counter()
    done = 0
    for start in range(0, len(prompts), config.chunk_size):
        if time.perf_counter() - started > config.collect_budget_s:
            log.warning(
                "collection budget of %.0f s spent after %d of %d train prompts",
                config.collect_budget_s,
                done,
                len(prompts),
            )
            break
        chunk = prompts[start : start + config.chunk_size]
        collect(
            chunk,
            decoder=decoder,
            tokenizer=target.tokenizer,
            store_root=store_root,
            run_id=f"suffix-train-{config.workload}-s{config.seed}",
            hardware=target.hardware,
            max_new_tokens=config.max_new_tokens,
            chunk_size=config.chunk_size,
            progress=progress,
        )
        done += len(chunk)
    return {"prompts": done, "seconds": time.perf_counter() - started}


@dataclass(frozen=True)
class Replay:
    checks: int  # target passes the engine would make
    draft_tokens: int
    accepted_tokens: int

    @property
    def mean_accepted_length(self) -> float:
        return (self.accepted_tokens + self.checks) / self.checks if self.checks else 0.0


def replay_greedy(drafter: Drafter, prompt: list[int], output: list[int], k: int) -> Replay:
    """What a deterministic drafter with a fixed k would achieve on a recorded greedy
    output, without the model: each step keeps the drafts that match ``output`` and then
    the output's next token (the target's), exactly as the engine's greedy verify does.
    Cheap enough to compare drafter settings on collected traffic before timing them."""
    from serving.engine.sampling import make_sampler

    sampler = make_sampler()
    tokens = list(prompt)
    drafter.begin(list(prompt))
    position = checks = drafted = accepted = 0
    try:
        while position < len(output):
            budget = min(k, len(output) - position - 1)
            proposal = DraftProposal.empty()
            if budget > 0:
                proposal = drafter.propose(DraftRequest(tokens, budget, sampler)).truncate(budget)
            draft = proposal.tokens.tolist()
            kept = 0
            while kept < len(draft) and draft[kept] == output[position + kept]:
                kept += 1
            new_tokens = output[position : position + kept + 1]
            drafter.commit(StepFeedback(len(draft), kept, new_tokens, tokens + new_tokens))
            tokens += new_tokens
            position += len(new_tokens)
            checks += 1
            drafted += len(draft)
            accepted += kept
    finally:
        drafter.end()
    return Replay(checks, drafted, accepted)


def _summary(runs: list[dict], methods: list[str]) -> list[dict]:
    base = [r for r in runs if r["method"] == BASELINE]
    base_rate = sum(r["tokens"] for r in base) / sum(r["seconds"] for r in base)
    rows = []
    for method in methods:
        mine = [r for r in runs if r["method"] == method]
        pooled = pool(RequestStats(**r["stats"]) for r in mine)
        rate = sum(r["tokens"] for r in mine) / sum(r["seconds"] for r in mine)
        rows.append(
            {
                "method": method,
                "prompts": len(mine),
                "tokens": pooled["generated_tokens"],
                "seconds": sum(r["seconds"] for r in mine),
                "tokens_per_s": rate,
                "speedup": rate / base_rate,
                "acceptance_rate": pooled["acceptance_rate"],
                "mean_accepted_length": pooled["mean_accepted_length"],
                "draft_tokens": pooled["draft_tokens"],
                "accepted_tokens": pooled["accepted_tokens"],
                "draft_s": sum(r["stats"]["draft_s"] for r in mine),
                "identical": all(r["identical"] for r in mine),
            }
        )
    return rows


def compare_on_heldout(
    config: SuffixEvalConfig,
    *,
    corpus_path: Path,
    target: LoadedTarget,
    progress: bool = True,
) -> dict[str, object]:
    """Interleaved held-out comparison of ``config.methods`` on ``target``; returns summary
    and runs."""
    from tqdm.auto import tqdm

    from tasks.data.traffic import build_workload

    if BASELINE not in config.methods:
        raise BadInputError(f"methods must include {BASELINE!r}, got {list(config.methods)}")
    prompts = build_workload(
        config.workload, config.heldout_prompts, seed=config.seed, split="heldout"
    )
    plans = {
        name: DraftPlan.parse(spec.format(corpus=corpus_path), policy=config.policy, k=config.k)
        for name, spec in config.methods.items()
    }
    decoders = {name: build_decoder(target, plan) for name, plan in plans.items()}
    names = list(decoders)
    tokenizer = target.tokenizer
    assert tokenizer is not None  # load_target loads it with the model
    encoded = [encode_messages(tokenizer, p.messages) for p in prompts]
    runs: list[dict] = []
    bar = tqdm(total=len(prompts) * len(names), desc="held-out", disable=not progress)
    calls = {
        name: (
            lambda index, decoder=decoder: decoder.generate(
                encoded[index], max_new_tokens=config.max_new_tokens
            )
        )
        for name, decoder in decoders.items()
    }
    rounds = interleave(
        calls,
        len(prompts),
        # first-call overheads land on nobody's numbers
        warm_up=lambda name: decoders[name].generate(encoded[0][:64], max_new_tokens=16),
        on_end=lambda *_: bar.update(),
    )
    for prompt, prompt_ids, timed in zip(prompts, encoded, rounds, strict=True):
        reference = timed[BASELINE].value.token_ids
        for name in names:
            result, seconds = timed[name].value, timed[name].seconds
            runs.append(
                {
                    "prompt_id": prompt.id,
                    "method": name,
                    "prompt_tokens": len(prompt_ids),
                    "tokens": len(result.token_ids),
                    "seconds": seconds,
                    "identical": result.token_ids == reference,
                    "stats": result.stats.to_dict(),
                }
            )
    bar.close()
    return {
        "drafters": {name: decoders[name].describe() for name in names},
        "summary": _summary(runs, names),
        "runs": runs,
    }


def run_suffix_eval(
    config: SuffixEvalConfig,
    *,
    out_dir: Path = Path("results/suffix_eval"),
    source: str = DEFAULT_TARGET,
    progress: bool = True,
) -> dict[str, object]:
    """Collect the outputs of the target loaded from ``source`` on train prompts into
    ``out_dir/store``, build ``out_dir/suffix-corpus.json``, compare on held-out prompts;
    write ``out_dir/suffix_eval.json`` and return it."""
    from serving.loader import load_target
    from tasks.train.suffix_index import build_suffix_index_from_store

    hardware = engine_target(config.hardware)
    set_threads(config.threads)
    out_dir = Path(out_dir)
    target = load_target(source, hardware)
    store_root = out_dir / "store"
    collected = collect_train_outputs(
        config, target=target, store_root=store_root, progress=progress
    )
    corpus_path = out_dir / "suffix-corpus.json"
    corpus = build_suffix_index_from_store(
        store_root,
        corpus_path,
        hardware_name=config.hardware,
        include_prompts=config.include_prompts,
        description=f"{config.workload} train outputs of {source}, greedy",
    )
    comparison = compare_on_heldout(
        config, corpus_path=corpus_path, target=target, progress=progress
    )
    results: dict[str, object] = {
        "config": asdict(config),
        "target": source,
        "collection": collected,
        "corpus": {
            "path": str(corpus_path),
            "sequences": len(corpus.sequences),
            "tokens": corpus.tokens,
            "sha256": corpus.checksum(),
        },
        "environment": {
            "threads": torch.get_num_threads(),
            "kernels": hardware.kernels,
            "torch": torch.__version__,
            "machine": platform.machine(),
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
        },
        **comparison,
    }
    write_json_atomic(out_dir / "suffix_eval.json", results)
    return results


def format_summary(rows: list[dict]) -> str:
    lines = [
        f"{'method':<16} {'tok/s':>7} {'vs none':>8} {'accept':>7} {'mean len':>8} {'= none':>7}"
    ]
    for row in rows:
        accept = row["acceptance_rate"]
        lines.append(
            f"{row['method']:<16} {row['tokens_per_s']:>7.2f} {row['speedup']:>7.3f}x "
            f"{'-' if accept is None else format(accept, '.3f'):>7} "
            f"{row['mean_accepted_length']:>8.3f} {'yes' if row['identical'] else 'NO':>7}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    defaults = SuffixEvalConfig()
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.suffix_eval", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out-dir", type=Path, default=Path("results/suffix_eval"))
    parser.add_argument("--train-prompts", type=int, default=defaults.train_prompts)
    parser.add_argument("--heldout-prompts", type=int, default=defaults.heldout_prompts)
    parser.add_argument("--max-new-tokens", type=int, default=defaults.max_new_tokens)
    parser.add_argument("--collect-budget-s", type=float, default=defaults.collect_budget_s)
    parser.add_argument("--k", type=int, default=defaults.k)
    parser.add_argument("--policy", default=defaults.policy)
    parser.add_argument("--threads", type=int, default=defaults.threads)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--include-prompts", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    config = SuffixEvalConfig(
        train_prompts=args.train_prompts,
        heldout_prompts=args.heldout_prompts,
        seed=args.seed,
        max_new_tokens=args.max_new_tokens,
        k=args.k,
        policy=args.policy,
        threads=args.threads,
        collect_budget_s=args.collect_budget_s,
        include_prompts=args.include_prompts,
    )

    def study() -> None:
        results = run_suffix_eval(config, out_dir=args.out_dir)
        print(format_summary(results["summary"]))  # type: ignore[arg-type]
        print(f"written: {args.out_dir / 'suffix_eval.json'}")
        print(json.dumps(results["corpus"]))

    return run_study(study)


if __name__ == "__main__":
    sys.exit(main())
