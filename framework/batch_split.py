"""How a batch is cut over the ranks that share its work: the one place a batch is split, and the
contract a task states for it (`Task.batch_split`; ground floor: imports nothing of the framework).

A step's batch is cut three ways: over the data-parallel ranks (the sampler deals whole rows:
framework/data/sampler.py), into microbatches for pipeline stages (the task's `pipeline_split`; a
language model's: `for_stages`), and along the sequence over context-parallel ranks (`cut_sequence`, called by
framework/strategy/mesh/context.py). The strategy moves a batch to the device first
(`batch_to_device` only moves) and cuts it after (`split_batch`).

A sequence cut shifts the labels first: each position keeps its own next-token label, the last
position of a share too, under SHIFTED (transformers' `shift_labels`). A task reads any batch,
whole or cut, through `inputs_and_targets` and `scored_tokens`.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from framework.errors import ConfigError
from framework.sequences import IGNORE_INDEX, document_ids, next_token_targets

#: the key of a cut batch's labels, shifted before the cut
SHIFTED = "shift_labels"


@dataclass(frozen=True)
class BatchSplit:
    """What a task's batch allows besides whole rows over the data-parallel ranks."""

    #: its rows may be cut along the sequence (context parallelism): its loss is a sum over
    #: positions, each scored from its own next-token label
    sequence: bool = False
    #: the fields of a dict batch cut along the sequence with the rows (B, T each); others are refused
    per_token: tuple[str, ...] = ("input_ids", "labels", "position_ids", "attention_mask")
    #: the field whose next-token labels are taken before the cut (input_ids where a batch has none)
    shifted: str = "labels"


#: whole rows only (a classifier's, a GAN's, a preference task's pairs, a distillation's)
WHOLE_ROWS = BatchSplit()
#: a language model's: rows cut along the sequence too
SEQUENCE = BatchSplit(sequence=True)


def is_cut(batch) -> bool:
    """Whether `batch` is a share of each row's positions (labels shifted already)."""
    return isinstance(batch, Mapping) and SHIFTED in batch


def inputs_and_targets(batch) -> tuple[dict, torch.Tensor]:
    """(the model's keyword inputs, each position's next-token label (B, T): -100 where none is
    scored), of a whole batch or a cut one. A dict batch: every key but its labels goes to the
    model; a pair (tokens, next tokens): the tokens as input_ids."""
    if isinstance(batch, Mapping):
        if "input_ids" not in batch:
            raise ConfigError(f"task: a dict batch needs input_ids (it has {', '.join(batch)}).")
        if is_cut(batch):
            return {k: v for k, v in batch.items() if k != SHIFTED}, batch[SHIFTED]
        labels = batch.get("labels", batch["input_ids"])
        return {k: v for k, v in batch.items() if k != "labels"}, next_token_targets(labels)
    tokens, targets = batch
    return {"input_ids": tokens}, targets


def scored_tokens(batch) -> int:
    """Tokens a next-token loss scores in `batch` (whole or cut): every next token not -100."""
    if is_cut(batch):
        return int((batch[SHIFTED] != IGNORE_INDEX).sum())
    if isinstance(batch, Mapping):
        labels = batch.get("labels", batch.get("input_ids"))
        return int((labels[:, 1:] != IGNORE_INDEX).sum())
    return int((batch[1] != IGNORE_INDEX).sum())


def for_stages(batch, strategy: str = "pipeline") -> tuple[torch.Tensor, torch.Tensor]:
    """(token ids, each position's next-token label) of a whole batch as pipeline stages take it,
    cut into microbatches along the rows by the schedule: only the token ids pass between stages.
    Packed rows (position_ids: documents kept apart) cannot; the compatibility table refuses them
    before launch where the data says it packs, and this where a batch carries them regardless."""
    if not isinstance(batch, Mapping):
        return batch[0], batch[1]
    refuse_positions_in_stages(batch.get("position_ids"), strategy)
    return batch["input_ids"], next_token_targets(batch.get("labels", batch["input_ids"]))


def refuse_positions_in_stages(position_ids: torch.Tensor | None, strategy: str) -> None:
    if position_ids is not None:
        raise ConfigError(f"strategy={strategy}: packed rows (position_ids) do not pass between stages; set "
                          "data.packing=false, or use strategy=fsdp.")


@dataclass
class SequenceCut:
    """A batch made ready to be cut along the sequence: its fields (B, L) padded to `length` (a
    multiple of the pieces), labels shifted (SHIFTED), positions made explicit (the global ones);
    the keys that are real (`mask`: padded rows) and the documents of packed rows, for attention."""

    fields: dict[str, torch.Tensor]
    length: int
    mask: torch.Tensor | None
    documents: torch.Tensor | None


def cut_sequence(batch, split: BatchSplit, pieces: int) -> SequenceCut:
    """`batch` as `split` allows it to be cut into `pieces` equal pieces along the sequence: a
    row not a multiple of `pieces` long padded on after every real token (labels -100, keys
    masked, positions counting on: causal attention never reads them and they score nothing)."""
    if not split.sequence:
        raise ConfigError("a batch cut along the sequence whose task does not allow it (its batch_split.sequence "
                          "is false); set strategy.context_parallel_size=1.")
    if isinstance(batch, Mapping):
        extra = sorted(set(batch) - set(split.per_token))
        if extra:
            raise ConfigError(f"strategy.context_parallel_size: the batch has {', '.join(extra)}, which the task does "
                              f"not cut along the sequence (its batch_split.per_token: {', '.join(split.per_token)}); "
                              "set strategy.context_parallel_size=1.")
        ids = batch["input_ids"]
        targets = next_token_targets(batch.get(split.shifted, ids))
        positions, mask = batch.get("position_ids"), batch.get("attention_mask")
        documents_from_positions = positions is not None
    else:
        ids, targets = batch
        positions = mask = None
        documents_from_positions = False
    length = -(-ids.shape[1] // pieces) * pieces
    if positions is None:
        positions = torch.arange(ids.shape[1], device=ids.device).expand(ids.shape[0], ids.shape[1])
    if length != ids.shape[1]:
        ids, targets, positions, mask = (_pad(ids, length, 0), _pad(targets, length, IGNORE_INDEX),
                                         _pad(positions, length, None), _pad(mask, length, 0))
    documents = document_ids(positions) if documents_from_positions else None
    return SequenceCut({"input_ids": ids, "position_ids": positions, SHIFTED: targets}, length,
                       mask.bool() if mask is not None else None, documents)


def _pad(tensor: torch.Tensor | None, length: int, value: int | None) -> torch.Tensor | None:
    """`tensor` (B, T) padded on the right to `length` with `value` (None: positions, counting on)."""
    if tensor is None:
        return None
    extra = length - tensor.shape[1]
    if value is None:
        tail = tensor[:, -1:] + torch.arange(1, extra + 1, device=tensor.device)
    else:
        tail = torch.full((tensor.shape[0], extra), value, dtype=tensor.dtype, device=tensor.device)
    return torch.cat([tensor, tail], dim=1)
