"""DeepSpeed ZeRO: the strategy base every `strategy=deepspeed_stage_*` option builds (base), and
its helpers: the lazy import (imports), ZeRO sizes derived from the model (sizes), one float32
master copy shared with ZeRO-3's partitions (master_weights), and the gradient buffer between steps
(grad_buffer). `deepspeed` itself is imported only when a DeepSpeed strategy is chosen."""
