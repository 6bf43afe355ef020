"""The Django settings of the django-celery-beat test project (tests/contrib/): django-celery-beat
and the admin installed, its database a SQLite file (``ANARCHON_DJ_DB``) or a PostgreSQL URL,
migrated with ``migrate``. The beats load it through ``DJANGO_SETTINGS_MODULE`` (djbeat_app.py);
the test process passes :func:`settings_for` to ``settings.configure`` (it never sets
``DJANGO_SETTINGS_MODULE``: Celery's Django fix-up would then join every app of the process).
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from urllib.parse import urlsplit


def database(url_or_path: str) -> dict:
    """Django's ``DATABASES["default"]`` of a SQLite path or a ``postgresql://`` URL."""
    if url_or_path.startswith(("postgresql://", "postgres://")):
        parts = urlsplit(url_or_path)
        return {"ENGINE": "django.db.backends.postgresql", "NAME": parts.path.lstrip("/"),
                "USER": parts.username or "", "PASSWORD": parts.password or "",
                "HOST": parts.hostname or "", "PORT": str(parts.port or "")}
    import django

    options: dict = {"timeout": 20}
    if django.VERSION >= (5, 1):
        # several processes write (the beats' run counts, the test's rows): a transaction that
        # reads before it writes (update_or_create) would fail at once on a lock, not wait
        options.update(transaction_mode="IMMEDIATE",
                       init_command="PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL")
    return {"ENGINE": "django.db.backends.sqlite3", "NAME": url_or_path, "OPTIONS": options}


def settings_for(env: Mapping[str, str]) -> dict:
    """The settings, their database from ``env["ANARCHON_DJ_DB"]``."""
    return {
        "SECRET_KEY": "tests-only",
        "DEBUG": False,
        "ALLOWED_HOSTS": ["testserver", "localhost"],
        "USE_TZ": True,
        "TIME_ZONE": "UTC",
        "INSTALLED_APPS": ["django.contrib.admin", "django.contrib.auth",
                           "django.contrib.contenttypes", "django.contrib.sessions",
                           "django.contrib.messages", "django_celery_beat",
                           "celery_anarchon.contrib.django_celery_beat"],
        "MIDDLEWARE": ["django.contrib.sessions.middleware.SessionMiddleware",
                       "django.middleware.common.CommonMiddleware",
                       "django.middleware.csrf.CsrfViewMiddleware",
                       "django.contrib.auth.middleware.AuthenticationMiddleware",
                       "django.contrib.messages.middleware.MessageMiddleware"],
        "ROOT_URLCONF": "djbeat_urls",
        "TEMPLATES": [{"BACKEND": "django.template.backends.django.DjangoTemplates",
                       "APP_DIRS": True,
                       "OPTIONS": {"context_processors": [
                           "django.template.context_processors.request",
                           "django.contrib.auth.context_processors.auth",
                           "django.contrib.messages.context_processors.messages"]}}],
        "DATABASES": {"default": database(env.get("ANARCHON_DJ_DB", ":memory:"))},
        "DEFAULT_AUTO_FIELD": "django.db.models.AutoField",
    }


globals().update(settings_for(os.environ))
