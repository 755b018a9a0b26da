"""The steps run on the GPU machine (tasks/gpu/steps.py) that need no GPU to check."""

import json

from serving.engine.drafters.package import DraftManifest, write_package
from tasks.gpu.steps import _prompts


def test_the_bench_takes_its_prompts_in_turn_from_each_workload(tmp_path):
    bundle = tmp_path / "work" / "bundle"
    bundle.mkdir(parents=True)
    (bundle / "request.json").write_text(json.dumps({
        "format": 1, "hardware": "cuda", "max_new_tokens": 16,
        "contenders": {"challenger-0": "ngram/1"},
    }))  # fmt: skip
    rows = [
        {"id": f"{workload}-{i}", "workload": workload, "token_ids": [1, 2, i + 3]}
        for workload, count in (("humaneval", 4), ("grounded", 4), ("sharegpt", 2))
        for i in range(count)
    ]  # listed workload by workload, as a bundle lists them
    (bundle / "prompts.json").write_text(json.dumps(rows))
    write_package(bundle / "packages" / "challenger-0", DraftManifest(drafter="pld:3"))
    six = [p.id for p in _prompts(tmp_path, 6)]
    assert six == ["humaneval-0", "grounded-0", "sharegpt-0", "humaneval-1", "grounded-1",
                   "sharegpt-1"]  # fmt: skip
    every = [p.id for p in _prompts(tmp_path, 20)]
    assert sorted(every) == sorted(r["id"] for r in rows)
    assert every[-2:] == ["humaneval-3", "grounded-3"]  # the short workload ran out first
    assert [p.id for p in _prompts(tmp_path)] == [r["id"] for r in rows]
