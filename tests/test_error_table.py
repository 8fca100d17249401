"""Every user mistake gives one clear paragraph naming the key and the fix, exit code 2, and no
traceback (unless debug=true or HYDRA_FULL_ERROR=1). One row per mistake: the command as a user
types it, and a fragment the message must contain.

The rows run in this process, through the very entry a user's command goes through (the guard,
Hydra's app, the `framework` parser: tests/helpers/in_process.py); a few run as real commands too,
for the exit status a shell sees and a start-up that prints no traceback."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.helpers.in_process import run_command

TRAIN = ["train"]  # `python train.py ...` (the `framework train` app is the same)
FRAMEWORK = []  # `framework ...`

CASES = [
    # unknown options and keys, with a did-you-mean
    (TRAIN + ["strategy=ddpp"], "strategy=ddpp: no such option. Did you mean ddp?"),
    (TRAIN + ["precision=17"], "precision=17: no such option. Did you mean 16?"),
    (TRAIN + ["logger=[csv,tensorbord]"], "logger=tensorbord: no such option. Did you mean tensorboard?"),
    (TRAIN + ["callbacks=[chekpoint]"], "Did you mean checkpoint?"),
    (TRAIN + ["scheduler=cosin"], "scheduler=cosin: no such option. Did you mean cosine?"),
    (TRAIN + ["strategi=ddp"], "strategi: no such key. Did you mean strategy?"),
    (TRAIN + ["trainer.max_step=3"], "trainer.max_step: no such key. Did you mean max_steps?"),
    (TRAIN + ["model.n_layr=2"], "model.n_layr: no such key. Did you mean n_layer?"),
    (TRAIN + ["-m", "strategy=ddp,ddpp"], "strategy=ddpp: no such option. Did you mean ddp?"),
    # override syntax and types
    (TRAIN + ["foo"], "bad override syntax: Error parsing override 'foo'"),
    (TRAIN + ["+x=[1"], "bad override syntax"),
    (TRAIN + ["trainer.max_steps=abc"], "trainer.max_steps=abc: Value 'abc' of type 'str' could not be converted"),
    (TRAIN + ["trainer.preemption_signals=SIGTERM"], "is not a ListConfig, list or tuple. Give a value of the key's type"),
    (TRAIN + ["optimizer.lr=fast"], "optimizer.lr='fast': must be a number"),
    (TRAIN + ["+model.foo=1"], "model.foo: 'framework.models.gpt.GPT' takes no argument 'foo'. It takes: vocab_size"),
    (TRAIN + ["strategy=fsdp", "devices=2", "strategy.wrap_modules=[Blok]"],
     "strategy.wrap_modules=['Blok']: the model has no module of class Blok. Did you mean Block?"),
    (TRAIN + ["model=hf_causal_lm", "model.config=null", "model.pretrained=no-such-org/no-such-model"],
     "no such directory, and not in the Hugging Face cache. The framework never downloads during a run"),
    (TRAIN + ["model=hf_causal_lm", "model.config={model_type:llama,hidden_size:64}"],
     "model.config.hidden_size: no such key (from the value given to model.config, which is merged into its existing "
     "keys). Add it with +model.config.hidden_size=..., or replace the whole node: ~model.config +model.config={...}"),
    (TRAIN + ["data=text_files", "data.files=nowhere/*.txt"], "data.files: the pattern '{tmp}/nowhere/*.txt' matches no file"),
    (TRAIN + ["model._target_=framework.models.gpt.GTP"], "the module 'framework.models.gpt' has no 'GTP'. Did you mean GPT?"),
    # values out of range
    (TRAIN + ["trainer.max_steps=0"], "trainer.max_steps=0: must be a positive integer or null"),
    (TRAIN + ["trainer.max_steps=null"], "trainer.max_steps and trainer.max_epochs are both null"),
    (TRAIN + ["devices=0"], "devices=0: must be a positive integer or 'auto'"),
    (TRAIN + ["devices=many"], "devices='many'"),
    (TRAIN + ["num_nodes=0"], "num_nodes=0"),
    (TRAIN + ["trainer.accumulate=-2"], "trainer.accumulate=-2: must be a positive integer"),
    (TRAIN + ["trainer.colour=red"], "trainer.colour: no such key"),
    (TRAIN + ["resume=yes"], "resume='yes': must be 'auto' or null"),
    (TRAIN + ["trainer.objective_mode=best"], "trainer.objective_mode='best': must be 'min' or 'max'"),
    (TRAIN + ["trainer.on_nonfinite=stpo"], "trainer.on_nonfinite='stpo': must be 'stop', 'skip' or 'warn'"),
    (TRAIN + ["trainer.nonfinite_skip_limit=-1"], "trainer.nonfinite_skip_limit=-1: must be zero (no limit)"),
    (TRAIN + ["model.n_embd=-4"], "model.n_embd=-4: must be a number > 0"),
    (TRAIN + ["data.batch_size=0"], "data.batch_size=0: must be a number > 0"),
    (TRAIN + ["strategy=ddp", "strategy.bucket_cap_mb=-1"], "strategy.bucket_cap_mb=-1: must be a number > 0"),
    (TRAIN + ["model.n_head=3"], "model.n_head=3 must divide model.n_embd=128"),
    (TRAIN + ["trainer.preemption_signals=[SIGFOO]"], "'SIGFOO' is not a signal name"),
    (TRAIN + ["-m", "model.n_layer=1,2", "optimizer.lr=1e-3,fast"], "optimizer.lr='fast': must be a number"),
    # impossible combinations (the compatibility table)
    (TRAIN + ["accelerator=cuda"] if not __import__("torch").cuda.is_available() else TRAIN + ["accelerator=mps"],
     "Use accelerator=cpu (or accelerator=auto"),
    (TRAIN + ["strategy=single_device", "devices=2"], "strategy=single_device runs one process, but devices=2"),
    (TRAIN + ["accelerator=mps"], "accelerator=mps"),
    (TRAIN + ["strategy=deepspeed_stage_2", "trainer.on_nonfinite=skip"],
     "trainer.on_nonfinite=skip with strategy=deepspeed_stage_2: its engine clips and steps in one call"),
    (TRAIN + ["--config-dir", str(ROOT / "recipes"), "--config-name", "gan_manual_optimization", "trainer.on_nonfinite=skip"],
     "trainer.on_nonfinite=skip with a task that steps its optimizers itself"),
    (TRAIN + ["strategy=deepspeed_stage_2", "precision=64"], "DeepSpeed has no float64 mode; use precision=32"),
    (TRAIN + ["strategy=deepspeed_stage_2", "precision=bf16_true"], "no true half precision; use precision=bf16"),
    (TRAIN + ["strategy=deepspeed_stage_2", "trainer.clip_grad_value=1.0"], "use trainer.clip_grad_norm instead"),
    (TRAIN + ["num_nodes=2"], "num_nodes=2 with cluster=local: the framework starts processes on this machine only"),
    (TRAIN + ["strategy=ddp", "strategy.sync_batchnorm=true"], "set strategy.sync_batchnorm=false"),
    (TRAIN + ["-m", "strategy=ddp,single_device", "devices=2"], "strategy=single_device runs one process"),
    (TRAIN + ["-m", "fault_tolerance=torchft", "fault_tolerance.replica_groups=2", "seed=1,2"],
     "fault_tolerance=torchft in a sweep: each job would start a lighthouse and every group of its own"),
    # files: missing, incomplete, conflicting
    (TRAIN + ["ckpt_path=/nonexistent/ckpt"], "ckpt_path=/nonexistent/ckpt: no such checkpoint directory"),
    (TRAIN + ["ckpt_path={tmp}"], "is not a complete checkpoint: meta.json is missing"),
    (TRAIN + ["ckpt_path={tmp}", "resume=auto"], "both choose a checkpoint: give one"),
    (FRAMEWORK + ["run", "gpt_dpp"], "no such file, and no built-in recipe 'gpt_dpp'. Did you mean gpt_ddp?"),
    (FRAMEWORK + ["run", "missing/recipe.yaml"], "recipe missing/recipe.yaml: no such file"),
    (FRAMEWORK + ["run", "digits_classifier", "callbacks=[]"], "callbacks.checkpoint: settings (every_n_steps"),
    (FRAMEWORK + ["run", "digits_classifier", "callbacks=[]"], "Add checkpoint to callbacks=[...]"),
    (FRAMEWORK + ["validate", "{tmp}/nope.yaml"], "no such file"),
    (FRAMEWORK + ["plan", "strategy=ddpp"], "strategy=ddpp: no such option. Did you mean ddp?"),
    (FRAMEWORK + ["list", "stratgy"], "no config group stratgy. Did you mean strategy?"),
    (FRAMEWORK + ["cp", "gpt_dpp", "{tmp}/x.yaml"], "Did you mean gpt_ddp?"),
    # trust
    (TRAIN + ["model._target_=os.system"], "model._target_=os.system is not in the trusted targets"),
    # bad input found on the way to one pipeline (issue 13)
    (TRAIN + ["+trainer.max_stepz=10"], "trainer.max_stepz: no such key, and nothing reads it"),
    (TRAIN + ["data=digits"], "data (Digits) gives (features, labels): a float vector and a class per sample, but "
     "task (LanguageModeling) reads (inputs, targets) blocks of token ids"),
    (TRAIN + ["model=mlp"], "model (MLP), data (StdlibText) and task (LanguageModeling) do not fit "
     "together"),
    # a task given data whose batches it cannot read (issue 78): the data options that fit named
    (TRAIN + ["task=preference"], "task (Preference) reads preference pairs: the chosen rows, then the rejected rows "
     "of the same prompts. Choose data=preference_files, or another task."),
    (TRAIN + ["task=preference", "data=chat_files"], "data (ChatFiles) gives rows of input_ids"),
    (TRAIN + ["task=gan", "model=gan"], "task (GANTask) reads (points,): unlabelled float vectors (a distribution to "
     "learn). Choose data=gaussian_ring, or another task."),
    (TRAIN + ["task=classification", "model=mlp", "data=preference_files"], "Choose data=digits, or another task."),
    (TRAIN + ["task=language_modeling", "data=gaussian_ring"],
     "Choose data=chat_files or data=stdlib_text or data=text_files, or another task."),
    (TRAIN + ["task=gan", "data=gaussian_ring"], "model (GPT), data (GaussianRing) and task (GANTask) do not fit "
     "together: the task's optimizer_groups (it steps its optimizers itself) fails with: 'GPT' object has no "
     "attribute 'discriminator'"),
    (TRAIN + ["strategy=fsdp", "+strategy.find_unused_parameters=true"],
     "drop it with ~strategy.find_unused_parameters"),
    (TRAIN + ["strategy=deepspeed_stage_2", "+strategy.config.zero_optimization.stage=7"],
     "strategy.config.zero_optimization.stage=7: DeepSpeed refuses it"),
    (TRAIN + ["hydra.run.dir=/etc/passwd/run"], "hydra.run.dir=/etc/passwd/run: cannot be created, because /etc/passwd"),
    # bad input that still got through (issue 27)
    (TRAIN + ["model=hf_causal_lm", "model.config.n_positions=64"],
     "data.block_size=128: the data's blocks are 128 tokens, but the model (GPT2LMHeadModel) has learned positions "
     "for 64 (model.config.n_positions=64, its transformer.wpe). Set data.block_size=64 or less"),
    (TRAIN + ["model.block_size=64", "data.block_size=128"], "has learned positions for 64 (model.block_size=64"),
    (TRAIN + ["model=hf_causal_lm", "model.config.model_type=gtp2"],
     "model.config.model_type='gtp2' is not an architecture transformers"),
    (TRAIN + ["model=hf_causal_lm", "model.config.model_type=llama"],
     "model.config: llama has no field n_embd, n_head, n_layer, n_positions. Fields merged from another architecture? "
     "Choose the family with model/config=llama"),
    (TRAIN + ["model=hf_causal_lm", "model/config=llama", "model.config.num_key_value_heads=3"],
     "model.config.num_key_value_heads=3 does not divide model.config.num_attention_heads=4"),
    (TRAIN + ["model=mlp", "data=digits", "task=classification", "+task.loss_chunk_tokens=16"],
     "task.loss_chunk_tokens: 'framework.tasks.classification.Classification' takes no argument 'loss_chunk_tokens'"),
    (TRAIN + ["strategy=pipeline", "devices=2", "task.loss_chunk_tokens=16"],
     "task.loss_chunk_tokens with strategy=pipeline and pipeline stages"),
    # preference tuning (docs/post-training.md)
    (TRAIN + ["task=preference", "data=preference_files", "task.loss=dpo"],
     "task.loss='dpo': must be one of 'sigmoid', 'ipo', 'simpo'"),
    (TRAIN + ["task=preference", "data=preference_files", "task.beta=0"], "task.beta=0: must be a number > 0"),
    (TRAIN + ["task=preference", "data=preference_files", "task.label_smoothing=0.5"],
     "task.label_smoothing=0.5: must be at least 0 and below 0.5"),
    (TRAIN + ["task=preference", "data=preference_files", "task.reference=/nonexistent/sft-run"],
     "task.reference=/nonexistent/sft-run: no such directory"),
    (TRAIN + ["task=preference", "data=preference_files", "strategy=pipeline", "devices=2"],
     "task Preference with strategy=pipeline: the task computes with a second, frozen model"),
    (TRAIN + ["task=distillation"], "task.teacher: give the teacher's directory"),
    (TRAIN + ["task=distillation", "task.teacher=/nonexistent/teacher"], "task.teacher=/nonexistent/teacher: no such "
     "directory"),
    (TRAIN + ["task=distillation", "task.teacher=x", "task.kd_ratio=2"], "task.kd_ratio=2: must be between 0 and 1"),
    (TRAIN + ["task=distillation", "task.teacher=x", "task.temperature=0"], "task.temperature=0"),
    # a Hugging Face mixture of experts is checked as the built-in GPT's model.moe is
    (TRAIN + ["model=hf_causal_lm", "model/config=qwen3_moe", "model.config.num_experts_per_tok=9"],
     "model.config.num_experts_per_tok=9 is more than model.config.num_experts=8: each token is sent to "
     "num_experts_per_tok of the layer's 8 experts; choose num_experts_per_tok between 1 and 8."),
    (TRAIN + ["model=hf_causal_lm", "model/config=mixtral", "model.config.num_experts_per_tok=0"],
     "model.config.num_experts_per_tok=0 is less than 1"),
    (TRAIN + ["model=hf_causal_lm", "model/config=mixtral", "model.config.num_local_experts=0"],
     "model.config.num_local_experts=0: a mixture of experts needs at least one expert per layer"),
    (TRAIN + ["model=hf_causal_lm", "model/config=olmoe", "model.config.router_aux_loss_coef=-1"],
     "model.config.router_aux_loss_coef=-1.0: the balancing loss's weight must be 0 (none) or more"),
    (TRAIN + ["model=hf_causal_lm", "model.config.n_head=3"],
     "model.config.n_embd=128 is not divisible by model.config.n_head=3"),
    (FRAMEWORK + ["run", "hf_gpt2_text", "data.tokenizer={tmp}/nope.json"], "/nope.json': no such tokenizer.json"),
    (FRAMEWORK + ["run", "hf_gpt2_text", "data.val_files={tmp}/empty.jsonl", "data.files={tmp}/rows.jsonl"],
     "data.val_files: {tmp}/empty.jsonl is empty"),
    (FRAMEWORK + ["run", "hf_gpt2_text", "data.files={tmp}/rows.jsonl", "data.text_field=body"],
     "data.text_field='body': {tmp}/rows.jsonl has no such field (its first row has text)"),
    (TRAIN + ["callbacks.checkpoint.monitor=val/los"],
     "callbacks.checkpoint.monitor='val/los' is never logged: a validation logs val/loss, val/perplexity. Did you mean "
     "val/loss?"),
    (FRAMEWORK + ["run", "digits_classifier", "trainer.objective=val/acc"],
     "trainer.objective='val/acc' is never logged: a validation logs val/accuracy, val/loss. Did you mean val/accuracy?"),
    (TRAIN + ["model._target_=visoin.SmallCNN"], "model._target_=visoin.SmallCNN: no module named 'visoin' can be found"),
    (TRAIN + ["checkpoint_io=xla"], "checkpoint_io=xla with accelerator=cpu: this plugin serves XLA runs only"),
    # after fit: test, predict, generate, metrics
    (TRAIN + ["trainer.test_at_end=true", "data.test_percent=0"],
     "trainer.test_at_end=true: the data (StdlibText) has no test split. Give it one"),
    (TRAIN + ["trainer.objective=test/loss"], "trainer.objective='test/loss' is a test metric, logged only when the run "
                                              "tests at its end: set trainer.test_at_end=true"),
    (TRAIN + ["task.metrics=[MulticlassAUROC]"], "task.metrics[0] (MulticlassAUROC): its state preds, target keeps every "
                                                 "prediction"),
    (FRAMEWORK + ["test", "{tmp}"], "framework test {tmp}: not a run directory (it has no config.yaml)"),
    (FRAMEWORK + ["predict", "{tmp}", "-o", "rows.csv"], "-o rows.csv: write predictions to a .jsonl or .parquet file"),
    (FRAMEWORK + ["generate", "{tmp}", "--prompt", "def", "--top-p", "0"], "--top-p=0.0: must be in (0, 1]"),
    # adapters
    # 2-D meshes: sizes that do not divide, a model without a tensor-parallel plan
    (TRAIN + ["strategy=model_parallel", "devices=4", "strategy.tensor_parallel_size=3"],
     "strategy.tensor_parallel_size=3 does not divide the 4 ranks (devices x num_nodes)"),
    (TRAIN + ["strategy=model_parallel", "devices=2", "model.n_head=1", "model.n_embd=32"],
     "strategy.tensor_parallel_size=auto (2) does not divide model.n_head=1"),
    (TRAIN + ["model=mlp", "data=digits", "task=classification", "strategy=model_parallel", "devices=2"],
     "MLP has no tensor-parallel plan (the built-in GPT and Hugging Face models whose config has a base_model_tp_plan"),
    (TRAIN + ["strategy=hsdp", "devices=4", "strategy.shard_size=3"],
     "strategy.shard_size=3 does not divide the 4 ranks of a node (devices)"),
    # mixtures of experts: routing settings, expert parallelism's sizes, a Hugging Face family's routing under stages
    (TRAIN + ["model.moe.num_experts=4", "model.moe.top_k=5"], "model.moe.top_k=5 is more than model.moe.num_experts=4"),
    (TRAIN + ["model.moe.num_experts=4", "model.moe.layers=[3]"], "model.moe.layers=[3]: [3] not among the model's "
                                                                 "Blocks 0..1"),
    (TRAIN + ["model.moe.num_experts=4", "model.moe.scor=x"], "model.moe.scor: no such key. Did you mean score?"),
    (TRAIN + ["strategy=fsdp", "devices=2", "strategy.expert_parallel_size=2"],
     "strategy.expert_parallel_size=2: GPT has no mixture-of-experts layers to spread; set model.moe.num_experts"),
    (TRAIN + ["strategy=fsdp", "devices=2", "strategy.expert_parallel_size=2", "model.moe.num_experts=3",
              "model.moe.top_k=1"], "strategy.expert_parallel_size=2 does not divide the model's 3 experts per layer"),
    (TRAIN + ["strategy=fsdp", "devices=2", "strategy.expert_parallel_size=4", "model.moe.num_experts=4"],
     "strategy.expert_parallel_size=4 does not divide the 2 ranks that shard the model"),
    (TRAIN + ["model=hf_causal_lm", "model/config=qwen3_moe", "strategy=model_parallel", "devices=4",
              "strategy.tensor_parallel_size=2", "strategy.expert_parallel_size=2"],
     "strategy.expert_parallel_size=2 with a Hugging Face model (Qwen3MoeForCausalLM) takes data-parallel ranks only"),
    (TRAIN + ["strategy=fsdp", "devices=2", "strategy.cpu_offload=true", "strategy.expert_parallel_size=2",
              "model.moe.num_experts=4"], "strategy=fsdp with cpu_offload and expert_parallel_size=2: the experts are "
                                          "spread, not sharded by FSDP, and would stay on the device"),
    (TRAIN + ["strategy=pipeline", "devices=2", "model=hf_causal_lm", "model/config=qwen3_moe"],
     "a Hugging Face mixture of experts' routing is counted over every layer at once"),
    (TRAIN + ["strategy=pipeline", "devices=2", "model=hf_causal_lm", "model/config=qwen3_moe",
              "model.config.router_aux_loss_coef=0"],  # no loss, but the same watch: refused alike
     "under strategy=pipeline the layers lie on different pipeline stages; use strategy=fsdp"),
    # trainer.compile where it cannot work
    (TRAIN + ["trainer.compile=true", "strategy=deepspeed_stage_2", "devices=2"],
     "trainer.compile=true with strategy=deepspeed_stage_2: its engine wraps and drives the model's modules itself"),
    (TRAIN + ["trainer.compile=true", "precision=bnb_nf4"],
     "trainer.compile=true with precision=bnb_nf4: its layers run kernels of their own"),
    (TRAIN + ["adapter=lora", "adapter.target_modules=[qkvv]"], "adapter.target_modules: 'qkvv' match no linear layer "
                                                                "of the model. Did you mean qkv?"),
    (TRAIN + ["adapter=lora", "adapter.r=512"], "adapter.r=512: larger than blocks.0.attn.qkv's smaller dimension"),
    # chat data
    (TRAIN + ["data=chat_files", "data.chat_template=null"], "data.chat_template: the tokenizer has no chat template "
                                                             "(byte-level tokens have none); give one"),
    (TRAIN + ["data=chat_files", "data.files={tmp}/rows.jsonl"], "rows.jsonl's rows have neither 'messages' (a list of "
                                                                 "{role, content}: OpenAI's), 'conversations' (a "
                                                                 "list of {from, value}: ShareGPT's), 'instruction' "
                                                                 "and 'output'"),
    (TRAIN + ["data=chat_files", "model.block_size=16"], "longer than data.block_size=16, and no response starts "
                                                         "within the block: nothing in it is left to score"),
    (TRAIN + ["data=chat_files", "strategy=pipeline", "devices=2"],
     "passes only activations between its stages; set data.packing=false"),
    (TRAIN + ["strategy=pipeline", "devices=2", "precision=16"],
     "precision=16 with strategy=pipeline: its loss scaling multiplies the loss before backward"),
    (FRAMEWORK + ["run", "hf_lora_chat", "data.streaming=true"],
     "data.streaming: no such key. It is a key of data=text_files, not of the data option chosen"),
    (FRAMEWORK + ["run", "hf_lora_chat", "adapter=null"], "adapter: settings (r, alpha) for an adapter that is not "
                                                          "chosen"),
    # the last mile (issue 43): refused before anything is allocated or written
    (TRAIN + ["model.block_size=100000000"], "memory: the run cannot fit this machine"),
    (TRAIN + ["data=text_files", "data.cache_dir={tmp}/rows.jsonl/cache"],
     "data.cache_dir={tmp}/rows.jsonl/cache: cannot be created, because {tmp}/rows.jsonl is a file, not a folder; set "
     "data.cache_dir to a folder you can write"),
]

if importlib.util.find_spec("flash_attn") is None:  # a CUDA-only package: refused where it is not installed
    CASES.append((TRAIN + ["model=hf_causal_lm", "model.attn_implementation=flash_attention_2"],
                  "model.attn_implementation=flash_attention_2: needs the flash_attn package"))


def test_the_table_is_large_enough():
    assert len(CASES) >= 30


def write_inputs(tmp):
    (tmp / "empty.jsonl").write_text("")
    (tmp / "rows.jsonl").write_text("".join(f'{{"text": "row {i} of a small file of text"}}\n' for i in range(40)))


def as_typed(command, tmp):
    """The row's command with {tmp} filled in, a run cut to 2 steps (if a refusal were lost, it
    would not train for long)."""
    command = [part.replace("{tmp}", str(tmp)) for part in command]
    if command[:1] == TRAIN and "max_steps" not in " ".join(command):
        command.append("trainer.max_steps=2")
    return command


def assert_refused(result, fragment, tmp):
    assert result.returncode == 2, (result.returncode, result.stdout[-2000:], result.stderr[-2000:])
    assert fragment.replace("{tmp}", str(tmp)) in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    first = result.stderr.strip().splitlines()[0]
    assert first.startswith(("configuration error:", "checkpoint error:", "error:")), first
    assert not (tmp / "outputs").exists() and not (tmp / "multirun").exists()  # nothing left behind


@pytest.mark.parametrize("command,fragment", CASES, ids=[" ".join(c) for c, _ in CASES])
def test_mistake_gives_one_paragraph_and_exit_code_2(command, fragment, tmp_path):
    write_inputs(tmp_path)
    assert_refused(run_command(as_typed(command, tmp_path), tmp_path), fragment, tmp_path)


def shell(command, tmp, env=None):
    """The command in a fresh interpreter, as typed in a shell."""
    full_env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    full_env.update(env or {})
    program = [sys.executable, str(ROOT / "train.py")] if command[:1] == TRAIN else [sys.executable, "-m", "framework"]
    argv = command[1:] if command[:1] == TRAIN else command
    return subprocess.run([*program, *argv], capture_output=True, text=True, cwd=tmp, env=full_env, timeout=300)


# One row of each kind as a real command: Hydra's composition (an option, a key), a sweep's
# precheck (an option, a refusal), a refusal of the compatibility table, the preflight's memory check, a `framework`
# subcommand of its own.
SHELL_ROWS = (["strategy=ddpp"], ["trainer.max_step=3"], ["-m", "strategy=ddp,single_device", "devices=2"],
              ["model.block_size=100000000"], ["-m", "strategy=ddp,ddpp"], ["run", "gpt_dpp"])
IN_A_SHELL = [(c, f) for c, f in CASES if c[1:] in SHELL_ROWS[:5] and c[:1] == TRAIN or c == SHELL_ROWS[5]]


def test_the_shell_rows_are_found():
    assert len(IN_A_SHELL) == 6


@pytest.mark.slow
@pytest.mark.parametrize("command,fragment", IN_A_SHELL, ids=[" ".join(c) for c, _ in IN_A_SHELL])
def test_as_a_real_command_too(command, fragment, tmp_path):
    write_inputs(tmp_path)
    assert_refused(shell(as_typed(command, tmp_path), tmp_path), fragment, tmp_path)


@pytest.mark.slow
def test_debug_true_and_hydra_full_error_show_the_traceback(tmp_path):
    with_debug = shell(TRAIN + ["model.n_head=3", "debug=true"], tmp_path)
    assert with_debug.returncode != 0 and "Traceback" in with_debug.stderr
    with_env = shell(TRAIN + ["strategi=ddp"], tmp_path, env={"HYDRA_FULL_ERROR": "1"})
    assert with_env.returncode != 0 and "Traceback" in with_env.stderr
