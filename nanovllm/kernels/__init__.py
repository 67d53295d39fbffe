"""Attention / KV-cache kernels: plain-torch reference and Triton implementations."""
