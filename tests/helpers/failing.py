"""Models and constructors that fail on purpose, to test how failures are reported."""
import os

from framework.models.mlp import MLP


class FailOnRank(MLP):
    def __init__(self, rank: int = 1, **kwargs):
        super().__init__(**kwargs)
        self.fail_rank = rank

    def forward(self, x):
        if int(os.environ.get("RANK", 0)) == self.fail_rank:
            raise RuntimeError(f"deliberate failure on rank {self.fail_rank}")
        return super().forward(x)


def needs_a_missing_package():
    """A constructor that imports a package no machine has (tests/config/test_targets.py)."""
    import no_such_package_for_the_test  # noqa: F401
