"""A tmux pane's program in the tmux tests: `exec python pane.py STATE`, the pane's session leader.

It gives up the pane's terminal (TIOCNOTTY), so that a khaelor the fork server forks can take it
as a user's shell would give it one: that child makes a session of its own with the terminal as
its controlling terminal and itself in the foreground (it gets SIGWINCH, and keys reach it).
STATE/pane.json tells the test the terminal's path and the environment tmux gave the pane;
the test writes khaelor's exit code to STATE/exit, and the pane shows it as a shell's
`echo EXITED $?` does, then stays open as the old `…; sleep 60` did, until tmux closes the pane
(without a controlling terminal no SIGHUP comes: the hang-up is seen on the terminal itself).
Only the standard library: it starts in a few milliseconds, where the program imports the SDK.
"""
import fcntl
import json
import os
import select
import signal
import sys
import termios
import time

state = sys.argv[1]
# giving up the terminal sends SIGHUP to its foreground process group: this one
signal.signal(signal.SIGHUP, signal.SIG_IGN)
terminal = os.ttyname(0)
fcntl.ioctl(0, termios.TIOCNOTTY)
with open(f"{state}/pane.tmp", "w") as f:
    json.dump({"tty": terminal, "env": dict(os.environ)}, f)
os.rename(f"{state}/pane.tmp", f"{state}/pane.json")
hang_up = select.poll()
hang_up.register(0, 0)                  # POLLHUP and POLLERR only: typed keys stay for khaelor
deadline = None
while not hang_up.poll(20) and (deadline is None or time.monotonic() < deadline):
    if deadline is None and os.path.exists(f"{state}/exit"):
        with open(f"{state}/exit") as f:
            os.write(1, f"EXITED {f.read()}\n".encode())
        deadline = time.monotonic() + 60
