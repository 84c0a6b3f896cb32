"""A stand-in for Slurm's ``srun`` on one machine: ``fake_srun.py --ntasks N COMMAND...``.

It starts N copies of COMMAND at once with the variables srun sets (every "node" is
127.0.0.1, task i on node i), waits for all of them and exits with the first non-zero code.
"""

import argparse
import os
import subprocess
import sys

parser = argparse.ArgumentParser()
parser.add_argument("--ntasks", type=int, required=True)
parser.add_argument("command", nargs=argparse.REMAINDER)
args = parser.parse_args()

tasks = []
for rank in range(args.ntasks):
    env = dict(os.environ, SLURM_JOB_ID="4242", SLURM_JOB_NODELIST="127.0.0.1",
               SLURM_NTASKS=str(args.ntasks), SLURM_PROCID=str(rank), SLURM_NODEID=str(rank))
    tasks.append(subprocess.Popen(args.command, env=env))
codes = [task.wait() for task in tasks]
sys.exit(next((code for code in codes if code), 0))
