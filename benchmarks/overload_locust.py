"""The users of ``python -m benchmarks.overload`` for locust (``locust -f`` this file; the
benchmark runs it). Two kinds, counted by the environment the benchmark sets:

- ``ChatUser`` (``OVERLOAD_USERS``): a chat request, then ``OVERLOAD_THINK_S`` seconds.
- ``StormUser`` (``OVERLOAD_STORM_USERS``): the same request again at once, whatever the
  answer, ``Retry-After`` ignored (the issue's 64 users retrying at once).

A 429 is not a failure of the load test (it is the answer under test); the benchmark
counts answers by status from the server's own metrics, and takes locust's request rate.
"""

from __future__ import annotations

import json
import os

from locust import FastHttpUser, constant, task

BODY = json.loads(os.environ.get("OVERLOAD_BODY", "{}"))


def _ask(user: FastHttpUser, kind: str) -> None:
    with user.client.post(
        "/v1/chat/completions", json=BODY, catch_response=True, name=kind
    ) as response:
        if response.status_code in (200, 429):
            response.success()


class ChatUser(FastHttpUser):
    fixed_count = int(os.environ.get("OVERLOAD_USERS", "0"))
    wait_time = constant(float(os.environ.get("OVERLOAD_THINK_S", "1")))

    @task
    def chat(self) -> None:
        _ask(self, "chat")


class StormUser(FastHttpUser):
    fixed_count = int(os.environ.get("OVERLOAD_STORM_USERS", "0"))
    wait_time = constant(0)

    @task
    def storm(self) -> None:
        _ask(self, "storm")
