"""A small Celery project for the command-line tests (tests/operate/test_cli.py), configured by
environment variables: ANARCHON_CLI_STORE (store URL), ANARCHON_CLI_NAMESPACE."""
import os

from celery import Celery

app = Celery("cli_app")
app.conf.update(
    broker_url="memory://",
    beat_scheduler="celery_anarchon:Scheduler",
    anarchon_store_url=os.environ["ANARCHON_CLI_STORE"],
    anarchon_namespace=os.environ["ANARCHON_CLI_NAMESPACE"],
    timezone="UTC",
    beat_schedule={"config-entry": {"task": "cli_app.report", "schedule": 60.0}},
)


@app.task
def report(*args, **kwargs):
    """Does nothing: the tests only schedule it."""
