"""End to end: the real `khaelor -p` process, the real anthropic SDK, the scripted fake API."""
import contextlib
import json
import os
import pty
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

import events
import sandbox
from conftest import run_khaelor
from fake_api import error, redacted_thinking, reply, text, thinking, tool_use


def strip_request(messages):
    """A request's messages without the cache breakpoints: what history gives (the turn's
    environment facts are history too: EnvironmentNoted)."""
    messages = json.loads(json.dumps(messages))
    for message in messages:
        for block in message["content"] if isinstance(message["content"], list) else []:
            block.pop("cache_control", None)
    return messages


def said(message) -> list[str]:
    """The texts of a user message but the environment facts."""
    texts = [block["text"] for block in message["content"] if block["type"] == "text"]
    return [text for text in texts if not text.startswith("<environment>")]


def assert_no_rejections(fake):
    assert fake.rejections == [], fake.rejections


def test_a_multi_step_tool_loop_runs_and_every_request_is_valid(khaelor, fake, project):
    (project / "notes.txt").write_text("alpha\nbeta\n")
    fake.enqueue(
        reply(text("Reading the notes."), tool_use("read", {"file_path": "notes.txt"})),
        reply(tool_use("bash", {"command": "echo gamma >> notes.txt"})),
        reply(tool_use("bash", {"command": "wc -l notes.txt"})),
        reply(text("notes.txt now has 3 lines.")),
    )
    result = khaelor.run("-p", "count the notes", "--yes")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "notes.txt now has 3 lines."
    assert_no_rejections(fake)
    assert len(fake.requests) == 4
    assert (project / "notes.txt").read_text() == "alpha\nbeta\ngamma\n"
    last = fake.requests[-1]["body"]["messages"]
    results = [b for m in last for b in m["content"] if isinstance(b, dict) and b["type"] == "tool_result"]
    assert "alpha" in results[0]["content"] and "3 notes.txt" in results[2]["content"]


def test_replaying_the_log_gives_the_messages_that_were_sent(khaelor, fake, project):
    fake.enqueue(reply(tool_use("bash", {"command": "echo one"})), reply(tool_use("bash", {"command": "echo two"})),
                 reply(text("done")))
    assert khaelor.run("-p", "go", "--yes").returncode == 0
    replayed = events.replay(events.SessionStore.open(khaelor.session_files()[-1]).events).messages
    for request in fake.requests:
        sent = strip_request(request["body"]["messages"])
        assert json.dumps(sent) == json.dumps(replayed[:len(sent)])


def test_continue_sends_the_same_history_into_the_next_request(khaelor, fake):
    fake.enqueue(reply(tool_use("bash", {"command": "echo hi"})), reply(text("first answer")))
    assert khaelor.run("-p", "first", "--yes").returncode == 0
    before = strip_request(fake.requests[-1]["body"]["messages"])
    fake.enqueue(reply(text("second answer")))
    result = khaelor.run("-c", "-p", "second")
    assert result.returncode == 0, result.stderr
    after = strip_request(fake.requests[-1]["body"]["messages"])
    assert json.dumps(after[:len(before)]) == json.dumps(before)
    assert after[len(before)] == {"role": "assistant", "content": [{"type": "text", "text": "first answer"}]}
    assert after[-1]["content"][-2] == {"type": "text", "text": "second"}
    assert after[-1]["content"][-1]["text"].startswith("<environment>")
    assert len(khaelor.session_files()) == 1
    assert_no_rejections(fake)


def test_kill_9_mid_stream_then_continue_gives_a_valid_request(khaelor, fake):
    fake.enqueue(reply(text("word " * 400), chunk=5, delay=0.01))
    proc = khaelor.popen("-p", "write a lot", "--yes")
    deadline = time.time() + 30
    while not fake.requests and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)   # well into the stream
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    fake.enqueue(reply(text("recovered")))
    result = khaelor.run("-c", "-p", "try again")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "recovered"
    assert_no_rejections(fake)
    sent = strip_request(fake.requests[-1]["body"]["messages"])
    # the words saved before the kill are kept as the cut-off answer, between the two messages
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    kept = [block["text"] for block in sent[1]["content"]]
    assert len(kept) == 1 and kept[0].startswith("word word") and ("word " * 400).startswith(kept[0])
    assert said(sent[0]) == ["write a lot"]
    assert said(sent[2])[0].startswith("[I interrupted your reply here") and said(sent[2])[1:] == ["try again"]


def test_refused_tool_calls_are_said_on_stderr_and_listed_in_the_result(khaelor, fake, tmp_path):
    """-p under --yes: a write outside the project, a command a deny rule names, and one that
    would need a person all end refused; the run goes on (exit 0, as Claude Code's), but a script
    is told which calls were refused, on stderr and in the result's permission_denials."""
    outside = tmp_path / "outside.txt"
    calls = [tool_use("write", {"file_path": str(outside), "content": "x"}, id="toolu_w"),
             tool_use("bash", {"command": "touch denied-by-rule.txt"}, id="toolu_b")]
    for output_format in ("text", "json"):
        fake.enqueue(reply(*calls), reply(text("did what I could")))
        result = khaelor.run("-p", "go", "--yes", "--disallowedTools", "Bash(touch:*)",
                             "--output-format", output_format)
        assert result.returncode == 0, result.stderr
        said_no = [line for line in result.stderr.splitlines()
                   if line.startswith(("khaelor: refused", "khaelor: denied"))]
        assert len(said_no) == 2, result.stderr
        assert str(outside) in said_no[0] and "touch denied-by-rule.txt" in said_no[1]
        assert "--disallowedTools" in said_no[1]
    # a command that ran, confined, and was refused a write outside: said, and listed
    confining = {"command": f"echo x > {tmp_path / 'o2.txt'}"}
    fake.enqueue(reply(tool_use("bash", confining, id="toolu_s")), reply(text("tried")))
    confined = khaelor.run("-p", "go", "--yes", "--output-format", "json")
    assert confined.returncode == 0 and not (tmp_path / "o2.txt").exists()
    said = f"khaelor: the sandbox refused a command: it would need write access to {tmp_path}"
    assert said in confined.stderr, confined.stderr
    assert json.loads(confined.stdout)["permission_denials"] == [
        {"tool_name": "bash", "tool_use_id": "toolu_s", "tool_input": confining}]
    listed = json.loads(result.stdout)["permission_denials"]
    assert listed == [{"tool_name": "write", "tool_use_id": "toolu_w",
                       "tool_input": {"file_path": str(outside), "content": "x"}},
                      {"tool_name": "bash", "tool_use_id": "toolu_b",
                       "tool_input": {"command": "touch denied-by-rule.txt"}}]
    assert not outside.exists() and not (khaelor.project / "denied-by-rule.txt").exists()
    fake.enqueue(reply(text("nothing refused")))
    again = json.loads(khaelor.run("-c", "-p", "again", "--output-format", "json").stdout)
    assert again["permission_denials"] == []          # the earlier run's are not this one's


def test_claude_codes_stream_json_command_line_runs_as_it_is(khaelor, fake):
    """`claude -p … --output-format stream-json --verbose` (Claude Code refuses stream-json without
    --verbose, so every script passes it) was refused here: unrecognized arguments."""
    fake.enqueue(reply(text("streamed")))
    result = khaelor.run("-p", "hi", "--output-format", "stream-json", "--verbose")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert lines[-1]["type"] == "result" and lines[-1]["result"] == "streamed"


def test_kill_9_while_a_reply_pauses_mid_text_keeps_the_words_already_shown(khaelor, fake):
    """A reply that streams a few words and then goes quiet (the model thinking between sentences,
    a slow network): the words on screen reach the log within a fraction of a second even though
    no further delta arrives to trigger a save, so a kill -9 during the pause loses none of them."""
    fake.enqueue(reply(text("early words on screen. " + "the rest never comes " * 20), chunk=23,
                       stall_after_events=4, stall_seconds=30))
    proc = khaelor.popen("-p", "write a lot")
    deadline = time.time() + 10
    while not fake.requests and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(1.2)         # the pause: the first delta came, nothing since
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    fake.release()
    saved = "".join(e["text"] for e in khaelor.log() if e["type"] == "TextCheckpoint")
    assert saved == "early words on screen. "


def test_kill_9_while_the_model_thinks_keeps_its_line_for_the_resume(khaelor, fake):
    """The screen showed `✻ Thinking · 1s · Plan it…` when khaelor was killed, and `khaelor -c`
    showed nothing there: thinking reached the log only as a finished block. What streams of it is
    saved on the clock as text is, and the resume's Interrupted draws its line (never sent)."""
    import ui
    fake.enqueue(reply(thinking("Plan it carefully. " * 20), text("never shown"), chunk=6,
                       stall_after_events=8, stall_seconds=30))
    # (stream-json: someone watches, so the API is asked for the thinking's text)
    proc = khaelor.popen("-p", "think hard", "--output-format", "stream-json", "--verbose")
    deadline = time.time() + 10
    while not fake.requests and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(1.2)         # the pause: five deltas of thinking came, nothing since
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    fake.release()
    fake.enqueue(reply(text("Went on.")))
    result = khaelor.run("-c", "-p", "go on")
    assert result.returncode == 0, result.stderr
    log = khaelor.log()
    [cut] = [e for e in log if e["type"] == "Interrupted"]
    assert cut["thinking"] == "Plan it carefully. Plan it car" and cut["thinking_ms"] >= 0
    shown = "\n".join(ui.render_transcript(log, 80))
    assert "✻ Thinking · 1s · Plan it carefully. Plan it car\n\n■ Interrupted" in shown, shown
    sent = json.dumps(fake.requests[-1]["body"]["messages"])
    assert "Plan it" not in sent and "Went on." in result.stdout
    assert_no_rejections(fake)


def test_kill_9_while_a_command_runs_keeps_what_it_printed(khaelor, fake):
    """The user watched a long command print its failures, then khaelor was killed: on resume the
    cancelled result gives the model (and the replay) that output, not only "khaelor exited"."""
    fake.enqueue(reply(tool_use("bash", {"command": "echo 'FAILED test_b: 2 != 3'; sleep 30"})))
    proc = khaelor.popen("-p", "run the tests", "--yes")
    deadline = time.time() + 20
    while time.time() < deadline and not list(Path(khaelor.env["KHAELOR_HOME"]).glob(
            "spill/*/running-*.txt")):
        time.sleep(0.05)
    [live] = Path(khaelor.env["KHAELOR_HOME"]).glob("spill/*/running-*.txt")
    while time.time() < deadline and b"FAILED" not in live.read_bytes():
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    fake.enqueue(reply(text("b fails")))
    result = khaelor.run("-c", "-p", "what failed?")
    assert result.returncode == 0, result.stderr
    [cancelled] = [e for e in khaelor.log() if e["type"] == "ToolCancelled"]
    assert cancelled["output"] == "FAILED test_b: 2 != 3"
    sent = json.dumps(fake.requests[-1]["body"]["messages"])
    assert ("khaelor exited while the tool was running; its command was stopped on resume. "
            "Its output until then:") in sent
    assert "FAILED test_b: 2 != 3" in sent and not live.exists()
    # the `sleep 30` the killed khaelor left is stopped, not left to run on
    [started] = [e for e in khaelor.log() if e["type"] == "CommandStarted"]
    assert not sandbox.pids_in_groups({started["pid"]})
    assert_no_rejections(fake)


def test_kill_9_while_a_background_process_runs_keeps_what_it_printed(khaelor, fake):
    """A server the model started printed its error, then khaelor was killed: `khaelor -c` closes
    the process the log still calls running with that output, which the replay shows under its
    line and the model reads when it asks for the process again."""
    import ui
    command = "echo 'listening on 8123'; echo 'ERROR: db down'; sleep 30"
    fake.enqueue(reply(tool_use("process", {"action": "start", "command": command})),
                 reply(text("waiting " * 50), chunk=5, stall_after_events=4, stall_seconds=30))
    proc = khaelor.popen("-p", "start the server", "--yes")
    home = Path(khaelor.env["KHAELOR_HOME"])
    deadline = time.time() + 20
    while time.time() < deadline and not list(home.glob("spill/*/running-*-p1.txt")):
        time.sleep(0.05)
    [live] = home.glob("spill/*/running-*-p1.txt")
    # the start call has its result: the model streams its next reply (stalled)
    while time.time() < deadline and (b"ERROR" not in live.read_bytes() or len(fake.requests) < 2):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    fake.release()
    [started] = [e for e in khaelor.log() if e["type"] == "ProcessStarted"]
    try:
        fake.enqueue(reply(tool_use("process", {"action": "read", "id": "p1"})),
                     reply(text("the db is down")))
        result = khaelor.run("-c", "-p", "what did the server say?", "--yes")
    finally:
        with contextlib.suppress(OSError):
            os.killpg(started["pid"], signal.SIGKILL)       # no khaelor manages it any more
    assert result.returncode == 0, result.stderr
    log = khaelor.log()
    [lost] = [e for e in log if e["type"] == "ProcessExited"]
    assert lost["output"] == "listening on 8123\nERROR: db down" and not live.exists()
    sent = json.dumps(fake.requests[-1]["body"]["messages"])
    assert "p1 was lost when khaelor exited" in sent and "ERROR: db down" in sent
    shown = "\n".join(ui.render_transcript(log, 80))
    # the server a killed khaelor left running (its group, named by pid and start) is stopped
    assert "◆ process p1: lost: khaelor exited while it ran; stopped on resume\n  ⎿ listening" in shown
    assert "started_ticks" in started and not sandbox.pids_in_groups({started["pid"]})
    # the resumed turn's facts say so before the model asks (the next turn's no more)
    facts = json.dumps(fake.requests[-2]["body"]["messages"][-1])
    assert "- p1: echo 'listening on 8123'" in facts and "(lost: khaelor exited while it ran" in facts
    assert "ERROR: db down" in shown
    assert_no_rejections(fake)


def test_kill_9_mid_reply_still_counts_the_request_that_reached_the_api(khaelor, fake):
    """message_start says what the request's input cost before any text streams: it is in the log
    at once, so after a kill -9 the resumed session counts it (once), never $0 for a paid request."""
    paid = {"input_tokens": 50_000, "cache_read_input_tokens": 7_000}
    fake.enqueue(reply(text("word " * 200), chunk=5, stall_after_events=4, stall_seconds=30,
                       usage=paid))
    proc = khaelor.popen("-p", "write a lot")
    deadline = time.time() + 10
    while time.time() < deadline and not (
            khaelor.session_files() and any(e.get("usage") for e in khaelor.log())):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    fake.release()
    fake.enqueue(reply(text("recovered"),
                       usage={"input_tokens": 10, "cache_read_input_tokens": 0, "output_tokens": 33}))
    result = khaelor.run("-c", "-p", "again", "--output-format", "json")
    assert result.returncode == 0, result.stderr
    usage = json.loads(result.stdout)["usage"]
    assert usage["input_tokens"] == 50_010 and usage["cache_read_input_tokens"] == 7_000
    # a response that completes is counted once: its start's report is replaced, not added to
    assert usage["output_tokens"] == 1 + 33      # the cut-off one's start said 1


def test_rate_limits_and_overload_are_retried_until_the_task_completes(khaelor, fake):
    fake.enqueue(error("rate_limit_error", "slow down", status=429, **{"retry-after": "0.01"}),
                 error("overloaded_error", "Overloaded", status=529, **{"retry-after": "0.01"}),
                 reply(text("made it")))
    result = khaelor.run("-p", "hello")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "made it"
    assert len(fake.requests) == 3
    assert "429" in result.stderr and "529" in result.stderr   # each retry is visible


def test_a_persistent_500_ends_with_exit_1_naming_the_status(khaelor, fake):
    fake.enqueue(*[error("api_error", "Internal server error", status=500, **{"retry-after": "0.01"})] * 5)
    result = khaelor.run("-p", "hello")
    assert result.returncode == 1
    assert "500" in result.stderr.splitlines()[-1]
    assert "Traceback" not in result.stderr
    log = khaelor.log()
    assert log[-1]["type"] == "TaskFailed"


def test_a_mid_stream_error_event_and_a_dropped_connection_are_retried(khaelor, fake):
    fake.enqueue({"content": [text("partial answer that will be lost")], "stream_error":
                  {"type": "overloaded_error", "message": "Overloaded"}},
                 {"content": [text("also lost " * 20)], "drop_after_events": 4},
                 reply(text("complete answer")))
    # the backoff a tenth of its figures (test_model checks them): 0.1 s in all, not 1.3 s
    quick = {"KHAELOR_TEST_CONSTANTS": json.dumps({"model.BASE_DELAY_S": 0.05})}
    result = khaelor.run("-p", "hello", "--output-format", "json", env=quick)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["result"] == "complete answer"
    history = events.replay(khaelor.log()).messages
    assert history[-1] == {"role": "assistant", "content": [{"type": "text", "text": "complete answer"}]}
    assert_no_rejections(fake)


def test_a_torn_last_line_is_recovered_on_continue(khaelor, fake):
    fake.enqueue(reply(text("one")))
    assert khaelor.run("-p", "first").returncode == 0
    path = khaelor.session_files()[-1]
    with open(path, "ab") as f:
        f.write(b'{"v":1,"seq":77,"type":"ToolReq')
    fake.enqueue(reply(text("two")))
    result = khaelor.run("-c", "-p", "second")
    assert result.returncode == 0, result.stderr
    assert "cut off mid-write" in result.stderr
    assert_no_rejections(fake)
    assert all(json.loads(line) for line in path.read_text().splitlines())


def test_stream_json_prints_every_durable_event_as_it_is_recorded(khaelor, fake):
    """Every event of the log as it is recorded, and among them Claude Code's messages (a script
    written for `claude -p --output-format stream-json` read none: its session_id from the system
    init line, the text from assistant messages, the tool results from user ones)."""
    fake.enqueue(reply(text("running it"), tool_use("bash", {"command": "echo hi"}, id="toolu_1")),
                 reply(text("ok")))
    result = khaelor.run("-p", "go", "--yes", "--output-format", "stream-json")
    assert result.returncode == 0, result.stderr
    printed = [json.loads(line) for line in result.stdout.splitlines()]
    logged = [line for line in printed if "seq" in line]
    assert logged == khaelor.log() and printed[-1]["type"] == "result"
    assert {"ToolRequested", "ToolCompleted", "ModelResponseCompleted", "TaskCompleted"} <= {e["type"] for e in printed}
    claude = [line for line in printed if line["type"] in ("system", "assistant", "user", "result")]
    kinds = [line["type"] for line in claude]
    assert kinds == ["system", "assistant", "user", "assistant", "result"]
    session = printed[-1]["session_id"]
    assert claude[0]["subtype"] == "init" and "bash" in claude[0]["tools"]
    assert {line["session_id"] for line in claude} == {session}
    assert claude[1]["message"]["content"] == [
        {"type": "text", "text": "running it"},
        {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "echo hi"}}]
    result_block = claude[2]["message"]["content"][0]
    assert result_block["type"] == "tool_result" and result_block["tool_use_id"] == "toolu_1"
    assert "hi" in result_block["content"] and claude[3]["message"]["content"][0]["text"] == "ok"


def test_max_turns_stops_the_loop_with_exit_1(khaelor, fake):
    fake.enqueue(*[reply(tool_use("bash", {"command": f"echo {i}"})) for i in range(5)])
    result = khaelor.run("-p", "loop", "--yes", "--max-turns", "2", "--output-format", "json")
    assert result.returncode == 1
    assert "--max-turns 2" in result.stderr
    assert len(fake.requests) == 2
    # as Claude Code's: error_max_turns, is_error, and why in `errors` (a list of strings)
    answer = json.loads(result.stdout)
    assert answer["subtype"] == "error_max_turns" and answer["is_error"] is True
    assert len(answer["errors"]) == 1 and "--max-turns 2" in answer["errors"][0], answer


def test_usage_errors_are_one_line_with_exit_2(khaelor, fake):
    no_key = khaelor.run("-p", "hi", env={"ANTHROPIC_API_KEY": ""})
    assert no_key.returncode == 2 and "ANTHROPIC_API_KEY" in no_key.stderr and len(no_key.stderr.splitlines()) == 1
    unknown = khaelor.run("-r", "nope", "-p", "hi")
    assert unknown.returncode == 2 and "khaelor sessions" in unknown.stderr
    nothing = khaelor.run("-c", "-p", "hi")
    assert nothing.returncode == 2 and "no earlier session" in nothing.stderr
    # "" is a prefix of every id: it started a new session without a word
    empty = khaelor.run("-r", "", "-p", "hi")
    assert empty.returncode == 2 and "-r needs a session id" in empty.stderr
    # (it said "run without -c", which rewind has not; no session is nothing to rewind: exit 1)
    no_steps = khaelor.run("rewind")
    assert no_steps.returncode == 1 and "no session in this project yet" in no_steps.stderr
    assert len(no_steps.stderr.splitlines()) == 1
    bad_flag = khaelor.run("--frobnicate")
    assert bad_flag.returncode == 2 and "Traceback" not in bad_flag.stderr
    assert fake.requests == []


def test_text_piped_in_follows_the_prompt_and_a_bare_p_reads_the_prompt_from_the_pipe(
        khaelor, fake, project):
    """`git diff | khaelor -p "write the commit message"` sent the prompt alone, and `echo task |
    khaelor -p` was a usage error: Claude Code takes both; a byte that is not UTF-8 crashed."""
    fake.enqueue(*[reply(text(str(n))) for n in range(5)])
    assert khaelor.run("-p", "explain this log", stdin="E1 disk full\n").returncode == 0
    assert khaelor.run("-p", stdin="say two\n").returncode == 0
    assert khaelor.run("-p", "nothing piped").returncode == 0         # stdin is /dev/null
    # bytes that are not UTF-8 (a binary file, a latin-1 log) crashed the run
    latin = run_khaelor(["-p", "-"], project, khaelor.env, "caf\udce9\n", errors="surrogateescape")
    assert latin.returncode == 0, latin.stderr
    argv = khaelor.run("-p", "caf\udce9 (an argument)")
    assert argv.returncode == 0, argv.stderr
    asked = [said(request["body"]["messages"][0]) for request in fake.requests]
    assert asked == [["explain this log\n\nE1 disk full\n"], ["say two\n"], ["nothing piped"],
                     ["caf\ufffd\n"], ["caf\ufffd (an argument)"]]


def test_a_pipe_on_stdin_that_stays_silent_is_left_after_a_wait(khaelor, fake, project):
    """A CI runner's stdin may be a pipe that never closes: -p PROMPT must not wait for it."""
    from conftest import khaelor_popen
    fake.enqueue(reply(text("went on")))
    # the wait at 1 s, not its 3 s, in this run (what is checked is that it ends)
    run_env = {**khaelor.env, "KHAELOR_TEST_CONSTANTS": json.dumps({"khaelor.STDIN_WAIT_S": 1.0})}
    with khaelor_popen(["-p", "hi"], project, run_env, stdin=subprocess.PIPE,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:
        # a khaelor that waits for EOF fails the test instead of hanging it
        closing = threading.Timer(20, process.stdin.close)
        closing.start()
        start = time.monotonic()
        out = process.stdout.read()
        waited = time.monotonic() - start
        err = process.stderr.read()
        closing.cancel()
        process.stdin.close()
    assert process.returncode == 0 and out == "went on\n", err
    assert "nothing came on stdin in 1 s" in err and 0.8 < waited < 20
    assert said(fake.requests[0]["body"]["messages"][0]) == ["hi"]


@pytest.mark.parametrize("signum, code, said", [(signal.SIGTERM, 143, "terminated by SIGTERM"),
                                                (signal.SIGINT, 130, "interrupted")])
def test_a_signal_before_the_run_begins_is_said_and_answers_with_the_result_object(
        khaelor, fake, project, signum, code, said):
    """QA: `khaelor -p hi --output-format json` killed while it waited for a pipe on stdin (or
    imported the SDK) exited 143 without a word on stderr, and a script reading stdout got
    nothing: it says why it ended, and prints the result object a run that cannot start prints."""
    from conftest import khaelor_popen
    run_env = {**khaelor.env, "KHAELOR_TEST_CONSTANTS": json.dumps({"khaelor.STDIN_WAIT_S": 30})}
    with khaelor_popen(["-p", "hi", "--output-format", "json"], project, run_env,
                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True) as process:
        time.sleep(1.5)
        process.send_signal(signum)
        out, err = process.communicate(timeout=20)
    assert process.returncode == code and said in err and "Traceback" not in err, err
    answer = json.loads(out)
    assert answer["type"] == "result" and answer["is_error"] is True and said in answer["result"]
    assert fake.requests == []


def test_a_bad_config_file_names_the_file_and_the_problem(khaelor, project):
    (project / ".khaelor").mkdir()
    (project / ".khaelor" / "config.json").write_text('{"model": "x",\n "permissions": 3}')
    result = khaelor.run("-p", "hi")
    assert result.returncode == 2
    assert "config.json" in result.stderr and "permissions" in result.stderr


def test_sessions_lists_id_title_tokens_and_cost(khaelor, fake):
    fake.enqueue(reply(text("hi there")))
    assert khaelor.run("-p", "say hello to the team").returncode == 0
    listing = khaelor.run("sessions")
    assert listing.returncode == 0
    row = listing.stdout.splitlines()[1]
    assert khaelor.session_files()[0].stem in row and "say hello to the team" in row and "$" in row


def test_resume_accepts_an_unambiguous_id_prefix(khaelor, fake):
    fake.enqueue(reply(text("one")))
    assert khaelor.run("-p", "first").returncode == 0
    session_id = khaelor.session_files()[0].stem
    fake.enqueue(reply(text("two")))
    result = khaelor.run("-r", session_id[:-3], "-p", "second")
    assert result.returncode == 0, result.stderr
    assert len(khaelor.session_files()) == 1


def test_thinking_blocks_go_back_byte_exact_with_their_signatures(khaelor, fake):
    fake.enqueue(reply(thinking("Let me check the files.", "sig-abc=="), redacted_thinking("EmwKopaque"),
                       tool_use("bash", {"command": "ls"})),
                 reply(thinking("", "sig-empty"), text("done")))
    result = khaelor.run("-p", "look", "--yes")
    assert result.returncode == 0, result.stderr
    assert_no_rejections(fake)
    # text output shows no thinking, so it is asked for omitted: a signature alone comes back, and goes back
    assert fake.requests[0]["body"]["thinking"] == {"type": "adaptive", "display": "omitted"}
    replayed = fake.requests[1]["body"]["messages"][1]["content"]
    assert replayed[:2] == [{"type": "thinking", "thinking": "", "signature": "sig-abc=="},
                            {"type": "redacted_thinking", "data": "EmwKopaque"}]


def test_malformed_tool_input_becomes_a_repairable_tool_error(khaelor, fake):
    fake.enqueue(reply(tool_use("read", {"offset": "not a number"})), reply(tool_use("nonexistent_tool", {})),
                 reply(text("gave up")))
    result = khaelor.run("-p", "go", "--yes")
    assert result.returncode == 0, result.stderr
    assert_no_rejections(fake)
    results = [b for m in fake.requests[-1]["body"]["messages"] for b in m["content"] if b["type"] == "tool_result"]
    assert all(r["is_error"] for r in results)
    assert "file_path" in results[0]["content"] and "nonexistent_tool" in results[1]["content"]


def test_a_context_overflow_compacts_through_the_aux_model_and_the_retry_is_smaller(khaelor, fake):
    fake.max_context_tokens = 6000
    checkpoint = json.dumps({"objective": "print many x", "completed": ["printed 20000 x"],
                             "next_steps": ["report the count"]})
    fake.enqueue(reply(tool_use("bash", {"command": "python3 -c \"print('x' * 20000)\""})),
                 reply(text(checkpoint), match={"model": "claude-haiku-5-5"}),
                 reply(text("finished after compaction")))
    result = khaelor.run("-p", "print x many times", "--yes")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "finished after compaction"
    assert len(fake.rejections) == 1 and "prompt is too long" in str(fake.rejections[0])
    main_requests = [r for r in fake.requests if r["body"]["model"] == "claude-sonnet-5-5"]
    rejected, retried = main_requests[-2], main_requests[-1]
    assert len(retried["raw"]) < len(rejected["raw"]) / 2
    assert "print many x" in json.dumps(retried["body"]["messages"])
    assert any(r["body"]["model"] == "claude-haiku-5-5" for r in fake.requests)
    compacted = [e for e in khaelor.log() if e["type"] == "ContextCompacted"]
    assert len(compacted) == 1 and compacted[0]["checkpoint"]["objective"] == "print many x"


def test_a_scripted_session_uses_all_seven_tools(khaelor, fake, project):
    server = "python3 -u -c \"import time; print('server ready', flush=True); time.sleep(60)\""
    fake.enqueue(
        reply(tool_use("write", {"file_path": "src/app.py", "content": "def greet():\n    return 'hello'\n"})),
        reply(tool_use("read", {"file_path": "src/app.py"})),
        reply(tool_use("edit", {"file_path": "src/app.py", "old_string": "return 'hello'", "new_string": "return 'hi'"})),
        reply(tool_use("grep", {"pattern": "def greet"})),
        reply(tool_use("glob", {"pattern": "**/*.py"})),
        reply(tool_use("bash", {"command": "python3 -m py_compile src/app.py && "        # a check: no gate reminder
                                           "python3 -c 'import sys; sys.path.insert(0, \"src\"); import app; print(app.greet())'"})),
        reply(tool_use("process", {"action": "start", "command": server})),
        reply(tool_use("process", {"action": "list"})),
        reply(text("all seven used")),
    )
    result = khaelor.run("-p", "exercise the tools", "--yes")
    assert result.returncode == 0, result.stderr
    assert (project / "src" / "app.py").read_text() == "def greet():\n    return 'hi'\n"
    assert fake.rejections == []
    results = [b for m in fake.requests[-1]["body"]["messages"] for b in m["content"] if b["type"] == "tool_result"]
    assert len(results) == 8 and not any(r.get("is_error") for r in results), results
    assert "return 'hello'" in results[1]["content"]
    assert "src/app.py" in results[3]["content"] and "src/app.py" in results[4]["content"]
    assert "hi" in results[5]["content"]
    assert "python3" in results[7]["content"]
    log = khaelor.log()
    assert [e["path"] for e in log if e["type"] == "FileModified"] == ["src/app.py", "src/app.py"]
    started = [e for e in log if e["type"] == "ProcessStarted"]
    exited = [e for e in log if e["type"] == "ProcessExited"]
    assert len(started) == 1 and exited and exited[-1]["cause"] == "khaelor exit"   # no orphan at exit
    with pytest.raises(ProcessLookupError):
        os.kill(started[0]["pid"], 0)


def test_khaelor_home_deleted_mid_run_keeps_the_log(khaelor, fake):
    import shutil
    from pathlib import Path
    # the reply stalls a few events in until the folder is gone (20 s at most), where a 2 s stream
    # was paced to outlast the deletion
    fake.enqueue(reply(text("word " * 200), chunk=5, stall_after_events=8, stall_seconds=20))
    proc = khaelor.popen("-p", "write a lot")
    deadline = time.time() + 30
    while not fake.requests and time.time() < deadline:
        time.sleep(0.05)
    home = Path(khaelor.env["KHAELOR_HOME"])
    shutil.rmtree(home)        # mid-stream, while the log is open for appending
    fake.release()
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    log = khaelor.log()
    assert [e["type"] for e in log][:1] == ["SessionCreated"] and log[-1]["type"] == "TaskCompleted"
    assert [e["seq"] for e in log] == list(range(1, len(log) + 1))
    assert oct(khaelor.session_files()[-1].stat().st_mode & 0o777) == "0o600"


# ---------------------------------------------------------------- terminals and closed pipes (issue 14)

def test_text_mode_streams_the_answer_when_stdout_is_a_terminal(khaelor, fake):
    fake.enqueue(reply(text("early words of the answer. " + "then the rest arrives."), chunk=12,
                       stall_after_events=5, stall_seconds=20))
    master, slave = pty.openpty()
    proc = khaelor.popen("-p", "say it slowly", stdin=subprocess.DEVNULL, stdout=slave, text=False)
    os.close(slave)
    seen, deadline = b"", time.monotonic() + 20
    while b"early words" not in seen and time.monotonic() < deadline:
        seen += os.read(master, 4096)
    assert b"early words" in seen and proc.poll() is None      # shown while the reply is still coming
    fake.release()                                             # the rest may come now
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:                    # the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    assert proc.wait(20) == 0, proc.stderr.read()
    os.close(master)
    assert seen.decode().count("early words of the answer. then the rest arrives.") == 1


def test_a_closed_pipe_ends_quietly_with_141_in_every_output_format(khaelor, fake):
    """Issue 22 item 2: `khaelor … | head -1` whose reader has already left: no BrokenPipeError,
    no "Exception ignored", exit 141 (128 + SIGPIPE) as a shell expects, whatever was writing."""
    fake.enqueue(reply(text("answer one")))
    assert khaelor.run("-p", "make a session").returncode == 0
    formats = [["-p", "again", "--output-format", kind] for kind in ("text", "json", "stream-json")]
    for argv in (["sessions"], ["--version"], *formats):
        fake.enqueue(reply(text("answer two\nsecond line")))
        read_end, write_end = os.pipe()
        os.close(read_end)                 # `| head -1` that has already left
        result = run_khaelor(argv, khaelor.project, khaelor.env, stdout=write_end)
        os.close(write_end)
        assert (result.returncode, result.stderr) == (141, ""), argv


def test_a_reader_that_leaves_mid_run_stops_it_as_an_interruption(khaelor, fake):
    """stream-json read by `head -3`: the reader goes while the reply streams; the run stops at
    the next line it would write, the log says it was interrupted, and the exit is a quiet 141."""
    fake.enqueue(reply(text("a reply that takes its time " * 20), chunk=8, stall_after_events=4,
                       stall_seconds=2))
    proc = khaelor.popen("-p", "go", "--output-format", "stream-json")
    kinds = []
    while "UserMessageCreated" not in kinds:
        kinds.append(json.loads(proc.stdout.readline())["type"])
    proc.stdout.close()
    assert proc.wait(30) == 141
    assert proc.stderr.read() == ""
    assert khaelor.log()[-1]["type"] == "Interrupted"


def test_a_retry_after_a_closed_tool_use_block_runs_only_the_retried_call(khaelor, fake):
    fake.enqueue({"content": [text("Let me look."), tool_use("bash", {"command": "touch first-try.txt"})],
                  "stream_error": {"type": "overloaded_error", "message": "Overloaded"}},
                 reply(tool_use("bash", {"command": "touch second-try.txt"})),
                 reply(text("made it")))
    result = khaelor.run("-p", "make a file", "--yes")
    assert result.returncode == 0, result.stderr
    assert not (khaelor.project / "first-try.txt").exists() and (khaelor.project / "second-try.txt").exists()
    log = khaelor.log()
    first = [e["tool_use_id"] for e in log if e["type"] == "ToolRequested"][0]
    assert not [e for e in log if e.get("tool_use_id") == first and e["type"] != "ToolRequested"]
    sent = json.dumps(fake.requests[-1]["body"]["messages"])
    assert first not in sent and "first-try" not in sent and "second-try" in sent
    assert_no_rejections(fake)


def test_an_approved_outside_path_is_opened_where_it_was_judged(khaelor, fake, project, tmp_path):
    """Issue 19 item 4, end to end: the decision's confine carries the approved real path to the
    file tools, which open exactly it (a link in the project to it included, its folders made).
    --yes alone approves nothing outside the project (it cannot be rewound), so the same calls
    are refused there. QA: the refusal of the write, which named its path, said that path "now
    leads to" itself and told the model to name it (it had): it says to ask the user instead."""
    outside = tmp_path / "elsewhere" / "notes.txt"
    outside.parent.mkdir()
    outside.write_text("outside notes\n")
    (project / "link.txt").symlink_to(outside)
    config = tmp_path / "newtool" / "conf" / "config.ini"
    for approval in (["--yes"], ["--allowedTools", f"Read(/{outside.parent}/**)",
                                 f"Edit(/{tmp_path}/newtool/**)"]):
        fake.enqueue(reply(tool_use("read", {"file_path": "link.txt"})),
                     reply(tool_use("write", {"file_path": str(config), "content": "[x]\n"})),
                     reply(text("done")))
        result = khaelor.run("-p", "go", *approval)
        assert result.returncode == 0, result.stderr
        last = fake.requests[-1]["body"]["messages"]
        results = [b for m in last for b in m["content"]
                   if isinstance(b, dict) and b["type"] == "tool_result"]
        if approval == ["--yes"]:
            assert "outside notes" not in str(results[0]["content"]) and not config.exists()
            refused = str(results[1]["content"])
            assert "now leads to" not in refused and "--yes approves nothing outside" in refused
    assert "outside notes" in str(results[0]["content"]), results
    assert config.read_text() == "[x]\n", results


@pytest.mark.parametrize("output_format, signum, code, said", [
    ("json", signal.SIGINT, 130, "interrupted by the user (Ctrl-C)"),
    ("stream-json", signal.SIGINT, 130, "interrupted by the user (Ctrl-C)"),
    ("json", signal.SIGTERM, 143, "terminated by SIGTERM")])
def test_ctrl_c_still_answers_with_the_result_object(khaelor, fake, output_format, signum, code,
                                                     said):
    """Issue 22 item 7: SIGINT mid-stream ends the run with the result object a script reads;
    SIGTERM too, named, with 143. Once: the end of the run is not said again as it unwinds. Its
    "result" is what the model had said (it was "", the partial text only in the log)."""
    fake.enqueue(reply(text("word " * 400), chunk=5, delay=0.01))
    proc = khaelor.popen("-p", "write a lot", "--output-format", output_format)
    deadline = time.time() + 30
    while not fake.requests and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == code, stderr
    results = [line for line in stdout.splitlines() if '"type": "result"' in line]
    result = json.loads(results[-1])
    assert len(results) == 1 and result["type"] == "result" and result["is_error"] is True
    assert result["subtype"] == "error_interrupted" and result["error"] == said
    assert result["result"].startswith("word word") and set(result["result"].split()) == {"word"}
    assert "Traceback" not in stderr and stderr.count(said) == 1, stderr


def test_a_sigterm_handled_inside_the_runs_own_code_still_ends_with_the_interrupted_result(
        project, env, fake, monkeypatch):
    """The test above flaked under load: a SIGTERM handled while the run's own code ran (not while
    the loop waited) raised KeyboardInterrupt in that frame, past the run's `except
    CancelledError`, and the result object said error_during_execution, as if the run had never
    started. Here the signal lands at a known place: stream-json printing the reply's first event.
    In-process, for that place: a process signalled from outside cannot be aimed."""
    import io
    import sys

    import khaelor as cli
    fake.enqueue(reply(text("word " * 400), chunk=5, delay=0.01))
    for key, value in {**env, "ANTHROPIC_BASE_URL": fake.base_url}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(project)

    class Stdout(io.StringIO):
        def write(self, text):
            if '"TextCheckpoint"' in text and not cli.SIGNALLED:
                os.kill(os.getpid(), signal.SIGTERM)
            return super().write(text)
    out = Stdout()
    monkeypatch.setattr(sys, "stdout", out)
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGHUP)}
    try:
        code = cli.main(["-p", "write a lot", "--output-format", "stream-json"])
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        cli.SIGNALLED.clear()
    result = json.loads(out.getvalue().splitlines()[-1])
    assert (code, result["subtype"], result["error"]) == (
        143, "error_interrupted", "terminated by SIGTERM"), result


def terminal_stdout(monkeypatch):
    """sys.stdout replaced by a terminal that keeps what is written."""
    import io
    import sys

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    out = Terminal()
    monkeypatch.setattr(sys, "stdout", out)
    return out


def test_an_escape_split_between_deltas_is_stripped_whole_whatever_its_introducer(monkeypatch):
    """-p on a terminal holds back a sequence a delta ends inside, ESC or 8-bit (an OSC opened
    by 0x9D), so what is shown does not depend on where the stream was cut."""
    import khaelor

    out = terminal_stdout(monkeypatch)
    answer = khaelor.StreamedAnswer()
    for delta in ("red \x1b[3", "1mtext, title \x9d0;x", "y\x07 end"):
        answer({"type": "TextDelta", "text": delta})
    assert out.getvalue() == "red text, title  end"


def test_a_retry_before_any_text_of_the_reply_says_nothing_broke_off(monkeypatch):
    """-p on a terminal: a request sent again before its reply wrote a word (a context overflow
    compacted, a refused thinking setting dropped) printed "[the reply broke off; …]" all the
    same. Only a reply that was being written is said to have broken off."""
    import khaelor

    out = terminal_stdout(monkeypatch)
    answer = khaelor.StreamedAnswer()
    retry = {"type": "ModelRequestFailed", "retrying": True}
    for event in (retry, {"type": "TextDelta", "text": "half"}, retry,
                  {"type": "TextDelta", "text": "whole"},
                  {"type": "ModelTextBlockCompleted", "text": "whole"},
                  {"type": "ModelResponseCompleted"}, retry):
        answer(event)
    assert out.getvalue() == "half\n[the reply broke off; it is being written again]\n\nwhole\n\n"


def test_text_mode_leaves_one_blank_line_after_a_block_whatever_newlines_it_ends_with(
        khaelor, fake, monkeypatch):
    """QA: a text block ending in "\\n\\n" (as one before a tool call often does) was followed by
    two more on a terminal (three blank lines), and an answer ending in newlines by a blank line
    more in a pipe."""
    import khaelor as cli
    out = terminal_stdout(monkeypatch)
    answer = cli.StreamedAnswer()
    for block in ("Looking.\n\n", "Found it.\n", "Done."):
        answer({"type": "TextDelta", "text": block})
        answer({"type": "ModelTextBlockCompleted", "text": block})
    assert out.getvalue() == "Looking.\n\nFound it.\n\nDone.\n\n"
    fake.enqueue(reply(text("Answer one.\n\n")))
    piped = khaelor.run("-p", "answer")
    assert piped.returncode == 0 and piped.stdout == "Answer one.\n", piped.stdout


def test_a_closed_stdin_or_stdout_is_read_and_written_as_dev_null(khaelor, fake):
    """`khaelor -p - <&-` crashed ("internal error: AttributeError: 'NoneType' object has no attribute
    'isatty'"), and `khaelor sessions >&-` ended in a traceback: a closed standard stream is
    /dev/null, so -p - has an empty prompt (exit 2) and output goes nowhere."""
    def run(*args, close):
        # forked without that fd: as a fresh interpreter started so, it has sys.stdin (or stdout)
        # None, and the fd is free for the next file it opens
        return run_khaelor(args, khaelor.project, khaelor.env, closed=(close,))

    closed_stdin = run("-p", "-", close=0)
    assert closed_stdin.returncode == 2, closed_stdin.stderr
    assert "the prompt is empty" in closed_stdin.stderr
    closed_stdout = run("sessions", close=1)
    assert (closed_stdout.returncode, closed_stdout.stderr) == (0, "")
    fake.enqueue(reply(text("hi")))
    closed_stdout = run("-p", "hi", close=1)
    assert (closed_stdout.returncode, closed_stdout.stderr) == (0, "")


@pytest.mark.parametrize("output_format", ["json", "stream-json"])
def test_a_start_up_error_still_answers_with_the_result_object(khaelor, fake, project,
                                                                  output_format):
    """A script reading `--output-format json` got nothing on stdout when the run could not start
    (no API key, a config that does not parse, an unknown model, a --resume id that is no session):
    it gets the result object, is_error and the message, and the exit code is kept."""
    (project / ".khaelor").mkdir()
    cases = [({"ANTHROPIC_API_KEY": ""}, [], "ANTHROPIC_API_KEY"),
             ({}, ["--model", "gpt-9000"], "gpt-9000"),
             ({}, ["-r", "nosuchsession"], "nosuchsession")]
    for env, argv, said in cases:
        result = khaelor.run("-p", "hi", "--output-format", output_format, *argv, env=env)
        assert result.returncode == 2, result.stderr
        answer = json.loads(result.stdout.strip().splitlines()[-1])
        assert answer["type"] == "result" and answer["subtype"] == "error_during_execution", answer
        assert answer["is_error"] is True and said in answer["result"], answer
        assert set(answer) >= {"session_id", "num_turns", "usage", "total_cost_usd", "error"}
    (project / ".khaelor" / "config.json").write_text("{not json")
    result = khaelor.run("-p", "hi", "--output-format", output_format)
    answer = json.loads(result.stdout)
    assert result.returncode == 2 and answer["is_error"] and "config.json" in answer["result"]
    assert fake.requests == []


def test_a_positional_prompt_is_the_p_prompt_and_subcommands_stay_subcommands(khaelor, fake):
    """`khaelor "query" -p` was refused as unrecognized arguments: the positional prompt is -p's,
    as `claude -p "query"` has it; two prompts are a usage error; a first word that names a
    subcommand is that subcommand, and --help says so."""
    fake.enqueue(reply(text("answered")))
    result = khaelor.run("say hi", "-p")
    assert result.returncode == 0 and result.stdout.strip() == "answered", result.stderr
    assert said(fake.requests[-1]["body"]["messages"][0]) == ["say hi"]
    both = khaelor.run("-p", "one", "two")
    assert both.returncode == 2 and "two prompts" in both.stderr, both.stderr
    assert khaelor.run("sessions").returncode == 0
    assert "a first word that names a subcommand" in khaelor.run("--help").stdout
    assert len(fake.requests) == 1


def test_under_yes_a_fresh_clones_env_setup_runs_and_no_secret_is_opened(khaelor, fake, project):
    """QA: under -p --yes, `cp .env.example .env`, `test -f .env || cp …` and `chmod 600 .env` in
    a fresh clone were refused ("it reads the project's secret files"): a file the command makes
    has no bytes to read, and test only looks at one. A .env that holds values stays closed: a cp
    onto it still asks (refused here), and its value reaches no request."""
    (project / ".env.example").write_text("API_KEY=changeme\n")
    setup = ["test -f .env || cp .env.example .env && chmod 600 .env", "ls -la",
             "test -f .env && echo present"]
    fake.enqueue(reply(*[tool_use("bash", {"command": c}, id=f"toolu_{n}")
                         for n, c in enumerate(setup)]), reply(text("set up")))
    result = khaelor.run("-p", "set the project up", "--yes", "--output-format", "json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["permission_denials"] == [], result.stderr
    assert (project / ".env").read_text() == "API_KEY=changeme\n"
    assert (project / ".env").stat().st_mode & 0o777 == 0o600
    outputs = [b["content"] for b in fake.requests[-1]["body"]["messages"][-1]["content"]
               if b.get("type") == "tool_result"]
    assert "-rw------- " in outputs[1] and " .env\n" in outputs[1] and "present" in outputs[2]
    (project / ".env").write_text("API_KEY=sk-the-real-one-2f9a\n")
    again = ["cp .env.example .env", "test -f .env && echo present",
             "cp .env.example .env && cat .env"]
    fake.enqueue(reply(*[tool_use("bash", {"command": c}, id=f"toolu_{n}")
                         for n, c in enumerate(again)]), reply(text("kept")))
    result = khaelor.run("-p", "again", "--yes", "--output-format", "json")
    refused = [d["tool_input"]["command"] for d in json.loads(result.stdout)["permission_denials"]]
    assert refused == [again[0], again[2]], result.stderr
    assert (project / ".env").read_text() == "API_KEY=sk-the-real-one-2f9a\n"
    assert "present" in json.dumps(fake.requests[-1]["body"])
    assert "sk-the-real-one" not in json.dumps([r["body"] for r in fake.requests])


def test_a_sandbox_refusal_under_p_without_yes_says_nobody_answers_a_question(khaelor, fake,
                                                                              tmp_path):
    """The sandbox's note told the model to run a command naming the path so that the user's
    permission question covers it: under -p no one answers one (that command is refused), so the
    note says so, and that only the user's own rules let such a command run."""
    target = tmp_path / "outside.txt"
    code = f"open({str(target)!r}, 'w').write('x')"
    fake.enqueue(reply(tool_use("bash", {"command": f'python3 -c "{code}"'})), reply(text("no")))
    result = khaelor.run("-p", "go", "--allowedTools", "Bash(python3:*)")
    assert result.returncode == 0 and not target.exists(), result.stderr
    sent = json.dumps(fake.requests[-1]["body"]["messages"][-1])
    assert f"write access to {tmp_path}" in sent and "nobody answers a permission question" in sent
    assert "so that the user's permission question covers it" not in sent, sent
