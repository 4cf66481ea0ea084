"""The tenancy pages (HTMX, staff only); their views are in tenancy/views.py."""

from django.urls import path  # noqa: F401

urlpatterns: list = []
