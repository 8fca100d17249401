"""A prompt's group of completions (framework/tasks/rollout.py): seeded by seed, step and row alone,
the same with the KV cache as recomputing, the same when every position is decoded (several
processes), each cut after its stop id."""
from __future__ import annotations

import torch

from framework.models.gpt import GPT
from framework.sampling import Sampling
from framework.tasks.rollout import group_seed, sample_group

PROMPT = list(b"12+3=")
NEWLINE = 10


def _model() -> GPT:
    torch.manual_seed(0)
    return GPT(vocab_size=256, block_size=32, n_layer=2, n_head=2, n_embd=32, dropout=0.0).eval()


def _group(model, index=0, step=0, **kwargs):
    generator = torch.Generator().manual_seed(group_seed(7, step, index))
    return sample_group(model, PROMPT, 6, Sampling(max_new_tokens=8, temperature=1.0), [NEWLINE], generator, **kwargs)


def test_the_same_seed_step_and_row_draw_the_same_completions_and_others_do_not():
    model = _model()
    first, again = _group(model), _group(model)
    assert first.completions == again.completions
    assert _group(model, index=1).completions != first.completions
    assert _group(model, step=1).completions != first.completions
    assert len(set(map(tuple, first.completions))) > 1  # a group's completions differ from each other


def test_the_kv_cache_and_recomputing_draw_the_same_tokens():
    model = _model()
    assert _group(model, use_cache=True).completions == _group(model, use_cache=False).completions


def test_decoding_every_position_changes_no_completion_and_each_ends_after_its_stop():
    model, stops = _model(), set(range(40))  # a sixth of the ids stop: some rows end early, some run out

    def group(**kwargs):
        generator = torch.Generator().manual_seed(group_seed(7, 0, 3))
        return sample_group(model, PROMPT, 16, Sampling(max_new_tokens=8, temperature=1.0), stops, generator, **kwargs)

    short, full = group(), group(every_position=True)
    assert short.completions == full.completions and short.truncated == full.truncated
    assert any(full.truncated) and not all(full.truncated)
    for ids, cut in zip(full.completions, full.truncated):
        assert (ids[-1] in stops) == (not cut) and not stops & set(ids[:-1])  # nothing after the stop
        assert len(ids) == 8 if cut else len(ids) <= 8


def test_a_hugging_face_model_decodes_with_its_own_cache_as_recomputing_does(tiny_llama):
    """transformers' cache: the prompt once, then one new token a forward (the last position's
    logits alone); the same completions as recomputing the whole sequence each token."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_llama).eval()
    windows, logits = [], []
    model.model.register_forward_hook(lambda module, args, kwargs, out: windows.append(kwargs["input_ids"].shape[1]),
                                      with_kwargs=True)
    model.register_forward_hook(lambda module, args, out: logits.append(out.logits.shape[1]))
    cached = _group(model)
    assert windows == [len(PROMPT)] + [1] * (len(windows) - 1) and len(windows) > 1 and set(logits) == {1}
    windows.clear()
    assert _group(model, use_cache=False).completions == cached.completions
    assert windows[:3] == [len(PROMPT), len(PROMPT) + 1, len(PROMPT) + 2]


def test_the_plan_counts_the_rollouts_kv_cache_of_either_kind_of_model():
    """framework plan's task.rollout line: keys and values of num_generations x (prompt +
    completion) positions per layer; a Hugging Face model's of its key-value heads (grouped-query
    attention keeps fewer than its heads)."""
    import transformers

    from framework.tasks.grpo import GRPO

    task = GRPO(tokenizer="bytes", num_generations=4, max_completion_tokens=8)
    with torch.device("meta"):
        gpt = GPT(vocab_size=256, block_size=32, n_layer=2, n_head=2, n_embd=32, dropout=0.0)
        llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=256, hidden_size=64, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=1))
    assert task.rollout_memory(gpt, 8, 2, 4)[0] == 2 * 2 * 4 * (8 + 8) * 32 * 4
    bytes_, words = task.rollout_memory(llama, 8, 2, 2)
    assert bytes_ == 2 * 3 * 4 * (8 + 8) * 16 * 2 and "KV cache of 4 completions x 16 positions x 3 layers x 16" in words
