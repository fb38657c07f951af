"""The fork server the tests run the real program through: `python fork_server.py ROOT WARM_UP`.

It imports the SDK once (~1.9 s, most of a headless run's cost), runs `khaelor.main` once
in-process (WARM_UP: {"cwd", "env", "argv"}, against a fake API) so the lazy imports and the SDK's
schemas are built, then reads jobs, one JSON line each on stdin:
    {"id", "argv", "cwd", "env", "stdin" (a path or null), "stdout", "stderr"}
and forks a child per job. The child is an ordinary process with the job's cwd, environment, argv
and files as fds 0, 1 and 2; it runs `sys.exit(khaelor.main(argv))` as khaelor.py's last line does,
so it ends like any run (atexit, the wait for non-daemon threads, the flush). For each job the
server prints {"id", "pid"} once forked and {"id", "exit"} once reaped (as subprocess reports it:
-N for signal N). EOF on stdin ends the server. conftest.py's ForkServer is the other end.
"""
import json
import os
import select
import sys
import threading

sys.path[0] = sys.argv[1]      # as `python khaelor.py` has it: the program's folder, not tests/
import anthropic  # noqa: E402,F401  (the import every forked child then skips)

import khaelor  # noqa: E402


def warm_up(job: dict) -> None:
    """One run in-process, its output thrown away, and no thread left running (a fork copies only
    the thread that forks: a lock another thread held would stay held in every child)."""
    os.chdir(job["cwd"])
    os.environ.update(job["env"])
    saved = os.dup(1)
    quiet = os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, 1)
    khaelor.main(job["argv"])
    sys.stdout.flush()
    os.dup2(saved, 1)
    os.close(saved)
    os.close(quiet)
    for thread in threading.enumerate():
        if thread is not threading.main_thread():
            thread.join()


def tell(message: dict) -> None:
    print(json.dumps(message), flush=True)


def serve() -> dict:
    """Fork a child per job and report the exits. Returns, in the child only, the job it runs."""
    children = {}
    pending = b""
    while True:
        # a job's exit is noticed within 10 ms; with none running, wait for the next job
        if select.select([0], [], [], 0.01 if children else None)[0]:
            data = os.read(0, 1 << 16)
            if not data:
                return {}
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                job = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    return job
                children[pid] = job["id"]
                tell({"id": job["id"], "pid": pid})
        reap(children)


def reap(children: dict) -> None:
    while children:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if not pid:
            return
        tell({"id": children.pop(pid), "exit": os.waitstatus_to_exitcode(status)})


def become(job: dict) -> None:
    """Turn this forked child into the job's process: its files, directory, environment and argv."""
    files = ((0, job["stdin"] or os.devnull, os.O_RDONLY),
             (1, job["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
             (2, job["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC))
    for fd, path, flags in files:
        opened = os.open(path, flags, 0o600)
        os.dup2(opened, fd)
        os.close(opened)
    os.chdir(job["cwd"])
    os.environ.clear()
    os.environ.update(job["env"])
    sys.argv = [os.path.join(sys.argv[1], "khaelor.py"), *job["argv"]]


warm_up(json.loads(sys.argv[2]))
tell({"ready": os.getpid()})
job = serve()
if job:
    become(job)
    sys.exit(khaelor.main(job["argv"]))
