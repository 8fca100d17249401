"""Run overrides the layout-equality tests share: a tiny GPT, four logged steps with a checkpoint
every second one, and the two-process layouts that split one batch of four rows (each compared with
one process reading the four)."""
from __future__ import annotations

TWO_LAYER_GPT = ["model.n_layer=2", "model.n_embd=32", "model.n_head=2", "model.dropout=0.0"]

FOUR_LOGGED_STEPS = ["trainer.max_steps=4", "trainer.val_every=2", "trainer.log_every=1", "trainer.progress_bar=false",
                     "trainer.plot=false", "trainer.val_at_start=false", "seed=0", "callbacks=[checkpoint]",
                     "callbacks.checkpoint.every_n_steps=2", "callbacks.checkpoint.keep_last_k=4"]

ONE_PROCESS = ["data.batch_size=4"]

TWO_PROCESS_LAYOUTS = {"ddp": ["strategy=ddp", "devices=2", "data.batch_size=2"],
                       "fsdp": ["strategy=fsdp", "devices=2", "data.batch_size=2"],
                       "deepspeed_stage_3": ["strategy=deepspeed_stage_3", "devices=2", "data.batch_size=2"],
                       # the tensor-parallel ranks read one batch together: the group's batch is the whole 4
                       "model_parallel": ["strategy=model_parallel", "devices=2", "data.batch_size=4"]}
