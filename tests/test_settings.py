"""The settings table (celery_anarchon/settings.py): every ``anarchon_*`` key read once through
:data:`OPTIONS`, the defaults, the errors of a bad value, where the store is (``anarchon_store_url``,
else the broker's), the values derived once, the one version, and the docs' list of settings."""
from __future__ import annotations

import importlib.metadata
import pathlib
import re
from datetime import timedelta
from types import SimpleNamespace

import pytest
from celery import Celery

import celery_anarchon
from celery_anarchon.errors import ConfigError
from celery_anarchon.schedule.timing import TimingSettings
from celery_anarchon.settings import OPTIONS, SETTINGS, Settings, open_app_store
from celery_anarchon.stores import open_store, url_following_broker

ROOT = pathlib.Path(__file__).resolve().parent.parent


def make_app(**conf):
    app = Celery("proj", set_as_current=False)
    app.conf.update({"broker_url": "memory://", **conf})
    return app


def app_with(**conf) -> Celery:
    app = Celery("metrics_settings", set_as_current=False)
    app.conf.update(conf)
    return app


# -- the table, read once ------------------------------------------------------------------------

class _CountingConf(dict):
    """A Celery app's conf that counts the reads of each key (Celery's attributes read through)."""

    def __init__(self, conf) -> None:
        super().__init__(conf.items())
        self._conf, self.reads = conf, {}

    def get(self, key, default=None):
        self.reads[key] = self.reads.get(key, 0) + 1
        return super().get(key, default)

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._conf, name)


def test_every_row_of_the_table_is_read_once():
    app = make_app(anarchon_store_url="sqlite:///unused.sqlite3", anarchon_jitter=1,
                   anarchon_metrics_port=9808)
    conf = _CountingConf(app.conf)
    settings = Settings.from_app(SimpleNamespace(main=app.main, conf=conf, timezone=app.timezone))
    assert {k: n for k, n in conf.reads.items() if k.startswith("anarchon_")} == dict.fromkeys(OPTIONS, 1)
    assert settings.jitter_s == 1 and settings.metrics_port == 9808
    assert SETTINGS == tuple(OPTIONS) and all(name == row.name for name, row in OPTIONS.items())


def test_unset_settings_take_the_defaults_of_the_table():
    settings = Settings.from_app(make_app(anarchon_store_url="sqlite:///unused.sqlite3"))
    assert settings.jitter_s is None and settings.namespace == "proj"
    for name, field in [("anarchon_max_late", "max_late_s"), ("anarchon_lease", "lease_s"),
                        ("anarchon_heartbeat", "heartbeat_s"),
                        ("anarchon_sync_interval", "sync_interval_s"),
                        ("anarchon_request_retention", "request_retention_s"),
                        ("anarchon_store_options", "store_options"),
                        ("anarchon_metrics_port", "metrics_port"),
                        ("anarchon_metrics_addr", "metrics_addr"),
                        ("anarchon_metrics_max_entries", "metrics_max_entries"),
                        ("anarchon_worker_metrics_port", "worker_metrics_port"),
                        ("anarchon_worker_metrics_addr", "worker_metrics_addr")]:
        assert getattr(settings, field) == OPTIONS[name].default, name
    timing = TimingSettings()
    assert (timing.max_late_s, timing.lease_s, timing.heartbeat_s, timing.sync_interval_s) == (
        settings.max_late_s, settings.lease_s, settings.heartbeat_s, settings.sync_interval_s)


def test_a_namespace_defaults_to_the_apps_name_else_default():
    assert Settings.from_app(make_app(anarchon_namespace="billing")).namespace == "billing"
    app = make_app()
    app.main = None
    assert Settings.from_app(app).namespace == "default"
    with pytest.raises(ConfigError, match=r"^anarchon_namespace: 5 must be a string$"):
        Settings.from_app(make_app(anarchon_namespace=5))


def test_a_wrong_type_names_the_setting_the_value_and_the_fix():
    with pytest.raises(ConfigError) as info:
        Settings.from_app(make_app(anarchon_lease="30s"))
    assert str(info.value) == ("anarchon_lease: '30s' is not a duration; give seconds (int or "
                               "float) or a datetime.timedelta")
    with pytest.raises(ConfigError) as info:
        Settings.from_app(make_app(anarchon_metrics_max_entries="many"))
    assert str(info.value) == (
        "anarchon_metrics_max_entries = 'many': must be an integer >= 0 (entries with an entry "
        "label of their own; the others are counted under entry='(other)'). Fix: e.g. 500, the "
        "default.")
    with pytest.raises(ConfigError, match=r"^anarchon_store_options: \['memory'\] must be a dict$"):
        Settings.from_app(make_app(anarchon_store_options=["memory"]))
    with pytest.raises(ConfigError, match=r"^anarchon_store_url: 6379 must be a URL string$"):
        Settings.from_app(make_app(anarchon_store_url=6379))


def test_an_unknown_setting_names_the_closest_and_every_setting():
    with pytest.raises(ConfigError) as info:
        Settings.from_app(make_app(anarchon_jiter=1))
    assert str(info.value) == (
        "unknown setting 'anarchon_jiter' (did you mean 'anarchon_jitter'?). celery_anarchon's "
        "settings: anarchon_catch_up, anarchon_catch_up_window, anarchon_heartbeat, "
        "anarchon_jitter, anarchon_lease, anarchon_max_late, "
        "anarchon_namespace, anarchon_request_retention, anarchon_store_options, "
        "anarchon_store_url, anarchon_sync_interval, anarchon_metrics_port, anarchon_metrics_addr, "
        "anarchon_metrics_max_entries, anarchon_worker_metrics_port, anarchon_worker_metrics_addr, "
        "anarchon_acknowledge, anarchon_flower_url. A typo must not silently disable a rule.")


def test_zero_lease_or_heartbeat_and_a_slow_heartbeat_are_refused():
    with pytest.raises(ConfigError) as info:
        Settings.from_app(make_app(anarchon_lease=0))
    assert str(info.value) == ("anarchon_lease and anarchon_heartbeat must be more than 0 seconds "
                               "(got 0 s and 5 s; defaults 30 and 5)")
    with pytest.raises(ConfigError, match=r"^anarchon_heartbeat: -1 s must be more than 0 \(default 5\)$"):
        Settings.from_app(make_app(anarchon_heartbeat=-1))
    with pytest.raises(ConfigError) as info:
        Settings.from_app(make_app(anarchon_lease=12, anarchon_heartbeat=6))
    assert str(info.value) == (
        "anarchon_heartbeat 6 s must be less than half of anarchon_lease 12 s: a lease must be "
        "renewed at least twice before it can run out. Fix: set anarchon_heartbeat below 6 (e.g. "
        "2) or raise anarchon_lease.")


def test_the_run_now_max_late_is_derived_once_from_the_sync_interval():
    assert Settings.from_app(make_app()).run_now_max_late_s == 15
    assert Settings.from_app(make_app(anarchon_sync_interval=10)).run_now_max_late_s == 25
    assert TimingSettings(sync_interval_s=1).run_now_max_late_s == 7


def test_the_sync_interval_defaults_to_five_seconds_and_is_checked_like_the_others():
    settings = Settings.from_app(make_app())
    assert settings.sync_interval_s == 5 and settings.run_now_max_late_s == 15
    assert Settings.from_app(make_app(anarchon_sync_interval=timedelta(seconds=1))).sync_interval_s == 1
    for value, expected in [(0, "anarchon_sync_interval: 0 s must be more than 0 (default 5)"),
                            ("5s", "'5s' is not a duration"),
                            (-1, "anarchon_sync_interval: -1 s must be more than 0 (default 5)")]:
        with pytest.raises(ConfigError) as info:
            Settings.from_app(make_app(anarchon_sync_interval=value))
        assert expected in str(info.value) and "anarchon_sync_interval" in str(info.value)
    with pytest.raises(ConfigError) as info:
        Settings.from_app(make_app(anarchon_sync_intervall=5))
    assert "did you mean 'anarchon_sync_interval'?" in str(info.value)


def test_the_request_retention_defaults_to_a_week_and_is_checked_like_the_others():
    assert Settings.from_app(make_app()).request_retention_s == 7 * 86400
    assert Settings.from_app(make_app(
        anarchon_request_retention=timedelta(days=2))).request_retention_s == 2 * 86400
    for value, expected in [(0, "anarchon_request_retention: 0 s must be more than 0"),
                            (-1, "anarchon_request_retention: -1 s must be more than 0"),
                            (1e9, "at most 3.1536e+08 (ten years)"),
                            (1e12, "more than 3155760000 s (100 years)"),
                            ("7d", "'7d' is not a duration")]:
        with pytest.raises(ConfigError) as info:
            Settings.from_app(make_app(anarchon_request_retention=value))
        assert expected in str(info.value) and "anarchon_request_retention" in str(info.value)
    with pytest.raises(ConfigError, match="did you mean 'anarchon_request_retention'"):
        Settings.from_app(make_app(anarchon_request_retension=5))


# -- the metrics settings ------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["9808", True, 0, 70000, 1.5])
def test_a_bad_metrics_port_names_the_setting_and_the_fix(value):
    with pytest.raises(ConfigError) as err:
        Settings.from_app(app_with(anarchon_metrics_port=value))
    assert f"anarchon_metrics_port = {value!r}" in str(err.value) and "Fix:" in str(err.value)


def test_bad_metrics_address_and_cap_are_refused():
    with pytest.raises(ConfigError, match="anarchon_metrics_addr = ''"):
        Settings.from_app(app_with(anarchon_metrics_addr=""))
    with pytest.raises(ConfigError, match="anarchon_metrics_max_entries = -1"):
        Settings.from_app(app_with(anarchon_metrics_max_entries=-1))
    with pytest.raises(ConfigError, match="anarchon_worker_metrics_port = 0"):
        Settings.from_app(app_with(anarchon_worker_metrics_port=0))


def test_acknowledge_takes_a_list_of_check_warning_names_and_names_the_fix_of_a_bad_one():
    assert Settings.from_app(app_with()).acknowledged == ()
    assert Settings.from_app(app_with(anarchon_acknowledge=["store-setup", "sqlite-one-host"])
                             ).acknowledged == ("sqlite-one-host", "store-setup")
    with pytest.raises(ConfigError, match=r"^anarchon_acknowledge = 'sqlite-one-host': must be a "
                                          r"list of check warning names, e\.g\. anarchon_acknowledge "
                                          r"= \[\"sqlite-one-host\"\]; the names: sqlite-one-host, "):
        Settings.from_app(app_with(anarchon_acknowledge="sqlite-one-host"))
    with pytest.raises(ConfigError, match=r"^anarchon_acknowledge: 'task-unregistered' is no check "
                                          r"warning \(did you mean 'task-not-registered'\?\)"):
        Settings.from_app(app_with(anarchon_acknowledge=["task-unregistered"]))


def test_the_flower_url_is_an_http_url_kept_without_its_trailing_slash():
    assert Settings.from_app(app_with()).flower_url is None
    assert Settings.from_app(app_with(anarchon_flower_url="")).flower_url is None
    assert Settings.from_app(app_with(anarchon_flower_url="https://flower.internal:5555/")
                             ).flower_url == "https://flower.internal:5555"
    for bad in ("flower.internal", "javascript:alert(1)", "https://", "http://a b", 5555):
        with pytest.raises(ConfigError, match=r"^anarchon_flower_url = .*must be the http:// or "
                                              r"https:// URL of Flower"):
            Settings.from_app(app_with(anarchon_flower_url=bad))


def test_the_metrics_settings_are_known_settings_with_defaults():
    app = app_with(anarchon_metrics_port=9808, anarchon_worker_metrics_port=9809,
                   anarchon_metrics_addr="0.0.0.0", anarchon_metrics_max_entries=10,
                   anarchon_worker_metrics_addr="127.0.0.1")
    settings = Settings.from_app(app)       # no "unknown setting" error
    assert (settings.metrics_port, settings.metrics_addr, settings.metrics_max_entries) == (
        9808, "0.0.0.0", 10)
    assert (settings.worker_metrics_port, settings.worker_metrics_addr) == (9809, "127.0.0.1")
    default = Settings.from_app(app_with())
    assert (default.metrics_port, default.metrics_addr, default.metrics_max_entries) == (
        None, "127.0.0.1", 500)


# -- where the store is ----------------------------------------------------------------------------

def test_an_app_without_a_broker_url_has_celerys_default_brokers_store():
    """No broker_url (Celery's default app, or ``celery anarchon`` run without ``-A``) is
    Celery's default broker, RabbitMQ on localhost: its store is that broker's, a URL the store
    registry knows, never the bare word ``amqp``."""
    app = make_app(broker_url=None)
    default = app.connection_for_write().as_uri(include_password=True)
    assert url_following_broker(None) == (default, None) == url_following_broker("")
    settings = Settings.from_app(app)
    assert settings.store_url == default
    open_store(settings.store_url, namespace="n", instance_id="i").close()


@pytest.mark.parametrize("broker, store", [
    ("redis://:pw@r:6379/0", "redis://:pw@r:6379/0"),
    ("rediss://r:6380/1", "rediss://r:6380/1"),
    ("sqla+postgresql://u@db/app", "postgresql://u@db/app"),
    ("pyamqp://guest:pw@rabbit//", "amqp://guest:pw@rabbit//"),
    ("amqps://u@rabbit:5671/vh", "amqps://u@rabbit:5671/vh"),
])
def test_the_store_follows_a_shared_broker(broker, store):
    assert url_following_broker(broker) == (store, None)
    settings = Settings.from_app(make_app(broker_url=broker))
    assert (settings.store_url, settings.store_warning) == (store, None)


def test_a_local_broker_gives_the_embedded_sqlite_store_with_a_warning(tmp_path):
    url, warning = url_following_broker(f"sqla+sqlite:///{tmp_path}/broker.sqlite3")
    assert url == f"sqlite:///{tmp_path}/celery-anarchon.sqlite3"
    assert "one host only" in warning and "anarchon_store_url" in warning
    settings = Settings.from_app(make_app(broker_url=f"sqla+sqlite:///{tmp_path}/broker.sqlite3"))
    assert (settings.store_url, settings.store_warning) == (url, warning)


@pytest.mark.parametrize("broker", ["sqs://key:secret@", "azureservicebus://x"])
def test_a_broker_that_cannot_be_a_store_asks_for_a_store_url(broker):
    with pytest.raises(ConfigError) as info:
        url_following_broker(broker)
    assert "anarchon_store_url" in str(info.value) and "secret" not in str(info.value)
    with pytest.raises(ConfigError) as info:
        Settings.from_app(make_app(broker_url=broker))
    assert "anarchon_store_url" in str(info.value) and "secret" not in str(info.value)
    assert Settings.from_app(make_app(broker_url=broker, anarchon_store_url="redis://r/0"))


def test_a_sentinel_broker_gives_its_master_name_to_the_store(tmp_path):
    app = Celery("proj", set_as_current=False)
    app.conf.update(broker_url="sentinel://s1:26379;sentinel://s2:26379",
                    broker_transport_options={"master_name": "mymaster"})
    settings = Settings.from_app(app)
    assert settings.store_url.startswith("sentinel://s1:26379")
    assert settings.store_options["master_name"] == "mymaster"
    assert settings.store_warning is None


def test_the_store_url_and_options_set_are_the_stores(tmp_path):
    url = f"sqlite:///{tmp_path}/s.sqlite3"
    options = {"memory": 600}
    settings = Settings.from_app(make_app(anarchon_store_url=url, anarchon_store_options=options,
                                          anarchon_namespace="billing"))
    assert (settings.store_url, settings.store_options, settings.store_warning) == (
        url, options, None)
    assert settings.store_options is not options      # the app's dict is never the store's
    store = open_app_store(settings, instance_id="i")
    try:
        assert store.kind == "sqlite" and store.memory.duration_s == 600
        assert store.namespace == "billing"
    finally:
        store.close()
    other = open_app_store(settings, instance_id="i", namespace="other")
    try:
        assert other.namespace == "other"
    finally:
        other.close()


def test_the_check_command_drops_a_bad_setting_and_still_finds_the_brokers_store(capsys):
    from celery_anarchon.operate.cli import rules
    app = make_app(broker_url="redis://r:6379/0", anarchon_sync_interval=-5)
    report = rules._Report()
    settings = rules._settings(app, report)
    assert report.failed == 1 and "anarchon_sync_interval: -5 s" in capsys.readouterr().out
    assert settings.sync_interval_s == 5 and settings.store_url == "redis://r:6379/0"


# -- the one version -------------------------------------------------------------------------------

def test_the_version_is_the_installed_distributions():
    assert celery_anarchon.__version__ == importlib.metadata.version("celery-anarchon")
    assert re.search(r"^name = celery-anarchon$", (ROOT / "setup.cfg").read_text(), re.M)


# -- the docs' list of settings --------------------------------------------------------------------

def _docs_table() -> dict[str, tuple[str, str]]:
    """``name -> (default, unit)`` of the table under "## Settings" in docs/configuration.md."""
    text = (ROOT / "docs" / "configuration.md").read_text()
    section = text.split("\n## Settings\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        found = re.match(r"\| `(anarchon_[a-z_]+)` \| ([^|]*) \| ([^|]*) \|", line)
        if found:
            rows[found[1]] = (found[2].strip(), found[3].strip())
    return rows


def test_the_docs_list_every_setting_of_the_table_with_its_unit_and_default():
    documented = _docs_table()
    assert sorted(documented) == sorted(OPTIONS)
    for name, (default, unit) in documented.items():
        row = OPTIONS[name]
        assert unit == row.type, name
        if isinstance(row.default, (int, float)):
            assert re.split(r"[ ,]", default)[0] == f"{row.default:g}", name
        elif isinstance(row.default, str):
            assert default == f'`"{row.default}"`', name
        elif isinstance(row.default, dict):
            assert default == f"`{row.default}`", name


def test_every_setting_the_docs_set_or_quote_is_a_row_of_the_table():
    pages = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
    for page in pages:
        text = page.read_text()
        for name in re.findall(r"(?:conf\.|\b)(anarchon_[a-z_]+) ?=(?!=)", text):
            assert name in OPTIONS, f"{page.name}: {name}"
        for listed in re.findall(r"celery_anarchon's settings: ([a-z_, ]+)\.", text):
            assert listed.split(", ") == list(SETTINGS), page.name
