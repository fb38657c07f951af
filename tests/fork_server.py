"""The fork server the tests run the real program through:
`python fork_server.py ROOT WARM_UP LISTENER`.

It imports the SDK once (~1.9 s, most of a headless run's cost), runs `khaelor.main` once
in-process (WARM_UP: {"cwd", "env", "argv"}, against a fake API) so the lazy imports and the SDK's
schemas are built, prints {"ready": its pid}, then serves the clients that connect to LISTENER (the
number of an inherited, listening Unix SOCK_SEQPACKET socket): all the xdist workers of a run
share one server, so the import and the warm-up are paid once, not once per worker. A client is
sent {"ready": pid} once accepted, then sends jobs: one message each,
    {"id", "argv", "cwd", "env", "tty" (optional: a terminal's path),
     "closed" (optional: of fds 0-2, those the job starts without, as `<&-` or `>&-` leave them),
     "rlimits" (optional: {"RLIMIT_FSIZE": 2000}, the soft and hard limits the job runs under)}
carrying three file descriptors, the job's stdin, stdout and stderr (the pipes, files or terminal
a subprocess.Popen child would get). It forks a child per job. The child is an ordinary process
with the job's cwd, environment, argv and files as fds 0, 1 and 2; it runs
`khaelor.main(argv)` as khaelor.py's last line does, and ends like any run (the wait for non-daemon
threads, atexit, the flush, the exit status), without the interpreter's teardown (see
end_as_the_interpreter_would). With "tty", the child is what a terminal's shell starts:
a session leader whose controlling terminal is that one (the terminal must have no session: see
tests/pane.py). The job's env may set KHAELOR_TEST_CONSTANTS (see become). For each job the
server sends its client {"id", "pid"} once forked and {"id", "status"} once reaped (the raw wait
status). EOF on stdin ends the server. conftest.py's ForkServer is the client, and
start_fork_server the one that starts it.
"""
import atexit
import fcntl
import gc
import io
import json
import os
import resource
import select
import signal
import socket
import sys
import termios
import threading

sys.path[0] = sys.argv[1]      # as `python khaelor.py` has it: the program's folder, not tests/
import anthropic  # noqa: E402,F401  (the import every forked child then skips)

import khaelor  # noqa: E402


def warm_up(job: dict) -> None:
    """One run in-process, its output thrown away, and no thread left running (a fork copies only
    the thread that forks: a lock another thread held would stay held in every child), with the
    signal dispositions a fresh interpreter has: each child inherits them."""
    before = {signum: signal.getsignal(signum) for signum in signal.valid_signals()
              if signum not in (signal.SIGKILL, signal.SIGSTOP)}
    os.chdir(job["cwd"])
    os.environ.update(job["env"])
    # its stdin is /dev/null (the server's own is the pipe whose EOF ends it: on it, -p waited
    # STDIN_WAIT_S for a prompt, 3 s of every run's start)
    saved = [os.dup(0), os.dup(1)]
    quiet = os.open(os.devnull, os.O_RDWR)
    os.dup2(quiet, 0)
    os.dup2(quiet, 1)
    khaelor.main(job["argv"])
    sys.stdout.flush()
    os.dup2(saved[0], 0)
    os.dup2(saved[1], 1)
    for fd in (*saved, quiet):
        os.close(fd)
    for thread in threading.enumerate():
        if thread is not threading.main_thread():
            thread.join()
    # main's own SIGTERM and SIGHUP handlers go too: a child installs them itself, as a fresh run
    for signum, handler in before.items():
        if signal.getsignal(signum) != handler:
            signal.signal(signum, handler)
    assert signal.set_wakeup_fd(-1) == -1, "the warm-up left its event loop's wakeup fd"


def tell(client: socket.socket, message: dict) -> None:
    try:
        client.send(json.dumps(message).encode())
    except OSError:
        pass        # the client has gone (its worker ended): nobody is waiting for this


def serve(listener: socket.socket) -> tuple:
    """Accept clients, fork a child per job and report the exits to the job's client. Returns, in
    the child only, (job, its fds, the server's sockets the child must close); ({}, [], []) once
    stdin reaches EOF."""
    clients = []
    children = {}
    while True:
        # a job's exit is noticed within 10 ms; with none running, wait for the next job
        waiting = [sys.stdin, listener, *clients]
        for ready in select.select(waiting, [], [], 0.01 if children else None)[0]:
            if ready is sys.stdin:
                if not os.read(0, 1 << 10):
                    return {}, [], []
            elif ready is listener:
                client, _ = listener.accept()
                clients.append(client)
                tell(client, {"ready": os.getpid()})
            else:
                data, fds, _, _ = socket.recv_fds(ready, 1 << 20, 3)
                if not data:
                    clients.remove(ready)
                    ready.close()
                    continue
                job = json.loads(data)
                pid = os.fork()
                if pid == 0:
                    return job, fds, [listener, *clients]
                for fd in fds:
                    os.close(fd)
                children[pid] = ready, job["id"]
                tell(ready, {"id": job["id"], "pid": pid})
        reap(children)


def reap(children: dict) -> None:
    while children:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if not pid:
            return
        client, job_id = children.pop(pid)
        tell(client, {"id": job_id, "status": status})


def become(job: dict, fds: list) -> None:
    """Turn this forked child into the job's process: its files, terminal, directory, environment
    and argv. The server's own fds 0 and 1 (its stdin, its stdout) are replaced."""
    if job.get("tty"):
        os.setsid()
        terminal = os.open(job["tty"], os.O_RDWR)
        fcntl.ioctl(terminal, termios.TIOCSCTTY, 0)     # ours, and we its foreground process group
        fds = [terminal] * 3
    for fd, received in enumerate(fds):
        os.dup2(received, fd)
    for received in set(fds):
        if received > 2:
            os.close(received)
    closed = job.get("closed", ())
    for fd in closed:
        os.close(fd)        # free, as in a process started without it: the next open takes it
    for fd, name in enumerate(("stdin", "stdout", "stderr")):
        # a closed one is None, as CPython's create_stdio makes it for an fd that is not valid
        stream = None if fd in closed else stdio(fd, getattr(sys, name))
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    # set here, in the job's own process, as a preexec_fn sets them before a fresh one's exec
    for name, limit in job.get("rlimits", {}).items():
        resource.setrlimit(getattr(resource, name), (limit, limit))
    os.chdir(job["cwd"])
    os.environ.clear()
    os.environ.update(job["env"])
    # a test's own figures for the program's waits, as monkeypatch.setattr gives them in-process:
    # KHAELOR_TEST_CONSTANTS='{"model.BASE_DELAY_S": 0.05}' (a fresh run has no such thing)
    for name, value in json.loads(os.environ.pop("KHAELOR_TEST_CONSTANTS", "{}")).items():
        module, attribute = name.split(".")
        assert hasattr(sys.modules[module], attribute), name
        setattr(sys.modules[module], attribute, value)
    sys.argv = [os.path.join(sys.argv[1], "khaelor.py"), *job["argv"]]


def stdio(fd: int, was: io.TextIOWrapper) -> io.TextIOWrapper:
    """sys.stdin, stdout or stderr as a fresh interpreter makes it for what the fd now is (CPython's
    create_stdio): line-buffered on a terminal (stderr always), unless unbuffered (-u,
    PYTHONUNBUFFERED: then written through), in the server's encoding."""
    mode = "r" if fd == 0 else "w"
    unbuffered = mode == "w" and was.write_through
    buffer = io.open(fd, mode + "b", buffering=0 if unbuffered else -1, closefd=False)
    raw = buffer if unbuffered else buffer.raw
    raw.name = f"<{('stdin', 'stdout', 'stderr')[fd]}>"
    line_buffered = not unbuffered and (fd == 2 or raw.isatty())
    stream = io.TextIOWrapper(buffer, was.encoding, was.errors, "\n",
                              line_buffering=line_buffered, write_through=was.write_through)
    stream.mode = mode
    return stream


def end_as_the_interpreter_would(code) -> None:
    """What Py_FinalizeEx does before it tears the interpreter down (wait for the non-daemon threads,
    run the atexit functions, flush stdout and stderr), then exit. The teardown itself, freeing
    every module and object, would touch (and so copy from the server) every page the SDK's import
    made: ~70 ms of CPU per run, a run's largest cost. A code that is not a number, or a flush that
    fails, takes the interpreter's own way out, which reports it."""
    if code is not None and not isinstance(code, int):
        sys.exit(code)
    threading._shutdown()
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        sys.exit(code)
    os._exit((code or 0) & 0xFF)


warm_up(json.loads(sys.argv[2]))
# What the SDK and the warm-up made lives as long as any child: out of the collector's sight, a
# child's collections no longer walk (and copy, page by page) it all: a headless run's CPU went
# from 0.47 s to 0.15 s.
gc.collect()
gc.freeze()
print(json.dumps({"ready": os.getpid()}), flush=True)
job, job_fds, servers = serve(socket.socket(fileno=int(sys.argv[3])))
if job:
    for server_socket in servers:
        server_socket.close()        # the server's, not the job's
    become(job, job_fds)
    try:
        code = khaelor.main(job["argv"])
    except SystemExit as stop:
        code = stop.code
    end_as_the_interpreter_would(code)
