"""django-celery-beat's ``PeriodicTaskAdmin``, its actions meaning the same on every host:
"Disable" / "Enable" / "Toggle" pause and resume the rows' entries in our store (held inside
the atomic claim on every instance), and "Run selected tasks" is one run-now request per row
and click, each recorded with the admin user (:mod:`.control`). Registered in place of
django-celery-beat's own when ``"celery_anarchon.contrib.django_celery_beat"`` is in
``INSTALLED_APPS``.
"""
from __future__ import annotations

import uuid

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django_celery_beat import admin as dcb_admin
from django_celery_beat.models import PeriodicTask

from celery_anarchon.contrib.django_celery_beat import control
from celery_anarchon.errors import ConfigError, StoreError

#: the field of the action form that tells one click from another (:class:`ActionForm`)
CLICK_FIELD = "anarchon_click"
#: what the store or our checks raise: shown to the admin user as an error message
_STORE_ERRORS = (ConfigError, StoreError, OSError)


class ActionForm(helpers.ActionForm):
    """The admin's action form with a hidden id made afresh each time the change list is shown:
    the same form submitted twice (a double click, a resent POST) carries the same id."""

    anarchon_click = forms.CharField(widget=forms.HiddenInput, required=False,
                                     initial=lambda: uuid.uuid4().hex)


def click_id(request) -> str:
    """The id of this click: the form's :data:`CLICK_FIELD` (ASCII letters and digits, at most
    64), else a new one (a POST made without the form: one request per POST)."""
    given = request.POST.get(CLICK_FIELD, "")
    if given and len(given) <= 64 and given.isascii() and given.isalnum():
        return given
    return uuid.uuid4().hex


class PeriodicTaskAdmin(dcb_admin.PeriodicTaskAdmin):
    """django-celery-beat's admin of ``PeriodicTask``, whose actions act on our store first:
    a store that cannot be reached leaves the rows as they were, with an error message. While
    the project's app does not run our Scheduler (:func:`.control.celery_app`), they are
    django-celery-beat's own."""

    action_form = ActionForm

    def _store_failed(self, request, what: str, exc: Exception) -> None:
        self.message_user(request, f"celery_anarchon: {what} failed, the rows are left as they "
                          f"were: {exc}", level=messages.ERROR)

    @admin.action(description=dcb_admin.PeriodicTaskAdmin.disable_tasks.short_description)
    def disable_tasks(self, request, queryset):
        """Pause every selected row in the store, then disable it (django-celery-beat's
        action): from the moment this returns, no instance sends a run of it."""
        app = control.celery_app()
        if app is None:
            return super().disable_tasks(request, queryset)
        try:
            control.pause_rows(app, queryset.values_list("name", flat=True),
                               by=control.admin_by(request.user), reason=control.REASON)
        except _STORE_ERRORS as exc:
            return self._store_failed(request, "pausing the selected tasks", exc)
        return super().disable_tasks(request, queryset)

    @admin.action(description=dcb_admin.PeriodicTaskAdmin.enable_tasks.short_description)
    def enable_tasks(self, request, queryset):
        """Enable every selected row (django-celery-beat's action), then resume it in the
        store."""
        names = list(queryset.values_list("name", flat=True))
        response = super().enable_tasks(request, queryset)
        app = control.celery_app()
        if app is None:
            return response
        try:
            control.resume_rows(app, names, by=control.admin_by(request.user))
        except _STORE_ERRORS as exc:
            self.message_user(request, f"celery_anarchon: resuming the selected tasks failed: "
                              f"{exc}; they are enabled but paused: enable them again",
                              level=messages.ERROR)
        return response

    @admin.action(description=dcb_admin.PeriodicTaskAdmin.toggle_tasks.short_description)
    def toggle_tasks(self, request, queryset):
        """Disable the enabled rows and enable the disabled ones, as the two actions above."""
        rows = queryset.model.objects
        on = list(queryset.filter(enabled=True).values_list("pk", flat=True))
        off = list(queryset.filter(enabled=False).values_list("pk", flat=True))
        self.disable_tasks(request, rows.filter(pk__in=on))
        return self.enable_tasks(request, rows.filter(pk__in=off))

    @admin.action(description=dcb_admin.PeriodicTaskAdmin.run_tasks.short_description)
    def run_tasks(self, request, queryset):
        """One run-now request per selected row and click, claimed like any run by the
        instances (instead of a send from the web process): the same click submitted twice runs
        each row once."""
        app = control.celery_app()
        if app is None:
            return super().run_tasks(request, queryset)
        names = list(queryset.values_list("name", flat=True))
        try:
            done = control.run_rows(app, names, click=click_id(request),
                                    by=control.admin_by(request.user))
        except _STORE_ERRORS as exc:
            return self.message_user(request, f"celery_anarchon: run now failed: {exc}",
                                     level=messages.ERROR)
        new = sum(1 for r in done if r.created)
        self.message_user(request, f"{new} run-now request{'s' if new != 1 else ''} made "
                          f"({len(done) - new} made before by this click)")

    def save_model(self, request, obj, form, change) -> None:
        """Save the row, a change of ``enabled`` recorded with the admin user
        (:func:`.control.before_save`)."""
        with control.acting(control.admin_by(request.user)):
            super().save_model(request, obj, form, change)


if admin.site.is_registered(PeriodicTask):
    admin.site.unregister(PeriodicTask)
admin.site.register(PeriodicTask, PeriodicTaskAdmin)
