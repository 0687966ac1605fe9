"""A ProxyCommand for tests of the user's ansible.cfg: it carries one ssh connection and logs it."""

from __future__ import annotations

from pathlib import Path

# `python3 proxy.py HOST PORT LOG`: appends `HOST:PORT checks` where verify's checks process opened the connection
# (PROVISION_VERIFY_HOSTS is in its environment), else `HOST:PORT probe`
LOGGING_PROXY = """\
import os, socket, sys, threading
host, port, log = sys.argv[1], int(sys.argv[2]), sys.argv[3]
with open(log, "a") as f:
    f.write(f"{host}:{port} {'checks' if os.environ.get('PROVISION_VERIFY_HOSTS') else 'probe'}\\n")
s = socket.create_connection((host, port))
def up():
    while data := os.read(0, 65536):
        s.sendall(data)
    s.shutdown(socket.SHUT_WR)
threading.Thread(target=up, daemon=True).start()
while data := s.recv(65536):
    os.write(1, data)
"""


def bastion_dir(tmp_path: Path) -> tuple[Path, Path]:
    """A working directory whose ansible.cfg sends every ssh connection through the logging proxy, and its log."""
    work = tmp_path / "shop"
    work.mkdir(mode=0o755)  # Ansible reads no ansible.cfg from a world-writable directory
    (work / "proxy.py").write_text(LOGGING_PROXY)
    log = work / "proxy.log"
    (work / "ansible.cfg").write_text(
        "[ssh_connection]\n"
        f'ssh_args = -o ProxyCommand="python3 {work}/proxy.py %h %p {log}" '
        "-o ControlMaster=auto -o ControlPersist=30s\n"
    )
    return work, log
