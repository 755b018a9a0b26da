"""``specops chat``: an interactive terminal session that loads the target once and keeps it.

- :mod:`specops.chat.commands`: the session's settings and what a typed line means (pure:
  no model, no terminal);
- :mod:`specops.chat.session`: decoding, ``/compare``, ``/stats``, ``/champion`` and
  ``/save`` on the loaded target (no terminal: text arrives through callbacks);
- :mod:`specops.chat.jobs`: ``/eval`` and ``/train``, the loop's flows run as ``specops``
  subprocesses whose progress is read line by line;
- :mod:`specops.chat.ui`: the terminal (prompt_toolkit line editing, history and
  completion; rich output) and Ctrl-C handling.
"""
