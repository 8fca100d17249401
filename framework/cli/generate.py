"""`framework generate RUN_DIR|CHECKPOINT|HF_DIR --prompt TEXT`: text from a trained language model.

RUN_DIR: the run's best checkpoint (by its checkpoint monitor; the newest without one);
CHECKPOINT: one checkpoint directory; HF_DIR: a `from_pretrained` directory (what `framework
convert --to hf` writes). Tokens are decoded with the run's tokenizer (bytes for byte-level data)
or --tokenizer. Greedy with --temperature 0; else sampled (--top-k, --top-p) from --seed: the same
seed, prompt and weights give the same text at every call. The built-in GPT decodes with a KV
cache; Hugging Face models with transformers' own generate.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from framework.data.chat_template import ChatTemplate
from framework.errors import ConfigError, ExitCode, UserError, report
from framework.generation.decode import generate
from framework.generation.load import check_prompt, load_model
from framework.sampling import Sampling

COMMAND = "framework generate"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=COMMAND, description="text from a trained language model")
    p.add_argument("target", help="a run directory, a checkpoint directory or a Hugging Face directory")
    p.add_argument("--prompt", action="append", default=[], help="text to continue (repeat for several)")
    p.add_argument("--prompts", help="a file of prompts: one per line, or JSON lines with a 'prompt' field")
    p.add_argument("--max-new-tokens", type=int, default=Sampling.max_new_tokens)
    p.add_argument("--temperature", type=float, default=Sampling.temperature, help="0: greedy")
    p.add_argument("--greedy", action="store_true", help="the likeliest token each time (--temperature 0)")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None, help="in (0, 1]")
    p.add_argument("--seed", type=int, default=Sampling.seed)
    p.add_argument("--no-stop", action="store_true", help="do not stop at the tokenizer's end-of-text token")
    p.add_argument("--no-cache", action="store_true", help="recompute the whole sequence per token (for comparison)")
    p.add_argument("--tokenizer", default=None, help="bytes, or a tokenizer.json / a directory holding one")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    p.add_argument("--chat", action="store_true", help="each prompt is a user's message: rendered with the run's "
                   "chat template (or --chat-template), the reply printed alone, ending at the end of its turn")
    p.add_argument("--chat-template", default=None, help="with --chat: a built-in template's name, a .jinja file, or "
                   "Jinja inline (default: the run's data.chat_template, else the tokenizer's own)")
    p.add_argument("--system", default=None, help="with --chat: a system message before each prompt")
    p.add_argument("-o", "--output", help="write one JSON line per prompt to this file")
    return p


def read_prompts(args) -> list[str]:
    prompts = list(args.prompt)
    if args.prompts:
        path = Path(args.prompts).expanduser()
        if not path.is_file():
            raise ConfigError(f"--prompts {path}: no such file.")
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            if path.suffix in (".jsonl", ".json"):
                try:
                    row = json.loads(line)
                    prompts.append(row["prompt"] if isinstance(row, dict) else str(row))
                except (ValueError, KeyError) as err:
                    raise ConfigError(f"--prompts {path}: line {number} is not a JSON object with a 'prompt' field "
                                      f"({type(err).__name__}).") from err
            else:
                prompts.append(line)
    if not prompts:
        raise ConfigError(f"{COMMAND}: no prompt; give --prompt TEXT or --prompts FILE.")
    return prompts


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    try:
        sampling = Sampling(max_new_tokens=args.max_new_tokens, temperature=0.0 if args.greedy else args.temperature,
                            top_k=args.top_k, top_p=args.top_p, seed=args.seed).check()
        prompts = read_prompts(args)
        loaded = load_model(Path(args.target).expanduser(), COMMAND, args.tokenizer, args.device, DTYPES[args.dtype])
        texts, stop = prompts, None
        if args.chat:
            given = args.chat_template or ((loaded.config or {}).get("data") or {}).get("chat_template")
            template = ChatTemplate.choose(given, loaded.tokenizer.spec)
            system = [{"role": "system", "content": args.system}] if args.system else []
            texts = [template.render([*system, {"role": "user", "content": p}], add_generation_prompt=True)
                     for p in prompts]
            stop = loaded.tokenizer.encode([template.turn_end()])[0] if template.turn_end() else None
        elif args.chat_template or args.system:
            raise ConfigError(f"{COMMAND}: --chat-template and --system go with --chat.")
        encoded = loaded.tokenizer.encode(texts, special=not args.chat)  # a text prompt as tokenizer(text) has it
        for text, ids in zip(texts, encoded):
            check_prompt(loaded, ids, text, COMMAND)
    except UserError as err:
        report(err)
        return ExitCode.USER_ERROR
    print(f"{COMMAND}: {loaded.source}", file=sys.stderr, flush=True)
    stop_ids = () if args.no_stop else loaded.tokenizer.stop_ids
    rows = []
    for text, ids in zip(prompts, encoded):
        result = generate(loaded.model, ids, sampling, stop_ids=stop_ids, use_cache=not args.no_cache, stop=stop)
        completion = loaded.tokenizer.decode(result.ids[:len(result.ids) - len(stop)] if result.stopped and stop
                                             else result.ids)
        print(completion if args.chat else text + completion, flush=True)
        print(f"-- {len(result.ids)} tokens in {result.seconds:.2f} s ({result.tokens_per_s:.1f} tokens/s)"
              f"{', stopped at the end of its turn' if result.stopped and stop else ''}"
              f"{', stopped at end-of-text' if result.stopped and not stop else ''}", file=sys.stderr, flush=True)
        rows.append({"prompt": text, "completion": completion, "new_tokens": len(result.ids),
                     "stopped": result.stopped, "tokens_per_s": round(result.tokens_per_s, 2)})
    if args.output:
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
        print(f"wrote {out}", file=sys.stderr)
    return ExitCode.OK
