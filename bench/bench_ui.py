"""bench_ui.py: rendering cost of ui.py while a long reply streams at full speed.

Measures (budgets from ../shared/DESIGN.md §11):
  - frame time p50/p99 while a 20,000-word markdown reply streams (budget < 16 ms): one frame
    = the deltas that arrived since the last frame folded into the timeline + one App.render
  - CPU seconds per 1,000 streamed words (fold + frames)
  - traced memory after 1,000,000 streamed words, next to the figure after 100,000 (bounded:
    settled lines leave the process once written)
  - replaying a resumed session of 10,000 events into scrollback lines (render_transcript)
Frames go to /dev/null: this measures our work, not the terminal's.

Run: python bench/bench_ui.py [--words-for-memory 1000000]
"""

import argparse
import os
import random
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import ui  # noqa: E402

WORDS_PER_DELTA = 3          # an SDK text delta carries a few tokens
DELTAS_PER_FRAME = 8         # at full speed several deltas land inside one 16 ms window


class IdleController:
    busy = True
    command_names = ["/help"]

    def status(self):
        return {"model": "claude-sonnet-5-5", "tokens": 123456, "cost": 1.23, "context_pct": 41,
                "cache_share": 0.8, "processes": 1, "branch": "main"}

    def mention_candidates(self, prefix):
        return []


def reply_words(rng: random.Random):
    """An endless plausible markdown reply, word by word (paragraphs, lists, code, tables)."""
    vocabulary = ("the parser **settled** block `render` width cell stream *delta* frame terminal "
                  "scrollback [docs](https://example.com) 中文 emoji 🎉 function value").split()
    while True:
        kind = rng.random()
        if kind < 0.6:
            yield from (rng.choice(vocabulary) + " " for _ in range(rng.randint(30, 120)))
            yield "\n\n"
        elif kind < 0.75:
            for _ in range(rng.randint(2, 6)):
                yield "- "
                yield from (rng.choice(vocabulary) + " " for _ in range(rng.randint(5, 15)))
                yield "\n"
            yield "\n"
        elif kind < 0.9:
            yield "```python\n"
            for k in range(rng.randint(5, 30)):
                yield f"def f{k}(x):  "
                yield f"# {rng.choice(vocabulary)}\n    return \"s\" + x * {k}\n"
            yield "```\n\n"
        else:
            yield "| name | value | note |\n|---|---:|---|\n"
            for k in range(rng.randint(3, 8)):
                yield f"| row{k} | {k * 7} | {rng.choice(vocabulary)} |\n"
            yield "\n"


def deltas(n_words: int, seed: int = 1):
    words = reply_words(random.Random(seed))
    sent = 0
    while sent < n_words:
        chunk = []
        while len(chunk) < WORDS_PER_DELTA:
            word = next(words)
            chunk.append(word)
            sent += word.strip() != ""
        yield "".join(chunk), sent


def stream(n_words: int, out_fd: int, on_frame) -> None:
    app = ui.App(IdleController(), style=ui.Style(True), width=100, height=40)
    for k, (text, sent) in enumerate(deltas(n_words), 1):
        app.on_event({"type": "TextDelta", "text": text})
        if k % DELTAS_PER_FRAME == 0:
            os.write(out_fd, app.render(time.monotonic()))
            on_frame(sent)


def frame_budget(n_words: int, out_fd: int) -> None:
    # Frame time = the whole window's work: every delta's fold plus the render.
    app = ui.App(IdleController(), style=ui.Style(True), width=100, height=40)
    frames, window, pending = [], 0.0, 0
    cpu_start = time.process_time()
    for text, _ in deltas(n_words):
        start = time.perf_counter()
        app.on_event({"type": "TextDelta", "text": text})
        pending += 1
        if pending == DELTAS_PER_FRAME:
            os.write(out_fd, app.render(time.monotonic()))
            pending = 0
            frames.append(window + time.perf_counter() - start)
            window = 0.0
        else:
            window += time.perf_counter() - start
    cpu = time.process_time() - cpu_start
    frames.sort()
    p50 = statistics.median(frames) * 1000
    p99 = frames[int(len(frames) * 0.99)] * 1000
    print(f"frames: {len(frames)} for {n_words:,} words ({DELTAS_PER_FRAME} deltas per frame)")
    print(f"frame time p50 {p50:.2f} ms, p99 {p99:.2f} ms, max {frames[-1] * 1000:.2f} ms "
          f"(budget 16 ms: {'ok' if p99 < 16 else 'OVER'})")
    print(f"CPU per 1,000 words: {cpu / n_words * 1000 * 1000:.1f} ms")


def memory_bound(n_words: int, out_fd: int) -> None:
    tracemalloc.start()
    marks = {}

    def on_frame(sent):
        if sent >= n_words // 10 and not marks:
            marks[n_words // 10] = tracemalloc.get_traced_memory()[0]

    start = time.perf_counter()
    stream(n_words, out_fd, on_frame)
    elapsed = time.perf_counter() - start
    current, peak = tracemalloc.get_traced_memory()
    marks[n_words] = current
    tracemalloc.stop()
    for mark, size in sorted(marks.items()):
        print(f"traced memory after {mark:,} words: {size / 1024:.0f} KiB")
    print(f"peak traced memory: {peak / 1024:.0f} KiB ({elapsed:.1f} s with tracing on)")
    try:
        import resource
        print(f"max RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f} MiB")
    except ImportError:
        pass


def replay_cost(n_events: int = 10_000) -> None:
    rng = random.Random(2)
    words = reply_words(rng)
    log = []
    for k in range(n_events // 10):
        reply = "".join(next(words) for _ in range(120))
        log += [{"type": "UserMessageCreated", "text": f"request number {k}"},
                {"type": "ModelTextBlockCompleted", "text": reply},
                {"type": "ToolRequested", "tool_use_id": f"b{k}", "name": "bash",
                 "input": {"command": "pytest -q"}},
                {"type": "ToolStarted", "tool_use_id": f"b{k}", "name": "bash"},
                {"type": "ToolCompleted", "tool_use_id": f"b{k}", "name": "bash",
                 "output": "ok\n" * 30, "meta": {"exit_code": 0, "duration_ms": 1500}},
                {"type": "ToolRequested", "tool_use_id": f"e{k}", "name": "edit",
                 "input": {"file_path": "src/app.py"}},
                {"type": "FileModified", "tool_use_id": f"e{k}", "path": "src/app.py",
                 "added": 1, "removed": 1, "created": False,
                 "diff": "@@ -3,2 +3,2 @@\n-old = 1\n+new = 2\n context\n"},
                {"type": "ToolCompleted", "tool_use_id": f"e{k}", "name": "edit", "output": "ok",
                 "meta": {}},
                {"type": "ModelResponseCompleted", "usage": {}},
                {"type": "TaskCompleted", "evidence": {}}]
    for max_turns, label in ((None, "every turn"), (ui.REPLAY_TURNS, "as run_app does")):
        start = time.perf_counter()
        lines = ui.render_transcript(log, 100, color=True, max_turns=max_turns)
        elapsed = time.perf_counter() - start
        print(f"replay of {len(log):,} events, {label}: {elapsed * 1000:.0f} ms "
              f"({len(lines):,} lines)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--words", type=int, default=20_000)
    parser.add_argument("--words-for-memory", type=int, default=1_000_000)
    args = parser.parse_args()
    out_fd = os.open(os.devnull, os.O_WRONLY)
    frame_budget(args.words, out_fd)
    replay_cost()
    memory_bound(args.words_for_memory, out_fd)


if __name__ == "__main__":
    main()
