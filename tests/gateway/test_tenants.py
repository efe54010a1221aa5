"""API keys to tenants: hashed keys in config (constant-time comparison and revocation are in
test_secrets.py)."""

from __future__ import annotations

import pytest

from tokenplane.gateway.config import TenantConfig, hash_key
from tokenplane.gateway.errors import AuthenticationFailed
from tokenplane.gateway.tenants import Authenticator


def _auth(n: int = 1) -> Authenticator:
    return Authenticator(
        [TenantConfig.model_validate({"name": f"t{i}", "api_keys": [hash_key(f"sk-{i}")]}) for i in range(n)]
    )


def test_a_valid_key_authenticates_every_time_and_a_wrong_one_never() -> None:
    auth = _auth()
    for _ in range(3):
        assert auth.authenticate("Bearer sk-0").name == "t0"
        with pytest.raises(AuthenticationFailed, match="invalid API key"):
            auth.authenticate("Bearer sk-1")
    assert auth.authenticate("bearer sk-0 ").name == "t0"  # the scheme is case-blind


@pytest.mark.parametrize(
    ("header", "tenant"),
    [
        ("Bearer sk-0", "t0"),
        ("Bearer  sk-0\t", "t0"),  # the key is stripped
        ("bearer sk-0", "t0"),
        ("BEARER sk-0", "t0"),
        ("Bearer sk-0 x", None),  # not a key of anyone's
        ("Bearer ", None),
        ("Bearer", None),
        ("Basic sk-0", None),
        ("Bearersk-0", None),
        (" Bearer sk-0", None),
    ],
)
def test_the_bearer_scheme_in_every_spelling(header: str, tenant: str | None) -> None:
    """The usual ``Bearer `` spelling is read without partition and lower(): the same answers."""
    auth = _auth()
    if tenant is None:
        with pytest.raises(AuthenticationFailed):
            auth.authenticate(header)
    else:
        assert auth.authenticate(header).name == tenant
