"""Start-up and resume benchmarks (DESIGN §11). Run: python3 bench/bench_startup.py [--runs N]

- `python -c pass` as the baseline of the interpreter itself, measured in the same run;
- `khaelor --version`;
- `khaelor` (interactive) from launch until the composer is painted in a pseudo-terminal;
- `khaelor -p` from launch until the first request reaches the (fake) API;
- replay of a 10,000-event session (open + every projection), in-process.
Medians over N runs; budgets (DESIGN §11, issue 21): --version < 45 ms, first paint < 100 ms,
resume of 10K events < 500 ms (aim < 150 ms).
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
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import events  # noqa: E402
from fake_api import FakeAnthropic, reply, text  # noqa: E402


def time_command(argv, env, runs):
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, env=env, capture_output=True, check=True)
        samples.append(time.perf_counter() - start)
    return samples


def time_first_request(env, workdir, runs):
    samples = []
    for _ in range(runs):
        with FakeAnthropic([reply(text("ok"))]) as fake:
            start = time.perf_counter()
            proc = subprocess.Popen([sys.executable, "-m", "khaelor", "-p", "hi"], cwd=workdir,
                                    env={**env, "ANTHROPIC_BASE_URL": fake.base_url},
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            while not fake.requests:
                time.sleep(0.001)
            samples.append(time.perf_counter() - start)
            proc.wait()
    return samples


def time_first_paint(env, workdir, runs):
    """Launch the interactive UI in a pseudo-terminal; stop the clock at the composer's `❯`."""
    import pty
    import select
    samples = []
    for _ in range(runs):
        leader, follower = pty.openpty()
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "khaelor"], cwd=workdir, env={**env, "TERM": "xterm"},
                                stdin=follower, stdout=follower, stderr=follower, start_new_session=True)
        seen = b""
        while "❯".encode() not in seen and time.perf_counter() - start < 10:
            if select.select([leader], [], [], 0.5)[0]:
                seen += os.read(leader, 65536)
        samples.append(time.perf_counter() - start)
        proc.kill()
        proc.wait()
        os.close(leader)
        os.close(follower)
    return samples


def make_session(path: Path, n_events: int) -> None:
    bus = events.Bus(events.SessionStore.create(path.parent, path.stem))
    usage = {"input_tokens": 100, "output_tokens": 50, "cache_read_tokens": 900, "cache_write_tokens": 0}
    bus.emit("UserMessageCreated", text="start")
    i = 0
    while len(bus.store.events) < n_events:
        i += 1
        tid = f"toolu_{i}"
        bus.emit("ModelTextBlockCompleted", text=f"step {i}: looking at the code " * 4)
        bus.emit("ToolRequested", tool_use_id=tid, name="read", input={"file_path": f"src/m{i}.py"})
        bus.emit("ModelResponseCompleted", message_id=f"m{i}", model="claude-sonnet-5-5", stop_reason="tool_use", usage=usage)
        bus.emit("ToolStarted", tool_use_id=tid, name="read")
        bus.emit("ToolCompleted", tool_use_id=tid, name="read", output="line of code\n" * 20, meta={"lines": 20})
    bus.store.close()


def time_resume(path: Path, runs: int):
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        store = events.SessionStore.open(path)
        store.state.messages      # replayed by open: history, kernel state and usage in one fold
        store.close()
        samples.append(time.perf_counter() - start)
    return samples, len(store.events)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    runs = parser.parse_args().runs
    tmp = Path(tempfile.mkdtemp())
    (tmp / "project").mkdir()
    # An installed khaelor runs from bytecode (pip compiles it); this machine sets
    # PYTHONDONTWRITEBYTECODE, so compile once here and let the runs use the cache.
    import compileall
    compileall.compile_dir(str(ROOT), maxlevels=0, quiet=1)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env = {**env, "KHAELOR_HOME": str(tmp / "home"), "ANTHROPIC_API_KEY": "bench",
           "ANTHROPIC_CONFIG_DIR": str(tmp / "cfg"), "PYTHONPATH": str(ROOT)}
    rows = [("python -c pass (baseline)", time_command([sys.executable, "-c", "pass"], env, runs), None),
            # -m runs khaelor from its cached bytecode, as the installed console script does
            ("khaelor --version", time_command([sys.executable, "-m", "khaelor", "--version"], env, runs), 0.045),
            ("khaelor (interactive) → composer painted", time_first_paint(env, tmp / "project", runs), 0.100),
            ("khaelor -p → first request at the API", time_first_request(env, tmp / "project", max(3, runs // 3)), None)]
    session = tmp / "s" / "bench.jsonl"
    make_session(session, 10_000)
    samples, n = time_resume(session, runs)
    rows.append((f"resume (replay + projections) of {n} events", samples, 0.500))
    baseline = statistics.median(rows[0][1])
    print(f"{'measurement':<48} {'median':>9} {'× baseline':>11} {'budget':>8}")
    for name, values, budget in rows:
        median = statistics.median(values)
        print(f"{name:<48} {median * 1000:>7.1f}ms {median / baseline:>10.2f}x "
              f"{'' if budget is None else f'{budget * 1000:.0f}ms':>8}")


if __name__ == "__main__":
    main()
