"""An OpenAI-compatible HTTP server over AsyncLLM (needs the `serve` extra: fastapi, uvicorn).

`python -m nanovllm.server MODEL [--port 8000] [--api-key KEY] ...` or `run_server(...)`.
"""
from nanovllm.server.app import build_app, run_server

__all__ = ["build_app", "run_server"]
