from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView

from fleet.metrics.view import metrics_view
from llmgw.api import api
from llmgw.logins import AdminLoginForm, ThrottledLoginView

# The admin's own login is throttled as /login/ is: one would be a way around the other.
admin.site.login_form = AdminLoginForm

urlpatterns = [
    path("login/", ThrottledLoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", include("fleet.urls")),
    path("", include("catalog.urls")),
    path("", include("tenancy.urls")),
    path("", include("mirror.urls")),
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
    # Prometheus scrapes this without credentials, as it does any exporter.
    path("metrics", metrics_view),
    # What a browser asks for on a page that names no icon (the admin's, the API's docs).
    path("favicon.ico", RedirectView.as_view(url=static("favicon.svg"), permanent=True)),
]
