"""Detailed-mode records of the tiny target for the acceptance predictor's tests: real
engine runs (prompt lookup and the n-gram store drafting, greedy) turned into collected
records (:func:`serving.records.schema.from_detailed`) and a dataset
(:func:`tasks.data.dataset.build_dataset`), as ``specops data validate`` writes it."""

from __future__ import annotations

import random
from pathlib import Path

from serving.engine.decoder import SpeculativeDecoder
from serving.engine.drafters.ngram_store import NGramDrafter
from serving.engine.drafters.prompt_lookup import PromptLookupDrafter
from serving.engine.policy import FixedK
from serving.records.schema import from_detailed, parse_record
from serving.target import LoadedTarget
from tasks.data.dataset import build_dataset, write_dataset

DRAFTERS = {"pld": PromptLookupDrafter, "ngram": NGramDrafter}


def engine_records(
    target, *, prompts: int = 12, new_tokens: int = 48, seed: int = 0, hardware: str = "cpu"
) -> list[dict]:
    """``prompts`` requests per drafter; every fourth is of the held-out split. Prompts
    repeat a short random phrase, so that the n-gram drafters find something to draft."""
    rng = random.Random(seed)
    records: list[dict] = []
    for name, make in DRAFTERS.items():
        decoder = SpeculativeDecoder(
            LoadedTarget.of(target), drafter=make(), policy=FixedK(4), eos_token_ids=[]
        )
        for i in range(prompts):
            phrase = [rng.randrange(3, 96) for _ in range(rng.randrange(3, 7))]
            prompt = [1, *phrase * rng.randrange(2, 4), *rng.sample(range(3, 96), 4)]
            result = decoder.generate(prompt, max_new_tokens=new_tokens, mode="detailed")
            assert result.record is not None
            records.append(
                from_detailed(
                    result.record,
                    record_key=f"{name}-{seed}-{i}",
                    prompt_id=f"{name}-{i}",
                    workload="grounded",
                    split="heldout" if i % 4 == 3 else "train",
                    prompt="",
                    output_text="",
                    drafter_version="builtin",
                    hardware=hardware,
                    run_id="test",
                    timestamp=1_000.0 + len(records),
                )
            )
    return records


def write_parts(records: list[dict], folder: Path) -> Path:
    """The dataset parts of ``records`` (as stored) in ``folder`` (every failure and some
    replay train), as validation writes them."""
    write_dataset(build_dataset([parse_record(r) for r in records], failure_share=0.5), folder)
    return folder


def relabel(records: list[dict], rule) -> list[dict]:
    """``records`` with every drafted row's ``accepted`` set by ``rule(row)``: a labelling by
    construction, for tests that need a known, learnable signal."""
    return [
        {**r, "drafted": [{**row, "accepted": bool(rule(row))} for row in r["drafted"]]}
        for r in records
    ]
