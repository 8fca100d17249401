"""Context parallelism (strategy.context_parallel_size): the split and its refusals without
processes; the attention over a split sequence against one process's at 2 and 3 gloo ranks (outputs
and the gradients of q, k and v, packed rows too); and whole runs against one process: the same
losses, clipped norms, token counts and final weights within 1e-5 at context 2, 4, 2 x fsdp 2 and
2 x tensor 2 for the built-in GPT, at 2 and 2 x fsdp 2 for a Hugging Face llama (grouped-query
attention, rotary positions); checkpoints resume across context sizes sample-exact."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from framework.batch_split import SEQUENCE, WHOLE_ROWS
from framework.config.loop_settings import LoopSettings
from framework.errors import ConfigError
from framework.models.gpt import GPT, packed_mask
from framework.strategy.fsdp import FSDPStrategy
from framework.strategy.mesh.context import split_batch
from framework.strategy.mesh.context_attention import local_positions
from framework.strategy.model_parallel import ModelParallelStrategy
from framework.strategy.pipeline import PipelineStrategy
from tests.conftest import checkpoint_at, load_model_state, metric_values, run_inprocess
from tests.helpers.run_cache import trained_run
from tests.helpers.torchrun import free_port
from tests.helpers.two_ranks import BASE, STEPS, shared

# ---- the layout and its refusals, no processes -----------------------------------------------------


def _planned(strategy, devices: int, **loop):
    strategy.devices = devices
    settings = {"micro_batch_size": 8, "batch_split": SEQUENCE, "sequence_length": 32, "task": "LanguageModeling", **loop}
    strategy.configure_loop(LoopSettings(**settings))
    return strategy


def test_context_ranks_are_taken_first_and_share_their_groups_batch():
    dims = FSDPStrategy(context_parallel_size=2).parallel_dims(4)
    assert (dims.shard, dims.context, dims.world_size, dims.data_parallel) == (2, 2, 4, 2)
    shares = [dims.data_share(rank) for rank in range(4)]
    # ranks 0 and 1 (one context group) read share 0, every context rank's scores count, no whole rows
    assert [(s.rank, s.reports, s.whole_rows) for s in shares] == [(0, True, False), (0, True, False),
                                                                   (1, True, False), (1, True, False)]
    strategy = ModelParallelStrategy(context_parallel_size=2)
    strategy.devices = 8
    dims = strategy.parallel_dims(8)  # tensor 'auto': the node's devices the context ranks leave
    assert (dims.shard, dims.context, dims.tensor) == (1, 2, 4)
    with pytest.raises(ConfigError, match=r"strategy.context_parallel_size=3 does not divide the 4 ranks"):
        FSDPStrategy(context_parallel_size=3).parallel_dims(4)
    with pytest.raises(ConfigError, match=r"tensor_parallel_size=4 does not divide the 2 ranks.*context_parallel_size=2 "
                                          r"takes its share first: 4 ranks / 2"):
        ModelParallelStrategy(context_parallel_size=2, tensor_parallel_size=4).parallel_dims(4)


@pytest.mark.parametrize("devices,nodes,kwargs", [
    (4, 2, {"context_parallel_size": 2}),  # tensor 'auto' takes what a node's devices leave: 2
    (4, 2, {"context_parallel_size": 4}),
    (8, 2, {"context_parallel_size": 2, "tensor_parallel_size": 2}),
    (2, 4, {"context_parallel_size": 2}),
])
def test_a_context_group_stays_within_a_node(devices, nodes, kwargs):
    """Several nodes: every context group (and every tensor group) is ranks of one node, so the
    attention's all-gather never crosses the slower link between nodes."""
    strategy = ModelParallelStrategy(**kwargs)
    strategy.devices = devices
    dims = strategy.parallel_dims(devices * nodes)
    groups: dict[tuple, set[int]] = {}
    for rank in range(dims.world_size):
        at = dims.coordinates(rank)
        groups.setdefault(tuple(v for k, v in at.items() if k != "context"), set()).add(rank // devices)
    assert dims.context == kwargs["context_parallel_size"] and all(len(nodes_of) == 1 for nodes_of in groups.values())
    assert dims.context * dims.tensor <= devices


@pytest.mark.parametrize("strategy,loop,fragment", [
    (lambda: FSDPStrategy(context_parallel_size=2), {"sequence_length": 30},
     "(x 2: a head and a tail chunk a rank) does not divide data.block_size=30; choose a block_size that is a multiple of 4"),
    (lambda: FSDPStrategy(context_parallel_size=2), {"compile": True}, "trainer.compile=true"),
    (lambda: FSDPStrategy(context_parallel_size=2), {"batch_split": WHOLE_ROWS, "task": "Classification"},
     "with task Classification: only a language model's batches"),
    (lambda: FSDPStrategy(context_parallel_size=2, expert_parallel_size=2), {}, "expert_parallel_size=2"),
    (lambda: PipelineStrategy(pipeline_parallel_size=2, context_parallel_size=2), {}, "with pipeline stages"),
    # 'auto' stages at 4 ranks after context 4 took them: one stage, still a pipeline's layout
    (lambda: PipelineStrategy(context_parallel_size=4), {}, "pipeline_parallel_size resolved to 1"),
])
def test_what_context_parallelism_refuses_before_launch(strategy, loop, fragment):
    """Rows of the compatibility table (framework/config/compatibility.py), one each."""
    from framework.accelerator.cpu import CPUAccelerator
    from framework.checkpoint_io.torch import TorchCheckpointIO
    from framework.cluster.local import LocalEnvironment
    from framework.config.compatibility import judge
    from framework.config.plan_facts import Plan
    from framework.precision.fp32 import FP32Precision

    planned = _planned(strategy(), 4, **loop)
    found = [r for r in judge(Plan(CPUAccelerator(), planned, FP32Precision(), TorchCheckpointIO(), LocalEnvironment(),
                                   4, 1, planned.loop_settings))[0] if "context_parallel_size" in r]
    assert len(found) == 1 and fragment in found[0], found
    left = planned.problems(GPT(block_size=32, n_layer=1, n_embd=16, n_head=2))
    assert not [r for r in left if "context_parallel_size" in r]  # the table's alone, not the applier's too


def test_predict_under_context_parallelism_is_a_row_of_the_table():
    """Refused before launch by the compatibility table (each rank would write a part of every row's
    prediction), not after the processes started; fit and test are not."""
    from framework.loop.state import RunMode
    from framework.preflight import prepare
    from tests.conftest import TINY_GPT, compose_cfg

    cfg = compose_cfg([*TINY_GPT, "strategy=fsdp", "devices=2", "strategy.context_parallel_size=2"])
    refused = {mode: [r for r in prepare(cfg, strict=False, mode=RunMode(mode)).refusals if "framework predict" in r]
               for mode in ("fit", "test", "predict")}
    assert not refused["fit"] and not refused["test"]
    assert refused["predict"] == ["framework predict with strategy.context_parallel_size=2: each rank would see a "
                                  "share of every row and write a part of its prediction; predict with "
                                  "strategy.context_parallel_size=1 (the checkpoint loads at any layout)."]


def test_eager_attention_and_attentionless_models_are_refused():
    from framework.models.mlp import MLP

    planned = _planned(FSDPStrategy(context_parallel_size=2), 2)
    assert "has no attention module" in planned.problems(MLP())[0]
    gpt = GPT(block_size=32, n_layer=1, n_embd=16, n_head=2)
    gpt.config = type("Config", (), {"_attn_implementation": "eager"})()
    assert "attn_implementation=eager" in planned.problems(gpt)[0] and "model.attn_implementation=sdpa" in planned.problems(gpt)[0]


def test_plan_shows_the_activations_per_rank_falling_with_the_context_size():
    model = GPT(block_size=32, n_layer=1, n_embd=16, n_head=2)
    shares = [_planned(FSDPStrategy(context_parallel_size=c), 4).layout(4, model).activation_share for c in (1, 2, 4)]
    assert shares == [1.0, 0.5, 0.25]
    lines = _planned(FSDPStrategy(context_parallel_size=2), 4).layout(4, model).lines
    assert any("every sequence split over 2 ranks (16 of 32 positions each" in line for line in lines), lines


def test_a_batch_is_split_after_its_labels_are_shifted():
    """Each rank's share: a head and a tail chunk of the ids, their global positions, and each
    position's own next token (the last of a chunk too); the two shares are the whole batch."""
    ids = torch.arange(16).view(2, 8)
    shares = [split_batch({"input_ids": ids}, SEQUENCE, 2, rank)[0] for rank in range(2)]
    assert shares[0]["position_ids"][0].tolist() == [0, 1, 6, 7] and shares[1]["position_ids"][0].tolist() == [2, 3, 4, 5]
    assert local_positions(8, 2, 1).tolist() == [2, 3, 4, 5]
    assert shares[0]["shift_labels"][0].tolist() == [1, 2, 7, -100] and shares[1]["shift_labels"][0].tolist() == [3, 4, 5, 6]
    assert shares[0]["input_ids"][1].tolist() == [8, 9, 14, 15]


def test_a_padded_batch_of_uneven_length_is_padded_on_to_whole_chunks():
    """Rows padded to a batch's longest (6 here, not a multiple of 2 x 2 chunks) are padded on to 8
    after every real token: the shares hold every real token once, with its own next token, the
    positions count on, the padding scores nothing and its keys are masked."""
    ids = torch.tensor([[5, 6, 7, 8, 9, 10], [11, 12, 13, 0, 0, 0]])
    batch = {"input_ids": ids, "attention_mask": (ids > 0).long(), "labels": torch.where(ids > 0, ids, -100)}
    shares = [split_batch(batch, SEQUENCE, 2, rank) for rank in range(2)]
    assert [share["input_ids"][0].tolist() for share, _ in shares] == [[5, 6, 0, 0], [7, 8, 9, 10]]
    assert [share["shift_labels"][0].tolist() for share, _ in shares] == [[6, 7, -100, -100], [8, 9, 10, -100]]
    assert shares[0][0]["position_ids"][0].tolist() == [0, 1, 6, 7]
    assert shares[0][1].length == 8 and shares[0][1].real_keys.long().tolist()[1] == [1, 1, 1, 0, 0, 0, 0, 0]
    from framework.tasks.language_modeling import LanguageModeling

    task = LanguageModeling()
    assert sum(task.scored_count(share) for share, _ in shares) == task.scored_count(batch) == 7


def test_the_shares_scored_tokens_add_up_to_the_batchs():
    """LanguageModeling counts a share's shift_labels as they are: the shares' counts add up to the
    whole batch's (whose last position predicts nothing)."""
    from framework.tasks.language_modeling import LanguageModeling

    batch = {"input_ids": torch.randint(0, 64, (2, 8)), "labels": torch.randint(0, 64, (2, 8))}
    batch["labels"][0, 3] = -100
    task = LanguageModeling()
    counts = [task.scored_count(split_batch(batch, SEQUENCE, 2, rank)[0]) for rank in range(2)]
    assert sum(counts) == task.scored_count(batch) == 13


# ---- the attention itself, at 2 and 3 gloo ranks -----------------------------------------------------
ATTENTION = """
import torch, torch.distributed as dist
from torch.nn import functional as F
import framework.strategy.mesh.context_attention as ca
from framework.models.gpt import packed_mask
ca.PIECE_TOKENS = 5  # several SDPA calls per chunk, the masks' offsets exercised
dist.init_process_group("gloo")
rank, size = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
B, H, T, D = 2, 4, 24, 8
q, k, v = (torch.randn(B, H, T, D, dtype=torch.float64, requires_grad=True) for _ in range(3))
worst = 0.0
gathers = []
real_gather = dist.all_gather
dist.all_gather = lambda *a, **k: gathers.append(1) or real_gather(*a, **k)
mask_free = ca.SequenceShard._mask_free
for packed, masked in ((False, False), (False, True), (True, True)):
    # plain causal rows take the CPU's mask-free path, or (forced) the masked path other devices take
    ca.SequenceShard._mask_free = mask_free if not masked or packed else (lambda self, q, dropout_p: False)
    pos = torch.arange(T).expand(B, T).clone()
    docs = None
    if packed:
        pos[0, 10:] = torch.arange(T - 10); pos[1, 5:] = torch.arange(T - 5)
        starts = torch.ones_like(pos, dtype=torch.bool); starts[:, 1:] = pos[:, 1:] - pos[:, :-1] != 1
        docs = starts.cumsum(1)
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=packed_mask(pos))
    else:
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    w = torch.randn_like(ref)
    grads = torch.autograd.grad((ref * w).sum(), (q, k, v))
    shard = ca.SequenceShard(None, size, rank, T, docs)
    mine = [shard.split(t.detach(), 2).requires_grad_() for t in (q, k, v)]
    gathers.clear()
    with ca.ContextAttention(lambda: shard):
        out = F.scaled_dot_product_attention(*mine, is_causal=True)
    assert len(gathers) == 1, gathers  # the keys and values in one all-gather per attention call
    local = torch.autograd.grad((out * shard.split(w, 2)).sum(), mine)
    for got, want in zip((out, *local), (ref, *grads)):
        worst = max(worst, (got - shard.split(want, 2)).abs().max().item())
print(f"rank {rank} worst {worst:.3e}", flush=True)
dist.destroy_process_group()
assert worst < 1e-12, worst
"""


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [2, 3])
def test_split_attention_equals_one_process_with_its_gradients(tmp_path, ranks):
    script = tmp_path / "attention.py"
    script.write_text(ATTENTION)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}",
                             f"--master_port={free_port()}", str(script)], capture_output=True, text=True, env=env,
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("worst") == ranks


# ---- whole runs against one process ------------------------------------------------------------------
# The reference: the shared fsdp run at 2 ranks x 8 (tests/helpers/two_ranks.py: accumulation 2,
# clipping at 0.5, a checkpoint at step 2), a global batch of 16 like every run below.
RUNS = {
    "context2": ["strategy=fsdp", "devices=2", "strategy.context_parallel_size=2", "data.batch_size=16",
                 "trainer.activation_checkpointing=true"],
    "context4": ["strategy=fsdp", "devices=4", "strategy.context_parallel_size=4", "data.batch_size=16"],
    "context2_fsdp2": ["strategy=fsdp", "devices=4", "strategy.context_parallel_size=2", "data.batch_size=8"],
    "hsdp_context2": ["strategy=hsdp", "devices=4", "strategy.shard_size=1", "strategy.context_parallel_size=2",
                      "data.batch_size=8"],
    "context2_tensor2": ["strategy=model_parallel", "devices=4", "strategy.context_parallel_size=2",
                         "strategy.tensor_parallel_size=2", "data.batch_size=16"],
}


def _run(name: str):
    return trained_run([*BASE, *RUNS[name]])


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RUNS))
def test_a_context_parallel_run_equals_one_process(name):
    reference, run = shared("fsdp"), _run(name)
    for key in ("train/loss", "train/grad_norm", "val/loss"):
        got, want = metric_values(run, key), metric_values(reference, key)
        assert len(got) == len(want) > 0, key
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-5, atol=1e-5, msg=key)
    assert min(metric_values(run, "train/grad_norm")) > 0.5  # every step clipped: the norm itself is compared
    assert metric_values(run, "train/tokens") == metric_values(reference, "train/tokens")  # the whole batch's
    final, straight = load_model_state(checkpoint_at(run, STEPS)), load_model_state(checkpoint_at(reference, STEPS))
    assert set(final) == set(straight)
    for key, value in straight.items():
        torch.testing.assert_close(final[key], value, rtol=1e-5, atol=1e-6, msg=key)


@pytest.mark.slow
@pytest.mark.parametrize("source,into", [("context2", ["strategy=single_device", "data.batch_size=16"]),
                                         ("reference", RUNS["context2"])],
                         ids=["context2_to_one_process", "two_ranks_to_context2"])
def test_resume_across_context_sizes_is_sample_exact(tmp_path, source, into):
    start = shared("fsdp") if source == "reference" else _run(source)
    run_inprocess([*BASE, *into, f"ckpt_path={checkpoint_at(start, STEPS // 2)}"], tmp_path)
    torch.testing.assert_close(torch.tensor(metric_values(tmp_path)), torch.tensor(metric_values(shared("fsdp"))[2:]),
                               rtol=1e-5, atol=1e-5)


LLAMA = ["model=hf_causal_lm", "model/config=llama", "model.config.hidden_size=32", "model.config.intermediate_size=64",
         "data.block_size=32", "data.max_bytes=300000", "data.val_batch_size=32", "trainer.val_batches=2",
         "trainer.progress_bar=false", "trainer.plot=false", "trainer.max_steps=3", "trainer.log_every=1",
         "trainer.val_every=3", "trainer.val_at_start=false", "callbacks=[checkpoint]", "trainer.clip_grad_norm=0.5"]


@pytest.mark.slow
def test_a_hugging_face_llama_trains_under_context_parallelism_as_in_one_process(tmp_path):
    """Rotary positions from the global position_ids, grouped-query attention (its keys gathered
    once per group, whichever path transformers took on each rank), at context 2 and 2 x fsdp 2."""
    one = trained_run([*LLAMA, "data.batch_size=8"])
    runs = {"context2": [*LLAMA, "strategy=fsdp", "devices=2", "strategy.context_parallel_size=2", "data.batch_size=8"],
            "context2_fsdp2": [*LLAMA, "strategy=fsdp", "devices=4", "strategy.context_parallel_size=2",
                               "data.batch_size=4"]}
    for name, overrides in runs.items():
        run = tmp_path / name
        run_inprocess(overrides, run)
        for key in ("train/loss", "train/grad_norm", "val/loss"):
            torch.testing.assert_close(torch.tensor(metric_values(run, key)), torch.tensor(metric_values(one, key)),
                                       rtol=1e-5, atol=1e-5, msg=f"{name} {key}")
        final, whole = load_model_state(checkpoint_at(run, 3)), load_model_state(checkpoint_at(one, 3))
        for key, value in whole.items():
            torch.testing.assert_close(final[key], value, rtol=1e-5, atol=1e-6, msg=f"{name} {key}")


def test_packed_mask_matches_the_split_attentions_documents():
    """The documents the split takes from packed rows' positions (a position that does not follow
    the one before by 1 starts one) are the ones the built-in GPT's own packed mask separates (a
    position not above the one before starts one): packed documents restart at 0. A rank's share of
    unpacked rows (positions that jump forward from its head chunk to its tail chunk) is one
    document to the GPT: it builds no mask, the split attention masks by the whole sequence."""
    positions = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2]])
    _, shard = split_batch({"input_ids": torch.zeros(1, 8, dtype=torch.long), "position_ids": positions}, SEQUENCE, 2, 0)
    assert shard.documents.tolist() == [[1, 1, 1, 2, 2, 3, 3, 3]]
    mask = packed_mask(positions)[0, 0]
    same = shard.documents[0][:, None] == shard.documents[0][None, :]
    assert torch.equal(mask, same & torch.ones(8, 8, dtype=torch.bool).tril())
    share, _ = split_batch({"input_ids": torch.zeros(1, 8, dtype=torch.long)}, SEQUENCE, 2, 0)
    assert share["position_ids"].tolist() == [[0, 1, 6, 7]] and packed_mask(share["position_ids"]) is None


CHAT = ["data=chat_files", "model.n_layer=2", "model.n_embd=32", "model.n_head=2", "model.block_size=256",
        "model.dropout=0.0", "data.batch_size=4", "trainer.val_batches=2", "trainer.progress_bar=false",
        "trainer.plot=false", "trainer.max_steps=3", "trainer.log_every=1", "trainer.val_every=3",
        "trainer.val_at_start=false"]


@pytest.mark.slow
@pytest.mark.parametrize("packing", [True, False], ids=["packed_rows", "padded_rows"])
def test_chat_rows_packed_or_padded_train_under_context_parallelism_as_in_one_process(tmp_path, packing):
    """Packed rows (position_ids restarting per conversation: the mask from the whole row's
    documents) and padded rows (attention_mask: padded keys masked), only the responses scored.
    The padded rows are short conversations of many lengths, so a batch's longest row is mostly not
    a multiple of 2 x 2 chunks: the split pads it on (never a refusal mid-run)."""
    rows = [*CHAT, f"data.packing={packing}"]
    if not packing:
        import json

        words = "the a list of names in python module returns value".split()
        conversations = [{"prompt": " ".join(words[: 1 + i % 7]) + "?" * (i % 3),
                          "response": " ".join(words[i % 5:]) + "." * (i % 4)} for i in range(96)]
        lengths = {len(c["prompt"]) + len(c["response"]) for c in conversations}
        assert len({n % 4 for n in lengths}) == 4  # every remainder: uneven batches come
        (tmp_path / "chat.jsonl").write_text("".join(json.dumps(c) + "\n" for c in conversations))
        rows += [f"data.files={tmp_path / 'chat.jsonl'}", f"data.cache_dir={tmp_path / 'cache'}"]
    one = trained_run(rows)
    run_inprocess([*rows, "strategy=fsdp", "devices=2", "strategy.context_parallel_size=2"], tmp_path)
    for key in ("train/loss", "train/grad_norm", "val/loss", "train/tokens"):
        torch.testing.assert_close(torch.tensor(metric_values(tmp_path, key)), torch.tensor(metric_values(one, key)),
                                   rtol=1e-5, atol=1e-5, msg=key)
