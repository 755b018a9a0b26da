"""What ``specops profile`` prints of a measured profile (:mod:`tasks.bench.profile`): where it
ran, the costs relative to a one-token pass, and the line ``configs/hardware.yaml`` takes."""

from __future__ import annotations

from serving.hardware import HardwareTarget
from tasks.bench.profile import BatchProfile, PassProfile, batch_yaml, curve_yaml


def pass_report(hardware: HardwareTarget, result: PassProfile) -> str:
    """A :func:`~tasks.bench.profile.profile_hardware` result, ending in its
    ``verify_curve:`` line."""
    max_n = len(result["verify_curve"])
    draft_cost = ", ".join(f"{name}={cost:.3g}" for name, cost in result["draft_cost"].items())
    return "\n".join(
        [
            f"{hardware.name}: {result['device_name']} ({result['device']}, {result['dtype']}, "
            f"{result['threads']} threads)",
            f"verify cost by block size n=1..{max_n} (relative to n=1):",
            "  " + ", ".join(f"{c:.2f}" for c in result["verify_curve"]),
            f"one-token target pass: {result['target_pass_s'][1] * 1000:.1f} ms",
            "draft cost per token (relative to a target pass): " + draft_cost,
            f"for configs/hardware.yaml, under targets.{hardware.name} (made non-decreasing):",
            "    " + curve_yaml(result["config_curve"]),
        ]
    )


def batch_report(hardware: HardwareTarget, batched: BatchProfile) -> str:
    """A :func:`~tasks.bench.profile.profile_batch_hardware` result: the cost of every
    (rows, sequences) cell relative to one row of one sequence, ending in its
    ``batch_curve:`` line."""
    table = batched["table"]
    one_row = next(c for c in table if (c["rows"], c["sequences"]) == (1, 1))
    counts = sorted({c["sequences"] for c in table})
    lines = [
        f"{hardware.name}: {batched['device_name']} ({batched['device']}, {batched['dtype']}, "
        f"{batched['threads']} threads), contexts {batched['context']}",
        f"packed pass over 1 row of 1 sequence: {one_row['pass_s'] * 1000:.1f} ms",
        "cost by rows n (rows), sequences B (columns), relative to that pass:",
        "  rows " + "".join(f"{f'B={b}':>8}" for b in counts),
    ]
    for n in sorted({c["rows"] for c in table}):
        costs = {c["sequences"]: c["cost"] for c in table if c["rows"] == n}
        lines.append(
            f"  {n:>4} " + "".join(f"{costs[b]:>8.2f}" if b in costs else " " * 8 for b in counts)
        )
    lines += [
        f"for configs/hardware.yaml, under targets.{hardware.name} (the most sequences, "
        "made non-decreasing):",
        "    " + batch_yaml(batched["batch_curve"]),
    ]
    return "\n".join(lines)
