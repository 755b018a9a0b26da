"""The studies' tests use the command-line tests' tiny target folder (a tiny random Llama and
a character tokenizer saved as a local model folder)."""

from tests.specops.conftest import target_dir

__all__ = ["target_dir"]
