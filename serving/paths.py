"""Where the checkout's own files are: every module that reads ``configs/`` or runs a
command from the project root takes the path from here, so moving a module never breaks
it."""

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = PROJECT_ROOT / "configs"
