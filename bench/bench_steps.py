"""Per-step cost over a long session (issue 13). Run:
python3 bench/bench_steps.py [--steps 1000] [--tool bash]

One turn of N tool steps through the real kernel, context and toolbox (the `read` tool on a
small file in a temporary project, or with --tool bash a command that runs without asking, in
its sandbox, with the SDK imported as in khaelor by then), against a scripted in-process model that streams one text
block and one tool call per response. It measures:
- khaelor's own CPU per step (time.process_time between two model calls), early (steps 11-60)
  and late (the last 50), with the cost of what the SDK would do to the request (deep-copying
  the messages and JSON-encoding the body) measured separately, on every SDK_EVERY-th step,
  and left out (done on every step, its 20 MB of copying late in a session slows whatever
  runs after it through the CPU caches, and that would be counted as khaelor's);
- the longest time the event loop was blocked by khaelor (a 1 ms ticker's worst lateness, less
  the SDK-equivalent work done meanwhile).
Budget: late ≤ 1.5 × early; no block over 16 ms.
"""
import argparse
import asyncio
import copy
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import context  # noqa: E402
import events  # noqa: E402
import kernel  # noqa: E402
import model as client  # noqa: E402
import permissions  # noqa: E402
import tools  # noqa: E402

SDK_EVERY = 10         # steps between two measurements of the SDK-equivalent work
USAGE = {"input_tokens": 50, "cache_read_tokens": 9_000, "cache_creation_input_tokens": 0,
         "output_tokens": 40}


class ScriptedModel:
    """Streams `n_steps` responses of one text block and one read call, then a final answer."""

    def __init__(self, n_steps: int, tool: str):
        self.n_steps = n_steps
        self.tool = tool
        self.step_cpu = []      # (process_time when a model call starts, after its SDK work)
        self.sdk_cpu = []       # CPU of copying + encoding a request as the SDK would, sampled
        self.sdk_wall = 0.0     # wall time of that work, summed (the ticker leaves it out)

    async def stream(self, request: dict):
        await asyncio.sleep(0.001)     # the network: the loop runs other tasks meanwhile
        now = time.process_time()
        n = len(self.step_cpu) + 1
        if n % SDK_EVERY == 0:
            wall = time.perf_counter()
            copy.deepcopy(request["messages"])
            json.dumps(request)
            self.sdk_wall += time.perf_counter() - wall
            self.sdk_cpu.append(time.process_time() - now)
        self.step_cpu.append((now, time.process_time()))
        yield {"type": "message_start", "message": {"id": f"m{n}", "model": request["model"],
                                                    "usage": USAGE}}
        yield {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
        text = f"Step {n}: reading the module to see how the parser handles it."
        yield {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}
        yield {"type": "content_block_stop", "index": 0}
        stop = "end_turn"
        if n <= self.n_steps:
            stop = "tool_use"
            block = {"type": "tool_use", "id": f"toolu_{n}", "name": self.tool, "input": {}}
            yield {"type": "content_block_start", "index": 1, "content_block": block}
            partial = json.dumps({"file_path": "src/module.py", "offset": 1 + n % 5})
            if self.tool == "bash":
                partial = json.dumps({"command": f"grep -c function_{n % 20} src/module.py"})
            delta = {"type": "input_json_delta", "partial_json": partial}
            yield {"type": "content_block_delta", "index": 1, "delta": delta}
            yield {"type": "content_block_stop", "index": 1}
        yield {"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": 40}}
        yield {"type": "message_stop"}

    async def complete(self, request):
        return {"text": "{}"}

    async def close(self):
        pass


async def ticker(worst: list, model: ScriptedModel) -> None:
    """Records how late a 1 ms sleep wakes up: the longest stretch the loop was blocked."""
    while True:
        before = time.perf_counter()
        excused = model.sdk_wall
        await asyncio.sleep(0.001)
        late = time.perf_counter() - before - 0.001 - (model.sdk_wall - excused)
        worst[0] = max(worst[0], late)


async def run(n_steps: int, tool: str, project: Path, home: Path) -> tuple[ScriptedModel, float]:
    (project / "src").mkdir(parents=True)
    lines = [f"def function_{i}(value):\n    return value * {i}  # some code\n" for i in range(20)]
    (project / "src" / "module.py").write_text("".join(lines))
    store = events.SessionStore.create(home / "sessions")
    bus = events.Bus(store)
    toolbox = tools.Toolbox(tools.Workspace(project), home, bus.emit, lambda: store.state)
    ctx = context.Context(project_root=project, cwd=project, home=home, model="claude-sonnet-5-5",
                          tool_schemas=toolbox.schemas, workspace=toolbox.workspace)
    model = ScriptedModel(n_steps, tool)

    async def ask(request):
        return "once", ""

    agent = kernel.Kernel(bus=bus, model=model, toolbox=toolbox, ctx=ctx,
                          rules=permissions.load_rules([]), project_root=project, ask=ask)
    bus.emit("SessionCreated", cwd=str(project), project_root=str(project),
             model=ctx.model, aux_model=ctx.aux_model, version="bench")
    agent.submit("Read the module again and again.")
    worst = [0.0]
    watch = asyncio.create_task(ticker(worst, model))
    await asyncio.sleep(0.01)
    worst[0] = 0.0
    try:
        await agent.run()
    finally:
        watch.cancel()
        await toolbox.close()
        store.close()
    return model, worst[0]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--tool", choices=["read", "bash"], default="read")
    args = parser.parse_args()
    # as khaelor imports it: its 60 MB are in the process each command forks, and in the heap
    client._sdk()
    with tempfile.TemporaryDirectory() as tmp:
        model, worst = asyncio.run(run(args.steps, args.tool, Path(tmp) / "project",
                                       Path(tmp) / "home"))
    starts, sdk = model.step_cpu, model.sdk_cpu
    # A step: from the end of one model call's SDK-equivalent work to the start of the next call.
    per_step = [b[0] - a[1] for a, b in zip(starts, starts[1:])]
    early, late = per_step[10:60], per_step[-50:]
    early_ms, late_ms = statistics.mean(early) * 1e3, statistics.mean(late) * 1e3
    print(f"steps: {len(per_step)}")
    print(f"khaelor CPU per step: early {early_ms:.2f} ms, late {late_ms:.2f} ms "
          f"(late/early {late_ms / early_ms:.2f}; budget 1.50)")
    sdk_early, sdk_late = statistics.mean(sdk[1:6]) * 1e3, statistics.mean(sdk[-5:]) * 1e3
    print(f"SDK-equivalent request copy + JSON encode: early {sdk_early:.2f} ms, "
          f"late {sdk_late:.2f} ms (not in the numbers above)")
    print(f"whole run CPU (khaelor only): {sum(per_step):.2f} s")
    print(f"longest event-loop block: {worst * 1e3:.1f} ms (budget 16)")


if __name__ == "__main__":
    main()
