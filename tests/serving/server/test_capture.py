from serving.drafters.prompt_lookup import PromptLookupDrafter
from serving.engine import SpeculativeDecoder
from serving.policy import FixedK
from serving.records import store
from serving.server.capture import Capture
from tasks.data.validate import validate_store


def detailed_record(target, prompt):
    decoder = SpeculativeDecoder(target, drafter=PromptLookupDrafter(), policy=FixedK(3))
    return decoder.generate(prompt, max_new_tokens=24, mode="detailed").record


def test_captured_requests_land_in_the_store_and_validate(tmp_path, target, prompt):
    capture = Capture(root=tmp_path, share=1.0, hardware="cpu", chunk_size=2)
    for i in range(3):
        capture.add(
            detailed_record(target, prompt[i:]),
            prompt_text=f"prompt {i}",
            output_text="text",
            drafter_version="7",
        )
    assert len(store.part_files(tmp_path)) == 1  # two records flushed as one part
    assert capture.flush() == 1
    parts = store.part_files(tmp_path)
    assert len(parts) == 2 and all("hardware=cpu" in str(p) for p in parts)
    result = validate_store(tmp_path, known_hardware=["cpu"], run_id="t")
    assert result.summary["valid"] == 3 and result.summary["quarantined"] == 0
    assert {r["workload"] for r in result.valid} == {"live"}
    assert {r["drafter_version"] for r in result.valid} == {"7"}


def test_the_share_decides_how_many_requests_are_captured(tmp_path):
    assert not any(Capture(root=tmp_path, share=0.0, hardware="cpu").wants() for _ in range(50))
    assert all(Capture(root=tmp_path, share=1.0, hardware="cpu").wants() for _ in range(50))
    some = Capture(root=tmp_path, share=0.3, hardware="cpu", seed=1)
    taken = sum(some.wants() for _ in range(1000))
    assert 230 < taken < 370


def test_old_records_are_flushed_by_age(tmp_path, target, prompt):
    capture = Capture(root=tmp_path, share=1.0, hardware="cpu", chunk_size=100, max_age_s=0.0)
    capture.add(detailed_record(target, prompt), prompt_text="p", output_text="o")
    capture.flush_if_old()
    assert len(store.part_files(tmp_path)) == 1
