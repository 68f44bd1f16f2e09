"""The process a test holds for a command the fork server runs (tests/forkserver.py): started
with -S -E (the standard library alone, in milliseconds), it hands its standard streams, working
directory, environment and arguments to the server, forwards the signals it gets to the child
running the command, and exits as that child ended.

    python -S -E tests/forkclient.py SOCKET -m fxformer.train --workdir=...
"""

import json
import os
import signal
import socket
import struct
import sys

path, argv = sys.argv[1], sys.argv[2:]
present = []
for fd in (0, 1, 2):
    try:
        os.fstat(fd)
        present.append(fd)
    except OSError:
        pass  # closed by the caller: closed in the child too
server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
server.connect(path)
request = {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd(), "present": present}
socket.send_fds(server, [json.dumps(request).encode()], present)
pid = struct.unpack("q", server.recv(8))[0]
for name in ("SIGTERM", "SIGINT", "SIGABRT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2"):
    signal.signal(getattr(signal, name), lambda number, _frame: os.kill(pid, number))
ended = server.recv(8)
if len(ended) != 8:
    print(f"forkclient: the fork server ended while the command ran (pid {pid})", file=sys.stderr)
    os._exit(1)
code = struct.unpack("q", ended)[0]
if code < 0:  # killed by a signal: so is this process
    if -code != signal.SIGKILL:
        signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
os._exit(code)
