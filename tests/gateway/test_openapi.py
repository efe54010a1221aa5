"""``GET /openapi.json``: the document describes every route the gateway serves, and schemathesis,
driving the live gateway from it, finds no input that yields a 5xx or a 4xx outside the OpenAI
error shape (a bounded run here; ``bench/schemathesis_run.py --cases 5000`` is the long one)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import schemathesis

BENCH = Path(__file__).resolve().parents[2] / "bench" / "schemathesis_run.py"


async def test_the_document_describes_every_route(upstreams, gateway) -> None:
    gw = await gateway(await upstreams(1))
    doc = await gw.get("/openapi.json", key=None)  # public: no key needed
    assert doc["openapi"].startswith("3.1")
    served = {
        (route.method.lower(), route.resource.canonical)
        for route in gw.server.app.router.routes()
        if route.resource is not None and "{tail" not in route.resource.canonical and route.method != "HEAD"
    }
    described = {(method, path) for path, ops in doc["paths"].items() for method in ops}
    assert served <= described, served - described
    assert ("post", "/v1/embeddings") in described  # a pass-through route, by example
    schema = schemathesis.openapi.from_dict(doc)
    assert all(result.ok() for result in schema.get_all_operations())  # every operation loads
    chat = doc["components"]["schemas"]["ChatCompletionRequest"]
    assert chat["required"] == ["model", "messages"]
    assert chat["properties"]["temperature"]["anyOf"][0] == {"type": "number", "minimum": 0, "maximum": 2}


def _bench() -> Any:
    spec = importlib.util.spec_from_file_location("schemathesis_run", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_schemathesis_finds_no_5xx_and_only_openai_errors() -> None:
    out = _bench().run(200, seed_=1)
    assert out["cases"] >= 200
    assert out["server_errors"] == 0, out["failures"]
    assert out["failures"] == [], out["failures"]
    statuses = out["statuses"]
    assert statuses.get(200, 0) > 0 and statuses.get(400, 0) > 0 and statuses.get(401, 0) > 0, statuses
