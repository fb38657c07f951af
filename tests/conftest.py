"""Shared fixtures: an isolated KHAELOR_HOME and project, the fake API, and the real CLI as a
subprocess (forked from a fork server, or fresh), and the order tests start in."""
import itertools
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

# PYTHONDONTWRITEBYTECODE (set in some shells and images) also stops pytest from caching the test
# modules it rewrites for its asserts: every worker rewrote and compiled all of them (~2.5 s of CPU
# each), and every fresh interpreter compiled the program. Caches go in the gitignored __pycache__.
sys.dont_write_bytecode = False

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from fake_api import FakeAnthropic, reply, text, tool_use  # noqa: E402

# Every event any test emits (in-process, and in the CLI subprocesses that inherit it) is checked
# against its kind's row in events.EVENT_KINDS: a mismatch raises where the event is made.
os.environ["KHAELOR_CHECK_EVENTS"] = "1"
# The SDK's client loads the whole trust store when it is made (~50 ms of CPU in each of the
# suite's hundreds of runs), though the fake API speaks plain HTTP: one root certificate will do.
os.environ["SSL_CERT_FILE"] = str(ROOT / "tests" / "data" / "one-root-ca.pem")


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


def start_fork_server(base: Path) -> tuple[subprocess.Popen, str]:
    """Start tests/fork_server.py listening at a socket in `base`: (the server, its address). Its
    warm-up runs in the background (this returns at once); a client that connects meanwhile waits
    for it. Closing the server's stdin ends it."""
    address = str(base / "server.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(address)
    listener.listen(16)
    (base / "project" / ".git").mkdir(parents=True)
    fake = FakeAnthropic([reply(text("Warming up."), tool_use("bash", {"command": "true"})),
                          reply(text("ok"))]).__enter__()
    warm_up = {"cwd": str(base / "project"), "argv": ["-p", "warm up", "--yes"],
               "env": {**base_env(base), "KHAELOR_HOME": str(base / "home"),
                       "ANTHROPIC_BASE_URL": fake.base_url}}
    server = [sys.executable, str(ROOT / "tests" / "fork_server.py"), str(ROOT),
              json.dumps(warm_up), str(listener.fileno())]
    proc = subprocess.Popen(server, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            pass_fds=[listener.fileno()])
    listener.close()            # the server's now: once it has gone, a connect is refused

    def end_the_warm_up():
        """The fake API lives until the warm-up has used it (the server says it is ready)."""
        proc.stdout.readline()
        fake.__exit__(None, None, None)
    threading.Thread(target=end_the_warm_up, daemon=True).start()
    return proc, address


class ForkServer:
    """A client of tests/fork_server.py: a process that imported the SDK once and forks the real
    `khaelor.main` per job. Each child is an ordinary process with its own cwd, environment and
    files; it skips only the ~1.9 s SDK import that would otherwise be most of the suite's time."""

    def __init__(self, address: str):
        self.jobs = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.jobs.connect(address)
        self.jobs.settimeout(120)       # the server's warm-up, on a machine under load
        ready = self.jobs.recv(1 << 16)
        assert ready, "the fork server ended before it was ready: its warm-up failed"
        self.jobs.settimeout(None)
        self.pids, self.statuses = {}, {}
        self.changed = threading.Condition()
        self.write_lock = threading.Lock()
        self.numbers = itertools.count()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        try:
            while data := self.jobs.recv(1 << 16):
                message = json.loads(data)
                with self.changed:
                    if "pid" in message:
                        self.pids[message["id"]] = message["pid"]
                    else:
                        self.statuses[message["id"]] = message["status"]
                    self.changed.notify_all()
        except OSError:
            return      # close() at the end of the run: the socket went from under this recv

    def spawn(self, argv, cwd, env, fds=(0, 1, 2), tty=None, closed=(), rlimits=None) -> tuple:
        """Start `khaelor *argv` with `fds` as its stdin, stdout and stderr (or, with `tty`, as a
        terminal's session leader), without the fds in `closed` and under `rlimits` (see
        fork_server.py); returns (the job's id, its pid)."""
        job_id = f"job-{next(self.numbers)}"
        job = {"id": job_id, "argv": list(argv), "cwd": str(cwd), "env": env, "tty": tty,
               "closed": list(closed), "rlimits": rlimits or {}}
        with self.write_lock:
            socket.send_fds(self.jobs, [json.dumps(job).encode()], [] if tty else list(fds))
        with self.changed:
            assert self.changed.wait_for(lambda: job_id in self.pids, timeout=20)
            return job_id, self.pids[job_id]

    def status(self, job_id, timeout=None):
        """The job's raw wait status once it has ended, or None if it still runs after `timeout`."""
        with self.changed:
            self.changed.wait_for(lambda: job_id in self.statuses, timeout)
            return self.statuses.get(job_id)

    def close(self):
        self.jobs.close()


class ForkedPopen(subprocess.Popen):
    """subprocess.Popen([python, khaelor.py, *argv], ...) whose child the fork server forks: the
    same pipes, files, terminals and contract (communicate, wait, poll, signals, returncode). It
    replaces only the three steps of Popen that start and reap a child (CPython's POSIX ones).
    Two options a preexec_fn would otherwise give a fresh child: `closed`, the fds of 0-2 it
    starts without (what preexec_fn=lambda: os.close(0) does), and `rlimits`, the resource
    limits it runs under ({"RLIMIT_FSIZE": 2000}: soft and hard)."""

    def __init__(self, *args, closed=(), rlimits=None, **options):
        self.closed, self.rlimits = closed, rlimits
        super().__init__(*args, **options)

    def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env,
                       startupinfo, creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite,
                       errread, errwrite, restore_signals, gid, gids, uid, umask,
                       start_new_session, process_group):
        assert preexec_fn is None and not pass_fds and not start_new_session and umask == -1, \
            "a forked run takes none of these: pass fresh=True"
        # -1: not redirected, so the child inherits this process's own fd, as a fresh one does
        given = (p2cread, c2pwrite, errwrite)
        fds = [fd if fd != -1 else inherited for inherited, fd in enumerate(given)]
        # and this process's directory and environment, unless given
        cwd = os.getcwd() if cwd is None else cwd
        env = dict(os.environ) if env is None else env
        self.job, self.pid = fork_server().spawn(args[2:], cwd, env, fds, closed=self.closed,
                                                 rlimits=self.rlimits)
        self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)

    def _try_wait(self, wait_flags):
        status = fork_server().status(self.job, 0 if wait_flags & os.WNOHANG else None)
        return (0, 0) if status is None else (self.pid, status)

    def _internal_poll(self, _deadstate=None, **_):
        if self.returncode is None:
            status = fork_server().status(self.job, 0)
            if status is not None:
                self._handle_exitstatus(status)
        return self.returncode


_fork_server = {}
_fork_server_lock = threading.Lock()
# where an xdist run's fork server listens: the controller starts it, its workers connect
FORK_SERVER_ADDRESS = "KHAELOR_TESTS_FORK_SERVER"


def fork_server() -> ForkServer:
    """This worker's client of the run's fork server (connected on first use). Without xdist,
    this process starts the server itself."""
    with _fork_server_lock:
        if "client" not in _fork_server:
            address = os.environ.get(FORK_SERVER_ADDRESS)
            if address is None:
                base = _fork_server["config"]._tmp_path_factory.mktemp("fork-server")
                _fork_server["process"], address = start_fork_server(base)
            _fork_server["client"] = ForkServer(address)
        return _fork_server["client"]


def end_fork_server() -> None:
    """Close this process's client, and the server if this process started it."""
    if "client" in _fork_server:
        _fork_server.pop("client").close()
    if "process" in _fork_server:
        process = _fork_server.pop("process")
        process.stdin.close()
        process.wait(timeout=20)


def khaelor_popen(argv, cwd, env, fresh=False, **options) -> subprocess.Popen:
    """subprocess.Popen of `python khaelor.py *argv`, forked from the fork server; fresh=True
    starts a new interpreter instead, where only that proves the point (cold start, limits)."""
    popen = subprocess.Popen if fresh else ForkedPopen
    return popen([sys.executable, str(ROOT / "khaelor.py"), *argv], cwd=cwd, env=env, **options)


def run_khaelor(argv, cwd, env, stdin=None, timeout=60, fresh=False,
                **options) -> subprocess.CompletedProcess:
    """What subprocess.run(input=stdin, capture_output=True, text=True, timeout=timeout, **options)
    gives for `python khaelor.py *argv` (its own lines, since it cannot be given another Popen)."""
    # no input given: /dev/null, as a script's run has it (never the terminal pytest runs in)
    options = {"stdin": subprocess.DEVNULL if stdin is None else subprocess.PIPE,
               "stdout": subprocess.PIPE,
               "stderr": subprocess.PIPE, "text": True, **options}
    with khaelor_popen(argv, cwd, env, fresh, **options) as process:
        try:
            stdout, stderr = process.communicate(stdin, timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
        return subprocess.CompletedProcess(process.args, process.poll(), stdout, stderr)


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

    def popen(self, *args, fresh=False, **options):
        options = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, **options}
        return khaelor_popen(args, self.project, self.env, fresh, **options)

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
    # a connection a command made is queued before the command ends, so was_reached, asked after,
    # finds it at once: the timeout only bounds the look when none came
    server.settimeout(0.1)
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
    config.addinivalue_line("markers", "suite_end: runs after every other test "
                                       "(it checks what the run left behind)")


# The tests that take longest (seconds with three workers, setup included, the parameters'
# longest): they start first, and pyproject's --maxschedchunk 1 hands the tests out one by one,
# so that no worker is left running a long one at the end while the others idle. A test missing
# here only starts later; the figures need only keep their order.
LONG_TESTS = {
    "test_kill_9_at_random_points_loses_no_recorded_event_and_continue_is_valid": 30,
    # first with the kill test: the worker that runs the first of them makes reference_run, the
    # session both read, for every worker (test_faults.py)
    "test_reference_session_uses_every_tool_path_the_kill_points_hit": 30,
    "test_a_log_cut_at_any_byte_keeps_every_whole_line_and_continues_validly": 10,
    "test_a_checkpoint_does_not_wait_on_a_fifo_planted_as_packed_refs": 10,
    "test_rewind_brings_back_what_each_destructive_command_wiped": 10,
    "test_a_closed_pipe_ends_quietly_with_141_in_every_output_format": 8,
    "test_sessions_are_listed_from_their_meta_caches_and_rebuilt_when_stale": 8,
    "test_a_resumed_session_shows_what_the_live_one_showed": 7,
    "test_every_transient_api_fault_is_retried_visibly_and_the_task_completes": 4,
    "test_a_full_disk_while_appending_is_a_clear_error_and_the_log_stays_whole": 7,
    "test_rewinding_a_file_the_user_changed_since_asks": 7,
    "test_a_project_that_works_with_claude_code_works_unchanged": 7,
    "test_a_cloned_config_grants_nothing_until_trusted_and_a_change_withdraws_the_trust": 6,
    "test_thinking_streams_as_one_line_ctrl_o_opens_it_and_a_resume_shows_it_as_it_was": 3,
    "test_processes_that_ignore_sigterm_or_never_read_stdin_are_bounded": 6,
    "test_a_pipe_on_stdin_that_stays_silent_is_left_after_a_wait": 2,
    "test_a_rewind_lists_each_change_on_its_own_line_with_names_as_written": 5,
    "test_a_custom_command_runs_headless_with_its_template_and_model": 5,
    "test_a_forked_run_does_what_a_fresh_process_does": 5,
    "test_text_streamed_a_second_before_a_kill_is_in_the_next_request": 5,
    "test_open_and_quit_leaves_no_session_and_continue_finds_the_conversation": 5,
    "test_continue_sends_the_same_history_into_the_next_request": 4,
    "test_a_torn_last_line_is_recovered_on_continue": 4,
    "test_listing_two_hundred_sessions_reads_only_the_caches": 4,
    "test_trust_without_a_terminal_trusts_nothing_unless_told_yes": 4,
    "test_flags_and_config_shape_the_request_and_a_resume_keeps_them": 3,
    "test_an_approved_outside_path_is_opened_where_it_was_judged": 3,
    "test_context_shows_the_cached_tokens_of_the_last_response": 3,
    "test_a_repositorys_own_prices_count_only_once_trusted": 3,
    "test_ordinary_work_keeps_working_in_an_approved_sandbox": 3,
    "test_the_session_temp_dir_serves_mktemp_pytest_and_multiprocessing_and_goes_at_close": 3,
    "test_bad_tool_calls_from_the_model_become_repairable_errors": 3,
    "test_a_hijacked_model_runs_hidden_commands_without_a_question": 3,
    "test_permissions_check_reports_decisions_as_json": 3,
    "test_ctrl_l_and_redraws_leave_no_copy_of_the_status_line_or_composer_in_the_scrollback": 3,
    "test_headless_stops_a_doom_loop_with_a_clear_message": 3,
    "test_a_failed_continue_does_not_print_the_previous_answer": 3,
    "test_a_hostile_repository_runs_no_code_through_the_real_program": 3,
    "test_the_terminal_is_restored_after_a_ui_exception_sigterm_and_sighup": 2,
    "test_sigterm_and_sighup_in_headless_mode_stop_tools_and_keep_the_log": 3,
    "test_undo_works_after_continue": 3,
    "test_an_approved_pip_install_can_install_where_pip_installs_and_an_unapproved_one_cannot": 3,
    "test_disallowed_tools_denies_even_under_yes": 3,
    "test_append_system_prompt_is_its_own_cached_block_on_every_request": 3,
    "test_a_scripted_session_uses_all_seven_tools": 2,
    "test_accept_edits_writes_project_files_without_asking": 2,
    "test_permissions_and_trust_show_every_byte_of_a_rule_none_interpreted": 2,
    "test_json_output_has_claude_codes_result_fields_beside_khaelors": 2,
    "test_mentions_list_folders_new_files_and_quote_spaces_outside_git": 2,
    "test_a_denied_check_is_not_asked_for_again": 2,
    "test_sessions_without_a_user_message_are_not_listed_or_continued": 2,
    "test_trust_shows_the_grants_then_asks_and_only_yes_trusts": 2,
    "test_hostile_files_and_commands_give_bounded_results_end_to_end": 2,
    "test_the_gate_nudges_after_a_code_edit_until_a_check_runs": 2,
    "test_a_link_swapped_in_never_carries_the_python_search_out_of_the_project": 2,
    "test_price_overrides_reach_sessions_and_the_json_cost": 2,
    "test_a_corrupted_line_anywhere_is_skipped_with_a_warning_and_the_rest_continues": 2,
    "test_khaelor_prunes_file_versions_unused_for_thirty_days_at_start": 2,
    "test_baselines_and_attribution_keep_the_users_changes_apart": 2,
    "test_judging_grows_linearly_with_the_command": 2,
    "test_sessions_lists_id_title_tokens_and_cost": 2,
    "test_an_always_grant_is_persisted_and_honoured_by_a_new_process": 2,
    "test_a_ci_script_reads_the_result_from_the_pipe": 2,
}


def pytest_collection_modifyitems(items):
    """Longest first, then the rest in their order; the suite_end tests last of all."""
    def order(item):
        last = item.get_closest_marker("suite_end") is not None
        return last, -LONG_TESTS.get(item.originalname, 0)
    items.sort(key=order)


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
        settings = cli.load_settings(args, home, project)
        kernel = cli.build_kernel(args, settings, store, events.Bus(store), home, project, ask)
        kernel.submit(prompt)
        try:
            return await kernel.run(), store.events
        finally:
            await kernel.toolbox.close()
            await kernel.model.close()
    return lambda prompt, ask: asyncio.run(turn(prompt, ask))


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session):
    """In an xdist controller, before its workers start (xdist starts them here too): one fork
    server for all of them (they inherit its address), its SDK import and warm-up (~2.5 s of CPU)
    made once, while the workers start."""
    config = session.config
    if not hasattr(config, "workerinput") and getattr(config.option, "numprocesses", None):
        base = config._tmp_path_factory.getbasetemp() / "fork-server"
        base.mkdir()
        _fork_server["process"], os.environ[FORK_SERVER_ADDRESS] = start_fork_server(base)


def pytest_unconfigure(config):
    end_fork_server()


_suite_end = {}


def pytest_runtest_logreport(report):
    """In the controller: when the suite_end key scan that passed began (its report's start)."""
    if report.when == "call" and report.passed and "suite_end" in report.keywords:
        _suite_end["scan_began"] = report.start


def pytest_sessionfinish(session, exitstatus):
    """In parallel runs the suite_end key scan runs while the other workers may still be writing,
    so the controller scans every worker's folders again once all of them are done, and fails the
    run if any file khaelor wrote holds the API key. It reads again only the files made or changed
    (written, renamed, linked: their ctime) since that scan began: it read the others."""
    config = session.config
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        return
    base = config._tmp_path_factory.getbasetemp()
    key = b"sk-test-secret-key"
    read_since = _suite_end.get("scan_began", 0) - 1        # a second for the clock's grain
    for path in base.rglob("*"):
        if not path.is_file() or path.is_symlink() or path.name == "secrets.env":
            continue
        status = path.stat()
        if status.st_size > 64 << 20 or max(status.st_mtime, status.st_ctime) < read_since:
            continue
        if key in path.read_bytes():
            print(f"\nFAILED: the API key was written to {path}")
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
            return


def new_session(*args: str) -> None:
    """tmux new-session, again when it met the server exiting: the workers share tmux's server,
    which exits as its last session is killed, and a session started at that moment fails
    ("server exited unexpectedly")."""
    for _ in range(5):
        done = subprocess.run(["tmux", "new-session", *args], capture_output=True, text=True)
        if done.returncode == 0:
            return
        time.sleep(0.1)
    raise subprocess.CalledProcessError(done.returncode, done.args, done.stdout, done.stderr)
