"""The head settings sweep refuses a bad command line before it starts any run."""

from __future__ import annotations

import pytest

from benchmarks.head_sweep import main


@pytest.mark.parametrize(
    "extra, message",
    [
        ([], "give at least one --run NAME JSON"),
        (["--run", "a", "{}", "--run", "b", "{lr: 1}"], "--run b: '{lr: 1}' is not a JSON object"),
        (["--run", "a", "[1, 2]"], "--run a: '[1, 2]' is not a JSON object"),
        (["--run", "a", "{}", "--marks", "400,many"], "--marks takes comma-separated step counts"),
    ],
)
def test_a_bad_command_line_starts_nothing(tmp_path, capsys, extra, message):
    out = tmp_path / "sweep"
    args = ["--teacher", tmp_path / "t", "--heldout", tmp_path / "h", "--out", out, *extra]
    with pytest.raises(SystemExit) as exit_:
        main([str(a) for a in args])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
    assert not out.exists()  # no run was started (each writes its log there)
