from django.contrib import admin

from .models import Order, Product


@admin.register(Product)
class ProductAdmin(admin.ModelAdmin):
    list_display = ["sku", "name", "price", "initial_stock", "stock", "sold", "fence"]
    search_fields = ["sku", "name"]
    readonly_fields = ["fence"]

    @admin.display(description="sold")
    def sold(self, product: Product) -> int:
        return product.sold


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ["id", "product", "customer", "quantity", "backend", "fence", "created_at"]
    list_filter = ["backend", "product"]
    search_fields = ["customer"]
    list_select_related = ["product"]
