"""Knowledge distillation (`task=distillation`): a student language model trained on a frozen
teacher's distribution over the next token as well as on the labels (Hinton et al. 2015; torchtune's
KD recipe, NeMo's kd_ratio).

Per scored token (labels of -100, prompts and padding, are left out), with the student's logits s,
the teacher's t and temperature T:

    loss = (1 - kd_ratio) * CE(s, label) + kd_ratio * T² * D(softmax(t / T), softmax(s / T))

where D is `forward_kl`, KL(teacher || student) = Σ p_t (log p_t - log p_s) (the student covers
every token the teacher gives mass to: Hinton's), or `reverse_kl`, KL(student || teacher) (the
student keeps to the teacher's modes: MiniLLM's). The KL term is scaled by T², as Hinton et al. do,
so that its gradients keep their size as T changes. Both terms are sums over the step's scored
tokens divided by their number (the language model's normalisation: framework/tasks/base.py), so
the loss does not depend on how the step is split into ranks and micro-batches.

The teacher is a frozen model placed by the strategy as the student is (framework/tasks/frozen.py):
a run directory of this framework (its own model config) or a local Hugging Face directory, whose
vocabulary and tokenizer must be the student's and the data's (refused before launch otherwise).
Its logits are computed under no_grad in every training step. Validation reports the student's
plain next-token loss and perplexity (comparable with a run trained on the labels alone) and the
divergence to the teacher (`kl`, at the temperature).
"""
from __future__ import annotations

from typing import Literal

import torch
from torch.nn import functional as F

from framework.batch_split import WHOLE_ROWS, inputs_and_targets
from framework.config.types import NonNegativeFloat, PositiveFloat, PositiveInt
from framework.errors import ConfigError
from framework.sequences import IGNORE_INDEX
from framework.tasks.chunked_loss import capturing, chunked_head, scored_by
from framework.tasks.language_modeling import LanguageModeling, output_logits
from framework.tasks.second_model import FrozenSource, missing
from framework.tasks.token_logps import check_chunkable

DIVERGENCES = ("forward_kl", "reverse_kl")


def token_divergence(student: torch.Tensor, teacher: torch.Tensor, temperature: float, divergence: str) -> torch.Tensor:
    """Each token's divergence (N,) between the teacher's and the student's distributions over the
    vocabulary at `temperature` (logits (N, vocab)), times T²."""
    log_s = F.log_softmax(student.float() / temperature, dim=-1)
    log_t = F.log_softmax(teacher.float() / temperature, dim=-1)
    if divergence == "forward_kl":
        kl = (log_t.exp() * (log_t - log_s)).sum(-1)
    else:
        kl = (log_s.exp() * (log_s - log_t)).sum(-1)
    return kl * temperature ** 2


class Distillation(LanguageModeling):
    """The next-token loss mixed with the divergence to a frozen teacher's distribution."""

    frozen_model = True  # the teacher
    batch_split = WHOLE_ROWS  # the teacher's attention would need the sequence cut too
    pipeline_split = None  # the teacher has no stages (the compatibility table says so)
    summed_loss = None

    def __init__(self, teacher: str | None = None, divergence: Literal["forward_kl", "reverse_kl"] = "forward_kl",
                 temperature: PositiveFloat = 1.0, kd_ratio: NonNegativeFloat = 0.5,
                 loss_chunk_tokens: PositiveInt | None = None):
        """teacher: a run directory (outputs/<name>: its best checkpoint, else its newest), a
        checkpoint directory or a local Hugging Face model directory; divergence: forward_kl
        (KL(teacher || student): Hinton's) or reverse_kl (KL(student || teacher)); temperature: the
        softmax temperature of both distributions in the divergence (above 1: softer, the teacher's
        ranking of unlikely tokens counts more), the divergence scaled by its square; kd_ratio: the
        divergence's share of the loss, the labels' cross-entropy the rest (0: plain language
        modeling, 1: the teacher alone); loss_chunk_tokens: both models' output heads and the loss
        computed this many tokens at a time, never either's whole logits (the teacher's hidden
        states and head captured in its forward, each chunk's logits of both made, scored and
        dropped: framework/tasks/chunked_loss.py); null: the whole logits."""
        super().__init__(loss_chunk_tokens=loss_chunk_tokens)
        if not teacher:
            raise ConfigError("task.teacher: give the teacher's directory (a run directory of this framework, "
                              "outputs/<name>, or a local Hugging Face model directory).")
        if divergence not in DIVERGENCES:
            raise ConfigError(f"task.divergence={divergence!r}: choose forward_kl or reverse_kl.")
        if not temperature > 0:
            raise ConfigError(f"task.temperature={temperature}: must be above 0 (1: the models' own distributions).")
        if not 0 <= kd_ratio <= 1:
            raise ConfigError(f"task.kd_ratio={kd_ratio}: must be between 0 and 1 (the divergence's share of the loss).")
        self.teacher_path, self.divergence = teacher, divergence
        self.temperature, self.kd_ratio = float(temperature), float(kd_ratio)

    def frozen_source(self) -> FrozenSource:
        return FrozenSource("task.teacher", self.teacher_path, adapters_may_stand_in=False)

    def _sums(self, model, batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(the labels' cross-entropy summed over the scored tokens, the divergence summed over them,
        their number)."""
        if self.frozen is None:
            raise missing("task.teacher", "distillation")
        inputs, targets = inputs_and_targets(batch)
        if self.loss_chunk_tokens is not None:
            return self._chunked_sums(model, inputs, targets)
        logits = output_logits(model(**inputs))
        with self.frozen.computing(model) as teacher:
            taught = output_logits(teacher(**inputs))
        scored = (targets != IGNORE_INDEX).reshape(-1)  # a mask, not an index: shapes stay static
        student, teacher = logits.reshape(-1, logits.shape[-1]), taught.reshape(-1, taught.shape[-1])
        cross_entropy = F.cross_entropy(student.float(), targets.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum")
        divergence = (token_divergence(student, teacher, self.temperature, self.divergence) * scored).sum()
        return cross_entropy, divergence, scored.sum()

    def _chunked_sums(self, model, inputs, targets) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """As _sums, a chunk of positions at a time: the teacher's forward gives its hidden states
        and its head's weights (captured inside it, whole under any strategy), then the student's
        head scores each chunk of its own logits against the teacher's logits of the same positions,
        made there from the captured ones; neither model's whole logits are ever held."""
        check_chunkable(model)
        with self.frozen.computing(model) as teacher:
            check_chunkable(teacher)
            head = chunked_head(teacher, self.loss_chunk_tokens)
            with capturing(head):
                hidden = output_logits(teacher(**inputs))
            weight, bias = head._captured
            head._captured = None
        hidden, goal = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
        scored = goal != IGNORE_INDEX

        def both(logits: torch.Tensor, start: int, stop: int) -> torch.Tensor:
            with torch.no_grad():
                taught = F.linear(hidden[start:stop], weight, bias)
            cross_entropy = F.cross_entropy(logits.float(), goal[start:stop], ignore_index=IGNORE_INDEX, reduction="none")
            divergence = token_divergence(logits, taught, self.temperature, self.divergence) * scored[start:stop]
            return torch.stack([cross_entropy, divergence], dim=1)

        with scored_by(chunked_head(model, self.loss_chunk_tokens), both, goal.shape[0]):
            sums = output_logits(model(**inputs)).reshape(-1, 2).sum(0)
        return sums[0], sums[1], scored.sum()

    def training_sums(self, model, batch) -> tuple[torch.Tensor, torch.Tensor]:
        cross_entropy, divergence, count = self._sums(model, batch)
        return (1 - self.kd_ratio) * cross_entropy + self.kd_ratio * divergence, count

    def training_step(self, model, batch) -> torch.Tensor:
        loss_sum, count = self.training_sums(model, batch)
        return loss_sum / count.clamp(min=1)

    def validation_step(self, model, batch) -> dict[str, torch.Tensor]:
        cross_entropy, divergence, count = self._sums(model, batch)
        return {"loss_sum": cross_entropy.double(), "kl_sum": divergence.double(), "tokens": count.double()}

    def compute_metrics(self, sums) -> dict[str, float]:
        metrics = super().compute_metrics(sums)
        return {**metrics, "kl": (sums["kl_sum"] / sums["tokens"].clamp(min=1)).item()}
