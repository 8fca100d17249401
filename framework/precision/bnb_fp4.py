"""`precision=bnb_fp4`: linear layers frozen as 4-bit floats (fp4), a float32 scale per 64 weights.

Shared behaviour, options and checkpoints: framework/precision/quantized.py.
"""
from framework.precision.quantized import QuantizedPrecision


class BnbFP4Precision(QuantizedPrecision):
    """Linear layers frozen as 4-bit floats (fp4), a float32 scale per 64 weights."""

    name = "bnb_fp4"
    quantization = "fp4"
    double_quant = False
    bits_per_weight = 4.5
