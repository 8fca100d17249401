"""A model that fails on one rank, to test how a worker failure is reported."""
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
