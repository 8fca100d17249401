"""task.loss_chunk_tokens: the loss and gradients of the whole logits, computed a chunk of tokens at a
time by the model's own head (framework/tasks/chunked_loss.py), for the built-in GPT and a Hugging
Face family; what backward keeps shrinks by the logits; the layouts it cannot serve are refused."""
from __future__ import annotations

import pytest
import torch

from framework.models.gpt import GPT
from framework.tasks.language_modeling import LanguageModeling
from tests.conftest import TINY_GPT, compose_cfg, metric_values, run_inprocess


def _gradients(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _loss_and_gradients(task, model, batch):
    model.zero_grad()
    total, count = task.training_sums(model, batch)
    (total / count).backward()
    return total.detach(), count, _gradients(model)


def _assert_same(model, batch, chunk: int):
    plain = _loss_and_gradients(LanguageModeling(), model, batch)
    chunked = _loss_and_gradients(LanguageModeling(loss_chunk_tokens=chunk), model, batch)
    torch.testing.assert_close(chunked[0], plain[0], rtol=1e-6, atol=1e-6)
    assert int(chunked[1]) == int(plain[1])
    assert plain[2].keys() == chunked[2].keys() and plain[2]
    for name, grad in plain[2].items():
        torch.testing.assert_close(chunked[2][name], grad, rtol=1e-6, atol=1e-6, msg=name)


@pytest.mark.parametrize("chunk", [1, 7, 64, 10_000])  # one token, a chunk that does not divide, equal, all at once
def test_the_gpt_gives_the_plain_loss_and_gradients(chunk):
    torch.manual_seed(0)
    model = GPT(vocab_size=97, n_layer=2, n_embd=32, n_head=2, block_size=32)
    tokens = torch.randint(0, 97, (2, 32))
    targets = torch.randint(0, 97, (2, 32))
    targets[1, 20:] = -100  # not scored
    _assert_same(model, (tokens, targets), chunk)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_hugging_face_family_gives_the_plain_loss_and_gradients_on_padded_rows(family):
    from framework.models.hf_causal_lm import causal_lm

    torch.manual_seed(0)
    fields = {"gpt2": {"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 32,
                       "vocab_size": 101, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0},
              "llama": {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                        "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 101,
                        "max_position_embeddings": 32, "tie_word_embeddings": True}}[family]
    model = causal_lm(config=fields)
    ids = torch.randint(0, 101, (2, 24))
    labels = ids.clone()
    labels[0, 18:] = -100
    mask = torch.ones_like(ids)
    mask[0, 18:] = 0
    _assert_same(model, {"input_ids": ids, "attention_mask": mask, "labels": labels}, 5)


def test_bfloat16_weights_score_their_logits_in_float32():
    """A model in bfloat16: each chunk's logits are upcast before the cross-entropy, as the plain
    loss does (without it a token's loss is about 0.016 off at this vocabulary)."""
    from torch.nn import functional as F

    torch.manual_seed(0)
    model = GPT(vocab_size=512, n_layer=1, n_embd=64, n_head=2, block_size=32).to(torch.bfloat16)
    tokens, targets = torch.randint(0, 512, (2, 32)), torch.randint(0, 512, (2, 32))
    with torch.no_grad():
        logits = model(tokens)
        by_hand = F.cross_entropy(logits.float().view(-1, 512), targets.view(-1), reduction="sum")
        total, count = LanguageModeling(loss_chunk_tokens=7).training_sums(model, (tokens, targets))
    assert int(count) == 64
    torch.testing.assert_close(total.float() / 64, by_hand / 64, rtol=0, atol=2e-3)


def test_validation_and_prediction_score_as_the_plain_loss_and_generation_still_gets_logits():
    torch.manual_seed(0)
    model = GPT(vocab_size=64, n_layer=1, n_embd=16, n_head=2, block_size=16).eval()
    batch = (torch.randint(0, 64, (3, 16)), torch.randint(0, 64, (3, 16)))
    batch[1][0, 10:] = -100  # six positions scored nothing: counted by neither
    plain, chunked = LanguageModeling(), LanguageModeling(loss_chunk_tokens=5)
    with torch.no_grad():
        a, b = plain.validation_step(model, batch), chunked.validation_step(model, batch)
        torch.testing.assert_close(b["loss_sum"], a["loss_sum"], rtol=1e-6, atol=1e-6)
        assert b["tokens"] == a["tokens"] == 42
        p, q = plain.predict_step(model, batch), chunked.predict_step(model, batch)
        torch.testing.assert_close(q["loss"], p["loss"], rtol=1e-6, atol=1e-6)
        assert model(batch[0]).shape == (3, 16, 64)  # no targets given: the plain projection


def test_backward_keeps_one_chunk_of_logits_not_all_of_them():
    """What autograd saves for backward, counted with saved-tensor hooks: the whole logits (and
    their softmax) in the plain loss, a chunk's inputs only with the chunked one."""
    torch.manual_seed(0)
    vocab, tokens = 4096, 2 * 256
    model = GPT(vocab_size=vocab, n_layer=1, n_embd=32, n_head=2, block_size=256)
    batch = (torch.randint(0, vocab, (2, 256)), torch.randint(0, vocab, (2, 256)))

    def saved_bytes(task) -> int:
        sizes = []

        def pack(t):
            sizes.append(t.numel() * t.element_size())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            task.training_sums(model, batch)
        return sum(sizes)

    logits = tokens * vocab * 4
    plain, chunked = saved_bytes(LanguageModeling()), saved_bytes(LanguageModeling(loss_chunk_tokens=64))
    assert plain - chunked > logits  # at least the whole float32 logits fewer
    assert chunked < plain / 3


@pytest.mark.parametrize("overrides,fragment", [
    (["strategy=pipeline", "devices=2"], "task.loss_chunk_tokens with strategy=pipeline and pipeline stages"),
    (["strategy=model_parallel", "devices=2"], "task.loss_chunk_tokens with strategy=model_parallel: under tensor"),
    (["task.metrics=[{metric: MulticlassAccuracy}]"], "task.loss_chunk_tokens with task.metrics"),
    (["task.loss_chunk_tokens=0"], "task.loss_chunk_tokens=0: must be"),
])
def test_what_it_cannot_serve_is_refused_before_launch(overrides, fragment):
    from framework.errors import ConfigError
    from framework.preflight import prepare

    with pytest.raises(ConfigError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        prepare(compose_cfg([*TINY_GPT, "task.loss_chunk_tokens=16", *overrides]))


def test_a_task_without_a_language_model_head_refuses_the_key():
    from framework.errors import ConfigError
    from framework.preflight import prepare

    with pytest.raises(ConfigError, match="task.loss_chunk_tokens: 'framework.tasks.classification.Classification' "
                                          "takes no argument 'loss_chunk_tokens'"):
        prepare(compose_cfg(["model=mlp", "data=digits", "task=classification", "+task.loss_chunk_tokens=16"]))


@pytest.mark.slow
def test_a_run_trains_the_plain_runs_numbers(tmp_path):
    """End to end in one process, as a user runs it: the losses and validation losses of the plain
    loss, step by step."""
    run = [*TINY_GPT, "trainer.max_steps=4", "trainer.log_every=1", "trainer.val_every=2", "model.dropout=0.0",
           "callbacks=[checkpoint]", "strategy=single_device"]
    run_inprocess(run, tmp_path / "plain")
    run_inprocess([*run, "task.loss_chunk_tokens=10"], tmp_path / "chunked")
    for key in ("train/loss", "val/loss"):
        torch.testing.assert_close(torch.tensor(metric_values(tmp_path / "chunked", key)),
                                   torch.tensor(metric_values(tmp_path / "plain", key)), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["fsdp", "deepspeed_stage_3"])
def test_a_sharded_run_trains_the_plain_runs_numbers(strategy):
    """Under a sharding strategy the head's weights are gathered for the model's forward and again
    for backward's recomputation of each chunk: the two-process run (accumulation and clipping on)
    gives the plain run's losses, against the run the equivalence tests share."""
    from tests.helpers.two_ranks import shared, train_losses

    chunked = shared(strategy, extra=["task.loss_chunk_tokens=10"])
    torch.testing.assert_close(torch.tensor(train_losses(chunked)), torch.tensor(train_losses(shared(strategy))),
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.tensor(metric_values(chunked, "val/loss")),
                               torch.tensor(metric_values(shared(strategy), "val/loss")), rtol=1e-5, atol=1e-5)


def test_preference_log_probabilities_chunked_are_the_whole_logits_ones():
    """task=preference with task.loss_chunk_tokens: the policy's sequence log-probabilities, the DPO
    loss and its gradients are the whole logits' (one token log-probability path for both tasks)."""
    from framework.tasks.preference import Preference, sequence_logps
    from framework.tasks.second_model import Frozen

    torch.manual_seed(0)
    model = GPT(vocab_size=97, n_layer=2, n_embd=32, n_head=2, block_size=32)
    ids = torch.randint(0, 97, (4, 24))
    labels = ids.clone()
    labels[:, :8] = -100  # the prompt
    labels[1, 20:] = -100  # padding
    batch = {"input_ids": ids, "labels": labels}
    whole, counts = sequence_logps(model, batch)
    for chunk in (1, 7, 100):
        torch.testing.assert_close(sequence_logps(model, batch, chunk)[0], whole, rtol=1e-6, atol=1e-5)
    assert counts.tolist() == [16, 12, 16, 16]
    reference = GPT(vocab_size=97, n_layer=2, n_embd=32, n_head=2, block_size=32).eval()
    grads = []
    for chunk in (None, 5):
        task = Preference(loss_chunk_tokens=chunk)
        task.use_frozen(Frozen("task.reference", reference))
        model.zero_grad()
        loss = task.training_step(model, batch)["loss"]
        loss.backward()
        grads.append((loss.detach(), _gradients(model)))
    torch.testing.assert_close(grads[1][0], grads[0][0], rtol=1e-6, atol=1e-6)
    for name, grad in grads[0][1].items():
        torch.testing.assert_close(grads[1][1][name], grad, rtol=1e-5, atol=1e-6, msg=name)


def test_a_model_that_transforms_its_logits_after_the_head_is_refused_for_chunking():
    """Gemma 2 soft-caps its logits after the head: the chunked head would skip it."""
    from framework.errors import ConfigError
    from framework.models.hf_causal_lm import causal_lm
    from framework.tasks.token_logps import token_logps

    pytest.importorskip("transformers")
    model = causal_lm(config={"model_type": "gemma2", "hidden_size": 32, "intermediate_size": 64,
                              "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
                              "head_dim": 16, "vocab_size": 64, "max_position_embeddings": 32},
                      attn_implementation="eager")
    ids = torch.randint(0, 64, (1, 8))
    token_logps(model, {"input_ids": ids}, ids)  # the whole logits: fine
    with pytest.raises(ConfigError, match=r"gemma2 transforms its logits after the output head "
                                          r"\(final_logit_softcapping=30.0\)"):
        token_logps(model, {"input_ids": ids}, ids, chunk_tokens=4)
