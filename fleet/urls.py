"""The fleet pages (HTMX, staff only); their views are in fleet/views.py."""

from django.urls import path  # noqa: F401

urlpatterns: list = []
