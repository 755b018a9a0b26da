"""One evaluation bundle for the tests of the remote path and the GPU run kit: a registered
prompt-lookup draft and short code prompts, tokenized by a tiny target's real tokenizer."""

from __future__ import annotations

from pathlib import Path

from serving.engine.drafters.package import DraftManifest, write_package
from tasks.evaluate.evaluate import EncodedPrompt

CODE = "def add(a, b):\n    return a + b\n\ndef add(a, b):"


def pld_bundle(registry, model_folder: Path, folder: Path, *, prompts: int):
    """``(bundle, draft, prompts)``: ``cpu``'s bundle of a registered ``pld:3`` draft on
    ``prompts`` prompts (8, 9, ... tokens of :data:`CODE`), written under ``folder``."""
    from transformers import AutoTokenizer

    from serving.hardware import engine_target
    from tasks.loop.remote_bundle import prepare_bundle

    tokenizer = AutoTokenizer.from_pretrained(model_folder)
    package = write_package(folder / "pld", DraftManifest(drafter="pld:3", k=4))
    draft = registry.log_draft(package, family="ngram")
    ids = tokenizer(CODE)["input_ids"]
    encoded = [EncodedPrompt(f"p{i}", "traffic:humaneval", ids[: 8 + i]) for i in range(prompts)]
    bundle = prepare_bundle(
        registry, engine_target("cpu"), [draft], encoded, folder / "bundle", tokenizer=tokenizer,
        cache=folder / "cache", max_new_tokens=8,
    )  # fmt: skip
    return bundle, draft, encoded
