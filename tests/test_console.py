"""What a training process prints besides metrics (framework/console.py)."""
from __future__ import annotations

import time
import warnings

from framework.console import WarningsOnce, announce_if_slow


def test_a_slow_phase_is_announced_and_a_quick_one_is_not(capsys):
    with announce_if_slow("building the model", after_s=0.05, why="a big one"):
        time.sleep(0.3)
    with announce_if_slow("reading the data", after_s=5):
        pass
    with announce_if_slow("on another rank", enabled=False, after_s=0.01):
        time.sleep(0.1)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "building the model (a big one)..."
    assert lines[1].startswith("building the model: done in 0.") and lines[1].endswith(" s")
    assert len(lines) == 2


def test_rank_zero_shows_each_warning_once_and_other_ranks_none(capsys):
    def library_step():  # a library warning from inside the training loop, re-armed every step
        warnings.resetwarnings()
        warnings.warn("`all_gather_into_tensor` is deprecated", FutureWarning, stacklevel=1)

    shown = []
    with warnings.catch_warnings():
        warnings.showwarning = lambda message, *args, **kwargs: shown.append(str(message))
        quiet = WarningsOnce(rank=0)
        for _ in range(5):
            library_step()
        warnings.warn("another one", UserWarning, stacklevel=1)
        quiet.restore()
        assert shown == ["`all_gather_into_tensor` is deprecated", "another one"]
        other = WarningsOnce(rank=1)
        library_step()
        other.restore()
        assert len(shown) == 2
        everything = WarningsOnce(rank=1, debug=True)
        warnings.warn("seen with debug=true", UserWarning, stacklevel=1)
        everything.restore()
        assert shown[-1] == "seen with debug=true"
