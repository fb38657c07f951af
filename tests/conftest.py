"""Shared fixtures: an isolated KHAELOR_HOME and project, the fake API, and the real CLI as a subprocess."""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from fake_api import FakeAnthropic  # noqa: E402

# Every event any test emits (in-process, and in the CLI subprocesses that inherit it) is checked
# against its kind's TypedDict in events.py: a mismatch raises where the event is made.
os.environ["KHAELOR_CHECK_EVENTS"] = "1"


@pytest.fixture
def project(tmp_path):
    path = tmp_path / "project"
    path.mkdir()
    (path / ".git").mkdir()          # marks the project root without needing git itself
    return path


@pytest.fixture
def env(tmp_path):
    home = tmp_path / "khaelor-home"
    return {**{k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "KHAELOR_"))},
            "KHAELOR_HOME": str(home), "ANTHROPIC_API_KEY": "sk-test-secret-key",
            "ANTHROPIC_CONFIG_DIR": str(tmp_path / "anthropic-config"), "NO_COLOR": "1",
            "HOME": str(tmp_path / "user-home"), "PYTHONPATH": str(ROOT), "KHAELOR_CHECK_EVENTS": "1"}


@pytest.fixture
def fake():
    with FakeAnthropic() as server:
        yield server


class Khaelor:
    """Runs the real program in a project directory against the fake server."""

    def __init__(self, project, env, fake):
        self.project, self.env, self.fake = project, env, fake
        self.env["ANTHROPIC_BASE_URL"] = fake.base_url

    def run(self, *args, stdin=None, timeout=60, env=None):
        return subprocess.run([sys.executable, str(ROOT / "khaelor.py"), *args], cwd=self.project,
                              env={**self.env, **(env or {})}, input=stdin, capture_output=True,
                              text=True, timeout=timeout)

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
