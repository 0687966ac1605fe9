"""ansible-playbook's own options on `apply` and `plan` (provision/cli.py _playbook_opts): --extra-vars parsed by
Ansible itself and checked as inventory values are, --skip-tags by phase, -v, and --list-hosts and --list-tasks,
which run nothing. The hosts are in TEST-NET-1 (192.0.2.0/24): nothing here reaches one."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from provision import cli, interrupts, runner
from tests.unit.provision.test_inventory import GOOD_HOSTS, make

CT = "sglang_model_path: /srv/m\n"


def _run(capsys, *argv: str) -> tuple[int, dict]:
    code = cli.main([*argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_extra_vars_are_checked_as_inventory_values_naming_the_option(tmp_path, capsys, monkeypatch):
    """-e sets a variable above every inventory value, so it is checked as they are: a wrong type names --extra-vars
    (not a file), whichever spelling gave it; nothing runs."""
    root = make(tmp_path, GOOD_HOSTS, {"gpu_containers": CT})
    (tmp_path / "vars.yml").write_text("sglang_p2p: maybe\n")
    monkeypatch.chdir(tmp_path)  # an @FILE is read from the working directory, as ansible-playbook reads it
    runs = tmp_path / "runs"
    for given in ("sglang_p2p=maybe", '{"sglang_p2p": "maybe"}', "@vars.yml"):
        code, env = _run(capsys, "plan", "-i", str(root), "-e", given, "--runs-dir", str(runs))
        assert (code, env["errors"]) == (
            2,
            ["--extra-vars: host ct1: value of sglang_p2p must be one of: auto, off, on, got: maybe"],
        ), (given, env)
    assert not runs.exists(), "nothing ran"


def test_a_bad_extra_vars_value_is_one_usage_line(tmp_path, capsys, monkeypatch):
    """Ansible's words for a file it cannot read; a value that is not a mapping, and a file given without its @, as
    ansible-playbook refuses them."""
    monkeypatch.chdir(tmp_path)
    root = make(tmp_path, GOOD_HOSTS, {"gpu_containers": CT})
    code, env = _run(capsys, "plan", "-i", str(root), "-e", "@nosuch.yml")
    missing = f"--extra-vars @{tmp_path / 'nosuch.yml'}: Unable to retrieve file contents."
    assert code == 2 and len(env["errors"]) == 1 and env["errors"][0].startswith(missing), env
    assert _run(capsys, "plan", "-i", str(root), "-e", "[1, 2]")[1]["errors"] == [
        "--extra-vars [1, 2]: not a mapping of variables"
    ]
    assert _run(capsys, "plan", "-i", str(root), "-e", "./vars.yml")[1]["errors"] == [
        "--extra-vars ./vars.yml: a file is given as @./vars.yml"
    ]


def test_a_secret_given_with_extra_vars_is_masked_like_the_inventorys(tmp_path, capsys):
    secret = "ek-" + "4f9d2c7a1b8e"
    root = make(tmp_path, GOOD_HOSTS, {"gpu_containers": CT})
    code, env = _run(capsys, "plan", "-i", str(root), "-e", f"sglang_api_key={secret}", "-e", "sglang_tp_size=two")
    assert code == 2 and env["errors"], env
    assert secret not in json.dumps(env)


def test_extra_vars_may_not_replace_what_provision_sets_for_the_run(tmp_path, capsys):
    root = make(tmp_path, GOOD_HOSTS, {"gpu_containers": CT})
    code, env = _run(capsys, "apply", "-i", str(root), "--yes", "-e", "provision_lock=x", "-e", "_sglang_args=[]")
    assert (code, env["errors"]) == (
        2,
        [
            "--extra-vars _sglang_args: provision sets it itself for this run (or a role keeps it to itself); "
            "--extra-vars provision_lock: provision sets it itself for this run (or a role keeps it to itself)"
        ],
    ), env


def test_list_hosts_prints_the_hosts_of_the_limit_and_runs_nothing(tmp_path, capsys):
    root = make(tmp_path, GOOD_HOSTS, {"gpu_containers": CT})
    runs = tmp_path / "runs"
    code = cli.main(["apply", "-i", str(root), "--limit", "ct1", "--list-hosts", "--runs-dir", str(runs)])
    assert code == 0 and capsys.readouterr().out == "proxmox_hosts (0):\ngpu_containers (1):\n  ct1\n"
    code, env = _run(capsys, "plan", "-i", str(root), "--list-hosts", "--runs-dir", str(runs))
    assert (code, env["result"]) == (0, {"hosts": {"proxmox_hosts": ["pve1"], "gpu_containers": ["ct1"]}})
    assert not runs.exists(), "nothing ran"


def test_list_tasks_is_ansible_playbooks_listing_of_the_chosen_phases_and_runs_nothing(tmp_path, capsys):
    root = make(tmp_path, GOOD_HOSTS, {"gpu_containers": CT})
    runs = tmp_path / "runs"
    code, env = _run(capsys, "apply", "-i", str(root), "--tags", "sglang", "--list-tasks", "--runs-dir", str(runs))
    listing = env["result"]["tasks"]
    assert code == 0 and listing.startswith("\nplaybook: "), env
    assert "sglang : Install" in listing and "TAGS: [sglang]" in listing
    assert "kernel_cmdline : Configure" not in listing, "a phase left out by --tags is not listed"
    assert not runs.exists(), "nothing ran"


def test_a_part_tag_lists_that_part_of_its_phase_and_no_task_that_records_the_phase(tmp_path, capsys):
    """--tags weights: the sglang role's preflight and weights, and nothing of its other parts or of the state role,
    whose record would call the phase converged; a part is never skipped alone."""
    root = make(tmp_path, GOOD_HOSTS, {"gpu_containers": CT})
    code, env = _run(capsys, "apply", "-i", str(root), "--tags", "weights", "--list-tasks")
    sglang_play = env["result"]["tasks"].split("(gpu_containers:&provision_stale_sglang)", 1)[1].split("play #", 1)[0]
    tasks = [line.split("TAGS:")[0].strip() for line in sglang_play.splitlines() if "TAGS:" in line][1:]
    assert code == 0 and [t for t in tasks if "Validating arguments" not in t] == [
        "provision.pve_sglang.sglang : Preflight",
        "provision.pve_sglang.sglang : Put the model weights in place (sglang_model_source)",
    ], sglang_play
    code, env = _run(capsys, "plan", "-i", str(root), "--skip-tags", "weights")
    assert (code, env["errors"]) == (
        2,
        ["--skip-tags: unknown phase(s) weights; choose from kernel, driver, gpu, sglang, gateway, verify"],
    )
    code, env = _run(capsys, "plan", "-i", str(root), "--tags", "weighs")
    assert (code, env["errors"]) == (
        2,
        [
            "--tags: unknown phase(s) weighs; choose from kernel, driver, gpu, sglang, gateway, verify; or parts of "
            "one: sglang_install, weights, sglang_service"
        ],
    )


def test_skip_tags_leave_a_phase_out_of_the_checks_and_the_run(tmp_path, capsys):
    """Without the API's address the gpu and kernel phases cannot run; skipping them (and rebooting never) leaves
    nothing that needs it. What ansible-playbook is given: the skipped tags, the verbosity, each -e as written with
    an @FILE made absolute."""
    root = make(tmp_path, GOOD_HOSTS, {"all": "proxmox_api_port: 8006\n", "gpu_containers": CT})
    code, env = _run(capsys, "plan", "-i", str(root), "--skip-tags", "gpu,kernel,driver", "--list-hosts")
    assert code == 0, env
    code, env = _run(capsys, "plan", "-i", str(root), "--skip-tags", "")
    assert (code, env["errors"]) == (
        2,
        [
            "--skip-tags is empty: it leaves no phase out; name phases (kernel, driver, gpu, sglang, gateway, verify) "
            "or leave it out"
        ],
    )
    argv = [
        "plan",
        "-i",
        str(root),
        "--skip-tags",
        "gpu",
        "-vvv",
        "-e",
        "@v.yml",
        "-e",
        "sglang_api_key=k-9f3e1d",
        "-u",
        "ops",
        "-b",
    ]
    opts = cli._apply_options(cli.build_parser().parse_args(argv), plan=True)
    config = runner.PlaybookConfig("site.yml", root, 2, user=opts.user)
    pdd = tmp_path / "pdd"
    pdd.mkdir()
    got = config.runner_args(pdd)
    assert (got["skip_tags"], got["verbosity"], got["quiet"]) == ("gpu", 3, False)
    # an inline value is on no command line: a file of the run's private data dir, readable by its owner alone
    inline = pdd / "extra-vars-1.yml"
    tail = f"--extra-vars @{Path('v.yml').resolve()} --extra-vars @{inline} --user ops --become"
    assert got["cmdline"].endswith(tail), got["cmdline"]
    assert "k-9f3e1d" not in got["cmdline"] and json.loads(inline.read_text()) == {"sglang_api_key": "k-9f3e1d"}
    assert inline.stat().st_mode & 0o777 == 0o600


def test_extra_vars_and_skip_tags_reach_ansible_playbook(tmp_path, monkeypatch):
    """The run's arguments, as ansible-runner passes them to ansible-playbook, on a local playbook: each -e lands
    above the inventory's value (an @FILE and an inline one), and a skipped tag's task does not run."""
    import ansible_runner

    monkeypatch.chdir(tmp_path)
    (tmp_path / "hosts.yml").write_text(
        "all:\n  hosts:\n    here:\n      ansible_connection: local\n      a: inventory\n      b: inventory\n"
        f"      ansible_python_interpreter: {sys.executable}\n"
    )
    (tmp_path / "v.yml").write_text("a: from-file\n")
    out = tmp_path / "out.json"
    (tmp_path / "play.yml").write_text(
        "- hosts: all\n  gather_facts: false\n  tasks:\n"
        f'    - {{copy: {{dest: {out}, content: \'{{{{ {{"a": a, "b": b}} | to_json }}}}\'}}, tags: [sglang]}}\n'
        f"    - {{file: {{path: {tmp_path / 'gpu-ran'}, state: touch}}, tags: [gpu]}}\n"
    )
    argv = ["apply", "-i", "hosts.yml", "-e", "@v.yml", "-e", "b=inline", "--skip-tags", "gpu"]
    user = cli._apply_options(cli.build_parser().parse_args(argv)).user  # the CLI's: the @FILE made absolute
    config = runner.PlaybookConfig(str(tmp_path / "play.yml"), tmp_path / "hosts.yml", 1, user=user)
    pdd = tmp_path / "pdd"
    pdd.mkdir()
    args = config.runner_args(pdd)
    # the run's environment but Mitogen's strategy, which a local connection does not take
    args["envvars"] = {k: v for k, v in args["envvars"].items() if "STRATEGY" not in k}
    with interrupts.SignalTrap():  # as provision runs it: the signal handlers runner installs are undone after
        result = ansible_runner.run(**args)
    assert result.rc == 0, result.stdout.read()[-2000:]
    assert json.loads(out.read_text()) == {"a": "from-file", "b": "inline"}
    assert not (tmp_path / "gpu-ran").exists(), "the skipped tag's task ran"
