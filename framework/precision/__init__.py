"""precision group. The option names are numbers, so the modules carry a prefix:

| conf/precision/ | module         | what it does                                  |
|-----------------|----------------|-----------------------------------------------|
| 32.yaml         | fp32.py        | float32 everywhere (the base behaviour)       |
| 64.yaml         | fp64.py        | the model and float inputs in float64         |
| 16.yaml         | fp16_mixed.py  | fp16 autocast + dynamic loss scaling          |
| bf16.yaml       | bf16_mixed.py  | bf16 autocast, float32 weights                |
| 16_true.yaml    | fp16_true.py   | the whole model and inputs cast to fp16       |
| bf16_true.yaml  | bf16_true.py   | the whole model and inputs cast to bf16       |
| bnb_int8.yaml   | bnb_int8.py    | linear layers frozen in int8 (bitsandbytes)   |
| bnb_nf4.yaml    | bnb_nf4.py     | linear layers frozen in 4-bit nf4             |
| bnb_nf4_dq.yaml | bnb_nf4_dq.py  | nf4 with double-quantized block scales        |
| bnb_fp4.yaml    | bnb_fp4.py     | linear layers frozen in 4-bit fp4             |
| te_fp8.yaml     | te_fp8.py      | fp8 matmuls through TransformerEngine (GPU)   |

The four quantized ones share quantized.py (which layers, checkpoints) and quantized_layers.py.
"""
