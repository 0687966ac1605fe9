"""The performance harness (docs/performance.md): the floor, provision's no-op apply and verify, and
the same playbooks under stock ansible-playbook settings, measured in one run against one inventory.

    .venv/bin/python -m tests.perf.harness --inventory inventory/lab [--repeat 3] [--cold] [--json FILE]
    .venv/bin/python -m tests.perf.harness --fleet 1,4,16 [--json FILE] [--chart FILE.png]

The floor is one ssh session per host, all hosts at once, that reads everything a no-op decision
needs (command line, bootloader files, boot id, state directory, dmesg, GPU nodes, unit files) and
starts python3 once. Hosts and their ssh settings come from Ansible's own inventory
(`ansible-inventory --list`). With --cold, the first apply is taken as a cold converge (run it right
after `provision lab up`) and its task time is split into reboots, installs and the rest. Every
figure is a median over --repeat runs and is reported as a ratio to the floor measured in the same
run, because these machines are noisy. docs/performance.md shows the figures of docs/performance-lab.json and
docs/performance-fleet.json, rendered by tests/perf/render.py with this module's tables.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

# what a no-op decision reads on a host, in one shell session that starts python3 once
FLOOR_SCRIPT = (
    "cat /proc/cmdline /proc/sys/kernel/random/boot_id /etc/default/grub /etc/default/grub.d/* "
    "/etc/kernel/cmdline 2>/dev/null | wc -c; ls -l /dev/nvidia* /var/lib/provision 2>/dev/null | wc -l; "
    "dmesg 2>/dev/null | wc -l; cat /etc/systemd/system/*.service 2>/dev/null | wc -c; "
    'python3 -c \'import json, os; print(json.dumps(sorted(os.listdir("/var/lib"))) != "")\''
)
INSTALL_WORDS = ("Install", "installer", "Download")
# the controller's CPU (user + system) a fleet point's no-op apply and verify took, medians like the wall times
CPU_KEYS = ("apply_noop_cpu", "verify_cpu")


def inventory_hosts(inventory: Path) -> dict[str, dict]:
    """Every host with its merged variables, as Ansible resolves them."""
    out = subprocess.run(
        [str(BIN / "ansible-inventory"), "-i", str(inventory), "--list"],
        capture_output=True,
        text=True,
        check=True,
        stdin=subprocess.DEVNULL,
    )
    data = json.loads(out.stdout)
    return data.get("_meta", {}).get("hostvars", {})


def ssh_command(hostvars: dict, command: str) -> list[str]:
    cmd = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes"]
    if hostvars.get("ansible_port"):
        cmd += ["-p", str(hostvars["ansible_port"])]
    if hostvars.get("ansible_ssh_private_key_file"):
        cmd += ["-i", str(hostvars["ansible_ssh_private_key_file"])]
    cmd += shlex.split(str(hostvars.get("ansible_ssh_common_args", "")))
    return [*cmd, f"{hostvars.get('ansible_user', 'root')}@{hostvars['ansible_host']}", command]


def floor_once(hosts: dict[str, dict]) -> float:
    def one(name: str) -> None:
        proc = subprocess.run(
            ssh_command(hosts[name], FLOOR_SCRIPT),
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=120,
        )
        if proc.returncode != 0:
            raise SystemExit(f"floor: ssh to {name} failed: {proc.stderr.strip()}")

    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=len(hosts)) as pool:
        list(pool.map(one, hosts))
    return time.monotonic() - start


def timed(cmd: list[str], env: dict | None = None) -> tuple[float, subprocess.CompletedProcess]:
    """The command's wall time and its process; `proc.cpu_s` is the controller's CPU it took (below)."""
    start, before = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(
        cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})}, cwd=REPO
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # user and system time of the command and every process below it that was waited for: provision,
    # ansible-playbook and its forked workers, their ssh clients. ssh's ControlPersist masters are not waited for:
    # their CPU is not in it.
    proc.cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return time.monotonic() - start, proc


def provision(*args: str, env: dict | None = None) -> tuple[float, dict]:
    seconds, data, _ = provision_cpu(*args, env=env)
    return seconds, data


def provision_cpu(*args: str, env: dict | None = None) -> tuple[float, dict, float]:
    """A provision command's wall time, its JSON result and the controller's CPU seconds it took."""
    seconds, proc = timed([str(BIN / "provision"), *args, "--json"], env)
    try:
        data = json.loads(proc.stdout)
    except ValueError:
        data = {}
    if proc.returncode != 0:
        failures = data.get("failures") or proc.stderr.strip()[-800:]
        raise SystemExit(f"provision {' '.join(args)} exited {proc.returncode}: {failures}")
    return seconds, data, proc.cpu_s


def changed_tasks(data: dict) -> int:
    """The tasks an apply changed, summed over its hosts (`--json`: `result.hosts`, docs/json.md)."""
    return sum(h["changed"] for h in data["result"]["hosts"].values())


SAMPLES = ("floor", "apply_noop", "full_noop", "full_linear_noop", "verify", "stock_noop", "stock_full_noop")
STOCK_CFG = """[defaults]
host_key_checking = True
retry_files_enabled = False
roles_path = {roles}
[ssh_connection]
pipelining = False
ssh_args =
"""


def stock_apply(inventory: Path, workdir: Path, full: bool = False) -> float:
    """site.yml through plain ansible-playbook: no Mitogen, no pipelining, no ControlPersist, default forks.
    With the same extra vars as provision passes; `full` also turns the fingerprint skip off."""
    from provision.paths import collections_path
    from provision.runner import base_extravars

    # the collection these playbooks name (provision.pve_sglang) is this checkout, as in provision's own runs
    collections = workdir / "collections"
    found = str(collections) if collections.exists() else collections_path(collections)
    cfg = workdir / "stock.cfg"
    cfg.write_text(STOCK_CFG.format(roles=REPO / "roles"))
    extra = workdir / "extravars.json"
    extra.write_text(json.dumps({**base_extravars(), **({"provision_state_skip": False} if full else {})}))
    seconds, proc = timed(
        [str(BIN / "ansible-playbook"), "-i", str(inventory), str(REPO / "playbooks" / "site.yml"), "-e", f"@{extra}"],
        env={
            "ANSIBLE_CONFIG": str(cfg),
            "ANSIBLE_COLLECTIONS_PATH": found,
            "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        },
    )
    if proc.returncode != 0 or "changed=0" not in proc.stdout:
        raise SystemExit(f"stock ansible-playbook was not a no-op (rc {proc.returncode}): {proc.stdout[-1500:]}")
    return seconds


def cold_breakdown(record_dir: Path) -> dict[str, float]:
    """Task time of a converge run, split by what the task does (summed over hosts)."""
    split = {"reboots": 0.0, "installs": 0.0, "rest": 0.0}
    for path in sorted((record_dir / "artifacts" / "run" / "job_events").glob("*.json")):
        event = json.loads(path.read_text())
        if event.get("event") not in ("runner_on_ok", "runner_on_failed"):
            continue
        data = event.get("event_data", {})
        task, seconds = data.get("task", ""), float(data.get("duration") or 0)
        if "Reboot" in task or "reboot" in task:
            split["reboots"] += seconds
        elif any(word in task for word in INSTALL_WORDS):
            split["installs"] += seconds
        else:
            split["rest"] += seconds
    return {k: round(v, 1) for k, v in split.items()}


def measure(inventory: Path, repeat: int, cold: bool, runs: Path) -> dict:
    hosts = inventory_hosts(inventory)
    results: dict = {"hosts": len(hosts), "repeat": repeat}
    common = ["--inventory", str(inventory), "--runs-dir", str(runs)]
    seconds, data = provision("apply", *common, "--yes")
    if cold:
        results["cold_converge_s"] = round(seconds, 1)
        results["cold_breakdown_task_s"] = cold_breakdown(Path(data["result"]["record_dir"]))
    samples: dict[str, list[float]] = {key: [] for key in SAMPLES}
    linear = {"PROVISION_ANSIBLE_STRATEGY": "linear"}
    for _ in range(repeat):
        samples["floor"].append(floor_once(hosts))
        runs_of = (("apply_noop", {}, []), ("full_noop", {}, ["--full"]), ("full_linear_noop", linear, ["--full"]))
        for key, env, more in runs_of:
            seconds, data = provision("apply", *common, "--yes", *more, env=env)
            changed = changed_tasks(data)
            if changed:
                raise SystemExit(f"the no-op apply changed {changed} task(s): converge the inventory first")
            samples[key].append(seconds)
        samples["verify"].append(provision("verify", *common)[0])
        samples["stock_noop"].append(stock_apply(inventory, runs))
        samples["stock_full_noop"].append(stock_apply(inventory, runs, full=True))
    medians = {k: round(statistics.median(v), 2) for k, v in samples.items()}
    results["seconds"] = medians
    results["samples"] = {k: [round(x, 2) for x in v] for k, v in samples.items()}
    floor = medians["floor"]
    results["ratios"] = {
        "apply_noop/floor": round(medians["apply_noop"] / floor, 1),
        "verify/floor": round(medians["verify"] / floor, 1),
        "stock_noop/apply_noop": round(medians["stock_noop"] / medians["apply_noop"], 1),
        "stock_full_noop/full_noop": round(medians["stock_full_noop"] / medians["full_noop"], 1),
        "stock_full_noop/apply_noop": round(medians["stock_full_noop"] / medians["apply_noop"], 1),
    }
    return results


FLEET_TAGS = "gpu,sglang,verify"


def fleet_point(count: int, repeat: int, runs: Path) -> dict:
    """A fresh lab with `count` SGLang containers on one nspawn node (`lab up --nodes nspawn`: no bootloader is
    involved here): the gpu+sglang converge, then no-op apply and verify."""
    subprocess.run([str(BIN / "provision"), "lab", "down"], capture_output=True, stdin=subprocess.DEVNULL, cwd=REPO)
    seconds, proc = timed([str(BIN / "provision"), "lab", "up", "--containers", str(count), "--nodes", "nspawn"])
    if proc.returncode != 0:
        raise SystemExit(f"lab up --containers {count} failed: {proc.stderr.strip()[-800:]}")
    inventory = REPO / "inventory" / "lab"
    hosts = {k: v for k, v in inventory_hosts(inventory).items() if v.get("proxmox_vmid")}
    common = ["--inventory", str(inventory), "--runs-dir", str(runs), "--limit", "gpu_containers"]
    point: dict = {"containers": count, "lab_up_s": round(seconds, 1)}
    point["converge_s"] = round(provision("apply", *common, "--yes", "--tags", FLEET_TAGS)[0], 1)
    samples: dict[str, list[float]] = {k: [] for k in ("floor", "ansible_floor", "apply_noop", "verify", *CPU_KEYS)}
    for _ in range(repeat):
        samples["floor"].append(floor_once(hosts))
        samples["ansible_floor"].append(ansible_floor(inventory, "gpu_containers", runs))
        seconds, data, cpu = provision_cpu("apply", *common, "--yes", "--tags", FLEET_TAGS)
        assert not changed_tasks(data), "the fleet's no-op apply changed something"
        samples["apply_noop"].append(seconds)
        samples["apply_noop_cpu"].append(cpu)
        seconds, _, cpu = provision_cpu("verify", *common)
        samples["verify"].append(seconds)
        samples["verify_cpu"].append(cpu)
    point.update({f"{k}_s": round(statistics.median(v), 2) for k, v in samples.items()})
    return point


def ansible_floor(inventory: Path, limit: str, runs: Path) -> float:
    """tests/perf/one_read.py: one raw read per host through provision's runner, in a process of its own."""
    seconds, proc = timed([sys.executable, "-m", "tests.perf.one_read", str(inventory), limit, str(runs)])
    if proc.returncode != 0:
        raise SystemExit(f"the Ansible floor failed: {proc.stderr.strip()[-800:]}")
    return seconds


def fleet(counts: list[int], repeat: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="provision-perf-") as runs:
        points = [fleet_point(n, repeat, Path(runs)) for n in counts]
    subprocess.run([str(BIN / "provision"), "lab", "down"], capture_output=True, stdin=subprocess.DEVNULL, cwd=REPO)
    first, last = points[0], points[-1]
    keys = ("apply_noop_s", "verify_s", "converge_s", "floor_s", "ansible_floor_s", *(k + "_s" for k in CPU_KEYS))
    growth = {k: round(last[k] / first[k], 2) for k in keys}
    per_host = (
        {
            k: round((last[k] - first[k]) / (last["containers"] - first["containers"]), 2)
            for k in ("apply_noop_s", "verify_s", "converge_s", *(k + "_s" for k in CPU_KEYS))
        }
        if len(points) > 1
        else {}
    )
    return {
        "tags": FLEET_TAGS,
        "repeat": repeat,
        "points": points,
        "growth": growth,
        "seconds_per_added_host": per_host,
    }


FLEET_COLUMNS = (
    "floor_s",
    "ansible_floor_s",
    "apply_noop_s",
    "verify_s",
    "converge_s",
    "apply_noop_cpu_s",
    "verify_cpu_s",
)


def fleet_table(result: dict) -> str:
    """The fleet's figures per container count, then their growth from the first count to the last."""
    points = result["points"]
    lines = [
        "| containers | floor (s) | Ansible floor (s) | no-op apply (s) | verify (s) | gpu+sglang converge (s) "
        "| controller CPU, no-op apply (s) | controller CPU, verify (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += ["| " + " | ".join(str(p[k]) for k in ("containers", *FLEET_COLUMNS)) + " |" for p in points]
    first, last = points[0], points[-1]
    span = f"{first['containers']} → {last['containers']}"
    lines.append(f"| growth {span} | " + " | ".join(f"{result['growth'][k]}×" for k in FLEET_COLUMNS) + " |")
    added = last["containers"] - first["containers"]
    if added:
        per = [round((last[k] - first[k]) / added, 2) for k in FLEET_COLUMNS]
        lines.append("| seconds per added container | " + " | ".join(map(str, per)) + " |")
    return "\n".join(lines)


def fleet_chart(result: dict, path: Path) -> None:
    """Two panels: the no-op runs beside their floors, and the converge (tens of times longer) on its own scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [p["containers"] for p in result["points"]]
    fig, (noop, converge) = plt.subplots(1, 2, figsize=(10, 4))
    lines = {
        noop: (
            ("apply_noop_s", "no-op apply"),
            ("verify_s", "verify"),
            ("ansible_floor_s", "Ansible floor (one raw read per host)"),
            ("floor_s", "floor (one ssh read per host)"),
        ),
        converge: (("converge_s", "gpu+sglang converge"),),
    }
    for ax, series in lines.items():
        for key, label in series:
            ax.plot(xs, [p[key] for p in result["points"]], marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xlabel("SGLang containers (on nspawn nodes)")
        ax.set_ylabel("seconds")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize="small")
    noop.set_title("no-op runs against host count")
    converge.set_title("converge against host count")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


LAB_ROWS = (
    ("floor", "floor: one ssh session per host, all at once"),
    ("apply_noop", "`provision apply`, no-op"),
    ("verify", "`provision verify`"),
    ("stock_noop", "same playbooks, stock `ansible-playbook` settings, no-op"),
    ("full_noop", "`provision apply --full` (every phase's tasks run), no-op"),
    ("full_linear_noop", "the same, Ansible's linear strategy (no Mitogen)"),
    ("stock_full_noop", "stock `ansible-playbook` settings, every phase's tasks run, no-op"),
)


def as_table(results: dict) -> str:
    """One row per figure of the VM-lab run: its median, its samples and its ratio to the floor."""
    s, samples = results["seconds"], results.get("samples", {})
    floor = s["floor"]
    lines = [
        f"| what ({results['hosts']} hosts, median of {results['repeat']}) | seconds | samples | × floor |",
        "|---|---|---|---|",
    ]
    for key, label in LAB_ROWS:
        runs = ", ".join(map(str, samples.get(key, [])))
        lines.append(f"| {label} | {s[key]} | {runs} | {round(s[key] / floor, 1)} |")
    if "cold_converge_s" in results:
        b, cold = results["cold_breakdown_task_s"], results["cold_converge_s"]
        lines.append(
            f"| cold converge (task time: reboots {b['reboots']}, installs {b['installs']}, rest {b['rest']}) "
            f"| {cold} | | {round(cold / floor, 1)} |"
        )
    return "\n".join(lines)


def stock_ratios(results: dict) -> str:
    r = results["ratios"]
    return (
        f"stock / provision no-op, same skip: {r['stock_noop/apply_noop']}×; every task run: "
        f"{r['stock_full_noop/full_noop']}×; stock with every task run / provision's no-op: "
        f"{r['stock_full_noop/apply_noop']}×"
    )


def write_json(path: Path, result: dict, date: str) -> None:
    """The figures with the day the run started (UTC), which docs/performance.md shows (tests/perf/render.py)."""
    path.write_text(json.dumps({"date": date, **result}, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inventory", type=Path, default=REPO / "inventory" / "lab")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cold", action="store_true", help="the first apply is a cold converge: break it down")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--fleet", help="container counts, e.g. 1,4,16: each on a fresh lab (lab up/down)")
    parser.add_argument("--chart", type=Path, help="with --fleet: time against host count, as a PNG")
    args = parser.parse_args(argv)
    date = time.strftime("%Y-%m-%d", time.gmtime())
    if args.fleet:
        result = fleet([int(n) for n in args.fleet.split(",")], args.repeat)
        print(fleet_table(result))
        if args.chart:
            fleet_chart(result, args.chart)
        if args.json:
            write_json(args.json, result, date)
        return 0
    with tempfile.TemporaryDirectory(prefix="provision-perf-") as runs:
        results = measure(args.inventory.resolve(), args.repeat, args.cold, Path(runs))
    print(as_table(results))
    print(stock_ratios(results))
    if args.json:
        write_json(args.json, results, date)
    return 0


if __name__ == "__main__":
    sys.exit(main())
