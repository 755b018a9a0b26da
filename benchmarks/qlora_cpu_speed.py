"""CPU speed of LoRA training steps and one-token forward passes on a tiny random Llama with
an fp32, bitsandbytes 8-bit or nf4 base (writes results/qlora_cpu_speed.json).

    .venv/bin/python -m benchmarks.qlora_cpu_speed --threads 1

Needs bitsandbytes (the ``qlora`` extra); the weights are random (speed only). Its result is
kept in docs/training.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.qlora_cpu_speed", description=__doc__
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path("results/qlora_cpu_speed.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    import bitsandbytes

    from serving.atomic import write_json_atomic
    from serving.models.tiny import tiny_llama
    from tasks.train.distill_model import quantized, with_lora

    heads = max(args.hidden // 64, 1)
    results: dict[str, dict[str, float]] = {}
    for mode in ("none", "8bit", "4bit"):
        model = tiny_llama(
            vocab_size=args.vocab,
            hidden_size=args.hidden,
            intermediate_size=4 * args.hidden,
            num_layers=args.layers,
            num_heads=heads,
            num_kv_heads=heads,
        ).train()
        if mode != "none":
            with tempfile.TemporaryDirectory() as scratch:
                model = quantized(model, mode, Path(scratch))  # type: ignore[arg-type]
        torch.manual_seed(0)
        model = with_lora(model, r=16, alpha=32, dropout=0.0, target_modules="all-linear")
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
        batch = torch.randint(0, args.vocab, (args.batch, args.seq))

        def train_step(
            model: torch.nn.Module = model,
            optimizer: torch.optim.Optimizer = optimizer,
            batch: torch.Tensor = batch,
        ) -> None:
            loss = model(input_ids=batch, labels=batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()

        token = torch.randint(0, args.vocab, (1, 1))

        @torch.no_grad()
        def forward(model: torch.nn.Module = model, token: torch.Tensor = token) -> None:
            model(input_ids=token)

        print(f"{mode}: timing {args.repeats} training steps ...", flush=True)
        train_step()  # warm-up
        forward()
        results[mode] = {
            "train_step_s": _median_s(train_step, args.repeats),
            "one_token_forward_s": _median_s(forward, 5 * args.repeats),
        }
    for mode in ("8bit", "4bit"):
        for key in ("train_step_s", "one_token_forward_s"):
            results[mode][key[: -len("_s")] + "_vs_fp32"] = (
                results[mode][key] / results["none"][key]
            )
    payload = {
        "command": "python -m benchmarks.qlora_cpu_speed "
        + " ".join(f"--{k}={v}" for k, v in vars(args).items()),
        "bitsandbytes": bitsandbytes.__version__,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "results": results,
    }
    write_json_atomic(args.out, payload)
    print(json.dumps(payload, indent=2, default=str))


if __name__ == "__main__":
    main()
