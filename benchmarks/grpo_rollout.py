"""task=grpo's rollout: one prompt's group of completions decoded with a KV cache and by
recomputing the whole sequence each token, for the built-in GPT (its own cache) and a Hugging Face
Llama (transformers' cache), side by side in one process, interleaved rounds, the median of each.
Every position is decoded (as a sharded layout does), so each case draws as many tokens; the
completions of the two ways are compared too (the same seed: the same tokens).

    python benchmarks/grpo_rollout.py [--generations 8] [--prompt 64] [--new 128] [--rounds 3]

Writes benchmarks/results/grpo_rollout.md. Under a minute on the 2-core CPU machine.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from results_table import publish  # noqa: E402


def models(vocab: int, context: int) -> dict:
    import torch
    import transformers

    from framework.models.gpt import GPT

    torch.manual_seed(0)
    gpt = GPT(vocab_size=vocab, block_size=context, n_layer=4, n_head=4, n_embd=256, dropout=0.0).eval()
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=context)).eval()
    return {"built-in GPT 4 x 256": gpt, "Hugging Face Llama 4 x 256": llama}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    import torch

    from framework.sampling import Sampling
    from framework.tasks.rollout import group_seed, sample_group

    vocab = 4096
    prompt = torch.randint(0, vocab, (args.prompt,), generator=torch.Generator().manual_seed(1)).tolist()
    sampling = Sampling(max_new_tokens=args.new, temperature=1.0)
    cases = models(vocab, args.prompt + args.new)

    def decode(model, use_cache: bool):
        generator = torch.Generator().manual_seed(group_seed(0, 0, 0))
        start = time.perf_counter()
        group = sample_group(model, prompt, args.generations, sampling, [], generator, every_position=True,
                             use_cache=use_cache)
        return time.perf_counter() - start, group.completions

    seconds: dict = {(name, cached): [] for name in cases for cached in (True, False)}
    drawn: dict = {}
    for _ in range(args.rounds):
        for name, model in cases.items():
            for cached in (True, False):
                took, completions = decode(model, cached)
                seconds[(name, cached)].append(took)
                drawn[(name, cached)] = completions
    lines = [f"One prompt's group: {args.generations} completions of {args.new} tokens after a prompt of "
             f"{args.prompt} (vocabulary {vocab}, float32, every position decoded), on the CPU; median of "
             f"{args.rounds} interleaved rounds; torch {torch.__version__}, {time.strftime('%Y-%m-%d')}.", "",
             "| model | KV cache (s) | recomputing (s) | cache / recompute | the same completions |",
             "|---|---|---|---|---|"]
    for name in cases:
        cached, recomputed = (statistics.median(seconds[(name, c)]) for c in (True, False))
        same = "yes" if drawn[(name, True)] == drawn[(name, False)] else "no"
        lines.append(f"| {name} | {cached:.2f} | {recomputed:.2f} | {cached / recomputed:.2f}x | {same} |")
    publish("grpo_rollout", lines)


if __name__ == "__main__":
    main()
