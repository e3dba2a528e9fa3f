"""API keys: create (token shown once), list (never tokens), revoke (``apikeys.revoke``)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from flask_smorest import Blueprint

from service import apikeys, datasets, wiring
from service.api.auth import current_key, may_use, require
from service.api.problems import APIError
from service.api.responses import AUTH, BODY, located, problems
from service.api.schemas import KeyCreateSchema, KeySchema

blp = Blueprint("keys", __name__, url_prefix="/v1/keys", description="API keys")


def _manages(key: apikeys.ApiKey) -> bool:
    """Whether the calling operator key may see and revoke ``key``.

    An operator limited to some datasets manages only keys limited to a subset of
    them: it must not list, nor revoke, unrestricted keys or keys of datasets it
    cannot use (their existence would be answered like a missing key's).
    """
    mine = current_key().datasets
    return mine is None or (key.datasets is not None and set(key.datasets) <= set(mine))


@blp.route("", methods=["POST"])
@require("operator")
@problems(blp, *AUTH, *BODY, 403)
@blp.arguments(KeyCreateSchema())
@blp.response(201, KeySchema())
@located("/v1/keys/{id}")
def create(body: dict[str, Any]) -> dict[str, Any]:
    """A new key with a role, optional dataset grants and expiry; the token is shown once."""
    keys = wiring.current().keys
    grants = body.get("datasets")
    if grants is None and current_key().datasets is not None:
        raise APIError(422, "a key limited to some datasets creates only keys limited to "
                       "them", code="validation_error", field="datasets")
    if grants is not None:
        for i, dataset_id in enumerate(grants):
            # a dataset the creating key may not use is answered as one that does not exist
            if not may_use(dataset_id) or datasets.get(wiring.current().ledger, dataset_id) is None:
                raise APIError(422, "no such dataset", code="validation_error",
                               field=f"datasets.{i}")
    expires = body.get("expires_at")
    if expires is not None and expires <= datetime.now(UTC):
        raise APIError(422, "expiry is in the past", code="validation_error",
                       field="expires_at")
    key, token = apikeys.create(
        keys, body["role"], label=body.get("label", ""),
        datasets=tuple(grants) if grants is not None else None,
        expires_at=apikeys.utc_text(expires) if expires else None,
    )
    return {**key.public(), "token": token,
            "callback_secret": apikeys.callback_secret(keys, key.id)}


@blp.route("")
@require("operator")
@problems(blp, *AUTH, 403)
@blp.response(200, KeySchema(many=True))
def list_keys() -> list[dict[str, Any]]:
    """Every key's public record the caller manages; tokens are never stored, so never
    shown."""
    return [k.public() for k in apikeys.list_all(wiring.current().keys)
            if _manages(k)]


@blp.route("/<key_id>", methods=["DELETE"])
@require("operator")
@problems(blp, *AUTH, 403, 404)
@blp.response(204)
def revoke(key_id: str) -> None:
    """Revoke a key: its token gets 401 from this API process's next request, from every
    other API process within PRIVRELEASE_KEY_CACHE_SECONDS (1 s), its cache of keys."""
    keys = wiring.current().keys
    key = apikeys.get(keys, key_id)
    if key is None or not _manages(key) or not apikeys.revoke(keys, key_id):
        raise APIError(404, "no such key", code="not_found")
