"""What the RabbitMQ tests ask the broker's own tool, ``rabbitmqctl`` (AMQP cannot list queues
or set policies): the store's production code never runs a program.

Without ``rabbitmqctl`` on this host a test skips on a developer machine and fails under
``CI=true`` (tests/conftest.py ``IN_CI``), like a missing server.
"""
from __future__ import annotations

import shutil
import subprocess

import pytest

import conftest


def need_rabbitmqctl() -> str:
    """The path of ``rabbitmqctl``; skips the test without it, or fails it under CI."""
    tool = shutil.which("rabbitmqctl")
    if tool is None:
        message = "rabbitmqctl is not on this host (the broker's CLI: it lists queues and sets policies)"
        if conftest.IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    return tool


def rabbitmqctl(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``rabbitmqctl args`` (60 s at most)."""
    return subprocess.run([need_rabbitmqctl(), *args], capture_output=True, text=True, timeout=60,
                          check=check)


def queue_names(vhost: str) -> list[str]:
    """Every queue name of ``vhost`` (``rabbitmqctl list_queues``): the lister that
    ``RabbitMQStore._forget_everything`` takes."""
    listed = rabbitmqctl("list_queues", "-q", "--no-table-headers", "-p", vhost, "name")
    return [line.strip() for line in listed.stdout.splitlines() if line.strip()]
