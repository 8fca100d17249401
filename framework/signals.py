"""Signal names as the config writes them (`SIGTERM` or `TERM`), read in one place."""
from __future__ import annotations

import signal


def signal_number(name: str) -> signal.Signals:
    """The signal called `name` ('SIGUSR1' or 'USR1'); KeyError for a name that is no signal."""
    name = str(name)
    return signal.Signals[name if name.startswith("SIG") else f"SIG{name}"]


def is_signal_name(name: str) -> bool:
    try:
        signal_number(name)
    except KeyError:
        return False
    return True
