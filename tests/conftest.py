"""Shared fixtures: an isolated KHAELOR_HOME and project, the fake API, and the real CLI as a subprocess."""
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from fake_api import FakeAnthropic, reply, text, tool_use  # noqa: E402

# Every event any test emits (in-process, and in the CLI subprocesses that inherit it) is checked
# against its kind's row in events.EVENT_KINDS: a mismatch raises where the event is made.
os.environ["KHAELOR_CHECK_EVENTS"] = "1"


@pytest.fixture
def project(tmp_path):
    path = tmp_path / "project"
    path.mkdir()
    (path / ".git").mkdir()          # marks the project root without needing git itself
    return path


@pytest.fixture
def env(tmp_path):
    return {**base_env(tmp_path), "KHAELOR_HOME": str(tmp_path / "khaelor-home")}


@pytest.fixture
def fake():
    with FakeAnthropic() as server:
        yield server


class ForkServer:
    """The client of tests/fork_server.py: a process that imported the SDK once and forks the real
    `khaelor.main` per job. Each child is an ordinary process with its own cwd, environment and
    files; it skips only the ~1.9 s SDK import that would otherwise be most of the suite's time."""

    def __init__(self, base: Path):
        self.jobs = base / "jobs"
        self.jobs.mkdir(parents=True)
        with FakeAnthropic([reply(text("Warming up."), tool_use("bash", {"command": "true"})),
                            reply(text("ok"))]) as fake:
            warm_up = {"cwd": str(base / "project"), "argv": ["-p", "warm up", "--yes"],
                       "env": {**base_env(base), "KHAELOR_HOME": str(base / "home"),
                               "ANTHROPIC_BASE_URL": fake.base_url}}
            (base / "project" / ".git").mkdir(parents=True)
            server = [sys.executable, str(ROOT / "tests" / "fork_server.py"), str(ROOT)]
            self.proc = subprocess.Popen([*server, json.dumps(warm_up)], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, text=True, bufsize=1)
            assert "ready" in json.loads(self.proc.stdout.readline())
        self.pids, self.exits = {}, {}
        self.changed = threading.Condition()
        self.write_lock = threading.Lock()
        self.numbers = itertools.count()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            message = json.loads(line)
            with self.changed:
                if "pid" in message:
                    self.pids[message["id"]] = message["pid"]
                else:
                    self.exits[message["id"]] = message["exit"]
                self.changed.notify_all()

    def spawn(self, job_id, argv, cwd, env, stdout, stderr, stdin=None) -> int:
        """Start `khaelor *argv` (stdin: a file's path, or None for /dev/null); returns its pid."""
        job = {"id": job_id, "argv": list(argv), "cwd": str(cwd), "env": env, "stdout": str(stdout),
               "stderr": str(stderr), "stdin": stdin and str(stdin)}
        with self.write_lock:
            self.proc.stdin.write(json.dumps(job) + "\n")
            self.proc.stdin.flush()
        with self.changed:
            assert self.changed.wait_for(lambda: job_id in self.pids, timeout=20)
            return self.pids[job_id]

    def wait(self, job_id, timeout):
        """The exit code (as subprocess gives it), or None if the job still runs after `timeout`."""
        with self.changed:
            self.changed.wait_for(lambda: job_id in self.exits, timeout)
            return self.exits.get(job_id)

    def run(self, argv, cwd, env, stdin=None, timeout=60) -> subprocess.CompletedProcess:
        """What subprocess.run(capture_output=True, text=True) gives for `python khaelor.py *argv`,
        a timeout included: the child is killed and subprocess.TimeoutExpired raised."""
        job_id = f"run-{next(self.numbers)}"
        files = {name: self.jobs / f"{job_id}.{name}" for name in ("stdin", "stdout", "stderr")}
        if stdin is not None:
            files["stdin"].write_text(stdin)
        pid = self.spawn(job_id, argv, cwd, env, files["stdout"], files["stderr"],
                         files["stdin"] if stdin is not None else None)
        code = self.wait(job_id, timeout)
        if code is None:
            os.kill(pid, signal.SIGKILL)
            self.wait(job_id, 20)
        # read as subprocess's text mode reads a pipe (universal newlines), then gone like a pipe's
        stdout, stderr = files["stdout"].read_text(), files["stderr"].read_text()
        for path in files.values():
            path.unlink(missing_ok=True)
        command = [sys.executable, str(ROOT / "khaelor.py"), *argv]
        if code is None:
            raise subprocess.TimeoutExpired(command, timeout, output=stdout, stderr=stderr)
        return subprocess.CompletedProcess(command, code, stdout, stderr)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=20)


_fork_server = {}
_fork_server_lock = threading.Lock()


def fork_server() -> ForkServer:
    """This worker's fork server, started on first use (a worker with no CLI test starts none)."""
    with _fork_server_lock:
        if "server" not in _fork_server:
            base = _fork_server["config"]._tmp_path_factory.mktemp("fork-server")
            _fork_server["server"] = ForkServer(base)
        return _fork_server["server"]


def run_khaelor(argv, cwd, env, stdin=None, timeout=60, fresh=False,
                preexec_fn=None) -> subprocess.CompletedProcess:
    """`python khaelor.py *argv` run to its end, forked from the fork server; fresh=True starts a
    new interpreter instead, where only that proves the point (cold start, signals, limits)."""
    if fresh:
        return subprocess.run([sys.executable, str(ROOT / "khaelor.py"), *argv], cwd=cwd, env=env,
                              input=stdin, capture_output=True, text=True, timeout=timeout,
                              preexec_fn=preexec_fn)
    assert preexec_fn is None, "a forked run takes no preexec_fn: pass fresh=True"
    return fork_server().run(argv, cwd, env, stdin, timeout)


def base_env(base: Path) -> dict:
    """What the `env` fixture gives, in a folder of one's own (module fixtures, the server)."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "KHAELOR_"))},
            "ANTHROPIC_API_KEY": "sk-test-secret-key", "NO_COLOR": "1",
            "ANTHROPIC_CONFIG_DIR": str(base / "anthropic-config"), "HOME": str(base / "user-home"),
            "PYTHONPATH": str(ROOT), "KHAELOR_CHECK_EVENTS": "1"}


class Khaelor:
    """Runs the real program in a project directory against the fake server."""

    def __init__(self, project, env, fake):
        self.project, self.env, self.fake = project, env, fake
        self.env["ANTHROPIC_BASE_URL"] = fake.base_url

    def run(self, *args, stdin=None, timeout=60, env=None, fresh=False):
        return run_khaelor(args, self.project, {**self.env, **(env or {})}, stdin, timeout, fresh)

    def popen(self, *args):
        return subprocess.Popen([sys.executable, str(ROOT / "khaelor.py"), *args], cwd=self.project,
                                env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def session_files(self):
        return sorted(Path(self.env["KHAELOR_HOME"]).glob("sessions/*/*.jsonl"))

    def log(self, path=None):
        path = path or self.session_files()[-1]
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def messages(self, i):
        return self.fake.requests[i]["body"]["messages"]


@pytest.fixture
def khaelor(project, env, fake):
    return Khaelor(project, env, fake)


@pytest.fixture
def listener():
    """A socket on 127.0.0.1 that nothing confined or denied should reach (was_reached tells)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.5)
    yield server
    server.close()


def was_reached(server) -> bool:
    try:
        connection, _ = server.accept()
    except socket.timeout:
        return False
    connection.close()
    return True


def pytest_configure(config):
    _fork_server["config"] = config
    config.addinivalue_line("markers", "suite_end: runs after every other test (it checks what the run left behind)")


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: item.get_closest_marker("suite_end") is not None)   # stable: the rest keep order


@pytest.fixture
def kernel_turn(project, env, fake, monkeypatch):
    """Run one turn through the real wiring in-process, with `ask` standing in for the user who
    answers permission questions: kernel_turn(prompt, ask) -> (final step, the session log)."""
    import asyncio

    import events
    import khaelor as cli
    for key in ("KHAELOR_HOME", "ANTHROPIC_API_KEY", "ANTHROPIC_CONFIG_DIR"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
    monkeypatch.chdir(project)

    async def turn(prompt, ask):
        home = Path(env["KHAELOR_HOME"])
        args = cli.parse_args(["-p", prompt])
        store = events.SessionStore.create(events.sessions_dir(home, project))
        kernel = cli.build_kernel(args, cli.load_settings(args, home, project), store, events.Bus(store),
                                  home, project, ask)
        kernel.submit(prompt)
        try:
            return await kernel.run(), store.events
        finally:
            await kernel.toolbox.close()
            await kernel.model.close()
    return lambda prompt, ask: asyncio.run(turn(prompt, ask))


def pytest_unconfigure(config):
    if "server" in _fork_server:
        _fork_server.pop("server").close()


def pytest_sessionfinish(session, exitstatus):
    """In parallel runs the suite_end key scan runs while the other worker may still be writing, so
    the controller scans every worker's folders again once all of them are done, and fails the run
    if any file khaelor wrote holds the API key."""
    config = session.config
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        return
    base = config._tmp_path_factory.getbasetemp()
    key = b"sk-test-secret-key"
    for path in base.rglob("*"):
        if not path.is_file() or path.is_symlink() or path.name == "secrets.env" or path.stat().st_size > 64 << 20:
            continue
        if key in path.read_bytes():
            print(f"\nFAILED: the API key was written to {path}")
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
            return
