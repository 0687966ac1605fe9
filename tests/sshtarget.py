"""A real sshd on loopback for integration tests, in its own mount namespace.

Each target's sshd runs under `unshare --mount` with a private tmpfs over the paths the
playbooks write (/var/lib/provision), so a test can converge it without touching the
machine running the tests. Host keys are made per target and recorded in a known_hosts
file, so host key checking stays on exactly as in production.
"""

from __future__ import annotations

import shlex
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
PRIVATE_PATHS = ("/var/lib/provision",)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class SshTarget:
    name: str
    port: int
    workdir: Path
    client_key: Path
    known_hosts: Path
    process: subprocess.Popen | None = None

    def inventory_vars(self) -> dict:
        return {
            "ansible_host": "127.0.0.1",
            "ansible_port": self.port,
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(self.client_key),
            "ansible_ssh_common_args": f"-o UserKnownHostsFile={self.known_hosts} -o IdentitiesOnly=yes",
            "ansible_python_interpreter": "/usr/bin/python3",
        }

    def ssh(self, command: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            [
                "ssh",
                "-p",
                str(self.port),
                "-i",
                str(self.client_key),
                "-o",
                "IdentitiesOnly=yes",
                "-o",
                f"UserKnownHostsFile={self.known_hosts}",
                "-o",
                "StrictHostKeyChecking=yes",
                "-o",
                "BatchMode=yes",
                "-o",
                "ConnectTimeout=10",
                "root@127.0.0.1",
                command,
            ],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
            check=check,
        )

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _shadow_with_root_password(workdir: Path, password: str) -> Path:
    """A copy of /etc/shadow whose root entry has this password, for the target's own namespace."""
    hashed = subprocess.run(
        ["openssl", "passwd", "-6", "-stdin"], input=password, capture_output=True, text=True, check=True
    ).stdout.strip()
    lines = []
    for line in Path("/etc/shadow").read_text().splitlines():
        user, _, rest = line.partition(":")
        lines.append(f"root:{hashed}:{rest.partition(':')[2]}" if user == "root" else line)
    shadow = workdir / "shadow"
    shadow.write_text("\n".join(lines) + "\n")
    shadow.chmod(0o600)
    return shadow


def start_target(
    name: str, root: Path, client_key: Path, known_hosts: Path, password: str | None = None, banner: str | None = None
) -> SshTarget:
    """An sshd that takes the client key; with `password`, also that password for root (through a copy of
    /etc/shadow mounted over the real one in the target's namespace only); with `banner`, root's home in that
    namespace is a directory whose .bashrc prints it: Debian's bash (SSH_SOURCE_BASHRC) reads ~/.bashrc for every
    command sshd runs, so each command's output starts with it, as on a host whose rc file prints a greeting; its sftp
    is then Debian's sftp-server, started through that shell, which the greeting breaks (`sftp`: "Received message too
    long"), where internal-sftp would not run the shell."""
    workdir = root / name
    workdir.mkdir(parents=True)
    host_key = workdir / "ssh_host_ed25519_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True)
    port = free_port()
    config = workdir / "sshd_config"
    config.write_text(
        "\n".join(
            [
                f"Port {port}",
                "ListenAddress 127.0.0.1",
                f"HostKey {host_key}",
                f"PidFile {workdir}/sshd.pid",
                f"AuthorizedKeysFile {client_key}.pub",
                "PermitRootLogin yes" if password else "PermitRootLogin prohibit-password",
                "PasswordAuthentication yes" if password else "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "UsePAM no",
                "StrictModes no",
                # with a banner, sftp through the login shell, as a Debian host runs it (see the docstring)
                "Subsystem sftp " + ("/usr/lib/openssh/sftp-server" if banner else "internal-sftp"),
                "LogLevel ERROR",
                "",
            ]
        )
    )
    Path("/run/sshd").mkdir(exist_ok=True)
    mounts = " && ".join(f"mkdir -p {p} && mount -t tmpfs -o mode=0755 tmpfs {p}" for p in PRIVATE_PATHS)
    if password:
        mounts += f" && mount --bind {_shadow_with_root_password(workdir, password)} /etc/shadow"
    if banner:
        home = workdir / "home"
        home.mkdir()
        (home / ".bashrc").write_text(f"echo {shlex.quote(banner)}\n")
        mounts += f" && mount --bind {home} /root"
    proc = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", f"{mounts} && exec {SSHD} -D -e -f {config}"],
        stdout=subprocess.DEVNULL,
        stderr=open(workdir / "sshd.log", "w"),  # noqa: SIM115
    )
    pub = host_key.with_suffix(".pub").read_text().split()
    with known_hosts.open("a") as f:
        f.write(f"[127.0.0.1]:{port} {pub[0]} {pub[1]}\n")
    target = SshTarget(name, port, workdir, client_key, known_hosts, proc)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd for {name} exited: {(workdir / 'sshd.log').read_text()}")
        if target.ssh("true", check=False).returncode == 0:
            return target
        time.sleep(0.2)
    target.stop()
    raise RuntimeError(f"sshd for {name} did not answer on port {port}")


def make_client_key(root: Path) -> Path:
    key = root / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return key
