"""`precision=bnb_nf4_dq`: linear layers frozen as nf4 with double quantization (the block
scales themselves in 8 bits: QLoRA's recipe).

Shared behaviour, options and checkpoints: framework/precision/quantized.py.
"""
from framework.precision.quantized import QuantizedPrecision


class BnbNF4DoubleQuantPrecision(QuantizedPrecision):
    """Linear layers frozen as nf4 with double-quantized block scales."""

    name = "bnb_nf4_dq"
    quantization = "nf4"
    double_quant = True
    bits_per_weight = 4.13
