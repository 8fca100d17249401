"""`precision=32`: float32 weights and compute."""
from framework.precision.base import Precision


class FP32Precision(Precision):
    """float32 everywhere; the reference every other precision is compared against."""

    name = "32"
