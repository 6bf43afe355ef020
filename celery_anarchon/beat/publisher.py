"""Beat's broker side: its connection and producer, the send batch, and the send of one won run
with its task id and headers (the engine's send callbacks, :data:`~celery_anarchon.beat.engine.sends.SendFn`
and :data:`~celery_anarchon.beat.engine.sends.SendBatchFn`): :class:`Publisher`, a part of
:class:`celery_anarchon.Scheduler` (its ``publisher``).

What a failed send means for the run decides between a retry and ``send_unknown``: an error
raised before a publish began wrote nothing (a plain failure: retried until max_late, then
``send_failed``); one raised once it began may have put the message on the broker, so that run is
never published again (:class:`~celery_anarchon.errors.SendOutcomeUnknown`). Whether a publish
began is known from Celery's ``before_task_publish`` signal and from beat's own producer.
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time

from celery import signals
from kombu.exceptions import EncodeError, OperationalError
from kombu.serialization import SerializerNotInstalled
from kombu.utils.objects import cached_property

from celery_anarchon._util import log_time
from celery_anarchon.errors import SendOutcomeUnknown
from celery_anarchon.schedule.message import task_message

logger = logging.getLogger("celery_anarchon.beat.scheduler")

#: how long beat tries to connect to the broker per send attempt; a run whose publish could not
#: start is retried by the engine every second until max_late. The publish itself is never
#: retried (kombu's ``retry=False``): one that broke off may have reached the broker.
BROKER_CONNECT_RETRIES = 1
#: a broker connection idle longer than this (seconds) is checked before the next publish, so a
#: connection the broker dropped meanwhile is found before a message is written to it
BROKER_PROBE_IDLE_S = 1.0
#: kombu's batch buffers at most this many commands per message before it writes on its own
#: (a message is one LPUSH, plus one PEXPIRE per priority step with queue expiry)
BATCH_COMMANDS_PER_MESSAGE = 12
#: socket timeout (seconds) of beat's own Redis broker connection when the broker's transport
#: options set none: without one a publish to a broker that stopped answering blocks beat forever
BROKER_SOCKET_TIMEOUT_S = 10.0


#: per thread: whether a publish began since :meth:`Publisher.send` cleared it. Set by Celery's
#: ``before_task_publish`` signal (sent right before any producer publishes a task message) and
#: by beat's own producer's ``publish``: either is proof enough that a write may have begun
_PUBLISHING = threading.local()


def _publish_begins(**_signal) -> None:
    _PUBLISHING.began = True


signals.before_task_publish.connect(_publish_begins, weak=False,
                                    dispatch_uid="celery_anarchon.beat.publisher.publish_begins")


def _exit_requested(exc: BaseException) -> bool:
    """True when a ``SystemExit`` or ``KeyboardInterrupt`` (beat's SIGTERM/SIGINT handlers raise
    them) hides in ``exc``'s chain (causes and contexts): a client library caught it and raised
    another error."""
    seen, todo = set(), [exc]
    while todo:
        exc = todo.pop()
        if exc is None or id(exc) in seen:
            continue
        if isinstance(exc, (SystemExit, KeyboardInterrupt)):
            return True
        seen.add(id(exc))
        todo += [exc.__cause__, exc.__context__]
    return False


class Publisher:
    """The broker side of :class:`celery_anarchon.Scheduler`, which makes one per process (of
    its class attribute ``Publisher``: a subclass may swap it) and hands :meth:`send` and
    :meth:`send_batch` to the engine. It opens nothing until the first send.

    :param app: the Celery app: its broker connection (``connection_for_write``) and tasks.
    :param producer_cls: the producer class (Celery's ``Scheduler.Producer``, kombu's
        ``Producer`` by default).
    :param namespace: ``anarchon_namespace``, in the headers of every message.
    :param instance_id: this instance's id, in the headers of every message.
    """

    def __init__(self, app, producer_cls, *, namespace: str, instance_id: str) -> None:
        self.app = app
        self.Producer = producer_cls
        self.namespace = namespace
        self.instance_id = instance_id
        self._stopping = False
        self._batch: _Batch | None = None
        #: monotonic: when the broker connection last answered (a publish, a check)
        self._broker_used_at = 0.0

    @cached_property
    def connection(self):
        """Beat's broker connection (Celery's ``connection_for_write``). On a Redis broker: a
        socket timeout when the transport options set none, and never ``retry_on_timeout`` (it
        would repeat a publish whose answer timed out)."""
        connection = self.app.connection_for_write()
        options = dict(connection.transport_options or {})
        if str(connection.transport_cls).split("+")[0] in ("redis", "rediss", "sentinel"):
            options.setdefault("socket_timeout", BROKER_SOCKET_TIMEOUT_S)
            # redis-py would send a publish whose answer timed out a second time
            options["retry_on_timeout"] = False
            connection.transport_options = options
        return connection

    @cached_property
    def producer(self):
        """Beat's producer; its ``publish`` notes that a publish began (:data:`_PUBLISHING`): an
        error raised before that wrote nothing (see :meth:`send`)."""
        producer = self.Producer(self._ensure_connected(), auto_declare=False)
        publish = producer.publish

        def noted_publish(*args, **kwargs):
            _PUBLISHING.began = True
            return publish(*args, **kwargs)
        producer.publish = noted_publish
        return producer

    def stop(self) -> None:
        """Beat is shutting down (its SIGTERM handler closed the scheduler in the middle of a
        tick): a publish that fails from now on is reported :class:`SendOutcomeUnknown`, never
        retried."""
        self._stopping = True

    def close(self) -> None:
        """Release the broker connection and producer (reopened by the next send). Never
        raises."""
        self._drop_connection()

    def _ensure_connected(self):
        """Connect to the broker without blocking the tick for long (Celery's default retries up
        to ``broker_connection_max_retries`` times); the engine retries the send every second."""
        def errback(exc, interval):
            logger.warning("beat: broker connection error: %s; trying again in %s s", exc, interval)
        return self.connection.ensure_connection(errback, max_retries=BROKER_CONNECT_RETRIES,
                                                 interval_start=0.2, interval_step=0.5,
                                                 interval_max=1)

    def _live_producer(self):
        """The producer, its connection checked if it sat idle: a Redis broker answers a PING,
        an AMQP connection is still open. Anything raised here happened before a publish.

        :raises Exception: the broker cannot be reached (the send is retried by the engine).
        """
        producer = self.producer
        if time.monotonic() - self._broker_used_at > BROKER_PROBE_IDLE_S:
            channel = producer.channel
            acquire = getattr(channel, "conn_or_acquire", None)
            if acquire is not None:                    # kombu's Redis channel: the publish's pool
                with acquire() as client:
                    client.ping()
            elif not self.connection.connected:
                raise ConnectionError("the broker connection is closed")
            self._broker_used_at = time.monotonic()
        return producer

    def _drop_connection(self) -> None:
        self.__dict__.pop("producer", None)
        connection = self.__dict__.pop("connection", None)
        if connection is not None:
            try:
                connection.release()
            except Exception:  # already broken; nothing else to free
                logger.debug("beat: releasing a broken broker connection failed", exc_info=True)

    @contextlib.contextmanager
    def send_batch(self, size: int):
        """The engine's send batch (:data:`~celery_anarchon.beat.engine.sends.SendBatchFn`): the
        publishes of up to ``size`` runs go through one producer and connection, in kombu's
        publish batch (``Producer.batch``: one pipelined write on a Redis broker, never retried;
        other transports publish each message at once, as without a batch).

        :raises Exception: on entering, the broker cannot be reached (nothing was published).
        :raises SendOutcomeUnknown: on leaving, the batch's write broke off: each of its
            messages may or may not be on the broker.
        """
        try:
            producer = self._live_producer()
        except Exception:
            self._drop_connection()
            raise
        batch = self._batch = _Batch(producer)
        try:
            # kombu before 5.7 has no Producer.batch: each message is published at once, as
            # kombu does itself on a transport that cannot batch
            batch_of = getattr(producer, "batch", None)
            with (batch_of(max_size=max(1, size) * BATCH_COMMANDS_PER_MESSAGE)
                  if batch_of is not None else contextlib.nullcontext()):
                yield
        except Exception as exc:
            self._drop_connection()
            if isinstance(exc, SendOutcomeUnknown):
                raise
            raise SendOutcomeUnknown(f"the batch's write broke off: {type(exc).__name__}: "
                                     f"{exc}") from exc
        finally:
            self._batch = None
        if batch.broken:
            self._drop_connection()
        self._broker_used_at = time.monotonic()

    def send(self, plan, slot_ms: int, attempt: int, token: int | None, task_id: str) -> None:
        """Publish one won run with its task id and headers (the engine's send callback).

        An error raised before kombu's ``Producer.publish`` began (Celery building the message:
        an option it refuses, a queue missing from ``task_queues``, arguments the task's
        signature refuses) wrote nothing: it is a plain failure, and it leaves the send batch to
        the other runs (only a connection error there marks the batch broken).

        :raises SendOutcomeUnknown: the publish broke off after it began: the broker may hold
            the message, so it must not be published again.
        :raises Exception: nothing was published (the broker could not be reached, Celery
            refused the message, the arguments cannot be serialized); the engine retries until
            max_late, then records ``send_failed``.
        """
        entry = plan.entry
        message = task_message(plan, namespace=self.namespace, instance_id=self.instance_id,
                               slot_ms=slot_ms, attempt=attempt, token=token, task_id=task_id)
        args, kwargs, options = message.args, message.kwargs, message.options
        batch = self._batch
        if batch is not None:
            if batch.broken:              # nothing was tried for this run: retried
                raise ConnectionError("an earlier publish of this batch broke off")
            producer = batch.producer
        else:
            try:
                producer = self._live_producer()
            except Exception:
                self._drop_connection()
                raise
        if logger.isEnabledFor(logging.INFO):
            logger.info("Scheduler: Sending due task %s (%s) slot %s attempt %d", plan.name,
                        entry.task, log_time(slot_ms), attempt)
        _PUBLISHING.began = False
        try:
            task = self.app.tasks.get(entry.task)
            if task is not None:
                task.apply_async(args, kwargs, producer=producer, **options)
            else:
                self.app.send_task(entry.task, args, kwargs, producer=producer, **options)
        except Exception as exc:
            stopped = self._stopping or _exit_requested(exc)
            if not stopped and not getattr(_PUBLISHING, "began", True):
                if _connection_error(exc, producer):   # the connection is suspect: dropped
                    if batch is not None:
                        batch.broken = True
                    else:
                        self._drop_connection()
                raise                     # before the publish: nothing was written
            if isinstance(exc, (EncodeError, SerializerNotInstalled, TypeError)) and not stopped:
                raise                     # the message could not be built: nothing was written
            if batch is not None:         # the connection is dropped when the batch ends
                batch.broken = True
            else:
                self._drop_connection()
            if stopped:
                raise SendOutcomeUnknown(f"beat was stopped during the publish ({exc!r})") from exc
            raise SendOutcomeUnknown(f"{type(exc).__name__}: {exc}") from exc
        self._broker_used_at = time.monotonic()


def _connection_error(exc: Exception, producer) -> bool:
    """Whether ``exc`` is an error of the broker connection or channel (kombu's
    ``OperationalError``, an ``OSError``, the driver's errors the transport lists in
    ``connection_errors`` / ``channel_errors``), not a refusal of the message itself. Python's
    own exception classes in those lists (the Redis transport lists ``KeyError``) are left out:
    Celery raises them for a bad message (a queue missing from ``task_queues``)."""
    errors: tuple = (OperationalError, OSError)
    try:
        connection = producer.connection
        listed = tuple(connection.connection_errors) + tuple(connection.channel_errors)
    except Exception:              # no connection to ask: the generic errors only
        listed = ()
    errors += tuple(cls for cls in listed if cls.__module__ != "builtins")
    return isinstance(exc, errors)


class _Batch:
    """The send batch in progress: its producer, and whether a publish in it broke off (the
    runs after it are not tried: retried by the engine)."""

    def __init__(self, producer) -> None:
        self.producer = producer
        self.broken = False
