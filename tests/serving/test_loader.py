from __future__ import annotations

import pytest

from serving.errors import BadInputError, ModelSourceError
from serving.loader import DecoderOptions, encode_prompt, load_target, set_threads


def test_set_threads_rejects_nonsense():
    with pytest.raises(BadInputError, match="threads must be an integer >= 1, got 0"):
        set_threads(0)


def test_load_target_rejects_unknown_kernels_and_missing_folders(tmp_path):
    with pytest.raises(BadInputError, match="unknown kernels 'cuda'"):
        load_target(kernels="cuda")
    with pytest.raises(ModelSourceError, match="neither 'smollm2' nor a local model folder"):
        load_target(str(tmp_path / "missing"))


def test_decoder_options_are_checked_before_loading():
    with pytest.raises(BadInputError, match="unknown policy"):
        DecoderOptions(policy="x").check()
    with pytest.raises(BadInputError, match="unknown hardware target"):
        DecoderOptions(hardware="x").check()
    with pytest.raises(BadInputError, match="k must be between"):
        DecoderOptions(k=0).check()
    assert DecoderOptions(drafter="none", k=0).check().kind == "none"


@pytest.mark.real_model
def test_encode_prompt_applies_the_chat_template(real_stock):
    _, tokenizer = real_stock
    chat = encode_prompt(tokenizer, "Hello")
    plain = encode_prompt(tokenizer, "Hello", chat=False)
    assert len(chat) > len(plain)
    assert tokenizer.decode(chat).rstrip().endswith("assistant")
    with pytest.raises(BadInputError, match="the prompt is empty"):
        encode_prompt(tokenizer, "  ")
