"""bench_sandbox.py: what the Landlock sandbox adds to starting a command (issue 12: budget < 5 ms).

    python bench/bench_sandbox.py [runs] [--with-sdk]     # default 200 runs of each

Starts `bash -c true` through Workspace.exec, sandboxed (an approved command's confine and a read-only
one's) and unsandboxed (the Workspace told the kernel has no Landlock), interleaved so that drift on a
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import sandbox  # noqa: E402
import tools  # noqa: E402


async def start_and_wait(workspace: tools.Workspace, confine: dict) -> float:
    started = time.perf_counter()
    child = await workspace.exec("true", confine=confine)
    await child.proc.wait()
    elapsed = time.perf_counter() - started
    child.close_pipes()
    return elapsed


async def measure(project: Path, runs: int) -> dict[str, list[float]]:
    sandboxed, unsandboxed = tools.Workspace(project), tools.Workspace(project)
    unsandboxed.abi = 0
    cases = {"unsandboxed": (unsandboxed, tools.DEFAULT_CONFINE),
             "sandboxed (approved)": (sandboxed, tools.DEFAULT_CONFINE),
             "sandboxed (read-only)": (sandboxed, tools.READ_ONLY_CONFINE)}
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


if __name__ == "__main__":
    main()
