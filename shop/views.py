"""Storefront pages and the JSON purchase API. Views parse and map; services decide."""

from __future__ import annotations

import asyncio
import json
import secrets
import string
import threading

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.middleware.csrf import REASON_NO_CSRF_COOKIE
from django.shortcuts import get_object_or_404, render
from django.urls import Resolver404, resolve, reverse
from django.utils import timezone
from django.views.decorators.csrf import ensure_csrf_cookie
from django.views.decorators.http import require_safe

from inventory.errors import InvalidQuantity, InventoryError, KeyReused, ProductNotFound
from inventory.models import Allocation, Order, Product
from inventory.results import PurchaseResult
from inventory.services import IDEMPOTENCY_KEY, most_per_request, purchase, sale_state
from inventory.strategies.contract import Outcome

#: A purchase body is tiny; anything larger is refused before it is parsed.
MAX_BODY_BYTES = 1024
#: What the buy form may be posted as: what a browser sends for it (the page's form is urlencoded).
FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")

#: What shoppers read for each sale state, and on the buy button in that state.
STATE_LABELS = {"upcoming": "Starts soon", "live": "Live now", "sold_out": "Sold out", "ended": "Sale ended"}
BUTTON_LABELS = {"upcoming": "Not on sale yet", "live": "Buy now", "sold_out": "Sold out", "ended": "Sale ended"}
HEADINGS = {
    Outcome.CONFIRMED: "Order confirmed",
    Outcome.SOLD_OUT: "Sold out",
    Outcome.LIMIT_REACHED: "Limit reached",
    Outcome.NOT_ON_SALE: "Not on sale",
    Outcome.BUSY: "Busy — try again",
}

STATUS_BY_OUTCOME = {
    Outcome.CONFIRMED: 201,
    Outcome.SOLD_OUT: 409,
    Outcome.LIMIT_REACHED: 409,
    Outcome.NOT_ON_SALE: 409,
    Outcome.BUSY: 503,
}
MESSAGES = {
    Outcome.CONFIRMED: "Your order is confirmed.",
    Outcome.SOLD_OUT: "Sold out: no units are left.",
    Outcome.LIMIT_REACHED: "That would take you past the most one shopper may buy of this product.",
    Outcome.NOT_ON_SALE: "This product is not on sale right now.",
    Outcome.BUSY: "The shop is busy: please try again in a moment.",
}
RETRY_AFTER_SECONDS = "1"


def outcome_message(result: PurchaseResult, quantity: int) -> str:
    if result.outcome is Outcome.SOLD_OUT and result.units_left:
        left = "1 unit is" if result.units_left == 1 else f"{result.units_left} units are"
        # No "ask for N or fewer": the shelf's read does not know how many of N this shopper may buy.
        return f"Only {left} left: not enough for {quantity}."
    return MESSAGES[result.outcome]


def outcome_heading(result: PurchaseResult, *, may_buy: int | None = None) -> str:
    """The result page's heading: a refusal for want of units while some are left is not "Sold out",
    nor one past the limit while the shopper may still buy some "Limit reached"."""
    if result.outcome is Outcome.SOLD_OUT and result.units_left:
        return "Not enough left"
    if result.outcome is Outcome.LIMIT_REACHED and may_buy:
        return "Over your limit"
    return HEADINGS[result.outcome]


def units_held(product: Product, customer: str) -> int:
    """The units ``customer`` holds of ``product`` across their orders (their allocation)."""
    return Allocation.objects.filter(product=product, customer=customer).values_list("units", flat=True).first() or 0


def server_timing(result: PurchaseResult) -> str:
    """The ``Server-Timing`` header: where the server spent this purchase (browsers show it).

    queue, lock, hold and outside follow one another and add up to total; commit and rtt (the SQL
    messages' round trips, the commit's among them when it rode the write) lie inside the hold; sql
    and batch are counts, not durations. A part that did not happen is left out.
    """
    t = result.timings
    # The hold: the lock's grant to release, or (no lock taken) the section's transaction, BEGIN to COMMIT.
    held = "lock held" if t.lock_wait_ms is not None else "section transaction"
    parts = [
        ("queue", t.queue_wait_ms, "queued for a batch"),
        ("lock", t.lock_wait_ms, "lock wait"),
        ("hold", t.lock_hold_ms, held),
        ("commit", t.commit_ms, "COMMIT (inside the hold)"),
        ("rtt", t.sql_ms, "SQL round trips (inside the hold)"),
        ("sql", t.sql_statements, "SQL statements in the section"),
        ("batch", t.batch, "purchases in its section"),  # the BATCH option: how many the section served
        ("outside", t.outside_ms, "outside the section"),
    ]
    said = "".join(f'{name};dur={_dur(value)};desc="{desc}", ' for name, value, desc in parts if value is not None)
    return f"{said}db;dur={t.db_ms:.2f}, total;dur={t.total_ms:.2f}"


def _dur(value: float) -> str:
    """A count as a whole number, a duration in ms to 0.01."""
    return str(value) if isinstance(value, int) else f"{value:.2f}"


def purchase_response(response: HttpResponse, result: PurchaseResult) -> HttpResponse:
    """What every purchase answer carries: Retry-After when busy, Server-Timing always."""
    if result.outcome is Outcome.BUSY:
        response["Retry-After"] = RETRY_AFTER_SECONDS
    response["Server-Timing"] = server_timing(result)
    return served_here(response)


def served_here(response: HttpResponse) -> HttpResponse:
    """With ``SHOP_SERVED_ON_HEADER``, say where the view answering runs (``X-Served-On``)."""
    if settings.SHOP_SERVED_ON_HEADER:
        response["X-Served-On"] = served_on()
    return response


def served_on() -> str:
    """Where the view answering runs: ``event loop in <thread>`` (ASGI, an ``async def`` view awaited
    on the worker's loop) or ``thread <thread>`` (WSGI, or a sync view that Django put on a thread)."""
    thread = threading.current_thread().name
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return f"thread {thread}"
    return f"event loop in {thread}"


def shopper_id(request: HttpRequest) -> str:
    """The shopper's identity: a random id kept in their session."""
    shopper = request.session.get("shopper")
    if not shopper:
        shopper = secrets.token_hex(16)
        request.session["shopper"] = shopper
    return shopper


def declared_length(request: HttpRequest) -> int | None:
    """The body size the client declared (0 when absent), or None when the header is not a size.

    Absent, with no ``Transfer-Encoding`` either (:func:`sent_unsized`), HTTP's framing gives the
    request an empty body on both servers."""
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return None
    return length if length >= 0 else None


def sent_unsized(request: HttpRequest) -> bool:
    """Whether the body came framed by a ``Transfer-Encoding`` (chunked) rather than a Content-Length.

    The two servers read such a body differently: Django's WSGI request reads no more than its
    CONTENT_LENGTH, so none of it (a purchase of 1 whatever it named), its ASGI request all of it,
    however large (the size checks read only Content-Length). So it is refused unread: 411 Length
    Required, which RFC 9110 (15.5.12) answers a request without a defined Content-Length with.
    """
    return "HTTP_TRANSFER_ENCODING" in request.META


def json_error(status: int, message: str, **extra) -> JsonResponse:
    return JsonResponse({"error": message, **extra}, status=status)


class Refused(Exception):
    """A request turned away before it reached the services; ``response`` is the 4xx answer to send."""

    def __init__(self, response: HttpResponse) -> None:
        super().__init__(response.status_code)
        self.response = response


def purchase_quantity(request: HttpRequest) -> object:
    """The ``quantity`` a purchase request's JSON body names (1 when absent), not yet validated.

    Raises :class:`Refused` with the 4xx answer when the request is not a POST of a small JSON
    object whose only field is ``quantity``. The purchase endpoint and the floor both ask it.
    """
    if request.method != "POST":
        response = json_error(405, "use POST", allowed=["POST"])
        response["Allow"] = "POST"
        raise Refused(response)
    if sent_unsized(request):
        raise Refused(json_error(411, "send the body with a Content-Length header, not Transfer-Encoding: chunked"))
    length = declared_length(request)
    if length is None:
        raise Refused(json_error(400, "invalid Content-Length"))
    if length > MAX_BODY_BYTES:
        raise Refused(json_error(413, f"body larger than {MAX_BODY_BYTES} bytes"))
    if request.content_type != "application/json":
        raise Refused(json_error(415, 'send a JSON body with Content-Type: application/json, e.g. {"quantity": 1}'))
    try:
        body = json.loads(request.body or b"{}")
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise Refused(json_error(400, "body is not valid JSON")) from None
    if not isinstance(body, dict):
        raise Refused(json_error(400, 'body must be a JSON object, e.g. {"quantity": 1}'))
    unknown = set(body) - {"quantity"}
    if unknown:
        raise Refused(json_error(400, f"unknown field(s): {', '.join(sorted(map(str, unknown)))}"))
    return body.get("quantity", 1)


def seconds_until(moment, now) -> int | None:
    """Whole seconds from ``now`` to ``moment`` (None when there is no moment), so that
    countdowns in the browser do not depend on the shopper's clock."""
    return None if moment is None else max(0, int((moment - now).total_seconds() + 0.999))


def product_payload(product: Product) -> dict:
    now = timezone.now()
    return {
        "sku": product.sku,
        "name": product.name,
        "price": str(product.price),
        "stock": product.stock,
        "initial_stock": product.initial_stock,
        "per_customer_limit": product.per_customer_limit,
        "max_quantity": most_per_request(product.per_customer_limit),  # the most one purchase may name
        "state": sale_state(product),
        "sale_starts_at": product.sale_starts_at.isoformat() if product.sale_starts_at else None,
        "sale_ends_at": product.sale_ends_at.isoformat() if product.sale_ends_at else None,
        "starts_in_s": seconds_until(product.sale_starts_at, now),
        "ends_in_s": seconds_until(product.sale_ends_at, now),
    }


def tile(product: Product) -> str:
    """Which of the stylesheet's tile colours (``art-a`` to ``art-d``) a product's picture takes."""
    return "abcd"[product.pk % 4]


def product_context(product: Product) -> dict:
    """What the product templates show: the API payload plus labels."""
    payload = product_payload(product)
    return {
        "product": product,
        "live": payload,
        "state": payload["state"],
        "state_label": STATE_LABELS[payload["state"]],
        "button_label": BUTTON_LABELS[payload["state"]],
        "art": tile(product),
    }


@require_safe
def home(request: HttpRequest) -> HttpResponse:
    listed = Product.objects.filter(listed=True)
    return render(request, "shop/home.html", {"products": [product_context(p) for p in listed]})


def card_payload(product: Product) -> dict:
    """A home page card's product: the API payload, its pages' URLs and its tile colour."""
    return {
        **product_payload(product),
        "url": reverse("product", args=[product.sku]),
        "api": reverse("api-product", args=[product.sku]),
        "art": tile(product),
    }


def api_products(request: HttpRequest) -> JsonResponse:
    """``GET``: the products the home page lists now, in its order. Its cards follow it each second:
    a product listed or created since the page loaded gets a card, one unlisted or deleted loses its own."""
    if refused := only_reads(request):
        return refused
    response = JsonResponse({"products": [card_payload(p) for p in Product.objects.filter(listed=True)]})
    response["Cache-Control"] = "no-store"
    return response


@require_safe
@ensure_csrf_cookie
def product_page(request: HttpRequest, sku: str) -> HttpResponse:
    product = get_object_or_404(Product, sku=sku)
    shopper_id(request)
    context = product_context(product)
    context["quantities"] = range(1, most_per_request(product.per_customer_limit) + 1)
    # The form's order key (an Idempotency-Key): the same form posted twice, a second click while the
    # first order waits, places one order and shows it twice. Each render of the page a new one, so
    # the page is never kept (a page come back to by Back is rendered again: another order).
    context["order_key"] = secrets.token_urlsafe(18)
    response = render(request, "shop/product.html", context)
    response["Cache-Control"] = "no-store"
    return response


def quantity_hint(product: Product) -> str:
    limit = most_per_request(product.per_customer_limit)
    if limit == 1:
        return "You can buy one unit of this product: choose a quantity of 1."
    return f"Choose a quantity from 1 to {limit}: the most one order may name."


def error_page(request: HttpRequest, product: Product | None, status: int, heading: str, message: str) -> HttpResponse:
    return render(
        request,
        "shop/result.html",
        {"product": product, "outcome": "error", "heading": heading, "message": message},
        status=status,
    )


def buy(request: HttpRequest, sku: str) -> HttpResponse:
    """The HTML form's target: works without JavaScript."""
    try:
        product, quantity = buy_form(request, sku)
        key = order_key(request, product)
    except Refused as refused:
        return refused.response
    try:
        result = purchase(sku=sku, customer=shopper_id(request), quantity=quantity, idempotency_key=key)
    except InventoryError as exc:
        return buy_refused(request, product, exc)
    return buy_answer(request, product, result, quantity, key=key)


def order_key(request: HttpRequest, product: Product) -> str:
    """The form's order key ("" from a form without one); raises :class:`Refused` for one that is no key."""
    key = request.POST.get("key", "").strip(string.whitespace)
    if key and not IDEMPOTENCY_KEY.match(key):
        message = "The order form was damaged on its way: reload the product page and try again."
        raise Refused(error_page(request, product, 400, "Check your order", message))
    return key


def buy_form(request: HttpRequest, sku: str) -> tuple[Product, int]:
    """The product and quantity the form posts; raises :class:`Refused` with the error page to send."""
    product = Product.objects.filter(sku=sku).first()
    if request.method != "POST":
        response = error_page(
            request,
            product,
            405,
            "Use the buy button",
            "Orders are placed with the buy button on the product page.",
        )
        response["Allow"] = "POST"
        raise Refused(response)
    if product is None:
        raise Refused(no_such_product(request, sku))
    if sent_unsized(request):
        message = "Send the order with a Content-Length header: a form sent in chunks is not read."
        raise Refused(error_page(request, product, 411, "Check your order", message))
    length = declared_length(request)
    if length is None:
        message = "The request's Content-Length is not a valid size."
        raise Refused(error_page(request, product, 400, "Check your order", message))
    if length > MAX_BODY_BYTES:
        raise Refused(error_page(request, product, 413, "Check your order", "The order form sent too much data."))
    if request.content_type not in FORM_TYPES:
        message = "Send the order with the buy button on the product page (an HTML form)."
        raise Refused(error_page(request, product, 415, "Check your order", message))
    raw = request.POST.get("quantity")
    if raw is None:  # the page always sends one (a select, or a hidden 1); so does the busy page's retry
        message = f"The order named no quantity. {quantity_hint(product)}"
        raise Refused(error_page(request, product, 400, "Check your order", message))
    # ASCII whitespace only: str.strip() also takes the separators \x1c-\x1f and other scripts'
    # spaces for whitespace, and sold "1\x1f" as 1.
    raw = raw.strip(string.whitespace)
    # Decimal digits only: int() also reads "+1", "0_1" and other scripts' digits ("\u0662" is 2).
    if not (raw.isascii() and raw.isdigit()):
        hint = f"The quantity must be a whole number. {quantity_hint(product)}"
        raise Refused(error_page(request, product, 400, "Check your order", hint))
    # Past any limit, and kept from int(), which refuses more than 4,300 digits.
    return product, int(raw) if len(raw) <= 18 else 10**18


def no_such_product(request: HttpRequest, sku: str) -> HttpResponse:
    """The form's 404 page: no product has ``sku`` (never had, or deleted)."""
    return error_page(request, None, 404, "No such product", f"There is no product {sku!r} in this sale.")


def buy_refused(request: HttpRequest, product: Product, exc: InventoryError) -> HttpResponse:
    """The form's page for input the services refused (a quantity outside the shopper's limit), or
    for a product deleted after the form read it (404, as the API answers)."""
    if isinstance(exc, ProductNotFound):
        return no_such_product(request, product.sku)
    if isinstance(exc, KeyReused):  # the same page's form posted again, for another quantity
        message = "This page already placed your order. Reload the product page to place another."
        return error_page(request, product, 409, "Already ordered", message)
    message = quantity_hint(product) if isinstance(exc, InvalidQuantity) else str(exc)
    return error_page(request, product, 400, "Check your order", message)


def buy_answer(
    request: HttpRequest, product: Product, result: PurchaseResult, quantity: int, *, key: str = ""
) -> HttpResponse:
    """The form's result page: the outcome, and the product as it is after the purchase (a refusal's
    product deleted since: the 404 page; a product with an order cannot be deleted)."""
    try:
        product.refresh_from_db()
    except Product.DoesNotExist:
        return no_such_product(request, product.sku)
    held = units_held(product, shopper_id(request)) if result.outcome is Outcome.LIMIT_REACHED else None
    may_buy = None if held is None else max(0, product.per_customer_limit - held)
    context = {
        **product_context(product),
        "outcome": result.outcome.value,
        "heading": outcome_heading(result, may_buy=may_buy),
        "held": held,
        "may_buy": may_buy,
        "message": outcome_message(result, quantity),
        "result": result,
        "quantity": quantity,
        "order_key": key,  # the busy page's retry is the same order
        # What the order cost at the price it was bought at (the product's may have changed since).
        "total": order_total(result),
    }
    return purchase_response(
        render(request, "shop/result.html", context, status=STATUS_BY_OUTCOME[result.outcome]), result
    )


def order_total(result: PurchaseResult):
    """A confirmed purchase's total as its order records it (its units at their ``unit_price``);
    None when there is no order, or a reset has deleted it since."""
    if result.order_id is None:
        return None
    order = Order.objects.filter(pk=result.order_id).values_list("unit_price", "quantity").first()
    return None if order is None else order[0] * order[1]


def only_reads(request: HttpRequest) -> JsonResponse | None:
    """The 405 for a JSON endpoint that only answers reads (GET, and HEAD wherever GET is), else None."""
    if request.method in ("GET", "HEAD"):
        return None
    response = json_error(405, "use GET", allowed=["GET", "HEAD"])
    response["Allow"] = "GET, HEAD"
    return response


def api_product(request: HttpRequest, sku: str) -> JsonResponse:
    if refused := only_reads(request):
        return refused
    product = Product.objects.filter(sku=sku).first()
    if product is None:
        return json_error(404, f"no product with sku {sku!r}")
    response = JsonResponse(product_payload(product))
    response["Cache-Control"] = "no-store"
    return response


@ensure_csrf_cookie
def api_session(request: HttpRequest) -> JsonResponse:
    """``GET``: the shopper's session and CSRF cookies for an API client that loaded no page (the
    burst's shoppers prepare with it: the product page sets the same cookies but renders its HTML)."""
    if refused := only_reads(request):
        return refused
    shopper_id(request)
    response = JsonResponse({"csrf_cookie": settings.CSRF_COOKIE_NAME, "csrf_header": "X-CSRFToken"})
    response["Cache-Control"] = "no-store"
    return response


def api_purchase(request: HttpRequest, sku: str) -> JsonResponse:
    """``POST {"quantity": n}``: 201 confirmed, 409 refused, 503 busy, 4xx bad input."""
    try:
        quantity, key, customer = purchase_request(request)
        result = purchase(sku=sku, customer=customer, quantity=quantity, idempotency_key=key)
    except Refused as refused:
        return refused.response
    except InventoryError as exc:
        return purchase_error(exc)
    return purchase_answer(result, quantity)


def purchase_request(request: HttpRequest) -> tuple[object, str, str]:
    """The purchase's quantity (not yet validated), Idempotency-Key and shopper; raises :class:`Refused`."""
    quantity = purchase_quantity(request)
    # From META, not request.headers, which builds a dict of every header (each name converted)
    # to read one: 9 us a purchase, timed on a request of seven headers. The WSGI and ASGI
    # handlers both put the header in META under this name.
    return quantity, request.META.get("HTTP_IDEMPOTENCY_KEY", ""), shopper_id(request)


def purchase_error(exc: InventoryError) -> JsonResponse:
    """Bad input the services refused: 404 for an unknown product, 422 for an Idempotency-Key sent
    again for another quantity, else 400 with the reason (and, for a quantity, the most this
    request may name of the product)."""
    if isinstance(exc, ProductNotFound):
        return json_error(404, str(exc))
    if isinstance(exc, KeyReused):
        return json_error(422, str(exc))
    if isinstance(exc, InvalidQuantity) and exc.most is not None:
        return json_error(400, str(exc), max_quantity=exc.most)
    return json_error(400, str(exc))


def purchase_answer(result: PurchaseResult, quantity: int) -> JsonResponse:
    payload = {
        "outcome": result.outcome.value,
        "message": outcome_message(result, quantity),
        "backend": result.backend,
        "order_id": result.order_id,
        "units_left": result.units_left,
        "conflicts": result.conflicts,
        "retries": result.retries,
        "constraint_hits": result.constraint_hits,
    }
    return purchase_response(JsonResponse(payload, status=STATUS_BY_OUTCOME[result.outcome]), result)


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """CSRF refusals: JSON for the API, a page for the storefront; always 403."""
    if request.path.startswith("/api/"):
        return json_error(
            403,
            f"CSRF check failed: {reason.rstrip('.')}. Load the product page first and send the X-CSRFToken header.",
        )
    context = {"reason": reason.rstrip("."), "product": refused_product(request)}
    # Django's words for a request that brought no CSRF cookie: the browser keeps none, and a reload will not help.
    context["no_cookie"] = reason == REASON_NO_CSRF_COOKIE
    return render(request, "shop/csrf_failure.html", context, status=403)


def refused_product(request: HttpRequest) -> Product | None:
    """The product whose buy form was refused, for the page's link back to it (None for any other form)."""
    try:
        match = resolve(request.path_info)
    except Resolver404:
        return None
    return Product.objects.filter(sku=match.kwargs["sku"]).first() if match.url_name == "buy" else None


def bad_request(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """Requests Django itself refuses (too many form fields, an oversized form body, a bad host)."""
    if request.path.startswith("/api/"):
        return json_error(400, "bad request")
    return error_page(request, None, 400, "Bad request", "The shop could not read that request.")


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if request.path.startswith("/api/"):
        return json_error(404, "not found")
    return render(request, "shop/404.html", status=404)
