"""Speculations become vLLM's own ``--speculative-config`` keys; bad suffix settings are
refused naming the value."""

from __future__ import annotations

import pytest

from serving.backends import Speculation
from serving.backends.vllm_config import speculative_config
from serving.errors import BadInputError


def test_each_method_in_vllms_keys():
    assert speculative_config(Speculation()) is None
    assert speculative_config(Speculation("ngram", 3, prompt_lookup_max=4)) == {
        "method": "ngram", "num_speculative_tokens": 3,
        "prompt_lookup_max": 4, "prompt_lookup_min": 1,
    }  # fmt: skip
    assert speculative_config(Speculation("eagle", 2, draft_path="/d")) == {
        "method": "eagle", "model": "/d", "num_speculative_tokens": 2,
    }  # fmt: skip
    suffix = speculative_config(Speculation("suffix", 4, suffix_min_token_prob=0.0))
    assert suffix["method"] == "suffix" and suffix["num_speculative_tokens"] == 4
    assert suffix["suffix_decoding_min_token_prob"] == 0.0
    assert suffix["suffix_decoding_max_tree_depth"] == 24


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"suffix_max_tree_depth": 2}, "suffix_max_tree_depth"),
        ({"suffix_max_spec_factor": 0.0}, "suffix_max_spec_factor"),
        ({"suffix_min_token_prob": 1.5}, "suffix_min_token_prob"),
        ({"suffix_max_cached_requests": -1}, "suffix_max_cached_requests"),
    ],
)
def test_bad_suffix_settings_are_refused(options, named):
    with pytest.raises(BadInputError, match=named):
        Speculation("suffix", 3, **options)


def test_eagle_needs_a_draft_folder():
    with pytest.raises(BadInputError, match="draft_path"):
        Speculation("eagle", 3)
