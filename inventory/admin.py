"""Staff views of the sale: products with their invariant, orders and burst runs (the dashboard: :mod:`.dashboard`).

Stock moves only through the services (purchase, restock, reset), so the admin shows stock and
fence read-only and offers restock and reset as actions, each behind a confirmation page and
each recorded in the admin log (``LogEntry``) of the product it changed.
"""

from __future__ import annotations

from typing import Callable
from urllib.parse import urlencode

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ChangeList
from django.db import transaction
from django.db.models import F, ProtectedError
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html

from inventory.errors import InventoryError

from .audit import AuditReport
from .models import BurstRun, Order, Product
from .services import reset_sale, restock, sale_state

admin.site.site_header = "Flash sale admin"
admin.site.site_title = "Flash sale admin"
admin.site.index_title = "Inventory"
admin.site.index_template = "admin/inventory/index.html"


class DeleteRefused(InventoryError):
    """A delete the products' orders forbid, found once their rows were locked: nothing deleted."""


def delete_products(ids: list) -> None:
    """Delete the products ``ids`` (those still there), or none of them when one has an order.

    The rows are locked first: a purchase writing a product's first order holds its row until it
    commits, so the check for orders that follows sees that order (the delete is refused), and no
    order can be written after it. Without the lock the check ran before that commit, the delete
    waited for the row and then failed the orders' foreign key at its own commit: a 500."""
    with transaction.atomic():
        list(Product.objects.select_for_update().filter(pk__in=ids).values_list("pk", flat=True))
        try:
            Product.objects.filter(pk__in=ids).delete()
        except ProtectedError as exc:
            ordered = {order.product_id for order in exc.protected_objects}
            skus = sorted(Product.objects.filter(pk__in=ordered).values_list("sku", flat=True))
            raise DeleteRefused(
                f"Not deleted: {', '.join(skus)} {'has' if len(skus) == 1 else 'have'} orders now "
                "(a purchase committed while the delete was being confirmed). Reset the sale first."
            ) from exc


def invariant_mark(product: Product) -> str:
    """The audit's verdict on a product from ``Product.objects.with_totals()``, in its own words."""
    problems = AuditReport.of(product).problems
    if not problems:
        return format_html(
            '<span class="invariant invariant-ok" title="{}">✔ holds</span>', "ordered = initial − stock, stock ≥ 0"
        )
    return format_html(
        '<span class="invariant invariant-broken" title="ordered ≠ initial − stock">✘ {}</span>', "; ".join(problems)
    )


def counted(number: int, noun: str) -> str:
    """``1 unit``, ``2 units``: the admin's messages count in the singular when there is one."""
    return f"{number} {noun}{'' if number == 1 else 's'}"


class RestockForm(forms.Form):
    quantity = forms.IntegerField(
        label="Units to add to each selected product",
        min_value=1,
        max_value=1_000_000,
        widget=forms.NumberInput(attrs={"autofocus": True}),
    )


class ResetSaleForm(forms.Form):
    stock = forms.IntegerField(
        label="Units to put on sale",
        min_value=0,
        max_value=1_000_000,
        required=False,
        help_text="Leave blank to put each product's current initial stock back on sale.",
    )


class CheckedChangeList(ChangeList):
    """A lookup the database or the date arithmetic cannot take is a bad lookup (the admin's own
    redirect to ``?e=1``), not a server error: a NUL byte in any parameter (PostgreSQL refuses it
    in text), a date hierarchy past 9999-12-31 (its next day or month overflows)."""

    def get_filters(self, request):
        if any("\x00" in value for values in request.GET.lists() for value in values[1]):
            raise IncorrectLookupParameters("a query parameter holds a NUL byte")
        try:
            return super().get_filters(request)
        except (ValueError, OverflowError) as exc:
            raise IncorrectLookupParameters(str(exc)) from exc


class CheckedLookups:
    """The admins' changelists with :class:`CheckedChangeList`."""

    def get_changelist(self, request, **kwargs):
        return CheckedChangeList


@admin.register(Product)
class ProductAdmin(CheckedLookups, admin.ModelAdmin):
    list_display = [
        "sku",
        "name",
        "price",
        "state",
        "initial_stock",
        "stock",
        "sold",
        "ordered",
        "fence",
        "invariant",
    ]
    list_display_links = ["sku", "name"]
    search_fields = ["sku", "name"]
    actions = ["restock_selected", "reset_sale_selected"]
    fieldsets = [
        (None, {"fields": ["sku", "name", "price", "per_customer_limit", "listed"]}),
        ("Sale window", {"fields": ["sale_starts_at", "sale_ends_at"], "description": "Blank means open-ended."}),
        ("Stock", {"fields": ["initial_stock", "stock", "fence", "version"]}),
    ]

    def get_queryset(self, request):
        return Product.objects.with_totals()

    def get_changeform_initial_data(self, request):
        """The add form prefilled from the query string, less the sale window: the split date and
        time widget cannot show a string given there (it was a server error)."""
        initial = super().get_changeform_initial_data(request)
        for name in ("sale_starts_at", "sale_ends_at"):
            initial.pop(name, None)
        return initial

    def response_action(self, request, queryset):
        """An action on rows that are not products' ids is refused with a message (Django's own
        filter by them was a server error), and changes nothing."""
        selected = request.POST.getlist(admin.helpers.ACTION_CHECKBOX_NAME)
        if not all(value.isascii() and value.isdigit() for value in selected):
            self.message_user(request, "The rows selected are not products' ids: nothing was changed.", messages.ERROR)
            return None
        if request.POST.get("action") != "delete_selected":
            return super().response_action(request, queryset)
        try:
            with transaction.atomic():  # a refused delete leaves no log entry saying it deleted
                return super().response_action(request, queryset)
        except DeleteRefused as refused:
            self.message_user(request, str(refused), messages.ERROR)
            return HttpResponseRedirect(request.get_full_path())

    def delete_view(self, request, object_id, extra_context=None):
        try:
            return super().delete_view(request, object_id, extra_context)
        except DeleteRefused as refused:
            self.message_user(request, str(refused), messages.ERROR)
            return HttpResponseRedirect(reverse("admin:inventory_product_change", args=[object_id]))

    def delete_model(self, request, obj) -> None:
        delete_products([obj.pk])

    def delete_queryset(self, request, queryset) -> None:
        delete_products(list(queryset.values_list("pk", flat=True)))

    def get_readonly_fields(self, request, obj=None):
        # Stock changes only through purchase, restock and reset; on creation it equals initial stock.
        return ["initial_stock", "stock", "fence", "version"] if obj else ["stock", "fence", "version"]

    def save_model(self, request, obj, form, change):
        if not change:
            obj.stock = obj.initial_stock
            obj.save()
        elif form.changed_data:
            # Only what the form edits: saving every column would write back the stock, fence
            # and version the form read, undoing any purchase that committed meanwhile.
            obj.save(update_fields=form.changed_data)

    @admin.display(description="sale")
    def state(self, product: Product) -> str:
        return sale_state(product).replace("_", " ")

    @admin.display(description="sold", ordering=F("initial_stock") - F("stock"))
    def sold(self, product: Product) -> int:
        return product.sold

    @admin.display(description="ordered", ordering="ordered_units")
    def ordered(self, product) -> int:
        return product.ordered_units

    @admin.display(description="invariant", ordering="invariant_ok")
    def invariant(self, product) -> str:
        return invariant_mark(product)

    def _confirm(self, request, queryset, *, form, action: str, title: str, verb: str, warning: str = ""):
        context = {
            **self.admin_site.each_context(request),
            "title": title,
            "opts": self.model._meta,
            "queryset": Product.objects.with_totals().filter(pk__in=queryset.values("pk")),
            "form": form,
            "action": action,
            "verb": verb,
            "warning": warning,
            "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "admin/inventory/product/action_confirmation.html", context)

    def _none_left(self, request, queryset) -> bool:
        """Every product selected was deleted since the list was shown (or its id never was one): the
        action has nothing to change. Said as Django's admin says it of an action with no row selected.
        Some of them only: the action goes on with the rest, and the user is told which ids it left out
        (they were acted on silently: "Restocked kept", nothing of the one gone)."""
        left = {str(pk) for pk in queryset.values_list("pk", flat=True)}
        if not left:
            self.message_user(request, "The products selected no longer exist: nothing was changed.", messages.WARNING)
            return True
        if request.POST.get("select_across") == "1":
            return False  # every product the list's filters match, not ids: none can be gone
        selected = set(request.POST.getlist(admin.helpers.ACTION_CHECKBOX_NAME))
        gone = sorted(selected - left, key=int)
        if gone:
            ids = ", ".join(gone)
            self.message_user(
                request,
                f"{len(gone)} of the {counted(len(selected), 'product')} selected "
                f"{'no longer exists' if len(gone) == 1 else 'no longer exist'} (id{'s' if len(gone) > 1 else ''} "
                f"{ids}): left out, nothing done to {'it' if len(gone) == 1 else 'them'}.",
                messages.WARNING,
            )
        return False

    @admin.action(description="Restock selected products…", permissions=["change"])
    def restock_selected(self, request, queryset):
        if self._none_left(request, queryset):
            return None
        form = RestockForm(request.POST if "post" in request.POST else None)
        if not form.is_valid():
            return self._confirm(
                request,
                queryset,
                form=form,
                action="restock_selected",
                title="Restock products",
                verb="Restock",
            )
        quantity = form.cleaned_data["quantity"]
        self._change_each(
            request,
            queryset,
            lambda product: restock(sku=product.sku, quantity=quantity),
            logged=lambda product, updated: (
                f"Restocked {counted(quantity, 'unit')}: stock {product.stock} → {updated.stock}, "
                f"initial {updated.initial_stock}."
            ),
            said=lambda product, updated: f"Restocked {product.sku}: +{quantity}, {updated.stock} now in stock.",
        )
        return None

    @admin.action(description="Reset sale of selected products…", permissions=["change"])
    def reset_sale_selected(self, request, queryset):
        if self._none_left(request, queryset):
            return None
        form = ResetSaleForm(request.POST if "post" in request.POST else None)
        if not form.is_valid():
            orders = Order.objects.filter(product__in=queryset).count()
            return self._confirm(
                request,
                queryset,
                form=form,
                action="reset_sale_selected",
                title="Reset sale",
                verb="Reset sale",
                warning=f"This deletes {counted(orders, 'order')} and sets the fence back to 0.",
            )
        stock = form.cleaned_data["stock"]
        self._change_each(
            request,
            queryset,
            lambda product: reset_sale(sku=product.sku, stock=product.initial_stock if stock is None else stock),
            logged=lambda product, updated: (
                f"Reset sale: {counted(product.order_count, 'order')} deleted, "
                f"stock {product.stock} → {updated.stock}, fence {product.fence} → 0."
            ),
            said=lambda product, updated: (
                f"Reset {product.sku}: {counted(updated.stock, 'unit')} on sale, orders cleared."
            ),
        )
        return None

    def _change_each(
        self,
        request,
        queryset,
        change: Callable[[Product], Product],
        *,
        logged: Callable[[Product, Product], str],
        said: Callable[[Product, Product], str],
    ) -> None:
        """Apply ``change`` (a service) to each product; record each change in the admin log
        (``logged``) and tell the user (``said``); a refusal is reported and the rest go on."""
        for product in queryset:
            try:
                updated = change(product)
            except InventoryError as exc:
                self.message_user(request, f"{product.sku}: {exc}", messages.ERROR)
                continue
            self.log_change(request, updated, logged(product, updated))
            self.message_user(request, said(product, updated), messages.SUCCESS)


class CustomerFilter(admin.SimpleListFilter):
    """Filter by a shopper id typed in (there are far too many shoppers for a list of links)."""

    title = "customer"
    parameter_name = "customer"
    template = "admin/inventory/input_filter.html"

    def lookups(self, request, model_admin):
        return ()

    def has_output(self) -> bool:
        return True

    def queryset(self, request, queryset):
        value = (self.value() or "").strip()
        return queryset.filter(customer=value) if value else queryset

    def choices(self, changelist):
        # The template renders a text box; this carries the other active filters along.
        params = {k: v for k, v in changelist.get_filters_params().items() if k != self.parameter_name}
        yield {
            "value": self.value() or "",
            "params": params,
            "clear_url": changelist.get_query_string(remove=[self.parameter_name]),
        }


class ReadOnlyAdmin(CheckedLookups, admin.ModelAdmin):
    """Records written by the shop and the burst runner: viewable, never edited by hand."""

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Order)
class OrderAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "product",
        "customer_link",
        "quantity",
        "unit_price",
        "total",
        "strategy",
        "fence",
        "created_at",
    ]
    list_filter = ["product", "strategy", CustomerFilter]
    search_fields = ["customer", "product__sku"]
    list_select_related = ["product"]
    date_hierarchy = "created_at"
    readonly_fields = ["total"]

    @admin.display(description="total")
    def total(self, order: Order) -> str:
        """What the shopper paid: the units at the price the order records, not the product's price now."""
        return f"{order.total:.2f}"

    @admin.display(description="customer", ordering="customer")
    def customer_link(self, order: Order) -> str:
        url = reverse("admin:inventory_order_changelist") + "?" + urlencode({"customer": order.customer})
        return format_html('<a href="{}" title="all orders of this customer">{}</a>', url, order.customer)


@admin.register(BurstRun)
class BurstRunAdmin(ReadOnlyAdmin):
    list_display = [
        "started_at",
        "strategy",
        "server",
        "sku",
        "requests",
        "stock_initial",
        "stock_final",
        "orders",
        "oversold",
        "undersold",
        "errors_5xx",
        "rps",
        "p99_ms",
        "invariants_ok",
    ]
    list_filter = ["strategy", "server", "invariants_ok", "sku"]
    date_hierarchy = "started_at"
