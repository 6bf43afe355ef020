"""The status page: ``celery -A proj anarchon web [--host H] [--port P] [--allow-actions]``.

One server-rendered HTML page (``GET /``) and the same data as JSON (``GET /api/status``): the
data of :func:`celery_anarchon.operate.overview.overview`, read from the app's store on every request.
Each entry has a page of its own (``GET /entries/<name>``, JSON ``GET /api/entries/<name>``;
``?before=<slot ms>&limit=N`` pages its history): the data of
:func:`celery_anarchon.operate.entry_detail.entry_detail`, read only (no action there).
With ``allow_actions``, ``POST /api/entries/<name>/pause``, ``.../resume`` and ``.../run-now``
change the schedule through :class:`celery_anarchon.operate.schedules.Schedules`, and
``POST /api/bulk/pause`` and ``/api/bulk/resume`` do so for each ``entry`` field of the form (one
answer per entry: one entry refused does not stop the others), each with the token in the
``X-Anarchon-Token`` header or a ``token`` form field (compared with :func:`hmac.compare_digest`);
without it the page has no buttons and those endpoints answer 403.

Security (docs/production.md "Status page"): it binds to 127.0.0.1 unless told otherwise, and on
a loopback address answers only requests addressed to a loopback name (a page of another site
cannot reach it through DNS rebinding); the store's URL is shown with its password masked
(``store.safe_url``); every value is escaped (entry names are user data: Jinja2 with autoescape,
and the page's script reads names from escaped attributes only); the page forbids framing and
scripts other than its own. For remote use, put it behind your proxy and its authentication.

Starlette, uvicorn and Jinja2 come with the ``web`` extra (``pip install celery-anarchon[web]``).
The page's HTML is rendered by :mod:`celery_anarchon.operate.page`.
"""
from __future__ import annotations

import hmac
import os
import secrets
import socket
import threading
from collections.abc import Callable
from urllib.parse import parse_qs

from celery_anarchon.errors import ConfigError, StoreError, StoreNotReached, UnknownEntry
from celery_anarchon.operate.page import (
    TOKEN_ENV, TOKEN_FIELD, TOKEN_HEADER, missing_extra, refresh_interval, render_entry,
    render_page,
)

#: where the page listens unless told otherwise
DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 8765
#: the host names a page bound to a loopback address answers to
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
#: the largest form body an action reads, bytes; a bulk action's (its entries' names)
MAX_FORM_BYTES, MAX_BULK_FORM_BYTES = 16_384, 1_048_576
#: the actions, by the last part of their path; those of ``/api/bulk/<action>``
ACTIONS, BULK_ACTIONS = ("pause", "resume", "run-now"), ("pause", "resume")
#: the most entries one bulk action names (the most rows a page shows: ``?per_page=1000``)
MAX_BULK_ENTRIES = 1000
#: a shorter actions' token is accepted with a warning at start-up
MIN_TOKEN_CHARS = 16


def token_warning(token: str | None, generated: bool) -> str | None:
    """The start-up warning of an actions' token shorter than :data:`MIN_TOKEN_CHARS`, or
    ``None`` (no token, a generated one, or a long enough one)."""
    if token is None or generated or len(token) >= MIN_TOKEN_CHARS:
        return None
    return (f"anarchon web: warning: the actions' token has {len(token)} characters, fewer than "
            f"{MIN_TOKEN_CHARS}: it can be guessed; fix: give a long random value (or none: the "
            "page makes one)")


def resolve_token(allow_actions: bool, token: str | None) -> tuple[str | None, bool]:
    """The actions' token: ``token``, else ``$ANARCHON_WEB_TOKEN``, else (actions allowed) a new
    random one.

    :returns: ``(token, generated)``; ``(None, False)`` when actions are off.
    :raises ConfigError: a token that is empty or whitespace only.
    """
    if not allow_actions:
        return None, False
    given = token if token is not None else os.environ.get(TOKEN_ENV)
    if given is None:
        return secrets.token_urlsafe(24), True
    if not given.strip():
        raise ConfigError(f"--token (or {TOKEN_ENV}) is empty; fix: give a long random value, "
                          "or none and the page makes one and prints it")
    return given, False


def token_matches(expected: str | None, given: str | None) -> bool:
    """True when actions are on and ``given`` is the token (constant time)."""
    if expected is None or given is None:
        return False
    return hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))


class StatusSource:
    """The app's store, opened once for the page's process, and what the page reads and does.

    Calls are serialized (one lock): the endpoints run in a thread pool, the store's connection
    is shared.

    :param app: the Celery app (its ``anarchon_*`` settings and ``beat_schedule``).
    :param runs: the runs per entry the page shows (the strip).
    :raises ConfigError: a bad ``anarchon_*`` setting or store URL.
    """

    def __init__(self, app, *, runs: int = 20) -> None:
        from celery_anarchon.settings import Settings, make_instance_id, open_app_store

        self.app, self.runs = app, runs
        self.settings = Settings.from_app(app)
        self.store = open_app_store(self.settings, instance_id="web:" + make_instance_id())
        self._lock = threading.Lock()

    def status(self) -> dict:
        """The status data (the JSON of ``/api/status``; keys: :func:`overview.overview`)."""
        from celery_anarchon.operate.overview import overview
        with self._lock:
            return overview(self.app, self.store, self.settings, runs=self.runs)

    def act(self, action: str, name: str, fields: dict[str, str], by: str) -> dict:
        """Pause, resume or run ``name`` now; returns the entry (or the request) as JSON values.

        :param fields: ``reason`` (pause), ``request_id`` (run-now: the page makes one per
            click; default a new one of the store's clock).
        :returns: run-now: the request (:class:`~celery_anarchon.stores.entry_store.RunRequest`
            as JSON values; ``created`` False: made before, no new run).
        :raises UnknownEntry: no entry of that name.
        :raises ConfigError: the store cannot hold pauses (NATS, RabbitMQ), or bad input
            (``RequestRefused``: a request id the store can no longer vouch for).
        :raises StoreError: the store is unreachable (the outcome is unknown; retry; a run-now's
            carries its ``request_id``, to repeat).
        """
        from celery_anarchon.operate.schedules import Schedules
        with self._lock, Schedules(self.app, store=self.store, by=by) as s:
            return _act(s, action, name, fields, by)

    def act_many(self, action: str, names: list[str], fields: dict[str, str],
                 by: str) -> list[dict]:
        """Pause or resume each of ``names``, in order, each on its own: one refused (an unknown
        entry, a store that fails) does not stop the others.

        :param fields: ``reason`` (pause): the same for every entry.
        :returns: one answer per name, in order: ``{"entry", "status": 200, "result"}`` (the
            entry as JSON values), or ``{"entry", "status", "error"}`` with the status and error
            of ``POST /api/entries/<name>/<action>`` (:func:`failure`).
        :raises ConfigError: the store cannot hold pauses (NATS, RabbitMQ).
        """
        from celery_anarchon.operate.schedules import Schedules
        answers = []
        with self._lock, Schedules(self.app, store=self.store, by=by) as s:
            for name in names:
                try:
                    answers.append({"entry": name, "status": 200,
                                    "result": _act(s, action, name, fields, by)})
                except (StoreError, ConfigError) as exc:   # UnknownEntry is a ConfigError
                    status, body = failure(exc)
                    answers.append({"entry": name, "status": status, **body})
        return answers

    def entry(self, name: str, before: str | None, limit: str | None) -> dict:
        """The entry page's data of ``name``
        (:func:`~celery_anarchon.operate.entry_detail.entry_detail`; ``before``, ``limit``: its
        history page).

        :raises UnknownEntry: no entry of that name.
        :raises StoreError: the store is unreachable.
        """
        from celery_anarchon.operate.entry_detail import entry_detail
        with self._lock:
            return entry_detail(self.app, self.store, self.settings, name, before=before,
                                limit=limit)

    def close(self) -> None:
        """Close the store."""
        self.store.close()


def _act(s, action: str, name: str, fields: dict[str, str], by: str) -> dict:
    """One action of :meth:`StatusSource.act` on the schedules ``s``."""
    import dataclasses
    if action == "pause":
        return s.pause(name, fields.get("reason", ""), by=by).as_json()
    if action == "resume":
        return s.resume(name, by=by).as_json()
    request_id = fields.get("request_id") or s.new_request_id()
    return dataclasses.asdict(s.run_now(name, request_id, by=by))


def failure(exc: Exception) -> tuple[int, dict]:
    """The HTTP status and JSON body of an action that raised ``exc``: 404 an unknown entry, 400
    bad input or a store that cannot hold pauses, 503 a store that is unreachable (the outcome is
    unknown; a run-now's body carries its ``request_id``, to repeat; a store not reached before
    any write, :class:`StoreNotReached`: nothing was changed).

    :param exc: an :class:`UnknownEntry`, :class:`ConfigError` or :class:`StoreError`.
    """
    if isinstance(exc, UnknownEntry):
        return 404, {"error": str(exc)}
    if isinstance(exc, ConfigError):
        return 400, {"error": str(exc)}
    if isinstance(exc, StoreNotReached):    # before any write: its message says so, and the fix
        return 503, {"error": str(exc)}
    request_id = getattr(exc, "request_id", None)
    if request_id is None:
        return 503, {"error": f"{exc} (the outcome is unknown: retry)"}
    return 503, {"error": f"{exc}; the outcome of run-now request {request_id} is unknown: "
                          f"repeat it with request_id={request_id} (one run, never two).",
                 "request_id": request_id}


def answer(action: str, name: str, done: dict) -> dict:
    """The JSON body of an action done: ``{"action", "entry", "result"}``; a run-now's adds
    ``already_requested`` (its request id was requested before: no new run) and ``message``
    (what happened, in words)."""
    body = {"action": action, "entry": name, "result": done}
    if action == "run-now":
        from celery_anarchon._util import iso
        again = not done.get("created", True)
        body["already_requested"] = again
        body["message"] = (
            f"run-now {name}: request {done['request_id']} was already requested at "
            f"{iso(done['requested_ms'])} by {done['by']}: no new run (its slot "
            f"{iso(done['slot_ms'])})" if again else
            f"run-now {name}: new request {done['request_id']}, slot {iso(done['slot_ms'])}")
    return body


#: the route convertor of an entry's name in a path: any text, line breaks too (Starlette's
#: ``path`` is ``.*``, which stops at one: such a name answered 404 instead of the name's rule)
ANY_TEXT = "anarchon_any_text"


def _register_any_text() -> None:
    """Register :data:`ANY_TEXT` with Starlette (once; its registry is global)."""
    from starlette.convertors import CONVERTOR_TYPES, PathConvertor, register_url_convertor
    if ANY_TEXT not in CONVERTOR_TYPES:
        class AnyText(PathConvertor):
            regex = r"[\s\S]*"
        register_url_convertor(ANY_TEXT, AnyText())


def create_app(source: StatusSource, *, token: str | None = None, refresh_s: float = 5.0,
               allowed_hosts: list[str] | None = None):
    """The Starlette application of the page.

    :param source: where the data comes from and where the actions go.
    :param token: the actions' token; ``None``: actions are off (no buttons, POST answers 403).
    :param refresh_s: how often the page reloads its data, seconds (0: never; ``?refresh=N``
        overrides it per page).
    :param allowed_hosts: the host names a request may be addressed to (``None``: any; see
        :data:`LOOPBACK_NAMES`).
    :raises ConfigError: the web extra is not installed.
    """
    try:
        from starlette.applications import Starlette
        from starlette.middleware import Middleware
        from starlette.middleware.trustedhost import TrustedHostMiddleware
        from starlette import responses
        from starlette.routing import Route
    except ImportError as exc:
        raise missing_extra() from exc
    HTMLResponse, JSONResponse = _escaped_responses(responses)

    actions = token is not None

    def headers(nonce: str | None = None) -> dict[str, str]:
        script = f"'nonce-{nonce}'" if nonce else "'none'"
        return {"Cache-Control": "no-store", "X-Frame-Options": "DENY",
                "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
                "Content-Security-Policy": (
                    f"default-src 'none'; script-src {script}; style-src 'unsafe-inline'; "
                    "connect-src 'self'; img-src 'self' data:; form-action 'self'; "
                    "base-uri 'none'; frame-ancestors 'none'")}

    def read(request) -> tuple[dict | None, str | None]:
        try:
            return source.status(), None
        except (StoreError, ConfigError) as exc:
            return None, str(exc)

    def index(request):
        data, error = read(request)
        refresh = refresh_interval(request.query_params.get("refresh"), refresh_s)
        nonce = secrets.token_urlsafe(16)
        q = request.query_params
        html = render_page(data, error=error, actions=actions, nonce=nonce, refresh_s=refresh,
                           query=q.get("q"), page=q.get("page"), per_page=q.get("per_page"),
                           params={k: q[k] for k in ("q", "per_page", "refresh") if k in q})
        return HTMLResponse(html, status_code=200 if data is not None else 503,
                            headers=headers(nonce))

    def read_entry(request) -> tuple[dict | None, int, str | None]:
        q = request.query_params
        try:
            return source.entry(request.path_params["name"], q.get("before"), q.get("limit")), \
                200, None
        except UnknownEntry as exc:
            return None, 404, str(exc)
        except (StoreError, ConfigError) as exc:
            return None, 503, str(exc)

    def entry_page(request):
        data, status, error = read_entry(request)
        html = render_entry(data, name=request.path_params["name"], error=error,
                            params=dict(request.query_params))
        return HTMLResponse(html, status_code=status, headers=headers())

    def api_entry(request):
        data, status, error = read_entry(request)
        if data is None:
            return _error(JSONResponse, status, error)
        return JSONResponse(data, headers=headers())

    def api_status(request):
        data, error = read(request)
        if data is None:
            return JSONResponse({"error": error}, status_code=503, headers=headers())
        return JSONResponse(data, headers=headers())

    def refused(request, fields: dict[str, str]):
        """The 403 answer of an action when actions are off or the token is wrong, or None."""
        if not actions:
            return _error(JSONResponse, 403, "actions are off: start the page with "
                          "--allow-actions (and a token) to pause, resume or run entries")
        given = request.headers.get(TOKEN_HEADER) or fields.get(TOKEN_FIELD)
        if not token_matches(token, given):
            return _error(JSONResponse, 403, f"wrong or missing token: send it in the "
                          f"{TOKEN_HEADER} header or a {TOKEN_FIELD!r} form field")
        return None

    def changed_by(request, fields: dict[str, str]) -> str:
        who = request.client.host if request.client else "?"
        return fields.get("by") or f"web:{who}@{socket.gethostname()}"

    async def act(request):
        name, action = request.path_params["name"], request.url.path.rsplit("/", 1)[1]
        if not actions:
            return refused(request, {})
        fields = {k: v[0] for k, v in (await _form(request)).items()}
        if (no := refused(request, fields)) is not None:
            return no
        from starlette.concurrency import run_in_threadpool
        try:
            done = await run_in_threadpool(source.act, action, name, fields,
                                           changed_by(request, fields))
        except (StoreError, ConfigError) as exc:        # UnknownEntry is a ConfigError
            status, body = failure(exc)
            return JSONResponse(body, status_code=status, headers=headers())
        return JSONResponse(answer(action, name, done), headers=headers())

    async def act_many(request):
        action = request.path_params["action"]
        if action not in BULK_ACTIONS:
            return api_not_found(request)
        if not actions:
            return refused(request, {})
        values = await _form(request, MAX_BULK_FORM_BYTES)
        fields = {k: v[0] for k, v in values.items()}
        if (no := refused(request, fields)) is not None:
            return no
        names = values.get("entry", [])
        if not names or len(names) > MAX_BULK_ENTRIES:
            return _error(JSONResponse, 400, f"{action} of the selected entries: give 1 to "
                          f"{MAX_BULK_ENTRIES} entries, one 'entry' form field each (given: "
                          f"{len(names)}), in a form of at most {MAX_BULK_FORM_BYTES} bytes")
        from starlette.concurrency import run_in_threadpool
        try:
            results = await run_in_threadpool(source.act_many, action, names, fields,
                                              changed_by(request, fields))
        except (StoreError, ConfigError) as exc:
            status, body = failure(exc)
            return JSONResponse(body, status_code=status, headers=headers())
        done = sum(1 for r in results if r["status"] == 200)
        return JSONResponse({"action": action, "results": results, "done": done,
                             "failed": len(results) - done}, headers=headers())

    def _error(response, status: int, message: str):
        return response({"error": message}, status_code=status, headers=headers())

    def api_not_found(request):
        return _error(JSONResponse, 404, f"no such API route: {request.method} "
                      f"{request.url.path}; the routes are GET /api/status, GET "
                      "/api/entries/<name> and POST /api/entries/<name>/pause, /resume, "
                      "/run-now, /api/bulk/pause, /resume")

    _register_any_text()
    routes = [Route("/", index), Route("/api/status", api_status),
              Route(f"/entries/{{name:{ANY_TEXT}}}", entry_page),
              Route(f"/api/entries/{{name:{ANY_TEXT}}}", api_entry)]
    routes += [Route(f"/api/entries/{{name:{ANY_TEXT}}}/{a}", act, methods=["POST"])
               for a in ACTIONS]
    routes += [Route("/api/bulk/{action}", act_many, methods=["POST"])]
    routes += [Route(f"/api/{{rest:{ANY_TEXT}}}", api_not_found,
                     methods=["GET", "POST", "PUT", "DELETE", "PATCH"])]
    middleware = ([Middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts))]
                  if allowed_hosts else [])
    return Starlette(routes=routes, middleware=middleware)


def _escaped_responses(responses) -> tuple[type, type]:
    """Starlette's HTML and JSON responses, writing text UTF-8 cannot encode escaped
    (``e\\ud800``): a lone surrogate in a ``beat_schedule`` name or task, or in a stored
    definition read with ``surrogateescape``, is shown on the page instead of failing the answer
    with UnicodeEncodeError (a 500)."""
    import json

    class HTMLResponse(responses.HTMLResponse):
        def render(self, content) -> bytes:
            if isinstance(content, str):
                return content.encode(self.charset, "backslashreplace")
            return super().render(content)

    class JSONResponse(responses.JSONResponse):
        def render(self, content) -> bytes:   # Starlette's, but backslashreplace
            return json.dumps(content, ensure_ascii=False, allow_nan=False, indent=None,
                              separators=(",", ":")).encode("utf-8", "backslashreplace")

    return HTMLResponse, JSONResponse



async def _form(request, limit: int = MAX_FORM_BYTES) -> dict[str, list[str]]:
    """The fields of an ``application/x-www-form-urlencoded`` body of at most ``limit`` bytes
    (every value of each, in order); other bodies, or a longer one, give none."""
    if not request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        return {}
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            return {}
    return parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)


def loopback(host: str) -> bool:
    """True for an address only this machine reaches (127.0.0.0/8, ::1, localhost)."""
    return host in LOOPBACK_NAMES or host.startswith("127.")


def check_address(host: str, port: int) -> None:
    """Fail now, with the fix, when the page could not listen on ``host``:``port``.

    :raises ConfigError: the port is taken, or the address is not one of this machine.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, _, _, _, address = infos[0]
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as exc:
        raise ConfigError(f"the status page cannot listen on --host {host} --port {port} "
                          f"({exc.strerror or exc}); fix: pick a free port with --port, or an "
                          "address of this machine with --host") from exc


def serve(app, *, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, allow_actions: bool = False,
          token: str | None = None, runs: int = 20, refresh_s: float = 5.0,
          echo: Callable[[str], None] = print) -> None:
    """Serve the page until interrupted (uvicorn, one process).

    :param host: the address to bind (default 127.0.0.1; ``0.0.0.0`` for every interface).
    :param port: the TCP port.
    :param allow_actions: render the buttons and accept the POST actions (with the token).
    :param token: the actions' token (default ``$ANARCHON_WEB_TOKEN``, else a new one, printed
        once here).
    :param runs: the runs per entry in the strip.
    :raises ConfigError: the web extra is missing, a bad setting, an empty token, or an address
        the page cannot listen on (:func:`check_address`).
    """
    try:
        import uvicorn
    except ImportError as exc:
        raise missing_extra() from exc
    token, generated = resolve_token(allow_actions, token)
    check_address(host, port)
    source = StatusSource(app, runs=runs)
    try:
        site = create_app(source, token=token, refresh_s=refresh_s,
                          allowed_hosts=[*LOOPBACK_NAMES, "[::1]", host] if loopback(host) else None)
        shown = f"[{host}]" if ":" in host else host
        echo(f"anarchon web: http://{shown}:{port}/ (store {source.store.safe_url}, "
             f"actions {'allowed' if allow_actions else 'off'})")
        warning = token_warning(token, generated)
        if warning:
            echo(warning)
        if generated:
            echo(f"anarchon web: the actions' token (shown once; pass --token or {TOKEN_ENV} "
                 f"to choose one): {token}")
        if not loopback(host):
            echo(f"anarchon web: listening on {host}, not only this machine: put it behind your "
                 "proxy and its authentication")
        uvicorn.run(site, host=host, port=port, log_level="warning", access_log=False)
    finally:
        source.close()

