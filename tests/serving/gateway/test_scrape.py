"""vLLM's spec-decode counters read from a /metrics page, and windows between readings."""

from __future__ import annotations

from serving.gateway.scrape import Counters, read_counters, window
from serving.hardware import hardware_target

CPU_VLLM = hardware_target("cpu-vllm")

PAGE = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="specops"} 10.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="specops"} 1.7e+09
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="specops"} 30.0
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="specops"} 12.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="specops",position="0"} 7.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="specops",position="1"} 4.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="specops",position="2"} 1.0
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="length",model_name="specops"} 3.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="specops"} 2.0
"""


def test_counters_are_summed_over_labels_and_created_stamps_ignored():
    counters = read_counters(PAGE)
    assert counters == Counters(10, 30, 12, 5, (7, 4, 1))


def test_a_window_is_the_difference_and_a_reset_counts_from_zero():
    before = Counters(4, 12, 6, 2, (4, 2))
    observed = window(before, read_counters(PAGE), start=0, end=10, hardware=CPU_VLLM,
                      champion="suffix/1", server="s1")  # fmt: skip
    assert (observed.drafts, observed.draft_tokens, observed.accepted_tokens) == (6, 18, 6)
    assert observed.requests == 3 and observed.accepted_per_position == [3, 2, 1]
    assert observed.acceptance == 6 / 18
    reset = window(Counters(100, 300, 200, 50, ()), read_counters(PAGE), start=0, end=1,
                   hardware=CPU_VLLM, champion="c", server="s")  # fmt: skip
    assert reset.draft_tokens == 30 and reset.requests == 5


def test_no_speculation_page_reads_as_zeros():
    assert read_counters("# nothing here\n") == Counters()
