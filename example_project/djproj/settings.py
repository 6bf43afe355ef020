"""The settings of djproj: django-celery-beat installed with the admin and celery_anarchon's
admin module (its Disable / Enable and "Run selected tasks", and any save() that changes a row's
``enabled``, act on the store: docs/from-django-celery-beat.md, "The admin"), the database a
SQLite file, Celery's settings read with namespace "CELERY" (djproj/celery.py). The files go to
``ANARCHON_DEMO_DIR`` (the demo's run folder), else beside this project."""
import os

import django

FOLDER = os.environ.get("ANARCHON_DEMO_DIR",
                        os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SECRET_KEY = "demo-only"
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = [
    "django.contrib.admin", "django.contrib.auth", "django.contrib.contenttypes",
    "django.contrib.sessions", "django.contrib.messages",
    "django_celery_beat",
    "celery_anarchon.contrib.django_celery_beat",    # the admin's actions on every host
    "djproj",
]
MIDDLEWARE = ["django.contrib.sessions.middleware.SessionMiddleware",
              "django.middleware.common.CommonMiddleware",
              "django.middleware.csrf.CsrfViewMiddleware",
              "django.contrib.auth.middleware.AuthenticationMiddleware",
              "django.contrib.messages.middleware.MessageMiddleware"]
TEMPLATES = [{"BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True,
              "OPTIONS": {"context_processors": [
                  "django.template.context_processors.request",
                  "django.contrib.auth.context_processors.auth",
                  "django.contrib.messages.context_processors.messages"]}}]
ROOT_URLCONF = "djproj.urls"
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"

_sqlite_options: dict = {"timeout": 20}
if django.VERSION >= (5, 1):
    # the beats (their run counts), the demo (its edits) and the admin write the same file: a
    # write transaction takes the lock when it begins, and readers never wait for writers
    _sqlite_options.update(transaction_mode="IMMEDIATE",
                           init_command="PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL")
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3",
                         "NAME": os.path.join(FOLDER, "db.sqlite3"), "OPTIONS": _sqlite_options}}

# No server: kombu's SQLAlchemy transport on a SQLite file. The claims go to the embedded SQLite
# store beside it (the store follows the broker), which coordinates the processes of one host;
# on several hosts set CELERY_ANARCHON_STORE_URL = "redis://..." (or postgresql://).
CELERY_BROKER_URL = f"sqla+sqlite:///{FOLDER}/broker.sqlite3"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# how often each beat asks django-celery-beat whether a row changed, seconds (default 5)
CELERY_ANARCHON_SYNC_INTERVAL = 1.0
