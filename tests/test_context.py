"""Tests for context.py: prompt tiers, request assembly and cache discipline, budget, pruning,
compaction cuts, checkpoints and the YAML emitter. Real files and real git in tmp_path; the only
stand-in is the aux model's answer, given as a plain async function."""
import ast
import asyncio
import copy
import json
import random
import shutil
import subprocess
from pathlib import Path

import pytest

import context
import events

SCHEMAS = [{"name": name, "description": f"the {name} tool", "input_schema": {"type": "object", "properties": {}}}
           for name in ("read", "write", "edit", "grep", "glob", "bash", "process")]


class Log(list):
    """Events in the envelope events.py writes, numbered as a store would number them."""

    def add(self, type: str, **payload) -> dict:
        event = {"v": 1, "seq": (self[-1]["seq"] + 1) if self else 1, "id": f"e{len(self)}", "ts": 0,
                 "session": "s", "type": type, **payload}
        self.append(event)
        return event

    @property
    def state(self) -> events.State:
        """The fold of the log, as a store keeps it: only the events added since the last fold are
        applied to it; a log cut or changed since is folded again from the start."""
        folded = getattr(self, "_folded", [])
        if len(folded) > len(self) or any(a is not b for a, b in zip(folded, self)):
            folded = []
        if not folded:
            self._state = events.State()
        for event in self[len(folded):]:
            events.apply(self._state, event)
        self._folded = list(self)
        return self._state

    def cut_to(self, whole: list[dict], cut: int, folded: events.State) -> None:
        """The log cut to whole[:cut], with `folded` (that prefix's fold) as its state."""
        self[:] = whole[:cut]
        self._state, self._folded = folded, list(self)


def folds_at(whole: list[dict], cuts: list[int]) -> list[events.State]:
    """The fold of whole[:cut] for each of the ascending `cuts`: one pass over the log, a copy of
    the state at each cut (folding each prefix from its start took a third of the test's time)."""
    folds = []
    state = events.State()
    done = 0            # the events folded into state so far
    for cut in cuts:
        for event in whole[done:cut]:
            events.apply(state, event)
        done = cut
        folds.append(copy.deepcopy(state))
    return folds


def make_context(tmp_path, model="claude-sonnet-5-5", workspace=None) -> context.Context:
    root = tmp_path / "project"
    root.mkdir(exist_ok=True)
    return context.Context(project_root=root, cwd=root, home=tmp_path / "home", model=model,
                           tool_schemas=SCHEMAS, workspace=workspace, user_home=tmp_path / "user-home")


def stable(value) -> str:
    """Bytes for comparison with cache_control markers removed: they mark positions, and the API
    leaves them out of the cache key, so a marker moving to a newer message keeps the prefix."""
    def strip(v):
        if isinstance(v, dict):
            return {k: strip(x) for k, x in v.items() if k != "cache_control"}
        if isinstance(v, list):
            return [strip(x) for x in v]
        return v
    return json.dumps(strip(value), ensure_ascii=False, separators=(",", ":"))


def usage(n_input=10, n_output=5, read=0, write=0) -> dict:
    return {"input_tokens": n_input, "output_tokens": n_output, "cache_read_tokens": read, "cache_write_tokens": write}


def check_api_valid(messages: list[dict]) -> None:
    """The structural rules of ANTHROPIC_API.md §3.1 the history must always satisfy."""
    assert messages and messages[0]["role"] == "user"
    for i, message in enumerate(messages):
        assert message["content"], f"messages.{i} is empty"
        for block in message["content"]:
            assert block["type"] != "text" or block["text"], f"messages.{i} has an empty text block"
        if i:
            assert message["role"] != messages[i - 1]["role"] or message["role"] == "assistant", messages
        results = [b for b in message["content"] if b["type"] == "tool_result"]
        if results:
            n = len(results)
            assert all(b["type"] == "tool_result" for b in message["content"][:n]), "text before a tool_result"
            uses = {b["id"] for b in messages[i - 1]["content"] if b["type"] == "tool_use"} if i else set()
            assert {b["tool_use_id"] for b in results} <= uses, f"messages.{i}: a result without its use"
        # The newest message may still be collecting results (the tools are running).
        if message["role"] == "assistant" and i + 2 < len(messages):
            uses = {b["id"] for b in message["content"] if b["type"] == "tool_use"}
            if uses:
                following = {b["tool_use_id"] for b in messages[i + 1]["content"] if b["type"] == "tool_result"}
                assert following == uses, f"messages.{i}: tool_use without tool_result right after"


# ---------------------------------------------------------------- system prompt tiers

def instruction_files(home, root, cwd) -> list:
    """The instruction files a session reads (none of these tests' files import others)."""
    return [item.path for item in context.load_instructions(home, root, cwd)[0]]


def test_instruction_discovery_nearest_project_file_wins_and_global_comes_first(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "user-home"))     # a real ~/.claude/CLAUDE.md stays out
    home, root = tmp_path / "home", tmp_path / "repo"
    deeper = root / "pkg" / "sub"
    deeper.mkdir(parents=True)
    home.mkdir()
    (tmp_path / "KHAELOR.md").write_text("above the project: never read")
    (home / "CLAUDE.md").write_text("GLOBAL claude")
    (home / "AGENTS.md").write_text("GLOBAL agents: loses to CLAUDE.md")
    (root / "KHAELOR.md").write_text("ROOT khaelor")
    (root / "pkg" / "AGENTS.md").write_text("PKG agents")

    found = instruction_files(home, root, deeper)
    assert found == [home / "CLAUDE.md", root / "pkg" / "AGENTS.md"]

    (root / "pkg" / "KHAELOR.md").write_text("PKG khaelor")   # same directory: KHAELOR.md first
    assert instruction_files(home, root, deeper)[1] == root / "pkg" / "KHAELOR.md"
    assert instruction_files(home, root, root)[1] == root / "KHAELOR.md"

    loaded = context.load_instructions(home, root, deeper)[0]
    project_tier = context.build_system(root, deeper, loaded)[2]["text"]
    assert project_tier.index("GLOBAL claude") < project_tier.index("PKG khaelor")
    for absent in ("ROOT khaelor", "PKG agents", "never read", "loses to"):
        assert absent not in project_tier


def test_no_instruction_files_and_fixed_tiers_do_not_depend_on_the_project(tmp_path):
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "project").mkdir()
    (tmp_path / "other" / "project" / "CLAUDE.md").write_text("other rules")
    a, b = make_context(tmp_path), make_context(tmp_path / "other")
    assert "other rules" in b.system[2]["text"]
    assert a.system[:2] == b.system[:2]
    assert [blk["text"] for blk in a.system[:2]] == [context.IDENTITY, context.TOOL_GUIDANCE]
    assert "Instructions from" not in a.system[2]["text"]


def test_prompt_sizes_are_small(tmp_path):
    """Tiers 1-2, the same for every session (estimated tokens)."""
    identity = events.estimate_tokens(context.IDENTITY)
    guidance = events.estimate_tokens(context.TOOL_GUIDANCE)
    fixed_system = events.estimate_tokens(context.IDENTITY + context.TOOL_GUIDANCE)
    assert abs(fixed_system - identity - guidance) <= 1
    assert fixed_system < 1_200     # the README quotes this number; keep the fixed part small


def test_oversized_instruction_file_is_cut(tmp_path):
    root = tmp_path / "project"
    root.mkdir()
    (root / "AGENTS.md").write_text("x" * (context.MAX_INSTRUCTION_CHARS + 500))
    text = make_context(tmp_path).system[2]["text"]
    assert "cut: the file has" in text and len(text) < context.MAX_INSTRUCTION_CHARS + 1_000


# ---------------------------------------------------------------- request assembly

def scripted_session(bus, requests, ctx):
    """A multi-turn session; a request is built wherever the kernel would call the model, and the
    environment facts recorded before a turn's first request, as the kernel records them."""
    def call(facts=""):
        if facts:
            bus.emit("EnvironmentNoted", text=facts)
        requests.append(ctx.build_request(bus.store.state))

    bus.emit("SessionCreated", cwd="/p", project_root="/p", model=ctx.model, aux_model="a", version="0")
    bus.emit("UserMessageCreated", text="fix the failing parser test")
    call("<environment>\nDate: 1\n</environment>")
    bus.emit("ModelThinkingBlockCompleted", thinking="", signature="sig1")
    bus.emit("ModelTextBlockCompleted", text="Reading the parser first.")
    bus.emit("ToolRequested", tool_use_id="t1", name="read", input={"file_path": "parser.py"})
    bus.emit("ModelResponseCompleted", message_id="m1", model=ctx.model, stop_reason="tool_use", usage=usage())
    bus.emit("ToolStarted", tool_use_id="t1", name="read")
    bus.emit("ToolCompleted", tool_use_id="t1", name="read", output="1\tdef parse(): ...", meta={})
    call()
    bus.emit("ToolRequested", tool_use_id="t2", name="edit", input={"file_path": "parser.py"})
    bus.emit("ToolRequested", tool_use_id="t3", name="bash", input={"command": "pytest -q"})
    bus.emit("ModelResponseCompleted", message_id="m2", model=ctx.model, stop_reason="tool_use", usage=usage())
    bus.emit("ToolFailed", tool_use_id="t2", name="edit", output="old_string not found", meta={})
    bus.emit("PermissionDenied", tool_use_id="t3", reason="the user declined", feedback="run only the parser tests")
    bus.emit("SteeringQueued", text="also update the docs")
    bus.emit("SteeringInjected", text="also update the docs")
    call()
    bus.emit("ModelTextBlockCompleted", text="Done: the parser handles empty input.")
    bus.emit("ModelResponseCompleted", message_id="m3", model=ctx.model, stop_reason="end_turn", usage=usage())
    bus.emit("TaskCompleted", evidence={})
    bus.emit("UserMessageCreated", text="now run the whole suite")
    call("<environment>\nDate: 4\n</environment>")
    bus.emit("ToolRequested", tool_use_id="t4", name="bash", input={"command": "pytest"})
    bus.emit("ModelResponseCompleted", message_id="m4", model=ctx.model, stop_reason="tool_use", usage=usage())
    bus.emit("ToolCompleted", tool_use_id="t4", name="bash", output="42 passed", meta={})
    call()


def test_requests_are_byte_stable_across_a_session(tmp_path):
    ctx, requests = make_context(tmp_path), []
    scripted_session(events.Bus(events.SessionStore.create(tmp_path / "s")), requests, ctx)
    first = requests[0]
    dump = lambda v: json.dumps(v, ensure_ascii=False, separators=(",", ":"))
    for request in requests:
        assert dump(request["system"]) == dump(first["system"]) and dump(request["tools"]) == dump(first["tools"])
        assert set(request) == {"model", "max_tokens", "system", "tools", "messages", "thinking"}
    for before, after in zip(requests, requests[1:]):
        old, new = before["messages"], after["messages"]
        # Every message a request sent is sent again unchanged (cache breakpoints aside): the whole
        # previous request is a cache hit, and a replayed thinking block stays bound (5.5 models).
        assert stable(new[:len(old)]) == stable(old)
        assert stable(new).startswith(stable(old)[:-1])


def test_the_environment_facts_follow_the_message_that_opened_their_turn(tmp_path):
    ctx, requests = make_context(tmp_path), []
    scripted_session(events.Bus(events.SessionStore.create(tmp_path / "s")), requests, ctx)
    for request in requests:
        first = request["messages"][0]["content"]
        assert [b["text"] for b in first[:2]] == ["fix the failing parser test",
                                                  "<environment>\nDate: 1\n</environment>"]
        assert "Date: " not in stable(request["system"]) + stable(request["tools"])
    texts = [b.get("text", "") for m in requests[-1]["messages"] for b in m["content"]]
    turn_two = texts.index("now run the whole suite")
    assert texts[turn_two + 1] == "<environment>\nDate: 4\n</environment>"
    assert sum(text.startswith("<environment>") for text in texts) == 2


def count_breakpoints(request: dict) -> int:
    blocks = [*request.get("system", []), *request.get("tools", [])]
    for message in request.get("messages", []):
        blocks += message["content"]
    return sum("cache_control" in block for block in blocks)


def test_breakpoints_at_most_four_and_where_they_belong(tmp_path):
    ctx, requests = make_context(tmp_path), []
    scripted_session(events.Bus(events.SessionStore.create(tmp_path / "s")), requests, ctx)
    for request in requests:
        assert count_breakpoints(request) <= 4
        assert "cache_control" in request["system"][-1] and "cache_control" in request["tools"][-1]
        messages = request["messages"]
        assert "cache_control" in messages[-1]["content"][-1]
        users = [m for m in messages if m["role"] == "user"]
        if len(users) > 1:
            assert "cache_control" in users[-2]["content"][-1]
        marked = [i for i, m in enumerate(messages) for b in m["content"] if "cache_control" in b]
        assert len(marked) == min(2, len(users))
    assert count_breakpoints(requests[-1]) == 4


def test_breakpoint_skips_thinking_and_empty_text_and_never_mutates_history():
    history = [{"role": "user", "content": "plain string content"},
               {"role": "assistant", "content": [{"type": "text", "text": "ok"},
                                                 {"type": "thinking", "thinking": "", "signature": "s"}]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "x"},
                                            {"type": "text", "text": ""}]}]
    before = copy.deepcopy(history)
    out = context.assemble_messages(history)
    assert history == before
    assert out[0]["content"] == [{"type": "text", "text": "plain string content", "cache_control": context.CACHE}]
    assert out[2]["content"][0]["cache_control"] == context.CACHE and "cache_control" not in out[2]["content"][1]
    # An assistant message ending in thinking (never sent last by the kernel) gets no marker on it.
    out = context.assemble_messages(history[:2])
    assert "cache_control" not in out[1]["content"][1] and out[1]["content"][0]["cache_control"] == context.CACHE


def test_a_whitespace_only_text_block_from_the_model_is_not_sent_back(tmp_path):
    """The API streams "\n\n" text blocks before a tool_use and refuses them when replayed
    ("text content blocks must contain non-whitespace text")."""
    from fake_api import validate
    log = Log()
    log.add("UserMessageCreated", text="hi")
    log.add("ModelTextBlockCompleted", text="\n\n")
    log.add("ToolRequested", tool_use_id="toolu_1", name="read", input={"file_path": "x"})
    log.add("ModelResponseCompleted", message_id="m", model="claude-sonnet-5-5", stop_reason="tool_use",
            usage=usage())
    log.add("ToolCompleted", tool_use_id="toolu_1", output="ok")
    request = make_context(tmp_path).build_request(log.state)
    assert validate(request) is None
    assert [b["type"] for b in request["messages"][1]["content"]] == ["tool_use"]


def test_a_whitespace_only_user_message_does_not_stay_in_every_later_request(tmp_path):
    """A paste of blank lines sent as a message: its text block would be refused by the API in
    this request and in every later one, since each later message joins the same user message."""
    from fake_api import validate
    log = Log()
    log.add("UserMessageCreated", text="hi")
    log.add("ModelTextBlockCompleted", text="hello")
    log.add("ModelResponseCompleted", message_id="m", model="claude-sonnet-5-5", stop_reason="end_turn",
            usage=usage())
    log.add("TaskCompleted", evidence={})
    log.add("UserMessageCreated", text=" \n\n  \n")
    log.add("TaskFailed", reason="x")
    log.add("UserMessageCreated", text="go on")
    request = make_context(tmp_path).build_request(log.state)
    assert validate(request) is None
    assert [b["text"] for b in request["messages"][-1]["content"]] == ["go on"]


def test_replay_from_jsonl_after_compaction_gives_identical_requests(tmp_path):
    ctx, requests = make_context(tmp_path), []
    store = events.SessionStore.create(tmp_path / "s")
    bus = events.Bus(store)
    scripted_session(bus, requests, ctx)

    paid = {"input_tokens": 900, "output_tokens": 80, "cache_read_tokens": 0, "cache_write_tokens": 0}

    async def summarize(request):
        return {"text": '{"objective": "make the parser tests pass", "next_steps": ["run pytest"]}',
                "usage": paid, "model": "claude-haiku-5-5"}

    payload = asyncio.run(context.compact(store.state, summarize, aux_model=ctx.aux_model))
    bus.emit("ContextCompacted", **payload)
    assert store.state.usage["claude-haiku-5-5"] == paid      # the summary call is paid for: /cost
    bus.emit("UserMessageCreated", text="and the docs?")
    bus.emit("EnvironmentNoted", text="<environment>x</environment>")
    live = ctx.build_request(store.state)
    store.close()
    replayed = ctx.build_request(events.SessionStore.open(store.path).state)
    assert json.dumps(live) == json.dumps(replayed)
    assert live["messages"][0]["content"][0]["text"] == payload["summary"]
    check_api_valid(live["messages"])


def random_session(rng: random.Random, log: Log, ctx: context.Context, send) -> None:
    """Turns as the kernel records them, at random: thinking, text (some of it empty or blank),
    parallel calls with big or small results, denials, retried and interrupted replies, Esc during
    a tool, steering, and the prunes and compactions the context engine plans before each call.
    `send(thinking_blocks)` builds and checks each request and binds the reply's thinking to it."""
    async def summarize(request):
        return {"text": '{"objective": "x"}', "usage": {}, "model": "claude-haiku-5-5"}
    for turn in range(rng.randint(1, 5)):
        log.add("UserMessageCreated", text=rng.choice(["go", "next", " \n "]))
        log.add("EnvironmentNoted", text="<environment>x</environment>")
        for step in range(rng.randint(1, 10)):
            plan = ctx.plan(log.state, 1e9)
            if plan == "prune":
                log.add("ContextPruned", **ctx.prune(log.state, 1e9))
            elif plan == "compact" and (payload := asyncio.run(context.compact(log.state, summarize))):
                log.add("ContextCompacted", **payload)
            thought = []
            if rng.random() < 0.7:
                thought.append({"thinking": f"t{len(log)}", "signature": f"sig{len(log)}"})
                log.add("ModelThinkingBlockCompleted", thinking=f"t{len(log)}", signature=f"sig{len(log)}")
            if rng.random() < 0.5:
                log.add("ModelTextBlockCompleted", text=rng.choice(["ok", "", "\n\n"]))
            calls = [f"toolu_{len(log)}_{k}" for k in range(rng.choice([0, 1, 1, 2]))]
            for call in calls:
                log.add("ToolRequested", tool_use_id=call, name="read", input={"file_path": call})
            fate = rng.random()
            if fate < 0.1:
                log.add("TextCheckpoint", index=0, text="partial")
                log.add("Interrupted")
                break
            if fate < 0.15:
                log.add("ModelRequestFailed", kind="retryable", status=529, message="x", retrying=True)
                continue
            send(thought)
            log.add("ModelResponseCompleted", message_id="m", model="claude-sonnet-5-5",
                    stop_reason="tool_use" if calls else "end_turn",
                    usage=usage(read=rng.choice([1_000, 200_000, 990_000])))
            if not calls:
                log.add("TaskCompleted", evidence={})
                break
            esc = rng.random() < 0.15
            for call in calls[:-1] if esc else calls:
                kind = rng.choice(["ToolCompleted", "ToolFailed", "PermissionDenied"])
                log.add(kind, tool_use_id=call, name="read", output="x" * rng.choice([10, 40_000, 100_000]),
                        reason="no", by="user")
            if esc:
                log.add("ToolCancelled", tool_use_id=calls[-1], reason="interrupted by the user")
                log.add("Interrupted")
                break
            if rng.random() < 0.1:
                log.add("SteeringQueued", text="also this")
                log.add("SteeringInjected", text="also this")
        else:
            log.add("TaskFailed", reason="stopped after --max-turns")


def carry_on(log: Log) -> None:
    """What a resumed khaelor records before its next request: Kernel.repair, then Kernel.submit."""
    for tool_use_id in sorted(log.state.started_tools):
        log.add("ToolCancelled", tool_use_id=tool_use_id, reason="khaelor exited while the tool was running")
    if log.state.turn_open and (log.state.attempt.blocks or log.state.attempt.partial):
        log.add("Interrupted", reason="khaelor exited while the reply was streaming")
    for call in log.state.pending_tools:
        log.add("ToolCancelled", tool_use_id=call["tool_use_id"], reason="not run: the user sent a new message")
    for text in log.state.queued_steering:
        log.add("SteeringInjected", text=text)
    log.add("UserMessageCreated", text="carry on")
    log.add("EnvironmentNoted", text="<environment>y</environment>")


def test_random_sessions_and_their_logs_cut_anywhere_give_valid_requests(tmp_path):
    """Every request of a random session, and the next one after its log is cut anywhere and
    resumed, passes the API's checks, replayed thinking bound to what it was made for included
    (Sonnet 5.5 binds it)."""
    import fake_api
    ctx = make_context(tmp_path)
    # 100 sessions: a prune that unbinds replayed thinking (may_prune_now always True) fails
    # seeds 12, 24, 94 and 98 of the first 150, blank texts sent back fail 65 of the first 100
    for seed in range(100):
        rng = random.Random(seed)
        ctx.prune_at = rng.choice([0, 2_000, 100_000])
        log, memory = Log(), fake_api.Memory()

        def send(thought):
            body = ctx.build_request(log.state)
            problem = fake_api.validate(body, memory=memory) or fake_api.check_binding(body, memory)
            assert problem is None, (seed, problem, [e["type"] for e in log][-12:])
            for block in thought:
                memory.thinking[block["signature"]] = block["thinking"]
                memory.bound[block["signature"]] = fake_api._binding_key(body, len(body["messages"]))
        random_session(rng, log, ctx, send)
        whole = list(log)
        cuts = sorted(rng.sample(range(1, len(whole) + 1), min(20, len(whole))))
        for cut, folded in zip(cuts, folds_at(whole, cuts)):
            log.cut_to(whole, cut, folded)
            carry_on(log)
            if ctx.plan(log.state, 1e9) == "prune":
                log.add("ContextPruned", **ctx.prune(log.state, 1e9))
            send([])


# ---------------------------------------------------------------- volatile facts

def test_summarize_git_status():
    """From `git status --porcelain=v2 --branch -z`, the one status format khaelor reads."""
    mode = "N... 100644 100644 100644"
    sha = "0" * 40
    porcelain = "\0".join([
        f"# branch.oid {sha}", "# branch.head main", "# branch.upstream origin/main",
        "# branch.ab +2 -0", f"1 .M {mode} {sha} {sha} a.py", f"1 M. {mode} {sha} {sha} b.py",
        f"1 MM {mode} {sha} {sha} c.py", "? new.txt",
        f"u UU N... 100644 100644 100644 100644 {sha} {sha} {sha} d.py", ""])
    assert context.summarize_git_status(porcelain) == \
        "branch main (ahead 2); 2 staged, 2 modified, 1 untracked, 1 conflicted"
    unborn = "# branch.oid (initial)\0# branch.head trunk\0"
    assert context.summarize_git_status(unborn) == "branch trunk; clean"


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_volatile_facts_from_a_real_repository(tmp_path):
    import tools
    root = tmp_path / "project"
    root.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "work", str(root)], check=True)
    (root / "new.py").write_text("x = 1\n")
    ctx = make_context(tmp_path, workspace=tools.Workspace(root))
    facts = ctx.volatile_facts([{"process_id": "p1", "pid": 9, "command": "npm   run dev", "runtime_s": 125}])
    assert facts.startswith("<environment>\nDate: ") and facts.endswith("</environment>")
    assert "Git: branch work; 1 untracked" in facts
    assert "- p1: npm run dev (running 2m 5s)" in facts     # events.duration, the one formatter
    assert "Git:" not in make_context(tmp_path).volatile_facts([])   # no workspace, no git line


def test_the_facts_say_which_processes_ended_since_the_last_message_and_how(tmp_path):
    """A dev server that crashed, or was lost with a killed khaelor, is named once in the next
    turn's facts, so the model does not go on as if it ran; one it stopped itself is not."""
    log = [{"type": "ProcessStarted", "process_id": f"p{n}", "pid": n, "command": command}
           for n, command in enumerate(["npm run dev", "pytest -x", "sleep 99", "sh s"], 1)]
    log += [{"type": "ProcessExited", "process_id": "p1", "exit_code": 3, "cause": "exited"},
            {"type": "ProcessExited", "process_id": "p2", "exit_code": -15, "cause": "stopped"},
            {"type": "ProcessExited", "process_id": "p3", "exit_code": -9, "cause": "exited"},
            {"type": "ProcessExited", "process_id": "p4", "exit_code": None,
             "cause": "lost: khaelor exited while it ran"}]
    state = events.replay([{**event, "seq": seq} for seq, event in enumerate(log, 1)])
    facts = make_context(tmp_path).volatile_facts([], ended=state.ended)
    assert "Ended since the last message (`process read` shows their output):" in facts
    assert "- p1: npm run dev (exited with code 3)" in facts
    assert "- p3: sleep 99 (killed by signal 9)" in facts
    assert "- p4: sh s (lost: khaelor exited while it ran)" in facts
    assert "p2" not in facts
    events.apply(state, {"type": "EnvironmentNoted", "text": facts, "seq": 99})
    assert "Ended" not in make_context(tmp_path).volatile_facts([], ended=state.ended)


# ---------------------------------------------------------------- budget and pruning

def tool_turns(n_results: int, chars: int) -> Log:
    log = Log()
    log.add("UserMessageCreated", text="go")
    for i in range(n_results):
        log.add("ToolRequested", tool_use_id=f"t{i}", name="read", input={})
        log.add("ModelResponseCompleted", message_id=f"m{i}", model="x", stop_reason="tool_use", usage=usage())
        log.add("ToolCompleted", tool_use_id=f"t{i}", name="read", output="y" * chars, meta={})
    return log


def test_prune_protects_the_newest_tokens_of_tool_output():
    log = tool_turns(30, 16_000)          # 30 results of ~4K tokens each
    ids = context.prune_ids(log.state)
    per_result = context.estimate_tokens("y" * 16_000) - context.estimate_tokens(events.PRUNED_PLACEHOLDER)
    n_kept = -(-context.PRUNE_PROTECT_TOKENS // per_result)
    assert ids == [f"t{i}" for i in range(30 - n_kept)]
    kept = [e for e in log if e["type"] == "ToolCompleted" and e["tool_use_id"] not in ids]
    assert sum(context.estimate_tokens(e["output"]) for e in kept) >= context.PRUNE_PROTECT_TOKENS
    # Already-pruned results are not chosen again; too little to gain means no pruning at all.
    log.add("ContextPruned", tool_use_ids=ids)
    assert context.prune_ids(log.state) == []
    assert context.prune_ids(tool_turns(7, 16_000).state) == []        # under PRUNE_MINIMUM_TOKENS
    assert context.prune_ids(tool_turns(1, 1_000_000).state) == []      # the newest result is never pruned


def test_plan_uses_the_last_measured_usage(tmp_path):
    ctx = make_context(tmp_path, model="claude-haiku-4-5")        # 200K window
    ctx.prune_at = 0            # the window's end alone here; pruning by cost: test_prune.py
    usable = ctx.usable_tokens
    assert usable == 200_000 - context.MAX_OUTPUT_TOKENS - context.BUFFER_TOKENS
    assert context.window_of("claude-sonnet-5-5") == 1_000_000 and context.window_of("mystery-1") == 200_000
    log = tool_turns(30, 16_000)
    assert ctx.plan(log.state) is None
    log.add("ModelResponseCompleted", message_id="z", model="x", stop_reason="tool_use",
            usage=usage(n_input=2_000, read=usable - 20_000, write=10_000, n_output=10_000))
    assert ctx.plan(log.state) == "prune"              # ~100K prunable covers the ~2K over
    log.add("ContextPruned", tool_use_ids=context.prune_ids(log.state))
    assert ctx.plan(log.state) is None                 # stale until the next response is measured
    log.add("ModelResponseCompleted", message_id="z2", model="x", stop_reason="end_turn",
            usage=usage(n_input=1_000, read=usable, write=0))
    assert ctx.plan(log.state) == "compact"            # nothing left worth pruning
    assert ctx.overflow_plan(log.state, "prompt is too long: 250000 tokens > 200000 maximum") == "compact"
    fresh = tool_turns(30, 16_000)
    # Tool output that arrived after the last response counts too (estimated), before the next call.
    fresh.add("ModelResponseCompleted", message_id="y", model="x", stop_reason="tool_use",
              usage=usage(n_input=1_000, read=usable - 30_000))
    assert ctx.plan(fresh.state) is None
    fresh.add("ToolCompleted", tool_use_id="late", name="read", output="z" * 200_000, meta={})
    assert ctx.plan(fresh.state) == "prune"
    assert ctx.overflow_plan(fresh.state, "prompt is too long: 201000 tokens > 200000 maximum") == "prune"
    assert ctx.overflow_plan(fresh.state, "prompt is too long") == "compact"


# ---------------------------------------------------------------- compaction cut (property test)

def random_log(rng: random.Random) -> Log:
    """A session as the kernel writes it: retries, interruptions, denials, steering, pruning and
    compactions (at the cut context.choose_cut picks), then cut off at a random point."""
    log, n_tools = Log(), 0
    log.add("SessionCreated", cwd="/p")
    for _ in range(rng.randint(1, 4)):
        log.add("UserMessageCreated", text=rng.choice(["fix it", "go on", "x"]))
        for _ in range(rng.randint(1, 5)):
            if rng.random() < 0.15:
                log.add("ModelTextBlockCompleted", text="partial")
                log.add("ModelRequestFailed", kind="retryable", status=529, message="overloaded", retrying=True)
            if rng.random() < 0.5:
                log.add("ModelThinkingBlockCompleted", thinking="", signature="sig")
            if rng.random() < 0.6:
                log.add("ModelTextBlockCompleted", text=rng.choice(["", "on it"]))
            ids = [f"t{n_tools + k}" for k in range(rng.choice([0, 0, 1, 1, 2, 3]))]
            n_tools += len(ids)
            for tool_use_id in ids:
                log.add("ToolRequested", tool_use_id=tool_use_id, name="bash", input={"command": "ls"})
            if rng.random() < 0.07:
                log.add("Interrupted")
                break
            if not ids and log[-1]["type"] not in events.BLOCK_EVENTS:
                log.add("ModelTextBlockCompleted", text="done")
            log.add("ModelResponseCompleted", message_id="m", model="x", stop_reason="tool_use" if ids else "end_turn",
                    usage=usage())
            if not ids:
                log.add("TaskCompleted", evidence={})
                break
            interrupted = False
            for k, tool_use_id in enumerate(ids):
                if rng.random() < 0.05:
                    for rest in ids[k:]:
                        log.add("ToolCancelled", tool_use_id=rest, reason="interrupted by the user")
                    log.add("Interrupted")
                    interrupted = True
                    break
                roll = rng.random()
                if roll < 0.2:
                    log.add("PermissionRequested", tool_use_id=tool_use_id, capability="process.execute")
                    log.add("PermissionDenied", tool_use_id=tool_use_id, reason="no", feedback="")
                    continue
                log.add("ToolStarted", tool_use_id=tool_use_id, name="bash")
                if roll < 0.3:
                    log.add("ProcessStarted", process_id=f"p{tool_use_id}", pid=1, command="npm run dev")
                kind = "ToolFailed" if roll > 0.85 else "ToolCompleted"
                log.add(kind, tool_use_id=tool_use_id, name="bash", output="out " * rng.randint(0, 50), meta={})
                if roll < 0.5:
                    log.add("FileModified", tool_use_id=tool_use_id, path="a.py", added=1, removed=0, diff="", created=False)
            if interrupted:
                break
            if rng.random() < 0.2:
                log.add("SteeringQueued", text="also this")
                log.add("SteeringInjected", text="also this")
            if rng.random() < 0.1:
                log.add("ContextPruned", tool_use_ids=ids[:1])
            if rng.random() < 0.15 and context.choose_cut(log.state) is not None:
                log.add("ContextCompacted", checkpoint={}, summary="summary so far", cut_seq=context.choose_cut(log.state))
    return Log(log[:rng.randint(1, len(log))])


def safe_cuts(log: list[dict]) -> list[int]:
    """Every seq after the latest cut where the log may be cut: each prefix's `State.safe_cut`."""
    state, cuts = events.State(), []
    for event in log:
        events.apply(state, event)
        if state.safe_cut == event["seq"]:
            cuts.append(event["seq"])
    return [seq for seq in cuts if seq > state.cut_seq]


def test_a_cut_never_separates_a_tool_use_from_its_result():
    rng = random.Random(20261130)
    n_cuts = 0
    for _ in range(400):
        log = random_log(rng)
        requested = {e["tool_use_id"]: e["seq"] for e in log if e["type"] == "ToolRequested"}
        answered = {e["tool_use_id"]: e["seq"] for e in log if e["type"] in events.TOOL_RESULT_EVENTS}
        cuts = safe_cuts(log)
        chosen = context.choose_cut(log.state)
        assert chosen is None or chosen == cuts[-1]
        for cut in rng.sample(cuts, min(8, len(cuts))) + ([chosen] if chosen else []):
            n_cuts += 1
            for tool_use_id, seq in requested.items():
                assert not (seq <= cut < answered.get(tool_use_id, 0)), (tool_use_id, cut)
            compacted = Log(log)
            compacted.add("ContextCompacted", checkpoint={}, summary="checkpoint", cut_seq=cut)
            messages = events.replay(compacted).messages
            assert messages[0]["content"][0]["text"] == "checkpoint"
            check_api_valid(messages)
    assert n_cuts > 1_000


def test_newest_cut_is_the_end_of_a_settled_log():
    log = tool_turns(3, 10)
    assert context.choose_cut(log.state) == log[-1]["seq"]
    log.add("ToolRequested", tool_use_id="open", name="bash", input={})
    log.add("ModelResponseCompleted", message_id="m", model="x", stop_reason="tool_use", usage=usage())
    assert context.choose_cut(log.state) == log[-3]["seq"]       # not between a tool_use and its result
    log.add("ContextCompacted", checkpoint={}, summary="s", cut_seq=log[-3]["seq"])
    assert context.choose_cut(log.state) is None                 # nothing new since the last cut


# ---------------------------------------------------------------- checkpoints

def test_parse_checkpoint_is_robust_to_prose_fences_and_missing_keys():
    answer = 'Here is the checkpoint:\n```json\n{"objective": "ship it", "completed": "one thing", ' \
             '"important_files": ["a.py", {"path": "b.py", "reason": "core", "extra": 1}], ' \
             '"decisions": [{"what": "use X", "why": "fast"}], "next_steps": null}\n```\nHope that helps {.'
    checkpoint = context.parse_checkpoint(answer)
    assert list(checkpoint) == list(context.CHECKPOINT_KEYS)
    assert checkpoint["objective"] == "ship it" and checkpoint["completed"] == ["one thing"]
    assert checkpoint["important_files"] == [{"path": "a.py"}, {"path": "b.py", "reason": "core"}]
    assert checkpoint["decisions"] == ["what: use X; why: fast"]
    assert checkpoint["next_steps"] == [] and checkpoint["current_state"] == ""
    prose = context.parse_checkpoint("I could not produce JSON, but we fixed a.py.")
    assert prose["current_state"] == "I could not produce JSON, but we fixed a.py." and prose["changes"] == []
    cut_off = '{"objective": "x", "important_files": [{"path": "a.py", "reason": "core"}], "next_st'
    assert context.parse_checkpoint(cut_off)["current_state"] == cut_off      # kept, not a nested fragment
    evidence = context.parse_checkpoint('{"raw_evidence": [{"label": "trace", "content": "  File a.py\n    x()\n"}]}')
    assert evidence["raw_evidence"] == [{"label": "trace", "content": "  File a.py\n    x()"}]


def test_compact_builds_a_tool_free_request_and_records_log_facts(tmp_path):
    log = tool_turns(2, 50_000)
    log.add("ProcessStarted", process_id="p1", pid=4, command="npm run dev")
    log.add("FileModified", tool_use_id="t1", path="src/a.py", added=3, removed=1, diff="", created=False)
    log.add("UserMessageCreated", text="now: fix \"quotes\"\n- and dashes")
    log.add("ModelTextBlockCompleted", text="ok")
    log.add("ModelResponseCompleted", message_id="m", model="x", stop_reason="end_turn", usage=usage())
    seen = []

    async def summarize(request):
        seen.append(request)
        return 'Sure! {"objective": "fix quotes", "running_processes": [{"id": "wrong"}]} trailing'

    payload = asyncio.run(context.compact(log.state, summarize, focus="the parser", aux_model="claude-haiku-5-5"))
    request = seen[0]
    assert "tools" not in request and request["model"] == "claude-haiku-5-5"
    assert "tool_use" not in json.dumps(request["messages"]).replace("[tool call", "")
    transcript = request["messages"][0]["content"][0]["text"]
    assert "focus on: the parser" in transcript and "characters omitted" in transcript
    assert len(transcript) < 30_000                           # 100K chars of tool output were clipped
    assert payload["cut_seq"] == log[-1]["seq"]
    checkpoint = payload["checkpoint"]
    assert checkpoint["running_processes"] == [{"id": "p1", "command": "npm run dev", "status": "running"}]
    assert checkpoint["changes"] == ["src/a.py: +3 -1 lines"]
    assert checkpoint["raw_evidence"][0]["content"] == "now: fix \"quotes\"\n- and dashes"
    assert payload["summary"].startswith(context.SUMMARY_HEADER)
    yaml = pytest.importorskip("yaml")
    assert yaml.safe_load(payload["summary"]) == checkpoint


# ---------------------------------------------------------------- YAML emitter

TRICKY = ["plain words", "key: value", "ends with colon:", "- leading dash", "#hash", "a # comment",
          "'single'", '"double"', "multi\nline\ntext", "trailing newline\n", "two trailing\n\n", "",
          " leading space", "trailing space ", "yes", "No", "null", "~", "123", "1.5e3", "0x1F", ".inf",
          "+.inf", "@at", "`tick", "!tag", "&anchor", "*alias", "{brace}", "[bracket]", "% percent",
          "tab\there", "cr\r\nlf", "bell\x07", "nel\x85", "ls\u2028", "emoji 🎉 ünïcödé", "a: b\nc: d",
          "  indented\nblock", "\nstarts with newline", "line\n  \nwhitespace line", "---", "...", "? q",
          "path/to/file.py:12", "C:\\windows\\path", "=", "<<"]


def test_yaml_emitter_is_well_formed_for_tricky_strings():
    document = {"strings": TRICKY, "nested": {"list": [{"path": "a: b", "content": "x\n- y\n"}, [1, [True, None]]],
                                              "empty_list": [], "empty_dict": {}}, "number": 3, "weird key: x": "v"}
    text = context.to_yaml(document)
    assert "\t" not in text.replace("tab\\there", "") and "\r" not in text
    assert 'key: value' not in text.splitlines()             # never a plain scalar with ": "
    assert '  - "- leading dash"' in text.splitlines()
    assert "  - |-\n    multi\n    line\n    text" in text
    yaml = pytest.importorskip("yaml")
    assert yaml.safe_load(text) == document
    for value in TRICKY:
        assert yaml.safe_load(context.to_yaml(value)) == value
        assert yaml.safe_load(context.to_yaml({"k": [value, {"v": value}]})) == {"k": [value, {"v": value}]}


def test_yaml_emitter_round_trips_random_strings():
    yaml = pytest.importorskip("yaml")
    rng = random.Random(7)
    alphabet = "ab :-#'\"\n\t|>{}[],&*!%@`?~=.0123\\é🎉"
    for _ in range(300):
        value = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        assert yaml.safe_load(context.to_yaml({"k": [value]})) == {"k": [value]}, repr(value)


# ---------------------------------------------------------------- inspection and import rules

def test_inspect_reports_every_section(tmp_path):
    ctx, requests = make_context(tmp_path), []
    store = events.SessionStore.create(tmp_path / "s")
    scripted_session(events.Bus(store), requests, ctx)
    rows = ctx.inspect(store.state, usage(n_input=100, read=3_000, write=200))
    names = [row["section"] for row in rows]
    assert names[:-1] == ["tools", "system: identity", "system: tool guidance", "system: project",
                          "checkpoint", "history"]
    assert all(row["tokens"] > 0 for row in rows if row["section"] != "checkpoint")
    assert sum(row["cached_tokens"] for row in rows[:-1]) <= 3_000 and rows[-1]["cached_tokens"] == 3_000
    assert rows[0]["cached_tokens"] > 0


def test_context_imports_only_stdlib_events_and_model():
    tree = ast.parse(Path(context.__file__).read_text())
    ours = {"khaelor", "kernel", "tools", "permissions", "ui", "anthropic"}
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not imported & ours and {"events", "model"} >= imported & {"events", "model"}


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_git_status_is_asked_again_only_when_the_tree_may_have_changed(tmp_path):
    import tools
    root = tmp_path / "project"
    root.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "work", str(root)], check=True)
    ctx = make_context(tmp_path, workspace=tools.Workspace(root))
    assert "Git: branch work; clean" in ctx.volatile_facts([], world_seq=5)
    (root / "new.py").write_text("x = 1\n")
    assert "Git: branch work; clean" in ctx.volatile_facts([], world_seq=5)     # only reads since
    assert "1 untracked" in ctx.volatile_facts([], world_seq=9)                 # a tool ran
    (root / "two.py").write_text("y = 2\n")
    assert "2 untracked" in ctx.volatile_facts([])                             # unknown: always asked
    log = Log()
    log.add("UserMessageCreated", text="go")
    log.add("ToolRequested", tool_use_id="r", name="read", input={})
    log.add("ModelResponseCompleted", message_id="m", model="x", stop_reason="tool_use", usage=usage())
    log.add("ToolCompleted", tool_use_id="r", name="read", output="x", meta={})
    assert log.state.world_seq == 0
    log.add("ToolRequested", tool_use_id="b", name="bash", input={"command": "touch z"})
    log.add("ModelResponseCompleted", message_id="m", model="x", stop_reason="tool_use", usage=usage())
    log.add("ToolCancelled", tool_use_id="b", reason="interrupted")
    assert log.state.world_seq == log[-1]["seq"]
