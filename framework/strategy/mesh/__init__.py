"""The FSDP2 family as one strategy over one parallel-dims spec (dims.py), built by small appliers
in a fixed order: tensor parallelism (tensor_parallel.py), the pipeline split
(framework/strategy/mesh/pipeline/), FSDP2 sharding (fully_shard.py); clipping (gradients.py) and
checkpoint state (state.py) written once for every layout. The options fsdp, fsdp_cpu_offload,
hsdp, model_parallel and pipeline are presets of it (framework/strategy/<option>.py)."""
