"""``{% load sale_dashboard %}``: whether a user may open the sale dashboard, for the admin pages
that link it (a link to a page that answers 403 was shown to staff who may not view burst runs)."""

from __future__ import annotations

from django import template

from inventory.dashboard import may_open

register = template.Library()


@register.filter
def may_open_dashboard(user) -> bool:
    """``{% if request.user|may_open_dashboard %}``: :func:`inventory.dashboard.may_open`."""
    return may_open(user)
