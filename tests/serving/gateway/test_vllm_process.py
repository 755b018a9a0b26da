"""How a vLLM server is started, and what of its log says why it stopped."""

from __future__ import annotations

import json
from pathlib import Path

from serving.gateway.vllm_process import ServerSpec, vllm_error

PYDANTIC_TAIL = """\
  File ".../vllm/engine/arg_utils.py", line 2099, in create_speculative_config
    return SpeculativeConfig(**self.speculative_config)
pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig
  Value error, prompt_lookup_min=5 must be <= prompt_lookup_max=2 [type=value_error]
    For further information visit https://errors.pydantic.dev/2.14/v/value_error
"""


def test_the_reason_is_the_exception_and_its_detail():
    reason = vllm_error(PYDANTIC_TAIL)
    assert reason.startswith("pydantic_core._pydantic_core.ValidationError: 1 validation")
    assert "prompt_lookup_min=5 must be <= prompt_lookup_max=2" in reason
    assert "errors.pydantic.dev" not in reason
    prefixed = "(EngineCore pid=7) ERROR 11-24 [core.py:1] RuntimeError: out of memory\n"
    assert vllm_error(prefixed) == "RuntimeError: out of memory"
    assert vllm_error("just stopped\n") == "just stopped"


def test_the_command_is_vllms_own_server_with_its_keys(tmp_path):
    config = {"method": "suffix", "num_speculative_tokens": 3}
    spec = ServerSpec(python=Path("py"), model=tmp_path, served_model_name="specops",
                      speculative_config=config)  # fmt: skip
    command = spec.command(8123)
    assert command[:3] == ["py", "-m", "vllm.entrypoints.openai.api_server"]
    assert json.loads(command[command.index("--speculative-config") + 1]) == config
    assert command[command.index("--per-request-spec-decode-metrics") + 1] == "detailed"
    assert "--enforce-eager" in command and command[command.index("--port") + 1] == "8123"
    assert spec.environment()["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    plain = ServerSpec(python=Path("py"), model=tmp_path, served_model_name="s",
                       speculative_config=None).command(1)  # fmt: skip
    assert "--speculative-config" not in plain
