"""bench_checkpoint.py: a work-tree checkpoint (tools.Checkpoints.take) against DESIGN.md §11.

    python bench/bench_checkpoint.py        # prints medians

Measures a checkpoint of a git repository with 10,000 tracked files of which 50 are changed (budget
< 100 ms, median), the same with nothing changed, and what the shadow repository grew by.
"""

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import tools  # noqa: E402

N_FILES = 10_000
N_CHANGED = 50
RUNS = 15


def make_repository(root: Path) -> None:
    """10,000 small files in 100 folders, committed and packed."""
    for n in range(N_FILES):
        path = root / f"pkg{n % 100}" / f"module_{n}.py"
        path.parent.mkdir(exist_ok=True)
        path.write_text(f"VALUE = {n}\n" * 20)
    git = ["git", "-C", str(root)]
    subprocess.run(git + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    identity = ["-c", "user.name=b", "-c", "user.email=b@b", "-c", "gc.auto=0"]
    subprocess.run(git + identity + ["commit", "-qm", "x"], check=True)
    # packed, as a repository with history is (and no gc left running in the background)
    subprocess.run(git + ["gc", "-q"], check=True)
    # as a user's index is: fresh from their last `git status`, a while after the files were
    # written (an entry written in the index's own second is "racily clean": git reads its file)
    time.sleep(1.1)
    subprocess.run(git + ["status", "-s"], check=True, capture_output=True)


def change(root: Path, run: int) -> None:
    for n in range(N_CHANGED):
        path = root / f"pkg{n % 100}" / f"module_{n * 7}.py"
        path.write_text(f"CHANGED = {run}\n")


def cpu_s() -> float:
    """CPU seconds of this process and its waited-for children: wall time on a loaded machine
    measures the other processes too."""
    now = os.times()
    return now.user + now.system + now.children_user + now.children_system


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    # Under the user's home, as ~/.khaelor and a project are: the sandbox's ruleset opens the
    # folders around $KHAELOR_HOME one by one, so a crowded /tmp would be measured instead.
    with tempfile.TemporaryDirectory(dir=Path.home()) as tmp:
        root = Path(tmp) / "project"
        home = Path(tmp) / "home"
        root.mkdir()
        make_repository(root)
        box = tools.Toolbox(tools.Workspace(root), home, lambda *a, **k: {}, tools.events.State)
        previous = box.checkpoints.take()["tree"]
        changed, unchanged = [], []
        cpu_changed = []
        for run in range(RUNS):
            change(root, run)
            start = time.perf_counter()
            cpu = cpu_s()
            previous = box.checkpoints.take(previous)["tree"]
            changed.append(time.perf_counter() - start)
            cpu_changed.append(cpu_s() - cpu)
            start = time.perf_counter()
            box.checkpoints.take(previous)
            unchanged.append(time.perf_counter() - start)
        shadow = du(home / "checkpoints")
        versions = du(home / "versions")
        shutil.rmtree(home, ignore_errors=True)
    print(f"checkpoint, {N_FILES} tracked files, {N_CHANGED} changed: "
          f"{statistics.median(changed) * 1000:.1f} ms median (budget < 100 ms)")
    print(f"  CPU (khaelor and its git processes): {statistics.median(cpu_changed) * 1000:.1f} ms"
          f" median; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"checkpoint, nothing changed: {statistics.median(unchanged) * 1000:.1f} ms median")
    print(f"after {RUNS * 2 + 1} checkpoints: shadow repository {shadow / 1e6:.2f} MB, "
          f"index copies {versions / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
