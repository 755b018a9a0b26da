"""``specops profile --breakdown``: both paths measured, every millisecond in a category."""

from __future__ import annotations

import pytest

from serving.errors import BadInputError
from serving.hardware import hardware_target
from tasks.bench.breakdown import CATEGORIES, breakdown, breakdown_report, category
from tests.serving.lean.models import tiny_target


@pytest.mark.parametrize(
    ("op", "expected"),
    [
        ("aten::_weight_int4pack_mm_for_cpu", "matmuls"),
        ("mkldnn::_linear_pointwise", "matmuls"),
        ("specops_lean::rope_attend", "attention"),
        ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
        ("specops_lean::add_rms_norm", "norms/activations"),
        ("aten::silu", "norms/activations"),
        ("aten::slice", None),
    ],
)
def test_ops_fall_in_their_category(op, expected):
    assert category(op) == expected


def test_a_breakdown_measures_both_paths_and_accounts_for_the_wall_time():
    model = tiny_target("int4")
    result = breakdown(model, rows=4, context=16, repeats=3)
    assert [(p.path, p.rows) for p in result.passes] == [
        ("transformers", 1),
        ("transformers", 4),
        ("lean", 1),
        ("lean", 4),
    ]
    for p in result.passes:
        assert set(p.ms) == set(CATEGORIES) and all(v >= 0 for v in p.ms.values())
        assert p.ms["matmuls"] > 0 and p.ms["attention"] > 0
    assert result.limit_ms > 0 and result.weight_bytes_per_token > 0
    report = breakdown_report(hardware_target("cpu"), result)
    assert "lean" in report and "transformers" in report and "limit" in report


def test_a_breakdown_refuses_a_one_row_block():
    with pytest.raises(BadInputError, match="rows must be >= 2"):
        breakdown(tiny_target("int8"), rows=1)
