"""Two commits side by side, in one run, on this machine (issue 21 item 8: a regression shows at once).

Run: python3 bench/compare.py [BASE [HEAD]] [--runs N]     (defaults: 75094d5 against the work tree)

Each commit is checked out with `git archive` into a temp dir and run from its own bytecode, as an
installed copy would be; the runs of the two alternate, and which goes first alternates too, so
that drift of the machine hits both. For
each: the median of
  - `khaelor --version`, wall time;
  - first paint: the interactive program in a pseudo-terminal until its composer's `❯` appears;
  - headless streaming: CPU time (user + system, from wait4) of `khaelor -p` while the scripted API
    streams a 20,000-word markdown reply, minus the same for a one-word reply (what start-up costs);
  - TUI streaming: the same reply streamed into the interactive program in a pseudo-terminal.
The scripted API is this tree's tests/fake_api.py for both commits.
"""
import argparse
import compileall
import os
import pty
import random
import select
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "bench")]

from bench_ui import reply_words  # noqa: E402
from fake_api import FakeAnthropic, reply, text  # noqa: E402

N_WORDS = 20_000
END = "ENDOFTHEREPLY"


def long_reply() -> str:
    words = reply_words(random.Random(1))
    return " ".join(next(words) for _ in range(N_WORDS)) + f"\n\n{END}\n"


def checkout(commit: str, into: Path) -> Path:
    """The commit's files (or this work tree's, for "WORKTREE"), compiled to bytecode."""
    if commit == "WORKTREE":
        source = ROOT
    else:
        into.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
        source = into
    compileall.compile_dir(str(source), maxlevels=0, quiet=1)
    return source


def environment(source: Path, home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(KHAELOR_HOME=str(home), HOME=str(home), ANTHROPIC_API_KEY="bench", TERM="xterm",
               PYTHONPATH=str(source), COLUMNS="100", LINES="40")
    return env


def cpu_of(proc: subprocess.Popen) -> float:
    _, _, usage = os.wait4(proc.pid, 0)
    proc.returncode = 0
    return usage.ru_utime + usage.ru_stime


def version_wall(env: dict, workdir: Path) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "khaelor", "--version"], cwd=workdir, env=env,
                   capture_output=True, check=True)
    return time.perf_counter() - start


class Terminal:
    """The interactive program on a pseudo-terminal; `wait_for` reads until a text appears."""

    def __init__(self, env: dict, workdir: Path):
        self.leader, follower = pty.openpty()
        os.set_blocking(self.leader, False)
        self.proc = subprocess.Popen([sys.executable, "-m", "khaelor"], cwd=workdir, env=env,
                                     stdin=follower, stdout=follower, stderr=follower,
                                     start_new_session=True)
        os.close(follower)
        self.seen = b""

    def wait_for(self, needle: str, timeout: float = 60) -> bool:
        deadline = time.perf_counter() + timeout
        while needle.encode() not in self.seen and time.perf_counter() < deadline:
            if select.select([self.leader], [], [], 0.2)[0]:
                try:
                    self.seen += os.read(self.leader, 1 << 16)
                except OSError:
                    return False
        return needle.encode() in self.seen

    def send(self, keys: str) -> None:
        os.write(self.leader, keys.encode())

    def quit(self) -> float:
        """Send /quit; the CPU time the program used in all (reaped here, so wait4 sees it)."""
        self.send("/quit\r")
        deadline = time.perf_counter() + 10
        while time.perf_counter() < deadline:
            pid, _, usage = os.wait4(self.proc.pid, os.WNOHANG)
            if pid:
                break
            self.wait_for("\0", 0.2)        # keep draining, so the program never blocks on output
        else:
            self.proc.kill()
            _, _, usage = os.wait4(self.proc.pid, 0)
        self.proc.returncode = 0
        os.close(self.leader)
        return usage.ru_utime + usage.ru_stime


def first_paint(env: dict, workdir: Path) -> float:
    start = time.perf_counter()
    term = Terminal(env, workdir)
    term.wait_for("❯", 10)
    elapsed = time.perf_counter() - start
    term.proc.kill()
    term.proc.wait()
    os.close(term.leader)
    return elapsed


def headless_cpu(env: dict, workdir: Path, body: str) -> float:
    with FakeAnthropic([reply(text(body), chunk=12)]) as fake:
        proc = subprocess.Popen([sys.executable, "-m", "khaelor", "-p", "write"], cwd=workdir,
                                env={**env, "ANTHROPIC_BASE_URL": fake.base_url},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return cpu_of(proc)


def tui_cpu(env: dict, workdir: Path, body: str) -> float:
    with FakeAnthropic([reply(text(body), chunk=12)]) as fake:
        term = Terminal({**env, "ANTHROPIC_BASE_URL": fake.base_url}, workdir)
        term.wait_for("❯", 10)
        term.send("write\r")
        if not term.wait_for(END, 120):
            print("  (the reply did not finish on screen)", file=sys.stderr)
        time.sleep(0.3)
        return term.quit()


def measure(source: Path, home: Path, workdir: Path, long: str) -> dict:
    env = environment(source, home)
    short = f"ok\n\n{END}\n"
    return {"--version (wall)": version_wall(env, workdir),
            "first paint (wall)": first_paint(env, workdir),
            "headless streaming (CPU)": headless_cpu(env, workdir, long)
            - headless_cpu(env, workdir, short),
            "TUI streaming (CPU)": tui_cpu(env, workdir, long) - tui_cpu(env, workdir, short)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("base", nargs="?", default="75094d5")
    parser.add_argument("head", nargs="?", default="WORKTREE")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp())
    sources = {name: checkout(name, tmp / f"src-{i}") for i, name in enumerate((args.base, args.head))}
    samples = {name: {} for name in sources}
    long = long_reply()
    for run in range(args.runs):
        # which goes first alternates too: the second of a pair ran measurably slower (an A/A run
        # of one commit against itself gave the second 1.03-1.09x)
        order = list(enumerate(sources.items()))
        for i, (name, source) in order[::-1] if run % 2 else order:
            workdir = tmp / f"project-{i}-{run}"
            workdir.mkdir()
            figures = measure(source, tmp / f"home-{i}-{run}", workdir, long)
            for key, value in figures.items():
                samples[name].setdefault(key, []).append(value)
    base, head = sources
    print(f"{'median over ' + str(args.runs) + ' runs':<28} {base:>12} {head:>12} {'head/base':>10}")
    for key in samples[base]:
        before = statistics.median(samples[base][key])
        after = statistics.median(samples[head][key])
        print(f"{key:<28} {before * 1000:>10.0f}ms {after * 1000:>10.0f}ms {after / before:>9.2f}x")


if __name__ == "__main__":
    main()
