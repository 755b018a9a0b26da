"""The server's endpoints by area, one ``APIRouter`` each, its handlers module-level
functions that read the :class:`~serving.server.state.ServerState` from the app."""
