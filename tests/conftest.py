"""Test-wide setup: one intra-op thread per process, and Ctrl-C reaching what tests start.

`pytest -n 2` runs two worker processes, and the multi-replica strategies run a thread per
replica inside each; letting torch also start a thread per core would oversubscribe a small
CI machine many times over.

A shell that starts a command in the background (`bash .ci/run &`, nohup, some CI runners)
starts it with SIGINT ignored, and every process started from it inherits that: Python then
installs no KeyboardInterrupt handler, and the tests that press Ctrl-C on a demo, a launcher
or a kernel would wait in vain. Restoring the default here (in every xdist worker, which
imports this file) gives the processes the tests start a working Ctrl-C again.
"""

import signal

import torch

torch.set_num_threads(1)

if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
