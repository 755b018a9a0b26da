"""vLLM's ``--speculative-config`` for a :class:`Speculation`, in vLLM's own keys.

Torch- and vLLM-free, so the main environment can write the configuration a promotion
deploys (``specops registry export``) and the vLLM environment can load it. Names differ
between the two projects in one place each way:

============================  ==================================  ==========================
specops drafter               :class:`Speculation` method          vLLM ``method``
============================  ==================================  ==========================
``pld:N`` (prompt lookup)     ``ngram``                           ``ngram``
``layers:N``, ``model:PATH``  ``draft_model``                     ``draft_model``
``lora:PATH`` (merged)        ``draft_model``                     ``draft_model``
``suffix[:CORPUS]``           ``suffix``                          ``suffix`` (Arctic Inference)
``head:PATH`` (layout eagle)  ``eagle``                           ``eagle`` (EAGLE-1)
============================  ==================================  ==========================

specops's ``ngram:N`` is its n-gram *store* drafter, which vLLM has no equivalent of;
vLLM's ``ngram`` is prompt lookup, specops's ``pld``.
"""

from __future__ import annotations

from typing import Any

from serving.backends.base import Speculation


def speculative_config(speculation: Speculation) -> dict[str, Any] | None:
    """The ``speculative_config`` vLLM takes for ``speculation`` (None: no drafting)."""
    k = speculation.num_speculative_tokens
    if speculation.method == "ngram":
        return {
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_max": speculation.prompt_lookup_max,
            "prompt_lookup_min": speculation.prompt_lookup_min,
        }
    if speculation.method in ("draft_model", "eagle"):
        return {
            "method": speculation.method,
            "model": speculation.draft_path,
            "num_speculative_tokens": k,
        }
    if speculation.method == "suffix":
        return {
            "method": "suffix",
            "num_speculative_tokens": k,
            "suffix_decoding_max_tree_depth": speculation.suffix_max_tree_depth,
            "suffix_decoding_max_spec_factor": speculation.suffix_max_spec_factor,
            "suffix_decoding_min_token_prob": speculation.suffix_min_token_prob,
            "suffix_decoding_max_cached_requests": speculation.suffix_max_cached_requests,
        }
    return None
