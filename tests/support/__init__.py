"""Plain builders shared by tests (checkpoints, prompts, paged-KV cases, the HF oracle).

Functions only: fixtures stay in the conftest.py files, and no test module imports another.
"""
