"""`strategy=hooked_ddp`: a DDP strategy that wraps the model its own way (the pattern of
Lightning's `configure_ddp`): here, a communication hook that averages gradients itself and
counts the buckets it reduced."""
# No `from __future__ import annotations` here: DDP checks the hook's annotations as objects.
import torch
import torch.distributed as dist

from framework.strategy.ddp import DDPStrategy


def averaging_hook(state: dict, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """All-reduce a bucket's gradients and divide by the world size (what DDP does by default)."""
    state["buckets"] += 1
    tensor = bucket.buffer().div_(dist.get_world_size())
    work = dist.all_reduce(tensor, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


class HookedDDPStrategy(DDPStrategy):
    """DDP with a gradient communication hook registered at wrap time."""

    name = "hooked_ddp"

    def __init__(self, *args, report_buckets: bool = True, **kwargs):
        """report_buckets: print how many gradient buckets the hook reduced, at teardown."""
        super().__init__(*args, **kwargs)
        self.report_buckets = report_buckets
        self.hook_state = {"buckets": 0}

    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        wrapped = super().wrap_model(model)
        wrapped.register_comm_hook(self.hook_state, averaging_hook)
        return wrapped

    def teardown(self) -> None:
        if self.report_buckets and self.is_global_zero:
            print(f"hooked_ddp: reduced {self.hook_state['buckets']} gradient bucket(s)", flush=True)
        super().teardown()
