"""The suffix drafter: automaton counts against brute force, exact proposals on hand-made
sequences, commits, the corpus file format, and greedy equality through the engine."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch

from serving.engine.decoder import SpeculativeDecoder
from serving.engine.drafters.base import DraftRequest, StepFeedback
from serving.engine.drafters.factory import build_drafter, parse_drafter_spec
from serving.engine.drafters.suffix import (
    SuffixCorpus,
    SuffixDrafter,
    SuffixIndex,
    load_suffix_corpus,
    suffix_drafter,
)
from serving.engine.policy import FixedK
from serving.engine.sampling import make_sampler
from serving.errors import BadInputError, IncompatibleDraftError, ModelSourceError

GREEDY = make_sampler()


def index_of(*sequences: list[int]) -> SuffixIndex:
    index = SuffixIndex()
    for sequence in sequences:
        index.add_sequence(sequence)
    return index


def naive_occurrences(sequences: list[list[int]], pattern: list[int]) -> int:
    width = len(pattern)
    return sum(
        sequence[i : i + width] == pattern
        for sequence in sequences
        for i in range(len(sequence) - width + 1)
    )


def test_counts_match_brute_force_on_random_sequences():
    rng = random.Random(0)
    for _ in range(100):
        sequences = [[rng.randrange(3) for _ in range(rng.randrange(20))] for _ in range(3)]
        many = index_of(*sequences)
        one = SuffixIndex()
        text: list[int] = []
        for sequence in sequences:  # one growing text, extended piece by piece
            one.extend(sequence)
            text += sequence
        for _ in range(20):
            pattern = [rng.randrange(3) for _ in range(rng.randrange(1, 6))]
            assert many.occurrences(pattern) == naive_occurrences(sequences, pattern)
            assert one.occurrences(pattern) == naive_occurrences([text], pattern)


def test_sequences_do_not_match_across_their_ends():
    index = index_of([10, 11], [12, 13])
    assert index.occurrences([11, 12]) == 0
    assert (len(index), index.sequences, index.max_token_id) == (4, 2, 13)
    assert index.continuation(index.match([11])[0]) is None


def test_index_cap_is_enforced_with_a_clear_error():
    index = SuffixIndex(max_tokens=5)
    index.add_sequence([1, 2, 3])
    with pytest.raises(BadInputError, match="max_tokens=5"):
        index.add_sequence([4, 5, 6])
    with pytest.raises(BadInputError, match="got -3"):
        SuffixIndex().extend([-3])


def propose(drafter: SuffixDrafter, tokens: list[int], k: int) -> tuple[list[int], list[float]]:
    proposal = drafter.propose(DraftRequest(tokens, k, GREEDY))
    assert proposal.draft_probs is None and proposal.tokens.dtype == torch.int64
    assert proposal.confidence is not None and len(proposal.confidence) == len(proposal)
    return proposal.tokens.tolist(), [round(c, 6) for c in proposal.confidence.tolist()]


def drafted(prompt: list[int], k: int, global_index: SuffixIndex | None = None, **kwargs):
    drafter = SuffixDrafter(global_index, **kwargs)
    drafter.begin(prompt)
    return propose(drafter, prompt, k)


def test_copies_what_followed_the_earlier_occurrence_and_chains_past_the_end():
    assert drafted([1, 2, 3, 4, 1, 2], 3)[0] == [3, 4, 1]
    # The copied span runs into the end of the text; the match falls back to "1 2" again.
    assert drafted([1, 2, 3, 4, 1, 2], 5)[0] == [3, 4, 1, 2, 3]


def test_most_frequent_continuation_wins_and_ties_go_to_the_most_recent():
    # "1 2" was followed by 3, 3 and 4: 3 (2/3). "1 2 3 1 2" was followed once by 3 and once
    # by 4: the more recent, 4 (1/2).
    prompt = [1, 2, 3, 1, 2, 3, 1, 2, 4, 9, 1, 2]
    assert drafted(prompt, 4) == ([3, 1, 2, 4], [round(2 / 3, 6), 1.0, 1.0, 0.5])
    assert drafted([1, 2, 3, 1, 2, 4, 1, 2], 1) == ([4], [0.5])


def test_longest_match_wins_over_more_frequent_shorter_ones():
    # "1 2" was followed by 9 and 8, "5 1 2" by 9 only.
    assert drafted([5, 1, 2, 9, 3, 1, 2, 8, 5, 1, 2], 1) == ([9], [1.0])


def test_min_match_and_no_match_give_empty_proposals():
    assert drafted([1, 5, 2, 5], 1)[0] == [2]
    assert drafted([1, 5, 2, 5], 1, min_match=2) == ([], [])
    assert drafted([1, 2, 3, 4], 4) == ([], [])
    assert drafted([9], 4) == ([], [])


def test_global_index_drafts_the_most_frequent_earlier_output():
    corpus = index_of([1, 2, 3], [1, 2, 3], [1, 2, 4])
    assert drafted([7, 1, 2], 3, corpus) == ([3], [round(2 / 3, 6)])  # the sequence ends there
    assert drafted([7, 8], 3, corpus) == ([], [])


def test_the_longer_match_picks_the_index_and_the_request_wins_ties():
    # Both match "1 2" (length 2): the request's own 9 wins over the corpus's 8.
    assert drafted([1, 2, 9, 1, 2], 1, index_of([1, 2, 8]))[0] == [9]
    # The corpus matches "4 1 2" (3 > 2): its 8 wins.
    assert drafted([1, 2, 9, 4, 1, 2], 1, index_of([4, 1, 2, 8]))[0] == [8]


def test_each_token_comes_from_the_index_with_the_longer_match():
    # "8 2" is only in the corpus (-> 3); then the corpus's sequence ends and the request's
    # own "2 3" (-> 0 -> 8 -> 2) takes over.
    assert drafted([2, 3, 0, 8, 2], 4, index_of([8, 2, 3])) == ([3, 0, 8, 2], [1.0] * 4)
    assert drafted([2, 3, 0, 8, 2], 5, index_of([8, 2, 3, 4, 5]))[0] == [3, 4, 5]


def test_max_spec_factor_caps_the_draft_by_the_match_length():
    assert drafted([1, 2, 3, 4, 5, 1], 4)[0] == [2, 3, 4, 5]
    assert drafted([1, 2, 3, 4, 5, 1], 4, max_spec_factor=2.0)[0] == [2, 3]
    assert drafted([1, 2, 3, 4, 5, 1, 2], 4, max_spec_factor=1.5)[0] == [3, 4, 5]


def test_min_path_confidence_stops_on_the_product_of_confidences():
    corpus = index_of([1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 6])
    # "1 2" -> 3 (2 of 3), then "1 2 3" -> 4 or 5 (a tie: the more recent, 5)
    assert drafted([1, 2], 3, corpus) == ([3, 5], [round(2 / 3, 6), 0.5])
    assert drafted([1, 2], 3, corpus, min_path_confidence=0.5) == ([3], [round(2 / 3, 6)])
    assert drafted([1, 2], 3, corpus, min_path_confidence=0.7) == ([], [])


def test_commit_extends_both_matches_and_begin_resets_them():
    drafter = SuffixDrafter(index_of([1, 2, 3, 4]))
    drafter.begin([9])
    assert propose(drafter, [9], 3) == ([], [])
    drafter.commit(StepFeedback(proposed=0, accepted=0, new_tokens=[1, 2], tokens=[9, 1, 2]))
    assert propose(drafter, [9, 1, 2], 3) == ([3, 4], [1.0, 1.0])
    drafter.commit(StepFeedback(proposed=2, accepted=0, new_tokens=[9], tokens=[9, 1, 2, 9]))
    assert propose(drafter, [9, 1, 2, 9], 3)[0] == [1, 2, 9]  # the request's own repeat
    drafter.begin([5, 6])
    assert propose(drafter, [5, 6], 3) == ([], [])


@pytest.mark.parametrize(
    ("kwargs", "shown"),
    [
        ({"min_match": 0}, "min_match"),
        ({"max_spec_factor": 0.0}, "max_spec_factor"),
        ({"min_path_confidence": 1.5}, "1.5"),
    ],
)
def test_bad_arguments_raise(kwargs, shown):
    with pytest.raises(BadInputError, match=shown):
        SuffixDrafter(**kwargs)


# --- The corpus file ----------------------------------------------------------------------


def write_corpus(path, sequences, **manifest) -> SuffixCorpus:
    corpus = SuffixCorpus(tuple(tuple(s) for s in sequences), manifest)
    path.write_text(json.dumps(corpus.to_payload()))
    return corpus


def test_corpus_payload_roundtrip(tmp_path):
    corpus = write_corpus(tmp_path / "c.json", [[1, 2, 3], [4]], run_ids=["r1"])
    loaded = load_suffix_corpus(tmp_path / "c.json")
    assert loaded == corpus and loaded.tokens == 4
    assert loaded.index().occurrences([2, 3]) == 1


@pytest.mark.parametrize(
    ("edit", "shown"),
    [
        (lambda p: p.update(format="other"), "not a specops-suffix-corpus file"),
        (lambda p: p.update(version=99), "version 99"),
        (lambda p: p.update(token_ids=[[1, -2]]), "non-negative"),
        (lambda p: p.update(token_ids="1 2"), "list of token id lists"),
        (lambda p: p.update(tokens=5), "header says"),
        (lambda p: p["token_ids"][0].__setitem__(0, 7), "checksum"),
    ],
)
def test_corrupt_corpus_payloads_are_refused(tmp_path, edit, shown):
    path = tmp_path / "c.json"
    payload = write_corpus(path, [[1, 2, 3], [4]]).to_payload()
    edit(payload)
    path.write_text(json.dumps(payload))
    with pytest.raises(ModelSourceError, match=shown):
        load_suffix_corpus(path)


def test_missing_or_unreadable_corpus_files_are_refused(tmp_path):
    with pytest.raises(ModelSourceError, match="does not exist"):
        load_suffix_corpus(tmp_path / "missing.json")
    (tmp_path / "cut.json").write_text('{"format": "specops-suffix-corpus", "tok')
    with pytest.raises(ModelSourceError, match="cannot be read"):
        load_suffix_corpus(tmp_path / "cut.json")


def test_factory_specs(tmp_path, loaded):
    write_corpus(tmp_path / "c.json", [[1, 2, 3]])
    assert parse_drafter_spec("suffix").arg is None
    assert parse_drafter_spec(f"SUFFIX:{tmp_path / 'c.json'}").kind == "suffix"
    with pytest.raises(BadInputError, match="is not a suffix corpus file"):
        parse_drafter_spec(f"suffix:{tmp_path / 'missing.json'}")
    plain = build_drafter("suffix", loaded)
    assert isinstance(plain, SuffixDrafter) and plain.global_index is None
    with_corpus = build_drafter(f"suffix:{tmp_path / 'c.json'}", loaded)
    assert isinstance(with_corpus, SuffixDrafter) and with_corpus.global_index is not None
    assert with_corpus.describe()["global_tokens"] == 3
    (tmp_path / "bad.json").write_text("[]")
    with pytest.raises(ModelSourceError, match=r"bad\.json"):
        build_drafter(f"suffix:{tmp_path / 'bad.json'}", loaded)


def test_corpus_with_ids_outside_the_vocabulary_is_incompatible(tmp_path, loaded):
    write_corpus(tmp_path / "c.json", [[1, 2, 500]])
    with pytest.raises(IncompatibleDraftError, match="token id 500"):
        SpeculativeDecoder(loaded, drafter=suffix_drafter(tmp_path / "c.json"), policy=FixedK(2))


# --- Greedy equality through the engine -----------------------------------------------------


def decode(loaded, prompt, drafter, k, new_tokens):
    decoder = SpeculativeDecoder(loaded, drafter=drafter, policy=FixedK(k))
    return decoder.generate(prompt, max_new_tokens=new_tokens)


@pytest.mark.parametrize("k", [1, 3, 8])
def test_greedy_output_equals_plain_greedy(loaded, prompt, greedy_reference, k):
    rng = random.Random(k)
    noise = index_of(*[[rng.randrange(96) for _ in range(40)] for _ in range(5)])
    own_outputs = index_of(greedy_reference, greedy_reference[5:30])
    for global_index in (None, noise, own_outputs):
        result = decode(loaded, prompt, SuffixDrafter(global_index), k, len(greedy_reference))
        assert result.token_ids == greedy_reference, (k, global_index)
        assert result.stats.draft_tokens > 0
    # An index of the target's own earlier output predicts it: after the first two tokens
    # (which no index continues: the output's first token follows the prompt, its second
    # the ambiguous "46") every block of k drafts is kept whole.
    result = decode(loaded, prompt, SuffixDrafter(own_outputs), k, len(greedy_reference))
    assert result.stats.checks <= 2 + math.ceil((len(greedy_reference) - 2) / (k + 1))
