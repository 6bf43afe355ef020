"""The ``celery anarchon`` entry point (setup.cfg ``celery.commands``): the command group of
:mod:`celery_anarchon.operate.cli`, and the worker side's safety net.

Celery imports every ``celery.commands`` entry point on every ``celery`` run, ``celery worker``
included, so loading this module connects :func:`celery_anarchon.worker.leases.connect_command_signals`:
it covers every worker the command starts. This glue is the one place where the operator's wing
and the worker's wing meet; neither imports the other.
"""
from celery_anarchon.operate.cli import anarchon
from celery_anarchon.worker import leases

__all__ = ["anarchon"]

# the safety net for workers this command starts (see leases.connect_command_signals)
leases.connect_command_signals()
