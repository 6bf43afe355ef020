"""The Django app of :mod:`celery_anarchon.contrib.django_celery_beat`: add
``"celery_anarchon.contrib.django_celery_beat"`` to ``INSTALLED_APPS`` (beside
``"django_celery_beat"``) and the admin's actions and every ``save()`` that changes a row's
``enabled`` act on our store (:mod:`.control`)."""
from django.apps import AppConfig


class AnarchonDjangoCeleryBeatConfig(AppConfig):
    """Connects the row signals (:func:`.control.connect`); its ``admin.py`` registers
    :class:`~.admin.PeriodicTaskAdmin` for ``PeriodicTask``."""

    name = "celery_anarchon.contrib.django_celery_beat"
    label = "anarchon_django_celery_beat"       # django-celery-beat's label is its own
    verbose_name = "celery_anarchon on django-celery-beat"

    def ready(self) -> None:
        """Connect the ``pre_save`` of ``PeriodicTask`` (a row disabled or enabled by a save)."""
        from celery_anarchon.contrib.django_celery_beat import control
        control.connect()
