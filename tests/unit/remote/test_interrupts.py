"""Ctrl-C while greenlets run (the hosts' steps, paramiko's transport threads under
pyinfra's monkey-patching): the main greenlet gets KeyboardInterrupt, no other greenlet
does, and nothing is printed (bootstrap.errors turns it into "interrupted", exit 130)."""

import subprocess
import sys

SCRIPT = """
from gevent import monkey; monkey.patch_all()
import os, signal, threading, time
import gevent
from bootstrap.remote.session import interrupt_quietly

interrupt_quietly()
transport_alive = []

def transport():  # paramiko's Transport.run: a thread, a greenlet here, always busy reading
    while True:
        time.sleep(0.001)
        transport_alive.append(1)

threading.Thread(target=transport, daemon=True).start()
def busy_step():
    while True:
        gevent.sleep(0.001)
gevent.spawn(busy_step)
gevent.spawn_later(0.2, os.kill, os.getpid(), signal.SIGINT)
try:
    gevent.sleep(5)
    print("not interrupted")
except KeyboardInterrupt:
    before = len(transport_alive)
    gevent.sleep(0.05)
    print("interrupted in main; the transport still runs:", len(transport_alive) > before)
"""


def test_ctrl_c_reaches_the_main_greenlet_and_prints_no_traceback():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "interrupted in main; the transport still runs: True", done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "KeyboardInterrupt" not in done.stderr, done.stderr


USER_ERROR_SCRIPT = """
import gevent
from bootstrap.errors import UsageError
from bootstrap.remote.session import user_errors_quietly

user_errors_quietly()

def read_kubeconfig():  # as the kubeconfig read while the agents join
    raise UsageError("the server's k3s.yaml has users[0].user.exec; it was refused")

job = gevent.spawn(read_kubeconfig)
gevent.joinall([job])
print("said by the main greenlet:", job.exception)
"""


def test_a_user_error_in_a_greenlet_is_said_once_by_the_main_greenlet_not_as_a_traceback():
    done = subprocess.run([sys.executable, "-c", USER_ERROR_SCRIPT], capture_output=True, text=True, timeout=60)
    assert done.stdout.startswith("said by the main greenlet: the server's k3s.yaml"), done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "exec" not in done.stderr, done.stderr
