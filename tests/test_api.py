"""The JSON API: outcomes, CSRF, and bad input of every kind, each a 4xx JSON error that changes nothing.

The property tests send bodies of arbitrary shape; the pytest-django ``db`` fixture does not
reset between hypothesis examples, so each example compares against a snapshot taken just
before it.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from inventory.models import Order, Product
from shop.views import MAX_BODY_BYTES
from tests.helpers import snapshot

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("private_static_root")]

URL = "/api/products/phone-x/purchase"
OUTCOMES = {201: {"confirmed"}, 409: {"sold_out", "limit_reached", "not_on_sale"}, 503: {"busy"}}


def post_json(client: Client, body, url: str = URL, **extra):
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return client.post(url, data=data, content_type=extra.pop("content_type", "application/json"), **extra)


def assert_refused(response, before, status: int | None = None) -> dict:
    """A 4xx with a JSON message, and stock, fence and orders as they were."""
    assert 400 <= response.status_code < 500, response.content
    if status is not None:
        assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/json"
    payload = response.json()
    assert isinstance(payload["error"], str) and payload["error"]
    assert snapshot() == before
    return payload


class TestProductEndpoint:
    def test_payload_is_fresh_and_complete(self, client, make_product):
        make_product(stock=7, sale_ends_at=timezone.now() + timedelta(minutes=5))
        response = client.get("/api/products/phone-x")
        assert response.status_code == 200
        assert response["Cache-Control"] == "no-store"
        payload = response.json()
        assert (payload["stock"], payload["initial_stock"], payload["state"]) == (7, 7, "live")
        assert payload["starts_in_s"] is None and 299 <= payload["ends_in_s"] <= 300
        assert (payload["per_customer_limit"], payload["max_quantity"]) == (1, 1)

    def test_max_quantity_is_what_one_purchase_may_name(self, client, make_product):
        make_product(stock=1000, limit=500)
        payload = client.get("/api/products/phone-x").json()
        assert (payload["per_customer_limit"], payload["max_quantity"]) == (500, 100)

    def test_unknown_sku_is_404_json(self, client, db):
        response = client.get("/api/products/nope")
        assert response.status_code == 404 and "nope" in response.json()["error"]

    def test_other_methods_are_405_json(self, client, make_product):
        make_product()
        response = client.post("/api/products/phone-x")
        assert response.status_code == 405 and response.json()["allowed"] == ["GET", "HEAD"]
        assert response["Allow"] == "GET, HEAD"

    def test_the_list_is_the_listed_products_as_the_home_page_shows_them(self, client, make_product):
        make_product("phone-x", stock=3)
        make_product("burst", stock=3, listed=False)
        response = client.get("/api/products")
        assert response.status_code == 200 and response["Cache-Control"] == "no-store"
        (card,) = response.json()["products"]
        assert card["sku"] == "phone-x" and card["price"] == "9.99" and card["stock"] == 3
        assert (card["url"], card["api"]) == ("/products/phone-x/", "/api/products/phone-x")
        refused = client.post("/api/products")
        assert refused.status_code == 405 and refused["Allow"] == "GET, HEAD"

    @pytest.mark.parametrize(
        "url", ["/api/products/phone-x", "/api/products", "/api/session", "/", "/products/phone-x/"]
    )
    def test_head_is_answered_where_get_is(self, client, make_product, url):
        """Seen by a helper: HEAD was 405 on every page and GET endpoint of the shop."""
        make_product()
        response = client.head(url)
        assert response.status_code == 200 and response.content == b""


class TestPurchaseOutcomes:
    def test_confirmed(self, client, make_product):
        make_product(stock=3, limit=2)
        response = post_json(client, {"quantity": 2})
        assert response.status_code == 201
        payload = response.json()
        assert payload["outcome"] == "confirmed" and payload["order_id"] == Order.objects.get().pk
        assert Product.objects.get().stock == 1

    def test_missing_quantity_means_one(self, client, make_product):
        make_product(stock=3, limit=2)
        assert post_json(client, {}).status_code == 201
        assert Order.objects.get().quantity == 1

    def test_limit_reached_says_no_more_than_is_true(self, client, make_product):
        """Seen with a limit of 5: a shopper holding 2 who asked for 4 was told "You have already
        bought your share of this product", with 3 more theirs to buy."""
        make_product(stock=10, limit=5)
        assert post_json(client, {"quantity": 2}).status_code == 201
        response = post_json(client, {"quantity": 4})
        assert (response.status_code, response.json()["outcome"]) == (409, "limit_reached")
        assert response.json()["message"] == "That would take you past the most one shopper may buy of this product."
        assert post_json(client, {"quantity": 3}).status_code == 201

    def test_limit_reached_then_sold_out(self, client, make_product):
        make_product(stock=2)
        assert post_json(client, {"quantity": 1}).status_code == 201
        before = snapshot()
        response = post_json(client, {"quantity": 1})
        assert (response.status_code, response.json()["outcome"]) == (409, "limit_reached")
        assert snapshot() == before
        assert post_json(Client(), {"quantity": 1}).status_code == 201
        before = snapshot()
        response = post_json(Client(), {"quantity": 1})
        assert (response.status_code, response.json()["outcome"]) == (409, "sold_out")
        assert snapshot() == before

    @pytest.mark.parametrize(
        "window",
        [
            {"sale_starts_at": timezone.now() + timedelta(hours=1)},
            {"sale_ends_at": timezone.now() - timedelta(seconds=1)},
        ],
    )
    def test_outside_the_sale_window(self, client, make_product, window):
        make_product(stock=5, **window)
        before = snapshot()
        response = post_json(client, {"quantity": 1})
        assert (response.status_code, response.json()["outcome"]) == (409, "not_on_sale")
        assert snapshot() == before

    def test_busy_is_503_with_retry_after(self, client, make_product, use_strategy):
        make_product(stock=5)
        use_strategy("redis", ACQUIRE_TIMEOUT_MS=0)
        from inventory.strategies import get_strategy

        with get_strategy().guard("phone-x"):
            before = snapshot()
            response = post_json(client, {"quantity": 1})
        assert (response.status_code, response.json()["outcome"]) == (503, "busy")
        assert response["Retry-After"] == "1"
        assert snapshot() == before


class TestPurchaseBadInput:
    @pytest.mark.parametrize(
        "quantity", [0, -1, -(10**30), 3, 101, 10**30, 1.5, 1.0, "1", "one", True, False, None, [1], {"n": 1}, 1e309]
    )
    def test_bad_quantity_is_400(self, client, make_product, quantity):
        make_product(stock=5, limit=2)
        before = snapshot()
        assert_refused(post_json(client, {"quantity": quantity}), before, 400)

    # Seen by posting 150 to a product whose per-customer limit is 500: confirmed, though the
    # most any request may name is 100 (MAX_QUANTITY, the most the product page offers), and 501
    # refused with "between 1 and 500" beside "max_quantity": 100.
    @pytest.mark.parametrize("limit, quantity, most", [(500, 150, 100), (500, 501, 100), (2, 3, 2), (1, 2, 1)])
    def test_too_many_is_400_naming_the_most_this_product_allows(self, client, make_product, limit, quantity, most):
        make_product(stock=1000, limit=limit)
        before = snapshot()
        payload = assert_refused(post_json(client, {"quantity": quantity}), before, 400)
        assert payload["max_quantity"] == most
        assert payload["error"] == ("quantity must be 1" if most == 1 else f"quantity must be between 1 and {most}")

    @pytest.mark.parametrize(
        "body",
        [
            b"",
            b"not json",
            b"{",
            b"[1]",
            b'"quantity"',
            b"1",
            b"null",
            b"\xff\xfe",
            b'{"quantity": NaN}',
            b'{"quantity": 1, "price": 0}',
            b'{"quantity": 1' + b"0" * 900 + b"}",
            b"[" * 1000,
            b'{"a":' * 200,
            b'{"quantity": 1e400}',
            ("9" * 1000).encode(),
        ],
    )
    def test_malformed_body_is_400(self, client, make_product, body):
        make_product(stock=5, limit=2)
        before = snapshot()
        response = post_json(client, body)
        # An empty body arrives without a Content-Type, hence 415.
        assert_refused(response, before, 415 if body == b"" else 400)

    def test_oversized_body_is_413(self, client, make_product):
        make_product()
        before = snapshot()
        assert_refused(post_json(client, {"quantity": 1, "pad": "x" * 2000}), before, 413)

    def test_body_over_djangos_upload_limit_is_413(self, client, make_product):
        make_product()
        before = snapshot()
        assert_refused(post_json(client, b"{" + b" " * (3 * 1024 * 1024) + b"}"), before, 413)

    # "-1": seen to go through as an empty body, so a purchase of one unit (gunicorn refuses it
    # before Django; another server, or a proxy in front, may not).
    @pytest.mark.parametrize("length", ["lots", "-1"])
    def test_lying_content_length_is_400(self, client, make_product, length):
        make_product()
        before = snapshot()
        payload = assert_refused(post_json(client, {"quantity": 1}, CONTENT_LENGTH=length), before, 400)
        assert payload["error"] == "invalid Content-Length"

    # Seen under gunicorn: a chunked body (no Content-Length) read as empty, so 201 and 1 unit for
    # {"quantity": 4}; under uvicorn read whole, past the size limit. Real pods: tests/test_length_required.py.
    def test_a_chunked_body_is_411_asking_for_a_content_length(self, client, make_product):
        make_product(stock=5, limit=5)
        before = snapshot()
        response = post_json(client, {"quantity": 4}, HTTP_TRANSFER_ENCODING="chunked")
        assert "Content-Length" in assert_refused(response, before, 411)["error"]

    @pytest.mark.parametrize(
        "content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"]
    )
    def test_wrong_content_type_is_415(self, client, make_product, content_type):
        make_product()
        before = snapshot()
        assert_refused(post_json(client, b'{"quantity": 1}', content_type=content_type), before, 415)

    def test_unknown_sku_is_404(self, client, db):
        response = post_json(client, {"quantity": 1}, url="/api/products/nope/purchase")
        assert response.status_code == 404 and "nope" in response.json()["error"]
        assert Order.objects.count() == 0

    @pytest.mark.parametrize("method", ["get", "put", "patch", "delete", "head", "options"])
    def test_other_methods_are_405(self, client, make_product, method):
        make_product()
        before = snapshot()
        response = getattr(client, method)(URL)
        assert response.status_code == 405
        assert response["Allow"] == "POST"
        if method != "head":
            assert_refused(response, before, 405)


class TestCsrf:
    @pytest.fixture
    def strict(self) -> Client:
        return Client(enforce_csrf_checks=True)

    def test_json_purchase_without_token_is_403_json(self, strict, make_product):
        make_product()
        strict.get("/products/phone-x/")  # has the CSRF cookie, but sends no header
        before = snapshot()
        payload = assert_refused(post_json(strict, {"quantity": 1}), before, 403)
        # Django's reason ends with its own full stop: one sentence, not "missing.. Load".
        assert payload["error"] == (
            "CSRF check failed: CSRF token missing. Load the product page first and send the X-CSRFToken header."
        )

    def test_json_purchase_with_wrong_token_is_403_json(self, strict, make_product):
        make_product()
        strict.get("/products/phone-x/")
        before = snapshot()
        assert_refused(post_json(strict, {"quantity": 1}, HTTP_X_CSRFTOKEN="x" * 32), before, 403)

    def test_json_purchase_without_cookie_is_403_json(self, strict, make_product):
        make_product()
        before = snapshot()
        assert_refused(post_json(strict, {"quantity": 1}, HTTP_X_CSRFTOKEN="x" * 32), before, 403)

    def test_json_purchase_with_the_pages_token_is_accepted(self, strict, make_product):
        make_product()
        token = strict.get("/products/phone-x/").cookies["csrftoken"].value
        assert post_json(strict, {"quantity": 1}, HTTP_X_CSRFTOKEN=token).status_code == 201

    def test_form_without_token_is_a_403_page(self, strict, make_product):
        make_product()
        strict.get("/products/phone-x/")
        before = snapshot()
        response = strict.post("/products/phone-x/buy", {"quantity": "1"})
        assert response.status_code == 403
        assert "Your form expired" in response.content.decode()
        assert snapshot() == before

    def test_form_without_the_cookie_says_to_allow_cookies_and_links_the_product(self, strict, make_product):
        """Seen by a helper: a browser that keeps no cookies read "Your form expired ... (CSRF cookie not
        set.). ... reload the page and try again", which it could do forever; the page linked the home
        page only, not the product it came from."""
        make_product()
        before = snapshot()
        response = strict.post("/products/phone-x/buy", {"quantity": "1"})
        assert response.status_code == 403
        html = response.content.decode()
        assert "Cookies needed" in html and "allow cookies for this site" in html and "expired" not in html
        assert '<a href="/products/phone-x/">Back to Phone X</a>' in html
        assert snapshot() == before

    def test_form_with_a_stale_token_names_the_reason_once(self, strict, make_product):
        make_product()
        strict.get("/products/phone-x/")
        html = strict.post("/products/phone-x/buy", {"quantity": "1"}).content.decode()
        assert "The security check failed (CSRF token missing). Nothing was bought." in html
        assert '<a href="/products/phone-x/">Back to Phone X</a>' in html

    def test_form_with_wrong_token_is_a_403_page(self, strict, make_product):
        make_product()
        strict.get("/products/phone-x/")
        before = snapshot()
        response = strict.post("/products/phone-x/buy", {"quantity": "1", "csrfmiddlewaretoken": "y" * 64})
        assert response.status_code == 403
        assert snapshot() == before

    def test_form_with_the_pages_token_buys(self, strict, make_product):
        make_product()
        html = strict.get("/products/phone-x/").content.decode()
        token = html.split('name="csrfmiddlewaretoken" value="', 1)[1].split('"', 1)[0]
        assert strict.post("/products/phone-x/buy", {"quantity": "1", "csrfmiddlewaretoken": token}).status_code == 201

    def test_admin_action_without_token_is_refused(self, strict, make_product, admin_user):
        make_product()
        strict.force_login(admin_user)
        response = strict.post("/admin/inventory/product/", {"action": "restock_selected", "_selected_action": ["1"]})
        assert response.status_code == 403


# Property tests. ---------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=12,
)
quantities = st.one_of(
    st.integers(min_value=-3, max_value=8),
    st.integers(),
    json_values,
)
bodies = st.one_of(
    st.fixed_dictionaries({"quantity": quantities}),
    st.fixed_dictionaries({"quantity": quantities}, optional={"extra": json_values}),
    json_values,
)
raw_bodies = st.one_of(
    bodies.map(lambda b: json.dumps(b).encode()),
    st.binary(max_size=64),
    st.text(max_size=64).map(str.encode),
)
content_types = st.sampled_from(
    ["application/json", "application/json; charset=utf-8", "text/plain", "application/x-www-form-urlencoded"]
)

PROPERTY_SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture
def roomy_product(make_product):
    """Enough stock that confirmations never run out during the examples; a limit of 5."""
    return make_product(stock=1_000_000, limit=5)


@pytest.fixture
def new_shopper():
    """One client for all examples (its middleware loads once); each call forgets the session."""
    client = Client()

    def fresh() -> Client:
        client.cookies.clear()
        return client

    return fresh


def assert_valid_outcome_or_refusal(response, before, sent_quantity) -> None:
    if response.status_code in OUTCOMES:
        payload = response.json()
        assert payload["outcome"] in OUTCOMES[response.status_code]
        stock, fence, orders = snapshot()
        if response.status_code == 201:
            assert isinstance(sent_quantity, int) and not isinstance(sent_quantity, bool)
            assert (stock, orders) == (before[0] - sent_quantity, before[2] + 1)
        else:
            assert (stock, fence, orders) == before
    else:
        assert_refused(response, before)


@pytest.mark.slow
@PROPERTY_SETTINGS
@given(body=bodies)
def test_property_json_bodies_of_any_shape(roomy_product, new_shopper, body):
    before = snapshot()
    response = post_json(new_shopper(), body)
    sent = body.get("quantity", 1) if isinstance(body, dict) else None
    assert_valid_outcome_or_refusal(response, before, sent)


@PROPERTY_SETTINGS
@given(raw=raw_bodies, content_type=content_types)
@example(raw=b'{"quantity": "' + b"x" * MAX_BODY_BYTES + b'"}', content_type="text/plain")
def test_property_raw_bodies_and_content_types(roomy_product, new_shopper, raw, content_type):
    before = snapshot()
    response = post_json(new_shopper(), raw, content_type=content_type)
    try:
        parsed = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        parsed = None
    sent = parsed.get("quantity", 1) if isinstance(parsed, dict) else None
    assert_valid_outcome_or_refusal(response, before, sent)
    # The size is checked before the content type: an oversized body is not read at all.
    if len(raw) > MAX_BODY_BYTES:
        assert response.status_code == 413
    elif content_type.split(";")[0] != "application/json":
        assert response.status_code == 415


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(quantity=st.text(max_size=30))
# Seen in a fresh clone's make test: "1\x1f" was sold as 1 (str.strip() takes the separators
# \x1c-\x1f for whitespace; int() does not, nor should a quantity carry them).
@example(quantity="1\x1f")
@example(quantity="\x1c2")
@example(quantity="1\xa0")
@example(quantity=" 2\t")
def test_property_form_quantity_text(roomy_product, new_shopper, quantity):
    before = snapshot()
    response = new_shopper().post("/products/phone-x/buy", {"quantity": quantity})
    if response.status_code == 201:
        assert snapshot()[0] == before[0] - int(quantity)
    else:
        assert response.status_code == 400, (quantity, response.status_code)
        assert "Check your order" in response.content.decode()
        assert snapshot() == before
