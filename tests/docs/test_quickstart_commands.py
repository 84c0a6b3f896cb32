"""docs/quickstart.md's example, run as written (tests/doc_commands.py registers it): the Keras
example on one machine, then its status from the events file (its plot command is README.md's,
run by test_readme_commands.py)."""

from __future__ import annotations

import re

import pytest

from tests.doc_commands import JOB_S, registered

pytestmark = pytest.mark.multiprocess


def test_the_quickstart(shell):
    job_command, status_command = registered("test_the_quickstart")
    job = shell(job_command)
    assert job.wait(JOB_S) == 0, job.tail()
    assert len(re.findall(r"\] epoch \d+ loss ", job.output)) >= 3, job.tail()
    status = shell(status_command)
    assert status.wait() == 0, status.tail()
    assert re.search(r"job \(events\.jsonl\): completed, generation \d+, world size 3",
                     status.output), status.output
