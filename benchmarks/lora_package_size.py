"""Size and load time of a LoRA draft package of SmolLM2-135M's first N layers, stored as
its fp32 merge (``model:weights``, the layout before adapters were stored alone) and as its
adapter (``lora:adapter``, merged when it loads) (writes results/lora_package_size.json).

    .venv/bin/python -m benchmarks.lora_package_size --layers 4 --threads 2

The adapter has distill's default settings (r=16, alpha=32, every linear layer) and random
updates: sizes do not depend on training. Its result is kept in docs/training.md.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch


def _sizes(folder: Path) -> dict[str, int]:
    files = [path for path in folder.rglob("*") if path.is_file()]
    return {"bytes": sum(p.stat().st_size for p in files), "largest_file_bytes": max(
        p.stat().st_size for p in files
    )}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.lora_package_size", description=__doc__
    )
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("results/lora_package_size.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    from serving.atomic import write_json_atomic
    from serving.engine.drafters.package import DraftManifest, load_package, write_package
    from serving.hardware import engine_target
    from serving.loader import load_target
    from serving.models.lora import lora_base_of, write_lora_base
    from serving.target import DEFAULT_TARGET
    from tasks.train.distill_model import base_draft, merge_lora, save_causal_lm, with_lora

    stock = load_target(DEFAULT_TARGET, engine_target("cpu-stock"))
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        torch.manual_seed(0)
        base = base_draft(stock.model, layers=args.layers, draft_model=None)
        adapted = with_lora(base, r=16, alpha=32, dropout=0.0, target_modules="all-linear")
        with torch.no_grad():
            for name, parameter in adapted.named_parameters():
                if "lora_B" in name:
                    parameter.normal_(0, 0.01)
        adapted.save_pretrained(root / "adapter")
        write_lora_base(root / "adapter", lora_base_of(stock.model, args.layers))
        fresh = base_draft(stock.model, layers=args.layers, draft_model=None)
        save_causal_lm(merge_lora(root / "adapter", fresh), root / "model", stock.tokenizer)
        layouts = {
            "model:weights": {"weights": root / "model", "adapter": root / "adapter"},
            "lora:adapter": {"adapter": root / "adapter"},
        }
        for drafter, files in layouts.items():
            folder = write_package(
                root / drafter.replace(":", "-"), DraftManifest(drafter=drafter), files
            )
            started = time.perf_counter()
            load_package(folder, stock)
            results[drafter] = {**_sizes(folder), "load_s": time.perf_counter() - started}
            print(drafter, results[drafter], flush=True)
        # Against the served target (oneDNN-packed layers: its fp32 base is read from its
        # folder, and the merged draft packed like it).
        packed = load_target(DEFAULT_TARGET)
        started = time.perf_counter()
        load_package(root / "lora-adapter", packed)
        results["lora:adapter"]["load_onednn_target_s"] = time.perf_counter() - started
    payload = {
        "command": "python -m benchmarks.lora_package_size "
        + " ".join(f"--{k}={v}" for k, v in vars(args).items()),
        "target": "smollm2 (SmolLM2-135M-Instruct, fp32, stock kernels)",
        "adapter": "r=16, alpha=32, all-linear (distill's defaults)",
        "torch": torch.__version__,
        "results": results,
    }
    write_json_atomic(args.out, payload)
    print(json.dumps(payload, indent=2, default=str))


if __name__ == "__main__":
    main()
