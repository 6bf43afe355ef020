"""Zone names as users give them (``timezone``, a crontab's or cron's ``tz``): a name that no
zone has is an unknown zone, whatever the zone database makes of it (with the ``tzdata`` package
installed, which django-celery-beat brings, a name too long for a file name raises ``OSError``
from its look-up)."""
from __future__ import annotations

import pytest

from celery_anarchon import ConfigError
from celery_anarchon.schedule.zones import iana_zone, resolve_zone


@pytest.mark.parametrize("name", ["x" * 5000, "Europe/" + "y" * 300, "Nowhere/Atlantis"])
def test_a_name_no_zone_has_is_unknown(name):
    assert iana_zone(name) is None
    with pytest.raises(ConfigError) as caught:
        resolve_zone(name, "app: timezone")
    assert str(caught.value).startswith(f"app: timezone: unknown time zone {name!r}")


def test_an_iana_name_is_its_zone():
    assert str(iana_zone("Europe/Paris")) == "Europe/Paris"
