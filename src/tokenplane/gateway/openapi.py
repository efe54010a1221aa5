"""The gateway's own OpenAPI document (``GET /openapi.json``): what its routes really accept.

Written by hand against :mod:`~tokenplane.gateway.request` (the parameters the gateway checks, and
their ranges), :mod:`~tokenplane.gateway.admin` and :mod:`~tokenplane.gateway.workflows`; the
schemathesis run (``bench/schemathesis_run.py``, and a bounded one in the tests) drives the live
gateway from it and checks that no input yields a 5xx and that every 4xx is an OpenAI error. Request
bodies allow properties beyond those listed: the gateway passes them to the instance as they came.
"""

from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web

from tokenplane.gateway.request import MAX_N

OPENAPI_PATH = "/openapi.json"

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}


def _error(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


_SAMPLING: dict[str, Any] = {
    "stream": _nullable({"type": "boolean"}),
    "stream_options": _nullable(
        {"type": "object", "properties": {"include_usage": _nullable({"type": "boolean"})}}
    ),
    "temperature": _nullable({"type": "number", "minimum": 0, "maximum": 2}),
    "top_p": _nullable({"type": "number", "minimum": 0, "maximum": 1}),
    "presence_penalty": _nullable({"type": "number", "minimum": -2, "maximum": 2}),
    "frequency_penalty": _nullable({"type": "number", "minimum": -2, "maximum": 2}),
    "n": _nullable({"type": "integer", "minimum": 1, "maximum": MAX_N}),
    "seed": _nullable({"type": "integer", "minimum": -(2**63), "maximum": 2**64 - 1}),
    "stop": _nullable({"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}),
    "user": _nullable({"type": "string"}),
    "max_tokens": _nullable({"type": "integer", "minimum": 1}),
    "max_completion_tokens": _nullable({"type": "integer", "minimum": 1}),
}

_MODEL = {"type": "string", "minLength": 1, "description": "A configured model name or alias."}

_MESSAGE = {
    "type": "object",
    "required": ["role"],
    "properties": {
        "role": {"type": "string"},
        "content": {
            "anyOf": [
                {"type": "string"},
                {"type": "null"},
                {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["type"],
                        "properties": {"type": {"type": "string"}},
                    },
                },
            ]
        },
    },
}

_PROMPT = {
    "anyOf": [
        {"type": "string"},
        {"type": "array", "minItems": 1, "items": {"type": "string"}},
        {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}},
        {
            "type": "array",
            "minItems": 1,
            "items": {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}},
        },
    ]
}


def _header(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "header", "required": False, "schema": schema}


_HINTS = [
    _header("X-Tokenplane-Workflow-Id", {"type": "string"}),
    _header("X-Tokenplane-Step", {"type": "integer", "minimum": 1}),
    _header("X-Tokenplane-Total-Steps", {"type": "integer", "minimum": 1}),
    _header("X-Tokenplane-Deadline-S", {"type": "number", "exclusiveMinimum": 0}),
]

_REFUSALS = {
    "400": _error("The body is not a valid request (the error names the parameter)."),
    "401": _error("A missing or unknown API key."),
    "404": _error("No such model, or not one this tenant may use."),
    "413": _error("The body is over the gateway's limit."),
    "429": _error("The tenant's limits, or its share of the pool, are full (Retry-After)."),
    "503": _error("No instance can take the request now (Retry-After)."),
    "502": _error("The instance failed (a 5xx answer, a broken connection)."),
    "504": _error("The instance did not answer in time."),
}


def _completion_route(summary: str, schema_ref: str) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "parameters": _HINTS,
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema_ref}"}}},
            },
            "responses": {
                "200": {
                    "description": "The instance's answer: JSON, or an event stream when stream is true.",
                    "content": {"application/json": {"schema": {"type": "object"}}, "text/event-stream": {}},
                },
                **_REFUSALS,
            },
        }
    }


def _get(
    summary: str, schema: dict[str, Any], *, auth: bool, content: str = "application/json"
) -> dict[str, Any]:
    op: dict[str, Any] = {
        "summary": summary,
        "responses": {"200": {"description": "OK", "content": {content: {"schema": schema}}}},
    }
    if auth:
        op["responses"]["401"] = _error("A missing or unknown API key.")
    else:
        op["security"] = []
    return {"get": op}


def _draining(op: dict[str, Any]) -> dict[str, Any]:
    """A readiness route answers 503 ``{"status": "draining"}`` once SIGTERM has started the drain."""
    op["get"]["responses"]["503"] = {
        "description": "Draining (SIGTERM): send new requests elsewhere.",
        "content": {"application/json": {"schema": {"type": "object", "required": ["status"]}}},
    }
    return op


def document() -> dict[str, Any]:
    """The OpenAPI 3.1 document."""
    list_schema = {
        "type": "object",
        "required": ["object", "data"],
        "properties": {"data": {"type": "array"}},
    }
    workflow_id = {
        "name": "workflow_id",
        "in": "path",
        "required": True,
        "schema": {"type": "string", "minLength": 1},
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "tokenplane gateway",
            "version": "1",
            "description": "An OpenAI-compatible gateway in front of an inference fleet. Errors are "
            '{"error": {"message", "type", "param", "code"}}.',
        },
        "security": [{"bearer": []}],
        "paths": {
            "/v1/chat/completions": _completion_route("A chat completion.", "ChatCompletionRequest"),
            "/v1/completions": _completion_route("A text completion.", "CompletionRequest"),
            "/v1/embeddings": {
                "post": {
                    "summary": "Passed to the model's instances as it came (any other POST /v1/... too).",
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {"schema": {"$ref": "#/components/schemas/ModelRequest"}}
                        },
                    },
                    "responses": {"200": {"description": "The instance's answer."}, **_REFUSALS},
                }
            },
            "/v1/models": _get("The models this tenant may use.", list_schema, auth=True),
            "/v1/instances": _get("The fleet's instances and their state.", list_schema, auth=False),
            "/health": _draining(
                _get(
                    "The gateway's health (readiness).",
                    {"type": "object", "required": ["status"]},
                    auth=False,
                )
            ),
            "/health/ready": _draining(
                _get(
                    "Ready for requests: 503 while draining.",
                    {"type": "object", "required": ["status"]},
                    auth=False,
                )
            ),
            "/health/live": _get(
                "Alive (200 while draining too).", {"type": "object", "required": ["status"]}, auth=False
            ),
            "/metrics": _get("Prometheus metrics.", {"type": "string"}, auth=False, content="text/plain"),
            "/v1/workflows/{workflow_id}": {
                "get": {
                    "summary": "A workflow's spend and outcome, from the ledger.",
                    "parameters": [workflow_id],
                    "responses": {
                        "200": {
                            "description": "The workflow.",
                            "content": {"application/json": {"schema": {"type": "object"}}},
                        },
                        "401": _error("A missing or unknown API key."),
                        "404": _error("No such workflow for this tenant."),
                    },
                }
            },
            "/v1/workflows/{workflow_id}/outcome": {
                "post": {
                    "summary": "Record a workflow's outcome.",
                    "parameters": [workflow_id],
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Outcome"}}},
                    },
                    "responses": {
                        "200": {
                            "description": "The workflow.",
                            "content": {"application/json": {"schema": {"type": "object"}}},
                        },
                        "400": _error("Not a valid outcome."),
                        "401": _error("A missing or unknown API key."),
                        "404": _error("No such workflow for this tenant."),
                        "409": _error("The workflow already has another outcome."),
                        "413": _error("The body is over the gateway's limit."),
                    },
                }
            },
            OPENAPI_PATH: _get("This document.", {"type": "object"}, auth=False),
            "/v1/keys/revoke": {
                "post": {
                    "summary": "Revoke one of this tenant's API keys (in memory, until restart).",
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Revoke"}}},
                    },
                    "responses": {
                        "200": {
                            "description": "Revoked.",
                            "content": {"application/json": {"schema": {"type": "object"}}},
                        },
                        "400": _error("Not a key hash."),
                        "401": _error("A missing or unknown API key."),
                        "404": _error("No such key for this tenant."),
                        "413": _error("The body is over the route's limit."),
                    },
                }
            },
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": _ERROR,
                "ModelRequest": {"type": "object", "required": ["model"], "properties": {"model": _MODEL}},
                "ChatCompletionRequest": {
                    "type": "object",
                    "required": ["model", "messages"],
                    "properties": {
                        "model": _MODEL,
                        "messages": {"type": "array", "minItems": 1, "items": _MESSAGE},
                        **_SAMPLING,
                    },
                },
                "CompletionRequest": {
                    "type": "object",
                    "required": ["model", "prompt"],
                    "properties": {"model": _MODEL, "prompt": _PROMPT, **_SAMPLING},
                },
                "Revoke": {
                    "type": "object",
                    "required": ["key_hash"],
                    "properties": {"key_hash": {"type": "string", "pattern": "^sha256:[0-9a-f]{64}$"}},
                },
                "Outcome": {
                    "type": "object",
                    "required": ["outcome"],
                    "additionalProperties": False,
                    "properties": {
                        "outcome": {"type": "string", "enum": ["succeeded", "failed", "abandoned"]}
                    },
                },
            },
        },
    }


_BODY = msgspec.json.encode(document())


async def serve(request: web.Request) -> web.Response:
    """``GET /openapi.json``: the document (public: it holds no configuration)."""
    return web.Response(body=_BODY, content_type="application/json")


__all__ = ["OPENAPI_PATH", "document", "serve"]
