"""The catalog pages (HTMX, staff only); their views are in catalog/views.py."""

from django.urls import path

from . import playground, views

urlpatterns = [
    path("models", views.models, name="models"),
    path("models/<str:name>", views.model, name="model"),
    path("playground", playground.playground, name="playground"),
]
