"""A Celery project that comes from RedBeat, for the import tests
(tests/operate/test_import_redbeat.py): the command-line tests' project (cli_app: its store from
ANARCHON_CLI_STORE and ANARCHON_CLI_NAMESPACE, its task cli_app.report, its beat_schedule entry
config-entry) with RedBeat's settings as it had them, redbeat_redis_url from ANARCHON_RB_REDIS
and redbeat_key_prefix from ANARCHON_RB_PREFIX, in the time zone Europe/Paris."""
import os

from cli_app import app

app.conf.update(redbeat_redis_url=os.environ["ANARCHON_RB_REDIS"],
                redbeat_key_prefix=os.environ["ANARCHON_RB_PREFIX"], timezone="Europe/Paris")
