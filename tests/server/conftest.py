"""A real server for each test module: uvicorn on a background thread, on a free port."""
import socket
import threading
import time

import pytest

MODEL = "tied_mha_d16"
NAME = "toy"
ENGINE_KW = dict(device="cpu", dtype="float32", kvcache_block_size=16, max_model_len=256)


class LiveServer:
    """uvicorn serving build_app(engine) on 127.0.0.1 from a thread; stop() joins it."""

    def __init__(self, engine, api_key: str | None = None, chat_template: str | None = None):
        import uvicorn

        from nanovllm.server import build_app

        self.engine = engine
        # IPPROTO_TCP named, as in the sockets uvicorn makes from a host and port: asyncio
        # sets TCP_NODELAY only on connections of such a socket, and without it every POST
        # after a connection's first waited 40 ms (Nagle against the client's delayed ACK).
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))  # port 0: the OS picks a free one, no race
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        app = build_app(engine, NAME, api_key=api_key, chat_template=chat_template)
        config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        """Ask uvicorn to exit and wait for it."""
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Poll until no request is live and every KV block is free (aborts processed)."""
        deadline = time.monotonic() + timeout
        while True:
            stats = self.engine.stats()
            held = stats["num_blocks"] - stats["num_free_blocks"]
            # Blocks alone are not enough: a request still waiting for admission holds none.
            if held == 0 and stats["idle"] and stats["num_live_requests"] == 0:
                return
            assert time.monotonic() < deadline, (
                f"{held} KV blocks still held, {stats['num_live_requests']} requests live")
            time.sleep(0.02)


# Engine settings several modules share: they share one server too (started once).
SHARED_OVERRIDES = dict(num_kvcache_blocks=128, max_num_seqs=32)


def _server_key(module) -> tuple:
    """What a module's live server is built from: equal keys may share one server."""
    kw = {**ENGINE_KW, **getattr(module, "ENGINE_OVERRIDES", {})}
    return (tuple(sorted(kw.items())), getattr(module, "ENGINE_PROCESS", True),
            getattr(module, "API_KEY", None))


@pytest.fixture(scope="session")
def _servers():
    """Live servers by _server_key, each stopped after the last module that uses it."""
    servers = {}
    yield servers
    for server in servers.values():
        server.stop()
        server.engine.shutdown()


@pytest.fixture(scope="module")
def live_server(toy_models, request, _servers):
    """A server over AsyncLLM(toy model); the module may set ENGINE_OVERRIDES, API_KEY and
    ENGINE_PROCESS (False: the engine on a thread, in reach of monkeypatch). Modules with the
    same settings get the same server, idle (no request live, every block free) at the start
    of each; it stops after the last of them."""
    from nanovllm.async_llm import AsyncLLM

    key = _server_key(request.module)
    if key not in _servers:
        kw = {**ENGINE_KW, **getattr(request.module, "ENGINE_OVERRIDES", {})}
        engine = AsyncLLM(toy_models[MODEL],
                          engine_process=getattr(request.module, "ENGINE_PROCESS", True), **kw)
        _servers[key] = LiveServer(engine, api_key=getattr(request.module, "API_KEY", None))
    server = _servers[key]
    server.wait_idle()
    yield server
    items = request.session.items
    last = max(i for i, item in enumerate(items) if item.module is request.module)
    if not any(_server_key(item.module) == key and "live_server" in item.fixturenames
               for item in items[last + 1:]):
        del _servers[key]
        server.stop()
        server.engine.shutdown()


@pytest.fixture(scope="module")
def offline(toy_models, request):
    """The offline LLM with the module's engine settings: the reference outputs."""
    from nanovllm import LLM

    kw = {**ENGINE_KW, **getattr(request.module, "ENGINE_OVERRIDES", {})}
    llm = LLM(toy_models[MODEL], **kw)
    yield llm
    llm.shutdown()
