"""The fork server (tests/fork_server.py, conftest's ForkServer): a forked run is the run a fresh
process makes, and it keeps subprocess.run's contract (stdin, exit code, output, timeout)."""
import json
import os
import signal
import subprocess

import pytest

from conftest import fork_server
from fake_api import reply, text, tool_use


def scenario(khaelor, fake, name: str, fresh: bool) -> tuple:
    """One headless run reading its prompt from stdin, whose bash call reads a toolchain file in
    this test's HOME (readable by the sandbox's per-HOME list, which the server's warm-up built
    for another HOME) and its directory; returns what a user would see and what the log says."""
    home = khaelor.env["HOME"]
    os.makedirs(f"{home}/.cargo", exist_ok=True)
    with open(f"{home}/.cargo/{name}", "w") as f:
        f.write(f"toolchain {name}\n")
    command = f"cat ~/.cargo/{name}; pwd"
    fake.enqueue(reply(tool_use("bash", {"command": command})), reply(text(f"done {name}")))
    argv = ["-p", "-", "--yes", "--output-format", "stream-json"]
    result = khaelor.run(*argv, stdin=f"check {name}\n", fresh=fresh)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    [done] = [e for e in lines if e["type"] == "ToolCompleted"]
    prompt = [e["text"] for e in lines if e["type"] == "UserMessageCreated"]
    return prompt, done["output"], [e["type"] for e in lines], lines[-1]["result"]


def test_a_forked_run_does_what_a_fresh_process_does(khaelor, fake):
    forked = scenario(khaelor, fake, "forked", fresh=False)
    fresh = scenario(khaelor, fake, "fresh", fresh=True)
    for run, name in ((forked, "forked"), (fresh, "fresh")):
        assert run[0] == [f"check {name}\n"]
        assert f"toolchain {name}\n{khaelor.project}\n" in run[1], run[1]
        assert run[3] == f"done {name}"
    assert forked[2] == fresh[2]


def test_a_forked_run_that_outlives_its_timeout_is_killed_and_raises(khaelor, fake):
    fake.enqueue(reply(text("never ends"), stall_after_events=2, stall_seconds=30))
    with pytest.raises(subprocess.TimeoutExpired) as raised:
        khaelor.run("-p", "hang", timeout=1)        # stalled for 30 s: killed wherever it is by then
    assert raised.value.timeout == 1
    server = fork_server()
    job = list(server.pids)[-1]          # this worker's last job: the run that timed out
    assert os.waitstatus_to_exitcode(server.statuses[job]) == -signal.SIGKILL
    with pytest.raises(ProcessLookupError):
        os.kill(server.pids[job], 0)     # killed and reaped, as subprocess.run leaves it
