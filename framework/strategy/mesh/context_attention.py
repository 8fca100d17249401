"""Causal attention over a sequence split across a context-parallel group.

Each rank of the group holds 2 of the sequence's 2C chunks (C ranks): rank r chunks r and 2C-1-r,
a head and a tail, so that under causal attention every rank has the same work (torchtitan's and
Megatron's load balancing). Inside an attention module's forward, `scaled_dot_product_attention` is
intercepted (a TorchFunctionMode entered around the module's own forward, so activation
checkpointing's recomputation passes through it too, on any thread): the keys and values of every
rank are all-gathered, as one stacked tensor (two separate autograd all-gathers would let the
autograd engine run their backward collectives in different orders on different ranks, pairing one
rank's key gradient with another's value gradient: ../shared/FACTS.md), and each local query attends
to the keys at or before its global position, in the same document for packed rows.

Why all-gather and not a ring: the all-gather is one collective per layer that gloo and NCCL both
run, its backward one all-reduce (gloo) or reduce-scatter (NCCL), and the attention itself stays
torch's SDPA on any device; a ring overlaps its sends with the attention, which matters on a GPU at
very long sequences, but needs the attention's log-sum-exp, which no public SDPA returns (torch's
experimental ring registers itself for the CUDA kernels only). The keys and values of the whole
sequence are held during one layer's attention: 2 x T x (heads x head size) per row, a small share
of a layer's activations.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode

#: the most query positions attended in one SDPA call: the mask of a call is this x the keys it sees
PIECE_TOKENS = 2048


def chunk_order(size: int, rank: int) -> tuple[int, int]:
    """The two chunks (of 2 x size) that `rank` of a context group of `size` holds."""
    return rank, 2 * size - 1 - rank


def local_positions(length: int, size: int, rank: int, device=None) -> torch.Tensor:
    """The global positions (of a sequence of `length`) that `rank` holds, in its local order."""
    chunk = length // (2 * size)
    return torch.cat([torch.arange(c * chunk, (c + 1) * chunk, device=device) for c in chunk_order(size, rank)])


@dataclass
class SequenceShard:
    """One micro-batch's split: the group, this rank's place in it, the sequence's length, and for
    packed rows each global position's document (B, T) and for padded rows which keys are real."""

    group: object
    size: int
    rank: int
    length: int
    documents: torch.Tensor | None = None
    real_keys: torch.Tensor | None = None

    @property
    def chunk(self) -> int:
        return self.length // (2 * self.size)

    def split(self, tensor: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """This rank's positions of `tensor` along `dim` (the sequence)."""
        c = self.chunk
        return torch.cat([tensor.narrow(dim, i * c, c) for i in chunk_order(self.size, self.rank)], dim=dim)

    def gather(self, local: torch.Tensor) -> torch.Tensor:
        """The whole sequence (dim -2) of every rank's `local` part, in global order; the backward
        keeps this rank's share of the summed gradient."""
        parts = _GatherSequence.apply(local, self.group, self.size, self.rank)  # (size, ..., 2c, d)
        c = self.chunk
        pieces = [None] * (2 * self.size)
        for r in range(self.size):
            first, second = chunk_order(self.size, r)
            pieces[first] = parts[r].narrow(-2, 0, c)
            pieces[second] = parts[r].narrow(-2, c, c)
        return torch.cat(pieces, dim=-2)

    def attend(self, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False, *,
               kv_groups: int = 1):
        """SDPA of this rank's queries over the whole sequence's keys, causal in global positions.
        The model's own mask (`attn_mask`, built from its local view) is replaced by one built from
        the global positions, documents and padding. `kv_groups`: query heads per key head (grouped
        query attention): keys a model repeated per query head are gathered once per group, so
        every rank gathers the same shape whichever path its model took (transformers takes
        another where a rank's positions look like packed rows)."""
        if attn_mask is None and not is_causal:
            raise RuntimeError("context parallelism splits causal attention only; this attention is bidirectional "
                               "(is_causal=False and no mask): set strategy.context_parallel_size=1.")
        if kv_groups > 1 and k.shape[-3] == q.shape[-3]:  # repeated: the first of each group (the repeat's
            k, v = k[..., ::kv_groups, :, :], v[..., ::kv_groups, :, :]  # backward sums into it)
        enable_gqa = k.shape[-3] != q.shape[-3]
        keys, values = self.gather(torch.stack([k, v])).unbind(0)
        if self._mask_free(q, dropout_p):
            return self._attend_by_parts(q, keys, values, scale)
        c, out = self.chunk, []
        for place, chunk in enumerate(chunk_order(self.size, self.rank)):
            for start in range(0, c, PIECE_TOKENS):
                n = min(PIECE_TOKENS, c - start)
                first = chunk * c + start  # the piece's first global position
                seen = first + n  # keys at or before the piece's last query
                query = q.narrow(-2, place * c + start, n)
                mask = self._mask(first, n, seen, q.device)
                out.append(F.scaled_dot_product_attention(
                    query, keys.narrow(-2, 0, seen), values.narrow(-2, 0, seen), attn_mask=mask,
                    is_causal=mask is None, dropout_p=dropout_p, scale=scale, enable_gqa=enable_gqa))
        return torch.cat(out, dim=-2)

    def _mask_free(self, q: torch.Tensor, dropout_p: float) -> bool:
        """Whether the queries can attend without a mask: plain causal rows (no documents, no
        padding), no dropout, on the CPU, whose flash kernel gives its log-sum-exp (a mask there is
        converted to floats and kept for backward: a chunk x sequence matrix per layer)."""
        return q.device.type == "cpu" and self.documents is None and self.real_keys is None and not dropout_p

    def _attend_by_parts(self, q, keys, values, scale):
        """Each local chunk's queries over the keys before the chunk (all visible) and the chunk's
        own (causal), merged by their log-sum-exp (_CausalChunk)."""
        if keys.shape[-3] != q.shape[-3]:  # grouped keys: the kernel takes one per query head
            groups = q.shape[-3] // keys.shape[-3]
            keys, values = keys.repeat_interleave(groups, dim=-3), values.repeat_interleave(groups, dim=-3)
        c = self.chunk
        out = [_CausalChunk.apply(q.narrow(-2, place * c, c), keys.narrow(-2, 0, (chunk + 1) * c),
                                  values.narrow(-2, 0, (chunk + 1) * c), chunk * c, scale)
               for place, chunk in enumerate(chunk_order(self.size, self.rank))]
        return torch.cat(out, dim=-2)

    def _mask(self, first: int, n: int, seen: int, device) -> torch.Tensor | None:
        """(B or 1, 1, n, seen), True where a query (global positions first..first+n) may attend;
        None where plain causal attention from position 0 is the mask."""
        if first == 0 and self.documents is None and self.real_keys is None:
            return None
        queries = torch.arange(first, first + n, device=device)
        keys = torch.arange(seen, device=device)
        allowed = (keys[None, :] <= queries[:, None])[None]  # (1, n, seen)
        if self.documents is not None:
            docs = self.documents
            allowed = allowed & (docs[:, first:first + n, None] == docs[:, None, :seen])
        if self.real_keys is not None:  # a query always sees itself: a padded row has no empty row of scores
            allowed = allowed & (self.real_keys[:, None, :seen] | (keys[None, :] == queries[:, None])[None])
        return allowed[:, None]


class _CausalChunk(torch.autograd.Function):
    """Queries at global positions first..first+n-1 over keys 0..first+n-1 without a mask: the keys
    before the queries all visible, the last n causal (top-left and bottom-right alignment agree on
    a square), the two flash attentions merged by their log-sum-exp. Backward: each part's flash
    backward with the merged output and log-sum-exp, which gives each part's exact share of the
    gradients (the identity ring attention rests on). torch's CPU flash kernels."""

    @staticmethod
    def forward(ctx, q, keys, values, first, scale):
        parts = ([(keys.narrow(-2, 0, first), values.narrow(-2, 0, first), False)] if first else []) + \
            [(keys.narrow(-2, first, keys.shape[-2] - first), values.narrow(-2, first, keys.shape[-2] - first), True)]
        results = [_FLASH(q, k, v, 0.0, causal, scale=scale) for k, v, causal in parts]
        if len(results) == 1:
            out, lse = results[0]
        else:
            (out_a, lse_a), (out_b, lse_b) = results
            lse = torch.logaddexp(lse_a, lse_b)
            weight_a, weight_b = (lse_a - lse).exp(), (lse_b - lse).exp()
            out = (out_a * _rows(weight_a, out_a) + out_b * _rows(weight_b, out_b)).to(q.dtype)
        ctx.save_for_backward(q, keys, values, out, lse)
        ctx.first, ctx.scale = first, scale
        return out

    @staticmethod
    def backward(ctx, grad):
        q, keys, values, out, lse = ctx.saved_tensors
        first, grad = ctx.first, grad.contiguous()
        grad_q, grad_k, grad_v = None, [], []
        bounds = ([(0, first, False)] if first else []) + [(first, keys.shape[-2] - first, True)]
        for start, length, causal in bounds:
            gq, gk, gv = _FLASH_BACKWARD(grad, q, keys.narrow(-2, start, length), values.narrow(-2, start, length),
                                         out, lse, 0.0, causal, scale=ctx.scale)
            grad_q = gq if grad_q is None else grad_q + gq
            grad_k.append(gk)
            grad_v.append(gv)
        return grad_q, torch.cat(grad_k, dim=-2), torch.cat(grad_v, dim=-2), None, None


def _rows(weight: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """A per-query weight (the kernel's log-sum-exp layout) broadcast over `out`'s (B, H, L, D)."""
    if weight.shape == out.shape[:-1]:
        return weight.unsqueeze(-1)
    return weight.transpose(1, 2).unsqueeze(-1)  # (B, L, H) -> (B, H, L, 1)


_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_FLASH_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


class _GatherSequence(torch.autograd.Function):
    """All-gather along a new first dimension; backward: the gathered gradient summed over the
    ranks, this rank's part kept (a reduce-scatter; on gloo, which has none, an all-reduce)."""

    @staticmethod
    def forward(ctx, local, group, size, rank):
        ctx.group, ctx.size, ctx.rank = group, size, rank
        local = local.contiguous()
        out = torch.empty((size, *local.shape), dtype=local.dtype, device=local.device)
        dist.all_gather(list(out.unbind(0)), local, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        if dist.get_backend(ctx.group) == "gloo":
            dist.all_reduce(grad, group=ctx.group)
            return grad[ctx.rank], None, None, None
        mine = torch.empty_like(grad[0])
        dist.reduce_scatter_tensor(mine, grad, group=ctx.group)
        return mine, None, None, None


class ContextAttention(TorchFunctionMode):
    """Active inside an attention module's forward: its SDPA call attends over the whole sequence of
    the micro-batch's shard (`shard()`: the current one, None outside a split batch); `kv_groups`:
    the module's query heads per key head."""

    def __init__(self, shard, kv_groups: int = 1):
        super().__init__()
        self.shard, self.kv_groups = shard, kv_groups
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            shard = self.shard()
            if shard is not None:
                self.calls += 1
                return shard.attend(*args, **kwargs, kv_groups=self.kv_groups)
        return func(*args, **kwargs)
