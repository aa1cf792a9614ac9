from django.contrib import admin
from django.urls import path

from . import views

handler404 = "shop.views.not_found"

urlpatterns = [
    path("", views.home, name="home"),
    path("products/<slug:sku>/", views.product_page, name="product"),
    path("products/<slug:sku>/buy", views.buy, name="buy"),
    path("api/products/<slug:sku>", views.api_product, name="api-product"),
    path("api/products/<slug:sku>/purchase", views.api_purchase, name="api-purchase"),
    path("admin/", admin.site.urls),
]
