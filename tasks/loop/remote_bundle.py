"""An evaluation to run on another machine: the champion and challengers of a hardware
target, and the prompts, in one folder that needs no registry to read.

A GPU box often has only torch, transformers, peft and accelerate: no MLflow, Prefect or
DVC. So the registry side stays here: :func:`prepare_bundle` downloads the draft packages
and tokenizes the held-out prompts (built-in workloads and held-out traffic); the folder
travels; ``python -m tasks.evaluate.remote BUNDLE --out FILE`` runs the interleaved
evaluation there and writes an evaluation file; ``specops registry log-evaluation FILE
--promote`` brings it back into the registry, where the gates decide.

Layout: ``request.json`` (format, hardware, max_new_tokens, contenders: name -> registry
label), ``prompts.json`` (id, workload, token ids), ``packages/<name>/`` (draft packages).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from registry.client import DraftVersion, Registry
from serving.atomic import atomic_dir
from serving.errors import BadInputError
from serving.hardware import HardwareTarget
from serving.loader import encode_messages
from tasks.data.prompts import Prompt
from tasks.evaluate.evaluate import EncodedPrompt

BUNDLE_FORMAT = 1
REQUEST = "request.json"
PROMPTS = "prompts.json"
PACKAGES = "packages"


def encode_prompts(tokenizer, prompts: Sequence[Prompt | EncodedPrompt]) -> list[EncodedPrompt]:
    return [
        p
        if isinstance(p, EncodedPrompt)
        else EncodedPrompt(p.id, p.workload, encode_messages(tokenizer, p.messages))
        for p in prompts
    ]


def prepare_bundle(
    registry: Registry,
    hardware: HardwareTarget,
    challengers: Sequence[DraftVersion],
    prompts: Sequence[Prompt | EncodedPrompt],
    out: Path,
    *,
    tokenizer,
    cache: Path,
    max_new_tokens: int = 96,
) -> Path:
    """Write the bundle for evaluating ``hardware``'s champion (if any) and
    ``challengers`` on ``prompts`` into ``out`` (atomically: a half-written bundle never
    travels). ``tokenizer`` is the target's."""
    if not challengers:
        raise BadInputError("nothing to evaluate: give at least one challenger")
    if not prompts:
        raise BadInputError("no evaluation prompts")
    by_name: dict[str, DraftVersion] = {}
    current = registry.champion(hardware.name)
    if current is not None:
        by_name["champion"] = current
    for index, draft in enumerate(challengers):
        by_name[f"challenger-{index}"] = draft
    encoded = encode_prompts(tokenizer, prompts)
    with atomic_dir(Path(out)) as scratch:
        for name, draft in by_name.items():
            shutil.copytree(registry.download(draft, cache), scratch / PACKAGES / name)
        request = {
            "format": BUNDLE_FORMAT,
            "hardware": hardware.name,
            "max_new_tokens": max_new_tokens,
            "contenders": {
                name: f"{draft.family}/{draft.version}" for name, draft in by_name.items()
            },
        }
        (scratch / REQUEST).write_text(json.dumps(request, indent=2))
        (scratch / PROMPTS).write_text(json.dumps([asdict(p) for p in encoded]))
    for draft in challengers:
        registry.set_challenger(draft, hardware.name)
    return Path(out)
