from django.conf import settings
from django.contrib import admin
from django.urls import path

from inventory.dashboard import dashboard_report_view, dashboard_stock_view, dashboard_view

from . import async_views, floor, views

# The purchases (the API's and the form's) and the floor run as the server runs natively: sync views
# under WSGI, ``async def`` views awaited on the event loop under ASGI (shop/async_views.py).
ON_LOOP = settings.SHOP_SERVER == "asgi"

handler400 = "shop.views.bad_request"
handler404 = "shop.views.not_found"

urlpatterns = [
    path("", views.home, name="home"),
    path("products/<slug:sku>/", views.product_page, name="product"),
    path("products/<slug:sku>/buy", async_views.buy if ON_LOOP else views.buy, name="buy"),
    path("api/session", views.api_session, name="api-session"),
    path("api/products", views.api_products, name="api-products"),
    path("api/products/<slug:sku>", views.api_product, name="api-product"),
    path(
        "api/products/<slug:sku>/purchase",
        async_views.api_purchase if ON_LOOP else views.api_purchase,
        name="api-purchase",
    ),
    # The burst's floor row: the purchase request path without storage (shop/floor.py).
    path("api/products/<slug:sku>/floor", floor.api_floor_on_loop if ON_LOOP else floor.api_floor, name="api-floor"),
    # The sale dashboard lives inside the admin, behind its staff login.
    path("admin/dashboard/", admin.site.admin_view(dashboard_view), name="admin-dashboard"),
    path("admin/dashboard/stock.json", admin.site.admin_view(dashboard_stock_view), name="admin-dashboard-stock"),
    path("admin/dashboard/report/", admin.site.admin_view(dashboard_report_view), name="admin-dashboard-report"),
    path("admin/", admin.site.urls),
]
