"""How a model is constructed for a run, below the strategies that use it: on the meta device and
replayed into shards (meta_build, meta_init), quantized as it is made (quantized_build), its units
(units) and their activation checkpointing, tied weights kept tied (tied), and optimizer state by
parameter name (named_state)."""
