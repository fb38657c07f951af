"""Fault injection: the world misbehaves (API, storage, kill -9) and khaelor keeps working, losing nothing.

Scenarios run the real program against tests/fake_api.py; independent runs share a small thread pool,
forked from conftest's fork server (a pre-warmed interpreter), as the kill -9 experiments are.
Where many damaged logs are checked (every byte offset, every line), the next request is built
in-process by the same functions `--continue` runs and checked with fake_api.validate, the fake
server's own rules.
"""
import fcntl
import json
import random
import shutil
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import context
import events
import kernel
import tools
from conftest import base_env, khaelor_popen, run_khaelor
from fake_api import FakeAnthropic, error, reply, text, thinking, tool_use, validate

KEY = "sk-test-secret-key"      # conftest's env fixture; test_abuse greps for it in all khaelor wrote


def run_cli(project, env, *args, fake=None, extra_env=None, timeout=60, fresh=False,
            rlimits=None):
    """One real `khaelor …` (what the `khaelor` fixture does, with a few more knobs: `rlimits`,
    the resource limits a forked run runs under)."""
    env = {**env, **({"ANTHROPIC_BASE_URL": fake.base_url} if fake else {}), **(extra_env or {})}
    options = {"rlimits": rlimits} if rlimits else {}
    result = run_khaelor(args, project, env, timeout=timeout, fresh=fresh, **options)
    with open(Path(project).parent / "khaelor-output.txt", "a", encoding="utf-8") as kept:   # for test_abuse's key scan
        kept.write(f"$ khaelor {' '.join(args)[:200]}\n{result.stdout}{result.stderr}")
    return result


def in_parallel(*thunks):
    """Run independent CLI scenarios two at a time (two cores), results in order."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        return [f.result() for f in [pool.submit(t) for t in thunks]]


def read_log(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def session_files(env):
    return sorted(Path(env["KHAELOR_HOME"]).glob("sessions/*/*.jsonl"))


def env_home(env):
    return Path(env["KHAELOR_HOME"])


def next_request(log_path, project, home, scratch):
    """The request a `--continue` would send next, built in-process by the functions the CLI runs:
    open the log (dropping a torn line), repair, the new user message, build. Works on a copy, so
    the log on disk stays as the crash left it. Returns (store, request body as JSON would carry it)."""
    copy = Path(scratch) / f"copy-{time.monotonic_ns()}.jsonl"
    copy.write_bytes(Path(log_path).read_bytes())
    store = events.SessionStore.open(copy)
    bus = events.Bus(store)
    # (the toolbox gives back what a command killed with khaelor had printed)
    toolbox = tools.Toolbox(tools.Workspace(project), home, bus.emit, lambda: store.state)
    k = kernel.Kernel(bus=bus, model=None, toolbox=toolbox, ctx=None, rules=[], project_root=project,
                      ask=None)
    k.repair()
    k.submit("continue")
    store.close()
    assert kernel.derive_next(store.state) == "call-model"
    ctx = context.Context(project_root=project, cwd=project, home=home, model="claude-sonnet-5-5",
                          tool_schemas=tools.SCHEMAS)
    request = ctx.build_request(store.state)
    return store, json.loads(json.dumps(request))


def assert_valid_history(log_path, project, home, scratch):
    _, request = next_request(log_path, project, home, scratch)
    assert validate(request) is None, validate(request)


# ---------------------------------------------------------------- API faults

def test_every_transient_api_fault_is_retried_visibly_and_the_task_completes(project, env, tmp_path):
    """Across three requests: 429 with and without retry-after, a 529, a 500, a reset mid-stream, an
    `error` event mid-stream, a stalled stream, a body that ends before message_stop. The stalled
    and errored attempts had already streamed the same complete tool call the retry then makes:
    retries of one response are not the model repeating itself (the doom-loop check)."""
    (project / "a.txt").write_text("alpha\n")
    call = tool_use("bash", {"command": "cat a.txt"})
    with FakeAnthropic() as fake:
        fake.enqueue(error("rate_limit_error", "slow down", status=429, retry_after="0.01"),
                     {"content": [text("lost " * 30), call], "drop_after_events": 9},
                     error("overloaded_error", "Overloaded", status=529, retry_after_ms="10"),
                     error("api_error", "Internal server error", status=500, retry_after="0.01"),
                     reply(text("Reading."), call),
                     {"content": [call], "stream_error": {"type": "overloaded_error", "message": "Overloaded"}},
                     {"content": [call], "stall_after_events": 8, "stall_seconds": 30},
                     reply(call),
                     error("rate_limit_error", "spend cap", status=429),          # no retry-after: backoff
                     {"content": [text("half an answer"), call], "end_after_events": 6},
                     reply(text("The file says alpha."), chunk=200))
        # the backoff a tenth of its 0.5 s base: the five faults without a retry-after wait
        # 0.05-0.1 s each, not 0.5-1 s (test_model checks the backoff's own figures)
        result = run_cli(project, env, "-p", "what does a.txt say", "--yes", fake=fake,
                         extra_env={"KHAELOR_READ_TIMEOUT": "1",
                                    "KHAELOR_TEST_CONSTANTS": json.dumps({"model.BASE_DELAY_S": 0.05})})
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == "The file says alpha."
        assert fake.rejections == [] and fake.pending == []
    retries = [line for line in result.stderr.splitlines() if "retrying in" in line]
    assert len(retries) == 8, result.stderr
    for what in ("429", "529", "500", "RemoteProtocolError", "overloaded_error", "ReadTimeout", "message_stop"):
        assert any(what in line for line in retries), (what, result.stderr)
    log = read_log(session_files(env)[-1])
    assert [e["type"] for e in log if e["type"] in ("ToolCompleted", "TaskCompleted")] == \
        ["ToolCompleted", "ToolCompleted", "TaskCompleted"]
    assert "half" not in json.dumps(events.replay(log).messages) and "lost" not in json.dumps(events.replay(log).messages)
    assert_valid_history(session_files(env)[-1], project, env_home(env), tmp_path)


def test_api_faults_that_do_not_clear_end_with_one_clear_line_and_exit_1(tmp_path, env):
    def scenario(name, script, *, max_context=None, extra_env=None):
        project = tmp_path / name
        (project / ".git").mkdir(parents=True)
        scenario_env = {**env, "KHAELOR_HOME": str(tmp_path / f"{name}-home")}

        def go():
            with FakeAnthropic(script, max_context_tokens=max_context) as fake:
                result = run_cli(project, scenario_env, "-p", "hello there", fake=fake, extra_env=extra_env)
                return result, list(fake.requests), list(fake.rejections), scenario_env
        return go

    overloaded = [error("overloaded_error", "Overloaded", status=529, retry_after="0.01")] * 5
    outcomes = in_parallel(
        scenario("burst", overloaded + [reply(text("too late"))]),
        scenario("badkey", [reply(text("never"))], extra_env={"ANTHROPIC_API_KEY": "bad-key"}),
        scenario("overflow", [reply(text("never"))], max_context=50),
        scenario("fatal", [{"content": [text("partial")], "stream_error": {"type": "invalid_request_error",
                                                                           "message": "bad thing"}}]))
    (burst, burst_requests, _, burst_env), (badkey, badkey_requests, _, badkey_env), \
        (overflow, _, overflow_rejections, overflow_env), (fatal, fatal_requests, _, fatal_env) = outcomes
    for result in (burst, badkey, overflow, fatal):
        assert result.returncode == 1, result.stderr
        assert "Traceback" not in result.stderr and result.stderr.splitlines()[-1].startswith("khaelor: ")
    assert len(burst_requests) == 5 and "529" in burst.stderr.splitlines()[-1] and "5 attempts" in burst.stderr
    assert len(badkey_requests) == 1 and "ANTHROPIC_API_KEY" in badkey.stderr.splitlines()[-1]
    assert "invalid x-api-key" in badkey.stderr, "the API's own reason"
    assert "bad-key" not in badkey.stderr
    assert overflow_rejections and "too long" in overflow.stderr.splitlines()[-1]
    assert len(fatal_requests) == 1 and "bad thing" in fatal.stderr.splitlines()[-1]
    for scenario_env in (burst_env, badkey_env, overflow_env, fatal_env):
        log = read_log(session_files(scenario_env)[-1])
        assert log[-1]["type"] == "TaskFailed"
        assert not any(e["type"] == "ModelResponseCompleted" for e in log)
        # the prompt and the environment facts told with it
        [prompt] = events.replay(log).messages
        assert prompt["content"][0] == {"type": "text", "text": "hello there"}
        assert [b["text"][:13] for b in prompt["content"][1:]] == ["<environment>"]


def test_a_bad_read_timeout_setting_is_a_usage_error(project, env):
    result = run_cli(project, env, "-p", "hi", extra_env={"KHAELOR_READ_TIMEOUT": "soon"})
    assert result.returncode == 2 and "KHAELOR_READ_TIMEOUT" in result.stderr


# ---------------------------------------------------------------- kill -9

N_TIMED_KILLS = 16          # kill points chosen at random times (fixed seed)
N_EVENT_KILLS = 16          # kill points chosen right after the k-th recorded event, k at random
N_REAL_CONTINUES = 3        # kill points also checked with a real `khaelor -c`, one per main phase
KILL_POOL = 8               # experiments at once; each is mostly waiting on streams and sleeps
N_TORN_APPENDS = 200        # byte offsets the reference log is cut at
SEED = 20261130



def session_script():
    """A multi-tool session of ~1.5 s: streamed text and thinking, a read, two bash calls in one response
    (one sleeps, one prints 40 KB so its result line is large), a 60 KB write, an edit that fails."""
    return [reply(text("Let me look at the notes first. " * 3), tool_use("read", {"file_path": "notes.txt"}),
                  chunk=6, delay=0.005),
            reply(text("Two things at once."), tool_use("bash", {"command": "sleep 0.3; echo one >> notes.txt"}),
                  # 40 000 x's and a newline without a Python's start (~0.1 s of CPU, pyenv's shim)
                  tool_use("bash", {"command": "head -c 40000 /dev/zero | tr '\\0' x; echo"}),
                  chunk=6, delay=0.005),
            reply(tool_use("write", {"file_path": "big.txt", "content": "y" * 60000 + "\n"}), chunk=2000, delay=0.005),
            reply(thinking("The notes changed under me; try the edit anyway."),
                  tool_use("edit", {"file_path": "notes.txt", "old_string": "one", "new_string": "two"}),
                  chunk=6, delay=0.005),
            reply(text("All done. " * 20), chunk=5, delay=0.005)]


def new_workspace(base: Path, env: dict, fake) -> tuple[Path, dict]:
    project = base / "project"
    (project / ".git").mkdir(parents=True)
    (project / "notes.txt").write_text("alpha\nbeta\n")
    return project, {**env, "KHAELOR_HOME": str(base / "home"), "ANTHROPIC_BASE_URL": fake.base_url}


def kill_experiment(base: Path, env: dict, name: str, trigger: tuple) -> dict:
    """Run the scripted session and SIGKILL it at `trigger`: ("time", seconds after the first request)
    or ("event", k: right after the k-th durable event was printed), or ("never",)."""
    base.mkdir(parents=True)
    with FakeAnthropic(session_script()) as fake:
        project, run_env = new_workspace(base, env, fake)
        out, err = base / "stdout.jsonl", base / "stderr.txt"
        started = time.monotonic()
        with open(out, "wb") as stdout, open(err, "wb") as stderr:
            proc = khaelor_popen(["-p", "tidy the notes", "--yes", "--output-format", "stream-json"],
                                 project, run_env, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr)
        deadline = time.monotonic() + 20
        while not fake.requests and time.monotonic() < deadline:
            time.sleep(0.002)
        first_request = time.monotonic()
        if trigger[0] == "time":
            time.sleep(trigger[1])
        elif trigger[0] == "event":
            with open(out, "rb") as printed:
                lines = 0
                while proc.poll() is None and time.monotonic() < deadline:
                    lines += printed.read().count(b"\n")       # what was printed since the last look
                    if lines >= trigger[1]:
                        break
                    time.sleep(0.001)
        if trigger[0] != "never" and proc.poll() is None:
            proc.kill()
        code = proc.wait(30)
        n_requests = len(fake.requests)
        rejections = list(fake.rejections)
    return {"name": name, "trigger": trigger, "code": code, "project": project, "env": run_env, "stdout": out,
            "stderr": err, "n_requests": n_requests, "rejections": rejections, "base": base,
            "seconds": time.monotonic() - first_request, "startup": first_request - started}


def phase_of(log: list, torn: bool, n_requests: int) -> str:
    """What the killed process was doing, read from what it left behind."""
    if torn:
        return "log append"
    last = log[-1]["type"] if log else None
    if last in ("ToolStarted", "PermissionGranted"):
        return "tool"
    if n_requests > sum(e["type"] == "ModelResponseCompleted" for e in log):
        return "streaming"
    if last in ("ToolCompleted", "ToolFailed", "FileModified"):
        return "between result and request"
    return "after a response"


def make_reference_run(base: Path) -> dict:
    """The whole scripted session, not killed: its log and timing calibrate the kill points."""
    env = base_env(base)
    run = kill_experiment(base / "run", env, "reference", ("never",))
    assert run["code"] == 0, run["stderr"].read_text()
    assert run["rejections"] == []
    run["log_path"] = session_files(run["env"])[-1]
    run["base_env"] = env
    return run


REFERENCE_PATHS = ("project", "stdout", "stderr", "base", "log_path")


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory, worker_id):
    """make_reference_run's, once per pytest run. Under xdist the five tests that read it go to
    different workers, and each built its own (2-3.4 s each): now the first worker to need it
    makes it in the run's shared temp folder, under a lock the others wait on, and leaves it
    there as JSON for them. The tests only read what it made."""
    if worker_id == "master":
        return make_reference_run(tmp_path_factory.mktemp("reference"))
    shared = tmp_path_factory.getbasetemp().parent / "faults-reference"
    shared.mkdir(exist_ok=True)
    saved = shared / "run.json"
    with open(shared / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not saved.exists():
            saved.write_text(json.dumps(without_the_key(make_reference_run(shared / "made")),
                                        default=str))
    run = json.loads(saved.read_text())
    for name in REFERENCE_PATHS:
        run[name] = Path(run[name])
    for name in ("env", "base_env"):
        run[name]["ANTHROPIC_API_KEY"] = KEY
    return run


def without_the_key(run: dict) -> dict:
    """The run's record with its environments' API key left out: no file may hold it (the
    suite's key scan)."""
    environments = {name: {k: v for k, v in run[name].items() if k != "ANTHROPIC_API_KEY"}
                    for name in ("env", "base_env")}
    return {**run, **environments}


def test_reference_session_uses_every_tool_path_the_kill_points_hit(reference_run):
    log = read_log(reference_run["log_path"])
    kinds = {e["type"] for e in log}
    assert {"ToolCompleted", "ToolFailed", "FileModified", "ModelThinkingBlockCompleted", "TaskCompleted"} <= kinds
    assert max(len(line) for line in reference_run["log_path"].read_bytes().splitlines()) > 60_000


def test_kill_9_at_random_points_loses_no_recorded_event_and_continue_is_valid(reference_run, tmp_path):
    rng = random.Random(SEED)
    n_events = len(read_log(reference_run["log_path"]))
    window = reference_run["seconds"] * 0.95
    triggers = [("time", round(rng.uniform(0, window), 3)) for _ in range(N_TIMED_KILLS)]
    # distinct events: a second kill after the same event adds little
    triggers += [("event", k) for k in sorted(rng.sample(range(1, n_events - 1), N_EVENT_KILLS))]
    env = reference_run["base_env"]
    with ThreadPoolExecutor(max_workers=KILL_POOL) as pool:
        runs = list(pool.map(lambda it: kill_experiment(tmp_path / f"kill{it[0]}", env, f"kill{it[0]}", it[1]),
                             enumerate(triggers)))
    phases, checked = {}, 0
    for run in runs:
        if run["code"] != -signal.SIGKILL:
            assert run["code"] == 0, run["stderr"].read_text()      # it finished before its kill point
            continue
        assert run["rejections"] == [], run["rejections"]
        [log_path] = session_files(run["env"])
        raw = log_path.read_bytes()
        whole = [json.loads(line) for line in raw[:raw.rfind(b"\n") + 1].splitlines()]
        printed = []
        for line in run["stdout"].read_bytes().splitlines(keepends=True):
            # (Claude Code's messages among the events are no events: they carry no seq)
            if line.endswith(b"\n") and "seq" in json.loads(line):
                printed.append(json.loads(line))
        # recorded before published: everything printed is in the log, in order, unchanged
        assert whole[:len(printed)] == printed and len(whole) - len(printed) <= 1
        store, request = next_request(log_path, run["project"], Path(run["env"]["KHAELOR_HOME"]), tmp_path)
        assert store.events[:len(whole)] == whole                   # opening and repairing lose nothing
        assert validate(request) is None, (run["trigger"], validate(request))
        phase = phase_of(whole, bool(raw) and not raw.endswith(b"\n"), run["n_requests"])
        phases.setdefault(phase, []).append(run)
        checked += 1
    summary = {phase: len(found) for phase, found in phases.items()}
    print(f"kill -9 points: {checked} of {len(runs)}; by phase: {summary}")
    assert checked >= len(runs) - 4, summary      # at most a few finished before their point
    assert {"streaming", "tool", "between result and request"} <= set(phases), summary

    # A real `khaelor -c` for the first kill of each phase: the fake API validates as the real one would.
    def carry_on(run):
        with FakeAnthropic([reply(text("recovered"))]) as fake:
            before = read_log(session_files(run["env"])[-1]) if session_files(run["env"]) else []
            result = run_cli(run["project"], run["env"], "-c", "-p", "carry on", "--yes", fake=fake)
            return run, result, list(fake.rejections), before
    picked = [phases[phase][0] for phase in ("streaming", "tool", "between result and request")][:N_REAL_CONTINUES]
    for run, result, rejections, before in in_parallel(*[lambda r=r: carry_on(r) for r in picked]):
        assert result.returncode == 0, (run["trigger"], result.stderr)
        assert result.stdout.strip() == "recovered" and rejections == []
        after = read_log(session_files(run["env"])[-1])
        assert after[:len(before)] == before


def test_a_log_cut_at_any_byte_keeps_every_whole_line_and_continues_validly(reference_run, tmp_path):
    """kill -9 during an append leaves a prefix of the file (one write per line): cut the reference
    log at random byte offsets, including inside its 60 KB lines."""
    rng = random.Random(SEED)
    raw = reference_run["log_path"].read_bytes()
    project, home = reference_run["project"], Path(reference_run["env"]["KHAELOR_HOME"])
    cuts = sorted(rng.randrange(1, len(raw)) for _ in range(N_TORN_APPENDS))
    for cut in cuts:
        torn = tmp_path / "torn.jsonl"
        torn.write_bytes(raw[:cut])
        whole = [json.loads(line) for line in raw[:raw.rfind(b"\n", 0, cut) + 1].splitlines()]
        store, request = next_request(torn, project, home, tmp_path)
        assert store.events[:len(whole)] == whole
        assert validate(request) is None, (cut, validate(request))


def edit_first_field(line: bytes, value) -> bytes:
    """The line's event with its first field after the envelope removed (value None) or set."""
    event = json.loads(line)
    key = [key for key in event if key not in (*events.ENVELOPE, "type")][0]
    if value is None:
        del event[key]
    else:
        event[key] = value
    return json.dumps(event).encode() + b"\n"


def test_a_corrupted_line_anywhere_is_skipped_with_a_warning_and_the_rest_continues(reference_run, tmp_path):
    """Each line in turn replaced by garbage, by half of itself, by NUL bytes (what some file
    systems leave after a power cut), or edited by hand: the log still opens, warns about that
    line, and the next request is valid."""
    lines = reference_run["log_path"].read_bytes().splitlines(keepends=True)
    project, home = reference_run["project"], Path(reference_run["env"]["KHAELOR_HOME"])
    damages = {"garbage": lambda line: b"\x8f#%garbage{{\n", "half": lambda line: line[:len(line) // 2] + b"\n",
               "nul": lambda line: b"\0" * len(line) + b"\n",
               # edited by hand: valid JSON whose first field is gone, or of another type
               "field gone": lambda line: edit_first_field(line, None),
               "field retyped": lambda line: edit_first_field(line, [1])}
    print(f"corrupted lines: {len(lines) - 1} lines x {len(damages)} kinds")
    for number in range(2, len(lines) + 1):      # line 1 is SessionCreated
        for kind, damage in damages.items():
            corrupt = tmp_path / "corrupt.jsonl"
            corrupt.write_bytes(b"".join(lines[:number - 1] + [damage(lines[number - 1])] + lines[number:]))
            store, request = next_request(corrupt, project, home, tmp_path)
            warned = any(f":{number} is not a valid event" in w for w in store.warnings)
            # a hand edit the folds can still read may stay (the log is checked field by field
            # only when its fold fails: a retyped thinking block then reaches the API as it is)
            assert warned or kind.startswith("field"), (number, kind)
            if kind != "field retyped":
                assert validate(request) is None, (number, kind, validate(request))


def test_a_corrupted_middle_line_is_reported_and_the_session_continues(reference_run, tmp_path):
    base = tmp_path / "corrupted"
    shutil.copytree(reference_run["base"], base)
    env = {**reference_run["env"], "KHAELOR_HOME": str(base / "home")}
    [copied] = session_files(env)
    log_path = events.sessions_dir(base / "home", base / "project") / copied.name    # the folder names the project
    log_path.parent.mkdir(parents=True)
    copied.rename(log_path)
    lines = log_path.read_bytes().splitlines(keepends=True)
    lines[5] = b'{"v":1,"seq":6,"ty\xff\xfe garbage\n'
    log_path.write_bytes(b"".join(lines))
    with FakeAnthropic([reply(text("still here"))]) as fake:
        result = run_cli(base / "project", env, "-c", "-p", "carry on", fake=fake)
        assert result.returncode == 0, result.stderr
        assert fake.rejections == []
    assert f"{log_path}:6 is not a valid event" in result.stderr and result.stdout.strip() == "still here"
    assert log_path.read_bytes().startswith(b"".join(lines))        # the damaged line is left as evidence


def test_a_log_from_a_newer_khaelor_is_refused_untouched(project, env):
    log_path = events.sessions_dir(env_home(env), project) / "20261130-120000000-abcdef.jsonl"
    log_path.parent.mkdir(parents=True)
    lines = [{"v": 1, "seq": 1, "id": "a", "ts": 1, "session": "s", "type": "SessionCreated", "cwd": str(project)},
             {"v": 2, "seq": 2, "id": "b", "ts": 2, "session": "s", "type": "UserMessageCreated",
              "content": [{"kind": "text", "body": "a shape this khaelor does not know"}]}]
    log_path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    before = log_path.read_bytes()
    with FakeAnthropic([reply(text("never"))]) as fake:
        result = run_cli(project, env, "-c", "-p", "second", fake=fake)
        assert result.returncode == 1 and fake.requests == []
    assert "newer khaelor" in result.stderr and "v2" in result.stderr and "Traceback" not in result.stderr
    assert log_path.read_bytes() == before


def test_a_full_disk_while_appending_is_a_clear_error_and_the_log_stays_whole(project, env):
    """RLIMIT_FSIZE makes an append write part of a line and then fail, as a full disk does."""
    small_disk = {"RLIMIT_FSIZE": 2000}     # SessionCreated and the prompt fit; the answer not
    with FakeAnthropic([reply(text("a long answer " * 400))]) as fake:
        # the forked run's own limit (set in its process, not the fork server's)
        full = run_cli(project, env, "-p", "first", fake=fake, rlimits=small_disk)
        assert full.returncode == 1, full.stderr
        assert "Traceback" not in full.stderr
        assert "cannot append to the session log (File too large)" in full.stderr.splitlines()[-1]
        [log_path] = session_files(env)
        assert log_path.read_bytes().endswith(b"\n")
        recorded = read_log(log_path)
        kinds = [e["type"] for e in recorded]
        # the request's usage (message_start) fits, and perhaps the answer's first words, not all of it
        first_saved = kinds.index("TextCheckpoint")
        assert kinds[0] == "SessionCreated"
        assert kinds[first_saved - 2:first_saved] == ["UserMessageCreated", "EnvironmentNoted"]
        assert set(kinds[first_saved:]) == {"TextCheckpoint"}
        assert recorded[first_saved]["usage"]["input_tokens"] > 0
        assert "ModelTextBlockCompleted" not in kinds

        fake.enqueue(reply(text("two")))
        again = run_cli(project, env, "-c", "-p", "second", fake=fake)
        assert again.returncode == 0, again.stderr
        assert again.stdout.strip() == "two" and fake.rejections == []
    assert read_log(log_path)[:len(recorded)] == recorded


def test_an_unusable_khaelor_home_is_a_clear_error(tmp_path, project, env):
    not_a_folder = tmp_path / "home-file"
    not_a_folder.write_text("")
    sessions_blocked = tmp_path / "home-blocked"
    sessions_blocked.mkdir()
    (sessions_blocked / "sessions").write_text("a file where the sessions folder goes")
    results = in_parallel(*[lambda home=home: run_cli(project, {**env, "KHAELOR_HOME": str(home)}, "-p", "hi",
                                                      extra_env={"ANTHROPIC_BASE_URL": "http://127.0.0.1:9"})
                            for home in (not_a_folder, sessions_blocked)])
    for home, result in zip((not_a_folder, sessions_blocked), results):
        assert result.returncode in (1, 2) and "Traceback" not in result.stderr, result.stderr
        assert len(result.stderr.splitlines()) == 1 and str(home) in result.stderr
        assert "internal error" not in result.stderr
