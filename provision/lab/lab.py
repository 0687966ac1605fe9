"""`provision lab up|down|status`: the lab's lifecycle and the inventory it writes.

State lives in the lab directory ($PROVISION_LAB_DIR, default ./.lab): the per-lab ssh
client key and known_hosts, the API secrets (0600), VM overlays, the container's upper
layer, logs and state.json. `lab up` writes inventory/lab/ for that state; `lab down`
stops everything and removes both.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from provision.errors import ProvisionError
from provision.lab import pve, wheelhouse
from provision.lab.container import MODEL_DIR, WHEELHOUSE_IN_CONTAINER, ContainerSpec, LabContainer
from provision.lab.ctbody import CREATED_FILE
from provision.lab.image import Image, cache_lock, cache_root, check_tools, ensure_image
from provision.lab.nspawn_node import NSPAWN_KMSG, LabNspawnNode
from provision.lab.specs import BENCH_WHEELS_IN_CONTAINER, ct_spec, hub_model_vars
from provision.lab.vm import LabVm, VmSpec, choose_accel

BOOT_TIMEOUT_S = 600
CONTAINER_NAME = "sglang-01"
# `lab up --gateway`: one more container, with no GPU and not a CT of the lab's PVE, for SGLang's gateway
GATEWAY_NAME = "sglang-gw"
CONTAINER_VMID = 101
TOKEN_NAME = "provision"
DRIVER_VERSION = "580.95.05"
# what fakepve reports for `provision lab up --pve-version N`: PVE 8 leaves every devN change pending until the CT
# restarts, PVE 9 hot-plugs a new one (pve-container 6.0.4)
PVE_VERSIONS = {8: "8.4.1", 9: "9.0.11"}
# the CT as a site makes it in PVE's GUI: unprivileged, nesting on (the wizard's default), started with its node
CONTAINER_CONFIG = {
    "cores": 8,
    "memory": 65536,
    "net0": "name=eth0,bridge=vmbr0,ip=dhcp,type=veth",
    "unprivileged": 1,
    "features": "nesting=1",
    "onboot": 1,
    "ostype": "debian",
    "hostname": "",
}
# the nodes' copy of the stand-in NVIDIA installer, where an offline site's mirror holds NVIDIA's
NODE_DRIVER_MIRROR = "/srv/provision-mirror/nvidia"
# `provision lab up --gpu-link`: what the lab's nvidia-smi reports between GPUs (overlay/.../nvidia-smi)
GPU_LINKS = ("pcie", "nvlink")
GPU_LINK_FILE = "/etc/lab/gpu_link"
# `provision lab up --nodes`: qemu VMs (a bootloader, real reboots), or nspawn containers (provision/lab/nspawn_node.py)
NODE_KINDS = ("vm", "nspawn")


def lab_dir() -> Path:
    return Path(os.environ.get("PROVISION_LAB_DIR", ".lab")).resolve()


def inventory_dir() -> Path:
    return Path(os.environ.get("PROVISION_LAB_INVENTORY", "inventory/lab")).resolve()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def host_specs(count: int, ports: list[int]) -> list[VmSpec]:
    """Host 1 boots with GRUB, host 2 with systemd-boot, further ones alternate."""
    specs = []
    for i in range(count):
        loader = "grub" if i % 2 == 0 else "sdboot"
        name = f"pve-{loader}" + (f"-{i + 1}" if i >= 2 else "")
        specs.append(VmSpec(name=name, bootloader=loader, port=ports[i]))
    return specs


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy(source, target)


@dataclass
class Lab:
    dir: Path = field(default_factory=lab_dir)
    # picks the container network 10.213.<net_index>.0/30 and its namespace, so two labs can coexist
    net_index: int = field(default_factory=lambda: int(os.environ.get("PROVISION_LAB_NET_INDEX", "1")))

    # ---------------------------------------------------------------- state
    @property
    def state_file(self) -> Path:
        return self.dir / "state.json"

    def state(self) -> dict[str, Any]:
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}

    def _save(self, state: dict[str, Any]) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        os.replace(tmp, self.state_file)

    @property
    def client_key(self) -> Path:
        return self.dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.dir / "known_hosts"

    def vms(self, state: dict[str, Any] | None = None) -> list[LabVm | LabNspawnNode]:
        """The nodes: qemu VMs, or with `--nodes nspawn` containers booted from the same rootfs and overlay."""
        state = state or self.state()
        image = state.get("image", {})
        if state.get("nodes") == "nspawn":
            rootfs = Path(image.get("rootfs", ""))
            return [
                LabNspawnNode(
                    VmSpec(**spec), self.dir / "vms" / spec["name"], rootfs, self.client_key, self.known_hosts
                )
                for spec in state.get("vms", [])
            ]
        disks = {"grub": Path(image.get("grub_disk", "")), "sdboot": Path(image.get("sdboot_disk", ""))}
        return [
            LabVm(
                VmSpec(**spec),
                self.dir / "vms" / spec["name"],
                disks[spec["bootloader"]],
                self.client_key,
                self.known_hosts,
            )
            for spec in state.get("vms", [])
        ]

    def workers(self, state: dict[str, Any] | None = None) -> list[LabContainer]:
        """The seeded CTs that serve SGLang: every container but the gateway."""
        state = state or self.state()
        return [c for c in self.containers(state) if c.spec.name != state.get("gateway")]

    def containers(self, state: dict[str, Any] | None = None) -> list[LabContainer]:
        state = state or self.state()
        rootfs = Path(state.get("image", {}).get("rootfs", ""))
        return [
            LabContainer(
                ContainerSpec(**spec),
                self.dir / "containers" / spec["name"],
                rootfs,
                self.client_key,
                self.known_hosts,
                read_only_binds=self._container_binds(),
            )
            for spec in state.get("containers", [])
        ]

    def _container_binds(self) -> dict[str, Path]:
        """What every lab CT sees of this machine: the site's package share, and the node's hardware as its
        nvidia-smi reports it (the link between the GPUs, `set_gpu_link`)."""
        return {WHEELHOUSE_IN_CONTAINER: self.dir / "wheelhouse", GPU_LINK_FILE: self.dir / "gpu_link"}

    def created_containers(self) -> dict[int, LabContainer]:
        """The bodies of the CTs created through the lab's API (and not destroyed), by VMID, as its PVE lists them."""
        try:
            records = json.loads((self.dir / CREATED_FILE).read_text())
        except (OSError, ValueError):
            return {}
        return {int(vmid): LabContainer.from_record(record) for vmid, record in records.items()}

    def vm(self, name: str) -> LabVm:
        return next(v for v in self.vms() if v.spec.name == name)

    def container(self, name: str = CONTAINER_NAME) -> LabContainer:
        return next(c for c in self.containers() if c.spec.name == name)

    def pve_control(self, method: str, path: str, body: dict | None = None) -> Any:
        return pve.control(self.dir, method, path, body)

    def secrets(self) -> dict[str, str]:
        return json.loads((self.dir / "secrets.json").read_text())

    # ---------------------------------------------------------------- up
    def up(
        self,
        hosts: int = 2,
        progress=print,
        cold_boot: bool = False,
        containers: int = 1,
        pve_version: int = 9,
        gpu_link: str = "pcie",
        bare: bool = False,
        nodes: str = "vm",
        gateway: bool = False,
    ) -> dict[str, Any]:
        _check_up_args(hosts, containers, pve_version, gpu_link, nodes, gateway and bare)
        check_tools()
        if self.state().get("up"):
            progress("lab: already up (provision lab down first to rebuild)")
            return self.status()
        timings: dict[str, float] = {}
        try:
            with cache_lock(progress), ThreadPoolExecutor(max_workers=1) as fetch:
                # the wheelhouse (pip downloads into the cache, then copies) beside the image build (mmdebstrap, the
                # disks): a cold cache pays the longer of the two, not their sum
                start = time.monotonic()
                self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
                house = fetch.submit(self._build_wheelhouse, gateway)
                image = ensure_image(progress)
                timings["image_s"] = round(time.monotonic() - start, 1)
                timings.update(image.timings_s)
                state = self._init_state(hosts, image, cold_boot, 0 if bare else containers, bare, nodes, gateway)
                state["pve_version"] = PVE_VERSIONS[pve_version]
                (self.dir / "gpu_link").write_text(gpu_link + "\n")
                start = time.monotonic()
                house.result()
                timings["wheelhouse_s"] = round(time.monotonic() - start, 1)  # what the image build did not cover
                cts, vms = self.containers(state), self.vms(state)
                accel = choose_accel() if nodes == "vm" else "nspawn"
                state["accel"] = accel
                progress(
                    f"lab: starting {len(vms)} nspawn node(s)"
                    if nodes == "nspawn"
                    else f"lab: starting {len(vms)} VM(s) under {accel.upper()} "
                    f"(a first boot takes about {70 * len(vms)} s on 2 cores, then each resumes from its booted "
                    "snapshot in seconds)"
                )
                start = time.monotonic()
                with ThreadPoolExecutor(max_workers=len(vms) or 1) as pool:
                    resumed = list(pool.map(lambda v: self._start_vm(v, accel, cold_boot, progress), vms))
                timings["vms_to_ssh_s"] = round(time.monotonic() - start, 1)
            for vm in vms:  # what the node's pve-guests.service needs to call startall/stopall (lab stand-in)
                self._node_api_file(vm, state)
                if bare:  # only a bare lab's inventory pins the driver and names this installer (_node_vars)
                    self._driver_mirror(vm)
            self.set_gpu_link(gpu_link, vms)
            # the API starts the containers as PVE does (prestart checks against their node), so nodes come first
            start = time.monotonic()
            self._start_pve(state)
            if gateway:
                self.start_gateway(state)
            for ct in cts:
                ct.wait_for_ssh(120)
            timings["container_to_ssh_s"] = round(time.monotonic() - start, 1)
            if bare:  # the weights of the CT the apply creates come from the lab's hub (write_inventory)
                hub = self.start_hf_hub()
                state["hub"] = {key: hub[key] for key in ("url", "repo", "commit")}
            state["vms_resumed"] = sum(resumed)
            state["up"] = True
            state["timings"] = timings
            self._save(state)
            self.write_inventory(state)
            total = sum(timings.get(k, 0) for k in ("image_s", "wheelhouse_s", "container_to_ssh_s", "vms_to_ssh_s"))
            progress(f"lab: up in {total:.0f}s; inventory: {inventory_dir()}")
            return self.status()
        except BaseException:
            progress("lab: bring-up failed; tearing down what was started")
            self.down(progress=lambda *_: None)
            raise

    def recreate(self, progress=print, nodes: str | None = None) -> dict[str, Any]:
        """Down, then up again in the same shape (nodes, containers, PVE version, GPU link), or with nodes of another
        kind: a fresh lab from the cached image and booted snapshots, in about 20 s once they exist."""
        state = self.state()
        version = next((k for k, v in PVE_VERSIONS.items() if v == state.get("pve_version")), 9)
        link_file = self.dir / "gpu_link"
        link = link_file.read_text().strip() if link_file.is_file() else GPU_LINKS[0]
        hosts, containers = len(state.get("vms", [])) or 2, len(self.workers(state)) or 1
        self.down(progress=progress)
        return self.up(
            hosts=hosts,
            containers=containers,
            pve_version=version,
            gpu_link=link,
            progress=progress,
            bare=bool(state.get("bare")),
            nodes=nodes or state.get("nodes", "vm"),
            gateway=bool(state.get("gateway")),
        )

    @staticmethod
    def _start_vm(vm: LabVm | LabNspawnNode, accel: str, cold_boot: bool, progress) -> bool:
        """Resume the VM from its booted snapshot; without one, boot it, save one, and resume from that. An nspawn
        node boots in seconds."""
        if isinstance(vm, LabNspawnNode):
            vm.start()
            vm.wait_for_ssh(BOOT_TIMEOUT_S)
            return False
        if vm.start(accel, resume=not cold_boot):
            vm.wait_for_ssh(BOOT_TIMEOUT_S)
            vm.after_resume()
            return True
        vm.wait_for_ssh(BOOT_TIMEOUT_S)
        if cold_boot:
            return False
        progress(f"lab: saving {vm.spec.name}'s booted state for the next lab up")
        vm.save_snapshot(accel)
        return Lab._start_vm(vm, accel, cold_boot, progress)

    def start_gateway(self, state: dict[str, Any]) -> None:
        """`--gateway`'s container: on this machine's links like the CTs, but no CT of the lab's PVE, as a gateway on a
        host of its own is (a node's reboot leaves it up). Unprivileged-LXC rules as a CT made in PVE's GUI: nesting
        on, no device, no node driver."""
        gateway = next(c for c in self.containers(state) if c.spec.name == state["gateway"])
        gateway.configure(devices=[], nesting=True, driver_version=None)
        gateway.start()

    def _node_api_file(self, vm: LabVm, state: dict[str, Any]) -> None:
        """/etc/lab/pve-api on a node: the lab's API as the guest reaches it (slirp's 10.0.2.2 is this host's
        loopback; an nspawn node shares this host's network), the node's name and the token that its
        pve-guests.service stand-in calls startall with."""
        token = f"root@pam!{TOKEN_NAME}={self.secrets()['pve_token_secret']}"
        text = f"url=https://{vm.api_address}:{state['pve_port']}/api2/json\nnode={vm.spec.name}\ntoken={token}\n"
        _pipe_to_node(vm, "umask 077 && mkdir -p /etc/lab && cat > /etc/lab/pve-api", text, "write /etc/lab/pve-api")

    def set_gpu_link(self, link: str, vms: list[LabVm] | None = None) -> None:
        """The link between each pair of the fake GPUs, as every nvidia-smi in the lab reports it (`topo -m`):
        NV18 (nvlink) or PHB (pcie). A test may change it on a running lab, as a hardware change would."""
        if link not in GPU_LINKS:
            raise ProvisionError(f"gpu link: one of {', '.join(GPU_LINKS)}")
        with open(self.dir / "gpu_link", "w") as f:  # in place: the containers see it through a bind mount
            f.write(link + "\n")
        for vm in self.vms() if vms is None else vms:
            _pipe_to_node(vm, f"mkdir -p /etc/lab && cat > {GPU_LINK_FILE}", link + "\n", f"write {GPU_LINK_FILE}")

    def inject_kernel_line(self, vm_name: str, message: str) -> None:
        """Log `message` in a node's kernel ring buffer (through /dev/kmsg, so journald records it as a kernel
        message), as the IOMMU or the NVIDIA driver would log a fault. What it cannot copy: the kernel itself
        logs with facility kern, a line written to /dev/kmsg from userspace gets facility user."""
        node = self.vm(vm_name)
        if isinstance(node, LabNspawnNode):  # a container may not write the kernel's ring: the node's own (dmesg shim)
            line = f'printf "%s %s\\n" "$(date +%s.%N)" "$(cat)" >> {NSPAWN_KMSG}'
            _pipe_to_node(node, line, message, f"append to {NSPAWN_KMSG}")
            return
        _pipe_to_node(node, "cat > /dev/kmsg", f"<3>{message}\n", "write to /dev/kmsg")

    def install_kernel(self, vm_name: str, headers: bool = False) -> str:
        """Install on a node, as an `apt full-upgrade` does, the newer kernel the lab's apt repository holds
        (the newest Debian 12 kernel ABI; the image boots the one before it), with or without its headers; returns
        its release. The kernel's own
        hooks run: initramfs, update-grub on the GRUB node, and dkms's, which builds the node's DKMS modules for it
        where its headers are. On the systemd-boot node `proxmox-boot-tool refresh` follows, as PVE's
        zz-proxmox-boot hook runs it. The node boots it at its next reboot."""
        node = self.vm(vm_name)
        if isinstance(node, LabNspawnNode):
            raise ProvisionError(f"lab kernel: {vm_name} is an nspawn node, which boots no kernel: use a lab of VMs")
        found = node.ssh("dpkg-deb -f /srv/lab-apt/linux-image-[0-9]*_*.deb Package", timeout=30)
        if found.returncode != 0 or not found.stdout.strip():
            raise ProvisionError(f"lab kernel: no newer kernel in {vm_name}'s /srv/lab-apt: {found.stderr.strip()}")
        release = found.stdout.strip().removeprefix("linux-image-")
        packages = [f"linux-image-{release}"] + ([f"linux-headers-{release}"] if headers else [])
        refresh = " && proxmox-boot-tool refresh" if node.spec.bootloader == "sdboot" else ""
        command = (
            "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "
            + " ".join(packages)
            + refresh
        )
        done = node.ssh(command, timeout=900)
        if done.returncode != 0:
            raise ProvisionError(
                f"lab kernel: installing {' '.join(packages)} on {vm_name} failed: "
                f"{(done.stderr or done.stdout).strip()[-800:]}"
            )
        return release

    def _client_key(self) -> None:
        """The lab's ssh client key: one per cache, since the VMs' booted snapshots already trust it."""
        cached = cache_root() / "client" / "id_ed25519"
        if not cached.exists():
            cached.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "provision-lab", "-f", str(cached)], check=True
            )
        for suffix in ("", ".pub"):
            target = Path(f"{self.client_key}{suffix}")
            if not target.exists():
                shutil.copy(f"{cached}{suffix}", target)
        self.client_key.chmod(0o600)

    def _init_state(
        self,
        hosts: int,
        image: Image,
        cold_boot: bool,
        containers: int,
        bare: bool = False,
        nodes: str = "vm",
        gateway: bool = False,
    ) -> dict[str, Any]:
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._client_key()
        secrets_file = self.dir / "secrets.json"
        if not secrets_file.exists():
            secrets_file.touch(mode=0o600)
            secrets_file.write_text(
                json.dumps({"pve_password": secrets.token_urlsafe(18), "pve_token_secret": str(uuid.uuid4())})
            )
        (self.dir / "pve-password").touch(mode=0o600)
        (self.dir / "pve-password").write_text(self.secrets()["pve_password"])
        vm_specs = host_specs(hosts, [_free_port() for _ in range(hosts)])
        if bare:  # no driver at boot (and its own booted snapshots: the spec is part of their key)
            vm_specs = [replace(spec, driver_version="") for spec in vm_specs]
        # sglang-01 first (CT 101), then sglang-02 ... for a fleet; all on the first node
        ct_specs = [ContainerSpec(name=f"sglang-{i + 1:02d}", index=self.net_index + i) for i in range(containers)]
        if gateway:  # the next CT, on the next link, with no GPU
            ct_specs.append(ContainerSpec(name=GATEWAY_NAME, index=self.net_index + containers, gpus=0))
        state: dict[str, Any] = {
            "up": False,
            "image": {
                "rootfs": str(image.rootfs),
                "grub_disk": str(image.grub_disk),
                "sdboot_disk": str(image.sdboot_disk),
            },
            "vms": [vars(s) for s in vm_specs],
            "containers": [{"name": s.name, "index": s.index, "gpus": s.gpus} for s in ct_specs],
            "pve_port": _free_port(),
            "bare": bare,
            "nodes": nodes,
            "gateway": GATEWAY_NAME if gateway else None,
        }
        self._save(state)
        machines = [*self.vms(state), *self.containers(state)]
        accel = choose_accel()
        for vm in self.vms(state) if nodes == "vm" else []:  # a booted snapshot brings the host key its guest has
            vm.prepare(None if cold_boot else vm.cached_snapshot(accel))
        for machine in machines:
            machine.make_host_key()
        lines = [machine.known_hosts_line() for machine in machines]
        self.known_hosts.write_text("\n".join(lines) + "\n")
        return state

    def _build_wheelhouse(self, gateway: bool = False) -> None:
        house = self.dir / "wheelhouse"
        house.mkdir(exist_ok=True)
        sglang_wheel = wheelhouse.fetch_sglang_wheel(cache_root() / "wheels")
        target = house / sglang_wheel.name
        if not target.exists():
            shutil.copy(sglang_wheel, target)
        wheelhouse.build_standin_wheel(sglang_wheel, house)
        wheelhouse.build_fake_nvidia_installer(house, DRIVER_VERSION)
        # the real benchmark client: the sglang wheel and what its benchmark module imports
        bench = house / "bench"
        bench.mkdir(exist_ok=True)
        cache = cache_root() / "wheels" / f"bench-{wheelhouse.SGLANG_VERSION}"
        for wheel in [sglang_wheel, *wheelhouse.fetch_bench_client_wheels(sglang_wheel, cache)]:
            if not (bench / wheel.name).exists():
                _link_or_copy(wheel, bench / wheel.name)
        if gateway:  # SGLang's gateway and its dependencies, the wheels its pinned requirements name
            (house / "gateway").mkdir(exist_ok=True)
            for wheel in wheelhouse.fetch_gateway_wheels(cache_root() / "wheels" / "gateway"):
                if not (house / "gateway" / wheel.name).exists():
                    _link_or_copy(wheel, house / "gateway" / wheel.name)

    def _start_pve(self, state: dict[str, Any]) -> None:
        seed = {
            "port": state["pve_port"],
            "token_name": TOKEN_NAME,
            "nodes": [v["name"] for v in state["vms"]],
            "containers": [
                {
                    "vmid": CONTAINER_VMID + i,
                    "name": c["name"],
                    "node": _node_of(state, i),
                    "config": {**CONTAINER_CONFIG, "hostname": c["name"]},
                }
                for i, c in enumerate(state["containers"])
                if c["name"] != state.get("gateway")
            ],
            "pve_version": state.get("pve_version", PVE_VERSIONS[9]),
            # the nspawn container behind each CT (provision/lab/ctbody.py)
            "bodies": {str(CONTAINER_VMID + i): ct.record() for i, ct in enumerate(self.workers(state))},
            # what a CT created through the API is made from: the same image and binds, in a directory of its own
            "create": {
                "rootfs": state["image"]["rootfs"],
                "containers_dir": str(self.dir / "containers"),
                "client_key": str(self.client_key),
                "binds": {k: str(v) for k, v in self._container_binds().items()},
                "first_index": self.net_index,  # links from this lab's own, so two labs can coexist
            },
            # each node holds its containers' configuration files, as pmxcfs does (/etc/pve/lxc/<vmid>.conf)
            "node_ssh": {vm.spec.name: vm.ssh_argv() for vm in self.vms()},
        }
        (self.dir / pve.SEED_FILE).write_text(json.dumps(seed))
        (self.dir / "pve-ready").unlink(missing_ok=True)
        try:
            import fakepve  # noqa: F401
        except ImportError as exc:
            needs = "the lab needs fakepve: pip install 'provision-pve-sglang[lab]' (or run .ci/setup)"
            raise ProvisionError(needs) from exc
        with (self.dir / "pve.log").open("a") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "provision.lab.pve", str(self.dir)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        (self.dir / "pve.pid").write_text(str(proc.pid))
        deadline = time.monotonic() + 60 + 10 * len(state["containers"])  # it starts every CT first
        while not (self.dir / "pve-ready").exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = (self.dir / "pve.log").read_text(errors="replace").strip().splitlines()[-3:]
                raise ProvisionError("lab: fakepve did not start: " + " | ".join(tail))
            time.sleep(0.1)

    # ---------------------------------------------------------------- Hugging Face hub (provision/lab/hfhub.py)
    @property
    def hf_token_file(self) -> Path:
        return self.dir / "hf-token"

    def start_hf_hub(self, corrupt: tuple[str, ...] = (), index: int | None = None) -> dict[str, str]:
        """The lab's hub on the host side of the container link `index` (default the lab's first, sglang-01's),
        which the container reaches, serving the tiny gated repo; `corrupt` names files served with wrong bytes.
        It binds with IP_FREEBIND: under `lab up --bare` the link's veth appears only when the apply creates and
        starts the CT. Returns url, repo, commit and token (the token is in a 0600 file of the lab, never on a
        command line). Started again when it runs already."""
        self.stop_hf_hub()
        token_file = self.hf_token_file
        if not token_file.exists():
            token_file.touch(mode=0o600)  # 0600 before the token is in it
            token_file.write_text("hf_lab" + secrets.token_hex(16) + "\n")
        ready = self.dir / "hfhub.json"
        ready.unlink(missing_ok=True)
        host = ContainerSpec(name="", index=self.net_index if index is None else index).host_addr
        argv = [
            sys.executable,
            "-m",
            "provision.lab.hfhub",
            "--host",
            host,
            "--freebind",
            "--token-file",
            str(token_file),
            "--ready-file",
            str(ready),
            *[arg for path in corrupt for arg in ("--corrupt", path)],
        ]
        with (self.dir / "hfhub.log").open("a") as log:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        (self.dir / "hfhub.pid").write_text(str(proc.pid))
        deadline = time.monotonic() + 30
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise ProvisionError("lab: the hub did not start: " + (self.dir / "hfhub.log").read_text()[-300:])
            time.sleep(0.1)
        return json.loads(ready.read_text()) | {"token": token_file.read_text().strip()}

    def stop_hf_hub(self) -> None:
        pid_file = self.dir / "hfhub.pid"
        if pid_file.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid_file.read_text()), signal.SIGTERM)
            pid_file.unlink()

    # ---------------------------------------------------------------- inventory
    def write_inventory(self, state: dict[str, Any]) -> Path:
        inv = inventory_dir()
        (inv / "group_vars").mkdir(parents=True, exist_ok=True)
        nodes = {
            v["name"]: {"ansible_host": "127.0.0.1", "ansible_port": v["port"], "lab_bootloader": v["bootloader"]}
            for v in state["vms"]
        }
        seeded = {
            c["name"]: {
                "ansible_host": ContainerSpec(**c).address,
                "proxmox_host": _node_of(state, i),
                "proxmox_vmid": CONTAINER_VMID + i,
            }
            for i, c in enumerate(state["containers"])
        }
        gateway = seeded.pop(state.get("gateway"), None)
        if gateway:  # a host of its own, not a CT of the lab's PVE (start_gateway)
            gateway = {"ansible_host": gateway["ansible_host"]}
        cts = {CONTAINER_NAME: self._bare_container(state)} if state.get("bare") else seeded
        groups = {"proxmox_hosts": {"hosts": nodes}, "gpu_containers": {"hosts": cts}}
        if gateway:
            groups["sglang_gateways"] = {"hosts": {state["gateway"]: gateway}}
        hosts = {"all": {"children": groups}}
        header = "# Written by `provision lab up` for the running lab; removed by `provision lab down`.\n"
        (inv / "hosts.yml").write_text(header + yaml.safe_dump(hosts, sort_keys=False))
        password_file = self.dir / "pve-password"
        group_vars = {
            # an unprivileged user with sudo, as sites that allow no root ssh (overlay/common/.../ops-user.sh)
            "ansible_user": "ops",
            "ansible_become": True,
            "ansible_ssh_private_key_file": str(self.client_key),
            "ansible_ssh_common_args": f"-o UserKnownHostsFile={self.known_hosts} -o IdentitiesOnly=yes",
            "ansible_python_interpreter": "/usr/bin/python3",
            "proxmox_api_host": "127.0.0.1",
            "proxmox_api_port": state["pve_port"],
            "proxmox_api_user": "root@pam",
            "proxmox_api_password": "{{ lookup('ansible.builtin.env', 'PROXMOX_PASSWORD', "
            f"default=lookup('ansible.builtin.file', '{password_file}')) }}}}",
            "proxmox_api_validate_certs": True,
            "proxmox_api_ca_file": str(self.dir / "pve.crt"),
            # the lab's VMs (TCG) cannot do SEV-SNP: the profile's arguments still apply, and every report
            # says "SNP not proven" instead of failing on it (roles/kernel_cmdline/README.md)
            "kernel_cmdline_snp_required": False,
        }
        (inv / "group_vars" / "all.yml").write_text(header + yaml.safe_dump(group_vars, sort_keys=False, width=200))
        container_vars = {
            # the same variables an offline site uses: install from a local wheelhouse
            "sglang_pip_find_links": WHEELHOUSE_IN_CONTAINER,
            "sglang_pip_index_url": "",
            # the lab has no GPU: its SGLang stand-in serves the API under the real flags
            "sglang_package": "sglang_labserver",
            "sglang_launch_module": "sglang_labserver.launch_server",
            "sglang_model_path": MODEL_DIR,
            # the controller reads the pinned release's flags from the sglang wheel in the lab's wheelhouse
            "sglang_flag_check_wheel_dirs": [str(self.dir / "wheelhouse")],
            "sglang_served_model_name": "lab-standin",
            # the benchmark runs SGLang's real client, from its own venv (the service's holds the stand-in);
            # the wheelhouse holds the complete, pinned set, so nothing else is resolved
            "sglang_bench_venv_dir": "/opt/sglang-bench",
            "sglang_bench_client_packages": sorted(
                wheelhouse.pinned_name(w) for w in (self.dir / "wheelhouse" / "bench").glob("*.whl")
            ),
            "sglang_bench_client_no_deps": True,
            "sglang_bench_pip_find_links": BENCH_WHEELS_IN_CONTAINER,
            "sglang_bench_report_note": (
                "Lab run against SGLang's stand-in (no model, no GPU): the figures measure nothing; "
                "they show that every step of the pipeline ran."
            ),
            # the lab's stand-in for NVIDIA's .run installer (it installs an nvidia-smi that reports the version),
            # and its sha256, as a site pins the checksum of NVIDIA's file
            "gpu_passthrough_userspace_installer": (
                f"{WHEELHOUSE_IN_CONTAINER}/NVIDIA-Linux-x86_64-{{{{ gpu_passthrough_node_driver }}}}.run"
            ),
            "gpu_passthrough_userspace_installer_sha256": hashlib.sha256(
                (self.dir / "wheelhouse" / f"NVIDIA-Linux-x86_64-{DRIVER_VERSION}.run").read_bytes()
            ).hexdigest(),
        }
        if gateway:  # the gateway reaches the workers on their CTs' addresses, with the key they share
            container_vars["sglang_host"] = "0.0.0.0"
            container_vars["sglang_api_key"] = f"{{{{ lookup('ansible.builtin.file', '{self._api_key_file()}') }}}}"
            gateway_vars = {
                "sglang_gateway_pip_find_links": f"{WHEELHOUSE_IN_CONTAINER}/gateway",
                "sglang_gateway_pip_index_url": "",
                # the benchmark client through the gateway (bench --through-gateway): the same client, and the
                # model's tokenizer, which the lab puts in every seeded CT
                **{k: v for k, v in container_vars.items() if k.startswith("sglang_bench_")},
                "sglang_bench_tokenizer": MODEL_DIR,
            }
            (inv / "group_vars" / "sglang_gateways.yml").write_text(
                header + yaml.safe_dump(gateway_vars, sort_keys=False)
            )
        (inv / "group_vars" / "gpu_containers.yml").write_text(header + yaml.safe_dump(container_vars, sort_keys=False))
        node_vars = yaml.safe_dump(self._node_vars(bool(state.get("bare"))), sort_keys=False)
        (inv / "group_vars" / "proxmox_hosts.yml").write_text(header + node_vars)
        return inv

    def _api_key_file(self) -> Path:
        """The SGLang API key a gateway lab's servers and gateway share: in a 0600 file of the lab, read by the
        inventory's lookup as a site reads one from vault, never written into the inventory itself."""
        path = self.dir / "sglang-api-key"
        if not path.exists():
            path.touch(mode=0o600)
            path.write_text("lab-" + secrets.token_hex(16) + "\n")
        return path

    def _bare_container(self, state: dict[str, Any]) -> dict[str, Any]:
        """`lab up --bare`'s sglang-01: CT 101 on the first node, which does not exist yet, as a site writes a CT for
        `provision apply` to create (its spec, on the lab's first link, reached as root with the lab's client key,
        which the spec gives root) and its weights from the lab's hub, the token read from the lab's 0600 file on
        the controller as the PVE password is."""
        link = ContainerSpec(name=CONTAINER_NAME, index=self.net_index)
        public_key = Path(f"{self.client_key}.pub").read_text().strip()
        spec = ct_spec(
            public_key, link.index, CONTAINER_NAME, cores=CONTAINER_CONFIG["cores"], memory=CONTAINER_CONFIG["memory"]
        )
        token = f"{{{{ lookup('ansible.builtin.file', '{self.hf_token_file}') }}}}"
        return {
            "ansible_host": link.address,
            "ansible_user": "root",
            "proxmox_host": state["vms"][0]["name"],
            "proxmox_vmid": CONTAINER_VMID,
            "proxmox_ct_spec": spec,
            **hub_model_vars(state["hub"], token),
        }

    # ---------------------------------------------------------------- the node's NVIDIA driver
    def _standin_installer(self) -> Path:
        return self.dir / "wheelhouse" / f"NVIDIA-Linux-x86_64-{DRIVER_VERSION}.run"

    def _driver_mirror(self, vm: LabVm) -> None:
        """The stand-in NVIDIA installer on the node, where an offline site's mirror holds NVIDIA's file."""
        target = f"{NODE_DRIVER_MIRROR}/{self._standin_installer().name}"
        command = f"mkdir -p {NODE_DRIVER_MIRROR} && cat > {target} && chmod 0644 {target}"
        _pipe_to_node(vm, command, self._standin_installer().read_text(), f"write {target}")

    def _node_vars(self, bare: bool) -> dict[str, Any]:
        """The nodes' variables: the reboot wait's connection timeout, and on a bare lab the driver phase's, as an
        offline site sets them: the pinned version, the installer from the node's mirror and its sha256. A normal lab's
        nodes boot with a driver an admin installed, which the inventory leaves unmanaged (no pin: the driver phase
        skips them saying so), as the hand-made deployment did; the bare lab is where the phase installs, checks and
        upgrades a pinned driver (tests/lab/test_driver.py). The nodes' apt mirror holds no headers for the kernel
        they boot and no dkms package (the lab's dkms stand-in is in the image), so the phase installs none; it has
        headers only for the newer kernel of `provision lab kernel` (docs/lab.md)."""
        driver = {
            "nvidia_driver_version": DRIVER_VERSION,
            "nvidia_driver_installer": f"{NODE_DRIVER_MIRROR}/NVIDIA-Linux-x86_64-{{{{ nvidia_driver_version }}}}.run",
            "nvidia_driver_installer_sha256": hashlib.sha256(self._standin_installer().read_bytes()).hexdigest(),
            "nvidia_driver_headers_packages": [],
            "nvidia_driver_packages": [],
        }
        return {
            **(driver if bare else {}),
            # qemu's user networking accepts a connection to a VM that is down and holds it until the client gives
            # up: each attempt of ansible's reboot wait then runs this long (measured: a reboot waited 79 s with
            # the default 20 against 67 s with 5, the VM itself back after about 45 s). Loopback needs no more.
            "kernel_cmdline_reboot_connect_timeout": 5,
        }

    # ---------------------------------------------------------------- down
    def down(self, progress=print) -> None:
        state = self.state()
        self.stop_hf_hub()
        for vm in self.vms(state):
            vm.stop()
        for ct in [*self.containers(state), *self.created_containers().values()]:
            ct.teardown()
        pid_file = self.dir / "pve.pid"
        if pid_file.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.killpg(int(pid_file.read_text()), signal.SIGTERM)
            pid_file.unlink(missing_ok=True)
        inv = inventory_dir()
        generated = ("hosts.yml", "group_vars/all.yml", "group_vars/gpu_containers.yml", "group_vars/proxmox_hosts.yml")
        generated += ("group_vars/sglang_gateways.yml",)
        for name in generated:
            (inv / name).unlink(missing_ok=True)
        if (inv / "group_vars").is_dir() and not any((inv / "group_vars").iterdir()):
            (inv / "group_vars").rmdir()
        if self.dir.is_dir():
            leftovers = [
                line.split()[1]
                for line in Path("/proc/mounts").read_text().splitlines()
                if str(self.dir) in line.split()[1]
            ]
            for mount in sorted(leftovers, reverse=True):
                subprocess.run(["umount", "-l", mount], capture_output=True)
            shutil.rmtree(self.dir, ignore_errors=True)
        progress("lab: down")

    # ---------------------------------------------------------------- status
    @staticmethod
    def _container_status(vmid: int, ct: LabContainer, created: bool = False) -> dict[str, Any]:
        status = {"name": ct.spec.name, "vmid": vmid, "ssh": f"{ct.spec.address}:22", "running": ct.is_running()}
        return {**status, "created_through_api": True} if created else status

    def status(self) -> dict[str, Any]:
        state = self.state()
        if not state:
            return {"up": False, "lab_dir": str(self.dir), "cache": str(cache_root())}
        pve_up = False
        with contextlib.suppress(OSError):
            pve_up = bool(self.pve_control("GET", f"/ct/{CONTAINER_VMID}"))
        return {
            "up": bool(state.get("up")),
            "lab_dir": str(self.dir),
            "inventory": str(inventory_dir()),
            "accel": state.get("accel"),
            "nodes": state.get("nodes", "vm"),
            "vms": [
                {
                    "name": v.spec.name,
                    "bootloader": v.spec.bootloader,
                    "ssh": f"127.0.0.1:{v.spec.port}",
                    "running": v.is_running(),
                }
                for v in self.vms(state)
            ],
            "containers": [self._container_status(CONTAINER_VMID + i, c) for i, c in enumerate(self.workers(state))]
            + [self._container_status(vmid, c, True) for vmid, c in sorted(self.created_containers().items())],
            "gateway": [
                {"name": c.spec.name, "ssh": f"{c.spec.address}:22", "running": c.is_running()}
                for c in self.containers(state)
                if c.spec.name == state.get("gateway")
            ],
            "pve": {"url": f"https://127.0.0.1:{state.get('pve_port')}", "running": pve_up},
            "timings": state.get("timings", {}),
        }


def _node_of(state: dict[str, Any], i: int) -> str:
    """The node of the lab's i-th seeded CT: the first node, but in a gateway lab the workers take the nodes in turn,
    so that a node's reboot leaves the gateway a worker on the other."""
    nodes = [v["name"] for v in state["vms"]]
    return nodes[i % len(nodes)] if state.get("gateway") else nodes[0]


def _check_up_args(
    hosts: int, containers: int, pve_version: int, gpu_link: str, nodes: str, bare_gateway: bool = False
) -> None:
    """`lab up`'s arguments, each refused with the option's name."""
    if bare_gateway:
        raise ProvisionError("--gateway: needs the lab's seeded containers as its workers (not with --bare)")
    if hosts < 1:
        raise ProvisionError("--hosts: at least 1")
    if not 1 <= containers <= 64:
        raise ProvisionError("--containers: 1 to 64")
    if pve_version not in PVE_VERSIONS:
        raise ProvisionError(f"--pve-version: one of {sorted(PVE_VERSIONS)}")
    if gpu_link not in GPU_LINKS:
        raise ProvisionError(f"--gpu-link: one of {', '.join(GPU_LINKS)}")
    if nodes not in NODE_KINDS:
        raise ProvisionError(f"--nodes: one of {', '.join(NODE_KINDS)}")


def _pipe_to_node(vm: LabVm, command: str, text: str, what: str) -> None:
    """Run `command` on a lab node with `text` on its stdin; a failure names the node and what it was for."""
    proc = subprocess.run([*vm.ssh_argv(), command], input=text, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise ProvisionError(f"lab: could not {what} on {vm.spec.name}: {proc.stderr.strip()}")
