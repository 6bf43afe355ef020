"""A Django project's Celery app that leaves django-celery-beat's admin, for the import tests
(tests/operate/test_import_django.py): the command-line tests' project (cli_app: its store from
ANARCHON_CLI_STORE and ANARCHON_CLI_NAMESPACE, its task cli_app.report, its beat_schedule entry
config-entry) with Django's settings from DJANGO_SETTINGS_MODULE, as Django's Celery guide sets
it: the django-celery-beat test project (djbeat_settings.py), its database ANARCHON_DJ_DB."""
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "djbeat_settings")

from cli_app import app  # noqa: E402

__all__ = ["app"]
