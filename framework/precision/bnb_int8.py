"""`precision=bnb_int8`: linear layers frozen in LLM.int8() form: int8 weights with a float scale per row.

Shared behaviour, options and checkpoints: framework/precision/quantized.py.
"""
from framework.precision.quantized import QuantizedPrecision


class BnbInt8Precision(QuantizedPrecision):
    """Linear layers frozen in LLM.int8() form: int8 weights with a float scale per row."""

    name = "bnb_int8"
    quantization = "int8"
    double_quant = False
    bits_per_weight = 8.25
