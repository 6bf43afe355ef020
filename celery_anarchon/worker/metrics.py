"""Prometheus metrics of the worker side of leases: ``anarchon_worker_leases_total{event}``,
counted where :mod:`celery_anarchon.worker.leases` counts (the process that runs the task body and its
heartbeat thread), served by the worker's main process when ``anarchon_worker_metrics_port`` is
set (``anarchon_worker_metrics_addr``: default ``"127.0.0.1"``). Imports prometheus_client only
(never the beat side), and only when the app sets the port.

Events: ``adopted`` (a leased run started here), ``renewed``, ``renew_failed`` (the store did not
answer), ``lost`` (a renewal found the token stale: taken over), ``released``,
``release_refused`` (finished after a takeover), ``release_failed``, ``handed_back`` (a retry),
``dropped`` (a message of a run that is not this attempt's to run), ``dropped_paused`` (a
message of a run not started yet whose entry is paused: the run ends) and
``dropped_store_unreachable``.

Which processes count where:

* ``solo`` and ``threads`` pools: the bodies run in the main process, which serves its counts;
  nothing else is needed.
* ``prefork``: the bodies run in child processes, whose counts the main process cannot see by
  itself. Use prometheus_client's multiprocess mode, as Celery users do for their own worker
  metrics: set ``PROMETHEUS_MULTIPROC_DIR`` to an empty directory of its own before the worker
  starts (wiped at each start); every process then writes its counts there and the main
  process's exporter adds them up. Without it, the prefork main process serves zeros (a warning
  says so at start-up).
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Any

from celery_anarchon import exporter
from celery_anarchon.errors import ConfigError

logger = logging.getLogger("celery_anarchon.worker.metrics")

PORT_SETTING, ADDR_SETTING = "anarchon_worker_metrics_port", "anarchon_worker_metrics_addr"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: every event counted (the module's words), each served from 0 so that the first one is an increase
EVENTS = ("adopted", "renewed", "renew_failed", "lost", "released", "release_refused",
          "release_failed", "handed_back", "dropped", "dropped_paused", "dropped_store_unreachable")

_lock = threading.Lock()
_counter: Any = None            # the counter, once created in this process
_own_registry: Any = None       # its registry, outside multiprocess mode
_enabled: dict[int, bool] = {}  # id(app) -> whether its conf sets the port


def _enabled_for(app: Any) -> bool:
    enabled = _enabled.get(id(app))
    if enabled is None:
        enabled = _enabled[id(app)] = app.conf.get(PORT_SETTING) is not None
    return enabled


def _registry() -> Any:
    global _own_registry
    if _own_registry is None:
        _own_registry = exporter.registry()
    return _own_registry


def _lease_counter() -> Any:
    global _counter
    with _lock:
        if _counter is None:
            from prometheus_client import Counter
            # multiprocess mode: every process writes its values to files under the directory,
            # read by the main process's collector, so the counter needs no registry
            _counter = Counter("anarchon_worker_leases", "Lease events of the worker side "
                               "(adopted, renewed, lost, released, dropped, ...)", ["event"],
                               registry=None if os.environ.get(MULTIPROC_ENV) else _registry())
        return _counter


def count(app: Any, event: str) -> None:
    """Count one lease ``event`` of ``app``'s worker side (nothing unless ``app`` sets
    ``anarchon_worker_metrics_port`` and prometheus_client is installed). Never raises."""
    try:
        if _enabled_for(app):
            _lease_counter().labels(event).inc()
    except Exception:  # metrics never stop a task
        logger.debug("celery_anarchon: counting the lease event %s failed", event, exc_info=True)


def start_exporter(app: Any, pool: str = "") -> Any:
    """Start the worker's exporter in this (the worker's main) process, if ``app`` sets
    ``anarchon_worker_metrics_port``. In multiprocess mode (``PROMETHEUS_MULTIPROC_DIR`` set) it
    serves the sum of every process's counts.

    :param pool: the pool's module name, for the prefork warning.
    :returns: the HTTP server, or ``None`` when no port is set.
    :raises ConfigError: a bad setting, the port in use, or prometheus_client not installed.
    """
    from celery_anarchon.settings import OPTIONS
    port = OPTIONS[PORT_SETTING].read(app.conf)
    addr = OPTIONS[ADDR_SETTING].read(app.conf)
    if port is None:
        return None
    exporter.require_prometheus_client(PORT_SETTING)
    if os.environ.get(MULTIPROC_ENV):
        from prometheus_client import multiprocess
        registry = exporter.registry()
        multiprocess.MultiProcessCollector(registry)
    else:
        registry = _registry()
        if "prefork" in pool:
            logger.warning(
                "celery_anarchon: %s: the prefork pool runs task bodies in child processes, whose "
                "lease counts this exporter cannot see: set %s to an empty directory before the "
                "worker starts (prometheus_client's multiprocess mode), or use the threads or "
                "solo pool.", PORT_SETTING, MULTIPROC_ENV)
    counter = _lease_counter()      # exported from the start, every event at zero
    for event in EVENTS:
        counter.labels(event)
    server = exporter.serve(registry, port=port, addr=addr, setting=PORT_SETTING)
    logger.info("celery_anarchon: worker lease metrics on http://%s:%d/metrics", addr, port)
    return server


__all__ = ["count", "start_exporter", "ConfigError"]
