"""Tests for permissions.py: the evaluator, bash parsing, the floor, suggestions, config."""

import ast
import gc
import json
import os
import re
import shlex
import time
from pathlib import Path

import pytest

import permissions
import sandbox
import tools
from permissions import (Rule, add_grant, check, decide, default_rules, load_rules,
                         validate_config_rules)

DEFAULTS = default_rules()
GLOBS = json.loads((Path(__file__).parent / "data" / "globs.json").read_text())["cases"]


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project directory with a sibling outside it, and HOME pointing at a temp dir."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    root = tmp_path / "proj"
    (root / "src").mkdir(parents=True)
    (root / "src" / "app.py").write_text("print(1)\n")
    (root / ".env").write_text("KEY=1\n")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text("x\n")
    return root


def bash(command, root, rules=DEFAULTS):
    return check("bash", command, root, rules)


def timed(call):
    """call()'s result and CPU time, with collections held off as decide() holds them: in a full
    run a collection of the worker's heap, due as soon as decide() lets it, took 0.28 s in CI and
    is not the judgement's cost."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        started = time.thread_time()
        result = call()
        return result, time.thread_time() - started
    finally:
        if collecting:
            gc.enable()


# ---------------------------------------------------------------- evaluator table

@pytest.mark.parametrize("tool, tool_input, action, capability", [
    ("read", {"file_path": "src/app.py"}, "allow", "file.read"),
    ("read", {"file_path": "./src/../src/app.py"}, "allow", "file.read"),
    ("read", {"file_path": ".env"}, "ask", "file.read"),
    ("read", {"file_path": "src/.env.production"}, "ask", "file.read"),
    ("read", {"file_path": ".env.example"}, "allow", "file.read"),
    ("read", {"file_path": "deploy/server.pem"}, "ask", "file.read"),
    ("read", {"file_path": "keys/id_rsa"}, "ask", "file.read"),
    ("write", {"file_path": "src/new.py", "content": "x"}, "ask", "file.write.project"),
    ("edit", {"file_path": "src/app.py", "old_string": "1", "new_string": "2"}, "ask", "file.write.project"),
    ("grep", {"pattern": "TODO"}, "allow", "file.read"),
    ("grep", {"pattern": "TODO", "path": "src"}, "allow", "file.read"),
    ("glob", {"pattern": "**/*.py"}, "allow", "file.read"),
    ("glob", {"pattern": "../outside/*"}, "ask", "filesystem.outsideProject"),
    ("grep", {"pattern": "x", "path": "/etc"}, "ask", "filesystem.outsideProject"),
    ("bash", {"command": "ls -la"}, "allow", "process.execute"),
    ("bash", {"command": "git status"}, "allow", "process.execute"),
    ("bash", {"command": "git diff HEAD~1..HEAD"}, "allow", "process.execute"),
    ("bash", {"command": "git log --oneline | head -20"}, "allow", "process.execute"),
    ("bash", {"command": "git branch -a"}, "allow", "process.execute"),
    ("bash", {"command": "git branch feature"}, "ask", "git.modify"),
    ("bash", {"command": "git stash list"}, "allow", "process.execute"),
    ("bash", {"command": "git branch -v feature"}, "ask", "git.modify"),
    ("bash", {"command": "git branch -v -D feature"}, "ask", "git.modify"),
    ("bash", {"command": "git tag"}, "allow", "process.execute"),
    ("bash", {"command": "git tag v1.0"}, "ask", "git.modify"),
    ("bash", {"command": "git config --get user.name"}, "allow", "process.execute"),
    ("bash", {"command": "git config user.name Bob"}, "ask", "git.modify"),
    ("bash", {"command": "git remote -v"}, "allow", "process.execute"),
    ("bash", {"command": "git worktree list --porcelain"}, "allow", "process.execute"),
    ("bash", {"command": "git config --get --global user.name"}, "allow", "process.execute"),
    ("bash", {"command": "git remote get-url --push origin"}, "allow", "process.execute"),
    ("bash", {"command": "git config --global user.name x"}, "ask", "git.modify"),
    ("bash", {"command": "git worktree list --expire=now"}, "ask", "git.modify"),
    ("bash", {"command": "git remote add up url"}, "ask", "git.modify"),
    ("bash", {"command": "git -c core.pager=sh log"}, "ask", "process.execute"),
    ("bash", {"command": "/usr/bin/git push"}, "ask", "network.access"),
    ("bash", {"command": "sudo git reset --hard"}, "ask", "git.modify"),
    ("bash", {"command": "git stash"}, "ask", "git.modify"),
    ("bash", {"command": "git -C . commit -m x"}, "ask", "git.modify"),
    ("bash", {"command": "git push origin main"}, "ask", "network.access"),
    ("bash", {"command": "git fetch"}, "ask", "network.access"),
    ("bash", {"command": "git diff --output=patch.txt"}, "ask", "process.execute"),
    ("bash", {"command": "find . -name '*.py'"}, "allow", "process.execute"),
    ("bash", {"command": "find . -name '*.pyc' -delete"}, "ask", "process.execute"),
    ("bash", {"command": "find . -exec cat {} ;"}, "ask", "process.execute"),
    ("bash", {"command": "rg --pre ./evil TODO"}, "ask", "process.execute"),
    ("bash", {"command": "grep -rn TODO src"}, "allow", "process.execute"),
    ("bash", {"command": "cat .env"}, "ask", "file.read"),
    ("bash", {"command": "cat src/app.py"}, "allow", "process.execute"),
    ("bash", {"command": "echo hi > notes.txt"}, "ask", "file.write.project"),
    ("bash", {"command": "ls 2>/dev/null"}, "allow", "process.execute"),
    ("bash", {"command": "pytest -q"}, "ask", "process.execute"),
    ("bash", {"command": "curl https://example.com"}, "ask", "network.access"),
    ("bash", {"command": "pip install requests"}, "ask", "network.access"),
    ("bash", {"command": "python -m pip install -e ."}, "ask", "network.access"),
    ("bash", {"command": "npm install"}, "ask", "network.access"),
    ("bash", {"command": "sudo ls"}, "ask", "process.execute"),
    ("bash", {"command": "ls", "workdir": "/"}, "ask", "filesystem.outsideProject"),
    ("process", {"action": "start", "command": "npm run dev"}, "ask", "process.execute"),
    ("process", {"action": "list"}, "allow", "process.execute"),
    ("process", {"action": "start", "command": "ls"}, "allow", "process.execute"),
])
def test_default_policy_table(project, tool, tool_input, action, capability):
    decision = decide(*tools.permission_subject(tool, tool_input), project, DEFAULTS)
    assert (decision.action, decision.capability) == (action, capability), decision


def test_unknown_tool_is_denied(project):
    assert decide("teleport", {}, project, DEFAULTS).action == "deny"
    decision = decide(*tools.permission_subject("teleport", {"command": "ls"}), project, DEFAULTS)
    assert decision.action == "deny" and decision.reason == "unknown tool 'teleport'"


@pytest.mark.parametrize("tool, tool_input, action", [
    ("read", {"file_path": "src/app.py"}, "allow"),
    ("grep", {"pattern": "x"}, "allow"),
    ("glob", {"pattern": "*"}, "allow"),
    ("bash", {"command": "ls"}, "allow"),
    ("bash", {"command": "pytest"}, "deny"),
    ("write", {"file_path": "src/a.py", "content": ""}, "deny"),
    ("edit", {"file_path": "src/app.py", "old_string": "1", "new_string": "2"}, "deny"),
    ("process", {"action": "start", "command": "ls"}, "allow"),
    ("process", {"action": "start", "command": "npm run dev"}, "deny"),
    ("process", {"action": "list"}, "allow"),
    ("process", {"action": "read", "id": "p1"}, "allow"),
    ("process", {"action": "stop", "id": "p1"}, "deny"),
    ("process", {"action": "write", "id": "p1", "input": "ls\n"}, "deny"),
])
def test_plan_mode_runs_only_what_reads_judged_by_each_tools_subject(project, tool, tool_input,
                                                                     action):
    subject = tools.permission_subject(tool, tool_input)
    decision = decide(*subject, project, DEFAULTS, process_command="bash", mode="plan")
    assert decision.action == action, decision


def test_accept_edits_never_writes_into_git_in_any_case(project):
    """.git/config and hooks run code later; on a case-insensitive file system (macOS, Windows)
    .GIT/hooks/pre-commit is that same file, and acceptEdits wrote it without asking. A nested
    repository's are as much code (the user's git runs them there, or a submodule's from the top),
    and so is a .git file, which sends git to a repository of the writer's choosing; and so are the
    folders the guard holds (sandbox.GUARDED_DIRS), which acceptEdits wrote unasked."""
    for path in (".git/hooks/pre-commit", ".GIT/hooks/pre-commit", ".Git/config",
                 "vendor/lib/.git/config", "vendor/lib/.GIT/hooks/pre-commit", "vendor/lib/.git",
                 ".vscode/tasks.json", ".claude/commands/x.md", ".khaelor/notes"):
        decision = decide("write", {"file_path": path}, project, DEFAULTS, mode="acceptEdits")
        assert decision.action == "ask", path
    assert decide("write", {"file_path": "src/new.py"}, project, DEFAULTS,
                  mode="acceptEdits").action == "allow"


def test_last_matching_rule_wins(project):
    rules = [*DEFAULTS, Rule("process.execute", "npm *", "allow", "u"),
             Rule("process.execute", "npm run release *", "deny", "u")]
    assert bash("npm test", project, rules)["decision"] == "allow"
    assert bash("npm run release", project, rules)["decision"] == "deny"
    rules.append(Rule("process.execute", "npm *", "ask", "p"))
    assert bash("npm test", project, rules)["decision"] == "ask"


def test_unmatched_request_asks(project):
    assert check("read", "src/app.py", project, [])["decision"] == "ask"
    assert bash("ls", project, [])["rule"] is None


def test_capability_wildcard_in_rule(project):
    rules = [*DEFAULTS, Rule("*", "*", "allow", "yolo")]
    assert check("write", "src/x.py", project, rules)["decision"] == "allow"
    assert bash("git push", project, rules)["decision"] == "allow"


def test_trailing_star_matches_bare_command(project):
    rules = [*DEFAULTS, Rule("process.execute", "make test *", "allow", "u")]
    assert bash("make test", project, rules)["decision"] == "allow"
    assert bash("make test -j4", project, rules)["decision"] == "allow"
    assert bash("make testing", project, rules)["decision"] == "ask"


def test_rules_match_words_after_quote_removal(project):
    rules = [*DEFAULTS, Rule("process.execute", "rm *", "deny", "u")]
    assert bash('"r"m -f x', project, rules)["decision"] == "deny"


def test_outside_pattern_expands_tilde(project):
    notes = Path(os.environ["HOME"]) / "notes"
    notes.mkdir()
    rules = [*DEFAULTS, Rule("filesystem.outsideProject", "~/notes/*", "allow", "u")]
    assert check("read", str(notes / "a.md"), project, rules)["decision"] == "allow"


# ---------------------------------------------------------------- compound commands

@pytest.mark.parametrize("command, action", [
    ("ls && rm x", "ask"),
    ("ls || rm x", "ask"),
    ("ls; rm x", "ask"),
    ("ls | xargs rm", "ask"),
    ("ls\nrm x", "ask"),
    ("echo $(rm x)", "ask"),
    ("echo `rm x`", "ask"),
    ('echo "$(rm x)"', "ask"),
    ("(cd src && rm x)", "ask"),
    ("{ ls; rm x; }", "ask"),
    ("cat <(rm x)", "ask"),
    ("bash -c 'rm x'", "ask"),
    ("ls & rm x", "ask"),
    ("ls && pwd | wc -l; echo done", "allow"),
    ("if [ -f x ]; then cat x; fi", "allow"),
    ("cat <<'EOF'\nrm -rf / ; don't\nEOF", "allow"),
    # writes found by fuzzing the judge against bash (the allowed lines were run; a file appeared):
    # `> 2`, `&> -` write files named 2 and - (only >&2 and >&- copy or close); after a
    # redirection `for` is no keyword, so `> README.md for x` truncates README.md
    ("cat README.md > 1", "ask"), ("ls >> 2", "ask"), ("ls &> -", "ask"), ("echo hi > -", "ask"),
    ("ls >&2", "allow"), ("ls 2>&1 >&-", "allow"), ("> README.md for x", "ask"),
    ("> x case a in", "ask"), ("> x function f", "ask"),
    # $'\x' with no digit is a backslash and an x, not a crash
    ("echo $'\\x' $'\\u'", "allow"),
])
def test_every_part_is_judged_and_strictest_wins(project, command, action):
    assert bash(command, project)["decision"] == action


def test_deny_beats_ask_in_a_compound(project):
    rules = [*DEFAULTS, Rule("process.execute", "deploy *", "deny", "u")]
    result = bash("npm test && deploy now", project, rules)
    assert (result["decision"], result["rule"]) == ("deny", 'deny process.execute "deploy *" (u)')


def test_cd_moves_later_parts(project):
    assert bash("cd src && cat ../.env", project)["decision"] == "ask"     # .env, or ../.env if cd failed
    assert bash("cd /tmp && rm -rf build", project)["capability"] == "filesystem.outsideProject"


def test_unparsable_line_asks_even_when_a_rule_allows(project):
    result = bash("echo 'unterminated", project)
    assert (result["decision"], result["suggestion"]) == ("ask", None)


# ---------------------------------------------------------------- suggestions

@pytest.mark.parametrize("command, pattern", [
    ("git push origin main", "git push *"),
    ("git commit -m 'fix: the bug'", "git commit *"),
    ("git checkout -b feature", "git checkout *"),
    ("git stash pop", "git stash pop *"),
    ("git remote add origin git@x:y.git", "git remote add *"),
    ("npm run build", "npm run build *"),
    ("npm test", "npm test *"),
    ("npm install lodash", "npm install *"),
    ("npx prettier --write .", "npx prettier *"),
    ("yarn test --watch", "yarn test *"),
    ("pnpm run lint", "pnpm run lint *"),
    ("bun run dev", "bun run dev *"),
    ("docker compose up -d", "docker compose up *"),
    ("docker run -it ubuntu bash", "docker run *"),
    ("docker-compose up -d", "docker-compose up *"),
    ("kubectl apply -f deploy.yaml", "kubectl apply *"),
    ("python -m pytest -q", "python -m pytest *"),
    ("python3 -m http.server 8000", "python3 -m http.server *"),
    ("python scripts/gen.py --out x", "python scripts/gen.py *"),
    ("python manage.py migrate", "python manage.py migrate *"),
    ("pytest -q tests/", "pytest *"),
    ("cargo test", "cargo test *"),
    ("cargo build --release", "cargo build *"),
    ("go test ./...", "go test *"),
    ("go mod tidy", "go mod tidy *"),
    ("make test", "make test *"),
    ("ruff check .", "ruff check *"),
    ("mypy src", "mypy src *"),   # an unknown CLI: its plain words, never broader
    # a program whose operands are files or process lists: its name (OpenCode's arity 1)
    ("touch a2", "touch *"), ("mkdir build", "mkdir *"), ("ps aux", "ps *"),
    ("uv run pytest", "uv run pytest *"),
    ("poetry run pytest -x", "poetry run pytest *"),
    ("pip install -r requirements.txt", "pip install *"),
    ("bundle exec rspec", "bundle exec rspec *"),
    ("gh pr create --fill", "gh pr create *"),
    ("terraform plan", "terraform plan *"),
    ("./gradlew build", "./gradlew build *"),
    ("tsc --noEmit", "tsc *"),
    # exact: fewer words than the arity, options before the subcommand, destructive programs
    ("make", "make"),
    ("git -C sub push", "git -C sub push"),
    ("python -c 'print([1])'", "python -c 'print([[]1])'"),
    ("rm -rf build", "rm -rf build"),
    ("curl -sSf https://example.com", "curl -sSf https://example.com"),
    ("sudo apt install jq", "sudo apt install jq"),
    ("FOO=1 pytest", "FOO=1 pytest"),
    ("git push --force origin main", None),   # destroys work: asks every time
    ("find . -name '*.pyc' -delete", "find . -name '[*].pyc' -delete"),
])
def test_arity_suggestions(project, command, pattern):
    result = bash(command, project)
    assert result["suggestion"] == pattern, result


@pytest.mark.parametrize("command, pattern", [
    ("tar -tf x.tar", "tar -tf *"), ("tar -tvzf x.tgz", "tar -tvzf *"), ("tar tf x.tar", "tar tf *"),
    ("tar -xf x.tar", "tar -xf *"), ("tar -czf a.tgz src", "tar -czf *"), ("unzip -l a.zip", "unzip -l *"),
    ("zip -sf a.zip", "zip -sf *"), ("gzip -l a.gz", "gzip -l *"), ("xz -l a.xz", "xz -l *"),
    ("cpio -t", "cpio -t *"), ("tar --list -f x.tar", "tar --list -f x.tar"),
    ("tar -f x.tar -t", "tar -f x.tar -t")])
def test_always_keeps_the_option_that_picks_what_an_archiver_does(project, command, pattern):
    """"Always" to `tar -tf x.tar` saved `tar *`, which then allowed `tar -xf` and --to-command
    unasked: an archiver's "always" keeps its mode option, or names the whole command."""
    assert bash(command, project)["suggestion"] == pattern
    rules = load_rules([("u", add_grant({}, {"capability": "process.execute", "pattern": pattern}))])
    assert decide("bash", {"command": command}, project, rules).action == "allow"
    for other in ("tar -xf x.tar", "tar -x --to-command=sh -f x.tar", "unzip a.zip", "gzip -d a.gz"):
        if other != command:
            assert decide("bash", {"command": other}, project, rules).action == "ask", other


@pytest.mark.parametrize("command", [
    "git push origin main", "npm run build", "python -c 'print([1])'", "rm -rf build",
    "find . -name '*.pyc' -delete", "cat .env", "docker compose up -d"])
def test_granting_the_suggestion_allows_the_same_command(project, command):
    decision = decide("bash", {"command": command}, project, DEFAULTS)
    assert decision.action == "ask" and decision.suggestion
    config = add_grant({}, decision.suggestion)
    rules = load_rules([("proj", config)])
    assert decide("bash", {"command": command}, project, rules).action == "allow"


def test_always_to_reading_an_outside_file_never_allows_writing_it(project):
    """"Always" to `cat ~/.bashrc` saved a rule of no scope: `echo X >> ~/.bashrc`, code at the
    user's next shell, then ran unasked. The saved rule reads only."""
    rc = Path(os.path.expanduser("~/.bashrc"))
    rc.write_text("# the user's\n")
    decision = decide("bash", {"command": "cat ~/.bashrc"}, project, DEFAULTS)
    assert decision.action == "ask" and decision.suggestion["scope"] == "read"
    rules = load_rules([("grants", add_grant({}, decision.suggestion))])
    assert decide("bash", {"command": "cat ~/.bashrc"}, project, rules).action == "allow"
    for write in ("echo X >> ~/.bashrc", f"cp x {rc}"):
        assert decide("bash", {"command": write}, project, rules).action == "ask", write
    assert "scope" in (validate_config_rules([{**decision.suggestion, "action": "allow",
                                                "scope": "all"}]) or "")


@pytest.mark.parametrize("command", [
    "npm test && npm run lint",
    "npm test || true",
    "npm test; echo done",
    "npm test | tee log.txt",
    "npm test > log.txt",
    "npm test 2>&1",
    "npm test < input.txt",
    "npm test &",
    "npm run $(cat target)",
    "npm run `cat target`",
    "(npm test)",
    "npm test\nnpm run lint",
    "bash -c 'npm test'",
])
def test_no_suggestion_for_operators_or_redirections(project, command):
    result = bash(command, project)
    assert (result["decision"], result["suggestion"]) == ("ask", None)


def test_file_suggestions(project):
    assert check("write", "src/api/handler.py", project, [])["suggestion"] == "src/api/*"
    assert check("write", "README.md", project, [])["suggestion"] == "README.md"
    assert check("read", ".env", project, DEFAULTS)["suggestion"] == ".env"
    outside = project.parent / "outside" / "secret.txt"
    assert check("read", str(outside), project, DEFAULTS)["suggestion"] == str(outside.resolve())


def test_suggestion_is_in_the_event_shape(project):
    decision = decide("bash", {"command": "git push origin main"}, project, DEFAULTS)
    assert decision.suggestion == {"capability": "network.access", "pattern": "git push *"}
    assert decision.descriptor == "git push origin main"


# ---------------------------------------------------------------- hardline floor

FLOORED = [
    # a shell line carried by an option: nix-shell's, an Ex command's `!` in vim
    "nix-shell --run 'rm -rf ~'", "vim -c '!rm -rf ~'", "nvim +'silent !rm -rf /'",
    "rm -rf /", "rm -rf /*", "rm -rf ~", "rm -rf ~/", "rm -rf ~/*", "rm -rf $HOME", 'rm -rf "${HOME}"',
    'rm -rf "$HOME"/', "cd ~ && rm -rf *", "cd && rm -rf ./*", "rm -fr /", "rm -r -f /", "rm -R /",
    "rm --recursive --force /", "rm -rf --no-preserve-root /", "rm -rf -- /", "rm -rf //",
    "rm -rf /./", "rm -rf /home/..", "rm -rf /usr", "rm -rf /etc/", "rm -rf /home/*",
    # obfuscated spellings
    "r'm' -rf /", '"rm" -rf /', 'r""m -rf /', "r\\m -rf /", "\\rm -rf /", "rm -rf '/'",
    "rm${IFS}-rf${IFS}/", "rm$IFS-rf$IFS/", "{rm,-rf,/}", "$'\\x72\\x6d' -rf /", "$'rm' -rf /",
    "/bin/rm -rf /", "/usr/bin/rm -rf /", "./rm -rf /",
    # prefixes
    "sudo rm -rf /", "sudo -u root rm -rf /", "sudo -E -- rm -rf /", "doas rm -rf /", "env rm -rf /",
    "env FOO=1 BAR=2 rm -rf /", "env -S 'rm -rf /'", "env - rm -rf /", "command rm -rf /",
    "exec rm -rf /",
    "nice -n 19 rm -rf /", "nohup rm -rf / &", "time rm -rf /", "timeout 5 rm -rf /",
    "xargs rm -rf /", "xargs -0 -I {} rm -rf /", "busybox rm -rf /", "! rm -rf /",
    # variables set then expanded, substitutions
    "X=/; rm -rf $X", "X=/\nrm -rf $X", 'D="/"; rm -rf "$D"', "T=~; rm -rf $T",
    "export T=/; rm -rf $T", "a=rm; $a -rf /", "a=r b=m; $a$b -rf /", 'cmd="rm -rf /"; $cmd',
    "$(echo rm) -rf /", "`echo rm` -rf /", "rm -rf $(echo /)",
    # hidden inside compound or nested commands
    "ls && rm -rf /", "true || rm -rf ~", "echo ok; rm -rf /", "echo $(rm -rf /)", "echo `rm -rf ~`",
    "(rm -rf /)", "{ rm -rf /; }", "bash -c 'rm -rf /'", "sh -c \"rm -rf ~\"", "bash -lc 'rm -rf /'",
    "sudo sh -c 'rm -rf /'", "eval 'rm -rf /'", "eval \"$(echo rm -rf /)\"", "find . -exec rm -rf / ;",
    "while true; do rm -rf /; done", "if true; then rm -rf ~; fi", "ls\nrm -rf /",
    # disks, filesystems, permissions, fork bombs
    "mkfs.ext4 /dev/sda1", "mkfs -t ext4 /dev/sdb", "sudo mkfs.xfs /dev/nvme0n1", "mke2fs /dev/sda",
    "wipefs -a /dev/sda", "dd if=/dev/zero of=/dev/sda", "dd if=/dev/urandom of=/dev/nvme0n1 bs=1M",
    "sudo dd if=img of=/dev/disk2", "echo hi > /dev/sda", "cat image.iso > /dev/sdb",
    "cat x >> /dev/mmcblk0", "cat img | sudo tee /dev/sda", "cp disk.img /dev/sdc", "shred /dev/sda",
    "chmod -R 777 /", "chmod 777 -R /", "chmod --recursive 0777 /", "sudo chmod -R 777 /",
    "chown -R nobody /", "chmod -R 000 ~", "find / -delete", "find ~ -name '*' -delete",
    ":(){ :|:& };:", ":(){ :|: & };:", "bomb(){ bomb|bomb& };bomb", "f() { f | f & }; f",
    "function f { f|f& }; f", "bash -c ':(){ :|:& };:'", "echo \\' ; :(){ :|:& };:", "rm --rec -f ~",
    # a line the parser gives up on still cannot hide the floor
    "rm -rf /\necho 'unterminated", "env -C /tmp rm -rf ~; echo 'unterminated",
    # places a substitution runs that a naive parser skips
    "echo ${x:-$(rm -rf /)}", "cat <<EOF\n$(rm -rf /)\nEOF", "echo $(( $(rm -rf /) ))", "time -p rm -rf /",
    "bash <<< 'rm -rf /'", "bash <<EOF\nrm -rf ~\nEOF", "cat <(rm -rf /)",
    # an unset variable expands to nothing; find's {} is what it found
    "rm -rf $UNSET_DIR/", 'rm -rf "${OUT}"/*', "rm -rf /home/$USER", "find / -exec rm -rf {} +",
    # bash's -c command is the first word after all its options, not the word after -c
    "bash -c -- 'rm -rf /'", "bash -c -e 'rm -rf /'", "sh -c -x -- 'rm -rf ~'",
    "bash -oc errexit 'rm -rf /'", "bash -c -O extglob 'rm -rf /'", "bash -c - 'rm -rf /'",
    # a wrapper's long option that takes a value, abbreviated as getopt_long allows
    "sudo --us root rm -rf ~", "timeout --sig KILL 5 rm -rf ~", "nice --adj 5 rm -rf /",
    # a wrapper's option that takes a value, missing from its row (the value was read as the
    # command), or listed as taking one when it does not (watch -d, xargs -i: optional, attached)
    "sudo -R / rm -rf ~", "sudo --chroot / rm -rf ~", "sudo --command-timeout 5 rm -rf ~",
    "sudo --other-user x rm -rf ~", "doas -a style rm -rf ~", "env -a name rm -rf ~",
    "env --argv0 name rm -rf ~", "ionice -t rm -rf ~", "watch -d rm -rf ~", "watch -q 3 rm -rf ~",
    "stdbuf --output L rm -rf ~", "flock --timeout 5 /tmp/l rm -rf ~", "caffeinate -t 5 rm -rf ~",
    "torsocks -P 9050 rm -rf ~", "unshare -R / rm -rf ~", "unshare --propagation private rm -rf ~",
    "systemd-run --uid 0 rm -rf ~", "run0 --nice 5 rm -rf ~", "strace -P /x rm -rf ~",
    "ltrace -n 2 rm -rf ~", "xargs -i rm -rf ~", "xargs --arg-file list rm -rf ~",
    "runuser -s /bin/sh -u x rm -rf ~", "chrt -T 5 1 rm -rf ~",
    # command lines a program runs later: git's --exec, bisect run and submodule foreach, watch's
    # words (through sh -c), trap's action
    "git rebase -x 'rm -rf ~' HEAD~1", "git rebase --exec='rm -rf /' main", "git difftool -x 'rm -rf ~'",
    "git rebase -ix 'rm -rf ~' main", "git bisect run rm -rf ~", "git submodule foreach 'rm -rf ~'",
    "watch 'rm -rf ~'", "watch -n 5 'rm -rf /'", "trap 'rm -rf ~' EXIT", "trap -- 'rm -rf /' INT",
    # a wrapper that runs its command in another directory
    "env -C / rm -rf usr", "env --chdir=/ rm -rf *", "env -C / -S 'rm -rf usr'",
    "sudo -D / rm -rf usr", "sudo --chdir ~ rm -rf .", "unshare -w / rm -rf usr",
    "systemd-run --working-directory=/ rm -rf usr",
    # a known value trimmed: ${HOME%/*} is the directory holding the home directory
    "rm -rf ${HOME%/*}", 'rm -rf "${HOME%/*}"', "rm -rf ${HOME:0:1}", "rm -rf ${HOME::1}",
    "X=~/x; rm -rf ${X%/x}", "X=/tmp; rm -rf ${X%%t*}",
    # $(pwd) prints the working directory
    'cd / && rm -rf "$(pwd)"', "cd ~ && rm -rf $(pwd -P)", "cd / && rm -rf `pwd`",
    # a shell's --command, nsenter's command
    "su --command='rm -rf ~'", "su root --comm 'rm -rf /'", "script --command 'rm -rf ~'",
    "fish --command='rm -rf ~'", "nsenter -t 1 -m rm -rf ~",
    # the kernel's controls written by a program, not only by a redirection
    "echo c | sudo tee /proc/sysrq-trigger", "echo 1 | tee /proc/sys/kernel/panic",
    "dd if=x of=/proc/sysrq-trigger", "cp x /sys/power/state",
    # the word of ${X:-word} is expanded too
    'rm -rf "${UNSET:-$HOME}"', "rm -rf ${UNSET:-~}", "rm -rf ${UNSET=~/}", "rm -rf ${HOME:+$HOME}",
    # ~user is that user's home (root's is /root)
    "rm -rf ~root", "rm -rf ~root/", "X=~root; rm -rf $X",
    # rsync's --del is --delete-during
    "rsync -a --delete /tmp/empty/ ~/", "rsync -a --del /tmp/empty/ ~/",
    # a disk erased or encrypted over by a subcommand or an option
    "cryptsetup luksFormat /dev/sda", "cryptsetup -q erase /dev/sda", "nvme format /dev/nvme0n1",
    "nvme sanitize -a 2 /dev/nvme0", "hdparm --security-erase p /dev/sda",
    "hdparm --trim-sector-ranges 0:8 /dev/sda", "sudo sgdisk --zap-all /dev/sda",
    # wrappers that run the command they are given: sg's through sh
    "sg wheel 'rm -rf /'", "sg wheel -c 'rm -rf ~'", "chronic rm -rf /",
    # command lines run by parallel (its template, or each argument) and by tmux (a window's
    # command, keys typed into a shell)
    "parallel ::: 'rm -rf /'", "parallel 'rm -rf {}' ::: /", "parallel rm -rf ::: build ~",
    "tmux new-session 'rm -rf /'", "tmux new 'rm -rf ~'", "tmux new -d -s x rm -rf /",
    "tmux send-keys -t x 'rm -rf /' Enter", "tmux split-window -h 'rm -rf ~'",
    # a default with a blank is one word, split only after it is expanded
    "rm -rf ${UNSET:-/ x}", "rm -rf ${UNSET:-build /}",
    # more wrappers and tmux commands that run a command line (a popup's, a pipe's, if-shell's)
    "dbus-run-session rm -rf ~", "dbus-run-session -- rm -rf /", "tmux display-popup 'rm -rf ~'",
    "tmux popup -w 80 'rm -rf /'", "tmux pipe-pane -o 'rm -rf ~'", "tmux if-shell 'rm -rf /' ''",
    # more disks erased, overwritten or flashed: by a subcommand, an option, a program, a copy
    "cryptsetup luksErase /dev/sda", "hdparm --write-sector 1 --yes-i-know-what-i-am-doing /dev/sda",
    "hdparm --make-bad-sector 1 /dev/sda", "hdparm --fwdownload fw.bin /dev/sda",
    "sg_format --format /dev/sg0", "sg_sanitize --crypto /dev/sg0", "ddrescue /dev/zero /dev/sda",
    # tar's options that name a command: bundled in its old-style first word, long, abbreviated
    "tar xIf 'rm -rf ~' a.tar", "tar cfI a.tar 'rm -rf /' src", "tar xFf 'rm -rf ~' a.tar",
    "tar --use-comp='rm -rf ~' -xf a.tar", "tar xf a.tar --info 'rm -rf ~'",
]


@pytest.mark.parametrize("command", FLOORED)
def test_floor_refuses(project, command):
    result = bash(command, project)
    assert (result["decision"], result["floor"]) == ("deny", True), result
    assert result["rule"].startswith("hardline floor:")
    assert result["suggestion"] is None


@pytest.mark.parametrize("command", ["rm -rf /", "rm -rf ~", ":(){ :|:& };:", "dd if=/dev/zero of=/dev/sda"])
def test_floor_beats_allow_rules(project, command):
    rules = [*DEFAULTS, Rule("*", "*", "allow", "yolo"), Rule("process.execute", command, "allow", "exact")]
    decision = decide("bash", {"command": command}, project, rules)
    assert (decision.action, decision.floor, decision.rule) == ("deny", True, None)


def test_a_garbage_collection_never_counts_against_the_judgement(project):
    """The judgement's budget is CPU time: a collection falling inside it (100+ ms in a large
    heap) must not turn a floor refusal into a question."""
    def slow_collection(phase, info):
        if phase == "start":
            end = time.thread_time() + 0.06
            while time.thread_time() < end:
                pass
    threshold = gc.get_threshold()
    gc.callbacks.append(slow_collection)
    gc.set_threshold(1)
    try:
        decision = decide("bash", {"command": 'D="/"; rm -rf "$D"'}, project, DEFAULTS)
    finally:
        gc.callbacks.remove(slow_collection)
        gc.set_threshold(*threshold)
    assert decision.floor and decision.action == "deny", decision.reason


def test_floor_refuses_the_literal_home_directory(project):
    assert bash(f"rm -rf {os.path.expanduser('~')}", project)["floor"] is True


NOT_FLOORED = [
    "rm -rf ./build", "rm -rf build", "rm -rf node_modules", "rm -rf build/*", "rm -rf dist/ .cache",
    "rm -rf /tmp/khaelor-test", "rm -rf ~/project/build", 'rm -rf "$HOME/.cache/pip"', "rm -f /tmp/x",
    "rm -rf $BUILD_DIR", "rm -rf $TMPDIR/khaelor-x", "rm /", "rm -rf src/*.pyc",
    "find . -name __pycache__ -exec rm -rf {} +",
    "dd if=a of=b.img", "dd if=/dev/zero of=zeros.bin count=1", "dd if=/dev/sda of=backup.img",
    "dd if=x of=/dev/null", "echo hi > /dev/null", "cat /dev/null > log.txt", "ls /dev/sda",
    "ls 2>/dev/null", "npm test 2>&1 | tee /dev/stderr",
    "chmod -R 755 build", "chmod 777 script.sh", "chmod 777 /", "chmod -r /", "chown -R me ./data",
    'echo "rm -rf /"', "grep -rn 'rm -rf /' docs", "git commit -m 'never rm -rf /'",
    "echo ':(){ :|:& };:'", "printf '%s' 'mkfs /dev/sda'", "find . -name '*.tmp' -delete",
    "find . -name '*.tmp' | xargs rm -rf", "mkdir -p ~/x", "cp a.txt b.txt",
    "cat <<'EOF'\n$(rm -rf /)\nEOF", "echo $((1 + 2))", "python -c 'import os'",
    "rsync -a --delay-updates src/ ~/", "env -C build rm -rf dist", "rm -rf ${HOME%/*}/x",
    "cat /proc/sys/kernel/hostname", "cryptsetup status root", "nvme list", "hdparm -I /dev/sda",
    "sg wheel ls", "cryptsetup luksFormat --help", "tmux new -s dev", "parallel echo ::: / ~",
    "rm -rf ${UNSET:-build dist}",
]


@pytest.mark.parametrize("command", NOT_FLOORED)
def test_near_misses_are_not_floored(project, command):
    assert bash(command, project)["floor"] is False


def test_a_wildcard_lists_one_directory_for_the_floor_and_the_repository_guard(project):
    """_catastrophic and _rm_destroys once computed a glob's base apart: `rm -rf /home/al*`
    (the user's home among its matches) only asked, and `../*` from a subdirectory was not
    "everything at the root"."""
    home = Path(os.environ["HOME"])
    (project / "src" / "sub").mkdir()
    for command in (f"rm -rf {home.parent}/{home.name[:2]}*", "rm -rf ~/.ss?", "rm -rf /etc/ss*",
                    "rm -rf /us?/lib*", "cd src && rm -rf /pr*", "rm -rf ~/{a,b}*"):
        assert bash(command, project)["floor"] is True, command
    rules = [*DEFAULTS, Rule("*", "*", "allow", "u", "user")]
    for command in ("cd src && rm -rf ../*", "cd src/sub && rm -rf ../../.[!.]*", "rm -rf *.pyc"):
        decision = decide("bash", {"command": command}, project, rules)
        assert "everything at the project's root" in decision.destructive, (command, decision)
    for command in ("rm -rf .gi?/objects", "cd src && rm -rf ../.g*/", "rm -rf src/../.*"):
        assert decide("bash", {"command": command}, project, rules).action == "ask", command


def test_floor_resolves_relative_targets_against_the_cwd(project, monkeypatch):
    home = project.parent
    monkeypatch.setenv("HOME", str(home))
    assert bash("rm -rf ..", project)["rule"] == "hardline floor: recursive delete of .."
    assert bash("cd src && rm -rf ../..", project)["floor"] is True
    assert bash("rm -rf ../outside", project)["floor"] is False


def test_the_floor_knows_where_pwd_and_pushd_lead(project):
    """$PWD and ~+ are the working directory, and pushd moves it as cd does: `cd / && rm -rf
    "$PWD"`, `cd && rm -rf ~+` and `pushd / && rm -rf .` only asked (the first even under --yes
    as "the project"), since the variable was taken for an unset one and pushd for a no-op."""
    for command in ('cd / && rm -rf "$PWD"', "cd ~ && rm -rf ${PWD}", "cd && rm -rf ~+",
                    "cd / && rm -rf ~+/", "pushd / && rm -rf .", "pushd ~ >/dev/null; rm -rf *",
                    "cd src; pushd /; rm -rf ."):
        assert bash(command, project)["floor"] is True, command
    rules = [*DEFAULTS, Rule("*", "*", "allow", "u", "user")]
    for command in ("rm -rf ~+", "rm -rf ~+/.git", "cd src && rm -rf ~+/..", "rm -rf $PWD"):
        assert decide("bash", {"command": command}, project, rules).destructive, command
    for command in ("PWD=/tmp/x; rm -rf $PWD", "cd src && rm -rf ~+/build", "pushd src; rm -rf ."):
        decision = bash(command, project)
        assert not decision["floor"] and not decision["destructive"], command


def test_pathological_commands_stay_fast(project):
    import time
    for command in ["echo " + "x" * 100_000, "f(){ " * 2000, "{a,b}" * 20, "$(" * 1000, '"$(' * 300]:
        started = time.monotonic()
        bash(command, project)
        assert time.monotonic() - started < 1.0, command[:20]


def test_a_tree_removed_outside_the_project_is_not_listed(project):
    """rm -r lists the entries of the tree it removes, for the user's Edit denies: listing / (a
    look for secrets at each of its paths) took `rm -rf /` to most of the time budget, and under
    load past it, where the floor's refusal became a question. Outside the project nothing is
    listed: every write there asks anyway."""
    for command in ("rm -rf /", "chmod -R 777 /", "cd / && rm -rf \"$(pwd)\"", "rm -rf /usr"):
        result, spent = timed(lambda: bash(command, project))
        assert (result["decision"], result["floor"]) == ("deny", True), command
        assert spent < permissions.DECIDE_BUDGET_SECONDS / 3, (command, spent)


def test_floor_does_not_apply_to_file_tools(project):
    assert check("write", "/dev/sda", project, DEFAULTS)["floor"] is False


# ---------------------------------------------------------------- outside the project

@pytest.mark.parametrize("path", ["../outside/secret.txt", "src/../../outside/secret.txt",
                                  "{outside}/secret.txt", "/etc/hostname", "~/notes.txt"])
def test_paths_outside_the_project(project, path):
    path = path.format(outside=project.parent / "outside")
    for kind in ("read", "write"):
        result = check(kind, path, project, DEFAULTS)
        assert (result["decision"], result["capability"]) == ("ask", "filesystem.outsideProject")


def test_symlinked_file_pointing_out_is_outside(project):
    (project / "innocent.txt").symlink_to(project.parent / "outside" / "secret.txt")
    decision = decide("read", {"file_path": "innocent.txt"}, project, DEFAULTS)
    assert decision.capability == "filesystem.outsideProject"
    assert decision.descriptor == str((project.parent / "outside" / "secret.txt").resolve())


def test_write_through_symlinked_directory_is_outside(project):
    (project / "vendor").symlink_to(project.parent / "outside", target_is_directory=True)
    assert check("write", "vendor/new.txt", project, DEFAULTS)["capability"] == "filesystem.outsideProject"
    assert bash("cat vendor/secret.txt", project)["capability"] == "filesystem.outsideProject"
    assert bash("echo x > vendor/new.txt", project)["capability"] == "filesystem.outsideProject"


def test_symlink_inside_the_project_stays_inside(project):
    (project / "current").symlink_to(project / "src", target_is_directory=True)
    result = check("read", "current/app.py", project, DEFAULTS)
    assert (result["decision"], result["capability"]) == ("allow", "file.read")
    (project / "alias").symlink_to(project / ".env")
    assert check("read", "alias", project, DEFAULTS)["rule"] == 'ask file.read "*.env" (default)'


def test_project_root_reached_through_a_symlink(project):
    link = project.parent / "link-to-proj"
    link.symlink_to(project, target_is_directory=True)
    assert check("read", "src/app.py", link, DEFAULTS)["decision"] == "allow"
    assert check("read", str(project / "src" / "app.py"), link, DEFAULTS)["decision"] == "allow"


def test_globs_and_unknown_values_in_arguments(project):
    assert bash("cat .e*", project)["rule"] == 'ask file.read "*.env" (default)'
    assert bash("cat src/*.py", project)["decision"] == "allow"
    assert bash("cat $F", project)["decision"] == "ask"     # not literal, and $F could be anywhere
    assert bash("cat $(ls ~/.ssh/*)", project)["decision"] == "ask"
    assert bash("echo $F", project)["decision"] == "ask"    # only literal words are provably read-only


def test_bash_arguments_outside_the_project(project):
    assert bash("cat ../outside/secret.txt", project)["capability"] == "filesystem.outsideProject"
    assert bash("ls /etc", project)["capability"] == "filesystem.outsideProject"
    assert bash("grep -rn /api/v1 src", project)["decision"] == "allow"   # a pattern, not a path
    assert bash("echo /etc/passwd", project)["decision"] == "allow"


# ---------------------------------------------------------------- config layers and grants

def test_load_rules_layers_defaults_then_user_then_project(project):
    user = {"permissions": [{"capability": "process.execute", "pattern": "npm *", "action": "deny"}]}
    proj = {"model": "m", "permissions": [{"capability": "process.execute", "pattern": "npm test *",
                                           "action": "allow"}]}
    rules = load_rules([("/home/u/.khaelor/config.json", user), ("/p/.khaelor/config.json", proj)])
    assert rules[:len(DEFAULTS)] == DEFAULTS
    assert [r.source for r in rules[len(DEFAULTS):]] == ["/home/u/.khaelor/config.json", "/p/.khaelor/config.json"]
    assert bash("npm test", project, rules)["decision"] == "allow"        # project wins
    assert bash("npm run x", project, rules)["decision"] == "deny"        # user still applies
    assert load_rules([("a", {}), ("b", {"model": "x"})]) == DEFAULTS


@pytest.mark.parametrize("config, fragment", [
    ({"permissions": {"capability": "x"}}, '"permissions" must be a list'),
    ({"permissions": ["allow all"]}, "permissions[0] must be an object"),
    ({"permissions": [{"capability": "file.read", "pattern": "*"}]}, "permissions[0] is missing action"),
    ({"permissions": [{"capability": "file.read", "pattern": "*", "action": "alow"}]},
     'permissions[0].action "alow" is not one of allow, ask, deny'),
    ({"permissions": [{"capability": "file.raed", "pattern": "*", "action": "allow"}]},
     'capability "file.raed" names no capability'),
    ({"permissions": [{"capability": "file.read", "pattern": "", "action": "allow"}]},
     "permissions[0].pattern must be a non-empty string"),
    ({"permissions": [{"capability": "file.read", "pattern": "*", "action": "allow", "acton": "x"}]},
     "unknown key acton"),
])
def test_malformed_rules_give_actionable_errors(config, fragment):
    assert fragment in permissions.validate_config_rules(config)
    with pytest.raises(permissions.PermissionConfigError, match="/p/config.json: "):
        load_rules([("/p/config.json", config)])


def test_well_formed_configs_validate():
    assert permissions.validate_config_rules({"model": "x"}) is None
    assert permissions.validate_config_rules(None) is None
    assert "JSON object" in permissions.validate_config_rules("permissions")
    assert permissions.validate_config_rules(
        {"permissions": [{"capability": "file.*", "pattern": "docs/*", "action": "allow"}]}) is None


def test_add_grant_keeps_other_keys_and_is_idempotent():
    config = {"model": "claude-x", "prices": {"a": 1},
              "permissions": [{"capability": "file.read", "pattern": "*", "action": "allow"}]}
    grant = {"capability": "process.execute", "pattern": "git push *"}
    once = add_grant(config, grant)
    assert once["model"] == "claude-x" and once["prices"] == {"a": 1}
    assert once["permissions"][-1] == {"capability": "process.execute", "pattern": "git push *", "action": "allow"}
    assert add_grant(once, grant) == once
    assert len(config["permissions"]) == 1          # the input is not modified


def test_add_grant_moves_an_overridden_duplicate_to_the_end():
    entry = {"capability": "process.execute", "pattern": "npm *", "action": "allow"}
    config = {"permissions": [entry, {**entry, "action": "deny"}]}
    assert add_grant(config, entry)["permissions"] == [{**entry, "action": "deny"}, entry]


def test_add_grant_rejects_a_bad_rule():
    with pytest.raises(ValueError, match="action"):
        add_grant({}, {"capability": "file.read", "pattern": "*", "action": "sure"})


def test_a_path_rule_covers_what_git_reads_the_same_line_to_cover(project):
    """tests/data/globs.json: git's wildmatch cases, ripgrep's glob and gitignore cases and Claude
    Code's examples, each a deny rule on a path, against what git check-ignore says of the same
    line in a .gitignore: the path, or a directory above it, matches (a deny of `Read(./secrets)`
    that missed secrets/api.key would let it be read). Where ours differs on purpose the case says
    why; the agreements are counted, so a lost one shows."""
    agreed = 0
    for case in [case for case in GLOBS if case["covered"] is not None]:
        settings = json.dumps({"permissions": {"deny": [case["rule"]]}})
        rules = load_rules([permissions.claude_layer("settings.json", settings, project)])
        tool = "edit" if case["rule"].startswith("Edit(") else "read"
        subject = {"file_path": case["path"], "old_string": "a", "new_string": "b"}
        folder = project / case["path"]
        if case.get("dir"):
            folder.mkdir(parents=True)
        covered = decide(*tools.permission_subject(tool, subject), project, rules).action == "deny"
        if case.get("dir"):
            os.removedirs(folder)
        if covered == case["covered"]:
            agreed += 1
        else:
            assert "covered" in case.get("disputed", {}), case
    assert agreed == 352


# ---------------------------------------------------------------- inspection and module rules

def test_check_returns_the_cli_json_shape(project):
    result = bash("git push origin main", project)
    assert result == {"decision": "ask", "capability": "network.access", "rule": 'ask network.access "*" (default)',
                      "floor": False, "suggestion": "git push *", "layer": "default",
                      "reason": 'ask network.access "*" (default)', "read_only": False,
                      "not_read_only": "git push origin main: git push is not on the read-only list",
                      "destructive": "",
                      "confine": {"write": True, "network": True, "unattended_network": True,
                                  "unattended_paths": [], "git_network": True, "paths": [],
                                  "read_paths": [], "secrets": False, "secret_paths": [], "rule_asked": False,
                                  "hide": list(sandbox.SECRET_NAMES), "paths_write": False,
                                  "hide_paths": [], "deny_paths": [], "frozen_paths": [],
                                  "frozen_files": list(permissions.PROJECT_FILES),
                                  "unattended": False, "attended": False, "unconfined": False}}
    with pytest.raises(ValueError):
        check("delete", "x", project, DEFAULTS)


def test_under_yes_only_gits_network_and_plain_settings_read_the_credentials_in_git_config(project):
    """Confine.git_network: the lines that see .git/config with CI's token under --yes. A URL-like
    word made any git subcommand network (`git commit -F .git/config --trailer https://x` kept the
    token in a commit for a push to send), and a redirection kept `git ls-remote --get-url`'s."""
    kept = ["git push origin main", "git fetch && git pull --rebase", "git config user.email a@b",
            "git config user.email a@b && git push -u origin HEAD", "git remote update"]
    masked = ["git commit --allow-empty -F .git/config --trailer https://x",
              "git ls-remote --get-url origin > url.txt", "cat .git/config > n; git push",
              "git fetch origin && git notes add -F .git/config", "git config -l",
              "git config --get-regexp extraheader", "GIT_TRACE=1 git push",
              "git fetch < .git/config", "git config remote.origin.url --get"]
    for line in kept + masked:
        assert bash(line, project)["confine"]["git_network"] == (line in kept), line


def test_describe_rules_lists_evaluation_order_with_sources():
    rules = load_rules([("/p/.khaelor/config.json",
                         {"permissions": [{"capability": "git.modify", "pattern": "git push *", "action": "allow"}]})])
    lines = permissions.describe_rules(rules)
    assert len(lines) == len(rules)
    assert lines[0].split() == ["1", "allow", "file.read", "*", "default"]
    assert lines[-1].split()[1:] == ["allow", "git.modify", "git", "push", "*", "/p/.khaelor/config.json"]


def test_module_imports_only_sandbox_of_ours():
    ours = {p.stem for p in Path(permissions.__file__).parent.glob("*.py")}
    tree = ast.parse(Path(permissions.__file__).read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported & (ours - {"permissions"}) <= {"sandbox"}


def test_the_agent_cannot_edit_its_own_permission_config(tmp_path):
    rules = permissions.load_rules([("user", {"permissions": [
        {"capability": "file.write.project", "pattern": "*", "action": "allow"},
        {"capability": "process.execute", "pattern": "*", "action": "allow"},
        {"capability": "filesystem.outsideProject", "pattern": "*", "action": "allow"}]})])
    for tool, tool_input in [("write", {"file_path": ".khaelor/config.json", "content": "{}"}),
                             ("edit", {"file_path": "./.khaelor/../.khaelor/config.json", "old_string": "a", "new_string": "b"}),
                             ("bash", {"command": "echo '{}' > .khaelor/config.json"}),
                             ("write", {"file_path": str(tmp_path / "home" / ".khaelor" / "config.json"), "content": "{}"})]:
        decision = permissions.decide(*tools.permission_subject(tool, tool_input), tmp_path, rules)
        assert decision.action == "deny" and decision.floor, (tool, tool_input)
    assert permissions.decide("read", {"file_path": ".khaelor/config.json"}, tmp_path, rules).action == "allow"


def test_without_the_whole_os_boundary_every_command_asks(project):
    rules = [*DEFAULTS, Rule("process.execute", "npm *", "allow", "u", "user")]
    confined = decide("bash", {"command": "npm test"}, project, rules)
    unconfined = decide("bash", {"command": "npm test"}, project, rules, sandboxed=False)
    assert confined.action == "allow" and unconfined.action == "ask"
    assert unconfined.layer == "sandbox" and "sandbox" in unconfined.reason
    # the parser may be wrong about any command: without the kernel holding it, even `ls` asks
    assert decide("bash", {"command": "ls -la"}, project, DEFAULTS).action == "allow"
    assert decide("bash", {"command": "ls -la"}, project, DEFAULTS, sandboxed=False).action == "ask"


@pytest.mark.parametrize("command, destroys", [
    ("git reset --hard", True), ("git reset --hard HEAD~1", True), ("git clean -fdx", True),
    ("git clean -n", False), ("git push --force origin main", True), ("git push origin +main", True),
    ("git push origin main", False), ("git checkout -- .", True), ("git checkout feature", False),
    ("rm -rf .git", True), ("rm -rf ..", True), ("rm -rf *", True), ("rm -rf build", False),
    ("cd build && rm -rf *", False), ("git stash drop", True), ("git branch -D old", True),
    ("find . -delete", True), ("find . -name '*.pyc' -delete", False),
    # a ref deleted with its reflog, another work tree's changes, a branch overwritten or reset
    ("git update-ref -d refs/heads/old", True), ("git update-ref --delete HEAD", True),
    ("git worktree remove --force ../wt", True), ("git worktree remove ../wt", False),
    ("git branch -M old main", True), ("git switch -C main HEAD~3", True),
    ("git switch -c feature", False), ("git branch -m old new", False),
    # -M is --move --force, -C --copy --force; -f NAME resets NAME
    ("git branch -mf old main", True), ("git branch --move --force old main", True),
    ("git branch -c -f old main", True), ("git branch -f main HEAD~3", True),
    ("git branch --force main", True), ("git branch -f --list", False),
    # paths read from a file; -B resets a branch as switch -C does
    ("git checkout --pathspec-from-file=list.txt", True), ("git checkout -B main", True),
    ("git checkout HEAD --pathspec-from-file list.txt", True), ("git checkout -b new", False),
    # the index copied over the work tree
    ("git checkout-index -a -f", True), ("git checkout-index --force --all", True),
    ("git checkout-index -a", False), ("git read-tree -u --reset HEAD", True),
    ("git read-tree --reset HEAD", False), ("git read-tree -m -u HEAD", False),
    # find -delete of the repository's history or of a directory holding the project, as rm -r
    ("find .git -delete", True), ("find .git/ -mindepth 1 -delete", True),
    ("find ./.git/ -delete", True), ("find .git -name '*.lock' -delete", False),
    ("find build -delete", False),
    # rsync --delete into the project deletes what its source lacks
    ("rsync -a --delete /tmp/empty/ ./", True), ("rsync -a --del /tmp/empty/ .git", True),
    ("rsync -a --delete-after src/ build/", False), ("rsync -a /tmp/empty/ ./", False),
    ("git rebase -x 'git reset --hard' main", True), ("git rebase -x 'npm test' main", False),
    ("env -C src rm -rf ../.git", True), ("sudo -D build rm -rf dist", False),
    ('rm -rf "$(pwd)/.git"', True), ("rm -rf $(pwd)", True), ('rm -rf "$(pwd)/build"', False),
    # plain rm of a file in .git: a pack, a ref (a stale lock aside)
    ("rm -f .git/objects/pack/*.pack", True), ("rm .git/HEAD", True), ("cd .git && rm index", True),
    ("rm -f .git/index.lock", False), ("rm *.pyc", False),
    # on macOS and Windows .GIT is .git
    ("rm -rf .GIT", True), ("rm -f .Git/objects/pack/x.pack", True),
    # what is piped into xargs becomes the command's arguments
    ("echo --hard | xargs git reset", True), ("echo . | xargs rm -rf", True),
    ("echo .git | xargs rm -rf", True), ("echo build | xargs rm -rf", False),
    ("find . -name '*.tmp' | xargs rm -rf", False),
    # git -c given in the environment
    ("GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=core.pager GIT_CONFIG_VALUE_0=sh git log", True),
    ("env GIT_CONFIG_PARAMETERS=\"'core.fsmonitor=x'\" git status", True),
    ("GIT_PAGER=cat git log", False),
    # a release put in a public registry, which --yes's network for installs must not reach
    ("npm publish", True), ("npm publish --access public", True), ("cargo publish", True),
    ("twine upload dist/*", True), ("yarn npm publish", True), ("docker push me/app", True),
    ("gh release create v1", True), ("gh release upload v1 a.zip", True), ("uv publish", True),
    ("npm install", False), ("cargo build", False), ("gh release list", False),
    ("yarn npm info x", False), ("docker pull me/app", False),
    # what a host loses for good: --yes runs the network curl and gh need, never these
    ("curl -X DELETE https://api.example/items/1", True), ("curl -sXDELETE http://h/x", True),
    ("curl --request delete http://h/x", True), ("wget --method=DELETE http://h/x", True),
    ("http DELETE example.org/items/1", True), ("gh api --method DELETE repos/o/r", True),
    ("gh secret set TOKEN --body x", True), ("gh repo edit --visibility public", True),
    ("gh repo edit --visibility=public", True), ("gh repo create o/r --public --push", True),
    ("gh repo delete o/r --yes", True), ("gh release delete-asset v1 a.zip", True),
    ("curl -X POST http://h/x", False), ("curl https://example.org/DELETE", False),
    ("http POST example.org/items", False), ("gh secret list", False),
    ("gh repo edit --visibility private", False), ("gh api repos/o/r", False),
])
def test_commands_that_destroy_work_in_the_repository_ask_every_time(project, command, destroys):
    (project / "build").mkdir(exist_ok=True)
    rules = [*DEFAULTS, Rule("*", "*", "allow", "u", "user")]        # even when a rule allows everything
    decision = decide("bash", {"command": command}, project, rules)
    if decision.floor:          # here `..` also holds $HOME: the floor refuses it outright
        assert command == "rm -rf .." and decision.action == "deny"
        return
    assert bool(decision.destructive) == destroys, decision
    if destroys:
        assert decision.action == "ask" and decision.suggestion is None


@pytest.mark.parametrize("command, runs_denied", [
    # programs the wrapper table does not list, running the words after them
    ("gdb --args touch m", True), ("perf stat touch m", True), ("watchexec -- touch m", True),
    ("npx touch m", True), ("poetry run /usr/bin/touch m", True), ("uv run touch m", True),
    ("docker run img touch m", True), ("setarch linux64 -R touch m", True),
    ("bash <(echo touch m)", True), ("make touch", True),
    # a shell those programs run, and the line it runs
    ("npx sh -c 'touch m'", True), ("poetry run bash -c 'ls; touch m'", True),
    ("npx sh -c 'echo hi'", False),
    # a glob bash may expand to the denied program's name, where a program goes or after
    ("/usr/bin/t?uch m", True), ("/usr/bin/tou[c]h m", True), ("npx t*h m", True),
    ("/usr/bin/l? m", False), ("npx prettier *.py", False),
    # words that cannot be read (an unclosed quote), or not in time: as if they ran it
    ("poetry run touch 'm", True), ("poetry run " + "x " * 150_000, True),
    # the denied program's name inside a word, or not there at all
    ("git commit -m 'touch up'", False), ("npm test", False), ("poetry run pytest", False),
    ("ls; make; echo touch", False),
    # code an interpreter or make runs that names the denied program, given any way
    ("""python3 -c 'import os; os.system("touch m")'""", True), ("perl -e 'system q(touch m)'", True),
    ("""node -e 'require("child_process").execSync("touch m")'""", True),
    ("ruby -e '`touch m`'", True), ("""awk 'BEGIN{system("touch m")}'""", True),
    ("""python3 -c 'import subprocess; subprocess.run(["touch", "m"])'""", True),
    ("python3 <<'EOF'\nimport os\nos.system('touch m')\nEOF", True),
    ("""echo 'import os; os.system("touch m")' | python3""", True),
    ("make -f - <<< 'all:; touch m'", True), ("echo 'all:; touch m' | make -f -", True),
    ("""pypy3 -c 'import os; os.system("touch m")'""", True),
    ("python3 -c 'print(1)'", False), ("python3 -c 'import retouch, touchy'", False),
    ("echo touch | tee out", False),
])
def test_a_command_that_may_run_what_a_deny_refuses_is_never_approved_by_yes(project, command,
                                                                              runs_denied):
    rules = [*DEFAULTS, Rule("process.execute", "touch *", "deny", "u", "user")]
    decision = decide("bash", {"command": command}, project, rules)
    assert decision.action == "ask"
    assert bool(decision.destructive) == runs_denied, decision
    if runs_denied:
        assert "--yes alone never approves it" in decision.reason and decision.suggestion is None
    # an ask rule is not a deny
    rules[-1] = Rule("process.execute", "touch *", "ask", "u", "user")
    assert not decide("bash", {"command": command}, project, rules).destructive


@pytest.mark.parametrize("command, runs_denied", [
    ("""python3 -c 'import subprocess; subprocess.run(["git", "push", "origin"])'""", True),
    ("""python3 -c 'import os; os.system("git -C . push")'""", True),
    ("""python3 -c 'import subprocess; print(subprocess.check_output(["git", "log"]))'""", False),
    ("python3 -m pytest tests -k git", False), ("awk '/git/' log.txt", False),
])
def test_code_must_name_each_word_of_a_deny_to_ask_every_time(project, command, runs_denied):
    """A deny of `git push *` made every line of code that names git ask every time under --yes."""
    rules = [*DEFAULTS, Rule("process.execute", "git push *", "deny", "u", "user")]
    decision = decide("bash", {"command": command}, project, rules)
    assert decision.action == "ask" and bool(decision.destructive) == runs_denied, decision


def test_code_written_to_an_interpreter_that_names_a_denied_program_is_never_approved_by_yes(
        project):
    rules = [*DEFAULTS, Rule("process.execute", "touch *", "deny", "u", "user")]
    for text, runs_denied in (("os.system('touch m')\n", True), ("print(2)\n", False)):
        decision = decide("feed", {"input": text}, project, rules, process_command="python3")
        assert decision.action == "ask" and bool(decision.destructive) == runs_denied, decision


def test_what_a_deny_refuses_beside_an_undoable_destruction_is_never_approved_by_yes(project):
    """--yes takes a checkpoint and runs a git reset --hard (a rewind undoes it); the command that
    may run what a deny refuses beside it was left unread, and so ran with it."""
    rules = [*DEFAULTS, Rule("process.execute", "touch *", "deny", "u", "user")]
    for command in ("git reset --hard; npx touch m", "git checkout -- .; poetry run touch m"):
        decision = decide("bash", {"command": command}, project, rules)
        assert decision.action == "ask", command
        assert not permissions.checkpoint_undoes(decision.destructive), decision
        assert "touch m" in decision.reason, decision


def test_a_command_strace_pipes_its_trace_into_is_judged(project):
    """strace -o '|CMD' (or '!CMD') runs CMD in a shell: it was judged as a file written, and so
    ran under --yes what a deny refuses."""
    rules = [*DEFAULTS, Rule("process.execute", "touch *", "deny", "u", "user")]
    for command in ("strace -o '|touch m' ls", "strace -o'!touch m' ls",
                    "strace --output='|touch m' ls", "sudo strace -ff -o '|touch m' make"):
        assert decide("bash", {"command": command}, project, rules).action == "deny", command
    assert decide("bash", {"command": "strace -o trace.txt ls"}, project, rules).action == "ask"


def test_a_long_command_that_may_run_a_denied_one_is_read_within_its_budget(project):
    """What a deny refuses is looked for in every tail of the words: each joined anew, 64 at a time
    between looks at the clock, and the words split unclocked, 300 KB took 1.6 s. tar's old-style
    cluster is spelled out letter by letter: 600 KB of it took 0.46 s."""
    rules = [*DEFAULTS, Rule("process.execute", "rm -rf *", "deny", "u", "user")]
    decide("bash", {"command": "npx rm rm"}, project, rules)
    for command in ("npx " + "rm " * 3_000, "npx " + "rm " * 100_000,
                    "tar " + "v" * 600_000 + "f a.tar"):
        decision, spent = timed(lambda: decide("bash", {"command": command}, project, rules))
        assert decision.action == "ask", decision
        assert spent < 5 * permissions.DECIDE_BUDGET_SECONDS, f"{len(command)}: {spent:.3f} s"


def test_a_search_that_follows_symlinks_out_of_the_project_asks(project):
    (project / "docs").symlink_to(project.parent / "outside", target_is_directory=True)
    for following in ("grep -R secret .", "grep --dereference-recursive secret .", "rg -L secret", "rg --follow x"):
        assert bash(following, project)["decision"] == "ask", following
    for not_following in ("rg secret", "grep -rn secret src"):     # (grep -r . would read .env: asks)
        assert bash(not_following, project)["decision"] == "allow", not_following


def test_a_search_of_the_working_directory_with_option_values_reads_its_secrets(project):
    """grep -r and rg with no path search the working directory; an option's value given as
    the next word (-A 2, -g '*.pem', -t json) was taken for a path, so the secrets under the
    directory went unasked: `rg -A 2 KEY` read deploy/server.pem silently."""
    (project / "deploy").mkdir()
    (project / "deploy" / "server.pem").write_text("x\n")
    for command in ("rg -A 2 KEY", "rg -g '*.pem' KEY", "rg -t json KEY", "rg --max-count 1 KEY",
                    "grep -r -A 2 KEY", "grep -rC 3 KEY", "grep -r --include '*.pem' KEY"):
        assert bash(command, project)["decision"] == "ask", command
    for command in ("rg -A 2 KEY src", "grep -r -m 1 KEY src"):
        assert bash(command, project)["decision"] == "allow", command


def test_a_quoted_program_name_with_a_space_names_no_policy_row(project):
    """'git status' quoted is one word: a program no one has, not git's read-only status."""
    for command in ("'git status'", "'git log' -1", "\"git diff\""):
        result = bash(command, project)
        # the rule keeps the quotes, so granting it never grants git's own subcommand
        quoted = command.replace('"', "'")
        assert result["decision"] == "ask", result
        assert result["suggestion"] == permissions._escape(quoted), result


def test_an_always_rule_keeps_the_quotes_it_is_shown_with(project):
    """The rule shown is the rule stored and matched: `python3 -c 'print(1)'`, and granting
    `npm run 'my script'` does not grant `npm run my script` (two words)."""
    assert bash("python3 -c 'print(1)'", project)["suggestion"] == "python3 -c 'print(1)'"
    granted = bash("npm run 'my script'", project)["suggestion"]
    assert granted == "npm run 'my script' *"
    rules = [*DEFAULTS, Rule("process.execute", granted, "allow", "u")]
    assert bash("npm run 'my script' --watch", project, rules)["decision"] == "allow"
    assert bash('npm run "my script"', project, rules)["decision"] == "allow"
    assert bash("npm run my script", project, rules)["decision"] == "ask"


def test_test_v_with_an_array_subscript_is_not_read_only(project):
    assert bash("test -v name", project)["decision"] == "ask"
    assert bash("[ -f README.md ]", project)["decision"] == "allow"


def test_man_reads_and_its_options_that_run_a_program_ask_with_an_exact_always(project):
    """`man ls` asked, and "always" saved `man ls *`, which then ran `man ls -P 'touch m'` unasked."""
    for command in ("man ls", "man 5 crontab", "man -k printf", "man -aw ls"):
        assert bash(command, project)["decision"] == "allow", command
    for command in ("man -C ./man.conf ls", "man -M ./pages ls", "man -p t ls"):
        result = bash(command, project)
        assert result["decision"] == "ask", command
        assert result["suggestion"] == permissions._escape(shlex.join(shlex.split(command)))
    # the pager and the browser are read as the commands they run (as sort --co= is): no "always"
    for command in ("man ls -P 'touch m'", "man --pager='touch m' ls", "man -Hfirefox ls", "man --pa=x ls"):
        assert bash(command, project)["decision"] == "ask", command
        assert bash(command, project)["suggestion"] is None, command


def test_always_on_a_listed_command_asked_for_its_option_is_exact(project):
    """sort asked because of --co=: "always" must not save sort *, which would grant that form."""
    assert bash("git log --output=x", project)["suggestion"] == "git log --output=x"
    # --co(mpress-program) and --pre are read as the commands they run: a line of two commands has
    # no "always"
    for command in ("sort --co=bash names.txt", "rg --pre ./x TODO"):
        assert bash(command, project)["suggestion"] is None, command
    assert bash("git push origin main", project)["suggestion"] == "git push *"


def test_find_piped_into_xargs_rm_is_floored_from_its_roots(project):
    assert bash("find / | xargs rm -rf", project)["floor"]
    assert not bash("find . -name '*.pyc' | xargs rm -f", project)["floor"]


# ------------------------------------------------ grammar the judge follows exactly, or asks (issue 19)

@pytest.mark.parametrize("command", [
    "true {PATH}<<<x; cat src/app.py", "echo hi {fd}>&2", "cat {a[1]}<src/app.py", "true {PATH}>&-",
    'cat src/app$".py"', "ls {src,.}", "ls src/{a..c}", "ls {1..3}", "ls src{,/}",
    "echo $(ls # )\nid\n)", "cd -", "cd -P src", "cd", "cd src src", "grep -v -- -x .env",
])
def test_grammar_the_judge_does_not_follow_is_never_silent(project, command):
    assert bash(command, project)["decision"] != "allow", command


def test_a_relative_cd_that_cdpath_may_redirect_asks(project, monkeypatch):
    monkeypatch.setenv("CDPATH", str(project.parent / "outside"))
    assert bash("cd src && ls", project)["decision"] == "ask"
    assert bash("cd ./src && ls", project)["decision"] == "allow"
    monkeypatch.delenv("CDPATH")
    assert bash("cd src && ls", project)["decision"] == "allow"


def test_long_options_are_followed_only_when_spelled_out(project):
    """GNU and git expand an abbreviation among all their options, listed or not."""
    for abbreviated in ("sort --comp=sh src/app.py", "git --exec-p=. log", "ls --al", "git log --outp=x"):
        assert bash(abbreviated, project)["decision"] == "ask", abbreviated
    for spelled_out in ("ls --all src", "git log --oneline", "grep --count x src/app.py"):
        assert bash(spelled_out, project)["decision"] == "allow", spelled_out


def test_unknown_git_commands_and_aliases_are_never_approved_by_yes(project):
    """An unknown git command may be an alias for reset --hard: it asks every time, even under --yes."""
    for command in ("git lg", "git -C . st", "git config alias.st status", "git config include.path ../x"):
        result = bash(command, project)
        assert result["decision"] == "ask" and result["destructive"], command
    for command in ("git rev-list HEAD", "git config user.name me", "git push origin main"):
        assert not bash(command, project)["destructive"], command
    assert bash("git config --get alias.st", project)["decision"] == "allow"


@pytest.mark.parametrize("key", ["credential.helper", "core.askPass", "remote.origin.receivepack",
                                 "remote.origin.uploadpack", "core.hooksPath", "http.proxy",
                                 "url.ext::sh.insteadOf", "filter.x.smudge", "sequence.editor"])
def test_git_config_of_what_git_runs_is_never_approved_by_yes(project, key):
    """`git config credential.helper '!SCRIPT' && git push`: --yes gave the line the network (git
    is known to need it), and the push ran the script with it before the guard put the config back.
    A key the guard would put back now asks every time (also as git 2.46's `git config set`)."""
    for command in (f"git config {key} x && git push", f"git config set {key} x"):
        result = bash(command, project)
        assert result["decision"] == "ask" and result["destructive"], command
    assert not bash("git config remote.origin.url https://x/y && git push", project)["destructive"]


PATHOLOGICAL = {
    "nested substitutions": "echo " + "$(" * 75_000 + ")" * 75_000,
    "empty quotes": "echo " + "''" * 150_000,
    "escaped quotes": 'echo "' + '\\"' * 150_000,
    "unclosed brackets": "echo " + "[" * 300_000,
    "an unclosed brace list": "echo {" + "," * 300_000,
    "brace lists": "echo " + "{a,b}" * 60_000,
    "unclosed parameters": "echo " + "${a" * 100_000,
    "function definitions": "".join(f"f{i}(){{ :; }};" for i in range(25_000)),
    "doubling variables": "A=xx;" + "A+=$A;" * 60 + "echo $A",
    "pipes": "ls |" * 75_000 + "ls",
    "a heredoc": "cat <<EOF\n" + "line $x `id`\n" * 25_000 + "EOF\n",
    "an option cluster": "ls -" + "l" * 300_000,
}


@pytest.mark.parametrize("shape", PATHOLOGICAL)
def test_a_300_kb_pathological_command_asks_within_its_budget(project, shape):
    """decide() stops at DECIDE_BUDGET_SECONDS of CPU time and asks; the work after that (one linear
    pass to build the answer) is bounded too."""
    # the first call in a worker compiles the module's regular expressions: not the judgement's cost
    decide("bash", {"command": PATHOLOGICAL[shape][:2000]}, project, DEFAULTS)
    decision, spent = timed(lambda: decide("bash", {"command": PATHOLOGICAL[shape]}, project, DEFAULTS))
    assert decision.action == "ask" and not decision.read_only
    assert spent < 5 * permissions.DECIDE_BUDGET_SECONDS, f"{shape}: {spent:.3f} s"


def test_fields_that_are_not_an_object_ask_when_out_of_time(project, monkeypatch):
    """A malformed tool call's fields (a list) are judged as empty, on the out-of-time path too:
    it asks instead of raising."""
    monkeypatch.setattr(permissions, "DECIDE_BUDGET_SECONDS", -1)
    # the clock is read every 64th check
    decisions = [decide("read", ["x"], project, DEFAULTS) for _ in range(130)]
    assert any(d.not_read_only.startswith("read: not judged") for d in decisions)


@pytest.mark.parametrize("shape", ["unclosed brackets", "an unclosed brace list", "unclosed parameters",
                                   "escaped quotes", "function definitions", "brace lists"])
def test_judging_grows_linearly_with_the_command(project, monkeypatch, shape):
    """Without the budget, judging four times the command takes about four times as long (each
    shape was quadratic once: sixteen times, and minutes at 300 KB). A ratio, not a time: a busy
    machine slows both alike."""
    monkeypatch.setattr(permissions, "DECIDE_BUDGET_SECONDS", 60)
    command = PATHOLOGICAL[shape][:40_000]

    def judged_in(text):
        return timed(lambda: decide("bash", {"command": text}, project, DEFAULTS))[1]
    quarter = min(judged_in(command[:10_000]) for _ in range(3))
    whole = judged_in(command)
    assert whole < 9 * quarter + 0.02, f"{shape}: {quarter:.3f} s, then {whole:.3f} s"


@pytest.mark.parametrize("command", ["git branch feature", "git tag v1", "git branch -f main HEAD~1"])
def test_a_git_command_that_changes_refs_asks_and_runs_with_write_access(project, command):
    """Approved, it must be able to write .git: a read-only sandbox would make it fail."""
    decision = decide("bash", {"command": command}, project, DEFAULTS)
    assert decision.action == "ask" and decision.capability == "git.modify"
    assert not decision.read_only and decision.confine.write


# ------------------------------------------------- hostile lines under the user's own rules

def ruled(*rules):
    return [*DEFAULTS, *(Rule("process.execute", pattern, action, "u", "user") for pattern, action in rules)]


@pytest.mark.parametrize("command", [
    "dbus-run-session touch m", "dbus-run-session -- touch m", "tmux display-popup 'touch m'",
    "tmux popup -E 'touch m'", "tmux pipe-pane -o 'touch m'", "tmux if-shell 'touch m' ''",
    "tmux if -F 1 'touch m'", "tmux ls \\; run-shell 'touch m'", "tmux ls ';' run 'touch m'",
    "tmux ls\\; neww 'touch m'", "tmux -L s kill-server \\; new -d 'touch m'"])
def test_a_command_a_wrapper_or_tmux_runs_meets_the_users_deny(project, command):
    """A deny on `touch *` holds for the command a wrapper or a tmux command runs."""
    rules = ruled(("touch *", "deny"), ("dbus-run-session *", "allow"), ("tmux *", "allow"))
    assert bash(command, project, rules)["decision"] == "deny", command


@pytest.mark.parametrize("command", [
    "git fetch --upload-pack='touch m' ../other", "git fetch --upload-pack 'touch m' origin",
    "git pull --upload-pack 'touch m' ../other", "git ls-remote --upload-pack='touch m' ../other",
    "git clone -u 'touch m' ../other copy", "git clone --upl='touch m' ../other copy",
    "git push --receive-pack='touch m' ../other", "git push --exec='touch m' ../other main",
    "git archive --remote=../other --exec='touch m' HEAD"])
def test_the_program_git_starts_for_a_remote_on_this_machine_meets_the_users_deny(project, command):
    """For a remote that is a path, git runs --upload-pack or --receive-pack here, through a shell:
    with git allowed, `touch *` denied, `git fetch --upload-pack='touch m' ../other` ran it."""
    rules = [*DEFAULTS, *[Rule(capability, "git *", "allow", "u", "user")
                          for capability in ("process.execute", "network.access", "git.modify")],
             Rule("process.execute", "touch *", "deny", "u", "user")]
    assert bash(command, project, rules)["decision"] == "deny", command
    assert bash("git fetch -u origin", project, rules)["decision"] == "allow"


def test_git_with_another_exec_path_asks_even_where_git_is_allowed(project):
    """`git --exec-path=. lfs pull` runs ./git-lfs, the repository's own program: with git * allowed
    it ran unasked."""
    rules = [*DEFAULTS, *[Rule(capability, "git *", "allow", "u", "user")
                          for capability in ("process.execute", "network.access", "git.modify")]]
    for command in ("git --exec-path=. lfs pull", "git --exec-path=./bin status"):
        result = bash(command, project, rules)
        assert result["decision"] == "ask" and "exec-path" in result["destructive"], command
    assert bash("git status", project, rules)["decision"] == "allow"


@pytest.mark.parametrize("command", [
    "tar -xf a.tar --to-command='touch m'", "tar xf a.tar --to-command 'touch m'", "tar -xI 'touch m' -f a.tgz",
    "tar -cf a.tar --use-compress-program='touch m' src", "tar -cf a.tar -F 'touch m' src",
    "tar --checkpoint=1 --checkpoint-action=exec='touch m' -cf a.tar src",
    "tar --checkpoint --to-command='touch m' -xf a.tar", "sort --compress-program='touch m' f",
    "rg --pre touch x", "rg --pre=touch x", "fd -x touch m", "fd -e py --exec-batch sh -c 'touch m'",
    "git grep -O'touch m' x",
    # tar's old-style first word bundles options that take the next words (xIf CMD A), and GNU
    # takes any unambiguous prefix of a long option
    "tar xIf 'touch m' a.tar", "tar xfI a.tar 'touch m'", "tar cFf 'touch m' a.tar src",
    "tar xf a.tar --new-vol 'touch m'", "tar --rsh-c='touch m' -xf h:a.tar",
    "tar --use-comp 'touch m' -xf a.tar", "tar x --checkpoint-act=exec='touch m' -f a.tar",
    "tar --xattrs --to-command='touch m' -xf a.tar", "tar --list --to-command='touch m' -f a.tar",
    "tar --sparse -I 'touch m' -cf a.tar src"])
def test_a_command_an_option_of_tar_sort_rg_fd_or_git_grep_names_meets_the_users_deny(project, command):
    rules = ruled(("tar *", "allow"), ("sort *", "allow"), ("rg *", "allow"), ("fd *", "allow"),
                  ("git *", "allow"), ("touch *", "deny"))
    assert bash(command, project, rules)["decision"] == "deny", command
    for allowed in ("tar -czf a.tgz src", "tar -C out -xf a.tar", "tar --checkpoint -cf a.tar src"):
        assert bash(allowed, project, rules)["decision"] == "allow", allowed


@pytest.mark.parametrize("command", [
    "nix-shell --run 'touch m'", "nix-shell -p hello --comm 'touch m'", "vim -c '!touch m' f",
    "vim +'silent !touch m'", "nvim --cmd ':r !touch m'", "vim -c 'w !touch m' f"])
def test_the_shell_line_of_nix_shell_or_of_a_vim_ex_command_meets_the_users_deny(project, command):
    """nix-shell --run CMD and vim's `!CMD` run CMD in a shell: under a deny of touch they asked,
    and --yes approved them."""
    rules = ruled(("touch *", "deny"))
    assert bash(command, project, rules)["decision"] == "deny", command
    for other in ("nix-shell --run 'make test'", "vim -c 'set nu' f", "vim +10 f"):
        assert bash(other, project, rules)["decision"] == "ask", other
    # an allow of the program does not reach the line (nor offer "always": two things ask)
    allowed = bash(command, project, ruled(("nix-shell *", "allow"), ("vim *", "allow"),
                                           ("nvim *", "allow")))
    assert allowed["decision"] == "ask" and allowed["suggestion"] is None, allowed


@pytest.mark.parametrize("command", [
    "tar --create --file=config/prod.yml src", "tar --create --fil config/prod.yml src",
    "tar --cre -f config/prod.yml src", "tar --append --file config/prod.yml src",
    "tar -r --fi=config/prod.yml x", "tar --delete --file=config/prod.yml x",
    "tar --extract --dir=config -f a.tar", "tar -x --directory config -f a.tar",
    "tar --extract --fil=a.tar -C config", "tar --get --file a.tar --dir config",
    "tar xf a.tar --dir config", "tar --exclude x --extract --file a.tar --directory config",
    "tar -g config/prod.yml -cf a2.tar src", "tar cgf config/prod.yml a2.tar src",
    "tar --listed=config/prod.yml -cf a.tar src", "tar -v --index-file config/prod.yml -cf a.tar .",
    "patch --dir=config -p1 < fix.diff", "patch --in=fix.diff --dir config",
    "patch --inp fix.diff -d config", "patch --out=config/prod.yml f fix.diff",
    "patch --backup-if-mismatch --out=config/prod.yml f fix.diff",
    "patch --backup-if-mismatch --dir=config -p1 < fix.diff",
    "time -o config/prod.yml patch -p1 < fix.diff"])
def test_a_deny_of_a_write_meets_tar_and_patch_by_their_long_options(project, command):
    """Where tar and patch write was read from their short options (tar -c -f OUT, -x -C DIR,
    patch -d DIR -i D) and a few long ones spelled out: `tar --create --file OUT`, `--dir=DIR` and
    `patch --in=D --dir=DIR` (GNU takes any unambiguous prefix) wrote a file a deny protects, and
    only asked; so did tar's snapshot and index files (-g F, --index-file F) and a patch wrapped
    by `time -o F`."""
    import tarfile
    (project / "config").mkdir()
    (project / "prod.yml").write_text("a: 1\n")
    with tarfile.open(project / "a.tar", "w") as archive:
        archive.add(project / "prod.yml", "prod.yml")
    (project / "fix.diff").write_text("--- a/prod.yml\t2020\n+++ b/prod.yml\n@@ -1 +1 @@\n")
    denied = Rule("file.write.project", "config/prod.yml", "deny", "u", "user", glob=True)
    rules = [*DEFAULTS, denied]
    assert bash(command, project, rules)["decision"] == "deny", command
    for other in ("tar --extract --file=a.tar", "tar --list --file=a.tar --directory=config",
                  "tar --create --file=a2.tar config", "patch --dir=src -p1 < fix.diff",
                  "patch -p1 < fix.diff", "patch --ifdef config/prod.yml -i fix.diff"):
        assert bash(other, project, rules)["decision"] == "ask", other


SSH_RULES = [Rule("network.access", f"{program} *", "allow", "u", "user")
             for program in ("ssh", "scp", "sftp", "rsync")]


@pytest.mark.parametrize("command", [
    "ssh -o ProxyCommand='touch m' h", "ssh -oProxyCommand='touch m' h", "ssh -o 'ProxyCommand touch m' h",
    "ssh -o proxycommand=touch h", "ssh -o LocalCommand='touch m' -o PermitLocalCommand=yes h",
    "ssh -o KnownHostsCommand='touch m' h", "scp -o ProxyCommand='touch m' a h:b", "scp -S touch a h:b",
    "sftp -S touch h", "rsync -e 'touch m' a h:b", "rsync -avze 'touch m' a h:b",
    "rsync --rsh='touch m' a h:b", "rsync --rs 'touch m' a h:b",
    "rsync -e \"ssh -o ProxyCommand='touch m'\" a h:b"])
def test_a_command_ssh_or_rsync_runs_here_meets_the_users_deny(project, command):
    """With ssh, scp, sftp and rsync allowed to reach the network, a ProxyCommand, scp's -S program
    or rsync's -e command ran here unread: `touch *` was denied, and they ran it."""
    rules = [*DEFAULTS, *SSH_RULES, Rule("process.execute", "touch *", "deny", "u", "user")]
    assert bash(command, project, rules)["decision"] == "deny", command


def test_ssh_and_rsync_as_allowed_still_run_and_a_config_of_unknown_commands_asks(project):
    rules = [*DEFAULTS, *SSH_RULES]
    for command in ("ssh h ls", "ssh -p 22 -i key -F /dev/null h", "rsync -av -e 'ssh -p 2222' a h:b",
                    "rsync --rsh='ssh -i key' a h:b", "scp -P 22 a h:b"):
        assert bash(command, project, rules)["decision"] == "allow", command
    for command in ("ssh -F ./ssh_config h", "rsync -e 'ssh -F ./c' a h:b", "scp -S ./myssh a h:b"):
        assert bash(command, project, rules)["decision"] == "ask", command


@pytest.mark.parametrize("command", [
    "tmux set-hook -g session-created 'run-shell \"touch m\"'", "tmux bind-key x run-shell 'touch m'",
    "tmux source-file x.conf", "tmux command-prompt 'run-shell %%'", "tmux ls \\; confirm 'run touch'",
    "tmux set -g default-command 'touch m'", "tmux display-menu T x 'run-shell \"touch m\"'"])
def test_tmux_commands_kept_to_run_later_ask_even_where_tmux_is_allowed(project, command):
    """A hook, a key binding, a sourced file or a prompt holds tmux commands (run-shell among them)
    the judge does not read: under `tmux *` they asked nothing, while `touch *` was denied."""
    rules = ruled(("touch *", "deny"), ("tmux *", "allow"))
    assert bash(command, project, rules)["decision"] == "ask", command
    assert bash("tmux ls \\; kill-server", project, rules)["decision"] == "allow"


@pytest.mark.parametrize("command", [
    "timeout 5 touch m", "env touch m", "env -S 'touch m'", "env -i PATH=/bin touch m",
    "nice -n 5 touch m", "stdbuf -oL touch m", "time touch m", "nohup touch m", "xargs touch < f",
    "timeout 5 python3 -c 'open(\"m\", \"w\")'", "timeout -k 1 5 env touch m", "numactl -C 0 touch m",
    "valgrind --tool=memcheck touch m", "faketime 2020-01-01 touch m", "proot -r / touch m",
    "fakeroot touch m"])
def test_an_allow_that_names_only_a_wrapper_does_not_reach_what_it_runs(project, command):
    """`timeout *` or `env *` allowed, to stop asking about timeouts, let `timeout 5 touch m` run
    unasked: the wrapped command is judged as if it stood alone."""
    wrappers = ("timeout *", "env *", "nice *", "stdbuf *", "time *", "nohup *", "xargs *", "numactl *",
                "valgrind *", "faketime *", "proot *", "fakeroot *")
    rules = ruled(*[(pattern, "allow") for pattern in wrappers])
    assert bash(command, project, rules)["decision"] == "ask", command


@pytest.mark.parametrize("command", [
    "time -o m ls", "time --output=m ls", "time --out m ls", "time -ao m ls", "time -a -o m sort f",
    "strace -o m ls", "time -o m patch -p1 < f.diff", "time -o m strace -o m2 ls",
    "valgrind --log-file=m ls", "valgrind --xml-file=m ls", "fakeroot -s m ls"])
def test_a_wrappers_output_file_is_a_write_even_where_the_wrapper_is_allowed(project, command):
    """`time -o F ls` under an allow of `time *` ran unasked and wrote F (ls alone is read-only,
    and sort or patch had rules of their own): the file a wrapper writes is judged as a
    redirection's is, and asks unless a rule allows writing it."""
    wrappers = ("time", "strace", "sort", "patch", "valgrind", "fakeroot")
    rules = ruled(*[(f"{name} *", "allow") for name in wrappers])
    assert bash(command, project, rules)["decision"] == "ask", command
    writes = [*rules, *(Rule("file.write.project", f, "allow", "u", "user") for f in ("m", "m2"))]
    assert bash(command, project, writes)["decision"] == "allow", command


def test_valgrinds_options_are_read_whole_as_valgrind_reads_them(project):
    """valgrind takes no abbreviated option: `--xml=yes` turns XML on and names no file (it was
    read as `--xml-file=yes`, a file written, so the line asked under an allow of valgrind)."""
    rules = ruled(("valgrind *", "allow"))
    for command in ("valgrind --xml=yes --xml-fd=2 ls", "valgrind --log-fd=2 ls"):
        assert bash(command, project, rules)["decision"] == "allow", command
    assert bash("valgrind --xml=yes --xml-file=m ls", project, rules)["decision"] == "ask"


def test_an_allow_that_names_the_wrapped_command_still_allows_it(project):
    rules = ruled(("timeout *", "allow"), ("timeout 5 touch *", "allow"), ("make *", "allow"),
                  ("env -S 'touch m'", "allow"), ("/usr/bin/touch *", "allow"))
    for command in ["timeout 5 touch m", "timeout 9 make test", "timeout 5 ls -la", "env -S 'touch m'",
                    "/usr/bin/touch m"]:
        assert bash(command, project, rules)["decision"] == "allow", command
    assert bash("timeout 5 tou*", project, rules)["decision"] == "ask"


@pytest.mark.parametrize("command", [
    "export GIT_PAGER='touch m'; git log", "export GIT_CONFIG_COUNT=0; git status",
    "declare -x GIT_EXTERNAL_DIFF=./x; git diff", "typeset -x LESSOPEN='|touch m'; ls",
    "readonly PAGER='touch m'; git log", "GIT_PAGER='touch m'; git log", "unset GIT_CONFIG_COUNT; git status",
    "read GIT_PAGER <<< 'touch m'; git log", "printf -v GIT_PAGER 'touch m'; git log",
    "export LD_PRELOAD=./x.so\nls", "export BASH_ENV=./x; bash -c ls", "mapfile -t X < f; git log",
    "shopt -s expand_aliases\nalias ls='touch m'\nls", "hash -p ./x ls; ls", "enable -f ./x.so ls; ls",
    "export NODE_OPTIONS='-r ./x' && npm test"])
def test_a_command_after_a_statement_that_changes_what_it_runs_asks(project, command):
    """An export (or declare, read, unset, alias, hash ...) the user allowed changes what a later
    command does (GIT_PAGER, LD_PRELOAD, hash -p): that command no longer runs unasked."""
    allowed = "export declare typeset readonly 'GIT_PAGER=* unset read printf mapfile shopt alias hash enable"
    rules = ruled(*((f"{name} *", "allow") for name in allowed.split()), ("npm test *", "allow"))
    first = re.split(r";|\n|&&", command)[0]
    assert bash(first, project, rules)["decision"] == "allow", first
    assert bash(command, project, rules)["decision"] == "ask", command


def test_an_alias_runs_what_it_stands_for(project):
    rules = ruled(("touch *", "deny"), ("alias *", "allow"))
    assert bash("alias ll='touch m'", project, rules)["decision"] == "deny"


@pytest.mark.parametrize("command", [
    "${X:-ls}", '"${X:-ls}"', "${X:-touch} m", "$(echo touch) m", '"$(echo touch)" m', "`echo ls`",
    "a=ls; $a", "for c in ls; do $c; done", "set -- ls; $1"])
def test_a_command_word_made_by_an_expansion_never_runs_unasked(project, command):
    """${X:-ls} runs $X when it is set; whatever the word expands to, no rule allows it unasked."""
    rules = ruled(("ls *", "allow"), ("touch *", "allow"), ("a=ls", "allow"), ("set *", "allow"))
    result = bash(command, project, rules)
    assert result["decision"] == "ask", (command, result)


ESCAPE_RULES = ("git log *", "git *", "find *", "awk *", "less *", "zip *", "vim *", "sort *", "sed *")


@pytest.mark.parametrize("command", [
    "git log --output=m", "git log --output m", "git diff --output=m HEAD", "git log -p --ext-diff",
    "git show --ext-diff HEAD", "find . -fprint m", "find . -name x -fprintf m %p", "find . -fls m",
    "awk 'BEGIN{system(\"touch m\")}'", "awk '{print | \"sh\"}' f", "awk '{print $1 > \"m\"}' f",
    "awk -f prog.awk f", "less '+!touch m' f", "vim -S x.vim f", "zip -T -TT 'touch m' a.zip f", "zip --unzip-command='touch m' -T a.zip f",
    "sort -o m f", "sort -ro m f", "sort --out=m f", "sed -n 'w m' f", "sed 's/a/b/gw m' f"])
def test_an_allow_naming_the_program_does_not_reach_its_options_that_write_or_run(project, command):
    """`git log *` (Bash(git log:*)), `find *`, `awk *` … allowed let `git log --output=F`, `find
    -fprint F`, `awk 'BEGIN{system(...)}'`, `less '+!CMD'`, `vim -c '!CMD'`, `zip -TT CMD` run
    unasked; they ask, and "always" saves the exact command."""
    rules = ruled(*[(pattern, "allow") for pattern in ESCAPE_RULES])
    result = bash(command, project, rules)
    assert result["decision"] == "ask", (command, result)
    assert result["suggestion"] == permissions._escape(shlex.join(shlex.split(command)))


def test_an_allow_that_names_the_option_reaches_it(project):
    rules = ruled(*[(pattern, "allow") for pattern in ESCAPE_RULES],
                  ("git log --output=* *", "allow"), ("sort -o *", "allow"), ("find . -fprint *", "allow"),
                  ("awk 'BEGIN{system(\"ls\")}'", "allow"), ("*", "allow"))
    for command in ("git log --output=m", "sort -o m f", "find . -fprint m", "awk 'BEGIN{system(\"ls\")}'",
                    "git log --oneline", "awk '$1 > 5 || $2 {print $1}' f", "less f", "vim f", "zip a.zip f",
                    "sort -r f", "sed 's/w/x/' f", "vim +10 f", "vim + f", "less +5 f",
                    "git format-patch --output=m -1"):
        assert bash(command, project, rules[:-1])["decision"] == "allow", command
    # Bash(*) allows everything, these too
    assert bash("vim -c '!touch m' f", project, rules)["decision"] == "allow"
    # and a deny of the command a wrapper runs still holds where the allow names the wrapper
    denied = ruled(("timeout 5 git log *", "allow"), ("git log --output*", "deny"))
    assert bash("timeout 5 git log --output=m", project, denied)["decision"] == "deny"


@pytest.mark.parametrize("command", [
    "man ./page.1", "man docs/x.5", "sha256sum -c SUMS", "md5sum --check SUMS", "b2sum -wc SUMS",
    "jq -n '\"x\" | modulemeta'", "jq -n get_search_list"])
def test_a_read_beyond_what_the_command_names_asks(project, command):
    """`man ./page.1` (its .so requests include other files), `sha256sum -c SUMS` (it reads the
    files SUMS lists) and jq's modulemeta (modules on its search path) ran as provably read-only."""
    assert bash(command, project)["decision"] == "ask", command
    for command in ("man ls", "man 1 ls", "sha256sum src/app.py", "jq . src/app.py"):
        assert bash(command, project)["decision"] == "allow", command


def test_a_secret_file_a_command_makes_or_looks_at_is_no_read_of_it(project):
    """cp .env.example .env with no .env yet, test -f .env: no bytes of a secret to read, so --yes
    may approve them (the kernel keeps the secret files closed to it). An existing .env written
    over, a read beside the copy, git's object of it, a stdin from it still open the secrets."""
    (project / ".env").unlink()
    (project / ".env.example").write_text("KEY=changeme\n")

    def secrets(command):
        return decide("bash", {"command": command}, project, DEFAULTS).confine.secrets

    def action(command, rules=DEFAULTS):
        return decide("bash", {"command": command}, project, rules).action
    assert not secrets("cp .env.example .env")
    assert not secrets("test -f .env || cp .env.example .env")
    assert action("test -f .env") == "allow"
    assert secrets("git show HEAD:.env > .env") and secrets("cp .env.example .env; cat .env")
    (project / ".env").write_text("KEY=1\n")
    assert action("[ -s .env ]") == "allow" and secrets("[ -s .env ] < .env")
    assert secrets("cp .env.example .env") and secrets("chmod 600 .env")
    deny = load_rules([("user", {"permissions": [
        {"capability": "file.read", "pattern": ".env", "action": "deny"}]})])
    assert action("test -f .env", deny) == "deny"
