"""A Celery project that comes from RedBeat, for the import tests (tests/operate/test_import_redbeat.py):
RedBeat's settings as it had them (redbeat_redis_url, redbeat_key_prefix) and our store, from
environment variables: ANARCHON_RB_REDIS, ANARCHON_RB_PREFIX, ANARCHON_RB_STORE,
ANARCHON_RB_NAMESPACE."""
import os

from celery import Celery

app = Celery("redbeat_app")
app.conf.update(
    broker_url="memory://",
    redbeat_redis_url=os.environ["ANARCHON_RB_REDIS"],
    redbeat_key_prefix=os.environ["ANARCHON_RB_PREFIX"],
    beat_scheduler="celery_anarchon:Scheduler",
    anarchon_store_url=os.environ["ANARCHON_RB_STORE"],
    anarchon_namespace=os.environ["ANARCHON_RB_NAMESPACE"],
    timezone="Europe/Paris",
    beat_schedule={"in-code": {"task": "redbeat_app.report", "schedule": 60.0}},
)


@app.task
def report(*args, **kwargs):
    """Does nothing: the tests only schedule it."""


@app.task
def cleanup(*args, **kwargs):
    """Does nothing: the tests only schedule it."""
