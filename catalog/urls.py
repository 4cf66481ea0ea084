"""The catalog pages (HTMX, staff only); their views are in catalog/views.py."""

from django.urls import path  # noqa: F401

urlpatterns: list = []
