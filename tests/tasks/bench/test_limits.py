from __future__ import annotations

import numpy as np
import pytest
import torch

from serving.models.onednn import onednn_available, pack_linear_layers
from serving.models.tiny import tiny_llama
from tasks.bench.limits import (
    gguf_weights,
    limit_tokens_per_s,
    memory_bandwidth,
    weight_bytes_per_token,
)

HIDDEN, VOCAB = 32, 96  # tiny_llama's defaults
ROW = HIDDEN * 4  # one float32 row of the token table


def _all_bytes(model) -> int:
    """Every parameter once (the tied table once) and the rotary frequencies the forward
    reads (its ``original_inv_freq`` copy is never read, so never counted)."""
    tensors = {id(t): t for t in [*model.parameters(), model.model.rotary_emb.inv_freq]}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def test_a_tied_head_reads_the_whole_table():
    model = tiny_llama()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert weight_bytes_per_token(model) == _all_bytes(model)


def test_a_table_that_is_only_indexed_counts_one_row():
    model = tiny_llama()
    model.lm_head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)  # untied
    table = model.model.embed_tokens.weight
    expected = _all_bytes(model) - table.numel() * 4 + ROW
    assert weight_bytes_per_token(model) == expected


@pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN kernels")
def test_packed_weights_held_as_attributes_are_counted():
    stock = tiny_llama()
    packed = tiny_llama()
    pack_linear_layers(packed)  # weights become oneDNN tensors, neither parameters nor buffers
    # The head's packed copy is read in full; the table it was tied to, one row.
    assert weight_bytes_per_token(packed) == weight_bytes_per_token(stock) + ROW


class _CodesLinear(torch.nn.Module):
    """A quantised-layer stand-in: int8 codes and a scale as buffers, plus a copy kept for
    export that the forward never reads."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.register_buffer("codes", torch.zeros_like(linear.weight, dtype=torch.int8))
        self.register_buffer("scale", torch.ones(linear.out_features))
        self.register_buffer("export_copy", torch.zeros_like(linear.weight), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x @ self.codes.float().t()) * self.scale


def test_buffers_of_quantised_layers_count_what_the_forward_reads():
    model = tiny_llama()
    model.lm_head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)
    before = weight_bytes_per_token(model)
    model.lm_head = _CodesLinear(model.lm_head)
    # float32 head (4 bytes a weight) -> int8 codes (1 byte) and one float32 scale per row.
    assert weight_bytes_per_token(model) == before - VOCAB * HIDDEN * 3 + VOCAB * 4


def test_bandwidth_is_a_positive_rate():
    bandwidth = memory_bandwidth(8, repeats=2)
    assert bandwidth.bytes_per_s > 0
    assert bandwidth.threads == torch.get_num_threads()
    assert bandwidth.to_dict()["gb_per_s"] == pytest.approx(bandwidth.bytes_per_s / 1e9)
    assert limit_tokens_per_s(1e9, 10**6) == pytest.approx(1000.0)


def _gguf(path, *, with_output: bool):
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), "llama")
    writer.add_tensor("token_embd.weight", np.ones((10, 4), dtype=np.float32))  # 10 rows
    writer.add_tensor("blk.0.ffn_up.weight", np.ones((8, 4), dtype=np.float32))
    if with_output:
        writer.add_tensor("output.weight", np.ones((10, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_gguf_token_table_is_one_row_unless_it_is_the_output_head(tmp_path):
    tied = _gguf(tmp_path / "tied.gguf", with_output=False)
    untied = _gguf(tmp_path / "untied.gguf", with_output=True)
    assert gguf_weights(tied).bytes_per_token == (10 * 4 + 8 * 4) * 4
    assert gguf_weights(untied).bytes_per_token == (1 * 4 + 8 * 4 + 10 * 4) * 4
    assert gguf_weights(untied).format == "F32"


def test_the_shipped_gguf_reads_about_a_tenth_of_a_gigabyte_per_token():
    from serving.models.real import gguf_path

    # Tied embeddings: the Q8_0 token table is the output head too, read in full.
    weights = gguf_weights(gguf_path())
    assert 90e6 < weights.bytes_per_token < 110e6
    assert weights.format == "Q4_1"


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_quantised_layers_count_their_codes_and_scales_once(scheme):
    from serving.models.quantized import (
        QuantisedKernelsUnavailable,
        check_kernels,
        quantize_linear_layers,
    )

    try:
        check_kernels(scheme)
    except QuantisedKernelsUnavailable as error:
        pytest.skip(str(error))
    model = tiny_llama()
    model.lm_head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
    stock = weight_bytes_per_token(model)
    quantize_linear_layers(model, scheme, fuse=False)  # unfused: the same layers, requantised
    read = {"int8": ("codes", "scale"), "int4": ("packed", "scales_and_zeros")}
    quantised = [m for m in model.modules() if getattr(m, "scheme", None) in read]
    expected = stock - sum(m.weight.numel() * 4 for m in linears)
    expected += sum(getattr(m, name).nbytes for m in quantised for name in read[m.scheme])
    # int4 layers also keep nibble codes for export; the forward never reads them.
    assert weight_bytes_per_token(model) == expected


def test_the_cpu_description_names_the_model_flags_and_narrowing_settings(monkeypatch):
    from tasks.bench.limits import cpu_description

    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.setenv("SPECOPS_LEAN_MARCH", "x86-64-v3")
    described = cpu_description()
    assert described["model"] and isinstance(described["flags"], list)
    assert described["settings"] == {"SPECOPS_LEAN_MARCH": "x86-64-v3"}
    assert described["torch_capability"] in ("DEFAULT", "AVX2", "AVX512")
