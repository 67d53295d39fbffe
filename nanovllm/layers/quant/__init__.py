"""Quantized linear methods: a layer's weight storage, loading and matmul (models/quantization.py
chooses one per layer)."""
