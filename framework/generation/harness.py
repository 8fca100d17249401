"""The framework's own model for EleutherAI's lm-evaluation-harness (`framework eval`): a model
and tokenizer `framework generate` loads (framework/generation/load.py), answering the harness's
three requests. The harness does the rest: its task registry, prompts, few-shot examples,
metrics and their aggregation.

- log-likelihood of a continuation given a context: context and continuation tokenised together
  and split where the context's tokens end (the harness's own TemplateLM rule), the last
  model-context tokens run through the model (right-padded in batches; a causal model's scores of
  real tokens do not see the padding), the continuation's log-probabilities summed, and whether
  each of its tokens was the greedy choice;
- rolling log-likelihood of a whole text (perplexity tasks): the harness's disjoint windows of the
  model's context, each token predicted once, the first from the beginning-of-text token, else the
  end-of-text token (lm-eval's hf model's rule), or, for a tokenizer with neither (bytes), the
  newline byte; texts are encoded without special tokens, as lm-eval's hf model encodes them;
- generation until a stop string: greedy decoding of `framework generate` (the built-in GPT's KV
  cache, transformers' generate for a Hugging Face model), stopped at the tokenizer's end tokens
  (its eos and generation_config.json's), cut at the first stop string.

lm_eval is imported only here, when `framework eval` runs (the `eval` extra).
"""
from __future__ import annotations

import torch

from framework.generation.decode import generate
from framework.generation.load import Loaded
from framework.models.context import context_length
from framework.sampling import Sampling
from framework.tasks.token_logps import logps_of, output_logits

NEWLINE = 10  # the byte a text is predicted from where the tokenizer has no end-of-text token


def harness_model(loaded: Loaded, batch_size: int = 8, device: str = "cpu"):
    """An lm-eval `TemplateLM` over `loaded` (its class made here: lm_eval is imported only now)."""
    from lm_eval.api.model import TemplateLM
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

    class FrameworkLM(TemplateLM):
        def __init__(self):
            super().__init__()
            self.model, self.tok = loaded.model.eval(), loaded.tokenizer
            self.batch_size, self._device = max(int(batch_size), 1), torch.device(device)
            self.max_length = context_length(self.model) or 2048

        @property
        def eot_token_id(self) -> int:
            return self.tok.eos_id if self.tok.eos_id is not None else NEWLINE

        @property
        def prefix_token_id(self) -> int:
            """What a text is predicted from (lm-eval's hf model: the bos where the tokenizer has one)."""
            return self.tok.bos_id if self.tok.bos_id is not None else self.eot_token_id

        def tok_encode(self, string: str, add_special_tokens=None, **kwargs) -> list[int]:
            return self.tok.encode([string])[0]

        def tok_decode(self, ids, **kwargs) -> str:
            return self.tok.decode(list(ids))

        @torch.no_grad()
        def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs):
            """(summed log-probability of each continuation, whether it is all greedy), in order."""
            order = sorted(range(len(requests)), key=lambda i: -len(requests[i][1]) - len(requests[i][2]))
            results: list[tuple[float, bool] | None] = [None] * len(requests)
            for start in range(0, len(order), self.batch_size):
                chunk = order[start:start + self.batch_size]
                rows = []
                for i in chunk:
                    _, context, continuation = requests[i]
                    whole = (list(context) + list(continuation))[-(self.max_length + 1):]
                    rows.append((whole[:-1], len(continuation)))
                width = max(len(ids) for ids, _ in rows)
                ids = torch.zeros((len(rows), width), dtype=torch.long, device=self._device)
                mask = torch.zeros_like(ids)
                for r, (row, _) in enumerate(rows):
                    ids[r, :len(row)], mask[r, :len(row)] = torch.tensor(row), 1
                logits = output_logits(self._forward(ids, mask))
                for r, i in enumerate(chunk):
                    length, n = len(rows[r][0]), rows[r][1]
                    scores = logits[r, length - n:length]
                    wanted = torch.tensor(list(requests[i][2]), device=self._device)
                    picked = logps_of(scores, wanted)  # framework/tasks/token_logps.py, as the tasks score
                    results[i] = (float(picked.sum()), bool((scores.argmax(-1) == wanted).all()))
            return results

        def _forward(self, ids: torch.Tensor, mask: torch.Tensor):
            if hasattr(self.model, "config"):  # a Hugging Face model reads the padding mask
                return self.model(input_ids=ids, attention_mask=mask)
            return self.model(ids)

        def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
            scores = []
            for (text,) in (request.args for request in requests):
                windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
                    self.tok_encode(text), self.prefix_token_id, self.max_length, context_len=1)]
                scored = self._loglikelihood_tokens([(None, context, target) for context, target in windows])
                scores.append(sum(score for score, _ in scored))
            return scores

        def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
            outputs = []
            for context, settings in (request.args for request in requests):
                settings = dict(settings or {})
                until = settings.get("until") or []
                until = [until] if isinstance(until, str) else list(until)
                prompt = self.tok_encode(context)[-self.max_length:]
                sampling = Sampling(max_new_tokens=int(settings.get("max_gen_toks", 256)), temperature=0.0)
                result = generate(self.model, prompt, sampling, stop_ids=self.tok.stop_ids)
                text = self.tok_decode(result.ids)
                for stop in until:
                    text = text.split(stop)[0] if stop else text
                outputs.append(text)
            return outputs

    return FrameworkLM()
