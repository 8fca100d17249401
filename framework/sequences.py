"""Token sequences as the language-model task, the models and context parallelism read them
(ground floor: imports nothing of the framework): the next token each position predicts, and the
documents of packed rows."""
from __future__ import annotations

import torch
from torch.nn import functional as F

#: a label not scored (padding, prompts, the last position of a row)
IGNORE_INDEX = -100


def next_token_targets(labels: torch.Tensor) -> torch.Tensor:
    """Each position's next-token label (B, T): labels shifted by one, the last position scoring
    nothing. Shifted before anything cuts the sequence, so the last position of a piece keeps its
    own next token."""
    return F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX)


def document_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """Packed rows' documents (B, T), numbered from 1 along each row: a document starts wherever a
    position does not follow the one before it by 1."""
    starts = torch.ones_like(position_ids, dtype=torch.bool)
    starts[:, 1:] = position_ids[:, 1:] - position_ids[:, :-1] != 1
    return starts.cumsum(dim=1)
