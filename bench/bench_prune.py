"""Pruning by cost (issue 24). Run: python3 bench/bench_prune.py [--turns 40 100] [--idle-every N]

A scripted session, each turn: the user asks; the model thinks and reads a distinct 24 KB file; it
thinks and runs one command (1.5 KB of output); it thinks and answers. Three requests a turn: 120
for 40 turns. It is played twice on the same scripted API, with khaelor's policy and with
keep-everything (context.prune_at = 0; a 1M window never reaches the window's end here).

What runs is in-process and real where it matters: the events the kernel would record are folded by
events.apply into the State, the policy is Context.plan / Context.prune, and every request is
Context.build_request's output. Each request then goes through tests/fake_api.py: `validate` (the
real API's rules, replayed thinking byte for byte against what the fake emitted) and its prompt-cache
simulation (a read for the longest earlier prefix up to a breakpoint, entries alive five minutes after
their last use, on a simulated clock: 15 s a request, 60 s between turns). The fake's usage becomes
the response's usage, as the real program records it. One check beyond the fake's: on Sonnet 5.5 a
replayed thinking block of the current turn must see the same earlier messages as when it was made
(the block binding of ANTHROPIC_API.md §3.3). Requests are built without the volatile tail: as
assemble_messages moves it from message to message, every mid-turn request would fail that check,
pruning or not (reported to the lead). What this leaves out: the kernel loop and the SDK and HTTP
layers (the numbers do not depend on them; tests/test_prune.py runs the real program).

Reports, per policy: total input cost (the model's prices, events.PRICES; Sonnet 5.5 by default), peak request size,
cache-read share, prunes, and invalid requests (must be 0). Target: khaelor ≤ 0.6× keep-everything,
peak ≤ 150K tokens.
"""
import argparse
import json
import random
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import context  # noqa: E402
import events  # noqa: E402
import fake_api  # noqa: E402
import tools  # noqa: E402

MODEL = "claude-sonnet-5-5"
FILE_BYTES = 24_000
COMMAND_BYTES = 1_500
REQUEST_S = 15          # one request, start to end, on the simulated clock
TURN_GAP_S = 60         # the user reading the answer and typing the next question
IDLE_S = 360            # a break: longer than the cache lives
WORDS = ("def", "return", "self", "value", "index", "result", "config", "path", "state", "event",
         "if", "for", "in", "None", "True", "items", "append", "update", "name", "data")


def source_file(rng: random.Random, size: int) -> str:
    """`size` characters of Python-looking text, different for every file."""
    lines = []
    total = 0
    while total < size:
        n_words = rng.randint(3, 10)
        line = "    " * rng.randint(0, 3) + " ".join(rng.choice(WORDS) for _ in range(n_words))
        line += f"  # {rng.getrandbits(32):08x}"
        lines.append(line)
        total += len(line) + 1
    return "\n".join(lines)[:size]


class Session:
    """The log of one scripted session, folded as it grows, and what it cost."""

    def __init__(self, ctx: context.Context, seed: int):
        self.ctx = ctx
        self.rng = random.Random(seed)
        self.state = events.State()
        self.seq = 0
        self.now = 0.0
        self.cache = fake_api.PromptCache(clock=lambda: self.now)
        self.memory = fake_api.Memory()
        self.bound = {}         # thinking signature -> the messages before it, when it was made
        self.requests = []      # (usage in the fake's keys) per request
        self.invalid = []       # (request number, what was wrong)
        self.prunes = []        # ContextPruned payloads
        self.n_tools = 0

    def add(self, kind: str, **payload) -> None:
        self.seq += 1
        event = {"v": 1, "seq": self.seq, "id": f"e{self.seq}", "ts": int(self.now * 1000),
                 "session": "bench", "type": kind, **payload}
        events.apply(self.state, event)

    def turn(self, k: int) -> None:
        path = f"src/module_{k}.py"
        self.add("UserMessageCreated", text=f"Turn {k}: check {path} and run its test; tell me what it does.")
        self.respond([("read", {"file_path": path})], "Reading the module first.")
        content = source_file(self.rng, FILE_BYTES)
        self.result("read", content, {"path": path, "lines": content.count("\n") + 1})
        command = f"python -m pytest -q tests/test_module_{k}.py"
        self.respond([("bash", {"command": command})], "Now its test.")
        self.result("bash", source_file(self.rng, COMMAND_BYTES), {"exit_code": 0})
        answer = f"module_{k} parses the config and folds events; its test passes. " * 12
        self.respond([], answer)
        self.add("TaskCompleted", evidence={})
        self.now += TURN_GAP_S

    def respond(self, calls: list, text: str) -> None:
        """One request: plan (maybe prune), build, validate, account; then the response's events."""
        self.plan()
        request = self.ctx.build_request(self.state)
        self.check(request)
        usage, writes, _ = self.cache.account(request)
        self.cache.commit(writes)
        thought = f"thinking {len(self.requests)}: what next"
        blocks = [{"type": "thinking", "thinking": thought, "signature": fake_api.auto_signature(thought)},
                  {"type": "text", "text": text}]
        self.add("ModelThinkingBlockCompleted", thinking=thought, signature=blocks[0]["signature"])
        self.add("ModelTextBlockCompleted", text=text)
        for name, tool_input in calls:
            self.n_tools += 1
            tool_use_id = f"toolu_{self.n_tools:04d}"
            blocks.append({"type": "tool_use", "id": tool_use_id, "name": name, "input": tool_input})
            self.add("ToolRequested", tool_use_id=tool_use_id, name=name, input=tool_input)
        self.memory.remember(blocks)
        self.bound[blocks[0]["signature"]] = stable(request["messages"])
        self.requests.append(usage)
        self.now += REQUEST_S
        recorded = {"input_tokens": usage["input_tokens"], "output_tokens": len(json.dumps(blocks)) // 4,
                    "cache_read_tokens": usage["cache_read_input_tokens"],
                    "cache_write_tokens": usage["cache_creation_input_tokens"]}
        self.add("ModelResponseCompleted", message_id=f"msg_{len(self.requests)}", model=self.ctx.model,
                 stop_reason="tool_use" if calls else "end_turn", usage=recorded)

    def result(self, name: str, output: str, meta: dict) -> None:
        self.add("ToolStarted", tool_use_id=f"toolu_{self.n_tools:04d}", name=name)
        self.now += 2
        self.add("ToolCompleted", tool_use_id=f"toolu_{self.n_tools:04d}", name=name, output=output, meta=meta)

    def plan(self) -> None:
        step = self.ctx.plan(self.state, self.now)
        if step == "compact":
            raise SystemExit("the policy asked for a compaction: not expected in this script")
        if step == "prune":
            payload = self.ctx.prune(self.state, self.now)
            self.prunes.append(payload)
            self.add("ContextPruned", **payload)

    def check(self, request: dict) -> None:
        number = len(self.requests) + 1
        problem = fake_api.validate(json.loads(json.dumps(request)), memory=self.memory)
        binds = self.ctx.model.startswith(context.BINDING_MODELS)   # §3.3: the 5.5 generation
        if problem is None and binds:
            problem = self.binding_problem(request["messages"])
        if problem is not None:
            self.invalid.append((number, problem))

    def binding_problem(self, messages: list) -> str | None:
        """A thinking block of the current turn replayed over changed earlier messages."""
        turn_start = 0
        for i, message in enumerate(messages):
            if message["role"] == "user" and all(b["type"] == "text" for b in message["content"]):
                turn_start = i      # the user's question (results and the volatile tail come later)
        for i in range(turn_start, len(messages)):
            for block in messages[i]["content"]:
                seen = self.bound.get(block.get("signature"))
                if seen is not None and seen != stable(messages[:i]):
                    return f"messages.{i}: thinking bound to a different conversation"
        return None


def stable(messages: list) -> str:
    """Messages as the API compares them: cache_control marks a position, it is not content."""
    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k != "cache_control"}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value
    return json.dumps(strip(messages), separators=(",", ":"))


def run(turns: int, prune_at: int, idle_every: int, model_id: str = MODEL) -> Session:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ctx = context.Context(project_root=root, cwd=root, home=root / "home", model=model_id,
                              tool_schemas=tools.SCHEMAS, user_home=root / "user", prune_at=prune_at)
        session = Session(ctx, seed=turns)
        for k in range(1, turns + 1):
            if idle_every and k % idle_every == 0:
                session.now += IDLE_S
            session.turn(k)
    return session


def report(name: str, session: Session) -> dict:
    price = events.price_row(session.ctx.model)
    usages = session.requests
    fresh = sum(u["input_tokens"] for u in usages)
    read = sum(u["cache_read_input_tokens"] for u in usages)
    written = sum(u["cache_creation_input_tokens"] for u in usages)
    cost = (fresh * price[0] + written * price[2] + read * price[3]) / 1e6
    sizes = [u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"]
             for u in usages]
    reasons = [p["reason"] for p in session.prunes]
    print(f"  {name:<15} input ${cost:7.3f}  peak {max(sizes):>7,} tok  cache reads {read / sum(sizes):5.1%}"
          f"  ({read:,} read, {written:,} written, {fresh:,} uncached)  prunes {len(reasons)}"
          f" {dict((r, reasons.count(r)) for r in set(reasons))}  invalid {len(session.invalid)}")
    for number, problem in session.invalid[:3]:
        print(f"    request {number}: {problem}")
    return {"cost": cost, "peak": max(sizes), "invalid": len(session.invalid)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, nargs="+", default=[40, 100])
    parser.add_argument("--prune-at", type=int, default=context.PRUNE_AT_TOKENS)
    parser.add_argument("--model", default=MODEL, help="one without thinking binding prunes mid-turn too")
    parser.add_argument("--idle-every", type=int, default=0, help="a 6-minute break before every Nth turn")
    args = parser.parse_args()
    ok = True
    for turns in args.turns:
        print(f"{turns} turns, {3 * turns} requests, {args.model}, prune_at {args.prune_at:,}:")
        kept = report("keep-everything", run(turns, 0, args.idle_every, args.model))
        pruned = report("khaelor", run(turns, args.prune_at, args.idle_every, args.model))
        ratio = pruned["cost"] / kept["cost"]
        met = ratio <= 0.6 and pruned["peak"] <= 150_000 and not pruned["invalid"] and not kept["invalid"]
        ok = ok and met
        print(f"  khaelor / keep-everything: {ratio:.2f}x cost  ({'meets' if met else 'MISSES'}"
              " the target: <= 0.6x, peak <= 150K, no invalid request)")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
