"""The mirror page (HTMX, staff only); its view is in mirror/views.py."""

from django.urls import path

from . import views

urlpatterns = [
    path("mirror", views.weights, name="mirror"),
]
