"""The served predictor: loads, swaps on a new version, and keeps the previous one when a
new one fails to load."""

from __future__ import annotations

import os

from serving.hardware import hardware_target
from serving.server.predictor_watch import LocalPredictor, PredictorWatcher
from tests.serving.engine.cascade.conftest import tiny_predictor


def test_swaps_on_change_and_keeps_serving_through_a_bad_version(tmp_path):
    folder = tiny_predictor(seed=0).save(tmp_path / "p")
    watcher = PredictorWatcher(LocalPredictor(folder), hardware=hardware_target("cpu"))
    first = watcher.current
    assert first is not None and watcher.last_error is None
    assert watcher.poll() is False  # nothing changed

    meta = folder / "predictor.json"
    good = meta.read_text()
    meta.write_text(good.replace('"hardware": "cpu"', '"hardware": "cuda"'))
    os.utime(meta, ns=(1, 10**18))
    assert watcher.poll() is False
    assert watcher.current is first  # the previous predictor still serves
    assert "hardware target 'cuda', not 'cpu'" in (watcher.last_error or "")

    tiny_predictor(seed=1).save(folder)
    assert watcher.poll() is True
    assert watcher.current is not first and watcher.last_error is None and watcher.swaps == 2


def test_no_predictor_at_start_leaves_the_cascade_on_running_acceptance(tmp_path):
    watcher = PredictorWatcher(
        LocalPredictor(tmp_path / "missing"), hardware=hardware_target("cpu")
    )
    assert watcher.current is None
    assert "no predictor" in (watcher.last_error or "")
