"""Adapters: a few trainable weights beside a frozen model (`adapter=lora`)."""
