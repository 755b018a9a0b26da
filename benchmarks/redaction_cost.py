"""Redaction's cost per captured record, with the real (SmolLM2) tokenizer.

Records come from the engine in detailed mode (a tiny random target with the real
tokenizer, the prompt-lookup drafter), so they carry the disagreements and drafted tokens
a captured record carries: a ShareGPT-sized prompt (~900 tokens) and 64 output tokens,
once without secrets and once with two (an e-mail address and an API key). Prints and
writes (``--out``) the median milliseconds of :func:`serving.security.redact.redact_record`
over ``--repeats`` runs. Run it against another checkout with ``PYTHONPATH=<checkout>``
to compare versions::

    PYTHONPATH=$PWD .venv/bin/python -m benchmarks.redaction_cost --out metrics/redaction_cost.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

PARAGRAPH = (
    "I am planning a two-week trip through Portugal in late spring and would like help with "
    "an itinerary. We land in Lisbon, want to spend a few days there, then head north to "
    "Porto by train, maybe stopping in Coimbra, and finish in the Algarve for some beach "
    "time. What should we see, where should we stay, and how should we get around? "
)
SECRETS = " Reach me at alice.smith@example.com; my key is sk-proj-AbCdEfGhIjKlMnOpQrStUv123456."


def _records(tokenizer) -> dict[str, dict]:
    import torch

    from serving.engine.build import build_decoder
    from serving.engine.drafters.plan import DraftPlan
    from serving.models.tiny import tiny_llama
    from serving.records.schema import from_detailed
    from serving.target import LoadedTarget

    torch.manual_seed(0)
    model = tiny_llama(
        vocab_size=len(tokenizer), hidden_size=64, num_layers=2, max_positions=2048
    ).eval()
    # As it is, with no end-of-sequence ids: every record runs to its token budget.
    target = LoadedTarget.of(model)
    decoder = build_decoder(target, DraftPlan.parse("pld", policy="fixed", k=3))
    rows = {}
    for name, text in (("plain", PARAGRAPH * 11), ("two_secrets", PARAGRAPH * 10 + SECRETS)):
        prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
        record = decoder.generate(prompt, max_new_tokens=64, mode="detailed").record
        assert record is not None  # detailed mode always records
        rows[name] = from_detailed(
            record, record_key=name, prompt_id=name, workload="live", split="train",
            prompt=text, output_text=tokenizer.decode(record.output_token_ids),
            drafter_version="builtin", hardware="cpu", run_id="bench",
        )  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    from serving.models.real import real_model_dir
    from serving.security.redact import Redactor, mask_token, redact_record

    tokenizer = AutoTokenizer.from_pretrained(real_model_dir())
    redactor, mask_id = Redactor(), mask_token(tokenizer)
    results = {}
    for name, row in _records(tokenizer).items():
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            _, counts = redact_record(row, redactor, tokenizer, mask_id)
            times.append((time.perf_counter() - start) * 1000)
        tokens = len(row["prompt_token_ids"]) + len(row["output_token_ids"])
        results[name] = {
            "tokens": tokens,
            "disagreements": len(row["disagreements"]),
            "secrets": sum(counts.values()),
            "median_ms": round(statistics.median(times), 2),
        }
        print(f"{name}: {results[name]}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
