"""What `specops profile` prints of a measured profile: where it ran, relative costs, and
the exact line configs/hardware.yaml takes (a (rows, sequences) cell not measured left
blank)."""

from __future__ import annotations

from serving.hardware import hardware_target
from tasks.bench.profile import BatchProfile, PassProfile
from tasks.bench.profile_report import batch_report, pass_report


def test_pass_report_ends_in_the_verify_curve_line():
    result: PassProfile = {
        "context": 256, "repeats": 3, "threads": 2, "device": "cpu", "device_name": "cpu",
        "dtype": "float32", "target_pass_s": {1: 0.0123, 2: 0.02, 3: 0.019},
        "verify_curve": [1.0, 1.626, 1.545], "config_curve": [1.0, 1.626, 1.626],
        "draft_cost": {"layers:1": 0.12, "layers:4": 0.351},
    }  # fmt: skip
    assert pass_report(hardware_target("cpu"), result).splitlines() == [
        "cpu: cpu (cpu, float32, 2 threads)",
        "verify cost by block size n=1..3 (relative to n=1):",
        "  1.00, 1.63, 1.54",
        "one-token target pass: 12.3 ms",
        "draft cost per token (relative to a target pass): layers:1=0.12, layers:4=0.351",
        "for configs/hardware.yaml, under targets.cpu (made non-decreasing):",
        "    verify_curve: [1.0, 1.626, 1.626]",
    ]


def test_batch_report_tables_rows_by_sequences():
    cells = [(1, 1, 0.01, 1.0), (2, 1, 0.012, 1.2), (2, 2, 0.015, 1.5)]
    batched: BatchProfile = {
        "context": [200, 180], "repeats": 3, "threads": 1, "device": "cpu",
        "device_name": "cpu", "dtype": "float32",
        "table": [{"rows": n, "sequences": b, "pass_s": s, "cost": c} for n, b, s, c in cells],
        "batch_curve": [(1, 1.0), (2, 1.5)], "prefill": [(16, 0.02)],
    }  # fmt: skip
    assert batch_report(hardware_target("cpu"), batched).splitlines() == [
        "cpu: cpu (cpu, float32, 1 threads), contexts [200, 180]",
        "packed pass over 1 row of 1 sequence: 10.0 ms",
        "cost by rows n (rows), sequences B (columns), relative to that pass:",
        "  rows      B=1     B=2",
        "     1     1.00        ",  # B = 2 needs two rows
        "     2     1.20    1.50",
        "for configs/hardware.yaml, under targets.cpu (the most sequences, made non-decreasing):",
        "    batch_curve: [[1, 1.0], [2, 1.5]]",
    ]
