"""Django settings, all from the environment through llmgw.core.config.

Embedded by default (SQLite in LLMGW_HOME, in-memory channel layer, the
reconciler inside `llmgw serve`); production when DATABASE_URL and REDIS_URL
are set (PostgreSQL, channels_redis, Celery beat and worker).
"""

import sys

import dj_database_url

from llmgw.core import config as _config
from llmgw.core.web import LOOPBACK_HOSTS, private_database

try:
    LLMGW = _config.load()
except _config.SettingError as exc:
    sys.stderr.write(f"llmgw: {exc}\n")
    raise SystemExit(2) from None

BASE_DIR = _config.Path(__file__).resolve().parent.parent
SECRET_KEY = LLMGW.secret_key
DEBUG = LLMGW.debug
# Loopback names unless LLMGW_ALLOWED_HOSTS says; `llmgw serve` adds the address it binds.
ALLOWED_HOSTS = list(LLMGW.web.allowed_hosts or LOOPBACK_HOSTS)
if LLMGW.web.behind_tls_proxy:
    # The proxy says the request came over TLS: CSRF's origin check and secure cookies
    # then see the https:// the browser used. The proxy must set (not pass on) the header.
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = LLMGW.web.secure_cookies
CSRF_TRUSTED_ORIGINS = ["http://127.0.0.1", "http://localhost"]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "django_htmx",
    "ninja",  # Swagger UI's assets, served from static/ (no CDN)
    "template_partials",
    "tenancy",
    "catalog",
    "fleet",
    "mirror",
    "llmgw.gateway",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "llmgw.csp.ContentSecurityPolicy",
    "django_htmx.middleware.HtmxMiddleware",
    # Last, so the views' database errors reach it first: an outage is a 503, not a 500.
    "llmgw.middleware.DatabaseAway",
]

ROOT_URLCONF = "llmgw.urls"
ASGI_APPLICATION = "llmgw.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            # `|when`: a time, relative, with the exact one on hover (llmgw/core/when.py);
            # `|bytes`: a size, in the one unit every page uses (llmgw/core/sizes.py).
            "builtins": ["llmgw.core.when", "llmgw.core.sizes"],
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

if LLMGW.database_url:
    # No persistent connections: under daphne each request runs in a thread of its own, so
    # a connection kept for the next request is never reused. It was left open until its
    # dead thread was garbage-collected, and a busy server ran PostgreSQL out of clients.
    # The one that is kept, the agents' thread's (llmgw.core.db), is checked before reuse.
    DATABASES = {
        "default": dj_database_url.parse(
            LLMGW.database_url, conn_max_age=0, conn_health_checks=True
        )
    }
else:
    private_database(LLMGW.home / "llmgw.sqlite3")
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": LLMGW.home / "llmgw.sqlite3",
            "OPTIONS": {
                # WAL lets readers go on while the reconciler writes; IMMEDIATE
                # takes the write lock at BEGIN so two writers queue instead of
                # deadlocking on a lock upgrade.
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
                "transaction_mode": "IMMEDIATE",
                "timeout": 30,
            },
            "TEST": {"NAME": LLMGW.home / "test.sqlite3"},
            "CONN_HEALTH_CHECKS": True,
        }
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Agents stay connected for months, and a group member older than group_expiry is
# dropped without a word: commands to that node would vanish. Ten years, then.
_GROUP_EXPIRY = 10 * 365 * 86400
if LLMGW.redis_url:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {
                "hosts": [LLMGW.redis_url],
                "capacity": 1000,
                "expiry": 30,
                "group_expiry": _GROUP_EXPIRY,
            },
        }
    }
else:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "llmgw.layers.PacedInMemoryChannelLayer",
            "CONFIG": {"group_expiry": _GROUP_EXPIRY},
        }
    }

# The login throttle's counts (llmgw/logins.py): in Redis when there is one, so every
# `llmgw serve` behind a balancer counts the same failures; in the process's memory
# otherwise.
if LLMGW.redis_url:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": LLMGW.redis_url,
            "KEY_PREFIX": "llmgw-cache",
        }
    }

CELERY_BROKER_URL = LLMGW.redis_url or "memory://"
CELERY_TASK_ALWAYS_EAGER = LLMGW.redis_url is None
CELERY_TASK_IGNORE_RESULT = True
CELERY_BEAT_SCHEDULE = {
    "reconcile": {
        "task": "fleet.tasks.reconcile",
        "schedule": LLMGW.timings.reconcile_interval,
        # A pass that could not run in time is skipped, not queued behind the next.
        "options": {"expires": LLMGW.timings.reconcile_interval},
    },
    # Retries and claims a dead worker left: the mirror's worker looks for due files.
    "mirror": {"task": "mirror.tasks.fetch", "schedule": 15.0, "options": {"expires": 15.0}},
}
# Downloads run for minutes: on a worker of their own (the one that holds
# LLMGW_MIRROR_DIR), never ahead of a reconciler pass.
CELERY_TASK_ROUTES = {"mirror.tasks.fetch": {"queue": "mirror"}}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "/admin/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = LLMGW.home / "static"

# Agents' and API bodies are small; anything larger is refused before parsing.
DATA_UPLOAD_MAX_MEMORY_SIZE = 1024 * 1024

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "text": {
            "()": "llmgw.core.logs.TextFormatter",
            "fmt": "%(asctime)s %(levelname)s %(name)s %(message)s",
        },
        "json": {"()": "llmgw.core.logs.JsonFormatter"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": LLMGW.log_format}},
    "root": {"handlers": ["console"], "level": "INFO"},
    "loggers": {
        "django.channels.server": {"level": "WARNING"},
        "daphne": {"level": "WARNING"},
    },
}
