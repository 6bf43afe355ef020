"""Schedulers on other projects' schedules: each module is an optional extra, imported only when
named (``celery_anarchon.contrib.django_celery_beat``: ``pip install celery-anarchon[django]``)."""
