"""Claude Code's permission settings, read as they are: the rule syntax against Claude Code's own
documentation examples (tests/data/claude_rules.json), the precedence (a deny is never lost), the
trust model for the repository's files, and `khaelor permissions` naming each rule's file and line."""
import json
import re
from pathlib import Path

import pytest

import permissions
import tools

DATA = json.loads((Path(__file__).parent / "data" / "claude_rules.json").read_text())["rules"]
OPERATORS = re.compile(r"&&|\|\||;|\||\$")


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KHAELOR_HOME", str(tmp_path / "khaelor-home"))
    project = tmp_path / "project"
    (project / ".git").mkdir(parents=True)
    return project


def rules_from(root, action, *rules):
    text = json.dumps({"permissions": {action: list(rules)}}, indent=2)
    layer = permissions.claude_layer("settings.json", text, root)
    return layer, permissions.load_rules([layer])


def decision(root, tool, subject, rules):
    tool_input = {"command": subject}
    if tool != "bash":
        tool_input = {"file_path": subject, "content": "", "old_string": "a", "new_string": "b"}
    return permissions.decide(*tools.permission_subject(tool, tool_input), root, rules).action


@pytest.mark.parametrize("action", ["allow", "deny"])
def test_a_rule_with_quoted_words_matches_the_command_it_names(root, action):
    """Bash(git commit -m "fix bug") names that command in either quoting; the words without
    their quotes are another command, and an unmatched quote is kept as written."""
    _, rules = rules_from(root, action, 'Bash(git commit -m "fix bug")',
                          "Bash(python3 -c 'print(1)')", 'Bash(touch "open)')
    for command in ('git commit -m "fix bug"', "git commit -m 'fix bug'",
                    "python3 -c 'print(1)'", 'python3 -c "print(1)"'):
        assert decision(root, "bash", command, rules) == action, command
    for command in ("git commit -m fix bug", "python3 -c print(1)", "touch open"):
        assert decision(root, "bash", command, rules) == "ask", command


def tool_of(rule: str) -> str:
    name = rule.split("(")[0]
    return {"Bash": "bash", "Read": "read", "Edit": "edit", "Write": "write"}.get(name, "")


def subject_and_home(example: str, monkeypatch) -> str:
    match = re.fullmatch(r"(.*) \(HOME=(.*)\)", example)
    if match:
        monkeypatch.setenv("HOME", match[2])
        return match[1]
    return example


@pytest.mark.parametrize("case", [c for c in DATA if tool_of(c["rule"])], ids=lambda c: c["rule"])
def test_each_documented_rule_denies_what_it_matches_and_nothing_else(root, case, monkeypatch):
    tool = tool_of(case["rule"])
    _, deny = rules_from(root, "deny", case["rule"])
    _, allow = rules_from(root, "allow", case["rule"])
    for example in case["matches"]:
        subject = subject_and_home(example, monkeypatch)
        assert decision(root, tool, subject, deny) == "deny", (case["rule"], subject)
    for example in case["does_not_match"]:
        subject = subject_and_home(example, monkeypatch)
        if tool == "bash" and case["rule"] == f"Bash({subject} *)":
            continue    # the bare command under "cmd *": the docs do not say; a deny here also covers it
        if tool == "bash" and OPERATORS.search(subject):
            # a compound line: the rule must not grant it (a deny of one part still denies it all)
            assert decision(root, tool, subject, allow) != "allow", (case["rule"], subject)
        else:
            assert decision(root, tool, subject, deny) != "deny", (case["rule"], subject)


@pytest.mark.parametrize("case", [c for c in DATA if not tool_of(c["rule"])], ids=lambda c: c["rule"])
def test_rules_for_tools_khaelor_lacks_are_listed_as_ignored_with_the_reason(root, case):
    layer, rules = rules_from(root, "allow", case["rule"])
    assert layer.rules == ()
    assert [entry[1] for entry in layer.ignored] == [case["rule"]] and layer.ignored[0][2]
    assert rules == permissions.default_rules()


def test_a_deny_is_never_lost_to_an_allow_in_any_layer(root):
    """deny > ask > allow for Claude Code's rules, whatever file or KHAELOR layer allows."""
    (root / "secrets").mkdir()
    text = json.dumps({"permissions": {"allow": ["Read", "Bash(cat *)"], "deny": ["Read(./secrets/**)"]}})
    claude = permissions.claude_layer("a/settings.json", text, root)
    ours = permissions.Layer("u/config.json", {"permissions": [
        {"capability": "*", "pattern": "*", "action": "allow"}]})
    rules = permissions.load_rules([claude, ours])
    assert decision(root, "read", "secrets/api.key", rules) == "deny"
    assert decision(root, "bash", "cat secrets/api.key", rules) == "deny"
    assert decision(root, "read", "src/app.py", rules) == "allow"


def test_ask_beats_allow_and_wrappers_do_not_hide_a_deny(root):
    text = json.dumps({"permissions": {"allow": ["Bash(git *)"], "ask": ["Bash(git push *)"],
                                       "deny": ["Bash(rm *)"]}})
    rules = permissions.load_rules([permissions.claude_layer("s.json", text, root)])
    assert decision(root, "bash", "git commit -m x", rules) == "allow"
    assert decision(root, "bash", "git push origin main", rules) == "ask"
    for wrapped in ("timeout 5 rm -rf build", "nice -n 5 rm x", "sudo rm x", "env A=1 rm x"):
        assert decision(root, "bash", wrapped, rules) == "deny", wrapped


def test_an_untrusted_repository_settings_file_tightens_but_grants_nothing(root):
    text = json.dumps({"permissions": {"allow": ["Bash"], "deny": ["Bash(make *)"]}})
    layer = permissions.claude_layer(".claude/settings.json", text, root, "project", trusted=False)
    rules = permissions.load_rules([layer])
    assert decision(root, "bash", "npm test", rules) == "ask"
    assert decision(root, "bash", "make all", rules) == "deny"
    assert [r.pattern for r in permissions.untrusted_grants([layer])] == ["*", "*", "*"]


def test_bad_settings_never_stop_khaelor(root):
    for text in ("{not json", '{"permissions": []}', '{"permissions": {"allow": "Bash"}}', '[]'):
        layer = permissions.claude_layer("s.json", text, root)
        assert layer.ignored and layer.rules == ()
        assert permissions.load_rules([layer]) == permissions.default_rules()


def test_a_permissions_key_khaelor_does_not_read_is_listed_as_ignored(root):
    """A misspelt "alow" granted nothing without a word."""
    text = json.dumps({"permissions": {"alow": ["Bash(make *)"], "deny": ["Bash(rm *)"],
                                       "defaultMode": "acceptEdits"}})
    layer = permissions.claude_layer("s.json", text, root)
    assert {(rule.pattern, rule.action) for rule in layer.rules} == {("rm *", "deny")}
    ignored = {rule: why for _, rule, why in layer.ignored}
    assert set(ignored) == {"permissions.alow", "permissions.defaultMode"}
    assert "allow, ask and deny" in ignored["permissions.alow"]


def test_a_project_that_works_with_claude_code_works_unchanged(khaelor, project, env):
    """The repository's .claude/settings.json and a Claude-style block pasted into
    .khaelor/config.json; `khaelor permissions` names the file and line of every rule; the
    repository's allows apply once trusted; the user's ~/.claude/settings.json is the user's."""
    (project / ".claude").mkdir()
    settings = {"permissions": {"allow": ["Bash(npm run test:*)", "Edit(src/**)"],
                                "deny": ["Read(./secrets/**)", "WebFetch(domain:example.com)"]}}
    (project / ".claude" / "settings.json").write_text(json.dumps(settings, indent=2))
    (project / ".khaelor").mkdir()
    (project / ".khaelor" / "config.json").write_text(json.dumps({"permissions": {"deny": ["Bash(make *)"]}}))
    user = Path(env["HOME"]) / ".claude"
    user.mkdir(parents=True)
    (user / "settings.json").write_text(json.dumps({"permissions": {"allow": ["Bash(make lint)"]}}))

    def check(*what):
        result = khaelor.run("permissions", "check", "--json", *what)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    assert check("--bash", "npm run test")["decision"] == "ask"          # not trusted yet
    assert check("--read", "secrets/db.key")["decision"] == "deny"       # tightening applies at once
    assert check("--bash", "make all")["decision"] == "deny"
    listing = khaelor.run("permissions").stdout
    assert f"{project / '.claude' / 'settings.json'}:4" in listing      # the line of "Bash(npm run test:*)"
    assert "WebFetch(domain:example.com)" in listing and "no web tool" in listing
    assert khaelor.run("trust", "--yes").returncode == 0
    assert check("--bash", "npm run test -- --watch")["decision"] == "allow"
    assert check("--write", "src/app.py")["decision"] == "allow"
    assert check("--read", "secrets/db.key")["decision"] == "deny"
    assert check("--bash", "make lint")["decision"] == "deny"     # the repository's deny outranks the user's allow


def test_a_path_rule_with_brackets_also_means_the_file_as_written(root):
    """Next.js routes: `Edit(app/[slug]/page.tsx)` denies that very file (the glob's character
    class alone would match `app/s/page.tsx` and miss it)."""
    _, rules = rules_from(root, "deny", "Edit(app/[slug]/page.tsx)")
    assert decision(root, "edit", "app/[slug]/page.tsx", rules) == "deny"
    assert decision(root, "edit", "app/s/page.tsx", rules) == "deny"
    assert decision(root, "edit", "app/other/page.tsx", rules) != "deny"


def test_a_path_rule_covers_a_directory_as_gitignore_does_and_a_search_of_it(root):
    """`Read(./secrets)` names the directory and all in it; `Read(config/)` a directory at any
    depth; `Read(./secrets/**)` every entry of secrets, so a grep, a glob or a listing of the
    directory itself reads only what the rule denies (the documented example: a grep of secrets
    once printed its keys), and a name with a newline in it is still in it."""
    (root / "secrets" / "prod").mkdir(parents=True)
    (root / "app" / "config").mkdir(parents=True)
    (root / "src").mkdir()
    for rule in ("Read(./secrets)", "Read(./secrets/**)", "Read(secrets/)", "Read(./secrets/*)"):
        _, rules = rules_from(root, "deny", rule, "Read(config/)")
        for tool, tool_input in [("read", {"file_path": "secrets/prod/db.key"}),
                                 ("read", {"file_path": "secrets/db\n.key"}),
                                 ("read", {"file_path": "app/config/x.yml"}),
                                 ("grep", {"pattern": "KEY", "path": "secrets"}),
                                 ("grep", {"pattern": "KEY", "path": "secrets/prod"}),
                                 ("glob", {"pattern": "secrets/*"}),
                                 ("bash", {"command": "grep -r KEY secrets"}),
                                 ("bash", {"command": "ls app/config"})]:
            subject = tools.permission_subject(tool, tool_input)
            assert permissions.decide(*subject, root, rules).action == "deny", (rule, tool_input)
        for tool, tool_input in [("grep", {"pattern": "KEY", "path": "src"}),
                                 ("read", {"file_path": "secrets.md"})]:
            subject = tools.permission_subject(tool, tool_input)
            assert permissions.decide(*subject, root, rules).action != "deny", (rule, tool_input)


def test_a_legacy_prefix_rule_ends_at_a_word_not_inside_one(root):
    """Bash(kill:*) is `kill` and `kill -9 1`, as Claude Code reads it (like Bash(kill *)), never
    killall; Bash(kill*) without the colon stays a plain prefix. Claude Code's matcher ends every
    `:*` prefix at a word, so an allow of curl http://x/:* grants no other URL; its docs read it
    as a plain prefix, which a deny keeps (it catches more)."""
    _, rules = rules_from(root, "allow", "Bash(kill:*)", "Bash(ls*)", "Bash(curl http://x.test/:*)")
    for command in ("kill", "kill -9 1", "lsof", "ls -la", "curl http://x.test/", "curl http://x.test/ -v"):
        assert decision(root, "bash", command, rules) == "allow", command
    for command in ("killall python", "killx", "curl http://x.test/a", "curl http://x.test/.evil.example"):
        assert decision(root, "bash", command, rules) == "ask", command
    _, rules = rules_from(root, "deny", "Bash(curl http://x.test/:*)")
    assert decision(root, "bash", "curl http://x.test/a", rules) == "deny"


WRITES_OF_A_DENIED_FILE = [
    "cp x config/prod.yml", "mv x config/prod.yml", "tee config/prod.yml", "tee -a config/prod.yml",
    "sed -i s/a/b/ config/prod.yml", "sed -i.bak -e s/a/b/ config/prod.yml", "touch config/prod.yml",
    "rm -f config/prod.yml", "truncate -s0 config/prod.yml", "dd if=x of=config/prod.yml",
    "install -m 644 x config/prod.yml", "ln -sf x config/prod.yml", "chmod 600 config/prod.yml",
    "git checkout -- config/prod.yml", "git restore config/prod.yml", "patch config/prod.yml",
    "perl -i -pe s/a/b/ config/prod.yml", "perl -pi -e s/a/b/ config/prod.yml",
    "rsync -a x config/prod.yml", "sudo cp x config/prod.yml", "cd config && cp ../x prod.yml",
    "cp x migrations/001.sql", "uniq a migrations/001.sql",
]


def test_a_denied_edit_is_denied_to_every_command_that_writes_the_file(root):
    """Edit(./config/prod.yml) denied `echo x > config/prod.yml` but only asked for cp, sed -i,
    dd of=, git restore ... of it, so --yes or a hurried "y" wrote it (anthropics/claude-code
    #70369). A copy from it is a read, and a write elsewhere asks as before."""
    (root / "config").mkdir()
    (root / "config" / "prod.yml").write_text("a: 1\n")
    _, rules = rules_from(root, "deny", "Edit(./config/prod.yml)", "Edit(./migrations/**)")
    for command in WRITES_OF_A_DENIED_FILE:
        assert decision(root, "bash", command, rules) == "deny", command
    for command in ("cp config/prod.yml backup.yml", "cp x config/dev.yml", "sed -i s/a/b/ src/a",
                    "dd if=config/prod.yml of=x", "tar -xf a.tar", "rsync -a migrations/ /tmp/m"):
        assert decision(root, "bash", command, rules) == "ask", command
    assert decision(root, "bash", "sed -n 1p config/prod.yml", rules) == "allow"
    # (a command that also destroys work names the rule that denied it, not the question it skips)
    denied = permissions.decide("bash", {"command": "git restore config/prod.yml"}, root, rules)
    assert denied.reason.startswith('deny file.write.project "config/prod.yml"'), denied.reason


WRITES_INTO_A_DENIED_DIRECTORY = [
    "cp prod.yml config/", "cp prod.yml config", "cp src/prod.yml config", "mv prod.yml config/",
    "install prod.yml config/", "ln -s prod.yml config/", "ln -s ../prod.yml config/",
    "rsync prod.yml config/", "scp prod.yml config/", "cp -t config prod.yml", "cp -tconfig prod.yml",
    "mv -t config prod.yml", "install -t config prod.yml", "ln -st config ../prod.yml",
    "cp --target-directory=config prod.yml", "mv --target config prod.yml", "mv config/prod.yml x",
    "git -C . checkout -- config/prod.yml", "git -C config restore prod.yml",
    "git -C src -C ../config restore prod.yml", "git --work-tree=. checkout -- config/prod.yml",
    "git --work-tree=config checkout -- prod.yml", "GIT_WORK_TREE=config git checkout -- prod.yml",
    "git -c core.worktree=config checkout -- prod.yml", "find . -fprint config/prod.yml",
    "find . -fprintf config/prod.yml %p", "find . -fls config/prod.yml", "find . -fprint0 config/prod.yml",
    "git log --output=config/prod.yml", "git diff --output config/prod.yml", "git -C config show --output=prod.yml",
    "git archive -o config/prod.yml HEAD", "sort -o config/prod.yml f", "sort -ro config/prod.yml f",
    "sort --out=config/prod.yml f", "shuf -o config/prod.yml f", "curl -o config/prod.yml http://x",
    "wget -O config/prod.yml http://x", "perl -lpi -e s/a/b/ config/prod.yml", "sed -ni 1p config/prod.yml",
    "chmod -w config/prod.yml", "sed -n '/a/w config/prod.yml' f", "sed 's/a/b/gw config/prod.yml' f",
    "patch -p1 < fix.diff", "patch -i fix.diff", "patch -o config/prod.yml f fix.diff",
    "time -o config/prod.yml ls", "sudo time -o config/prod.yml make", "strace -f -o config/prod.yml ls",
    "ltrace --output=config/prod.yml ls",
]


def test_a_denied_edit_meets_a_write_into_its_directory_by_option_or_through_git_s_directory(root):
    """Edit(./config/prod.yml) denied `cp x config/prod.yml` but only asked for `cp prod.yml config/`,
    `cp -t config prod.yml`, `git -C config restore prod.yml`, `find -fprint`, `sort -o`, `git log
    --output=`: the file a command writes is named by a directory, an option, or git's own -C."""
    (root / "config").mkdir()
    (root / "config" / "prod.yml").write_text("a: 1\n")
    (root / "src").mkdir()
    (root / "fix.diff").write_text("--- a/config/prod.yml\t2020\n+++ b/config/prod.yml\n@@ -1 +1 @@\n")
    _, rules = rules_from(root, "deny", "Edit(./config/prod.yml)", "Edit(./600)", "Edit(./fix.diff)")
    for command in WRITES_INTO_A_DENIED_DIRECTORY:
        assert decision(root, "bash", command, rules) == "deny", command
    # a copy of another file, a mode, a diff patch reads, and perl -M or a sed script with an i in it
    # write none of these
    for command in ("cp -t config dev.yml", "cp dev.yml config/", "git -C config restore dev.yml",
                    "find . -fprint config/dev.yml", "chmod 600 f", "chown 600 f", "patch f fix.diff",
                    "perl -Mstrict -e 1 config/prod.yml", "sed -e s/i/x/ config/prod.yml",
                    "git --work-tree=config checkout -- config/prod.yml", "rsync -t x config/dev.yml"):
        assert decision(root, "bash", command, rules) == "ask", command


def test_a_denied_edit_meets_a_tree_copied_or_moved_over_it(root):
    """`cp -r sub config/` writes config/sub/x: Edit(./config/sub/x) denied it, and it only asked;
    so did `cp *.yml config/` for config/new.yml, and `rm -rf config`, `git checkout -- config`."""
    for directory in ("config/sub/deep", "sub/deep"):
        (root / directory).mkdir(parents=True)
    (root / "sub" / "deep" / "x").write_text("1")
    (root / "config" / "sub" / "deep" / "x").write_text("1")
    (root / "new.yml").write_text("")
    _, rules = rules_from(root, "deny", "Edit(./config/sub/deep/x)", "Edit(./new/deep/x)",
                          "Edit(./config/new.yml)")
    for command in ("cp -r sub config/", "cp -r sub config", "cp -a sub/ config", "mv sub config/",
                    "rsync -a sub config/", "rsync -a sub/ config/sub", "cp -r sub new", "mv sub new",
                    "rsync -a sub/ new", "scp -r sub config/", "cp *.yml config/", "mv -t config n*.yml",
                    "rm -rf config", "chmod -R a-w config/", "git checkout -- config", "git restore ."):
        assert decision(root, "bash", command, rules) == "deny", command
    for command in ("rsync -a sub new", "cp -r sub other", "ln -s ../sub config/", "cp -r sub/deep config/",
                    "rm config", "chmod a-w config", "cp new.yml config/sub/"):
        assert decision(root, "bash", command, rules) == "ask", command


def test_a_denied_edit_meets_what_an_archive_is_extracted_into_or_made_as(root):
    """`tar -xf a.tar -C config` and `unzip a.zip -d config` wrote config/prod.yml, and `tar -cf
    config/prod.yml src` made it: Edit(./config/prod.yml) only asked. The members are read from
    the archive (a compressed tar's are not: finding them means inflating it, and a repository's
    few KB of xz can inflate to gigabytes, so those extractions only ask)."""
    import tarfile
    import zipfile
    (root / "config").mkdir()
    (root / "prod.yml").write_text("a: 1\n")
    for name, mode in (("a.tar", "w"), ("a.tgz", "w:gz")):
        with tarfile.open(root / name, mode) as archive:
            archive.add(root / "prod.yml", "prod.yml")
    with zipfile.ZipFile(root / "a.zip", "w") as archive:
        archive.write(root / "prod.yml", "prod.yml")
    _, rules = rules_from(root, "deny", "Edit(./config/prod.yml)")
    for command in ("tar -xf a.tar -C config", "tar xfC a.tar config", "tar -C config -xf a.tar",
                    "tar --extract --file=a.tar --directory=config", "unzip a.zip -d config",
                    "unzip -o a.zip -d config", "tar -cf config/prod.yml src", "tar cf config/prod.yml src",
                    "zip config/prod.yml src"):
        assert decision(root, "bash", command, rules) == "deny", command
    for command in ("tar -xf a.tar", "tar -tf a.tar -C config", "unzip -l a.zip -d config",
                    "unzip a.zip", "tar -cf a2.tar config", "zip -r a2.zip config",
                    "tar -xzf a.tgz -C config"):
        assert decision(root, "bash", command, rules) == "ask", command


def test_a_claude_prefix_rule_does_not_reach_the_programs_options_that_write_or_run(root):
    """Bash(git log:*) allowed `git log --output=F` and Bash(find:*) `find -fprint F` unasked."""
    _, rules = rules_from(root, "allow", "Bash(git log:*)", "Bash(find:*)", "Bash(awk:*)",
                          "Bash(git diff --output=*)")
    for command in ("git log --output=x", "git log -p --ext-diff", "find . -fprint x",
                    "awk 'BEGIN{system(\"ls\")}'"):
        assert decision(root, "bash", command, rules) == "ask", command
    for command in ("git log --oneline", "find . -name x", "awk '{print $1}' f", "git diff --output=x"):
        assert decision(root, "bash", command, rules) == "allow", command


def test_a_denied_read_meets_git_reading_the_file_from_its_objects(root):
    """Read(./secrets/**) denied `cat secrets/key` but `git show HEAD:secrets/key` printed it from
    git's objects, where the sandbox's hiding of secrets/ does not reach; `git -C sub diff token`
    read sub/token, not ./token."""
    (root / "secrets").mkdir()
    (root / "sub").mkdir()
    _, rules = rules_from(root, "deny", "Read(./secrets/**)", "Read(./sub/token)")
    for command in ("git show HEAD:secrets/key", "git show :secrets/key", "git show :0:secrets/key",
                    "git cat-file -p HEAD~2:secrets/key", "git archive HEAD:secrets",
                    "git -C secrets show HEAD:./key", "git diff HEAD:secrets/key HEAD:README",
                    "git -C sub log -p -- token", "git -C sub diff token"):
        assert decision(root, "bash", command, rules) == "deny", command
    # what prints from git's objects with no path named may print any version of them: it asks
    # while a read rule keeps files out of reach (the sandbox hides the file, not its history)
    for command in ("git show HEAD:README", "git show :/fix", "git show HEAD", "git log -p",
                    "git log --patch --all", "git log -U3", "git diff HEAD~3", "git grep --cached KEY",
                    "git -C sub show HEAD:./key", "git stash show -p", "git diff --cached"):
        assert decision(root, "bash", command, rules) == "ask", command
    # the work tree against the index shows no past version; blame names its file
    for command in ("git log --format=%h:%s", "git log --oneline", "git status", "git branch -a",
                    "git diff", "git diff --stat", "git blame README"):
        assert decision(root, "bash", command, rules) == "allow", command
    _, allowed = rules_from(root, "allow", "Bash(git:*)")
    _, allowed_and_denied = rules_from(root, "allow", "Bash(git:*)")
    allowed_and_denied += rules
    for command in ("git show HEAD", "git log -p", "git diff HEAD~3"):
        # no read rule: silent
        assert decision(root, "bash", command, permissions.load_rules([])) == "allow", command
        assert decision(root, "bash", command, allowed) == "allow", command
        assert decision(root, "bash", command, allowed_and_denied) == "ask", command


def test_khaelors_own_write_rules_meet_the_files_a_command_writes(root):
    """{capability: file.write.project, action: deny} likewise; an ask of a path asks even where
    the command is allowed, and a command allowed writes elsewhere without asking, as before."""
    layer = permissions.Layer("u/config.json", {"permissions": [
        {"capability": "process.execute", "pattern": "*", "action": "allow"},
        {"capability": "file.write.project", "pattern": "config/prod.yml", "action": "deny"},
        {"capability": "file.write.project", "pattern": "db/*", "action": "ask"}]})
    rules = permissions.load_rules([layer])
    for command in ("cp x config/prod.yml", "sed -i s/a/b/ config/prod.yml", "rm config/prod.yml",
                    "dd of=config/prod.yml"):
        assert decision(root, "bash", command, rules) == "deny", command
    assert decision(root, "bash", "mv x db/a.sql", rules) == "ask"
    assert decision(root, "bash", "cp config/prod.yml src/a", rules) == "allow"


def test_an_archive_or_a_diff_that_is_a_fifo_or_a_device_is_not_read(root):
    """unzip F, tar -xf F, patch -i F and patch < F read the archive or the diff to list what they
    write: a FIFO named so would block the judge until a writer came (the session hung), and
    /dev/zero never ends. Only a regular file is read; the judgement returns."""
    import os
    import threading
    _, rules = rules_from(root, "deny", "Edit(./config/**)")
    os.mkfifo(root / "fifo")
    commands = ["unzip fifo", "tar -xf fifo", "patch -i fifo", "patch < fifo",
                "unzip /dev/zero", "tar -xf /dev/zero", "patch -i /dev/zero"]
    for command in commands:
        judged = threading.Thread(target=decision, args=(root, "bash", command, rules), daemon=True)
        judged.start()
        judged.join(timeout=10)
        if judged.is_alive():
            # (a writer lets the blocked judge go)
            os.close(os.open(root / "fifo", os.O_WRONLY | os.O_NONBLOCK))
        assert not judged.is_alive(), command


def test_an_archive_lists_its_first_members_without_reading_the_rest(root):
    """A zip's central directory can list a million names in 30 MB (ZipFile reads each one:
    seconds): only the first hundred records are read, so a broken record past them does not
    hide config/x, the first member, from Edit(./config/**)."""
    import struct
    import zipfile
    _, rules = rules_from(root, "deny", "Edit(./config/**)")
    with zipfile.ZipFile(root / "a.zip", "w") as archive:
        for name in ["config/x"] + [f"m{k:03}" for k in range(150)]:
            archive.writestr(name, b"")
    data = bytearray((root / "a.zip").read_bytes())
    # the 120th record of the central directory, its signature broken
    record = [m.start() for m in re.finditer(re.escape(zipfile.stringCentralDir), data)][120]
    data[record:record + 4] = struct.pack("<I", 0)
    (root / "a.zip").write_bytes(bytes(data))
    assert decision(root, "bash", "unzip a.zip", rules) == "deny"


def test_a_diff_naming_thousands_of_files_is_judged_by_its_first_names(root):
    """patch -i D writes each file D names (in every -p form): a 300 KB diff of 20,000 names ran
    the judgement out of time (and one name of 4,000 directories took minutes), so the deny of
    the first file it names became a question; only its first hundred are judged."""
    _, rules = rules_from(root, "deny", "Edit(./config/**)")
    names = ["config/x"] + [f"d{k}/f" for k in range(20_000)]
    (root / "big.diff").write_text("".join(f"+++ {name}\n" for name in names))
    assert decision(root, "bash", "patch -i big.diff", rules) == "deny"
    (root / "deep.diff").write_text("+++ config/x\n+++ " + "a/" * 4000 + "b\n")
    assert decision(root, "bash", "patch -i deep.diff", rules) == "deny"


def test_the_floor_refuses_a_line_whose_judgement_runs_out_of_time(root, monkeypatch):
    """A judgement that runs out of time asks; the floor's refusal stands all the same (it was
    lost: `cat many/* ; rm -rf /` asked where a glob of 100,000 files starved the judgement), and
    the floor does not expand globs itself (it listed what every command writes, not only dd's)."""
    import itertools
    _, rules = rules_from(root, "deny", "Edit(./config/**)")
    (root / "many").mkdir()
    for k in range(200):
        (root / "many" / f"f{k}").write_text("")
    # (the session runs in its project: a glob the floor expanded from "" met many/ there)
    monkeypatch.chdir(root)
    monkeypatch.setattr(permissions, "DECIDE_BUDGET_SECONDS", -1)
    for command in ("cat many/* ; rm -rf /", "cp many/* config/ ; rm -rf ~", "rm -rf / many/*"):
        # (the clock is read every 64th check: from 1, the judgement stops at the 64th)
        monkeypatch.setattr(permissions, "_TICKS", itertools.count(1))
        decided = permissions.decide("bash", {"command": command}, root, rules)
        assert decided.not_read_only.startswith("bash: not judged"), command
        assert decided.action == "deny" and decided.floor, command
