"""A shopper and a member of staff in a real Chromium against the live server."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import psycopg
import pytest
from django.test import Client
from django.utils import timezone
from playwright.sync_api import expect

from inventory.models import BurstRun, Order, Product
from loadtests.pods import collect_static
from tests.helpers import asgi_pod

from .conftest import SCREENSHOTS

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_shopper_buys_and_sees_the_confirmation(live_server, page, make_product):
    make_product("phone-x", stock=100, name="Phone X", price="499.00")
    make_product("earbuds", stock=250, name="Earbuds", limit=3)
    make_product("watch", stock=50, name="Watch", sale_starts_at=timezone.now() + timedelta(hours=2))
    page.goto(live_server.url)
    expect(page.get_by_role("heading", name="Today's flash sale")).to_be_visible()
    expect(page.locator('[data-live-sku="watch"] [data-role="countdown"]')).to_contain_text("Starts in 0")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "storefront.png"), full_page=True)

    page.get_by_role("link", name="Buy Phone X").click()
    expect(page.get_by_role("heading", name="Phone X")).to_be_visible()
    page.get_by_role("button", name="Buy now").click()

    expect(page.get_by_role("heading", name="Order confirmed")).to_be_visible()
    order = Order.objects.get()
    expect(page.locator("#order-number")).to_have_text(str(order.pk))
    assert order.quantity == 1


def test_second_purchase_is_refused_by_the_limit(live_server, page, make_product):
    make_product("earbuds", stock=10, name="Earbuds", limit=2)
    page.goto(f"{live_server.url}/products/earbuds/")
    page.get_by_label("Quantity").select_option("2")
    page.get_by_role("button", name="Buy now").click()
    expect(page.get_by_role("heading", name="Order confirmed")).to_be_visible()

    page.get_by_role("link", name="Back to Earbuds").click()
    page.get_by_role("button", name="Buy now").click()
    expect(page.get_by_role("heading", name="Limit reached")).to_be_visible()
    assert Order.objects.count() == 1 and Order.objects.get().quantity == 2


def test_sold_out_appears_without_a_reload(live_server, page, make_product):
    make_product("phone-x", stock=1, name="Phone X")
    page.goto(f"{live_server.url}/products/phone-x/")
    button = page.get_by_role("button", name="Buy now")
    expect(button).to_be_enabled()
    page.evaluate("window.loadedOnce = true")

    # Another shopper buys the last unit while this page stays open.
    other = Client()
    assert (
        other.post("/api/products/phone-x/purchase", data={"quantity": 1}, content_type="application/json").status_code
        == 201
    )

    expect(page.get_by_role("button", name="Sold out")).to_be_disabled(timeout=5_000)
    expect(page.locator('[data-role="state"]')).to_have_text("Sold out")
    expect(page.locator('[data-role="stock"]')).to_have_text("0")
    assert page.evaluate("window.loadedOnce") is True  # still the same document: no reload


def test_a_home_card_button_follows_its_product_without_a_reload(live_server, page, make_product):
    """The card's button was rendered once: "Buy now" stayed on a card whose badge read sold out, and
    "View" on an upcoming card gone live."""
    make_product("phone-x", stock=1, name="Phone X")
    make_product("watch", stock=5, name="Watch", sale_starts_at=timezone.now() + timedelta(seconds=3))
    page.goto(live_server.url)
    phone, watch = page.locator('[data-live-sku="phone-x"]'), page.locator('[data-live-sku="watch"]')
    expect(phone.get_by_role("link", name="Buy Phone X")).to_have_text("Buy now")
    expect(watch.get_by_role("link", name="View Watch")).to_have_text("View")
    page.evaluate("window.loadedOnce = true")

    other = Client()
    assert (
        other.post("/api/products/phone-x/purchase", data={"quantity": 1}, content_type="application/json").status_code
        == 201
    )

    expect(phone.locator('[data-role="state"]')).to_have_text("Sold out", timeout=5_000)
    expect(phone.get_by_role("link", name="View Phone X")).to_have_text("View")
    expect(phone.get_by_role("link", name="View Phone X")).to_have_class("button button-quiet")
    expect(watch.locator('[data-role="state"]')).to_have_text("Live now", timeout=10_000)
    expect(watch.get_by_role("link", name="Buy Watch")).to_have_text("Buy now")
    expect(watch.get_by_role("link", name="Buy Watch")).to_have_class("button")
    assert page.evaluate("window.loadedOnce") is True  # still the same document: no reload


def test_a_price_or_limit_changed_by_staff_shows_without_a_reload(live_server, page, make_product):
    """Seen by a helper: the open product page polled its product each second but showed only the
    stock: after staff raised the price from $10.00 to $25.00 it still read $10.00 (the receipt then
    said $25.00), and a limit raised from 1 to 3 still said "Limit 1 per shopper." and offered 1 only."""
    product = make_product("earbuds", stock=10, name="Earbuds", price="10.00", limit=1)
    page.goto(f"{live_server.url}/products/earbuds/")
    expect(page.locator(".price-large")).to_have_text("$10.00")
    expect(page.locator("#limit-note")).to_have_text("Limit 1 per shopper.")
    page.evaluate("window.loadedOnce = true")

    # What the admin's change form saves (ProductAdmin.save_model: only the fields it changed).
    product.price, product.per_customer_limit = Decimal("25.00"), 3
    product.save(update_fields=["price", "per_customer_limit"])

    expect(page.locator(".price-large")).to_have_text("$25.00", timeout=5_000)
    expect(page.locator("#limit-note")).to_have_text("Limit 3 per shopper.")
    page.get_by_label("Quantity").select_option("3")
    page.get_by_role("button", name="Buy now").click()
    expect(page.get_by_role("heading", name="Order confirmed")).to_be_visible()
    expect(page.locator(".receipt")).to_contain_text("3 × Earbuds")
    expect(page.locator(".receipt")).to_contain_text("$75.00")

    # Lowered again, the page offers no more than the new limit, and a home card shows the new price.
    product.refresh_from_db()
    product.price, product.per_customer_limit = Decimal("12.50"), 1
    product.save(update_fields=["price", "per_customer_limit"])
    page.goto(live_server.url)
    page.evaluate("window.loadedOnce = true")
    card = page.locator('[data-live-sku="earbuds"]')
    expect(card.locator(".price")).to_have_text("$12.50")
    product.price = Decimal("11.00")
    product.save(update_fields=["price"])
    expect(card.locator(".price")).to_have_text("$11.00", timeout=5_000)
    assert page.evaluate("window.loadedOnce") is True  # still the same document: no reload


def test_a_name_changed_by_staff_shows_without_a_reload(live_server, page, make_product):
    """Seen by a helper: after staff renamed a product (its sku unchanged) the open product page kept
    the old name in its heading, breadcrumb and window title, and the home card its old title."""
    product = make_product("earbuds", stock=10, name="Earbuds")
    page.goto(f"{live_server.url}/products/earbuds/")
    expect(page.get_by_role("heading", level=1)).to_have_text("Earbuds")
    page.evaluate("window.loadedOnce = true")

    product.name = "<b>Quiet</b> buds"  # shown as text, never as markup
    product.save(update_fields=["name"])

    expect(page.get_by_role("heading", level=1)).to_have_text("<b>Quiet</b> buds", timeout=5_000)
    expect(page.locator("[aria-current=page]")).to_have_text("<b>Quiet</b> buds")
    expect(page).to_have_title("<b>Quiet</b> buds · Flash sale")
    assert page.locator("h1 b").count() == 0
    assert page.evaluate("window.loadedOnce") is True

    page.goto(live_server.url)
    page.evaluate("window.loadedOnce = true")
    product.name = "Quiet buds"
    product.save(update_fields=["name"])
    card = page.locator('[data-live-sku="earbuds"]')
    expect(card.locator(".product-name")).to_have_text("Quiet buds", timeout=5_000)
    expect(card.get_by_role("link", name="Buy Quiet buds")).to_have_text("Buy now")
    assert page.evaluate("window.loadedOnce") is True


def test_a_limit_lowered_by_staff_takes_the_larger_quantities_away(live_server, page, make_product):
    product = make_product("earbuds", stock=10, name="Earbuds", limit=3)
    page.goto(f"{live_server.url}/products/earbuds/")
    expect(page.get_by_label("Quantity").locator("option")).to_have_count(3)
    page.get_by_label("Quantity").select_option("3")
    page.evaluate("window.loadedOnce = true")

    product.per_customer_limit = 1
    product.save(update_fields=["per_customer_limit"])

    expect(page.locator("#limit-note")).to_have_text("Limit 1 per shopper.", timeout=5_000)
    expect(page.locator('select[name="quantity"]')).to_have_count(0)
    page.get_by_role("button", name="Buy now").click()
    expect(page.get_by_role("heading", name="Order confirmed")).to_be_visible()
    assert Order.objects.get().quantity == 1
    assert page.evaluate("window.loadedOnce") is not True  # the result page: a new document


def test_a_product_gone_from_the_sale_is_not_offered_without_a_reload(live_server, new_page, make_product):
    """Seen by a helper: after staff renamed a product's sku (or deleted it) its open page still read
    "Live now" over an enabled "Buy now" (the poll's 404 was ignored), which bought nothing but a
    "No such product" page; its home card still offered "Buy now"."""
    phone = make_product("phone-x", stock=5, name="Phone X")
    make_product("watch", stock=5, name="Watch")
    product_page, home = new_page(), new_page()
    product_page.goto(f"{live_server.url}/products/phone-x/")
    home.goto(live_server.url)
    expect(product_page.get_by_role("button", name="Buy now")).to_be_enabled()
    expect(home.locator("[data-live-sku]")).to_have_count(2)

    Product.objects.filter(pk=phone.pk).update(sku="phone-x1")  # a rename: the old sku is gone

    expect(product_page.locator('[data-role="state"]')).to_have_text("No longer on sale", timeout=5_000)
    expect(product_page.get_by_role("button", name="Not on sale")).to_be_disabled()
    # The home page's card under the old sku goes; the product, still listed, has its card under the new one.
    expect(home.locator('[data-live-sku="phone-x"]')).to_have_count(0, timeout=5_000)
    expect(home.locator('[data-live-sku="phone-x1"] a[href="/products/phone-x1/"]')).to_have_count(2)
    expect(home.locator('[data-live-sku="watch"]')).to_be_visible()


def test_the_home_page_follows_the_catalogue_without_a_reload(live_server, page, make_product):
    """Seen by a helper: the home page's cards were the products listed when it loaded. A product
    created (or put back on sale) afterwards never appeared; one unlisted stayed, offering "Buy now"."""
    make_product("phone-x", stock=5, name="Phone X")
    make_product("watch", stock=5, name="Watch")
    page.goto(live_server.url)
    cards = page.locator("[data-live-sku]")
    expect(cards).to_have_count(2)
    page.evaluate("window.loadedOnce = true")

    make_product("lamp", stock=3, name="Lamp", price=Decimal("12.50"))
    watch = Product.objects.get(sku="watch")
    watch.listed = False
    watch.save(update_fields=["listed"])

    lamp = page.locator('[data-live-sku="lamp"]')
    expect(lamp.locator('[data-role="name"]')).to_have_text("Lamp", timeout=5_000)
    expect(page.locator('[data-live-sku="watch"]')).to_have_count(0, timeout=5_000)
    expect(cards).to_have_count(2)
    assert cards.evaluate_all("cards => cards.map(c => c.dataset.liveSku)") == ["lamp", "phone-x"]  # the sku order
    expect(lamp.locator(".price")).to_have_text("$12.50")
    expect(lamp.get_by_role("link", name="Buy Lamp")).to_have_attribute("href", "/products/lamp/")
    expect(lamp.locator('[data-role="state"]')).to_have_text("Live now")
    other = Client()
    assert other.post("/api/products/lamp/purchase", content_type="application/json").status_code == 201
    expect(lamp.locator('[data-role="stock"]')).to_have_text("2", timeout=5_000)  # the new card is live too

    watch.listed = True
    watch.save(update_fields=["listed"])
    expect(cards).to_have_count(3, timeout=5_000)
    Product.objects.filter(sku__in=["lamp", "phone-x", "watch"]).update(listed=False)
    expect(cards).to_have_count(0, timeout=5_000)
    expect(page.get_by_text("No products on sale yet.")).to_be_visible()
    make_product("kettle", stock=2, name="Kettle")
    expect(page.locator('[data-live-sku="kettle"]')).to_be_visible(timeout=5_000)
    expect(page.get_by_text("No products on sale yet.")).to_be_hidden()
    assert page.evaluate("window.loadedOnce") is True  # still the same document: no reload


def test_a_second_click_on_buy_while_the_first_waits_places_one_order(live_server, page, make_product, use_strategy):
    """Seen by a helper: a second click on "Buy now" while the first order waited (a busy sale: here
    another transaction holds the product's row) posted the form again, and with a limit of 2 the
    shopper bought 2 units for the 1 chosen, each its own order."""
    use_strategy("db")  # the section waits for the row lock held below
    make_product("earbuds", stock=10, name="Earbuds", limit=2)
    page.goto(f"{live_server.url}/products/earbuds/")
    box = page.get_by_role("button", name="Buy now").bounding_box()
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    with psycopg.connect(**connection_params()) as holder:
        holder.execute("SELECT 1 FROM inventory_product WHERE sku = 'earbuds' FOR UPDATE")
        page.mouse.click(x, y)  # the page stays on screen while its order waits: a second click reaches it
        page.wait_for_timeout(300)
        page.mouse.click(x, y)
        page.wait_for_timeout(700)
        holder.commit()
    expect(page.get_by_role("heading", name="Order confirmed")).to_be_visible()
    order = Order.objects.get()
    assert order.quantity == 1
    expect(page.locator("#order-number")).to_have_text(str(order.pk))


def connection_params() -> dict:
    """psycopg's connection arguments for the test database the live server uses."""
    from django.db import connection

    db = connection.settings_dict
    return {
        "host": db["HOST"],
        "port": db["PORT"],
        "user": db["USER"],
        "password": db["PASSWORD"] or None,
        "dbname": db["NAME"],
    }


def test_staff_log_in_and_see_the_dashboard_with_charts(live_server, page, make_product, django_user_model):
    django_user_model.objects.create_superuser("admin", "admin@example.com", "a-long-test-password")
    make_product("phone-x", stock=100, name="Phone X")
    make_product("earbuds", stock=250, name="Earbuds")
    now = timezone.now()
    for i, (backend, rps, p99, stalls) in enumerate(
        [("db", 780.0, 240.0, 1.0), ("redis", 1350.0, 120.0, 0.6), ("redlock", 990.0, 310.0, 1.4)]
    ):
        BurstRun.objects.create(
            started_at=now - timedelta(minutes=10 - i),
            strategy=backend,
            sku="phone-x",
            requests=5000,
            stock_initial=100,
            stock_final=0,
            orders=100,
            oversold=0,
            undersold=0,
            status_counts={"201": 100, "409": 4900},
            errors_5xx=0,
            rps=rps,
            p50_ms=p99 / 5,
            p95_ms=p99 / 2,
            p99_ms=p99,
            duration_s=5000 / rps,
            invariants_ok=True,
            timeline=[
                [t / 4, max(0, round(100 - 100 * (t / 4) / (stalls * 2.5))), min(5000, round(rps * t / 4))]
                for t in range(int(4 * 5000 / rps) + 1)
            ],
        )

    page.goto(f"{live_server.url}/admin/dashboard/")
    expect(page).to_have_url(f"{live_server.url}/admin/login/?next=/admin/dashboard/")
    page.get_by_label("Username").fill("admin")
    page.get_by_label("Password").fill("a-long-test-password")
    page.get_by_role("button", name="Log in").click()

    expect(page.get_by_role("heading", name="Sale dashboard")).to_be_visible()
    expect(page.locator("svg.chart")).to_have_count(3)
    expect(page.locator("#chart-stock polyline")).to_have_count(3)
    expect(page.locator("#chart-throughput rect")).to_have_count(3)
    expect(page.locator("#burst-table tbody tr")).to_have_count(3)
    expect(page.locator('tr[data-sku="phone-x"] [data-field="stock"]')).to_have_text("100")

    Client().post("/api/products/phone-x/purchase", data={"quantity": 1}, content_type="application/json")
    expect(page.locator('tr[data-sku="phone-x"] [data-field="stock"]')).to_have_text("99", timeout=5_000)
    expect(page.locator("#invariant-summary")).to_have_text("✔ holds")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "dashboard.png"), full_page=True)


def test_the_dashboards_live_stock_follows_products_added_renamed_and_deleted(
    live_server, page, make_product, django_user_model
):
    """Seen by a helper: the live table kept the rows it was rendered with. A product added later had
    no row though the "units left" tile counted it; a deleted one kept its row and stock; a renamed
    one kept its old name."""
    django_user_model.objects.create_superuser("admin", "admin@example.com", "a-long-test-password")
    phone = make_product("phone-x", stock=100, name="Phone X")
    earbuds = make_product("earbuds", stock=20, name="Earbuds")
    page.goto(f"{live_server.url}/admin/dashboard/")
    page.get_by_label("Username").fill("admin")
    page.get_by_label("Password").fill("a-long-test-password")
    page.get_by_role("button", name="Log in").click()
    rows = page.locator("#live-stock tbody tr")
    expect(rows).to_have_count(2)
    expect(page.locator("#total-stock")).to_have_text("120")

    make_product("watch", stock=5, name="Watch")
    earbuds.delete()
    phone.name = "Phone X2"
    phone.save(update_fields=["name"])

    expect(page.locator("#total-stock")).to_have_text("105", timeout=5_000)
    expect(page.locator('tr[data-sku="watch"] [data-field="stock"]')).to_have_text("5", timeout=5_000)
    expect(page.locator('tr[data-sku="earbuds"]')).to_have_count(0)
    expect(rows).to_have_count(2)
    expect(page.locator('tr[data-sku="phone-x"] th')).to_contain_text("Phone X2")

    Product.objects.all().delete()
    expect(rows).to_have_text(["No products yet. Run python manage.py seed."], timeout=5_000)
    expect(page.locator("#total-stock")).to_have_text("0")


@pytest.mark.slow
def test_shopper_buys_through_an_asgi_pod(page, make_product, tmp_path):
    """The same purchase through an ASGI pod (gunicorn + uvicorn workers): the page and its static
    files (ServeStatic) load, the buy button's form is answered by the async view on the worker's
    event loop holding the asyncio lock, and the order is written."""
    make_product("phone-x", stock=3, name="Phone X", price="499.00")
    collect_static()  # the pod runs with DEBUG off: hashed names from the manifest
    statics = []
    page.on("response", lambda response: statics.append(response.status) if "/static/" in response.url else None)
    with asgi_pod(tmp_path, "redis", sku="phone-x", workers=1) as base:
        page.goto(f"{base}/products/phone-x/")
        expect(page.get_by_role("heading", name="Phone X")).to_be_visible()
        with page.expect_response(lambda response: response.url.endswith("/buy")) as answer:
            page.get_by_role("button", name="Buy now").click()
        expect(page.get_by_role("heading", name="Order confirmed")).to_be_visible()
        order = Order.objects.get()
        expect(page.locator("#order-number")).to_have_text(str(order.pk))
    assert answer.value.status == 201
    assert answer.value.headers["x-served-on"] == "event loop in MainThread"
    assert "lock;dur=" in answer.value.headers["server-timing"]
    assert statics and set(statics) == {200}, statics
    assert (order.strategy, order.quantity) == ("redis", 1)
