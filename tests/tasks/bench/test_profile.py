from __future__ import annotations

from serving.models.tiny import tiny_llama
from tasks.bench.profile import profile_model


def test_profile_reports_a_curve_relative_to_one_token():
    result = profile_model(
        tiny_llama(), max_n=3, context=16, repeats=2, draft_layers=(1, 2), progress=False
    )
    assert result["verify_curve"][0] == 1.0
    assert len(result["verify_curve"]) == 3
    assert set(result["draft_cost"]) == {"layers:1", "layers:2"}
    assert all(t > 0 for t in result["target_pass_s"].values())
