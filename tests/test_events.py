"""The session log and its projections: real files, replayed through the same folds."""
import asyncio
import json
import os
import re

import pytest

import events
from events import Bus, SessionStore


def new_bus(tmp_path):
    return Bus(SessionStore.create(tmp_path / "sessions"))


def tool_loop(bus):
    """user → assistant(text, tool_use) → tool result → assistant(text)."""
    usage = {"input_tokens": 10, "output_tokens": 5, "cache_read_tokens": 0, "cache_write_tokens": 0}
    bus.emit("UserMessageCreated", text="list files")
    bus.emit("ModelThinkingBlockCompleted", thinking="", signature="sig-1")
    bus.emit("ModelTextBlockCompleted", text="Looking.")
    bus.emit("ToolRequested", tool_use_id="toolu_1", name="bash", input={"command": "ls"})
    bus.emit("ModelResponseCompleted", message_id="m1", model="claude-sonnet-5-5", stop_reason="tool_use", usage=usage)
    bus.emit("ToolStarted", tool_use_id="toolu_1", name="bash")
    bus.emit("ToolCompleted", tool_use_id="toolu_1", name="bash", output="a.py\n", meta={})
    bus.emit("ModelTextBlockCompleted", text="One file.")
    bus.emit("ModelResponseCompleted", message_id="m2", model="claude-sonnet-5-5", stop_reason="end_turn", usage=usage)


def test_events_are_on_disk_before_subscribers_see_them(tmp_path):
    bus = new_bus(tmp_path)
    seen_on_disk = []
    bus.subscribe(lambda e: seen_on_disk.append(bus.store.path.read_text().count("\n")))
    bus.emit("UserMessageCreated", text="hi")
    bus.emit("TextDelta", text="ephemeral")
    assert seen_on_disk == [1, 1]
    lines = [json.loads(line) for line in bus.store.path.read_text().splitlines()]
    assert [e["type"] for e in lines] == ["UserMessageCreated"]
    assert {"v", "seq", "id", "ts", "session", "type", "text"} <= set(lines[0])


def test_replay_gives_byte_identical_history(tmp_path):
    bus = new_bus(tmp_path)
    tool_loop(bus)
    live = json.dumps(events.replay(bus.store.events).messages)
    bus.store.close()
    replayed = SessionStore.open(bus.store.path)
    assert json.dumps(events.replay(replayed.events).messages) == live
    assert replayed.next_seq == bus.store.next_seq


def test_a_lone_surrogate_in_an_event_is_recorded_as_u_fffd_and_the_request_can_be_sent(tmp_path):
    """A file name that is not UTF-8 reaches a tool's output as a lone surrogate (read's listing of
    a folder): it could be neither written to the log (the turn failed: UnicodeEncodeError) nor
    sent. The log, the live event and the conversation all hold U+FFFD."""
    bus = new_bus(tmp_path)
    tool_loop(bus)
    bus.emit("UserMessageCreated", text="and d?")
    bus.emit("ToolRequested", tool_use_id="toolu_2", name="read", input={"file_path": "d"})
    bus.emit("ModelResponseCompleted", message_id="m3", model="claude-sonnet-5-5", stop_reason="tool_use",
             usage={})
    event = bus.emit("ToolCompleted", tool_use_id="toolu_2", name="read", output="d/ is a directory:\nbad\udcff.py",
                     meta={"path": "d/bad\udcff"})
    assert event["output"].endswith("bad\ufffd.py") and event["meta"] == {"path": "d/bad\ufffd"}
    messages = bus.store.state.messages
    json.dumps(messages, ensure_ascii=False).encode()
    bus.store.close()
    assert SessionStore.open(bus.store.path).events == bus.store.events


def test_history_shapes_a_tool_loop(tmp_path):
    bus = new_bus(tmp_path)
    tool_loop(bus)
    messages = events.replay(bus.store.events).messages
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
    assert messages[1]["content"][0] == {"type": "thinking", "thinking": "", "signature": "sig-1"}
    assert messages[1]["content"][2] == {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "ls"}}
    assert messages[2]["content"] == [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.py\n"}]


def test_an_aborted_response_is_not_part_of_the_conversation(tmp_path):
    bus = new_bus(tmp_path)
    bus.emit("UserMessageCreated", text="one")
    bus.emit("ModelTextBlockCompleted", text="partial")
    bus.emit("ToolRequested", tool_use_id="toolu_x", name="bash", input={})
    bus.emit("ModelRequestFailed", kind="retryable", status=None, message="reset", retrying=True)
    bus.emit("ModelTextBlockCompleted", text="whole")
    bus.emit("ModelResponseCompleted", message_id="m", model="x", stop_reason="end_turn", usage={})
    bus.emit("ToolCancelled", tool_use_id="toolu_x", reason="stray")   # ignored: its tool_use never counted
    messages = events.replay(bus.store.events).messages
    assert messages[1] == {"role": "assistant", "content": [{"type": "text", "text": "whole"}]}
    assert len(messages) == 2


def test_steering_and_denials_join_the_tool_results_message(tmp_path):
    bus = new_bus(tmp_path)
    bus.emit("UserMessageCreated", text="go")
    bus.emit("ToolRequested", tool_use_id="t1", name="write", input={"file_path": "a", "content": "b"})
    bus.emit("ModelResponseCompleted", message_id="m", model="x", stop_reason="tool_use", usage={})
    bus.emit("PermissionDenied", tool_use_id="t1", reason="the user declined", feedback="use b instead")
    bus.emit("SteeringInjected", text="also be brief")
    last = events.replay(bus.store.events).messages[-1]
    assert last["role"] == "user"
    assert last["content"][0]["is_error"] is True
    assert "use b instead" in last["content"][0]["content"]
    assert last["content"][1] == {"type": "text", "text": "also be brief"}


def test_pruning_and_compaction_apply_on_every_rebuild(tmp_path):
    bus = new_bus(tmp_path)
    tool_loop(bus)
    bus.emit("ContextPruned", tool_use_ids=["toolu_1"])
    messages = events.replay(bus.store.events).messages
    assert messages[2]["content"][0]["content"] == events.PRUNED_PLACEHOLDER
    cut = bus.store.events[-1]["seq"]
    bus.emit("ContextCompacted", checkpoint={"objective": "x"}, summary="objective: x", cut_seq=cut)
    bus.emit("UserMessageCreated", text="next")
    messages = events.replay(bus.store.events).messages
    assert messages == [{"role": "user", "content": [{"type": "text", "text": "objective: x"},
                                                     {"type": "text", "text": "next"}]}]


def test_torn_last_line_is_dropped_and_appending_continues(tmp_path):
    bus = new_bus(tmp_path)
    tool_loop(bus)
    path = bus.store.path
    n_events = len(bus.store.events)
    bus.store.close()       # the crash: the writer is gone
    with open(path, "ab") as f:
        f.write(b'{"v":1,"seq":99,"type":"ModelTextBl')
    store = SessionStore.open(path)
    assert len(store.events) == n_events
    assert "cut off mid-write" in store.warnings[0] and "(35 bytes)" in store.warnings[0]
    store.close()
    with open(path, "ab") as f:
        f.write(b"{")
    store = SessionStore.open(path)
    assert store.warnings[0].endswith("(1 byte)"), store.warnings[0]
    Bus(store).emit("UserMessageCreated", text="after the crash")
    store.close()
    assert [e["text"] for e in SessionStore.open(path).events if e["type"] == "UserMessageCreated"][-1] == "after the crash"


def test_a_bad_line_in_the_middle_is_skipped_and_the_rest_kept(tmp_path):
    bus = new_bus(tmp_path)
    tool_loop(bus)
    lines = bus.store.path.read_text().splitlines()
    lines.insert(3, "not json at all")
    bus.store.path.write_text("\n".join(lines) + "\n")
    bus.store.close()
    store = SessionStore.open(bus.store.path)
    assert len(store.events) == len(bus.store.events)
    assert ":4 is not a valid event" in store.warnings[0]


def test_a_line_edited_by_hand_that_the_folds_cannot_read_is_skipped(tmp_path):
    """Valid JSON, but a field gone or of another type: the session opens without it, with the same
    warning as a garbled line (before, `khaelor sessions` and resuming ended in a traceback)."""
    bus = new_bus(tmp_path)
    tool_loop(bus)
    lines = bus.store.path.read_text().splitlines()
    bus.store.close()
    at = [json.loads(line)["type"] for line in lines].index("UserMessageCreated")
    typed = json.loads(lines[at])
    for damage in ({"text": 5}, {"text": None}, {"text": ["a"]}):
        lines[at] = json.dumps({key: value for key, value in {**typed, **damage}.items()
                                if value is not None})
        bus.store.path.write_text("\n".join(lines) + "\n")
        store = SessionStore.open(bus.store.path, read_only=True)
        assert f":{at + 1} is not a valid event" in store.warnings[0], damage
        assert [event["seq"] for event in store.events] == [
            json.loads(line)["seq"] for number, line in enumerate(lines) if number != at]


def test_a_log_written_again_after_its_folder_was_deleted_is_still_held(tmp_path):
    """KHAELOR_HOME removed mid-run: the log is written again from memory, and so is its lock,
    or a second khaelor could take the same session and both would append to it."""
    import shutil
    bus = new_bus(tmp_path)
    tool_loop(bus)
    shutil.rmtree(bus.store.path.parent)
    bus.store.close()       # syncs, finds the log unlinked, writes it again
    assert "was deleted while khaelor ran" in bus.store.warnings[-1]
    reopened = SessionStore.open(bus.store.path)
    assert len(reopened.events) == len(bus.store.events)
    reopened.close()
    bus = new_bus(tmp_path / "again")
    tool_loop(bus)
    shutil.rmtree(bus.store.path.parent)
    asyncio.run(bus.store.sync_off_loop())      # the same check, at a loop boundary mid-run
    with pytest.raises(events.SessionBusyError):
        SessionStore.open(bus.store.path)
    bus.store.close()


def test_a_log_from_a_newer_schema_is_refused(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps({"v": 2, "seq": 1, "type": "SessionCreated"}) + "\n")
    with pytest.raises(events.SessionFileError, match="newer khaelor"):
        SessionStore.open(path)


def test_kernel_state_tracks_pending_and_started_tools(tmp_path):
    bus = new_bus(tmp_path)
    bus.emit("UserMessageCreated", text="go")
    bus.emit("ToolRequested", tool_use_id="t1", name="bash", input={"command": "sleep 9"})
    bus.emit("ToolRequested", tool_use_id="t2", name="read", input={"file_path": "x"})
    state = events.replay(bus.store.events)
    assert state.pending_tools == [] and state.needs_model   # the response is not complete yet
    bus.emit("ModelResponseCompleted", message_id="m", model="x", stop_reason="tool_use", usage={})
    bus.emit("ToolStarted", tool_use_id="t1", name="bash")
    state = events.replay(bus.store.events)
    assert [t["tool_use_id"] for t in state.pending_tools] == ["t1", "t2"]
    assert state.started_tools == {"t1"}


def test_usage_totals_sum_the_api_fields_per_model(tmp_path):
    bus = new_bus(tmp_path)
    tool_loop(bus)
    assert bus.store.state.usage == {"claude-sonnet-5-5": {
        "input_tokens": 20, "output_tokens": 10, "cache_read_tokens": 0, "cache_write_tokens": 0}}


def test_a_session_is_held_by_one_store_at_a_time(tmp_path):
    bus = new_bus(tmp_path)
    bus.emit("UserMessageCreated", text="hi")        # the first append takes the session
    with pytest.raises(events.SessionBusyError, match=f"process {os.getpid()}") as refused:
        SessionStore.open(bus.store.path)
    assert refused.value.pid == os.getpid()
    assert len(SessionStore.open(bus.store.path, read_only=True).events) == 1   # listings may read
    bus.store.close()
    again = SessionStore.open(bus.store.path)
    Bus(again).emit("UserMessageCreated", text="continued")
    assert [e["seq"] for e in again.events] == [1, 2]
    again.close()


# ---------------------------------------------------------------- a cut-off reply is kept (issue 14 item 1)

def test_an_interrupted_reply_keeps_its_text_and_drops_its_half_blocks(tmp_path):
    bus = new_bus(tmp_path)
    bus.emit("SessionCreated", cwd="/p", project_root="/p", model="m", aux_model="a", version="0")
    bus.emit("UserMessageCreated", text="explain it")
    bus.emit("ModelThinkingBlockCompleted", thinking="hmm", signature="sig")
    bus.emit("ModelTextBlockCompleted", text="First block.")
    bus.emit("TextCheckpoint", index=2, text="Second block, cut ")
    bus.emit("TextCheckpoint", index=2, text="off here", model="m",
             usage={"input_tokens": 100, "output_tokens": 40, "cache_read_tokens": 0, "cache_write_tokens": 0})
    bus.emit("Interrupted")
    bus.emit("UserMessageCreated", text="continue")
    messages = events.replay(bus.store.events).messages
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[1]["content"] == [{"type": "text", "text": "First block.\n\nSecond block, cut off here"}]
    assert [b["text"] for b in messages[2]["content"]] == [events.INTERRUPTED_NOTE, "continue"]
    assert bus.store.state.usage["m"]["output_tokens"] == 40          # paid for, so counted
    bus.store.close()
    assert events.replay(SessionStore.open(bus.store.path).events).messages == messages   # replayed the same


def test_a_retried_or_failed_attempt_leaves_no_text_in_the_conversation(tmp_path):
    bus = new_bus(tmp_path)
    bus.emit("SessionCreated", cwd="/p", project_root="/p", model="m", aux_model="a", version="0")
    bus.emit("UserMessageCreated", text="go")
    bus.emit("TextCheckpoint", index=0, text="the broken try")
    bus.emit("ModelRequestFailed", kind="retryable", status=529, message="overloaded", retrying=True)
    bus.emit("ModelTextBlockCompleted", text="the retried answer")
    bus.emit("ModelResponseCompleted", message_id="m2", stop_reason="end_turn", model="m", usage={})
    assert events.replay(bus.store.events).messages[1]["content"] == [{"type": "text", "text": "the retried answer"}]


def test_every_event_kind_has_a_typed_dict_and_events_are_checked_against_it(tmp_path):
    assert set(events.EVENT_KINDS) == events.DURABLE | events.EPHEMERAL
    envelope = {"v": 1, "seq": 1, "id": "e1", "ts": 1, "session": "s"}
    call = {**envelope, "type": "ToolRequested", "tool_use_id": "t1", "name": "bash", "input": {}}
    assert events.check_event(call) == []
    assert events.check_event({**call, "input": "ls"}) == ["ToolRequested: 'input' is 'ls', not <class 'dict'>"]
    assert events.check_event({**call, "colour": "red"}) == ["ToolRequested: 'colour' is not a field of it"]
    missing = {k: v for k, v in call.items() if k != "name"}
    assert events.check_event(missing) == ["ToolRequested: 'name' is missing"]
    assert events.check_event({**call, "type": "Telepathy"}) == ["unknown event type 'Telepathy'"]
    bus = new_bus(tmp_path)
    bus.check = True
    with pytest.raises(ValueError, match="'reason' is missing"):
        bus.emit("TaskFailed")
    assert bus.store.events == []           # refused before it was written


# ---------------------------------------------------------------- terminal control: one grammar (issue 21 item 3)

@pytest.mark.parametrize("raw, shown", [
    ("a\x1b[31mb", "a^[[31mb"), ("50%\r100%", "50%␍100%"), ("\x00\x07\x08\x7f", "^@^G^H^?"),
    ("x\x9b2J", "x<U+009B>2J"), ("\x85\x9c", "<U+0085><U+009C>"), ("\u202eexe.gnp\u202c", "<U+202E>exe.gnp<U+202C>"),
    ("\u2066a\u2069", "<U+2066>a<U+2069>"), ("a\u200bb\u200dc\u2060d\ufeff", "a<U+200B>b<U+200D>c<U+2060>d<U+FEFF>"),
    ("tab\tand\nline", "tab\tand\nline"), ("中文 🎉 é ❤️", "中文 🎉 é ❤️"),
    # what a terminal draws as nothing, or as a blank: a name that reads as another
    ("no\u00adtes ls\u3164 a\u034fb\u2028", "no<U+00AD>tes ls<U+3164> a<U+034F>b<U+2028>"),
    ("\u115f\u17b4\u180e\uffa0\U0001d173\U000e0100", "<U+115F><U+17B4><U+180E><U+FFA0><U+1D173><U+E0100>")])
def test_every_control_bidi_and_invisible_character_is_shown_as_itself(raw, shown):
    assert events.visible_controls(raw) == shown
    assert events.has_hidden_characters(raw) == (raw != shown)


def test_a_line_ending_is_not_hidden_but_a_lone_cr_is_and_one_line_shows_newlines():
    assert not events.has_hidden_characters("a\r\nb\r\n")
    assert events.has_hidden_characters("a\rb\r\n")
    assert events.visible_controls("a\nb", one_line=True) == "a␤b"


@pytest.mark.parametrize("sequence", [
    "\x1b[2J", "\x1b[?1049h", "\x9b2J", "\x1b]0;title\x07", "\x1b]52;c;Zm9v\x1b\\", "\x9d8;;http://x\x9c",
    "\x1bPq#0;2;0;0;0\x1b\\", "\x1bXsos\x1b\\", "\x1b^pm\x1b\\", "\x1b_apc\x07", "\x9fapc\x9c", "\x1b7",
    "\x1bc", "\x1b(B", "\x1b]0;never ended", "\x1b"])
def test_every_escape_sequence_goes_whole_with_its_payload(sequence):
    assert events.plain_text(f"a{sequence}b") in ("ab", "a")
    assert events.without_escapes(f"a{sequence}b") in ("ab", "a")
    assert "\x1b" not in events.plain_text(sequence + "\u202ex\x08")


def test_a_stream_knows_a_complete_sequence_from_an_unfinished_one():
    complete = ["\x1b[31m", "\x1b]0;t\x07", "\x1bPx\x1b\\", "\x1b7"]
    unfinished = ["\x1b[31", "\x1b]0;t", "\x1bPx", "\x1b", "\x1b["]
    assert all(re.match(events.ESCAPE_SEQUENCE, s) for s in complete)
    assert not any(re.fullmatch(events.ESCAPE_SEQUENCE, s) for s in unfinished)


def test_one_duration_formatter_says_how_long_in_two_units_at_most():
    """events.duration: tool cards, the running processes the model is told of, session ages."""
    assert [events.duration(s) for s in (0.9, 3.21, 59.99, 125, 3 * 3600 + 307, 2 * 86400 + 3 * 3600)] == \
        ["900ms", "3.2s", "1m 0s", "2m 5s", "3h 5m", "2d 3h"]


def test_who_said_no_is_a_field_of_the_denial_and_old_logs_still_read():
    """PermissionDenied's `by`: a person ("user") or nobody to ask ("nobody") ends the gate's
    nudging for the turn; a rule ("policy") does not. A log from before `by` is read by its
    reason, as it was written."""
    def denied(**fields):
        log = [{"v": 1, "seq": 1, "id": "a", "ts": 0, "session": "s", "type": "UserMessageCreated",
                "text": "go"},
               {"v": 1, "seq": 2, "id": "b", "ts": 0, "session": "s", "type": "PermissionDenied",
                "tool_use_id": "t1", "feedback": "", **fields}]
        return events.replay(log).user_denied
    assert denied(reason="x", by="user") and denied(reason="x", by="nobody")
    assert not denied(reason="rm -rf /: refused by the floor", by="policy")
    assert denied(reason=events.USER_DECLINED) and denied(reason=events.NOT_ASKED)
    assert not denied(reason="git push: denied by a rule")


def test_a_session_taken_with_stdin_closed_appends(tmp_path):
    """Started with stdin closed (`khaelor -c -p … <&-`, a job runner), the session's lock is
    fd 0, which the first append took for no lock: it locked again and found the session busy,
    held by itself."""
    import subprocess
    import sys
    from pathlib import Path
    script = (
        "import os, sys\n"
        f"sys.path.insert(0, {str(Path(events.__file__).parent)!r})\n"
        "import events\n"
        "os.close(0)\n"
        f"store = events.SessionStore.open({str(tmp_path / 's.jsonl')!r})\n"
        "assert store._lock_fd == 0\n"
        "events.Bus(store).emit('SessionRenamed', title='still mine')\n"
        "store.close()\n")
    (tmp_path / "s.jsonl").write_bytes(b"")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "still mine" in (tmp_path / "s.jsonl").read_text()


def test_listed_names_the_first_few_then_how_many_others_there_are():
    assert events.listed(["a.py", "b.py"], 2) == "a.py, b.py"
    assert events.listed(["a.py", "b.py", "c.py", "d.py"], 2) == "a.py, b.py and 2 more"
    assert events.listed([], 3) == ""
