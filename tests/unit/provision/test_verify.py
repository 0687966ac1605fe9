"""provision/verify.py without any ssh: what the probe run's job events become, the checks deciding
from that file alone, and the probe playbook rendering only the variables the checks read."""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from provision import verify
from provision.checks import support
from provision.errors import UsageError
from provision.job_events import run_stats, task_outcomes
from provision.record import RunRecord
from provision.runner import RunResult
from tests.loaders import REPO

BIN = Path(sys.executable).parent

CHECKS_DIR = Path(verify.__file__).parent / "checks"


def _events(record: Path, *events: tuple[int, str, str, str, dict]) -> None:
    """Job events as runner writes them: <counter>-<uuid>.json (so "10-..." sorts before "9-...")."""
    folder = record / "artifacts" / "run" / "job_events"
    folder.mkdir(parents=True, exist_ok=True)
    for counter, kind, host, task, res in events:
        event = {"event": kind, "counter": counter, "event_data": {"host": host, "task": task, "res": res}}
        (folder / f"{counter}-{host}.json").write_text(json.dumps(event))


def _stats(record: Path, counter: int, data: dict) -> None:
    """The stats event ansible-playbook ends with: what the set_stats tasks handed over, in artifact_data."""
    folder = record / "artifacts" / "run" / "job_events"
    folder.mkdir(parents=True, exist_ok=True)
    event = {"event": "playbook_on_stats", "counter": counter, "event_data": {"ok": {}, "artifact_data": data}}
    (folder / f"{counter}-stats.json").write_text(json.dumps(event))


def _run(failures: list[dict], status: str = "failed") -> RunResult:
    return RunResult("verify_probe.yml", status, 2, False, "", 0.0, failures=failures)


PROBE_TASK = "Read the host's state in one command"


def test_readings_say_for_each_host_what_it_returned_or_why_it_did_not(tmp_path):
    """From the run's stats, whatever the tasks are called: a renamed task loses nothing."""
    probe = {"boot_id": "b-1", "files": {}}
    returned = {
        "n1": {"vars": {"a": "1"}, "stdout": "a warning\n" + json.dumps(probe), "stderr": ""},
        "n5": {"vars": {}, "stdout": "Traceback ...", "stderr": "boom"},
        # raw over ssh: the probe's stderr came back in stdout, and stderr is ssh's own line
        "n6": {
            "vars": {},
            "stdout": "Traceback ...\r\nValueError: bad request\r\n",
            "stderr": "Shared connection to n6 closed.\r\n",
        },
    }
    _events(tmp_path, (9, "runner_on_ok", "n1", "Any name", {"stdout": json.dumps({"boot_id": "not this"})}))
    _stats(tmp_path, 20, {verify.PROBE_STATS: returned, "other": {"n4": {}}})
    failures = [
        {"host": "n2", "task": PROBE_TASK, "message": "unreachable: Failed to connect:\n  ssh: connect refused"},
        {"host": "n3", "task": PROBE_TASK, "message": "non-zero return code: python3: not found"},
        {"host": "", "task": "", "message": "ERROR! the play was cut short"},
    ]
    found = verify.readings(tmp_path, ["n1", "n2", "n3", "n4", "n5", "n6"], _run(failures))
    assert found["n1"] == {"vars": {"a": "1"}, "probe": probe, "error": ""}
    assert found["n2"] == {"vars": {}, "probe": None, "error": "unreachable: Failed to connect: ssh: connect refused"}
    assert found["n3"]["error"] == "non-zero return code: python3: not found"
    assert found["n4"]["error"] == "the probe never ran here: ERROR! the play was cut short"
    assert found["n5"]["error"] == "the probe printed no JSON: boom"
    assert found["n6"]["error"] == "the probe printed no JSON: Traceback ... ValueError: bad request"


def test_run_stats_are_the_last_stats_event_of_the_run(tmp_path):
    assert run_stats(tmp_path) == {}, "no record: nothing handed over"
    _events(tmp_path, (1, "runner_on_ok", "h", "T", {"ansible_stats": {"data": {"k": {"h": 0}}}}))
    assert run_stats(tmp_path) == {}, "a run stopped before its stats handed nothing over"
    _stats(tmp_path, 9, {"k": {"h": 1}})
    _stats(tmp_path, 10, {"k": {"h": 2}})
    assert run_stats(tmp_path) == {"k": {"h": 2}}, "by counter (10 after 9), not by file name"


def test_task_outcomes_keep_the_last_end_of_a_task_per_host(tmp_path):
    _events(
        tmp_path,
        (2, "runner_on_start", "h", "T", {}),
        (5, "runner_on_ok", "h", "T", {"n": 1}),
        (40, "runner_on_ok", "h", "T", {"n": 2}),
        (41, "runner_on_ok", "h", "other", {"n": 3}),
    )
    assert task_outcomes(tmp_path, "T") == {"h": {"event": "runner_on_ok", "res": {"n": 2}}}
    assert task_outcomes(tmp_path, "T", started=True)["h"]["res"] == {"n": 2}
    assert task_outcomes(tmp_path / "absent", "T") == {}


def _spec(tmp_path: Path, readings: dict) -> Path:
    spec = tmp_path / "hosts.json"
    hosts = {name: ["test_common.py", "test_host.py"] for name in readings}
    spec.write_text(json.dumps({"hosts": hosts, "nodes": {}, "readings": readings}))
    return spec


def test_checks_load_no_pytest_plugin_the_environment_installs(tmp_path, monkeypatch):
    """A pytest plugin installed beside provision (an entry point in pytest11) does not load in the checks, and the
    environment's PYTEST_ADDOPTS does not reach them."""
    site = tmp_path / "site"
    dist = site / "foreign_plugin-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: foreign-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[pytest11]\nforeign = foreign_plugin\n")
    (site / "foreign_plugin.py").write_text("def pytest_configure(config):\n    raise SystemExit('loaded')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("PYTEST_ADDOPTS", "--foreign-option")  # a plugin's option, which pytest alone refuses
    ok = {"boot_id": "b-1", "state_dir": "/srv/state", "files": {"verify.json": "{}"}}
    spec = _spec(tmp_path, {"good": {"vars": {}, "probe": ok, "error": ""}})
    checks = verify._run_checks(["good"], spec, tmp_path, select="reachable or provision_applied")
    assert {(c.name, c.passed) for c in checks} == {("test_reachable", True), ("test_provision_applied", True)}


def test_checks_decide_from_the_readings_file_alone(tmp_path):
    ok = {"boot_id": "b-1", "state_dir": "/srv/state", "files": {"verify.json": "{}"}}
    unconverged = {"boot_id": "b-2", "state_dir": "/srv/state", "files": {"verify.json": None}}
    spec = _spec(
        tmp_path,
        {
            "good": {"vars": {}, "probe": ok, "error": ""},
            "fresh": {"vars": {}, "probe": unconverged, "error": ""},
            "down": {"vars": {}, "probe": None, "error": "unreachable: ssh: connect to host 10.0.0.9 port 22"},
        },
    )
    checks = verify._run_checks(["good", "fresh", "down"], spec, tmp_path, select="reachable or provision_applied")
    result = {(c.host, c.name): (c.passed, c.reason) for c in checks}
    assert result[("good", "test_reachable")] == (True, "")
    assert result[("good", "test_provision_applied")] == (True, "")
    assert result[("fresh", "test_reachable")] == (True, "")
    assert not result[("fresh", "test_provision_applied")][0]
    assert result[("fresh", "test_provision_applied")][1] == "/srv/state/verify.json is missing: run provision apply"
    for name in ("test_reachable", "test_provision_applied"):
        assert result[("down", name)] == (False, "cannot read down: unreachable: ssh: connect to host 10.0.0.9 port 22")


def test_a_suite_no_host_of_the_run_has_runs_nowhere(tmp_path):
    """An inventory without gateways: the gateway suite runs on no host (a user's check file runs on every host
    only when its name names no group's suite)."""
    ok = {"boot_id": "b-1", "state_dir": "/srv/state", "files": {"verify.json": "{}"}}
    spec = _spec(tmp_path, {"node": {"vars": {}, "probe": ok, "error": ""}})
    checks = verify._run_checks(["node"], spec, tmp_path, select="gateway or reachable")
    assert [(c.host, c.name) for c in checks] == [("node", "test_reachable")]


def test_host_vars_are_the_ones_the_checks_read():
    """A check that reads a host variable the probe playbook does not render would always see it unset."""
    read = set()
    for path in [*CHECKS_DIR.glob("*.py"), CHECKS_DIR.parent / "capacity.py"]:
        read |= set(re.findall(r"vars\.get\(\"(\w+)\"", path.read_text()))
    assert read, "the pattern no longer finds the checks' variables"
    assert read | {"verify_smoke_question"} == set(support.HOST_VARS)


def test_the_probe_playbook_renders_only_the_named_variables(tmp_path, monkeypatch):
    """Through the real playbook, on this machine (local connection): a templated smoke question is rendered
    and asked, and no other variable (a secret here) reaches the run's events."""
    monkeypatch.setenv("PROVISION_ANSIBLE_STRATEGY", "linear")
    # the probe runs on this machine: the refusal of a local connection is a row of
    # tests/unit/provision/test_cli_bad_inputs.py
    monkeypatch.setattr(verify.inventory_mod, "_check_connection", lambda host: [])
    local = {"ansible_connection": "local", "ansible_python_interpreter": "/usr/bin/python3"}
    hosts = {
        "node1": {**local, "proxmox_api_password": "hunter2-" + "never-rendered"},
        "ct1": {
            **local,
            "proxmox_host": "node1",
            "proxmox_vmid": 100,
            "verify_smoke_question": "{{ 'What is ' ~ (6 * 7) ~ '?' }}",
            "verify_smoke_expect": 42,
        },
    }
    (tmp_path / "inv").mkdir()
    doc = {
        "all": {
            "children": {
                "proxmox_hosts": {"hosts": {"node1": hosts["node1"]}},
                "gpu_containers": {"hosts": {"ct1": hosts["ct1"]}},
            }
        }
    }
    (tmp_path / "inv" / "hosts.yml").write_text(yaml.safe_dump(doc))
    inv = verify.inventory_mod.load(str(tmp_path / "inv"))
    with RunRecord(tmp_path / "runs", "verify", inv) as rec:
        spec, run = verify.read_hosts(inv, list(inv.hosts.values()), rec)
    record = rec.path
    assert run.succeeded, run.failures
    assert spec["readings"]["ct1"]["vars"] == {"verify_smoke_question": "What is 42?", "verify_smoke_expect": 42}
    assert spec["readings"]["node1"]["vars"] == {}
    assert spec["readings"]["node1"]["probe"]["boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert spec["readings"]["ct1"]["probe"]["question"] == "What is 42?", "the probe on the host got another question"
    events = "".join(p.read_text() for p in (record / "artifacts" / "run" / "job_events").glob("*.json"))
    assert "hunter2-never-rendered" not in events


def test_the_kernel_argument_check_reads_quoted_arguments_as_the_kernel_does(tmp_path):
    """verify decides by the same rule as the kernel phase's reboot (module_utils/kernel_cmdline.missing): an
    argument with quoted whitespace is there however GRUB quoted it."""
    wanted = json.dumps({"add": ["dyndbg=module iommu +p", "iommu=nopt"], "remove": ["iommu=pt"]})
    files = {support.WANTED: wanted}
    lines = {
        "grub206": 'BOOT_IMAGE=/vmlinuz ro "dyndbg=module iommu +p" iommu=nopt',
        "written": 'BOOT_IMAGE=/vmlinuz ro dyndbg="module iommu +p" iommu=nopt',
        "pending": "BOOT_IMAGE=/vmlinuz ro iommu=pt",
    }
    readings = {
        h: {"vars": {}, "probe": {"boot_id": h, "files": files, "proc_cmdline": line}, "error": ""}
        for h, line in lines.items()
    }
    checks = verify._run_checks(list(lines), _spec(tmp_path, readings), tmp_path, select="kernel_arguments")
    assert {c.host: c.passed for c in checks} == {"grub206": True, "written": True, "pending": False}
    pending = next(c.reason for c in checks if c.host == "pending")
    assert pending.startswith("/proc/cmdline lacks dyndbg=module iommu +p iommu=nopt and still has iommu=pt"), pending


SERVER = {
    "server_info": {"status": 200, "body": json.dumps({"max_total_num_tokens": 100000, "context_length": 10000})},
    "models": {"status": 200, "body": json.dumps({"data": []})},
    "model_config": None,
    "weights_bytes": None,
}
CAPACITY_READINGS = {
    "good": {"vars": {"verify_session_tokens": "8192"}, "probe": {"boot_id": "b", "sglang": SERVER}, "error": ""},
    "down": {"vars": {}, "probe": None, "error": "unreachable: ssh: connect refused"},
    "fresh": {"vars": {}, "probe": {"boot_id": "b", "files": {}}, "error": ""},
    "starting": {"vars": {}, "probe": {"sglang": {**SERVER, "server_info": {"status": 0}}}, "error": ""},
}


def test_the_capacity_check_and_the_capacity_report_decide_alike(tmp_path):
    """verify's check and `provision capacity` read the same reading through provision/capacity.py: the same
    hosts have a capacity, and the others the same reason."""
    names = list(CAPACITY_READINGS)
    spec = tmp_path / "hosts.json"
    suites = ["test_common.py", "test_container.py"]
    spec.write_text(json.dumps({"hosts": dict.fromkeys(names, suites), "nodes": {}, "readings": CAPACITY_READINGS}))
    checks = {c.host: c for c in verify._run_checks(names, spec, tmp_path, select="capacity_report")}
    found, unknown = verify.capacities(CAPACITY_READINGS, names)
    assert set(found) == {h for h, c in checks.items() if c.passed} == {"good"}
    assert unknown == {h: c.reason for h, c in checks.items() if not c.passed}
    assert unknown == {
        "down": "cannot read down: unreachable: ssh: connect refused",
        "fresh": f"{support.SERVICE_STATE} is missing: the sglang phase has not run here",
        "starting": "/server_info answered nothing (no connection)",
    }
    assert found["good"]["summary"] == "100,000 tokens ≈ 10.00 × 10,000-token sessions ≈ 12.2 × 8K sessions"
    wanted = verify.capacities(CAPACITY_READINGS, ["good"], session_tokens=(32768,))[0]
    assert wanted["good"]["summary"].endswith("≈ 3.1 × 32K sessions"), "--session-tokens wins over the host's"


GOOD = str(REPO / "inventory" / "prod")


def _stub_read_hosts(monkeypatch, readings: dict) -> list[list[str]]:
    """verify.read_hosts without ssh: the readings given; returns the hosts each call was asked to read."""
    asked = []

    def read_hosts(inv, hosts, record, **connection):
        asked.append([h.name for h in hosts])
        spec = {"hosts": {h.name: [] for h in hosts}, "nodes": {}, "readings": readings}
        return spec, RunResult("verify_probe.yml", "successful", 0, False, "", 0.1)

    monkeypatch.setattr(verify, "read_hosts", read_hosts)
    return asked


def test_provision_capacity_runs_no_check_and_prints_what_it_printed(monkeypatch, tmp_path, capsys):
    """The container's capacity, or why there is none, on stdout as before; no pytest run, a record of kind
    capacity, and nothing printed by the API itself."""
    from provision import cli

    _stub_read_hosts(monkeypatch, {"sglang-01": CAPACITY_READINGS["good"]})
    monkeypatch.setattr(verify, "_run_checks", lambda *a, **k: pytest.fail("capacity runs no check"))
    assert cli.main(["capacity", "-i", GOOD, "--runs-dir", str(tmp_path), "--session-tokens", "32768,8192"]) == 0
    assert capsys.readouterr().out == (
        "capacity sglang-01: 100,000 tokens ≈ 10.00 × 10,000-token sessions ≈ 3.1 × 32K sessions ≈ 12.2 × 8K "
        "sessions\n  kv cache auto, context 10,000, max_running_requests None\n"
    )
    (record,) = tmp_path.glob("*-capacity")
    assert json.loads((record / "verify.json").read_text())["checks"] == [
        {"host": "sglang-01", "suite": "capacity", "name": "capacity", "passed": True, "reason": "", "seconds": 0.0}
    ]

    _stub_read_hosts(monkeypatch, {"sglang-01": CAPACITY_READINGS["down"]})
    report = verify.capacity_report(GOOD, runs_dir=tmp_path)
    assert capsys.readouterr() == ("", ""), "a Python caller that asked for no progress gets nothing printed"
    assert not report.passed and report.capacity == {}
    assert cli.main(["capacity", "-i", GOOD, "--runs-dir", str(tmp_path)]) == 1
    assert capsys.readouterr().out == "sglang-01: cannot read sglang-01: unreachable: ssh: connect refused\n"


def test_the_api_modules_print_nothing_and_load_no_rich():
    """Presentation lives in provision/present.py: a program that imports the API gets data, not a console."""
    code = (
        "import sys; import provision.apply, provision.verify, provision.diag, provision.bench, provision.capacity; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'rich'))"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(verify.__file__).resolve().parents[1])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.strip() == "[]"


def test_the_findings_check_reads_the_command_line_by_the_same_tokeniser(tmp_path):
    """The findings of this boot are told from an earlier boot's by module_utils/kernel_cmdline's tokeniser: GRUB's
    quoting of an argument with whitespace is the same argument; another argument is another boot."""
    wanted = json.dumps({"add": ["dyndbg=module iommu +p", "iommu=nopt"], "remove": []})
    running = 'BOOT_IMAGE=/vmlinuz ro "dyndbg=module iommu +p" iommu=nopt'
    recorded = {
        "same": 'BOOT_IMAGE=/vmlinuz ro dyndbg="module iommu +p" iommu=nopt',
        "earlier": "BOOT_IMAGE=/vmlinuz ro iommu=pt",
        "passthrough": running,
    }
    readings = {}
    for host, line in recorded.items():
        domain = "Passthrough" if host == "passthrough" else "Translated"
        findings = json.dumps({"proc_cmdline": line, "iommu_default_domain": domain})
        files = {
            support.WANTED: wanted,
            support.FINDINGS: findings,
        }
        readings[host] = {"vars": {}, "probe": {"boot_id": host, "files": files, "proc_cmdline": running}, "error": ""}
    checks = verify._run_checks(list(recorded), _spec(tmp_path, readings), tmp_path, select="iommu_and_snp_findings")
    result = {c.host: (c.passed, c.reason) for c in checks}
    assert result["same"] == (True, "")
    assert result["earlier"] == (False, "the findings are from an earlier boot: run provision apply --tags kernel")
    assert not result["passthrough"][0] and "default domain is Passthrough" in result["passthrough"][1]


LIMIT_INVENTORY = """\
all:
  children:
    proxmox_hosts:
      hosts:
        pve-01: {}
        pve-02: {}
    gpu_containers:
      hosts:
        sglang-01: {proxmox_host: pve-01, proxmox_vmid: 101}
        sglang-02: {proxmox_host: pve-02, proxmox_vmid: 102}
        sglang-10: {proxmox_host: pve-01, proxmox_vmid: 110}
    rack_a:
      hosts:
        pve-01: {}
        sglang-01: {}
        sglang-10: {}
    monitoring:
      hosts:
        grafana-01: {}
"""


@pytest.mark.parametrize(
    "limit",
    [
        "all:!sglang-01",
        "sglang-*",
        "gpu_containers:&rack_a",
        "rack_a:!pve-*",
        "pve-01,sglang-02",
        "~sglang-0[12]",
        "gpu_containers[1:2]",
        "grafana-01",
        None,
    ],
)
def test_verify_limit_selects_what_ansible_playbook_limit_does(tmp_path, limit):
    (tmp_path / "inv").mkdir()
    (tmp_path / "inv" / "hosts.yml").write_text(LIMIT_INVENTORY)
    (tmp_path / "play.yml").write_text("- hosts: proxmox_hosts:gpu_containers\n  gather_facts: false\n  tasks: []\n")
    argv = [BIN / "ansible-playbook", "-i", tmp_path / "inv", tmp_path / "play.yml", "--list-hosts"]
    listed = subprocess.run(
        [str(a) for a in argv + (["--limit", limit] if limit else [])],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr
    ansible = sorted(line.strip() for line in listed.stdout.split("hosts (", 1)[1].splitlines()[1:] if line.strip())
    inv = verify.inventory_mod.load(str(tmp_path / "inv"))
    assert sorted(h.name for h in verify.targets(inv, limit)) == ansible


def test_a_node_must_run_the_driver_the_inventory_pins(tmp_path):
    def module(version):
        return f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {version}  Release Build  (dvs-builder@U16)\n"

    pin = {"nvidia_driver_version": "580.95.05"}
    spec = _spec(
        tmp_path,
        {
            "pinned": {"vars": pin, "probe": {"nvidia_module": module("580.95.05")}, "error": ""},
            "old": {"vars": pin, "probe": {"nvidia_module": module("580.65.06")}, "error": ""},
            "none": {"vars": pin, "probe": {"nvidia_module": None}, "error": ""},
            "unpinned": {"vars": {}, "probe": {"nvidia_module": module("580.65.06")}, "error": ""},
            # the driver phase's rule (module_utils/nvidia_driver.py pinned): an empty pin is no pin
            "empty": {"vars": {"nvidia_driver_version": ""}, "probe": {"nvidia_module": None}, "error": ""},
        },
    )
    hosts = ["pinned", "old", "none", "unpinned", "empty"]
    checks = verify._run_checks(hosts, spec, tmp_path, select="nvidia_driver_is_the")
    result = {c.host: (c.passed, c.reason) for c in checks}
    assert result["pinned"] == (True, "") and result["unpinned"] == (True, "") and result["empty"] == (True, "")
    assert result["old"] == (
        False,
        "the loaded NVIDIA module is 580.65.06, not nvidia_driver_version 580.95.05: run provision apply (the driver "
        "phase), and reboot the node if it says so",
    )
    assert not result["none"][0] and result["none"][1].startswith("the loaded NVIDIA module is none")


def test_the_smoke_check_names_the_question_the_probe_asked(tmp_path):
    """The question is rendered once, for the probe that asks it; a wrong answer names that question, not a second
    rendering of verify_smoke_question (a template with now() or a lookup would render otherwise)."""
    chat = {"status": 200, "body": json.dumps({"choices": [{"message": {"content": "I do not know"}}]})}
    probe = {"boot_id": "b", "files": {}, "question": "What is 6 * 7, asked at 10:00?", "sglang": {"chat": chat}}
    reading = {
        "vars": {"verify_smoke_question": "What is 6 * 7, asked at 10:01?", "verify_smoke_expect": 42},
        "probe": probe,
        "error": "",
    }
    spec = tmp_path / "hosts.json"
    spec.write_text(json.dumps({"hosts": {"ct1": ["test_container.py"]}, "nodes": {}, "readings": {"ct1": reading}}))
    (check,) = verify._run_checks(["ct1"], spec, tmp_path, select="smoke_answer")
    assert not check.passed and "asked 'What is 6 * 7, asked at 10:00?'" in check.reason, check.reason


def test_testinfra_checks_reach_the_host_through_ansible_and_a_users_check_file_runs_beside_them(tmp_path):
    """The listening and enabled checks ask the host itself through testinfra's `host` fixture, over the host's own
    Ansible connection plugin (here Ansible's local connection, in the run's environment): a socket that listens
    passes, a closed one fails naming it, a unit that is not enabled fails. A user's own file in --check-dir runs
    beside them with the same fixtures, and its failure counts. The inventory directory is one Ansible parses."""
    import socket as socket_mod

    from provision import runner

    inv = tmp_path / "inv"
    inv.mkdir()
    (inv / "hosts.yml").write_text(
        yaml.safe_dump(
            {
                "all": {
                    "children": {
                        "gpu_containers": {
                            "hosts": {
                                "ct1": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
                            }
                        }
                    }
                }
            }
        )
    )
    mine = tmp_path / "checks"
    mine.mkdir()
    (mine / "test_container_mine.py").write_text(
        "def test_my_file(host):\n    assert host.file('/nonexistent-provision-check').exists, 'my check failed'\n"
    )
    listener = socket_mod.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    state = {"service": "provision-test-absent", "host": "127.0.0.1", "port": port}
    # the probe's reading where the sglang phase's record exists (its server's answers are not read by these checks)
    probe = {
        "boot_id": "b",
        "state_dir": "/srv/state",
        "files": {support.SERVICE_STATE: json.dumps(state)},
        "sglang": {"service": {}},
    }
    spec = tmp_path / "hosts.json"
    spec.write_text(
        json.dumps(
            {
                "hosts": {"ct1": ["test_common.py", "test_container.py"]},
                "nodes": {},
                "readings": {"ct1": {"vars": {}, "probe": probe, "error": ""}},
            }
        )
    )
    select = "service_listening or service_enabled or my_file"
    with runner.adhoc_environment(1) as env:
        run = functools.partial(verify._run_checks, ["ct1"], spec, tmp_path, ansible_env=env, inventory=inv)
        checks = {c.name: c for c in run(select, mine=verify.user_checks(mine))}
        listener.close()
        closed = {c.name: c for c in run("service_listening")}
    assert checks["test_service_listening"].passed, checks["test_service_listening"].reason
    assert not closed["test_service_listening"].passed
    assert closed["test_service_listening"].reason == f"nothing listens on 127.0.0.1:{port}"
    assert not checks["test_service_enabled"].passed
    assert checks["test_service_enabled"].reason.startswith("the provision-test-absent unit is not enabled")
    assert (checks["test_my_file"].host, checks["test_my_file"].passed) == ("ct1", False)
    assert checks["test_my_file"].reason.startswith("my check failed")


def test_a_check_dir_without_check_files_is_refused_and_the_default_is_the_working_directory_s(tmp_path, monkeypatch):
    """--check-dir must name a directory that holds test_*.py files; without it, the user's checks are ./checks,
    where the working directory has one (never a directory of the inventory's, which Ansible reads as inventory
    sources)."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "a-file").write_text("")
    for given, why in (("missing", "no such directory"), ("empty", "no test_\\*.py in it"), ("a-file", "not a dir")):
        with pytest.raises(UsageError, match=f"--check-dir .*{given}: {why}"):
            verify.user_checks(tmp_path / given)
    monkeypatch.chdir(tmp_path)
    assert verify.user_checks() == []
    (tmp_path / "checks").mkdir()
    (tmp_path / "checks" / "test_site.py").write_text("")
    (tmp_path / "checks" / "helper.py").write_text("")
    assert verify.user_checks() == [str(tmp_path / "checks" / "test_site.py")]


def test_the_kernel_booted_next_must_have_the_nvidia_module(tmp_path):
    """A kernel update installed without its headers: DKMS built the module for the running kernel only, and the
    node's next boot (the newest kernel for systemd-boot, GRUB's default entry) would come up without a driver."""
    dkms = "nvidia/580.95.05, 6.8.12-4-pve, x86_64: installed\n"  # dkms 3.x `dkms status` (dell/dkms dkms.in)
    grub = "menuentry 'Proxmox VE GNU/Linux' {\n\tlinux\t/boot/vmlinuz-6.8.12-4-pve root=/dev/mapper/pve-root ro\n}\n"

    def node(bootloader, boot, grub_cfg=None, built=dkms):
        commands = {
            " ".join(support.BOOT_KERNELS): {"rc": 0, "stdout": boot, "stderr": ""},
            " ".join(support.RUNNING_KERNEL): {"rc": 0, "stdout": "6.8.12-4-pve\n", "stderr": ""},
            " ".join(support.DKMS_STATUS): {"rc": 0, "stdout": built, "stderr": ""},
        }
        files = {support.WANTED: json.dumps({"bootloader": bootloader}), support.GRUB_CFG: grub_cfg}
        probe = {"boot_id": "b", "state_dir": "/srv/state", "files": files, "commands": commands}
        return {"vars": {"nvidia_driver_version": "580.95.05"}, "probe": probe, "error": ""}

    two = "vmlinuz-6.8.12-4-pve\nvmlinuz-6.14.8-2-pve\n"
    readings = {
        "updated": node("systemd-boot", two),
        "grub_default_old": node("grub", two, grub),
        "built_for_both": node("systemd-boot", two, built=dkms + dkms.replace("6.8.12-4-pve", "6.14.8-2-pve")),
    }
    checks = verify._run_checks(list(readings), _spec(tmp_path, readings), tmp_path, select="kernel_booted_next")
    result = {c.host: (c.passed, c.reason) for c in checks}
    assert result["grub_default_old"] == (True, "") and result["built_for_both"] == (True, "")
    assert result["updated"] == (
        False,
        (
            "the kernel the node boots next, 6.14.8-2-pve, has no NVIDIA module (dkms status: 6.8.12-4-pve installed): "
            "run provision apply before the node reboots (the driver phase installs proxmox-headers-6.14.8-2-pve and "
            "builds the module with DKMS; proxmox-default-headers brings every future kernel's headers)"
        ),
    )


def test_the_listening_check_takes_an_ipv6_address_as_sglang_host_does(tmp_path):
    """sglang_host ::1 (the bench lab's): the check asks testinfra for the IPv6 socket and passes while it listens."""
    import socket as socket_mod

    from provision import runner

    inv = tmp_path / "inv"
    inv.mkdir()
    (inv / "hosts.yml").write_text(
        yaml.safe_dump(
            {
                "all": {
                    "children": {
                        "gpu_containers": {
                            "hosts": {
                                "ct1": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
                            }
                        }
                    }
                }
            }
        )
    )
    listener = socket_mod.socket(socket_mod.AF_INET6)
    listener.bind(("::1", 0))
    listener.listen()
    state = {"service": "sglang", "host": "::1", "port": listener.getsockname()[1]}
    probe = {
        "boot_id": "b",
        "state_dir": "/srv/state",
        "files": {support.SERVICE_STATE: json.dumps(state)},
        "sglang": {"service": {}},
    }
    spec = tmp_path / "hosts.json"
    spec.write_text(
        json.dumps(
            {
                "hosts": {"ct1": ["test_common.py", "test_container.py"]},
                "nodes": {},
                "readings": {"ct1": {"vars": {}, "probe": probe, "error": ""}},
            }
        )
    )
    try:
        with runner.adhoc_environment(1) as env:
            checks = verify._run_checks(["ct1"], spec, tmp_path, "service_listening", env, inv)
    finally:
        listener.close()
    assert [(c.name, c.passed, c.reason) for c in checks] == [("test_service_listening", True, "")]
