"""Real-model smoke run of model-draft distillation (writes results/distill/smoke.json).

LoRA on SmolLM2-135M-Instruct's first 4 layers (a deep copy), distilled on the teacher cache
of the target's own greedy answers to ShareGPT train prompts that scripts/head_smoke.py
builds (results/head/teacher-train; held-out agreement on results/head/teacher-heldout,
built from ShareGPT held-out prompts). Writes the draft package results/distill/package
(fixed k, so that acceptance is measured at every position) and a package of the untrained
first layers (results/distill/untrained) to compare against with ``eval-draft``. Resumable.

    .venv/bin/python scripts/distill_smoke.py --steps 100
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--teacher", type=Path, default=Path("results/head/teacher-train"))
    parser.add_argument("--heldout", type=Path, default=Path("results/head/teacher-heldout"))
    parser.add_argument("--kind", default="lora")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--loss", default="kl")
    parser.add_argument("--quantize", default="none")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--max-seq-len", type=int, default=128)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--lora-r", type=int, default=16)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("results/distill"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from serving.drafters.package import DraftManifest, write_package
    from serving.loader import load_target
    from tasks.distill import DistillConfig, distill, evaluate_draft, write_draft_package
    from tasks.distill_model import base_draft

    timings: dict[str, float] = {}
    started = time.perf_counter()
    target, tokenizer = load_target(kernels="stock")  # a layers draft copies stock weights
    timings["load_s"] = time.perf_counter() - started

    config = DistillConfig(
        teacher_dir=args.teacher,
        output_dir=args.out / "run",
        kind=args.kind,
        layers=args.layers,
        loss=args.loss,
        quantize=args.quantize,
        lora_r=args.lora_r,
        max_steps=args.steps,
        batch_size=args.batch_size,
        max_seq_len=args.max_seq_len,
        learning_rate=args.learning_rate,
        eval_every=50,
        checkpoint_every=50,
    )
    started = time.perf_counter()
    before = evaluate_draft(
        base_draft(target, layers=args.layers, draft_model=None).eval(),
        args.heldout,
        target=target,
        loss=args.loss,
        max_seq_len=args.max_seq_len,
    )
    timings["eval_before_s"] = time.perf_counter() - started

    started = time.perf_counter()
    result = distill(config, target, tokenizer=tokenizer)
    timings["train_s"] = time.perf_counter() - started

    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(result.model_dir).eval()
    after = evaluate_draft(
        merged, args.heldout, target=target, loss=args.loss, max_seq_len=args.max_seq_len
    )
    package = write_draft_package(result, args.out / "package", k=args.k, policy="fixed")
    untrained = write_package(
        args.out / "untrained",
        DraftManifest(
            drafter=f"layers:{args.layers}",
            policy="fixed",
            k=args.k,
            family="layers",
            description="the target's untrained first layers",
        ),
    )

    summary = {
        "command": "scripts/distill_smoke.py "
        + " ".join(f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()),
        "threads": torch.get_num_threads(),
        "heldout_sharegpt_agreement": {"before": vars(before), "after": vars(after)},
        "train": {
            "steps": result.steps,
            "resumed_from": result.resumed_from,
            "trainable_parameters": result.trainable_parameters,
            "train_sequences": result.train_sequences,
            "in_cache_heldout_sequences": result.heldout_sequences,
            "tokens_per_s": result.train_tokens_per_s,
            "history": [vars(m) for m in result.history],
        },
        "package": str(package),
        "untrained_package": str(untrained),
        "timings": timings,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "smoke.json").write_text(json.dumps(summary, indent=2, default=str))
    print(json.dumps({k: summary[k] for k in ("heldout_sharegpt_agreement", "timings")}, indent=2))


if __name__ == "__main__":
    main()
