"""Session listing benchmark (issue 7). Run: python3 bench/bench_sessions.py [--sessions 200] [--events 500] [--runs 5]

Builds N realistic sessions (SessionCreated, a baseline, a user message, then model/tool rounds with
usage) in a temporary KHAELOR_HOME, then measures:
- listing with every .meta.json missing (each log read once, its cache written) — in-process;
- listing from fresh caches (only the caches read) — in-process, median of --runs;
- `khaelor sessions` as a subprocess from fresh caches, against `python -c pass` measured alongside.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import events  # noqa: E402
import khaelor  # noqa: E402


def make_session(directory: Path, index: int, n_events: int, project: Path) -> None:
    bus = events.Bus(events.SessionStore.create(directory, f"20250101-{index:06d}000-bench0"))
    usage = {"input_tokens": 100, "output_tokens": 50, "cache_read_tokens": 900, "cache_write_tokens": 0}
    bus.emit("SessionCreated", cwd=str(project), project_root=str(project), model="claude-sonnet-5-5",
             aux_model="claude-haiku-5-5", version="bench")
    bus.emit("BaselineRecorded", reason="session start", git=True, branch="main", head="0" * 40, dirty=[],
             n_dirty=0, diff_hash="sha256:0")
    bus.emit("UserMessageCreated", text=f"benchmark task {index}: make the widget faster")
    i = 0
    while len(bus.store.events) < n_events:
        i += 1
        tid = f"toolu_{i}"
        bus.emit("ModelTextBlockCompleted", text=f"step {i}: looking at the code " * 4)
        bus.emit("ToolRequested", tool_use_id=tid, name="read", input={"file_path": f"src/m{i}.py"})
        bus.emit("ModelResponseCompleted", message_id=f"m{i}", model="claude-sonnet-5-5", stop_reason="tool_use",
                 usage=usage)
        bus.emit("ToolCompleted", tool_use_id=tid, name="read", output="x = 1\n" * 200, meta={"lines": 200})
    bus.store.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--events", type=int, default=500)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home, project = Path(tmp) / "home", Path(tmp) / "project"
        project.mkdir()
        directory = events.sessions_dir(home, project)
        for index in range(args.sessions):
            make_session(directory, index, args.events, project)
        size_mb = sum(p.stat().st_size for p in directory.glob("*.jsonl")) / 1e6
        start = time.perf_counter()
        cold = khaelor.list_sessions(home, project)
        rebuild_ms = (time.perf_counter() - start) * 1000
        warm = []
        for _ in range(args.runs):
            start = time.perf_counter()
            listed = khaelor.list_sessions(home, project)
            warm.append((time.perf_counter() - start) * 1000)
        assert [m["title"] for m in listed] == [m["title"] for m in cold] and len(listed) == args.sessions
        env = {**os.environ, "KHAELOR_HOME": str(home), "PYTHONPATH": str(ROOT)}
        cli, bare = [], []
        for _ in range(args.runs):
            start = time.perf_counter()
            subprocess.run([sys.executable, str(ROOT / "khaelor.py"), "sessions"], cwd=project, env=env,
                           capture_output=True, check=True)
            cli.append((time.perf_counter() - start) * 1000)
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", "pass"], capture_output=True, check=True)
            bare.append((time.perf_counter() - start) * 1000)
    print(f"{args.sessions} sessions × {args.events} events ({size_mb:.0f} MB of logs)")
    print(f"  list, caches missing (rebuild):  {rebuild_ms:8.1f} ms")
    print(f"  list, caches fresh (in-process): {statistics.median(warm):8.1f} ms (median of {args.runs})")
    print(f"  `khaelor sessions` (subprocess): {statistics.median(cli):8.1f} ms "
          f"(python -c pass: {statistics.median(bare):.1f} ms)")


if __name__ == "__main__":
    main()
