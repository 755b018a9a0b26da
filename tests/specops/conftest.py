"""Fixtures for the command-line tests: a tiny target saved as a local model folder with a
character tokenizer (both made here, for tests only), and an MLflow store for the commands
that open the registry."""

from __future__ import annotations

import string
from pathlib import Path

import pytest

from serving.models.tiny import tiny_llama


def make_char_tokenizer():
    """93 characters and pad/BOS/EOS: the tiny target's 96 ids."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2}
    for char in string.ascii_letters + string.digits + " " + string.punctuation[:30]:
        vocab[char] = len(vocab)
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="?"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
        unk_token="?",
    )  # fmt: skip


@pytest.fixture(scope="session")
def target_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("target")
    tiny_llama(max_positions=1024).save_pretrained(folder)
    make_char_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def hf_char_tokenizer():
    return make_char_tokenizer()


def point_registry_at(monkeypatch, folder: Path) -> None:
    """The environment every ``specops`` command's registry reads: a store in ``folder``."""
    monkeypatch.setenv("SPECOPS_MLFLOW_URI", f"sqlite:///{folder}/mlflow.db")
    monkeypatch.setenv("SPECOPS_MLFLOW_ARTIFACTS", str(folder / "artifacts"))


@pytest.fixture
def registry_env(tmp_path, monkeypatch, mlflow_uri) -> Path:
    """A copy of the session's migrated store in the test's folder (``mlflow_uri``,
    tests/conftest.py), where the commands' registry opens it; returns the folder."""
    point_registry_at(monkeypatch, tmp_path)
    return tmp_path
