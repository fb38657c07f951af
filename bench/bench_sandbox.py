"""bench_sandbox.py: what the sandbox (Landlock, seccomp, capabilities, rlimits, the connect
supervisor) adds to starting a command (budget < 5 ms), and what leaving the project's secret files
out costs on a 50,000-file tree (budget 50 ms per session, cached).

    python bench/bench_sandbox.py [runs] [--with-sdk]     # default 200 runs of each

Starts `bash -c true` through Workspace.exec, sandboxed (an approved command's confine and a read-only
one's) and unsandboxed (the confine of the user's own `!` commands), interleaved so that drift on a
shared machine hits all alike, and prints the medians and the differences. Building the ruleset alone
is timed too: it is the part that grows with the directories along the way to the closed locations.
The sandbox needs a preexec_fn, so CPython forks instead of using vfork: that costs more the larger the
process, hence --with-sdk, which first imports anthropic as a session's khaelor has (about 75 MB).
"""

import asyncio
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import sandbox  # noqa: E402
import tools  # noqa: E402


async def start_and_wait(workspace: tools.Workspace, confine: sandbox.Confine) -> float:
    started = time.perf_counter()
    child = await workspace.exec("true", confine=confine)
    await child.proc.wait()
    elapsed = time.perf_counter() - started
    child.close_pipes()
    return elapsed


async def measure(project: Path, runs: int) -> dict[str, list[float]]:
    sandboxed = unsandboxed = tools.Workspace(project)
    read_only = replace(tools.READ_ONLY_CONFINE, hide=(".env", ".env.*", "*.pem", "id_*"))
    cases = {"unsandboxed": (unsandboxed, sandbox.Confine(unconfined=True)),
             "sandboxed (approved)": (sandboxed, tools.DEFAULT_CONFINE),
             "sandboxed (read-only)": (sandboxed, read_only)}
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for name, (workspace, confine) in cases.items():    # warm-up: imports, the session temp dir, page cache
        await start_and_wait(workspace, confine)
    for _ in range(runs):
        for name, (workspace, confine) in cases.items():
            samples[name].append(await start_and_wait(workspace, confine))
    builds = []
    for _ in range(runs):
        started = time.perf_counter()
        fd = sandbox.build_ruleset(tools.DEFAULT_CONFINE, project, sandboxed.temp_dir, Path.home(),
                                   Path(os.environ.get("KHAELOR_HOME") or Path.home() / ".khaelor"), set())
        builds.append(time.perf_counter() - started)
        os.close(fd)
    samples["ruleset build alone"] = builds
    return samples


def secret_scan(files: int = 50_000) -> tuple[float, float]:
    """(first scan, cached scan) in ms on a tree of `files` files in 500 folders, 20 of them secret."""
    with tempfile.TemporaryDirectory() as root:
        for folder in range(500):
            path = Path(root, f"pkg{folder // 50}", f"mod{folder}")
            path.mkdir(parents=True)
            for index in range(files // 500):
                (path / f"f{index}.py").touch()
            if folder % 25 == 0:
                (path / ".env").touch()
        scan = sandbox.SecretScan()
        patterns = [".env", ".env.*", "*.pem", "id_*"]
        started = time.perf_counter()
        found = scan.find(root, patterns)
        first = time.perf_counter() - started
        cached = []
        for _ in range(20):
            started = time.perf_counter()
            scan.find(root, patterns)
            cached.append(time.perf_counter() - started)
        assert len(found) == 20, found
        return first * 1000, statistics.median(cached) * 1000


def main() -> None:
    numbers = [arg for arg in sys.argv[1:] if arg.isdigit()]
    runs = int(numbers[0]) if numbers else 200
    if "--with-sdk" in sys.argv:
        import anthropic  # noqa: F401  (only to give the process the size it has in a session)
    print(f"sandbox: {sandbox.status()}; {runs} runs of `bash -c true` each, through Workspace.exec"
          f"{' (anthropic imported)' if '--with-sdk' in sys.argv else ''}")
    if not sandbox.probe()[0]:
        print("nothing to measure: without Landlock every command runs unsandboxed")
        return
    with tempfile.TemporaryDirectory() as project:
        samples = asyncio.run(measure(Path(project), runs))
    medians = {name: statistics.median(values) * 1000 for name, values in samples.items()}
    for name, value in medians.items():
        print(f"  {name:<24} median {value:6.2f} ms")
    for name in ("sandboxed (approved)", "sandboxed (read-only)"):
        added = medians[name] - medians["unsandboxed"]
        verdict = "within" if added < 5 else "OVER"
        print(f"  {name} adds {added:+.2f} ms ({verdict} the 5 ms budget)")
    first, cached = secret_scan()
    verdict = "within" if cached < 50 else "OVER"
    print(f"  the project's secret files, 50,000 files: first scan {first:.1f} ms, "
          f"then {cached:.1f} ms a command ({verdict} the 50 ms budget)")


if __name__ == "__main__":
    main()
