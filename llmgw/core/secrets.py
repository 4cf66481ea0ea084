"""Secrets: new tokens shown once, their hashes kept, and the engines' keys derived."""

import hashlib
import hmac
import secrets


def new_secret(prefix: str) -> str:
    """A new secret such as `llmgw_adm_…`; its first 14 characters identify it in lists."""
    return f"{prefix}{secrets.token_urlsafe(32)}"


def digest(secret: str) -> str:
    """What is stored instead of a secret: its SHA-256 in hex."""
    return hashlib.sha256(secret.encode()).hexdigest()


def engine_key(secret_key: str, replica_id: str) -> str:
    """The key a replica's engine requires: derived, so it is never stored and survives restarts."""
    mac = hmac.new(secret_key.encode(), f"engine:{replica_id}".encode(), hashlib.sha256)
    return "llmgw-engine-" + mac.hexdigest()[:40]


def keyed_digest(secret_key: str, secret: str) -> str:
    """What is stored of a gateway API key: an HMAC of it under the control plane's secret,
    so a copy of the table alone cannot be used to test guesses."""
    return hmac.new(secret_key.encode(), f"apikey:{secret}".encode(), hashlib.sha256).hexdigest()
