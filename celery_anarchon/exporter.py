"""The HTTP exporter of Prometheus metrics, shared by beat (:mod:`celery_anarchon.beat.metrics`) and
the worker side (:mod:`celery_anarchon.worker.metrics`): the checks of its settings (rows of
:data:`celery_anarchon.settings.OPTIONS`), and ``prometheus_client.start_http_server`` started at
most once per process and port.

prometheus_client (the ``metrics`` extra) is imported only when an exporter is asked for.

The registries of both sides (:func:`registry`) serve no ``*_created`` series: a counter's
creation time is noise to an alert, and doubles the series of every labelled counter. They are
left out of these registries only: prometheus_client's process-wide switch
(``disable_created_metrics()``, ``PROMETHEUS_DISABLE_CREATED_SERIES``) would change the metrics
of the application's own code in the same process.
"""
from __future__ import annotations

import os
import threading
from typing import Any

from celery_anarchon.errors import ConfigError

#: the address an exporter binds when none is set: this host only
DEFAULT_ADDR = "127.0.0.1"
EXTRA_HINT = "pip install 'celery-anarchon[metrics]'"

_lock = threading.Lock()
#: (pid, addr, port) -> (registry, server) of the exporters this process started
_serving: dict[tuple[int, str, int], tuple[Any, Any]] = {}


def registry() -> Any:
    """A new ``prometheus_client.CollectorRegistry`` that serves its metrics without their
    ``*_created`` samples (counters, histograms, summaries; multiprocess collectors included).

    :raises ImportError: prometheus_client is not installed.
    """
    import copy

    from prometheus_client import CollectorRegistry

    class NoCreatedRegistry(CollectorRegistry):
        """A registry whose collected metrics have no ``*_created`` samples."""

        def collect(self):
            for metric in super().collect():
                samples = [s for s in metric.samples if not s.name.endswith("_created")]
                if len(samples) != len(metric.samples):
                    metric = copy.copy(metric)
                    metric.samples = samples
                yield metric

    return NoCreatedRegistry()


def check_port(value: Any, name: str) -> int | None:
    """``value`` of Celery setting ``name`` as the exporter's TCP port (``None``: no exporter).

    :raises ConfigError: not an integer from 1 to 65535, naming the setting, the value and the fix.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise ConfigError(f"{name} = {value!r}: must be a TCP port, an integer from 1 to 65535 "
                          f"(or None: no metrics exporter). Fix: e.g. {name} = 9808.")
    return value


def check_addr(value: Any, name: str) -> str:
    """``value`` of Celery setting ``name`` as the address to bind the exporter to (``None``:
    ``127.0.0.1``; ``"0.0.0.0"`` lets a Prometheus server on another host scrape it).

    :raises ConfigError: not a non-empty string.
    """
    if value is None:
        return DEFAULT_ADDR
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{name} = {value!r}: must be an address string such as '127.0.0.1' "
                          f"(this host only, the default) or '0.0.0.0' (every interface, for a "
                          f"Prometheus server on another host).")
    return value.strip()


def require_prometheus_client(setting: str):
    """Import prometheus_client.

    :raises ConfigError: it is not installed (naming the setting that asked and the extra).
    """
    try:
        import prometheus_client
    except ImportError as exc:
        raise ConfigError(f"{setting} is set but prometheus_client is not installed ({exc}). "
                          f"Fix: {EXTRA_HINT}, or unset {setting}.") from None
    return prometheus_client


def serve(registry: Any, *, port: int, addr: str, setting: str) -> Any:
    """Serve ``registry`` on ``http://addr:port/metrics`` from a daemon thread of this process;
    a second call for the same registry, address and port in this process does nothing.

    :param registry: a ``prometheus_client.CollectorRegistry``.
    :param setting: the Celery setting that holds ``port``, named in errors.
    :returns: the HTTP server (``.shutdown()`` stops it).
    :raises ConfigError: the port is in use (or the address cannot be bound), another registry
        is served there by this process, or prometheus_client is not installed.
    """
    prometheus_client = require_prometheus_client(setting)
    key = (os.getpid(), addr, port)
    with _lock:
        if key in _serving:
            served, server = _serving[key]
            if served is registry:
                return server
            raise ConfigError(f"{setting} = {port}: this process already serves other metrics on "
                              f"{addr}:{port}. Fix: give {setting} a port of its own.")
        try:
            server, _thread = prometheus_client.start_http_server(port, addr=addr,
                                                                  registry=registry)
        except OSError as exc:
            raise ConfigError(
                f"{setting} = {port}: cannot serve metrics on {addr}:{port}: "
                f"{exc.strerror or exc}. Fix: pick a free port for {setting} (every process of a "
                f"host needs its own: each beat, each worker, the beat inside worker -B), or stop "
                f"what listens on {port}.") from None
        _serving[key] = (registry, server)
        return server
