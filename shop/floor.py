"""The floor: the purchase endpoint's request path with no storage behind it.

``POST /api/products/<sku>/floor`` goes through the same middleware (session, CSRF), the same
size, content-type and JSON checks and the same shopper identity as the purchase endpoint, then
answers 200 without a database query, a lock or a Redis call. Its throughput under the burst is
this machine's framework floor: every strategy's ``floor_ratio`` is measured against it in the
same run. It changes nothing, so it needs no guard beyond the purchase endpoint's.
"""

from __future__ import annotations

import json
import time

from django.http import HttpRequest, JsonResponse

from inventory.services import InvalidQuantity, check_quantity

from .views import MAX_BODY_BYTES, declared_length, json_error, shopper_id


def api_floor(request: HttpRequest, sku: str) -> JsonResponse:
    """``POST {"quantity": n}``: 200 ``{"outcome": "floor"}``, or the purchase endpoint's 4xx for bad input."""
    started = time.perf_counter()
    if request.method != "POST":
        response = json_error(405, "use POST", allowed=["POST"])
        response["Allow"] = "POST"
        return response
    length = declared_length(request)
    if length is None:
        return json_error(400, "invalid Content-Length")
    if length > MAX_BODY_BYTES:
        return json_error(413, f"body larger than {MAX_BODY_BYTES} bytes")
    if request.content_type != "application/json":
        return json_error(415, 'send a JSON body with Content-Type: application/json, e.g. {"quantity": 1}')
    try:
        body = json.loads(request.body or b"{}")
    except (ValueError, UnicodeDecodeError, RecursionError):
        return json_error(400, "body is not valid JSON")
    if not isinstance(body, dict):
        return json_error(400, 'body must be a JSON object, e.g. {"quantity": 1}')
    unknown = set(body) - {"quantity"}
    if unknown:
        return json_error(400, f"unknown field(s): {', '.join(sorted(map(str, unknown)))}")
    try:
        quantity = check_quantity(body.get("quantity", 1))
    except InvalidQuantity as exc:
        return json_error(400, str(exc))
    shopper_id(request)  # the session lookup every purchase makes
    payload = {
        "outcome": "floor",
        "message": "Answered without touching storage.",
        "backend": "floor",
        "sku": sku,
        "quantity": quantity,
    }
    response = JsonResponse(payload)
    response["Server-Timing"] = f"total;dur={(time.perf_counter() - started) * 1000:.2f}"
    return response
