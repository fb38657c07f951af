"""Issue 24: pruning by cost. The policy in-process over logs as the kernel writes them (trigger,
protected window, break-even, turn boundaries, attached files, placeholders), a resume that rebuilds
the same request bytes from the JSONL log, and the real program pruning past `context.prune_at`
with /context explaining it."""
import json
import sys
from pathlib import Path

import pytest

import context
import events
from fake_api import reply, text, tool_use
from test_context import Log, make_context, stable, usage
from test_sessions import in_session

NOW_S = 1_000_000.0             # the tests' clock; a response at NOW_S - 10 s left the cache warm


def read_turn(log: Log, n_files: int, chars: int, first: int = 0, *, thinking=False,
              question="go on") -> Log:
    """A user turn: the model reads n_files files of `chars` characters each, one per response."""
    log.add("UserMessageCreated", text=question)
    for i in range(first, first + n_files):
        if thinking:
            log.add("ModelThinkingBlockCompleted", thinking=f"t{i}", signature=f"sig{i}")
        log.add("ToolRequested", tool_use_id=f"r{i}", name="read", input={"file_path": f"src/f{i}.py"})
        respond(log, "tool_use")
        log.add("ToolCompleted", tool_use_id=f"r{i}", name="read", output=f"{i}" * chars,
                meta={"path": f"src/f{i}.py"})
    return log


def respond(log: Log, stop_reason: str, tokens: int = 0, at: float = NOW_S - 10) -> None:
    """A ModelResponseCompleted whose usage says the request had `tokens` input tokens."""
    log.add("ModelResponseCompleted", message_id="m", model="claude-sonnet-5-5", stop_reason=stop_reason,
            usage=usage(n_input=10, read=tokens))
    log[-1]["ts"] = int(at * 1000)


def finish_turn(log: Log, tokens: int, at: float = NOW_S - 10) -> Log:
    log.add("ModelTextBlockCompleted", text="done")
    respond(log, "end_turn", tokens, at)
    log.add("TaskCompleted", evidence={})
    return log


def ten_files_then_a_question() -> Log:
    """Ten reads of ~8K tokens (~80K), a finished turn measured at 110K, and a new question."""
    log = finish_turn(read_turn(Log(), 10, 32_000), 110_000)
    log.add("UserMessageCreated", text="and now?")
    return log


def test_the_trigger_is_prune_at_and_zero_turns_it_off(tmp_path):
    ctx = make_context(tmp_path)
    assert ctx.prune_at == context.PRUNE_AT_TOKENS == 100_000
    log = ten_files_then_a_question()
    assert ctx.plan(log.state, NOW_S) == "prune"
    ctx.prune_at = 120_000
    assert ctx.plan(log.state, NOW_S) is None, "under the trigger"
    ctx.prune_at = 0
    assert ctx.plan(log.state, NOW_S) is None, "off: only the window's end prunes"
    ctx.prune_at = 100_000
    log.add("ContextPruned", **ctx.prune(log.state, NOW_S))
    assert ctx.plan(log.state, NOW_S) is None, "stale until the next response is measured"


def test_the_newest_results_stay_and_the_oldest_go_first(tmp_path):
    ctx = make_context(tmp_path)
    payload = ctx.prune(ten_files_then_a_question().state, NOW_S)
    # 8K tokens each: the newest two cover the 12K tokens, the third is kept as one of the newest 3
    assert payload["tool_use_ids"] == [f"r{i}" for i in range(7)]
    assert context.PRUNE_KEEP_RESULTS == 3
    big = read_turn(Log(), 3, 400_000)           # three huge results: each is one of the newest three
    assert context.prune_ids(big.state) == []


def test_break_even_a_clear_must_pay_back_its_rewrite(tmp_path):
    ctx = make_context(tmp_path)
    # Sonnet 5.5: write 2.50, read 0.20 per million -> (2.50 - 0.20) / 0.20 = 11.5
    assert context.payback_requests(40_000, 20_000, "claude-sonnet-5-5") == pytest.approx(23.0)
    assert context.payback_requests(10_000, 0, "claude-sonnet-5-5") is None
    # 7 results (~56K) cleared, ~3 kept after them (~24K) rewritten: pays back in ~5 requests
    payload = ctx.prune(ten_files_then_a_question().state, NOW_S)
    assert payload["reason"] == "cost" and payload["payback_requests"] < 6
    assert payload["rewritten_tokens"] == pytest.approx(24_000, rel=0.05)

    # Two old reads (~50K), then 120K tokens of talk after them: rewriting it does not pay back in 20.
    log = read_turn(Log(), 2, 100_000)
    log.add("ModelTextBlockCompleted", text="x" * 480_000)
    respond(log, "end_turn")
    read_turn(log, 3, 20_000, first=2)
    finish_turn(log, 200_000)
    log.add("UserMessageCreated", text="next")
    payload = ctx.prune(log.state, NOW_S)
    assert payload["tool_use_ids"] == ["r0", "r1"]
    assert payload["payback_requests"] > context.PRUNE_PAYBACK_REQUESTS
    assert ctx.plan(log.state, NOW_S) is None
    # After five idle minutes the cache is gone anyway: the clear costs nothing extra.
    assert ctx.plan(log.state, NOW_S + context.CACHE_TTL_S) == "prune"
    assert ctx.prune(log.state, NOW_S + context.CACHE_TTL_S)["reason"] == "idle"


def test_a_binding_model_prunes_at_a_turn_boundary_only(tmp_path):
    mid_turn = read_turn(Log(), 10, 32_000, thinking=True)
    respond(mid_turn, "tool_use", 110_000)
    binding = make_context(tmp_path, model="claude-sonnet-5-5")
    assert mid_turn.state.responses_in_turn > 0
    assert binding.plan(mid_turn.state, NOW_S) is None, "the turn's thinking binds what came before"
    assert make_context(tmp_path, model="claude-opus-4-8").plan(mid_turn.state, NOW_S) == "prune"
    no_thinking = read_turn(Log(), 10, 32_000)
    respond(no_thinking, "tool_use", 110_000)
    assert binding.plan(no_thinking.state, NOW_S) == "prune", "no thinking in this turn: nothing bound"
    finish_turn(mid_turn, 110_000)
    mid_turn.add("UserMessageCreated", text="next question")
    assert binding.plan(mid_turn.state, NOW_S) == "prune"


def test_a_tool_loop_cut_off_by_esc_still_binds_its_thinking_at_the_next_message(tmp_path):
    """Esc while a tool ran: the next message joins the cancelled result, so to the API the tool
    loop goes on and its thinking is replayed bound to what came before. A prune at that turn's
    start rewrote it: a 400 (bound to a different conversation), and the same on every message
    after, since each joined the same results."""
    import fake_api
    log = read_turn(Log(), 10, 32_000, thinking=True)
    log.add("ModelThinkingBlockCompleted", thinking="t10", signature="sig10")
    log.add("ToolRequested", tool_use_id="r10", name="read", input={"file_path": "src/f10.py"})
    respond(log, "tool_use", 110_000)
    log.add("ToolCancelled", tool_use_id="r10", reason="interrupted by the user")
    log.add("Interrupted")
    log.add("UserMessageCreated", text="go on")
    binding = make_context(tmp_path, model="claude-sonnet-5-5")
    before = binding.build_request(log.state)
    memory = fake_api.Memory()      # each thinking block bound to the messages before it
    for i, message in enumerate(before["messages"]):
        for block in message["content"]:
            if block["type"] == "thinking":
                memory.bound[block["signature"]] = fake_api._binding_key(before, i)
    assert fake_api.check_binding(before, memory) is None
    assert binding.plan(log.state, NOW_S) is None
    log.add("ContextPruned", **binding.prune(log.state, NOW_S))
    assert "bound to a different conversation" in fake_api.check_binding(binding.build_request(log.state), memory)


def test_at_the_window_end_mid_turn_a_binding_model_compacts_instead_of_pruning(tmp_path):
    """A prune rewrites the history the turn's replayed thinking is bound to: the next request
    would be a 400 (bound to a different conversation). A compaction replays none of it."""
    binding = make_context(tmp_path, model="claude-sonnet-5-5")
    mid_turn = read_turn(Log(), 10, 32_000, thinking=True)
    respond(mid_turn, "tool_use", binding.usable_tokens + 1)
    assert context.prune_ids(mid_turn.state), "pruning alone would free enough"
    assert binding.plan(mid_turn.state, NOW_S) == "compact"
    too_long = "prompt is too long: 1000500 tokens > 1000000 maximum"
    assert binding.overflow_plan(mid_turn.state, too_long) == "compact"
    assert make_context(tmp_path, model="claude-opus-4-8").plan(mid_turn.state, NOW_S) == "prune"


def test_where_pruning_cannot_keep_a_small_window_the_same_rule_compacts_at_a_turn_start(tmp_path):
    log = Log()
    log.add("UserMessageCreated", text="design notes:\n" + "words " * 70_000)    # ~105K tokens of talk
    finish_turn(log, 110_000)
    log.add("UserMessageCreated", text="and now?")
    assert context.prune_ids(log.state) == [], "nothing to prune"
    small = make_context(tmp_path, model="claude-haiku-4-5")     # 200K window: usable 148K
    assert small.plan(log.state, NOW_S) == "compact"
    assert make_context(tmp_path, model="claude-sonnet-5-5").plan(log.state, NOW_S) is None, "1M: not yet"
    log.add("ModelTextBlockCompleted", text="working")
    respond(log, "end_turn", 110_000)
    assert small.plan(log.state, NOW_S) is None, "mid-turn it waits for the window's end"
    short = finish_turn(Log(), 110_000)
    short.add("UserMessageCreated", text="hi")
    assert not context.compaction_pays(short.state, "claude-haiku-4-5", "claude-haiku-5-5", 110_000)


def test_what_the_user_attached_is_never_pruned(tmp_path):
    log = Log()
    log.add("UserMessageCreated", text="explain @src/f0.py, and @./src/f1.py.")
    log.add("UserShellRan", command="cat big.log", output="L" * 200_000, exit_code=0, duration_ms=5)
    read_turn(log, 10, 32_000, question="and the others")
    finish_turn(log, 110_000)
    log.add("UserMessageCreated", text="next")
    ids = make_context(tmp_path).prune(log.state, NOW_S)["tool_use_ids"]
    assert ids == [f"r{i}" for i in range(2, 7)], "the reads of attached files stay"
    request = make_context(tmp_path).build_request(log.state)
    shell = [b["text"] for m in request["messages"] for b in m["content"] if b["type"] == "text"]
    assert any("L" * 200_000 in t for t in shell), "a `!` command's output is the user's: never pruned"


def test_a_placeholder_says_how_to_get_the_result_back(tmp_path):
    log = Log()
    log.add("UserMessageCreated", text="go")
    calls = [("read", {"file_path": "src/a.py"}, {"path": "src/a.py"}),
             ("bash", {"command": "pytest  -q\ntests"}, {"exit_code": 1, "spill": "/h/spill/bash-1.txt"}),
             ("grep", {"pattern": "x"}, {})]
    for n, (name, tool_input, meta) in enumerate(calls):
        log.add("ToolRequested", tool_use_id=f"c{n}", name=name, input=tool_input)
        respond(log, "tool_use")
        log.add("ToolCompleted", tool_use_id=f"c{n}", name=name, output="z" * 100_000, meta=meta)
    read_turn(log, 3, 40_000, question="more")
    finish_turn(log, 150_000)
    log.add("UserMessageCreated", text="next")
    ctx = make_context(tmp_path)
    payload = ctx.prune(log.state, NOW_S)
    said = payload["placeholders"]
    assert said["c0"] == ("[old tool result removed to save context; it was the read of src/a.py:"
                          " read the file again if you need it]")
    assert "`pytest -q tests`: run the command again" in said["c1"]
    assert "saved to /h/spill/bash-1.txt: read that file first" in said["c1"]
    assert "a grep search: run it again" in said["c2"]
    log.add("ContextPruned", **payload)
    results = [b for m in ctx.build_request(log.state)["messages"] for b in m["content"]
               if b["type"] == "tool_result"]
    assert [r["content"] for r in results[:3]] == [said["c0"], said["c1"], said["c2"]]
    # A prune recorded before placeholders were: the fixed text.
    log.add("ContextPruned", tool_use_ids=["r0"])
    messages = events.replay(log).messages
    results = [b for m in messages for b in m["content"] if b["type"] == "tool_result"]
    assert results[3]["content"] == events.PRUNED_PLACEHOLDER


def test_resume_rebuilds_the_same_request_bytes_after_a_prune(tmp_path):
    """The kernel's path: events through a Bus into the JSONL log, the prune payload from the
    policy; reopening the log (a resume) folds it again into the same request, byte for byte."""
    events_dir = tmp_path / "sessions"
    bus = events.Bus(events.SessionStore.create(events_dir))
    for event in ten_files_then_a_question():
        payload = {k: v for k, v in event.items() if k not in ("v", "seq", "id", "ts", "session", "type")}
        bus.emit(event["type"], **payload)
    ctx = make_context(tmp_path)
    state = bus.store.state
    assert ctx.plan(state, time_now()) == "prune"
    bus.emit("ContextPruned", **ctx.prune(state, time_now()))
    before = json.dumps(ctx.build_request(bus.store.state), ensure_ascii=False)
    path = bus.store.path
    bus.store.close()
    resumed = events.SessionStore.open(path)
    after = json.dumps(ctx.build_request(resumed.state), ensure_ascii=False)
    resumed.close()
    assert after == before
    assert events.PRUNED_PLACEHOLDER[:40] in before and "src/f0.py: read the file again" in before
    assert "0" * 32_000 not in before and "9" * 32_000 in before


def time_now() -> float:
    import time
    return time.time()


def test_the_prune_changes_only_the_messages_after_the_first_cleared_result(tmp_path):
    log = ten_files_then_a_question()
    ctx = make_context(tmp_path)
    before = ctx.build_request(log.state)
    log.add("ContextPruned", **ctx.prune(log.state, NOW_S))
    after = ctx.build_request(log.state)
    assert stable(before["messages"][:2]) == stable(after["messages"][:2]), "the cached head survives"
    assert len(stable(after)) < len(stable(before)) - 200_000


def test_prune_report_says_what_why_and_what_it_saved(tmp_path):
    log = ten_files_then_a_question()
    ctx = make_context(tmp_path)
    log.add("ContextPruned", **ctx.prune(log.state, NOW_S))
    for _ in range(30):
        respond(log, "end_turn", 40_000)
    lines = context.prune_report(log, 100_000)
    assert lines[2].startswith("- trigger: past 100,000 input tokens (config `context.prune_at`)")
    assert lines[3].startswith("- 7 tool results cleared (7 read), ~55,")
    assert "past the trigger at 110,0" in lines[3] and "pays its cache rewrite back in" in lines[3]
    one = [{"type": "ToolRequested", "tool_use_id": "t1", "name": "read"},
           {"type": "ContextPruned", "tool_use_ids": ["t1"], "freed_tokens": 900}]
    assert context.prune_report(one, 100_000)[3].startswith("- 1 tool result cleared (1 read), ~900")
    # 30 requests x ~56K tokens x $0.20/M = $0.34, less the rewrite of ~24K x $2.30/M = $0.06
    assert "saved ~$0.28 so far" in lines[3]
    assert lines[4].startswith("- in all: ~55,")
    assert context.prune_report(Log(), 0)[2].startswith("- trigger: off")
    assert context.prune_report(Log(), 0)[-1] == "- nothing pruned yet"


def test_the_program_prunes_past_prune_at_and_context_explains(khaelor, fake, project, env, monkeypatch):
    (project / ".khaelor").mkdir()
    (project / ".khaelor" / "config.json").write_text('{"context": {"prune_at": 20000}}')
    for i in range(6):       # ~7.5K tokens each
        (project / f"f{i}.txt").write_text("".join(f"file {i} line {n:03d} " + f"{i}" * 80 + "\n" for n in range(300)))
    fake.enqueue(*[reply(tool_use("read", {"file_path": f"f{i}.txt"})) for i in range(6)], reply(text("read them")))
    run = khaelor.run("-p", "read the six files")
    assert run.returncode == 0, run.stderr
    # The fake's replies carry no thinking, so nothing binds the history: it prunes within the turn.
    log = khaelor.log()
    pruned = [e for e in log if e["type"] == "ContextPruned"]
    assert len(pruned) == 1 and pruned[0]["reason"] == "cost" and len(pruned[0]["tool_use_ids"]) == 3
    assert [e["type"] for e in log].index("ContextPruned") > [e["type"] for e in log].index("ToolCompleted")
    last = json.dumps(fake.requests[-1]["body"]["messages"])
    assert "it was the read of f0.txt" in last and "file 0 line 299" not in last and "file 5 line 299" in last
    assert fake.rejections == []

    async def context_command(session):
        before = session.fold_status()["context_pct"]
        # the status line's context figure drops as a prune is recorded, before the next usage
        session.bus.emit("ContextPruned", tool_use_ids=[], freed_tokens=10_000)
        return await session.cmd_context(""), before - session.fold_status()["context_pct"]
    shown, dropped = in_session(project, env, monkeypatch, context_command)
    assert dropped == pytest.approx(1.0), "10K tokens of a 1M window"
    assert "- trigger: past 20,000 input tokens" in shown
    assert "- 3 tool results cleared (3 read)" in shown and "pays its cache rewrite back in" in shown


def test_a_bad_context_setting_is_a_clear_error(khaelor, project):
    (project / ".khaelor").mkdir()
    for bad, says in (('{"context": {"prune_at": "100K"}}', "'context.prune_at' must be a whole number"),
                      ('{"context": {"prune": 1}}', "unknown key 'context.prune'")):
        (project / ".khaelor" / "config.json").write_text(bad)
        result = khaelor.run("-p", "hi")
        assert result.returncode == 2 and says in result.stderr, result.stderr


def test_the_bench_session_stays_valid_and_its_binding_check_can_fail(monkeypatch):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    import bench_prune
    session = bench_prune.run(12, 30_000, 0)
    assert session.prunes and not session.invalid
    monkeypatch.setattr(context, "may_prune_now", lambda state, model: True)     # prune mid-turn
    forced = bench_prune.run(12, 30_000, 0)
    assert any("bound to a different conversation" in problem for _, problem in forced.invalid)
