"""The permission gate wired into the kernel, end to end: real CLI or real Kernel, real SDK, fake API."""
import json

from fake_api import reply, text, tool_use


def tool_results(fake, i=-1):
    return [b for m in fake.requests[i]["body"]["messages"] for b in m["content"] if b["type"] == "tool_result"]


def test_headless_denies_a_write_leaves_the_file_untouched_and_tells_the_model(khaelor, fake, project):
    (project / "keep.txt").write_text("original\n")
    fake.enqueue(reply(tool_use("bash", {"command": "echo changed > keep.txt"})), reply(text("could not write")))
    result = khaelor.run("-p", "change keep.txt")
    assert result.returncode == 0, result.stderr
    assert (project / "keep.txt").read_text() == "original\n"
    denial = tool_results(fake)[0]
    assert denial["is_error"] and "Permission denied" in denial["content"]
    assert "echo changed > keep.txt" in result.stderr and "--yes" in result.stderr
    assert fake.rejections == []


def test_yes_cannot_get_past_the_hardline_floor(khaelor, fake, tmp_path):
    victim = tmp_path / "user-home"
    victim.mkdir(exist_ok=True)
    (victim / "precious").write_text("x")
    fake.enqueue(reply(tool_use("bash", {"command": "r\\m -r\"f\" ~"})), reply(tool_use("bash", {"command": "rm -rf /"})),
                 reply(text("refused")))
    result = khaelor.run("-p", "clean everything", "--yes")
    assert result.returncode == 0, result.stderr
    assert (victim / "precious").exists()
    results = tool_results(fake)
    assert len(results) == 2 and all("hardline" in r["content"] for r in results)
    log = khaelor.log()
    assert not [e for e in log if e["type"] == "ToolStarted"]


def test_an_allow_rule_in_the_project_config_lets_a_command_run_headless(khaelor, fake, project):
    (project / ".khaelor").mkdir()
    (project / ".khaelor" / "config.json").write_text(json.dumps(
        {"permissions": [{"capability": "process.execute", "pattern": "touch *", "action": "allow"}]}))
    fake.enqueue(reply(tool_use("bash", {"command": "touch made.txt"})), reply(text("made")))
    result = khaelor.run("-p", "make a file")
    assert result.returncode == 0, result.stderr
    assert (project / "made.txt").exists()


def test_an_always_grant_is_persisted_and_honoured_by_a_new_process(khaelor, fake, project, kernel_turn):
    """The kernel is driven in-process with a user who answers "always"; a fresh `khaelor -p`
    without --yes then runs the same kind of command because the grant is in the project config."""
    fake.enqueue(reply(tool_use("bash", {"command": "git init -q newrepo"})), reply(text("initialised")))
    asked = []

    async def ask(request):
        asked.append(request)
        return "always", ""

    assert kernel_turn("init a repo", ask)[0] == "done"
    assert asked[0]["suggestion"] == {"capability": "process.execute", "pattern": "git init *"} or \
        asked[0]["suggestion"]["pattern"] == "git init *"
    saved = json.loads((project / ".khaelor" / "config.json").read_text())
    assert any(r["pattern"] == "git init *" and r["action"] == "allow" for r in saved["permissions"])
    assert (project / "newrepo" / ".git").is_dir()

    fake.enqueue(reply(tool_use("bash", {"command": "git init -q second"})), reply(text("again")))
    result = khaelor.run("-p", "init another")     # a new process, no --yes
    assert result.returncode == 0, result.stderr
    assert (project / "second" / ".git").is_dir()
    assert fake.rejections == []


def test_permissions_check_reports_decisions_as_json(khaelor):
    floor = json.loads(khaelor.run("permissions", "check", "--json", "--bash", "sudo rm -rf /").stdout)
    assert floor == {**floor, "decision": "deny", "floor": True}
    ls = json.loads(khaelor.run("permissions", "check", "--json", "--bash", "ls -la").stdout)
    assert ls["decision"] == "allow" and ls["floor"] is False
    push = json.loads(khaelor.run("permissions", "check", "--json", "--bash", "git push origin main").stdout)
    assert push["decision"] == "ask" and push["suggestion"] == "git push *"
    outside = json.loads(khaelor.run("permissions", "check", "--json", "--write", "../elsewhere.txt").stdout)
    assert outside["capability"] == "filesystem.outsideProject" and outside["decision"] == "ask"
    listing = khaelor.run("permissions")
    assert listing.returncode == 0 and "default" in listing.stdout
