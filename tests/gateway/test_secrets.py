"""API keys: compared hashed (no raw key kept), never logged nor traced, and revocable per key."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tokenplane.gateway.app import GATEWAY_KEY
from tokenplane.gateway.config import TenantConfig, TracingConfig, hash_key
from tokenplane.gateway.errors import AuthenticationFailed
from tokenplane.gateway.stages.quotas import MAX_KEY_IDS, KeyIds
from tokenplane.gateway.tenants import MEMO_SIZE, Authenticator, Tenant
from tokenplane.gateway.tracing import Tracing

CHAT = "/v1/chat/completions"
SECOND_KEY = "sk-second-key-of-acme-5b1e"
WRONG_KEY = "sk-wrong-but-secret-looking-9f2c"


def _chat(names: Any, **extra: Any) -> dict[str, Any]:
    return {"model": names.MODEL, "messages": [{"role": "user", "content": "hi"}], **extra}


async def _raw(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    try:
        return await asyncio.wait_for(reader.read(65536), 5)
    finally:
        writer.close()


async def test_keys_never_reach_the_logs_or_the_traces(upstreams, gateway, names, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    gw = await gateway(await upstreams(1))
    exporter = InMemorySpanExporter()
    gw.server.app[GATEWAY_KEY].tracing = Tracing(TracingConfig(service_name="secrets"), exporter=exporter)
    assert (await gw.post(CHAT, _chat(names)))[0] == 200
    assert (await gw.post(CHAT, _chat(names, stream=True)))[0] == 200
    assert (await gw.post(CHAT, _chat(names), key=WRONG_KEY))[0] == 401
    assert (await gw.post(CHAT, None, raw=b"{not json"))[0] == 400
    assert (await gw.post(CHAT, _chat(names, model="no-such-model")))[0] == 404
    assert (await gw.post("/v1/keys/revoke", {"key_hash": hash_key(WRONG_KEY)}))[0] == 404
    # Requests the edge's parser refuses, with the key in their heads: aiohttp's own handler logs
    # the offending bytes; the edge's does not.
    start = f"POST {CHAT} HTTP/1.1\r\nHost: gw\r\n"
    for bad in (
        f"Authorization: Bearer {names.KEY}\r\nContent-Length : 2\r\n\r\n{{}}",
        f"Authorization : Bearer {WRONG_KEY}\r\n\r\n",
        f"Authorization: Bearer {names.KEY}\x00\r\n\r\n",
    ):
        answer = await _raw(gw.server.port, (start + bad).encode("latin-1"))
        assert answer.split(b"\r\n", 1)[0].endswith(b" 400 Bad Request"), answer
        assert names.KEY.encode() not in answer and WRONG_KEY.encode() not in answer
    await asyncio.sleep(0.1)
    spans = exporter.get_finished_spans()
    assert len(spans) >= 5  # the requests were traced...
    refusals = [r for r in caplog.records if r.name == "tokenplane.gateway.edges.guard"]
    assert len(refusals) == 3  # ...and the refusals logged
    traced = "\n".join(span.to_json() for span in spans)
    logged = "\n".join(
        f"{r.getMessage()} {r.exc_text or ''} {r.stack_info or ''} {r.args!r}" for r in caplog.records
    )
    for secret in (names.KEY, WRONG_KEY, hashlib.sha256(names.KEY.encode()).hexdigest()):
        assert secret not in traced
        assert secret not in logged
        assert secret not in caplog.text


async def test_a_tenant_revokes_one_of_its_keys(upstreams, gateway, names) -> None:
    ups = await upstreams(1)
    tenants = names.gateway_config(ups)["tenants"]
    tenants[0]["api_keys"].append(hash_key(SECOND_KEY))
    gw = await gateway(ups, tenants=tenants)
    assert (await gw.post(CHAT, _chat(names), key=SECOND_KEY))[0] == 200
    # another tenant cannot revoke acme's key (and learns nothing about it)
    status, err, _ = await gw.post("/v1/keys/revoke", {"key_hash": hash_key(SECOND_KEY)}, key=names.BATCH_KEY)
    assert status == 404 and err["error"]["code"] == "key_not_found"
    assert (await gw.post(CHAT, _chat(names), key=SECOND_KEY))[0] == 200
    # unauthenticated, or not a key hash
    assert (await gw.post("/v1/keys/revoke", {"key_hash": hash_key(SECOND_KEY)}, key=None))[0] == 401
    status, err, _ = await gw.post("/v1/keys/revoke", {"key_hash": SECOND_KEY})
    assert status == 400 and err["error"]["param"] == "key_hash"
    # acme revokes it with its other key
    status, body, _ = await gw.post("/v1/keys/revoke", {"key_hash": hash_key(SECOND_KEY)})
    assert status == 200 and body == {"revoked": hash_key(SECOND_KEY), "tenant": "acme"}
    status, err, _ = await gw.post(CHAT, _chat(names), key=SECOND_KEY)
    assert status == 401 and err["error"]["code"] == "invalid_api_key"
    assert (await gw.post(CHAT, _chat(names)))[0] == 200  # the other key still works
    assert (await gw.post("/v1/keys/revoke", {"key_hash": hash_key(SECOND_KEY)}))[0] == 404  # once


def _auth(keys: list[str]) -> Authenticator:
    return Authenticator([TenantConfig(name="t", api_keys=tuple(hash_key(k) for k in keys))])


_keys = st.text(st.characters(categories=["L", "N"]), min_size=6, max_size=30).map(lambda s: "sk-" + s)


@settings(max_examples=200, deadline=None)
@given(st.lists(_keys, min_size=1, max_size=4, unique=True), st.one_of(_keys, st.text(max_size=40)))
def test_a_key_authenticates_exactly_when_its_digest_is_configured(keys: list[str], guess: str) -> None:
    auth = _auth(keys)
    configured = guess.strip() in keys
    try:
        auth.authenticate(f"Bearer {guess}")
    except AuthenticationFailed:
        assert not configured or not guess.strip()
    else:
        assert configured
    held = repr((auth._by_digest, auth._memo._entries, [(t.name, t.allowed_models) for t in auth.tenants]))
    assert not any(k in held for k in keys)  # digests only: no raw key is kept


def test_the_key_comparison_hashes_first() -> None:
    """What a lookup compares is a digest: the stored form is all the authenticator holds."""
    auth = _auth(["sk-a"])
    assert list(auth._by_digest) == [hashlib.sha256(b"sk-a").hexdigest()]
    with pytest.raises(AuthenticationFailed):
        auth.authenticate("Bearer sk-")  # a prefix of a key is no nearer than any other guess


def _by_sha256(auth: Authenticator, header: str) -> Tenant | None:
    """The answer from the stored digests alone (the memo's oracle)."""
    key = header.partition(" ")[2].strip() if header.lower().startswith("bearer ") else ""
    return auth._by_digest.get(hashlib.sha256(key.encode("utf-8", "replace")).hexdigest()) if key else None


_headers = st.one_of(_keys.map(lambda k: f"Bearer {k}"), st.text(max_size=40))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(_keys, min_size=1, max_size=4, unique=True),
    st.lists(st.tuples(st.just("auth"), _headers) | st.tuples(st.just("revoke"), _keys), max_size=30),
    st.data(),
)
def test_remembered_headers_answer_as_their_digests_do(
    keys: list[str], steps: list[tuple[str, str]], data: st.DataObject
) -> None:
    """The memo of authenticated headers never changes an answer: a header seen before (the same
    key, revoked since or not) gets what hashing it afresh would give."""
    auth = _auth(keys)
    seen: list[str] = []
    for op, arg in steps:
        if op == "revoke":
            tenant = auth._by_digest.get(hashlib.sha256(arg.encode()).hexdigest())
            assert auth.revoke(auth.tenants[0], hash_key(arg)) == (tenant is not None)
            continue
        header = data.draw(st.sampled_from(seen)) if seen and data.draw(st.booleans()) else arg
        seen.append(header)
        try:
            got: Tenant | None = auth.authenticate(header)
        except AuthenticationFailed:
            got = None
        assert got is _by_sha256(auth, header)
    held = repr(auth._memo._entries)
    assert not any(k in held for k in keys)


def test_the_memo_is_bounded_and_keeps_no_failure() -> None:
    keys = [f"sk-bulk-{i}" for i in range(MEMO_SIZE + 10)]
    auth = _auth(keys)
    for k in keys:
        assert auth.authenticate(f"Bearer {k}").name == "t"
        assert len(auth._memo) <= MEMO_SIZE
    auth._memo.clear()
    for i in range(50):
        with pytest.raises(AuthenticationFailed):
            auth.authenticate(f"Bearer {WRONG_KEY}{i}")
    assert len(auth._memo) == 0


def test_a_revoked_key_is_refused_after_it_was_remembered() -> None:
    auth = _auth(["sk-a", "sk-b"])
    for _ in range(2):
        assert auth.authenticate("Bearer sk-a").name == "t"
    assert auth.revoke(auth.tenants[0], hash_key("sk-a"))
    with pytest.raises(AuthenticationFailed):
        auth.authenticate("Bearer sk-a")
    assert auth.authenticate("Bearer sk-b").name == "t"


def test_a_remembered_tag_needs_both_halves() -> None:
    """A header whose first hash matches a remembered one (as a forged collision would) but whose
    salted hash does not is hashed afresh, and refused."""
    auth = _auth(["sk-a"])
    auth.authenticate("Bearer sk-a")
    ((_tag, (check, tenant)),) = auth._memo._entries.items()
    guess = f"Bearer {WRONG_KEY}"
    auth._memo._entries[hash(guess)] = (check, tenant)  # the first half forged
    with pytest.raises(AuthenticationFailed):
        auth.authenticate(guess)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.text(alphabet="abcdefghijk0123456789-", min_size=8, max_size=40), min_size=1, max_size=30))
def test_per_key_quota_ids_are_stable_digests_and_keep_no_raw_key(keys: list[str]) -> None:
    """The quota stage's per-key id (RPM/TPM per key): the same id for the same header every time
    (and on every replica: a plain SHA-256 of the header), different keys apart, no raw key held."""
    ids = KeyIds()
    headers = [f"Bearer sk-{k}" for k in keys]
    first = [ids(h) for h in headers]
    assert [ids(h) for h in headers] == first  # remembered answers equal fresh ones
    assert first == [hashlib.sha256(h.encode()).hexdigest()[:24] for h in headers]
    assert len(set(first)) == len(set(headers))
    assert len(ids) <= MAX_KEY_IDS
    held = repr(ids._ids._entries)
    assert not any(f"sk-{k}" in held for k in keys)


def test_a_forged_quota_tag_is_recomputed() -> None:
    ids = KeyIds()
    right = ids("Bearer sk-a")
    ((_tag, (check, key_id)),) = ids._ids._entries.items()
    guess = f"Bearer {WRONG_KEY}"
    ids._ids._entries[hash(guess)] = (check, key_id)  # the first half forged
    assert ids(guess) == hashlib.sha256(guess.encode()).hexdigest()[:24] != right
