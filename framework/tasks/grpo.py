"""Online reinforcement learning from rewards (`task=grpo`, data=prompt_files): GRPO and its
relatives, computed as trl 1.16's GRPOTrainer computes them, under its metric names.

Each step, before any forward (the loop's rollout: framework/loop/rollout_steps.py), every prompt of the
step's micro-batches gets task.num_generations completions sampled from the policy
(framework/tasks/rollout.py: seeded by prompt and step, never by rank), the reward functions score
them (framework/tasks/rewards.py), and each completion's advantage is its reward against its group's
(framework/tasks/grpo_loss.py). With num_iterations > 1 the policy's log-probabilities at sampling
time are kept, and the loop trains the same completions for that many optimizer steps; with beta > 0
the reference's are computed then too (a frozen model placed like the policy, or the policy with its
adapters off). The loss of a completion token, with r = exp(logp - logp_old) and A its advantage:
-min(r A, clip(r, 1 - epsilon, 1 + epsilon_high) A) + beta (exp(ref - logp) - (ref - logp) - 1),
normalised as task.loss says (`grpo`, `bnpo`, `dr_grpo` per micro-batch; `dapo` over every token of
the step on every rank). Log-probabilities and entropies are of the logits divided by the sampling
temperature, as trl's are.

Logged beside the loss (each the whole step's, on every layout): reward, reward_std,
rewards/<function>/mean and /std, frac_reward_zero_std, completions/mean_length,
completions/clipped_ratio, entropy, kl (beta > 0), clip_ratio/low_mean, high_mean, region_mean.
Validation and `framework test` decode one completion a prompt (task.eval_temperature: 0 is greedy)
and report the same reward means: the held-out accuracy, with an exact-match reward.
"""
from __future__ import annotations

from typing import Literal

import torch

from framework.config.types import NonNegativeFloat, PositiveInt
from framework.data.tokenizer import loaded_tokenizer
from framework.errors import ConfigError
from framework.models.context import context_length
from framework.models.flops import key_value_shape
from framework.sampling import Sampling
from framework.sequences import IGNORE_INDEX
from framework.tasks import grpo_loss as G
from framework.tasks.base import Task
from framework.tasks.rewards import fields_read, resolved, reward_name, scored
from framework.tasks.rollout import ONE_PROCESS, Ranks, group_seed, keeps_past, sample_group
from framework.tasks.second_model import FrozenSource, missing
from framework.tasks.token_logps import logps_of, output_logits


def _many_processes() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized() \
        and torch.distributed.get_world_size() > 1


class GRPO(Task):
    """Group-relative policy optimisation from reward functions, with generation in the loop."""

    takes_batches = ("prompts",)
    throughput_unit = "tokens"
    frozen_model = True  # the reference, with beta > 0

    def __init__(self, tokenizer: str, rewards: list = ("exact_match",), reward_weights: list[float] | None = None,
                 num_generations: PositiveInt = 8, max_completion_tokens: PositiveInt = 64,
                 temperature: NonNegativeFloat = 1.0, top_p: float = 1.0, top_k: PositiveInt | None = None,
                 loss: Literal["grpo", "dr_grpo", "dapo", "bnpo"] = "dapo", epsilon: NonNegativeFloat = 0.2,
                 epsilon_high: NonNegativeFloat | None = None, beta: NonNegativeFloat = 0.0,
                 scale_rewards: Literal["group", "batch", "none"] = "group", num_iterations: PositiveInt = 1,
                 reference: str | None = None, disable_dropout: bool = False, stop: str | None = None,
                 eval_temperature: NonNegativeFloat = 0.0, seed: int = 0):
        """tokenizer: the data's (completions decoded for the rewards); rewards: built-in names
        (exact_match, format, length) or trusted `_target_`s (framework/tasks/rewards.py);
        reward_weights: one per reward (null: all 1); num_generations: completions per prompt (the
        group an advantage is relative to), at least 2; max_completion_tokens: the most a completion
        has; temperature, top_p, top_k: how they are sampled (the log-probabilities are of the
        logits / temperature); loss: grpo, dr_grpo, dapo or bnpo (trl's); epsilon, epsilon_high:
        the ratio's clip below and above (null: epsilon); beta: the KL penalty to the reference (0
        builds none); scale_rewards: divide advantages by the group's std, the batch's, or none;
        num_iterations: optimizer steps on each batch of completions (its sampling-time
        log-probabilities kept); reference: where the reference comes from (null: the policy's
        initial weights; with adapter=lora the policy with its adapters off); disable_dropout:
        every dropout of the policy at p=0 (trl's default keeps it); stop: a text whose one token
        also ends a completion (the tokenizer's end-of-text ids always do); eval_temperature: how
        validation and testing decode (0: greedy); seed: seeds the completions with step and prompt."""
        if temperature == 0:
            raise ConfigError("task.temperature=0: GRPO samples several completions a prompt to compare; greedy "
                              "decoding gives the same one each time. Set a temperature above 0 (trl's default 1.0).")
        if num_generations < 2:
            raise ConfigError(f"task.num_generations={num_generations}: an advantage is a completion's reward against "
                              "its group's, which needs at least 2 completions a prompt (trl's default 8).")
        if not 0 < top_p <= 1:
            raise ConfigError(f"task.top_p={top_p}: must be in (0, 1] (1 keeps every token).")
        if loss not in G.LOSSES:
            raise ConfigError(f"task.loss={loss!r}: choose one of {', '.join(G.LOSSES)} (trl's loss_type names).")
        if scale_rewards not in G.SCALES:
            raise ConfigError(f"task.scale_rewards={scale_rewards!r}: choose one of {', '.join(G.SCALES)}.")
        if epsilon >= 1:
            raise ConfigError(f"task.epsilon={epsilon}: the ratio is clipped below at 1 - epsilon, so epsilon must be "
                              "below 1 (trl's default 0.2).")
        self.tokenizer_spec = str(tokenizer)
        self.reward_functions = resolved(list(rewards))
        weights = [1.0] * len(self.reward_functions) if reward_weights is None else [float(w) for w in reward_weights]
        if len(weights) != len(self.reward_functions):
            raise ConfigError(f"task.reward_weights: {len(weights)} weights for {len(self.reward_functions)} reward "
                              "functions; give one weight per task.rewards entry (or null: all 1).")
        self.reward_weights = torch.tensor(weights, dtype=torch.float32)
        self.reward_names = [reward_name(f) for f in self.reward_functions]
        self.num_generations, self.max_completion_tokens = num_generations, max_completion_tokens
        self.sampling = Sampling(max_completion_tokens, temperature, top_k, None if top_p == 1 else top_p)
        self.loss, self.epsilon_low = loss, float(epsilon)
        self.epsilon_high = float(epsilon if epsilon_high is None else epsilon_high)
        self.beta, self.scale_rewards, self.num_iterations = float(beta), scale_rewards, num_iterations
        self.reference_path, self.disable_dropout = reference, bool(disable_dropout)
        self.eval_sampling = Sampling(max_completion_tokens, eval_temperature, top_k,
                                      None if top_p == 1 else top_p)
        self.seed = int(seed)
        self.stop = stop
        self._stop_ids: tuple[int, ...] | None = None
        if loss != "dapo":  # normalised per micro-batch: the loop's global token count is dapo's alone
            self.training_sums = None

    # ---- what it reads --------------------------------------------------------------------------------
    @property
    def tokenizer(self):
        return loaded_tokenizer(self.tokenizer_spec)

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """The ids a completion ends after: the tokenizer's end-of-text ids, and task.stop's one token."""
        if self._stop_ids is None:
            ids = set(self.tokenizer.stop_ids)
            if self.stop is not None:
                encoded = self.tokenizer.encode([self.stop_text])[0]
                if len(encoded) != 1:
                    raise ConfigError(f"task.stop={self.stop_text!r}: the tokenizer makes it {len(encoded)} tokens; a stop "
                                      "must be one token (e.g. a newline, or the chat template's end of turn).")
                ids.add(encoded[0])
            if not ids:
                raise ConfigError("task.stop: the tokenizer has no end-of-text token, so no completion would end "
                                  "before task.max_completion_tokens; give task.stop (a one-token text, e.g. '\\n').")
            self._stop_ids = tuple(sorted(ids))
        return self._stop_ids

    @property
    def stop_text(self) -> str | None:
        """task.stop with its backslash escapes read (the command line's task.stop='\\n' is a newline)."""
        if self.stop is None or "\\" not in self.stop:
            return self.stop
        return self.stop.encode("utf-8").decode("unicode_escape")

    def reward_fields(self) -> dict[str, tuple[str, ...]]:
        """Each reward function's name -> the prompt rows' fields it reads (checked before launch)."""
        return {name: fields_read(f) for name, f in zip(self.reward_names, self.reward_functions)}

    def problems_with(self, data, model: torch.nn.Module) -> list[str]:
        """A reward reading a field the prompt rows lack; a prompt and its completion longer than
        the model's context; a task.stop that is not one token."""
        found = []
        field_problems = getattr(data, "field_problems", None)
        if field_problems is not None:
            found += field_problems({name: fields for name, fields in self.reward_fields().items() if fields})
        context = context_length(model)
        prompt = getattr(data, "max_prompt_tokens", None)
        if context is not None and prompt is not None and prompt + self.max_completion_tokens > context:
            found.append(f"task.max_completion_tokens={self.max_completion_tokens} with data.max_prompt_tokens={prompt}: "
                         f"a prompt and its completion take up to {prompt + self.max_completion_tokens} positions, the "
                         f"model's context holds {context}; lower one of the two (or give the model a longer context).")
        try:
            _ = self.stop_ids
        except ConfigError as err:
            found.append(str(err))
        return found

    def rollout_memory(self, model: torch.nn.Module, prompt_tokens: int, prompts: int,
                       element_bytes: int) -> tuple[int, str]:
        """(bytes, what they are) a rank holds while sampling one prompt's group (its prompts are
        decoded one after another): a model with a KV cache (the GPT's own, a Hugging Face model's)
        keeps every layer's keys and values of num_generations x (prompt + completion) positions;
        another recomputes the whole sequence each token, its logits the largest piece. `model`: on
        the meta device."""
        positions, rows = prompt_tokens + self.max_completion_tokens, self.num_generations
        shape = key_value_shape(model) if hasattr(model, "new_cache") or keeps_past(model) else None
        if shape is not None:
            layers, width = shape
            cache = 2 * layers * rows * positions * width * element_bytes
            return cache, (f"KV cache of {rows} completions x {positions} positions x {layers} layers x {width} "
                           f"(keys and values), one prompt at a time ({prompts} a micro-batch)")
        vocabulary = getattr(getattr(model, "config", None), "vocab_size", None) or 0
        logits = rows * positions * vocabulary * 4
        return logits, (f"no KV cache of its own: each token recomputes {rows} x {positions} positions, their float32 "
                        f"logits over {vocabulary:,} tokens the largest piece")

    def frozen_source(self) -> FrozenSource | None:
        return FrozenSource("task.reference", self.reference_path) if self.beta > 0 else None

    def batch_size(self, batch) -> int:
        """Tokens trained (prompts and completions, padding included); a prompt batch's prompt tokens."""
        return int(batch["input_ids"].numel() if "input_ids" in batch else batch["prompt_ids"].numel())

    def scored_count(self, batch) -> int:
        """dapo: the completion tokens a rolled-out micro-batch scores (the step's count is all ranks')."""
        return int((batch["targets"] != IGNORE_INDEX).sum())

    def rolled_example(self, batch: dict) -> dict:
        """A rolled-out batch of the shapes `batch`'s prompts give (every completion
        max_completion_tokens long, values of no meaning): what the checks before launch pass
        through model and task (framework/tasks/fit_check.py), on the meta device."""
        prompts, width = batch["prompt_ids"].shape
        rows, device = prompts * self.num_generations, batch["prompt_ids"].device
        length = width + self.max_completion_tokens
        targets = torch.full((rows, length), IGNORE_INDEX, dtype=torch.long, device=device)
        targets[:, width - 1:length - 1] = 0
        example = {"input_ids": torch.zeros((rows, length), dtype=torch.long, device=device), "targets": targets,
                   "advantages": torch.zeros(rows, device=device), "tokens_per_rank": torch.ones((), device=device),
                   "step_values": {}}
        if self.num_iterations > 1:
            example["old_logps"] = torch.zeros((rows, length), device=device)
        if self.beta > 0:
            example["ref_logps"] = torch.zeros((rows, length), device=device)
        return example

    # ---- the rollout (the loop calls it with the step's micro-batches, before any forward) ----------
    @torch.no_grad()
    def rollout(self, model: torch.nn.Module, batches: list[dict], step: int, ranks: Ranks = ONE_PROCESS) -> list[dict]:
        """The step's prompt micro-batches (this rank's, on the device) made into what it trains on:
        completions sampled, scored, their advantages and (num_iterations > 1, beta > 0) the
        sampling-time and reference log-probabilities; every value logged is the whole step's."""
        was = model.training
        model.eval()
        try:
            groups = [self._completions(model, b, step, self.sampling, self.num_generations, ranks.collective_forward)
                      for b in batches]
        finally:
            model.train(was)
        return self.from_completions(model, batches, groups, ranks)

    @torch.no_grad()
    def from_completions(self, model: torch.nn.Module, batches: list[dict], groups: list[list],
                         ranks: Ranks = ONE_PROCESS) -> list[dict]:
        """What the rollout makes of given completions (`groups`: for each micro-batch, each prompt's
        (prompt ids, framework/tasks/rollout.py Group)): scored, advantages, the kept
        log-probabilities. The rollout samples them; a test feeds trl and this the same ones."""
        rolled = [self._assembled(b, g) for b, g in zip(batches, groups)]
        rewards = [self._rewards(b, r) for b, r in zip(batches, rolled)]
        return self._scored(model, rolled, rewards, ranks)

    def _completions(self, model, batch: dict, step: int, sampling: Sampling, generations: int,
                     collective: bool) -> list:
        prompts = [ids[:n].tolist() for ids, n in zip(batch["prompt_ids"], batch["prompt_lengths"].tolist())]
        found = []
        for prompt, index in zip(prompts, batch["index"].tolist()):
            generator = torch.Generator().manual_seed(group_seed(self.seed, step, index))
            found.append((prompt, sample_group(model, prompt, generations, sampling, self.stop_ids, generator,
                                               every_position=collective)))
        return found

    def _assembled(self, batch: dict, groups: list) -> dict:
        """Rows of prompt + completion, right-padded: input_ids (N, L), targets (N, L: the next
        token where it is a completion's, else -100), and what the rewards read."""
        rows, targets, completions, truncated, row_of = [], [], [], [], []
        for i, (prompt, group) in enumerate(groups):
            for ids, cut in zip(group.completions, group.truncated):
                rows.append(prompt + ids)
                targets.append([IGNORE_INDEX] * (len(prompt) - 1) + ids + [IGNORE_INDEX])
                completions.append(ids)
                truncated.append(cut)
                row_of.append(i)
        width = max(len(r) for r in rows)
        pad = self.tokenizer.pad_id
        device = batch["prompt_ids"].device
        input_ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows], dtype=torch.long, device=device)
        target = torch.tensor([t + [IGNORE_INDEX] * (width - len(t)) for t in targets], dtype=torch.long, device=device)
        return {"input_ids": input_ids, "targets": target, "completion_ids": completions,
                "truncated": torch.tensor(truncated, dtype=torch.float32), "row_of": row_of}

    def _rewards(self, batch: dict, rolled: dict) -> torch.Tensor:
        """(N, functions) rewards of a micro-batch's completions (NaN: no opinion)."""
        rows = [batch["rows"][i] for i in rolled["row_of"]]
        prompts = [batch["prompts"][i] for i in rolled["row_of"]]
        texts = [self.tokenizer.decode(ids) for ids in rolled["completion_ids"]]
        completions = [t if isinstance(p, str) else [{"role": "assistant", "content": t}] for p, t in zip(prompts, texts)]
        columns = [scored(f, rows, prompts, completions, rolled["completion_ids"]) for f in self.reward_functions]
        return torch.tensor(columns, dtype=torch.float32).T.reshape(len(rows), len(columns))

    def _scored(self, model, rolled: list[dict], rewards: list[torch.Tensor], ranks: Ranks) -> list[dict]:
        """The micro-batches trained on: advantages (each group's, or with scale_rewards=batch the
        whole step's std on every rank), the step's logged values (one all-reduce), and the kept
        log-probabilities."""
        each = torch.cat(rewards)  # (N_step, functions) on this rank
        weighted = (each * self.reward_weights).nansum(dim=1)
        weighted[torch.isnan(each).all(dim=1)] = float("nan")  # no function scored it: no advantage
        per_batch = [len(r["completion_ids"]) for r in rolled]
        scaled = [G.advantages(w, self.num_generations, self.scale_rewards) for w in weighted.split(per_batch)]
        lengths = torch.tensor([float(len(c)) for r in rolled for c in r["completion_ids"]])
        local = G.StepTally.local(each, weighted, lengths, torch.cat([r["truncated"] for r in rolled]),
                                  torch.cat([z for _, z in scaled]),
                                  [int((r["targets"] != IGNORE_INDEX).sum()) for r in rolled])
        device = rolled[0]["input_ids"].device
        tally = G.StepTally.of(ranks.data_sum(local.to(device)).cpu(), len(self.reward_functions))
        if self.scale_rewards == "batch":
            scaled = [G.advantages(w, self.num_generations, "batch", tally.reward) for w in weighted.split(per_batch)]
        values = tally.values(self.reward_names)
        out = []
        for r, (a, _), tokens in zip(rolled, scaled, tally.tokens):
            micro = {"input_ids": r["input_ids"], "targets": r["targets"], "advantages": a.to(device),
                     "tokens_per_rank": torch.tensor(tokens / tally.ranks, dtype=torch.float32, device=device),
                     "step_values": values}
            if self.num_iterations > 1:  # trl: the policy's at sampling time, in its training mode
                micro["old_logps"] = self.token_logps(model, micro).detach()
            if self.beta > 0:
                micro["ref_logps"] = self.reference_logps(model, micro)
            out.append(micro)
        return out

    # ---- log-probabilities ------------------------------------------------------------------------------
    def token_logps(self, model, batch: dict, with_entropy: bool = False):
        """Each position's log-probability of its target (N, L; 0 off the completions) under the
        logits / temperature, and (with_entropy) each position's entropy."""
        logits = output_logits(model(input_ids=batch["input_ids"])) / self.sampling.temperature
        logps = logps_of(logits, batch["targets"])
        return (logps, G.entropy_of(logits)) if with_entropy else logps

    def reference_logps(self, model, batch: dict) -> torch.Tensor:
        if self.frozen is None:
            raise missing("task.reference", "grpo")
        with self.frozen.computing(model) as reference:
            return self.token_logps(reference, batch)

    # ---- the loss -------------------------------------------------------------------------------------
    def _terms(self, model, batch: dict) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """(per-token loss (N, L), mask, the values logged for this micro-batch)."""
        logps, entropy = self.token_logps(model, batch, with_entropy=True)
        mask = (batch["targets"] != IGNORE_INDEX).float()
        old = batch.get("old_logps")
        terms = G.policy_terms(logps, logps.detach() if old is None else old, batch["advantages"], self.epsilon_low,
                               self.epsilon_high, self.beta, batch.get("ref_logps"))
        share = batch["tokens_per_rank"].clamp(min=1.0)  # averaged over the ranks: the step's token mean

        def token_mean(x):
            return ((x.detach() * mask).sum() / share).float()

        values = {"entropy": token_mean(entropy)}
        if terms.kl is not None:
            values["kl"] = token_mean(terms.kl)
        values.update({k: token_mean(v) for k, v in G.clip_counts(terms, batch["advantages"], self.epsilon_low,
                                                                   self.epsilon_high).items()})
        device = logps.device
        values.update({k: torch.tensor(float(v), device=device) for k, v in batch["step_values"].items()})
        return terms.per_token, mask, values

    def training_step(self, model, batch) -> dict[str, torch.Tensor]:
        per_token, mask, values = self._terms(model, batch)
        if self.loss == "dapo":
            loss = (per_token * mask).sum() / mask.sum().clamp(min=1.0)
        else:
            loss = G.normalised(per_token, mask, self.loss, self.max_completion_tokens)
        return {"loss": loss, **values}

    def training_sums(self, model, batch) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """dapo: the micro-batch's summed token losses and their count (the loop divides by the
        step's count over every rank), and the values to log."""
        per_token, mask, values = self._terms(model, batch)
        return (per_token * mask).sum(), mask.sum(), values

    # ---- validation and testing ------------------------------------------------------------------------
    def validation_step(self, model, batch) -> dict[str, torch.Tensor]:
        """One completion a prompt, decoded as task.eval_temperature says; the rewards summed. Under
        several processes every rank decodes as many prompts as the rank with the most in this
        batch (a short last batch decodes its last prompt again, unscored): a sharded model's
        forwards are collective."""
        many, prompts = _many_processes(), len(batch["prompts"])
        most = prompts
        if many:  # agreed before any forward: the forwards of every rank must line up
            count = torch.tensor(float(prompts), device=batch["prompt_ids"].device)
            torch.distributed.all_reduce(count, op=torch.distributed.ReduceOp.MAX)
            most = int(count.item())
        groups = self._completions(model, batch, 0, self.eval_sampling, 1, many)
        for _ in range(most - prompts):
            sample_group(model, groups[-1][0], 1, self.eval_sampling, self.stop_ids, torch.Generator(),
                         every_position=True)
        rolled = self._assembled(batch, groups)
        each = self._rewards(batch, rolled)
        weighted = (each * self.reward_weights).nansum(dim=1)
        device = batch["prompt_ids"].device
        sums = {"reward_sum": weighted.double().sum(), "count": torch.tensor(float(len(weighted)), dtype=torch.float64),
                "length_sum": torch.tensor(sum(float(len(c)) for c in rolled["completion_ids"]), dtype=torch.float64),
                "clipped_sum": rolled["truncated"].double().sum()}
        for k, name in enumerate(self.reward_names):
            # under a name of its own: a reward called `length` once overwrote the completions' length
            sums[f"rewards/{name}"] = torch.nan_to_num(each[:, k].double()).sum()
        return {k: v.to(device) for k, v in sums.items()}

    def compute_metrics(self, sums) -> dict[str, float]:
        count = float(sums["count"].clamp(min=1))
        metrics = {"reward": float(sums["reward_sum"]) / count,
                   "completions/mean_length": float(sums["length_sum"]) / count,
                   "completions/clipped_ratio": float(sums["clipped_sum"]) / count}
        for name in self.reward_names:
            metrics[f"rewards/{name}/mean"] = float(sums[f"rewards/{name}"]) / count
        return metrics

