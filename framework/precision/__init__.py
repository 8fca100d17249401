"""precision group. The option names are numbers, so the modules carry a prefix:

| conf/precision/ | module         | what it does                                  |
|-----------------|----------------|-----------------------------------------------|
| 32.yaml         | fp32.py        | float32 everywhere (the base behaviour)       |
| 64.yaml         | fp64.py        | the model and float inputs in float64         |
| 16.yaml         | fp16_mixed.py  | fp16 autocast + dynamic loss scaling          |
| bf16.yaml       | bf16_mixed.py  | bf16 autocast, float32 weights                |
| 16_true.yaml    | fp16_true.py   | the whole model and inputs cast to fp16       |
| bf16_true.yaml  | bf16_true.py   | the whole model and inputs cast to bf16       |
"""
