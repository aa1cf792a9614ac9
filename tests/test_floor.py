"""The floor endpoint: the purchase request path (CSRF, session, JSON checks) without storage."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from tests.helpers import snapshot

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("private_static_root")]

URL = "/api/products/phone-x/floor"


@pytest.fixture
def strict() -> Client:
    return Client(enforce_csrf_checks=True)


def post(client: Client, body, **extra):
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return client.post(URL, data=data, content_type=extra.pop("content_type", "application/json"), **extra)


def test_answers_200_without_a_query_and_changes_nothing(strict, make_product, django_assert_num_queries):
    make_product()
    token = strict.get("/products/phone-x/").cookies["csrftoken"].value
    before = snapshot()
    with django_assert_num_queries(0):
        response = post(strict, {"quantity": 1}, HTTP_X_CSRFTOKEN=token)
    assert response.status_code == 200
    assert response.json()["outcome"] == "floor"
    assert response["Server-Timing"].startswith("total;dur=")
    assert snapshot() == before


def test_without_csrf_token_is_403_like_a_purchase(strict, make_product):
    make_product()
    strict.get("/products/phone-x/")
    before = snapshot()
    response = post(strict, {"quantity": 1})
    assert response.status_code == 403 and "CSRF" in response.json()["error"]
    assert snapshot() == before


@pytest.mark.parametrize(
    "body, content_type, status",
    [
        (b"{not json", "application/json", 400),
        ([1], "application/json", 400),
        ({"quantity": 0}, "application/json", 400),
        ({"quantity": 1, "coupon": "x"}, "application/json", 400),
        ("quantity=1", "application/x-www-form-urlencoded", 415),
        ("x" * 2000, "application/json", 413),
    ],
)
def test_bad_input_is_the_purchase_endpoints_4xx(client, make_product, body, content_type, status):
    make_product()
    before = snapshot()
    response = post(client, body, content_type=content_type)
    assert response.status_code == status
    assert response.json()["error"]
    assert snapshot() == before


def test_a_chunked_body_is_411_as_a_purchase_is(client, make_product):
    """Seen under gunicorn: a chunked {"quantity": 4} answered 200 for a quantity of 1 (its body unread)."""
    make_product()
    response = post(client, {"quantity": 4}, HTTP_TRANSFER_ENCODING="chunked")
    assert response.status_code == 411 and "Content-Length" in response.json()["error"]


def test_a_bad_quantity_says_the_most_a_request_may_name_as_a_purchase_does(client, make_product):
    """Seen by a helper: the floor's 400 for a bad quantity had no max_quantity, the purchase's has."""
    make_product()
    assert post(client, {"quantity": 0}).json() == {"error": "quantity must be between 1 and 100", "max_quantity": 100}


def test_other_methods_are_405(client, db):
    response = client.get(URL)
    assert response.status_code == 405 and response["Allow"] == "POST"


def test_a_session_gives_an_api_client_its_cookies_without_a_query(strict, django_assert_num_queries):
    with django_assert_num_queries(0):
        response = strict.get("/api/session")
    assert response.status_code == 200 and response["Cache-Control"] == "no-store"
    assert {"csrftoken", "sessionid"} <= set(response.cookies)
    token = response.cookies["csrftoken"].value
    assert post(strict, {"quantity": 1}, HTTP_X_CSRFTOKEN=token).status_code == 200  # the cookies buy


def test_a_session_is_only_a_get():
    response = Client().post("/api/session")
    assert response.status_code == 405 and response.json()["error"] == "use GET"
