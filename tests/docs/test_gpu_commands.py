"""docs/gpu.md's check of a machine's setup, run as written (tests/doc_commands.py registers
it): here, without a GPU, two workers of 2 logical CPU devices each; the chief is killed, a
newcomer joins, every replica's copies and the weights are compared."""

from __future__ import annotations

import re

import pytest

from tests.doc_commands import JOB_S, registered

pytestmark = pytest.mark.multiprocess


def test_the_device_check(shell):
    [command] = registered("test_the_device_check")
    check = shell(command)
    assert check.wait(JOB_S) == 0, check.tail()
    assert re.search(r"ran on: node \d+: 2 device\(s\) CPU:0, CPU:1 \(no GPU", check.output), \
        check.output
    assert re.search(r"killed the chief \(node \d+\) at step \d+; node \d+ joined", check.output)
    assert "PASS: 2 workers" in check.output, check.output
