"""Scrambled weights: the same tensors, shapes and dtypes, permuted values; the package
still loads; a package with no weights is refused by name."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from serving.engine.drafters.package import DraftManifest, load_package, write_package
from serving.errors import BadInputError
from serving.models.tiny import tiny_llama
from serving.target import LoadedTarget
from tasks.loop.damage import scramble_weights


def test_scrambled_weights_keep_their_shapes_and_values_but_not_their_order(tmp_path, target):
    tiny_llama().save_pretrained(tmp_path / "weights")
    package = write_package(
        tmp_path / "draft",
        DraftManifest(drafter="model:weights", k=4, policy="fixed", family="head"),
        files={"weights": tmp_path / "weights"},
    )
    (weights,) = sorted(package.rglob("*.safetensors"))
    before = load_file(weights)
    assert scramble_weights(package) == [weights]
    after = load_file(weights)
    assert list(after) == list(before)
    for name, tensor in before.items():
        assert (after[name].shape, after[name].dtype) == (tensor.shape, tensor.dtype)
        assert torch.equal(after[name].reshape(-1).sort().values, tensor.reshape(-1).sort().values)
        if tensor.unique().numel() > 1:  # a norm's weights of ones look the same permuted
            assert not torch.equal(after[name], tensor), name
    # Still a package that loads, from weights that no longer mean anything.
    manifest, drafter = load_package(package, LoadedTarget.of(target))
    assert manifest.family == "head" and drafter is not None
    # A fixed seed: scrambling a second copy the same way gives the same files.
    again = write_package(
        tmp_path / "again",
        DraftManifest(drafter="model:weights", k=4, policy="fixed", family="head"),
        files={"weights": tmp_path / "weights"},
    )
    (copy,) = scramble_weights(again)
    assert all(torch.equal(load_file(copy)[n], t) for n, t in after.items())


def test_a_package_without_weights_is_refused(tmp_path):
    package = write_package(tmp_path / "pld", DraftManifest(drafter="pld:3"))
    with pytest.raises(BadInputError, match=r"pld.*no \*\.safetensors weights"):
        scramble_weights(package)
