"""What a handler gets from the app: the :class:`ServerState` that ``create_app`` keeps on
``app.state.server``, as a function and as a FastAPI dependency."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from serving.server.state import ServerState


def server_state(request: Request) -> ServerState:
    state = request.app.state.server
    assert isinstance(state, ServerState), "create_app keeps the ServerState on app.state"
    return state


ServerStateDep = Annotated[ServerState, Depends(server_state)]
