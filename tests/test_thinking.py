"""Thinking and effort (issue 23): the request builder per model family, checked against the scripted
API's own reading of ANTHROPIC_API.md §3.3/§3.3a; the real program for what only it proves."""
import json
from pathlib import Path

import pytest

import context
import events
import model
from fake_api import error, reply, text, thinking, tool_use, validate

BODY = {"messages": [{"role": "user", "content": "hi"}]}
ADAPTIVE_SHOWN = {"type": "adaptive", "display": "summarized"}


def body_for(name, mode, effort, show=True, max_tokens=32_000):
    taken = model.reasoning(name, mode, effort, show, max_tokens)
    return {"model": name, **BODY, **taken.fields}, taken.notes


def test_every_setting_on_every_family_is_a_request_the_api_accepts():
    for name in [*model.REASONING, "claude-opus-4-5-20251101", "claude-unknown-9"]:
        for mode in model.THINKING_MODES:
            for effort in (None, *model.EFFORTS):
                for show in (True, False):
                    body, _ = body_for(name, mode, effort, show)
                    assert validate(body) is None, (name, mode, effort, show, validate(body))


def test_the_scripted_api_refuses_what_the_table_avoids():
    """So the test above can fail: each of these is a 400 from the fake, as from the API."""
    base = {"model": "claude-opus-4-6", "max_tokens": 2000, **BODY}
    assert "not supported" in validate({**base, "output_config": {"effort": "xhigh"}})
    assert validate({**base, "model": "claude-sonnet-4-5", "output_config": {"effort": "low"}})
    assert validate({**base, "model": "claude-opus-5-5", "thinking": {"type": "disabled"}})
    assert validate({**base, "model": "claude-opus-5", "thinking": {"type": "disabled"},
                     "output_config": {"effort": "max"}})
    assert validate({**base, "model": "claude-opus-4-5", "thinking": {"type": "enabled", "budget_tokens": 2000}})
    assert validate({**base, "thinking": {"type": "disabled", "display": "omitted"}})


# one case per row of model.REASONING: (model, thinking, effort) -> (thinking sent, effort sent, a note?)
ROWS = [
    ("claude-opus-5-5", "off", None, ADAPTIVE_SHOWN, "low", "cannot turn thinking off"),
    ("claude-sonnet-5-5", "adaptive", "xhigh", ADAPTIVE_SHOWN, "xhigh", None),
    ("claude-haiku-5-5", "always", None, None, "high", "not documented"),
    ("claude-fable-5-2", "adaptive", "high", None, None, "takes effort no level"),
    ("claude-mythos-5-2", "off", None, None, None, "not documented"),
    ("claude-fable-5-1", "always", "low", ADAPTIVE_SHOWN, "high", None),
    ("claude-mythos-5-1", "adaptive", "max", ADAPTIVE_SHOWN, "max", None),
    ("claude-fable-5", "off", "medium", ADAPTIVE_SHOWN, "low", "cannot turn thinking off"),
    ("claude-mythos-5", "adaptive", "xhigh", ADAPTIVE_SHOWN, "xhigh", None),
    ("claude-mythos-preview", "adaptive", "xhigh", None, "high", "takes effort low, medium, high, max"),
    ("claude-opus-5", "off", "max", {"type": "disabled"}, "high", "only at effort high or below"),
    ("claude-sonnet-5", "off", "max", {"type": "disabled"}, "max", None),
    ("claude-opus-4-8", "adaptive", None, ADAPTIVE_SHOWN, None, None),
    ("claude-opus-4-7", "always", None, ADAPTIVE_SHOWN, "high", None),
    ("claude-opus-4-6", "adaptive", "xhigh", ADAPTIVE_SHOWN, "high", "takes effort low, medium, high, max"),
    ("claude-sonnet-4-6", "off", None, {"type": "disabled"}, None, None),
    ("claude-opus-4-5", "always", "max", {"type": "enabled", "budget_tokens": 16_000, "display": "summarized"},
     "high", "takes effort low, medium, high"),
    ("claude-sonnet-4-5", "always", "high", {"type": "enabled", "budget_tokens": 16_000,
                                            "display": "summarized"}, None, "takes effort no level"),
    ("claude-haiku-4-5", "adaptive", None, None, None, None),
]


def test_the_cases_cover_every_row_of_the_table():
    assert sorted(row[0] for row in ROWS) == sorted(model.REASONING)


@pytest.mark.parametrize("name, mode, effort, sent_thinking, sent_effort, note", ROWS)
def test_each_family_takes_the_setting_as_the_table_says(name, mode, effort, sent_thinking, sent_effort, note):
    body, notes = body_for(name, mode, effort)
    assert body.get("thinking") == sent_thinking
    assert (body.get("output_config") or {}).get("effort") == sent_effort
    if note is None:
        assert notes == []
    else:
        assert any(note in n for n in notes), notes


def test_thinking_is_omitted_from_the_display_unless_shown_and_output_stays_within_the_limit():
    body, _ = body_for("claude-sonnet-5-5", "adaptive", None, show=False)
    assert body["thinking"] == {"type": "adaptive", "display": "omitted"}
    body, notes = body_for("claude-opus-4-5", "always", None, max_tokens=100_000)
    assert body["max_tokens"] == 64_000 and body["thinking"]["budget_tokens"] < 64_000
    assert any("above claude-opus-4-5's limit" in n for n in notes)
    body, _ = body_for("claude-haiku-4-5", "always", None, max_tokens=1024)
    assert "thinking" not in body, "no budget fits below max_tokens: none is sent"


def test_only_a_400_that_names_the_setting_drops_it():
    sent = {"thinking": {"type": "adaptive"}, "output_config": {"effort": "max"}}
    assert model.refused_field('"thinking.type.enabled" is not supported for this model.', sent) == "thinking"
    assert model.refused_field("output_config.effort: 'max' is not supported", sent) == "output_config"
    edited = "messages.1.content.0: `thinking` or `redacted_thinking` blocks ... cannot be modified."
    assert model.refused_field(edited, sent) is None, "dropping a field cannot fix an edited block"
    assert model.refused_field("adaptive thinking is not supported on this model", {}) is None


def test_pruning_leaves_thinking_byte_identical_and_the_summariser_never_reads_it(tmp_path):
    bus = events.Bus(events.SessionStore.create(tmp_path / "s"))
    bus.emit("UserMessageCreated", text="read it")
    bus.emit("ModelThinkingBlockCompleted", thinking="secret plan", signature="sig-1", duration_ms=1200)
    bus.emit("ModelThinkingBlockCompleted", redacted="opaque")
    bus.emit("ToolRequested", tool_use_id="t1", name="read", input={"file_path": "a.py"})
    bus.emit("ModelResponseCompleted", message_id="m", model="claude-sonnet-5-5", stop_reason="tool_use",
             usage={"input_tokens": 1, "output_tokens": 9, "cache_read_tokens": 0, "cache_write_tokens": 0,
                    "thinking_tokens": 5})
    bus.emit("ToolCompleted", tool_use_id="t1", name="read", output="x" * 1000, meta={})
    before = json.dumps(bus.store.state.messages[1]["content"][:2])
    bus.emit("ContextPruned", tool_use_ids=["t1"])
    state = bus.store.state
    assert json.dumps(state.messages[1]["content"][:2]) == before
    assert "secret plan" not in context.render_transcript(state.messages)
    usage = state.usage["claude-sonnet-5-5"]
    assert usage["output_tokens"] == 9 and usage["thinking_tokens"] == 5, "thinking counted once, inside output"
    assert events.cost({"claude-sonnet-5-5": usage}) == pytest.approx((1 * 2 + 9 * 10) / 1e6)


# ---------------------------------------------------------------- through the real program

def write_config(home, **config):
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.json").write_text(json.dumps(config))


def bodies(fake):
    return [r["body"] for r in fake.requests if r["path"].endswith("/v1/messages")]


def test_flags_and_config_shape_the_request_and_a_resume_keeps_them(khaelor, fake, tmp_path):
    write_config(Path(khaelor.env["KHAELOR_HOME"]), max_output_tokens=20_000)
    fake.enqueue(reply(text("one")), reply(text("two")))
    first = khaelor.run("-p", "go", "--model", "claude-opus-4-5", "--thinking", "always", "--effort", "low",
                        "--output-format", "json")
    assert first.returncode == 0, first.stderr
    sent = bodies(fake)[0]
    assert sent["thinking"] == {"type": "enabled", "budget_tokens": 10_000, "display": "omitted"}
    assert sent["output_config"] == {"effort": "high"} and sent["max_tokens"] == 20_000
    result = json.loads(first.stdout)
    assert result["effort"] == "high" and result["thinking"] == "enabled"
    resumed = khaelor.run("-p", "again", "-r", result["session_id"], "--model", "claude-opus-4-7")
    assert resumed.returncode == 0, resumed.stderr
    assert bodies(fake)[1]["thinking"] == {"type": "adaptive", "display": "omitted"}
    assert bodies(fake)[1]["output_config"] == {"effort": "high"}, "the resumed session keeps always"
    assert fake.rejections == []


def test_a_refused_thinking_setting_is_retried_once_without_it_and_said(kernel_turn, fake, env):
    write_config(Path(env["KHAELOR_HOME"]), effort="high")
    refusal = '"thinking.type.adaptive" is not supported for this model.'
    never = lambda request: ("deny", "")
    fake.enqueue(error("invalid_request_error", refusal), reply(text("fine")))
    step, log = kernel_turn("go", never)
    assert step == "done"
    sent = bodies(fake)
    assert "thinking" in sent[0] and "thinking" not in sent[1] and sent[1]["output_config"] == {"effort": "high"}
    failures = [e for e in log if e["type"] == "ModelRequestFailed"]
    assert len(failures) == 1 and failures[0]["retrying"] is True
    assert "refused the thinking setting" in failures[0]["message"] and refusal in failures[0]["message"]
    fake.enqueue(error("invalid_request_error", refusal), error("invalid_request_error", refusal))
    step, log = kernel_turn("again", never)
    assert step == "failed" and len(bodies(fake)) == 4, "one retry, never a loop"


def test_signatures_survive_a_tool_round_trip_and_a_resume_and_stream_json_carries_them(khaelor, fake):
    fake.enqueue(reply(thinking("Look at the files first.", "sig-1"), tool_use("glob", {"pattern": "*"})),
                 reply(thinking("Enough.", "sig-2"), text("done")),
                 reply(text("resumed fine")))
    run = khaelor.run("-p", "list", "--output-format", "stream-json")
    assert run.returncode == 0, run.stderr
    lines = [json.loads(line) for line in run.stdout.splitlines()]
    blocks = [e for e in lines if e["type"] == "ModelThinkingBlockCompleted"]
    assert [b["thinking"] for b in blocks] == ["Look at the files first.", "Enough."]
    assert [b["signature"] for b in blocks] == ["sig-1", "sig-2"]
    assert bodies(fake)[0]["thinking"]["display"] == "summarized", "stream-json shows thinking"
    result = lines[-1]
    assert 0 < result["thinking_tokens"] <= result["usage"]["output_tokens"]
    resumed = khaelor.run("-p", "more", "-r", result["session_id"])
    assert resumed.returncode == 0, resumed.stderr
    assert "Look at the files" not in resumed.stdout, "text never prints thinking"
    replayed = bodies(fake)[2]["messages"][1]["content"][0]
    assert replayed == {"type": "thinking", "thinking": "Look at the files first.", "signature": "sig-1"}
    assert fake.rejections == [], "the fake checks every replayed block byte for byte"


def test_effort_chosen_in_the_session_applies_from_the_next_message(fake, project, env, monkeypatch):
    """/effort mid-turn leaves the running turn's requests as they were (a replayed thinking block
    holds only while the request is unchanged); the next message has it; the log records it."""
    import asyncio

    import khaelor as cli
    for key in ("KHAELOR_HOME", "ANTHROPIC_API_KEY", "HOME", "ANTHROPIC_CONFIG_DIR"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
    monkeypatch.chdir(project)
    home = Path(env["KHAELOR_HOME"])
    fake.enqueue(reply(thinking("look", "sig-a"), tool_use("glob", {"pattern": "*"}), delay=0.05),
                 reply(text("first")), reply(text("second")))

    async def go():
        args = cli.parse_args([])
        session = cli.Session(args, cli.load_settings(args, home, project), home, project)
        session.attach(events.SessionStore.create(events.sessions_dir(home, project)))
        try:
            listed = await session.run_command("/effort")
            chosen = await session.run_command("/effort max")
            status = session.status()["reasoning"]
            session.submit("one")
            await session.run_command("/effort low")
            await session.turn
            session.submit("two")
            await session.turn
            cost = await session.run_command("/cost")
            return listed, chosen, status, cost, session.store.events
        finally:
            await session.quit()
    listed, chosen, status, cost, log = asyncio.run(go())
    assert "(thinking " in cost and "last request: effort low" in cost
    assert "low, medium, high, xhigh, max" in listed and "claude-sonnet-5-5" in listed
    assert chosen.startswith("effort set to max, from your next message") and status == "effort max"
    sent = bodies(fake)
    assert [b["output_config"]["effort"] for b in sent] == ["max", "max", "low"]
    assert sent[0]["thinking"] == {"type": "adaptive", "display": "summarized"}, "the UI shows thinking"
    changes = [e.get("effort") for e in log if e["type"] == "ThinkingChanged"]
    assert changes == ["max", "low"] and fake.rejections == []


def test_config_takes_the_settings_and_says_what_is_wrong_with_a_bad_one(tmp_path):
    import khaelor as cli
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"thinking": "off", "effort": "max", "show_thinking": False,
                                "max_output_tokens": 64_000}))
    assert cli.read_config(good)["show_thinking"] is False
    for bad, says in (({"thinking": "sometimes"}, "one of off, adaptive, always"),
                      ({"effort": "extreme"}, "one of low, medium, high, xhigh, max"),
                      ({"max_output_tokens": 0}, "positive number"),
                      ({"max_output_tokens": True}, "must be a whole number, not true"),
                      ({"show_thinking": "yes"}, "'show_thinking' must be true or false, not \"yes\""),
                      ({"model": 5}, "'model' must be a string, not 5")):
        path = tmp_path / "bad.json"
        path.write_text(json.dumps(bad))
        with pytest.raises(cli.UsageError, match=says):
            cli.read_config(path)


def test_a_setting_refused_on_the_retry_is_not_said_to_be_sent_again(kernel_turn, fake, env):
    refusal = '"thinking.type.adaptive" is not supported for this model.'
    too_long = "prompt is too long: 1000100 tokens > 1000000 maximum"
    # the overflow, the compaction's summary, then the refusal on the one retry
    fake.enqueue(error("invalid_request_error", too_long), reply(text("objective: go")),
                 error("invalid_request_error", refusal))
    step, log = kernel_turn("go", lambda request: ("deny", ""))
    failures = [e for e in log if e["type"] == "ModelRequestFailed"]
    assert step == "failed" and failures[-1]["retrying"] is False
    assert "refused the thinking setting" in failures[-1]["message"]
    assert "sent again" not in failures[-1]["message"], "there is no third try"


@pytest.mark.parametrize("model_id, thinking, effort, sent_thinking", [
    ("claude-opus-5-5", "off", "max", "adaptive"),
    ("claude-opus-5", "off", "max", "adaptive"),
    ("claude-opus-5", "always", "low", "adaptive"),
    ("claude-sonnet-5", "off", "max", "disabled")])
def test_an_effort_chosen_after_thinking_is_the_effort_sent(project, env, monkeypatch, model_id,
                                                              thinking, effort, sent_thinking):
    """QA: /thinking off then /effort max on a model that cannot turn thinking off answered
    "effort max is kept, but the next request sends effort low": what was typed last was not
    done. The newer choice wins: thinking is adaptive again where the model has the effort only
    so, and it is said (not with the old setting's note, which named effort low as the effort
    sent: "…for effort max: … it thinks adaptively at effort low"); where the model takes both (Sonnet 5 thinks off at effort max) both stand.
    Chosen the other way round (effort, then thinking), thinking wins, as before."""
    import asyncio

    import khaelor as cli
    for key in ("KHAELOR_HOME", "ANTHROPIC_API_KEY", "HOME", "ANTHROPIC_CONFIG_DIR"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.chdir(project)
    home = Path(env["KHAELOR_HOME"])

    async def go(*commands):
        args = cli.parse_args(["--model", model_id])
        session = cli.Session(args, cli.load_settings(args, home, project), home, project)
        session.attach(events.SessionStore.create(events.sessions_dir(home, project)))
        try:
            said = [await session.run_command(command) for command in commands]
            return said[-1], session.next_reasoning().fields, dict(session.reasoning)
        finally:
            await session.quit()
    said, fields, chosen = asyncio.run(go(f"/thinking {thinking}", f"/effort {effort}"))
    assert fields["output_config"]["effort"] == effort, said
    assert fields["thinking"]["type"] == sent_thinking, said
    assert ("thinking is adaptive again" in said) == (sent_thinking == "adaptive"), said
    stale = {"low", "medium", "high", "xhigh", "max"} - {effort}
    assert not any(f"effort {level}" in said for level in stale), said
    assert chosen == {"thinking": "adaptive" if sent_thinking == "adaptive" else thinking,
                      "effort": effort}
    assert asyncio.run(go(f"/effort {effort}", f"/thinking {thinking}"))[2] == {
        "thinking": thinking, "effort": effort}


def test_a_note_on_an_undocumented_thinking_setting_is_said_once(project, env, monkeypatch):
    """QA: on haiku-5-5 (thinking settings not documented) with thinking off, every /effort said
    "…thinking settings are not documented; its default thinking stands" again."""
    from test_claude_parity import in_session

    async def choose(session):
        return [await session.run_command(f"/effort {level}") for level in ("low", "high", "low")]
    said = in_session(project, env, monkeypatch, choose,
                      argv=["--model", "haiku", "--thinking", "off"])
    assert "\n".join(said).count("not documented") == 1, said
    assert "not documented" in said[0], said


def test_a_resumed_session_says_the_effort_it_already_has(fake, project, env, monkeypatch):
    """QA: effort high chosen, khaelor -c, then /effort high: nothing at all was shown (the log
    had it, so no ◇ line came, and no word either). It says the effort is high already."""
    import asyncio

    import khaelor as cli
    for key in ("KHAELOR_HOME", "ANTHROPIC_API_KEY", "HOME", "ANTHROPIC_CONFIG_DIR"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
    monkeypatch.chdir(project)
    home = Path(env["KHAELOR_HOME"])
    fake.enqueue(reply(text("first")))

    async def go(argv, *commands):
        args = cli.parse_args(argv)
        session = cli.Session(args, cli.load_settings(args, home, project), home, project)
        session.attach(cli.open_session(args, home, project))
        try:
            if not argv:
                session.submit("one")
                await session.turn
            return [await session.run_command(command) for command in commands]
        finally:
            await session.quit()
    asyncio.run(go([], "/effort high"))
    assert asyncio.run(go(["-c"], "/effort high", "/effort low")) == ["effort is high already", ""]
