"""The tenancy pages (HTMX, staff only); their views are in tenancy/views.py."""

from django.urls import path

from . import views

urlpatterns = [
    path("quotas", views.quotas, name="quotas"),
    path("scopes", views.scopes, name="scopes"),
]
