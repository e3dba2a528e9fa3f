"""Release notifications: a signed POST of the release document to its callback_url.

Only hosts on the operator's allow-list (PRIVRELEASE_CALLBACK_HOSTS) are
accepted, checked at request time and again before sending, and redirects
are not followed, so the service cannot be turned against internal addresses.
The body is signed with HMAC-SHA256 under the requesting key's callback secret.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from urllib.parse import urlsplit

import requests

from service import apikeys
from service.config import Config
from service.releases import documents
from service.storage.keys import KeyStore
from service.storage.store import Store

log = logging.getLogger("privrelease.notify")

SIGNATURE_HEADER = "X-Privrelease-Signature"
TIMEOUT = 10.0


class DeliveryError(Exception):
    """The receiver did not take the notification (network error or non-2xx)."""


def check_url(url: str, allowed: tuple[str, ...]) -> str | None:
    """None if ``url`` may be called back, else why not (no data in the reason)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "not a valid URL"
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        return "must be an http(s) URL with a host"
    if parts.username or parts.password:
        return "must not carry credentials"
    host = parts.hostname.lower()
    port = port or (443 if parts.scheme == "https" else 80)
    if host not in allowed and f"{host}:{port}" not in allowed:
        return "host is not on the callback allow-list (PRIVRELEASE_CALLBACK_HOSTS)"
    return None


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def _callback(ledger: Store, release_id: str) -> tuple[str | None, str | None]:
    """The release's callback URL (from its request) and the key that asked for it."""
    h = ledger.release(release_id) or {}
    req = json.loads(h["request"]) if "request" in h else {}
    return req.get("callback_url"), h.get("actor")


def wanted(ledger: Store, release_id: str) -> bool:
    return bool(_callback(ledger, release_id)[0])


def deliver(keys: KeyStore, ledger: Store, config: Config, release_id: str) -> bool:
    """Send one notification; DeliveryError to be retried, False if it cannot be sent."""
    url, actor = _callback(ledger, release_id)
    doc = documents.document(ledger, release_id)
    if not url or doc is None:
        return False
    if check_url(url, config.callback_hosts) is not None:
        log.warning("callback host no longer allowed", extra={"release_id": release_id})
        return False
    secret = apikeys.callback_secret(keys, actor or "")
    if secret is None:
        log.warning("callback key revoked", extra={"release_id": release_id})
        return False
    body = json.dumps(doc, sort_keys=True).encode()
    headers = {"Content-Type": "application/json", SIGNATURE_HEADER: sign(secret, body),
               "X-Privrelease-Release": release_id}
    try:
        resp = requests.post(url, data=body, headers=headers, timeout=TIMEOUT,
                             allow_redirects=False)
    except requests.RequestException as err:
        raise DeliveryError(type(err).__name__) from None
    if not 200 <= resp.status_code < 300:
        raise DeliveryError(f"HTTP {resp.status_code}")
    return True
