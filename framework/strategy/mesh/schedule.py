"""The other side of the applier surface: a schedule that runs a step itself.

Most layouts run a micro-batch the plain way (the strategy's forward and backward, FSDP2's
gradients, DCP's state). A layout whose model is cut into pieces that pass activations between
ranks (pipeline stages) instead runs each step in a schedule of its own, and so also owns what
follows from the cut: the modules FSDP2 shards as roots, how this rank's tensors are allocated,
which parameters the gradient norm counts and over which group, and how the checkpoint state is
gathered and given back. Those are this surface, one object per layout (at most one applier of a
layout provides it: its `schedule` hook is COMBINED's "one"), not hooks every applier carries.
framework/strategy/mesh/pipeline/applier.py provides the pipeline's."""
from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class Schedule(ABC):
    """What a layout's step schedule answers: the abstract methods each schedule implements, the
    others a default a schedule may keep."""

    @abstractmethod
    def roots(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        """The modules FSDP2 shards as roots (a pipeline rank's stages)."""

    @abstractmethod
    def materialise(self, model: torch.nn.Module, log, device: torch.device) -> None:
        """Allocate this rank's tensors and replay the recorded initialisation into them."""

    def attach(self, model: torch.nn.Module) -> None:
        """After the appliers and the materialisation: the schedule set up over the model."""

    @abstractmethod
    def forward_backward(self, model, task, batch, group: int, scale, loss_of):
        """Both passes of every microbatch of `batch`: (the loss the guard watches, the logged share)."""

    def counted(self, model: torch.nn.Module) -> list | None:
        """The parameters the gradient norm counts, where not all (a tied head's copy left out)."""
        return None

    #: a process group the norm's squares are summed over besides the meshes' (the stages')
    norm_group = None

    @abstractmethod
    def merged_model_state(self, own: dict) -> dict:
        """This rank's model state merged with the other ranks' into the whole (collective)."""

    @abstractmethod
    def merged_optimizer_state(self, own: dict) -> dict:
        """This rank's optimizer state merged with the other ranks' into the whole (collective)."""

    @abstractmethod
    def load_model_state(self, model: torch.nn.Module, full: dict) -> None:
        """This rank's part of a whole model state loaded into `model`."""

    def optimizer_state_to_load(self, model: torch.nn.Module, full: dict) -> dict:
        """A whole optimizer state as this rank's optimizer loads it."""
        return full
