"""systemd-nspawn containers that stand in for the LXC container running SGLang.

Each boots the lab's bookworm rootfs (read-only lower layer; its own writable upper layer)
with systemd as PID 1, in a network namespace of its own joined to the host by a veth pair,
with the device nodes that the lab's PVE made from the CT's devN entries (`ctbody.py`). A
small supervisor restarts nspawn when the container reboots (exit 133), as
systemd-nspawn@.service does, so `systemctl reboot` inside works.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from provision.errors import ProvisionError
from provision.lab.machine import LabMachine
from provision.lab.tokenizer import write_tokenizer

# where the lab's "model" lives in the container (sglang_model_path); it holds only a tokenizer
MODEL_DIR = "/srv/models/lab-standin"
# An offline site's package share in every lab CT: the real sglang wheel and the lab's SGLang stand-in.
WHEELHOUSE_IN_CONTAINER = "/srv/provision-wheelhouse"
STANDIN_CONTEXT = 262144  # the stand-in's default context length (the scenario's)
# In an unprivileged LXC without `features: nesting=1`, AppArmor refuses the mounts that systemd's sandboxing
# (PrivateTmp=, ProtectSystem=, ...) makes in a unit's new mount namespace: the unit fails with 226/NAMESPACE
# (pve-container LXC/Config.pm: nesting is "also required by systemd to isolate services"). nspawn allows them.
# The lab gets the same effect by putting a file where systemd builds a unit's root: the mount onto it fails
# with ENOTDIR, which systemd does not excuse as "containerized" (only EPERM/EACCES from unshare are), so every
# sandboxed unit fails at step NAMESPACE and every other unit runs. Refusing unshare() instead would not do:
# systemd then runs the unit unsandboxed and says nothing (src/core/execute.c, insist_on_sandboxing).
NO_NESTING_TARGET = "/run/systemd/unit-root"
UNIFIED_MOUNTS = (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))
# The lab's CTs reach each other as CTs on one PVE bridge (vmbr0) do: a gateway CT calls its workers. This machine
# forwards what comes in on a lab link to another lab link only: forwarding is on for the link's interface alone
# (net.ipv4.ip_forward stays as it is), and two policy rules send what enters it to the main table for the lab's
# range, its default route suppressed, and refuse everything else ("No route to host"), so nothing a CT sends leaves
# this machine.
LAB_RANGE = "10.213.0.0/16"
RULE_PREFS = (2130, 2131)
# A container shares its node's kernel, so /proc/driver/nvidia/version inside is the node's module, from the moment
# the node loads it. The lab's node is another machine: its /proc/driver is copied in at start, staged under /run
# (nspawn binds nothing into /proc) and mounted over /proc/driver by a unit of the container's own at each of its
# boots (a reboot from inside restarts nspawn without the lab). The staged directory is always bound and only its
# contents change, so a copy the lab's PVE refreshes while the container runs (`show_node_driver`) shows inside.
PROC_DRIVER_STAGE = "/run/lab-proc-driver"
# Its /proc/cmdline is the node's too (neither LXC nor lxcfs gives a container its own): the node's line at the CT's
# start, staged and mounted by the same unit. A node boots its line once per boot, and its CTs start after it.
PROC_CMDLINE_STAGE = "/run/lab-proc-cmdline"
PROC_DRIVER_UNIT = f"""[Unit]
Description=Lab: the node's /proc/driver and /proc/cmdline (one kernel, as in an LXC)
DefaultDependencies=no
ConditionPathIsDirectory={PROC_DRIVER_STAGE}
Before=sysinit.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/mount --bind {PROC_DRIVER_STAGE} /proc/driver
ExecStart=/bin/sh -c 'if [ -f {PROC_CMDLINE_STAGE} ]; then mount --bind {PROC_CMDLINE_STAGE} /proc/cmdline; fi'
"""


# What pve-container writes into a new CT at create (LXC/Setup.pm post_create_hook): a host key of each type
# (Setup/Base.pm ssh_host_key_types_to_generate), and root's keys from `ssh-public-keys` between PVE's markers
# (Setup/Base.pm set_user_authorized_ssh_keys -> ct_modify_file, file mode 0700 as PVE writes it).
SSH_HOST_KEY_TYPES = ("rsa", "ecdsa", "ed25519")
PVE_BLOCK = ("# --- BEGIN PVE ---\n", "# --- END PVE ---\n")


def make_node(node: Path, dev: dict) -> None:
    node.parent.mkdir(parents=True, exist_ok=True)
    node.unlink(missing_ok=True)
    os.mknod(node, dev["mode"] | 0o020000, os.makedev(dev["major"], dev["minor"]))
    node.chmod(dev["mode"])
    os.chown(node, dev["uid"], dev["gid"])


@dataclass
class ContainerSpec:
    name: str
    index: int  # picks the 10.213.<index>.0/30 link
    gpus: int = 2
    # made by a create through the lab's API (`ctbody.py`): its identity (host keys, root's keys) is what the create
    # wrote into its rootfs, and it has none of the lab's own additions (the `ops` user, the model directory)
    created: bool = False

    @property
    def netns(self) -> str:
        return f"provision-lab-{self.index}"

    @property
    def host_if(self) -> str:
        return f"plab{self.index}"

    @property
    def host_addr(self) -> str:
        return f"10.213.{self.index}.1"

    @property
    def address(self) -> str:
        return f"10.213.{self.index}.2"


def _sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(cmd), stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise ProvisionError(f"lab: {' '.join(cmd)} failed: {proc.stderr.strip()}")
    return proc


def _cgroup_procs(cgroup: Path) -> str:
    """The pids in a cgroup (nothing once it is gone)."""
    try:
        return (cgroup / "cgroup.procs").read_text().strip()
    except OSError:
        return ""


def _signal_group(pgid: int, signum: int) -> None:
    """Signal a process group that may empty at any moment: one that is gone already has nothing left to signal."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signum)


def _remove_cgroup_tree(top: Path, deadline: float) -> None:
    """Kill what runs in a cgroup and the cgroups below it, then remove them deepest first, each once it is empty (a
    cgroup directory goes with rmdir alone): OSError when one is still busy at `deadline`."""
    tree = [*sorted((d for d in top.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts)), top]
    for pid in {int(p) for d in tree for p in _cgroup_procs(d).split()}:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for d in tree:
        while _cgroup_procs(d) and time.monotonic() < deadline:
            time.sleep(0.1)
        with contextlib.suppress(FileNotFoundError):
            d.rmdir()


def _mounted(path: Path) -> bool:
    return any(line.split()[1] == str(path) for line in Path("/proc/mounts").read_text().splitlines())


class LabContainer(LabMachine):
    kind = "container"
    # a container shares the kernel's boot_id; its own boots are told apart by when its PID 1 started
    boot_id_command = "echo $(cat /proc/sys/kernel/random/boot_id)-$(cut -d' ' -f22 /proc/1/stat)"

    def __init__(
        self,
        spec: ContainerSpec,
        workdir: Path,
        rootfs: Path,
        client_key: Path,
        known_hosts: Path,
        read_only_binds: dict[str, Path] | None = None,
    ):
        super().__init__(spec.name, workdir, client_key, known_hosts)
        self.spec = spec
        self.read_only_binds = read_only_binds or {}
        self.rootfs = rootfs
        self.root = workdir / "root"
        self.pidfile = workdir / "supervisor.pid"
        self.log = workdir / "nspawn.log"
        if spec.created:  # its host key is the one the create generated in its rootfs
            self.host_key = workdir / "upper" / "etc" / "ssh" / "ssh_host_ed25519_key"

    def record(self) -> dict:
        """What another process needs to drive this body (`from_record`): the lab's seed and the API's list."""
        return {
            "spec": vars(self.spec),
            "workdir": str(self.dir),
            "rootfs": str(self.rootfs),
            "client_key": str(self.client_key),
            "known_hosts": str(self.known_hosts),
            "binds": {k: str(v) for k, v in self.read_only_binds.items()},
        }

    @classmethod
    def from_record(cls, record: dict) -> LabContainer:
        return cls(
            ContainerSpec(**record["spec"]),
            Path(record["workdir"]),
            Path(record["rootfs"]),
            Path(record["client_key"]),
            Path(record["known_hosts"]),
            read_only_binds={k: Path(v) for k, v in record["binds"].items()},
        )

    @property
    def devices_file(self) -> Path:
        return self.dir / "devices.json"

    def devices(self) -> list[dict]:
        """The device nodes of the current start, as the lab's PVE made them from the CT's devN entries
        (`provision/lab/ctbody.py`): [{name (under /dev), major, minor, mode, uid, gid}]."""
        try:
            return json.loads(self.devices_file.read_text())
        except (OSError, ValueError):
            return []

    # ---------------------------------------------------------------- set-up
    def prepare(self) -> None:
        upper, work = self.dir / "upper", self.dir / "work"
        for d in (upper / "etc", work, self.root, self.dir / "dev"):
            d.mkdir(parents=True, exist_ok=True)
        if not self.spec.created:
            self._lab_identity(upper)
        (upper / "etc" / "hostname").write_text(self.spec.name + "\n")
        units = upper / "etc" / "systemd" / "system"
        (units / "sysinit.target.wants").mkdir(parents=True, exist_ok=True)
        (units / "lab-proc-driver.service").write_text(PROC_DRIVER_UNIT)
        link = units / "sysinit.target.wants" / "lab-proc-driver.service"
        if not link.is_symlink():
            link.symlink_to("../lab-proc-driver.service")
        (upper / "etc" / "hosts").write_text(f"127.0.0.1 localhost\n127.0.1.1 {self.spec.name}\n")
        shutil.rmtree(self.dir / "dev", ignore_errors=True)
        for dev in self.devices():
            make_node(self.dir / "dev" / dev["name"], dev)
        if not _mounted(self.root):
            _sh(
                "mount",
                "-t",
                "overlay",
                "overlay",
                "-o",
                f"lowerdir={self.rootfs},upperdir={upper},workdir={work}",
                str(self.root),
            )
        self._network_up()

    def _lab_identity(self, upper: Path) -> None:
        """What the lab gives the CTs it seeds: a host key known before first boot, root's key the lab's client key,
        the `ops` user, and the site's model directory (the stand-in needs no weights, the benchmark a tokenizer)."""
        self.install_keys(upper)
        write_tokenizer(upper / MODEL_DIR.lstrip("/"), context_length=STANDIN_CONTEXT)
        self._install_ops_user(upper)

    def install_keys(self, upper: Path) -> None:
        """The machine's host key, known before its first boot, and root's key the lab's client key."""
        self.make_host_key()
        (upper / "etc" / "ssh").mkdir(parents=True, exist_ok=True)
        for suffix, mode in (("", 0o600), (".pub", 0o644)):
            target = upper / "etc" / "ssh" / f"ssh_host_ed25519_key{suffix}"
            target.write_bytes(Path(f"{self.host_key}{suffix}").read_bytes())
            target.chmod(mode)
        ssh_dir = upper / "root" / ".ssh"
        ssh_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        (ssh_dir / "authorized_keys").write_bytes(Path(f"{self.client_key}.pub").read_bytes())
        (ssh_dir / "authorized_keys").chmod(0o600)

    def post_create(self, ssh_public_keys: str | None) -> None:
        """What a create writes into the new CT's rootfs (pve-container LXC/Setup.pm post_create_hook): root's
        authorized_keys from `ssh-public-keys` in PVE's marked block, and a fresh host key of each type, made with
        ssh-keygen outside the CT and commented root@<hostname> (Setup.pm rewrite_ssh_host_keys)."""
        upper = self.dir / "upper"
        ssh = upper / "etc" / "ssh"
        ssh.mkdir(parents=True, exist_ok=True)
        comment = "root@" + self.spec.name.split(".")[0]
        with tempfile.TemporaryDirectory(dir=self.dir) as tmp:
            for kind in SSH_HOST_KEY_TYPES:
                key = Path(tmp) / kind
                _sh("ssh-keygen", "-q", "-f", str(key), "-t", kind, "-N", "", "-C", comment)
                for suffix, mode in (("", 0o600), (".pub", 0o644)):
                    target = ssh / f"ssh_host_{kind}_key{suffix}"
                    target.write_bytes(Path(f"{key}{suffix}").read_bytes())
                    target.chmod(mode)
        if ssh_public_keys and ssh_public_keys.strip():
            keys = ssh_public_keys if ssh_public_keys.endswith("\n") else ssh_public_keys + "\n"
            (upper / "root" / ".ssh").mkdir(parents=True, exist_ok=True)
            (upper / "root").chmod(0o700)  # as Debian's /root: a directory made in the upper layer wins
            (upper / "root" / ".ssh").chmod(0o700)
            authorized = upper / "root" / ".ssh" / "authorized_keys"
            authorized.write_text(PVE_BLOCK[0] + keys + PVE_BLOCK[1])
            authorized.chmod(0o700)

    @staticmethod
    def _install_ops_user(upper: Path) -> None:
        """The VMs' unprivileged ssh user `ops` with sudo (overlay/common: one script for both)."""
        overlay = Path(__file__).resolve().parent / "overlay" / "common"
        for rel in ("usr/local/lib/lab/ops-user.sh", "etc/systemd/system/lab-ops-user.service"):
            (upper / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(overlay / rel, upper / rel)
        wants = upper / "etc/systemd/system/multi-user.target.wants"
        wants.mkdir(parents=True, exist_ok=True)
        if not (wants / "lab-ops-user.service").is_symlink():
            (wants / "lab-ops-user.service").symlink_to("../lab-ops-user.service")

    def _network_up(self) -> None:
        s = self.spec
        if s.netns not in _sh("ip", "netns", "list").stdout.split():
            _sh("ip", "netns", "add", s.netns)
        if _sh("ip", "link", "show", s.host_if, check=False).returncode != 0:
            _sh("ip", "link", "add", s.host_if, "type", "veth", "peer", "name", "host0", "netns", s.netns)
            _sh("ip", "addr", "add", f"{s.host_addr}/30", "dev", s.host_if)
            _sh("ip", "link", "set", s.host_if, "up")
            _sh("ip", "netns", "exec", s.netns, "ip", "addr", "add", f"{s.address}/30", "dev", "host0")
            _sh("ip", "netns", "exec", s.netns, "ip", "link", "set", "host0", "up")
            _sh("ip", "netns", "exec", s.netns, "ip", "link", "set", "lo", "up")
            _sh("ip", "netns", "exec", s.netns, "ip", "route", "add", "default", "via", s.host_addr)
        self._forwarding(True)

    def _forwarding(self, on: bool) -> None:
        """Forward between this CT's link and the lab's other links, and nowhere else (LAB_RANGE)."""
        host_if = self.spec.host_if
        for pref in RULE_PREFS:
            while _sh("ip", "rule", "del", "iif", host_if, "pref", str(pref), check=False).returncode == 0:
                pass
        if on:
            Path(f"/proc/sys/net/ipv4/conf/{host_if}/forwarding").write_text("1\n")
            lab_range = ("to", LAB_RANGE, "lookup", "main", "suppress_prefixlength", "0")
            _sh("ip", "rule", "add", "iif", host_if, *lab_range, "pref", str(RULE_PREFS[0]))
            _sh("ip", "rule", "add", "iif", host_if, "prohibit", "pref", str(RULE_PREFS[1]))

    # ---------------------------------------------------------------- lifecycle
    def nspawn_command(self) -> list[str]:
        cmd = [
            "systemd-nspawn",
            "--quiet",
            "--boot",
            f"--directory={self.root}",
            f"--machine={self.spec.name}",
            "--register=no",
            "--keep-unit",
            "--console=passive",
            f"--network-namespace-path=/run/netns/{self.spec.netns}",
        ]
        for dev in self.devices():
            cmd.append(f"--bind={self.dir / 'dev' / dev['name']}:/dev/{dev['name']}")
        if (self.dir / "proc-driver").is_dir():  # mounted onto /proc/driver once the container runs
            cmd.append(f"--bind-ro={self.dir / 'proc-driver'}:{PROC_DRIVER_STAGE}")
        if (self.dir / "proc-cmdline").is_file():  # onto /proc/cmdline
            cmd.append(f"--bind-ro={self.dir / 'proc-cmdline'}:{PROC_CMDLINE_STAGE}")
        if not self.nesting():
            marker = self.dir / "no-nesting"
            marker.write_text("lab: features: nesting=1 is not set on this CT\n")
            cmd.append(f"--bind-ro={marker}:{NO_NESTING_TARGET}")
        for inside, outside in self.read_only_binds.items():
            cmd.append(f"--bind-ro={outside}:{inside}")
        return cmd

    def nesting(self) -> bool:
        return (self.dir / "nesting").exists()

    def configure(
        self, devices: list[dict], nesting: bool, driver_version: str | None, cmdline: str | None = None
    ) -> None:
        """What the next start gets: device nodes, features: nesting, the node's driver version file and its kernel
        command line."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self.devices_file.write_text(json.dumps(devices))
        (self.dir / "nesting").touch() if nesting else (self.dir / "nesting").unlink(missing_ok=True)
        self.show_node_driver(driver_version)
        if cmdline is not None:
            (self.dir / "proc-cmdline").write_text(cmdline)

    def show_node_driver(self, driver_version: str | None) -> None:
        """The node's /proc/driver as the container sees it (its `nvidia/version`, or none when the node has no module
        loaded), changed in place: the directory itself is what the container has mounted."""
        stage = self.dir / "proc-driver"
        stage.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(stage / "nvidia", ignore_errors=True)
        if driver_version is not None:
            (stage / "nvidia").mkdir()
            (stage / "nvidia" / "version").write_text(driver_version)

    def leader(self) -> int | None:
        """PID (on this host) of the container's init."""
        pid = self.pid()
        if pid is None:
            return None
        for nspawn in _sh("pgrep", "-g", str(pid), "-x", "systemd-nspawn", check=False).stdout.split():
            for child in _sh("pgrep", "-P", nspawn, check=False).stdout.split():
                with contextlib.suppress(OSError):  # the container's init, once nspawn has exec'd it
                    if Path(f"/proc/{child}/comm").read_text().strip() == "systemd":
                        return int(child)
        return None

    def hotplug(self, dev: dict) -> None:
        """Create a device node inside the running container, as PVE 9 does for a new devN."""
        leader = self.leader()
        if leader is None:
            raise ProvisionError(f"lab: container {self.spec.name} is not running")
        path = f"/dev/{dev['name']}"
        # chmod after mknod: mknod -m fails from outside the container's PID namespace (glibc's lchmod needs /proc/self)
        script = (
            f"mkdir -p $(dirname {path}) && rm -f {path} && mknod {path} c {dev['major']} {dev['minor']} && "
            f"chmod {dev['mode']:o} {path} && chown {dev['uid']}:{dev['gid']} {path}"
        )
        _sh("nsenter", "-t", str(leader), "-m", "sh", "-c", script)
        self.devices_file.write_text(json.dumps([*(d for d in self.devices() if d["name"] != dev["name"]), dev]))
        # the entry is in the config now: a reboot from inside (LXC runs the hooks again) brings the node back
        make_node(self.dir / "dev" / dev["name"], dev)
        self._write_command()

    @property
    def command_file(self) -> Path:
        return self.dir / "nspawn.cmd"

    def _write_command(self) -> None:
        self.command_file.write_text(shlex.join(self.nspawn_command()) + "\n")

    def start(self) -> None:
        self.prepare()
        if self.is_running():
            return
        # restart on 133 (the container asked for a reboot), stop on anything else; each start reads the command
        # again, which a hot-plug extends. The supervisor first moves into a cgroup of this container's own
        # (`make_cgroups`), so that nspawn makes its `supervisor` and `payload` cgroups under it.
        self._write_command()
        loop = (
            'for cg in "${@:2}"; do echo $$ > "$cg/cgroup.procs" || exit 1; done; '
            'while :; do eval "$(cat "$1")"; rc=$?; [ "$rc" -eq 133 ] || exit "$rc"; done'
        )
        with self.log.open("a") as log:
            proc = subprocess.Popen(
                ["bash", "-c", loop, "supervisor", str(self.command_file), *map(str, self.make_cgroups())],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "SYSTEMD_NSPAWN_LOCK": "0"},
            )
        self.pidfile.write_text(str(proc.pid))

    def stop(self, timeout: float = 30) -> None:
        pid = self.pid()
        if pid is not None and self.is_running():
            _signal_group(pid, signal.SIGTERM)  # nspawn shuts the container down in order
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and _sh("pgrep", "-g", str(pid), check=False).returncode == 0:
                time.sleep(0.2)
            if _sh("pgrep", "-g", str(pid), check=False).returncode == 0:
                _signal_group(pid, signal.SIGKILL)
                time.sleep(0.5)
        self.pidfile.unlink(missing_ok=True)
        self.remove_cgroups()

    @property
    def cgroups_file(self) -> Path:
        return self.dir / "cgroups"  # the cgroups `make_cgroups` made, which `remove_cgroups` removes

    def make_cgroups(self) -> list[Path]:
        """This container's cgroup in each hierarchy where its systemd makes its own (cgroup v1's name=systemd, the
        unified one), under the cgroup of the process that starts it, as LXC gives each CT its own. nspawn
        (--keep-unit) moves itself into `<its cgroup>/supervisor` and the container into `<its cgroup>/payload`:
        started from one shared cgroup, every container's systemd would manage the same `payload/system.slice/<unit>`
        directories, and one container's unit removed another's as it started (seen: 219/CGROUP, "Failed to attach
        to cgroup ... No such file or directory", 1 CT in 16). The paths are kept in `cgroups_file`."""
        made = []
        digest = hashlib.sha256(str(self.dir).encode()).hexdigest()[:8]
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            hierarchy, controllers, path = line.split(":", 2)
            if controllers == "name=systemd":
                mount = Path("/sys/fs/cgroup/systemd")
            elif hierarchy == "0" and not controllers:  # cgroup v2's, where it is mounted (hybrid: unified/)
                mount = next((m for m in UNIFIED_MOUNTS if (m / "cgroup.controllers").exists()), None)
            else:
                continue
            if mount is None or not (mount / "cgroup.procs").exists():
                continue
            own = mount / path.lstrip("/") / "provision-lab" / f"{self.spec.name}-{digest}"
            try:
                own.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise ProvisionError(f"lab: cannot make a cgroup for {self.spec.name} ({own}): {e}") from e
            made.append(own)
        self.cgroups_file.write_text("".join(f"{d}\n" for d in made))
        return made

    def remove_cgroups(self, timeout: float = 10) -> None:
        """The cgroups `make_cgroups` made: what still runs in them once nspawn is gone (a container's processes die
        after it, in a session of their own) is killed, and each is removed once empty. One still busy after
        `timeout` stays listed in `cgroups_file` for the next stop, and the container's log names it."""
        made = self.cgroups_file.read_text().split() if self.cgroups_file.exists() else []
        deadline = time.monotonic() + timeout
        busy = []
        for own in (Path(d) for d in made if Path(d).is_dir()):
            try:
                _remove_cgroup_tree(own, deadline)
            except OSError as e:
                busy.append(own)
                with self.log.open("a") as log:
                    log.write(f"lab: cgroup {own} not removed: {e}\n")
        if busy:
            self.cgroups_file.write_text("".join(f"{d}\n" for d in busy))
        else:
            self.cgroups_file.unlink(missing_ok=True)

    def teardown(self) -> None:
        # the container is thrown away: no orderly shutdown to wait for (nspawn's took the whole 30 s)
        self.stop(timeout=2)
        if _mounted(self.root):
            _sh("umount", str(self.root), check=False)
        self._forwarding(False)
        _sh("ip", "link", "del", self.spec.host_if, check=False)
        _sh("ip", "netns", "del", self.spec.netns, check=False)

    def destroy(self) -> None:
        """What a destroy leaves of the body: nothing (its rootfs's upper layer, link, namespace and files)."""
        self.teardown()
        if _mounted(self.root):
            raise ProvisionError(f"lab: {self.root} is still mounted; not removing {self.dir}")
        shutil.rmtree(self.dir, ignore_errors=True)

    def ssh_destination(self) -> list[str]:
        return [f"root@{self.spec.address}"]

    def known_hosts_name(self) -> str:
        return self.spec.address

    def exit_detail(self) -> str:
        tail = self.log.read_text(errors="replace").strip().splitlines()[-3:] if self.log.exists() else []
        return "nspawn: " + " | ".join(tail)
