"""A worker of test_job_end.py: trains a few steps elastically, then ends in a way its exit hangs.

argv: a file that gets one line per start of the training function (so a test sees a job that
trained again), then how the exit hangs: "thread" (a non-daemon thread that never ends: the
interpreter waits for it before its atexit handlers), "atexit" (an atexit handler, registered
before init(), that never returns), "code" (the process ends with code 3, as a hang ended by a
backup of the exit deadline does), or "none".
"""

import atexit
import json
import os
import sys
import threading

import tensorflow as tf

import tensorflow_elastic as tfe

STARTS_FILE, HANG = sys.argv[1], sys.argv[2]
STEPS = 3

if HANG == "atexit":
    atexit.register(threading.Event().wait)
runtime = tfe.init()
strategy = tfe.ElasticMultiWorkerMirroredStrategy()
with strategy.scope():
    counter = tf.Variable(0.0)
state = tfe.TensorFlowState([counter], step=0)


@tfe.run
def train(state):
    with open(STARTS_FILE, "a") as f:
        f.write(f"{runtime.node_id}\n")
    while state.step < STEPS:
        counter.assign_add(1.0)
        state.step += 1
        state.commit()


train(state)
print(json.dumps({"done": True, "node": runtime.node_id, "step": state.step}), flush=True)
if HANG == "thread":
    threading.Thread(target=threading.Event().wait, name="never-ends").start()
if HANG == "code":
    os._exit(3)
