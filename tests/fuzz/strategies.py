"""Hypothesis strategies for every field a user or a store gives celery_anarchon, each mixing
valid values with invalid ones (wrong types, out of range, malformed text, past every limit).

The valid share is large enough that sequences of accepted calls build real store states; the
invalid share covers the classes of input that reach code assuming them away: numbers past a
datetime's range (10**400, 1e308, NaN, inf), bools where numbers go, strings that are not valid
text (lone surrogates, NUL, line breaks, bidi controls), names that are not strings, zone names
that are not zones, nesting past the recursion limit, and non-JSON values.
"""
from __future__ import annotations

import datetime
import decimal
import fractions
import json

from celery.schedules import crontab, schedule, solar
from hypothesis import strategies as st

def weighted(*pairs: tuple[int, st.SearchStrategy]) -> st.SearchStrategy:
    """One of the strategies, each drawn in proportion to its weight (``st.one_of`` flattens
    nested ``one_of``: a branch of many alternatives would outweigh the others)."""
    return st.sampled_from([s for w, s in pairs for _ in range(w)]).flatmap(lambda s: s)


# -- scalars ------------------------------------------------------------------------------------

#: integers of every magnitude, the edges named
INTS = st.one_of(
    st.integers(-3, 200_000),
    st.integers(),
    st.sampled_from([0, -1, 1, 2, 59, 60, 86_400, 2**31, 2**53, 2**53 + 1, 2**63, 2**64,
                     10**12, 10**18, 10**30]),
    st.sampled_from([400, -400]).map(lambda e: 10 ** abs(e) * (1 if e > 0 else -1)),   # 10**400
)
#: floats of every magnitude, NaN and the infinities
FLOATS = st.one_of(
    st.floats(min_value=1e-6, max_value=1e7),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 0.5, 0.0005, 1e-9, 1e-300, 5e-324, 1e15, 1e308, 1.7976931348623157e308,
                     float("nan"), float("inf"), float("-inf")]),
)
#: numbers as a user gives them: ints, floats, bools, Decimal, Fraction
NUMBERS = st.one_of(INTS, FLOATS, st.booleans(),
                    st.decimals(allow_nan=True).filter(lambda d: not d.is_snan()),
                    st.fractions())

#: characters that break or disguise text: NUL, controls, line breaks, bidi, zero width, a lone
#: surrogate, a decomposed accent, non-BMP
NASTY_CHARS = ["\x00", "\x1b", "\n", "\r", "\t", "\u2028", "\u202e", "\u200b", "\ufeff",
               "\ud800", "\udcff", "\u0301", "\U0001f600", "'", '"', "<", "&", "%", " ", "/",
               "\\", "*", ",", "-", "?", "#"]
TEXT = st.one_of(
    st.text(max_size=30),
    st.text(alphabet=st.sampled_from(NASTY_CHARS) | st.characters(), max_size=12),
    st.builds("e".__add__, st.text(alphabet=st.sampled_from(NASTY_CHARS), max_size=3)),
    st.sampled_from(["", " "]), st.sampled_from([201, 5000]).map(lambda n: "x" * n),
)
#: a short name of plain letters (most of the entries that are accepted)
PLAIN = st.text(alphabet="abcdefghij-_.0123456789", min_size=1, max_size=12)


def non_json() -> st.SearchStrategy:
    """Python values that are not JSON data."""
    return st.one_of(st.builds(object), st.binary(max_size=8), st.sets(st.integers(), max_size=2),
                     st.just(datetime.datetime(2026, 1, 1)), st.just(decimal.Decimal("1.5")),
                     st.just(fractions.Fraction(1, 3)), st.just(b"\xff"), st.complex_numbers(),
                     st.just(...), st.just(float("nan")), st.just(400).map(lambda e: 10 ** e))


SCALARS = st.one_of(st.none(), st.booleans(), INTS, FLOATS, TEXT)


def deep(depth: int, leaf=0):
    """A list nested ``depth`` levels."""
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


#: JSON-ish values: nested, large, with keys that are not strings and values that are not JSON
VALUES = st.one_of(
    st.recursive(SCALARS, lambda kids: st.lists(kids, max_size=4)
                 | st.dictionaries(st.one_of(PLAIN, TEXT), kids, max_size=4), max_leaves=12),
    st.dictionaries(st.one_of(INTS, st.none(), st.booleans(), st.tuples(st.integers())), SCALARS,
                    min_size=1, max_size=2),
    non_json(),
    st.sampled_from([98, 99, 100, 101, 150, 1100]).map(deep),
    st.just(70_000).map(lambda n: ["x" * n]),
)

# -- names, ids, reasons ---------------------------------------------------------------------------

NAMES = st.one_of(PLAIN, PLAIN, TEXT, st.sampled_from(["cfg", "celery.backend_cleanup", "CFG",
                                                         "cafe\u0301", "caf\u00e9"]),
                  st.none(), INTS, st.binary(max_size=4), st.lists(PLAIN, max_size=1))
#: names that can be dict keys (beat_schedule's)
NAME_KEYS = st.one_of(PLAIN, TEXT, st.none(), INTS, st.binary(max_size=4), st.tuples(PLAIN))
REQUEST_IDS = st.one_of(st.none(), PLAIN, TEXT, st.uuids().map(str), INTS, st.binary(max_size=4),
                        st.just("0190e1a3-7b2c-7d3e-8f00-000000000000"),      # an old UUIDv7
                        st.just("7fffffff-ffff-7fff-bfff-ffffffffffff"))      # far in the future
REASONS = st.one_of(st.just(""), PLAIN, TEXT, st.none(), INTS, st.lists(PLAIN, max_size=1))
BYS = st.one_of(st.none(), PLAIN, TEXT, INTS, st.binary(max_size=4))
TASKS = st.one_of(st.just("fuzz.t"), st.just("fuzz.t"), st.just("unknown.task"), TEXT, st.none(),
                  INTS, st.binary(max_size=4))

# -- time zones --------------------------------------------------------------------------------------

ZONES = st.one_of(
    st.sampled_from(["UTC", "Europe/Paris", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe",
                     "Pacific/Chatham", "Etc/GMT+12", "Europe/London", "America/Sao_Paulo"]),
    st.sampled_from(["Mars/Olympus", "America/New_Yrok", "", " UTC", "utc", "../etc/passwd",
                     "Europe/Paris\x00", "posixrules", "localtime", "Factory", "EST5EDT"]),
    TEXT, INTS, st.none(), st.timezones(),
)

# -- schedules ------------------------------------------------------------------------------------

CRON_FIELD = st.one_of(
    st.sampled_from(["*", "0", "*/5", "1-5", "mon-fri", "0,30", "*/120", "61", "-1", "L", "1W",
                     "5#3", "7", "sun", "jan", "*/0", "1-", ",", "1/2", "0-59/15", "60"]),
    st.integers(-2, 100).map(str), TEXT, INTS, st.booleans(), st.none(),
    st.sets(st.integers(0, 70), max_size=3),
)
CRON_TEXT = st.one_of(
    st.sampled_from(["0 3 * * *", "*/5 * * * *", "0 0 L * *", "0 0 1W * *", "0 0 * * 5#3",
                     "0 0 29 2 *", "0 0 31 4 *", "61 * * * *", "* * *", "0 25 * * *", "",
                     "@daily", "0 0 * * 1-5", "0 2 30 * *", "*/0 * * * *"]),
    st.lists(CRON_FIELD.filter(lambda f: isinstance(f, str)), min_size=1, max_size=6).map(" ".join),
    TEXT,
)


def _celerys(make):
    """Celery's constructor ``make``, or ``None`` when Celery itself refuses the fields (that is
    the user's own call, before any of ours)."""
    def build(*args, **kwargs):
        try:
            return make(*args, **kwargs)
        except Exception:   # Celery's own refusal (ValueError, ParseException, TypeError, ...)
            return None
    return build


_crontab = _celerys(crontab)


CRONTABS = st.builds(_crontab, **{k: st.one_of(st.just("*"), CRON_FIELD) for k in (
    "minute", "hour", "day_of_week", "day_of_month", "month_of_year")})
SOLARS = st.builds(_celerys(solar), st.one_of(st.sampled_from(["sunrise", "sunset", "dawn_civil", "noon",
                                                     "dusk_astronomical"]), TEXT),
                   st.one_of(st.floats(-90, 90), NUMBERS), st.one_of(st.floats(-180, 180), NUMBERS))


def _cron(expr, tz):
    """Our ``cron``; ``None`` when it refuses (its own ConfigError: any other error fails)."""
    from celery_anarchon import ConfigError, cron
    try:
        return cron(expr, tz=tz)
    except ConfigError:
        return None


_interval = _celerys(lambda value, relative: schedule(value, relative=relative))


#: what a user passes as a schedule: numbers, timedeltas, Celery's objects, ours, data, text
SCHEDULE_OBJECTS = st.one_of(
    NUMBERS,
    st.timedeltas(),
    st.sampled_from([datetime.timedelta(0), datetime.timedelta(days=999_999_999),
                     datetime.timedelta(microseconds=1), datetime.timedelta(seconds=-1)]),
    st.builds(_interval, st.one_of(st.timedeltas(), NUMBERS), st.booleans()),
    CRONTABS, SOLARS, st.builds(_cron, CRON_TEXT, st.one_of(st.none(), ZONES)),
    TEXT, st.none(), non_json(),
)
#: the data form of a schedule (``{"every": 60}``, ...), valid and not
SCHEDULE_DATA = st.one_of(
    st.builds(lambda v: {"every": v}, st.one_of(NUMBERS, TEXT, st.none())),
    st.builds(lambda f, z: {"crontab": f, **z},
              st.dictionaries(st.sampled_from(["minute", "hour", "day_of_week", "day_of_month",
                                               "month_of_year", "second", "minutes"]),
                              CRON_FIELD, max_size=5) | VALUES,
              st.one_of(st.just({}), st.builds(lambda z: {"timezone": z}, ZONES))),
    st.builds(lambda c, z: {"cron": c, **z}, st.one_of(CRON_TEXT, VALUES),
              st.one_of(st.just({}), st.builds(lambda z: {"timezone": z}, ZONES))),
    st.builds(lambda e, la, lo: {"solar": e, "lat": la, "lon": lo},
              st.sampled_from(["sunrise", "sunset", "noon", "moonrise", 1]), NUMBERS, NUMBERS),
    st.dictionaries(st.one_of(PLAIN, TEXT), VALUES, max_size=3),
)
SCHEDULES = st.one_of(st.integers(1, 100_000), st.floats(0.5, 1e6), SCHEDULE_OBJECTS,
                      SCHEDULE_DATA)
#: what beat_schedule takes as a schedule (no data form: Celery's objects and numbers)
CONFIG_SCHEDULES = st.one_of(st.integers(1, 100_000), SCHEDULE_OBJECTS)

# -- options ------------------------------------------------------------------------------------

#: ``options['anarchon']``: jitter, max_late, anchor, lease (True or its own keys), unknown keys
LEASE = st.one_of(st.booleans(), st.none(), NUMBERS, TEXT, st.fixed_dictionaries({}, optional={
    "duration": NUMBERS, "heartbeat": NUMBERS, "max_attempts": st.one_of(INTS, NUMBERS),
    "overlap": st.one_of(st.booleans(), TEXT, NUMBERS), "queue_timeout": NUMBERS,
    "durration": NUMBERS}))
#: ``start_at`` / ``end_at``: instants with and without an offset, aware and naive datetimes,
#: the edges of the years slots may lie in, and every kind of value
INSTANT_TEXTS = st.one_of(
    st.sampled_from(["2026-03-29T00:00:00Z", "2026-03-29T00:00:00+01:00", "2026-03-29T00:00:00",
                     "2026-03-29", "1969-12-31T23:59:59Z", "1970-01-01T00:00:00Z",
                     "9999-12-31T23:59:59+00:00", "9999-12-31T23:59:59-14:00",
                     "0001-01-01T00:00:00+14:00", "2026-02-30T00:00:00Z", "now", "T", ""]),
    st.datetimes(timezones=st.sampled_from([datetime.timezone.utc,
                                            datetime.timezone(datetime.timedelta(hours=-14))])
                 ).map(datetime.datetime.isoformat),
    TEXT,
)
INSTANTS = st.one_of(
    INSTANT_TEXTS, st.datetimes(), st.datetimes(timezones=st.just(datetime.timezone.utc)),
    NUMBERS, VALUES, st.none(),
)
ANARCHON = st.one_of(
    st.fixed_dictionaries({}, optional={
        "jitter": st.one_of(st.floats(0, 5), NUMBERS, TEXT), "max_late": st.one_of(
            st.floats(1, 600), NUMBERS, TEXT), "anchor": st.one_of(st.floats(0, 1e5), NUMBERS, TEXT),
        "lease": LEASE, "jiter": NUMBERS, "misfire": VALUES, "start_at": INSTANTS,
        "end_at": INSTANTS, "end": INSTANTS}),
    VALUES, st.none(),
)
#: ``apply_async`` options
APPLY_OPTIONS = st.one_of(
    st.fixed_dictionaries({}, optional={
        "queue": st.one_of(PLAIN, TEXT, VALUES), "priority": st.one_of(st.integers(0, 9), NUMBERS, TEXT),
        "expires": st.one_of(st.floats(1, 1e5), NUMBERS, TEXT, st.just("2030-01-01T00:00:00")),
        "countdown": NUMBERS, "eta": st.one_of(TEXT, st.just("2030-01-01T00:00:00")),
        "headers": st.one_of(st.dictionaries(PLAIN, SCALARS, max_size=2), VALUES),
        "delivery_mode": st.one_of(st.sampled_from([1, 2, "persistent", "transient"]), VALUES),
        "routing_key": TEXT, "exchange": st.one_of(TEXT, VALUES), "serializer": st.one_of(
            st.sampled_from(["json", "pickle", "yaml", "msgpack"]), TEXT),
        "compression": TEXT, "max_late": NUMBERS, "jitter": NUMBERS, "link": VALUES,
        "anarchon": ANARCHON, "task_id": TEXT, "unknown_option": VALUES}),
    VALUES, st.none(),
)
ARGS = st.one_of(st.lists(SCALARS, max_size=3), st.tuples(SCALARS), VALUES, st.none())
KWARGS = st.one_of(st.dictionaries(PLAIN, SCALARS, max_size=3), VALUES, st.none())

# -- a whole definition as data (a store entry), and its text -------------------------------------

DEFINITIONS = st.one_of(
    st.fixed_dictionaries({"task": TASKS, "schedule": SCHEDULE_DATA}, optional={
        "args": ARGS, "kwargs": KWARGS, "options": APPLY_OPTIONS, "anarchon": ANARCHON,
        "version": VALUES, "unknown": VALUES}),
    st.fixed_dictionaries({"task": st.just("fuzz.t"), "schedule": st.builds(
        lambda v: {"every": v}, st.integers(1, 10**6))}),
    VALUES,
)


def _dump(value) -> str:
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=True)
    except (TypeError, ValueError, RecursionError):
        return repr(value)


#: a definition's text as another version, a hand edit or a restore may leave it
DEFINITION_TEXTS = st.one_of(
    DEFINITIONS.map(_dump),
    st.sampled_from(["", "{", "null", "[]", "1", '"x"', '{"task":"fuzz.t"}', "{'task': 't'}",
                     '{"task":"fuzz.t","schedule":{"every":NaN}}',
                     '{"task":"fuzz.t","schedule":{"every":1e999}}',
                     '{"task":"fuzz.t","schedule":{"every":60},"schedule":{"every":1}}',
                     '{"task":"fuzz.t","schedule":{"every":60}}\x00']),
    st.just(5000).map(lambda n: "[" * n + "]" * n),
    st.just(5000).map(lambda n: '{"task":"fuzz.t","schedule":{"every":' + "9" * n + "}}"),
    TEXT,
)

# -- the command line -----------------------------------------------------------------------------

NUMBER_TEXTS = st.one_of(NUMBERS.map(str), st.sampled_from(
    ["1e400", "-0", "0x10", "1_000", " 5", "nan", "inf", "-inf", "1e-400"]), st.just(200).map(lambda n: "10" * n), TEXT)
DURATION_TEXTS = st.one_of(
    st.builds(lambda n, u: f"{n}{u}", st.one_of(INTS, FLOATS), st.sampled_from(
        ["", "s", "m", "h", "d", "w", "ms", "y"])),
    st.sampled_from(["2026-03-29T00:00:00Z", "2026-03-29T00:00:00+25:00", "9999-12-31T23:59:59Z",
                     "0001-01-01T00:00:00Z", "2026-02-30T00:00:00Z", "now", "1h30m", "-1h",
                     "1e400h", "99999999999999999999d", "2026-03-29", "T", "10000-01-01T00:00:00Z"]),
    TEXT,
)
JSON_TEXTS = st.one_of(VALUES.map(_dump), DEFINITION_TEXTS, TEXT)


@st.composite
def cli_write_args(draw, verb: str, name) -> list[str]:
    """The arguments of ``add`` or ``update`` NAME: flags drawn from every kind of text."""
    args = [verb, name]
    for flag, values in (("--task", st.one_of(st.just("fuzz.t"), TEXT)),
                         ("--every", st.one_of(st.integers(1, 10**5).map(str), NUMBER_TEXTS)),
                         ("--crontab", st.one_of(st.lists(CRON_FIELD.map(str), min_size=5,
                                                          max_size=5).map(" ".join), TEXT)),
                         ("--cron", CRON_TEXT), ("--timezone", ZONES.map(str)),
                         ("--args", JSON_TEXTS), ("--kwargs", JSON_TEXTS), ("--options", JSON_TEXTS),
                         ("--anarchon", JSON_TEXTS), ("--json-definition", JSON_TEXTS),
                         ("--start-at", INSTANT_TEXTS), ("--end-at", INSTANT_TEXTS),
                         ("--by", TEXT)):
        chance = 0.9 if flag in ("--task", "--every") else 0.15
        if draw(st.floats(0, 1)) < chance:
            args += [flag, draw(values)]
    if draw(st.booleans()):
        args.append("--no-check-task")
    if draw(st.booleans()):
        args.append("--json")
    return args


# -- beat_schedule ---------------------------------------------------------------------------------

#: a beat_schedule item of the shape Celery takes (its parts fuzzed)
CONFIG_ITEM_DICTS = st.fixed_dictionaries(
    {"task": weighted((5, st.just("fuzz.t")), (1, TASKS)), "schedule": CONFIG_SCHEDULES},
    optional={"args": st.one_of(st.lists(SCALARS, max_size=3), st.tuples(SCALARS)),
              "kwargs": KWARGS, "relative": VALUES, "schedulee": VALUES, "name": VALUES,
              "options": st.one_of(APPLY_OPTIONS.filter(lambda o: isinstance(o, dict)),
                                   st.builds(lambda a: {"anarchon": a}, ANARCHON))})
CONFIG_ITEMS = st.one_of(
    CONFIG_ITEM_DICTS, CONFIG_ITEM_DICTS,
    st.fixed_dictionaries({"task": st.just("fuzz.t"), "schedule": st.integers(1, 10**5)}),
    VALUES,
)
BEAT_SCHEDULES = weighted(
    (4, st.dictionaries(st.one_of(PLAIN, st.just("cfg")), CONFIG_ITEM_DICTS, max_size=4)),
    (2, st.dictionaries(st.one_of(PLAIN, TEXT), CONFIG_ITEM_DICTS, max_size=4)),
    (1, st.dictionaries(weighted((3, PLAIN), (1, NAME_KEYS)), CONFIG_ITEMS, max_size=4)),
    (1, VALUES),
)
