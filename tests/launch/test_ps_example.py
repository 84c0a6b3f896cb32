"""The parameter-server example run with the commands its docs give (docs/ps.md and the
script's docstring), as a new user would: it converges with every policy, and a diverging run
ends with one clear message instead of a crash loop through --max_restarts."""

from __future__ import annotations

import os
import re

import pytest

from tests.doc_commands import REPO_ROOT, block_with, docstring_commands, module_and_args

pytestmark = pytest.mark.multiprocess

EXAMPLE = "examples/ps_train.py"
DOC = "docs/ps.md"
# The documented PS address, which each test replaces by a free port.
DOC_ADDRESS = "127.0.0.1:7070"
POLICIES = ("synch", "fifo", "asypq", "stale", "cdismin", "cdismax", "granular", "wskew")
# The model starts at a held-out loss of about 17 (the targets' variance).
CONVERGED = 0.2
JOB_S = 120.0


def documented(source: str) -> tuple[str, str]:
    """The PS command and the workers' command, as ``source`` writes them."""
    commands = (block_with(DOC, "--role ps").commands if source == DOC
                else docstring_commands(EXAMPLE))
    [ps] = [c for c in commands if "--role ps" in c]
    [workers] = [c for c in commands if "--role worker" in c]
    return ps, workers


def start_job(start, port, tmp_path, source: str, policy: str | None = None,
              extra: tuple[str, ...] = ()):
    """Starts both documented commands (the workers wait for the PS by themselves)."""
    substitutions = _substitutions(port, tmp_path)
    jobs = []
    for command in documented(source):
        module, args = module_and_args(command, substitutions)
        if policy is not None:
            args[args.index("--policy") + 1] = policy
        jobs.append(start(*args, *extra, module=module))
    return jobs, substitutions


def _substitutions(port, tmp_path) -> dict[str, str]:
    return {DOC_ADDRESS: f"127.0.0.1:{port()}", EXAMPLE: os.path.join(REPO_ROOT, EXAMPLE),
            "/tmp/ps-ckpt": str(tmp_path / "ps-ckpt")}


def _look_and_steer(start, ps, substitutions) -> None:
    """docs/ps.md's ps-status and ps-configure, as written, at the PS the docs' commands started."""
    ps.wait_for(r"listening on")
    for command in block_with(DOC, "tfelastic ps-status").commands:
        module, args = module_and_args(command, substitutions)
        cli = start(*args, module=module)
        assert cli.wait(60) == 0, cli.tail()
        assert re.search(r"policy asypq|\"synch_block_size\": 2", cli.output), cli.output


def _final_loss(ps) -> float:
    [match] = ps.wait_for(r"final held-out loss ([0-9.e+-]+|inf|nan)")
    return float(match.group(1))


@pytest.mark.parametrize("policy", POLICIES)
def test_the_documented_example_converges_with_every_policy(start, port, tmp_path, policy):
    # asypq is the default: docs/ps.md's commands as written; the others: the docstring's,
    # which name the policy.
    if policy == "asypq":
        (ps, workers), substitutions = start_job(start, port, tmp_path, DOC)
        _look_and_steer(start, ps, substitutions)
    else:
        (ps, workers), _ = start_job(start, port, tmp_path, EXAMPLE, policy)
    assert workers.wait(JOB_S) == 0, workers.tail()
    assert ps.wait(JOB_S) == 0, ps.tail()
    assert _final_loss(ps) < CONVERGED, ps.tail()
    assert "TrainingDiverged" not in workers.output + ps.output


def test_a_diverging_job_ends_with_one_clear_message_and_no_restart(start, port, tmp_path):
    (ps, workers), _ = start_job(start, port, tmp_path, DOC, extra=("--learning_rate", "2.0"))
    assert workers.wait(JOB_S) == 1, workers.tail()
    assert ps.wait(JOB_S) == 1, ps.tail()
    for job in (ps, workers):
        assert "restart 1 of" not in job.output and "Traceback" not in job.output, job.tail()
        assert "[-inf, inf]" not in job.output and "had not joined" not in job.output
        assert "a worker failed in a way a restart cannot fix" in job.output
    advice = ("under policy asypq; lower the learning rate or bound the staleness with "
              "max_staleness")
    # The worker that saw it says where; any other says that the PS ended the job, and why:
    # each of the three once.
    own = [line for line in workers.lines if re.search(
        r"^\[worker \d\] TrainingDiverged: the training diverged: the loss became (inf|nan) "
        r"at iteration \d+ \(parameter version \d+\) ", line)]
    stopped = [line for line in workers.lines if re.search(
        r"^\[worker \d\] TrainingDiverged: stopped by the parameter server: the training "
        r"diverged: the loss became (inf|nan) on worker \d+ at version \d+ ", line)]
    assert own and len(own) + len(stopped) == 3, workers.tail()
    assert all(advice in line for line in own + stopped)
    assert re.search(r"  worker:     PS worker\n", workers.output)
    assert re.search(r"  worker:     parameter server\n", ps.output)
    [ps_line] = [line for line in ps.lines if line.startswith("[ps] TrainingDiverged: ")]
    assert not any(line.startswith("[worker ") for line in ps.lines), ps.tail()
    assert " on worker " in ps_line and advice in ps_line
