"""The settings of a Celery app, in one table: every ``anarchon_*`` key is a row of :data:`OPTIONS`
(name, type, default, check, doc, as Celery's ``celery.app.defaults.Option``), read once by
:meth:`Settings.from_app`, which also finds the store (``anarchon_store_url``, else the broker's)
and derives what the rules need; :func:`open_app_store` opens that store.

Shared by the beat, worker and operator wings: it sits below all three, above the stores it opens.
The pure timing rules (:mod:`celery_anarchon.schedule.timing`) read the part of the settings they
need, :class:`~celery_anarchon.schedule.timing.TimingSettings`, which :class:`Settings` extends.
"""
from __future__ import annotations

import dataclasses
import datetime
import difflib
import os
import secrets
import socket
from typing import Any, Callable

from celery.utils.text import match_case

from celery_anarchon import exporter
from celery_anarchon._util import duration as seconds  # seconds(value, what): a duration >= 0
from celery_anarchon.errors import ConfigError
from celery_anarchon.schedule.catch_up import (
    DEFAULT_CATCH_UP, DEFAULT_CATCH_UP_WINDOW_S, check_policy)
from celery_anarchon.schedule.timing import (
    DEFAULT_HEARTBEAT_S, DEFAULT_LEASE_S, DEFAULT_MAX_LATE_S, DEFAULT_REQUEST_RETENTION_S,
    DEFAULT_SYNC_INTERVAL_S, MAX_REQUEST_RETENTION_S, TimingSettings, timezone_error)
from celery_anarchon.stores import ClaimStore, open_store, scheme_of, url_following_broker

#: the ``entry`` label of every beat metrics entry past ``anarchon_metrics_max_entries``
OTHER_ENTRY_LABEL = "(other)"
DEFAULT_METRICS_MAX_ENTRIES = 500


@dataclasses.dataclass(frozen=True)
class Option:
    """One ``anarchon_*`` setting: a row of :data:`OPTIONS`.

    :param name: the Celery setting.
    :param type: what its value is, in the words of the "unit" column of docs/configuration.md
        (``"s"``: a duration in seconds, an int, a float or a ``datetime.timedelta``).
    :param default: its value when the app does not set it (``None``: see ``doc``).
    :param check: ``check(value, name)``: the value to use; raises
        :class:`~celery_anarchon.errors.ConfigError` naming the setting, the value and the fix.
    :param doc: one line: what it does.
    """

    name: str
    type: str
    default: Any
    check: Callable[[Any, str], Any]
    doc: str

    def read(self, conf: Any) -> Any:
        """This setting's checked value in ``conf`` (``app.conf``, or any mapping with ``get``),
        the default when unset; ``conf`` is read once.

        :raises ConfigError: from :attr:`check`.
        """
        return self.check(conf.get(self.name, self.default), self.name)


def _not_negative(value, name: str, default: float) -> None:
    """A negative number for a setting that must be more than 0: the message states that rule
    (the duration check would say ">= 0", and 0 is refused too)."""
    number = value.total_seconds() if isinstance(value, datetime.timedelta) else value
    if isinstance(number, (int, float)) and not isinstance(number, bool) and number < 0:
        raise ConfigError(f"{name}: {number:g} s must be more than 0 (default {default:g})")


def _duration(default: float) -> Callable[[Any, str], float]:
    """The check of a duration whose 0 is refused by a rule of its own (lease, heartbeat)."""
    def check(value: Any, name: str) -> float:
        _not_negative(value, name, default)
        return seconds(value, name)
    return check


def _more_than_0(default: float) -> Callable[[Any, str], float]:
    """The check of a duration that must be more than 0 s."""
    at_least_0 = _duration(default)

    def check(value: Any, name: str) -> float:
        s = at_least_0(value, name)
        if s <= 0:
            raise ConfigError(f"{name}: {s:g} s must be more than 0 (default {default:g})")
        return s
    return check


def _jitter(value: Any, name: str) -> float | None:
    return None if value is None else seconds(value, name)


def _retention(value: Any, name: str) -> float:
    s = _duration(DEFAULT_REQUEST_RETENTION_S)(value, name)   # 0 is refused with the range
    if not 0 < s <= MAX_REQUEST_RETENTION_S:
        raise ConfigError(f"{name}: {s:g} s must be more than 0 "
                          f"and at most {MAX_REQUEST_RETENTION_S:g} (ten years); default "
                          f"{DEFAULT_REQUEST_RETENTION_S:g} (a week)")
    return s


def _namespace(value: Any, name: str) -> str | None:
    if not value:
        return None     # Settings.from_app: app.main, else "default"
    if not isinstance(value, str):
        raise ConfigError(f"{name}: {value!r} must be a string")
    return value


def _url(value: Any, name: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"{name}: {value!r} must be a URL string")
    return value


def _options(value: Any, name: str) -> dict:
    value = value or {}
    if not isinstance(value, dict):
        raise ConfigError(f"{name}: {value!r} must be a dict")
    return dict(value)


def _flower_url(value: Any, name: str) -> str | None:
    """The Flower URL without its trailing ``/`` (``None``: unset)."""
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not value.startswith(("http://", "https://")) \
            or len(value.split("://", 1)[1].strip("/")) == 0 or any(c.isspace() for c in value):
        raise ConfigError(f"{name} = {value!r}: must be the http:// or https:// URL of Flower, "
                          f"e.g. {name} = \"https://flower.internal:5555\" (the status page "
                          "links a run's task id to <url>/task/<task id>)")
    return value.rstrip("/")


def _catch_up(value: Any, name: str) -> str:
    return check_policy(value, name, name)


def _max_entries(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{name} = {value!r}: must be an integer >= 0 (entries with an entry "
                          f"label of their own; the others are counted under "
                          f"entry={OTHER_ENTRY_LABEL!r}). Fix: e.g. 500, the default.")
    return value


#: the warnings of ``celery anarchon check`` an app may acknowledge (``anarchon_acknowledge``),
#: by name (each ``warn`` line ends with its name): an acknowledged one no longer fails
#: ``check --strict`` (docs/production.md "Command line for operators")
CHECK_WARNINGS: dict[str, str] = {
    "sqlite-one-host": "the SQLite store coordinates the beat processes of one host only",
    "store-setup": "what the store's setup can lose (no persistence, asynchronous replicas, ...)",
    "entry-timing": "a timing warning beat logs about an entry at start-up",
    "task-not-registered": "a task name this app does not register",
    "definitions-differ": "a live beat instance runs another definition of an entry",
}


def _acknowledge(value: Any, name: str) -> tuple[str, ...]:
    known = ", ".join(CHECK_WARNINGS)
    if value is None:
        return ()
    if isinstance(value, str) or not isinstance(value, (list, tuple, set, frozenset)) \
            or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{name} = {value!r}: must be a list of check warning names, e.g. "
                          f"{name} = [\"sqlite-one-host\"]; the names: {known}")
    for given in value:
        if given not in CHECK_WARNINGS:
            close = difflib.get_close_matches(given, CHECK_WARNINGS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{name}: {given!r} is no check warning{hint}; the names: {known} "
                              "(each warn line of celery anarchon check ends with its name)")
    return tuple(sorted(set(value)))


#: every ``anarchon_*`` setting, by name, in the order they are read (any other ``anarchon_*``
#: key is a typo); docs/configuration.md "Settings" lists the same (tests/test_settings.py)
OPTIONS: dict[str, Option] = {option.name: option for option in (
    Option("anarchon_catch_up", "text", DEFAULT_CATCH_UP, _catch_up,
           "which missed slots an entry claims at start-up: newest, all (within the window) "
           "or none"),
    Option("anarchon_catch_up_window", "s", DEFAULT_CATCH_UP_WINDOW_S,
           _more_than_0(DEFAULT_CATCH_UP_WINDOW_S),
           "how far back catch_up='all' claims missed slots (less than the store's memory)"),
    Option("anarchon_heartbeat", "s", DEFAULT_HEARTBEAT_S, _duration(DEFAULT_HEARTBEAT_S),
           "how often a leased run's lease is renewed by default; less than half of the lease"),
    Option("anarchon_jitter", "s", None, _jitter,
           "the most a run's claim waits after its slot (None: 2 s, lowered per entry)"),
    Option("anarchon_lease", "s", DEFAULT_LEASE_S, _duration(DEFAULT_LEASE_S),
           "the default lease duration of a leased entry"),
    Option("anarchon_max_late", "s", DEFAULT_MAX_LATE_S, _more_than_0(DEFAULT_MAX_LATE_S),
           "a run whose claim would come later than this after its slot is skipped"),
    Option("anarchon_namespace", "text", None, _namespace,
           "keeps two apps that share a store apart (None: app.main)"),
    Option("anarchon_request_retention", "s", DEFAULT_REQUEST_RETENTION_S, _retention,
           "how long the store keeps the id of a run-now request this app makes"),
    Option("anarchon_store_options", "dict", {}, _options, "options of the store"),
    Option("anarchon_store_url", "URL", None, _url,
           "the shared store that decides claims (None: follows the broker)"),
    Option("anarchon_sync_interval", "s", DEFAULT_SYNC_INTERVAL_S,
           _more_than_0(DEFAULT_SYNC_INTERVAL_S),
           "how often an instance heartbeats and reads the store's entries version"),
    Option("anarchon_metrics_port", "TCP port", None, exporter.check_port,
           "the port of beat's Prometheus metrics (None: off)"),
    Option("anarchon_metrics_addr", "address", exporter.DEFAULT_ADDR, exporter.check_addr,
           "the address beat's metrics exporter binds"),
    Option("anarchon_metrics_max_entries", "entries", DEFAULT_METRICS_MAX_ENTRIES, _max_entries,
           "how many entries (the first by name) get an entry label of their own"),
    Option("anarchon_worker_metrics_port", "TCP port", None, exporter.check_port,
           "the port of the worker side's lease metrics (None: off)"),
    Option("anarchon_worker_metrics_addr", "address", exporter.DEFAULT_ADDR, exporter.check_addr,
           "the address the worker's metrics exporter binds"),
    Option("anarchon_acknowledge", "names", (), _acknowledge,
           "the check warnings (by name) that no longer fail check --strict"),
    Option("anarchon_flower_url", "URL", None, _flower_url,
           "the status page links each run's task id to <url>/task/<task id> (None: no link)"),
)}
#: the names of :data:`OPTIONS`
SETTINGS = tuple(OPTIONS)


def _refuse_unknown(conf: Any) -> None:
    """:raises ConfigError: an ``anarchon_*`` key of ``conf`` that is no row of :data:`OPTIONS`.

    Under a namespace (``app.config_from_object("django.conf:settings", namespace="CELERY")``)
    Celery reads ``anarchon_jitter`` as ``CELERY_ANARCHON_JITTER`` (its ``ConfigurationView``: the
    prefix, in the prefix's case), so a key is checked with the prefix taken off, and the error
    names the spelling Celery reads (docs/with-django.md).
    """
    prefix = getattr(conf, "prefix", None) or ""
    spelled = [match_case(prefix + name, prefix) if prefix else name for name in SETTINGS]
    for key in list(conf.keys()):
        if not isinstance(key, str) or key in OPTIONS or key in spelled:
            continue
        bare = key[len(prefix):] if prefix and key.upper().startswith(prefix.upper()) else key
        if bare.lower().startswith("anarchon_"):
            wanted = match_case(prefix + bare, prefix) if prefix else key.lower()
            close = difflib.get_close_matches(wanted, spelled, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"unknown setting {key!r}{hint}. celery_anarchon's settings: "
                              f"{', '.join(spelled)}. A typo must not silently disable a rule.")


def _store_of(conf: Any, url: str | None, options: dict) -> tuple[str, dict, str | None]:
    """The store URL and options: ``anarchon_store_url``, else the broker's (a Sentinel broker's
    ``master_name`` too); and the warning of the embedded one-host default, else ``None``.

    :raises ConfigError: the broker cannot serve as a store and no store URL is set.
    """
    if url:
        return url, options, None
    broker = conf.broker_url or conf.broker_read_url or ""
    if scheme_of(broker) == "sentinel":
        transport = conf.broker_transport_options or {}
        if "master_name" in transport:
            options.setdefault("master_name", transport["master_name"])
        return broker, options, None
    url, warning = url_following_broker(broker)
    return url, options, warning


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings(TimingSettings):
    """The ``anarchon_*`` settings of a Celery app (:data:`OPTIONS`: defaults applied, values
    checked), with the store found; the timing rules' part is :class:`TimingSettings`.

    :param namespace: ``anarchon_namespace``, else the app's main name, else ``"default"``.
    :param store_url: the store's URL: ``anarchon_store_url``, else the broker's
        (docs/configuration.md "Where the store is, when anarchon_store_url is unset").
    :param store_options: ``anarchon_store_options`` (with a Sentinel broker's ``master_name``).
    :param store_warning: the warning of a store that coordinates one host only (the embedded
        SQLite file of a local broker), else ``None``.
    :param metrics_port: ``anarchon_metrics_port`` (``None``: beat serves no metrics).
    :param metrics_addr: ``anarchon_metrics_addr``.
    :param metrics_max_entries: ``anarchon_metrics_max_entries``.
    :param worker_metrics_port: ``anarchon_worker_metrics_port`` (``None``: no worker exporter).
    :param worker_metrics_addr: ``anarchon_worker_metrics_addr``.
    :param acknowledged: ``anarchon_acknowledge``: the names of :data:`CHECK_WARNINGS` that no
        longer fail ``check --strict``.
    :param flower_url: ``anarchon_flower_url``: Flower's URL without a trailing ``/``, to which
        the status page's entry page links each run's task id (``None``: no link).
    """

    namespace: str = "default"
    store_url: str = ""
    store_options: dict = dataclasses.field(default_factory=dict)
    store_warning: str | None = None
    metrics_port: int | None = None
    metrics_addr: str = exporter.DEFAULT_ADDR
    metrics_max_entries: int = DEFAULT_METRICS_MAX_ENTRIES
    worker_metrics_port: int | None = None
    worker_metrics_addr: str = exporter.DEFAULT_ADDR
    acknowledged: tuple[str, ...] = ()
    flower_url: str | None = None

    @classmethod
    def from_app(cls, app, *, check_timezone: bool = True) -> Settings:
        """Read and check the settings of ``app``: each row of :data:`OPTIONS` once, in order.

        :param check_timezone: check the app's ``timezone`` too (every crontab's slots and every
            view's times depend on it; the worker side, which computes no slot, passes False).
        :raises ConfigError: an unknown ``anarchon_*`` key (with the closest setting), a setting of
            the wrong type or out of range, ``anarchon_heartbeat`` not under half of
            ``anarchon_lease``, (``check_timezone``) an app ``timezone`` that names no known zone
            (:func:`~celery_anarchon.schedule.timing.timezone_error`), or no store: a broker that
            cannot serve as one and no ``anarchon_store_url``.
        """
        conf = app.conf
        _refuse_unknown(conf)
        value = {name: option.read(conf) for name, option in OPTIONS.items()}
        lease_s, heartbeat_s = value["anarchon_lease"], value["anarchon_heartbeat"]
        if lease_s <= 0 or heartbeat_s <= 0:
            raise ConfigError("anarchon_lease and anarchon_heartbeat must be more than 0 seconds "
                              f"(got {lease_s:g} s and {heartbeat_s:g} s; defaults 30 and 5)")
        if heartbeat_s >= lease_s / 2:
            raise ConfigError(
                f"anarchon_heartbeat {heartbeat_s:g} s must be less than half of anarchon_lease "
                f"{lease_s:g} s: a lease must be renewed at least twice before it can run out. "
                f"Fix: set anarchon_heartbeat below {lease_s / 2:g} (e.g. {lease_s / 6:.3g}) or "
                "raise anarchon_lease.")
        zone_error = timezone_error(app) if check_timezone else None
        if zone_error is not None:
            raise zone_error
        url, options, warning = _store_of(conf, value["anarchon_store_url"],
                                          value["anarchon_store_options"])
        return cls(
            jitter_s=value["anarchon_jitter"], max_late_s=value["anarchon_max_late"],
            lease_s=lease_s, heartbeat_s=heartbeat_s,
            sync_interval_s=value["anarchon_sync_interval"],
            request_retention_s=value["anarchon_request_retention"],
            catch_up=value["anarchon_catch_up"],
            catch_up_window_s=value["anarchon_catch_up_window"],
            namespace=value["anarchon_namespace"] or app.main or "default",
            store_url=url, store_options=options, store_warning=warning,
            metrics_port=value["anarchon_metrics_port"],
            metrics_addr=value["anarchon_metrics_addr"],
            metrics_max_entries=value["anarchon_metrics_max_entries"],
            worker_metrics_port=value["anarchon_worker_metrics_port"],
            worker_metrics_addr=value["anarchon_worker_metrics_addr"],
            acknowledged=value["anarchon_acknowledge"],
            flower_url=value["anarchon_flower_url"])


def make_instance_id() -> str:
    """``host:pid:random`` (the random suffix tells apart two processes that reuse a pid)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def open_app_store(settings: Settings, *, instance_id: str,
                   namespace: str | None = None) -> ClaimStore:
    """Open the store of ``settings`` (no I/O: it connects on first use) under ``namespace``
    (default: the settings' ``anarchon_namespace``).

    :raises ConfigError: the store's URL or options are refused
        (:func:`~celery_anarchon.stores.open_store`).
    """
    return open_store(settings.store_url,
                      namespace=settings.namespace if namespace is None else namespace,
                      instance_id=instance_id, options=dict(settings.store_options))
