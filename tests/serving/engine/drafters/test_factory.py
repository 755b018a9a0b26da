from __future__ import annotations

import pytest

from serving.engine.drafters.factory import build_drafter, parse_drafter_spec
from serving.engine.drafters.model import ModelDrafter
from serving.engine.drafters.ngram_store import NGramDrafter
from serving.engine.drafters.prompt_lookup import PromptLookupDrafter
from serving.errors import BadInputError, IncompatibleDraftError
from serving.models.tiny import tiny_llama
from serving.target import LoadedTarget


@pytest.mark.parametrize(
    ("spec", "kind", "arg"),
    [
        ("none", "none", None),
        ("pld", "pld", None),
        ("pld:2", "pld", "2"),
        ("ngram", "ngram", None),
        ("NGRAM:5", "ngram", "5"),
        ("layers:4", "layers", "4"),
    ],
)
def test_parse_accepts_known_specs(spec, kind, arg):
    parsed = parse_drafter_spec(spec)
    assert (parsed.kind, parsed.arg) == (kind, arg)


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("", "empty drafter spec"),
        ("eagle", "unknown drafter 'eagle'"),
        ("layers", "needs a number"),
        ("layers:x", "'x' is not an integer"),
        ("layers:0", "must be >= 1"),
        ("ngram:1", "must be >= 2"),
        ("ngram:4,fallback=maybe", "fallback='maybe' is not one of stop, shared, target"),
        ("ngram:4,fallback=shared", "fallback=shared and store=PATH go together"),
        ("ngram:4,store=/no/such/file", "fallback=shared and store=PATH go together"),
        ("ngram:4,fallback=shared,store=/no/such", "is not a corpus file"),
        ("ngram:4,min_conf=2", "min_conf=2 is not in"),
        ("ngram:4,min_conf=x", "min_conf='x' is not a number"),
        ("ngram:4,colour=red", "'colour=red' is not an n-gram option"),
        ("ngram:4,fallback=target,fallback=stop", "fallback is given twice"),
        ("none:3", "takes no argument"),
        ("model:", "needs a path"),
        ("model:/no/such/folder", "is not a model folder"),
    ],
)
def test_parse_rejects_bad_specs_naming_the_value(spec, fragment):
    with pytest.raises(BadInputError, match=fragment):
        parse_drafter_spec(spec)


def test_build_each_kind(loaded):
    assert build_drafter("none", loaded) is None
    assert isinstance(build_drafter("pld:2", loaded), PromptLookupDrafter)
    assert isinstance(build_drafter("ngram:3", loaded), NGramDrafter)
    layers = build_drafter("layers:2", loaded)
    assert isinstance(layers, ModelDrafter)
    assert layers.model.config.num_hidden_layers == 2


def test_layers_must_be_fewer_than_the_target_has(loaded):
    with pytest.raises(BadInputError, match="layers:N needs 1 <= N < 4"):
        build_drafter("layers:4", loaded)


def test_model_draft_from_a_folder(tmp_path, loaded):
    draft = tiny_llama(num_layers=1, seed=3)
    draft.save_pretrained(tmp_path / "draft")
    drafter = build_drafter(f"model:{tmp_path / 'draft'}", loaded)
    assert isinstance(drafter, ModelDrafter)


def test_model_draft_with_another_vocabulary_is_refused(tmp_path, loaded):
    tiny_llama(vocab_size=80).save_pretrained(tmp_path / "other")
    with pytest.raises(IncompatibleDraftError, match="vocabulary of 80 tokens"):
        build_drafter(f"model:{tmp_path / 'other'}", loaded)


@pytest.mark.real_model
def test_model_draft_with_another_tokenizer_is_refused(tmp_path, target, real_stock):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    folder = tmp_path / "other-tokenizer"
    tiny_llama().save_pretrained(folder)
    vocab = {f"w{i}": i for i in range(96)}
    other = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="w0")))
    other.save_pretrained(folder)
    with pytest.raises(IncompatibleDraftError, match="different tokenizer"):
        build_drafter(f"model:{folder}", LoadedTarget.of(target, real_stock.tokenizer))


def test_model_draft_runs_on_its_targets_kernels(tmp_path):
    import torch

    from serving.models.onednn import onednn_available, pack_linear_layers

    if not onednn_available():
        pytest.skip("torch built without oneDNN")
    packed_target = tiny_llama()
    pack_linear_layers(packed_target)
    tiny_llama(num_layers=1, seed=3).save_pretrained(tmp_path / "draft")
    drafter = build_drafter(f"model:{tmp_path / 'draft'}", LoadedTarget.of(packed_target))
    assert not any(isinstance(m, torch.nn.Linear) for m in drafter.model.model.modules())


@pytest.mark.parametrize(
    "arg",
    [
        "4",
        "3,fallback=target",
        "fallback=target",
        "5,min_conf=0.3",
        "2,fallback=target,min_conf=0.5",
    ],
)
def test_ngram_options_round_trip(arg):
    from serving.engine.drafters.factory import NgramOptions, parse_ngram_options

    options = parse_ngram_options(f"ngram:{arg}", arg)
    again = parse_ngram_options("ngram", options.arg())
    assert again == options
    assert parse_ngram_options("ngram", None) == NgramOptions()


def test_a_shared_store_from_a_corpus_file(tmp_path, loaded):
    from serving.engine.drafters.suffix import SuffixCorpus
    from tasks.train.suffix_index import save_suffix_index

    path = tmp_path / "store.json"
    save_suffix_index(SuffixCorpus(((5, 6, 7, 8), (5, 6, 9)), {}), path)
    drafter = build_drafter(f"ngram:3,fallback=shared,store={path}", loaded)
    assert drafter.describe()["store"] == str(path)
    drafter.begin([1, 2, 5])  # the request knows nothing after 5; the store knows 5 -> 6
    assert drafter.shared.predict([5]).token == 6
