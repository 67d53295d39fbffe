"""schemathesis against the server's own /openapi.json: requests generated from the schema
(valid ones and, by schemathesis' negative mode, invalid ones) never get a 5xx. Bounded and
reproducible: a fixed number of examples per operation, derandomized."""
import pytest
from hypothesis import HealthCheck, settings

schemathesis = pytest.importorskip("schemathesis")
from schemathesis.checks import not_a_server_error  # noqa: E402

from tests.server.conftest import NAME  # noqa: E402

# Short generations: a generated valid request runs on the CPU engine.
ENGINE_OVERRIDES = dict(max_model_len=48, num_kvcache_blocks=64, max_num_seqs=16)


@pytest.fixture(scope="module")
def api_schema(live_server):
    config = schemathesis.Config.from_dict({
        "seed": 26,
        # Schema-driven fuzzing only (the coverage phase adds hundreds of boundary cases
        # per operation, which test_fuzz.py and test_hardening.py cover by hand).
        "phases": {"coverage": {"enabled": False}, "stateful": {"enabled": False}},
        "generation": {"mode": "all", "max-examples": 25, "deterministic": True,
                       "database": "none"},
    })
    return schemathesis.openapi.from_url(f"{live_server.url}/openapi.json", config=config)


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=25, derandomize=True, deadline=None,
          suppress_health_check=list(HealthCheck))
def test_no_server_errors(case, live_server):
    if isinstance(case.body, dict) and "model" in case.body:
        case.body["model"] = NAME  # past the 404, into validation and the engine
    case.call_and_validate(checks=[not_a_server_error], timeout=30)


def test_engine_is_idle_afterwards(live_server):
    live_server.wait_idle()
    assert live_server.engine.is_running
