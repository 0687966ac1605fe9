"""Stopping a lab container (provision/lab/container.py): its supervisor's process group can empty at any moment
between the look that finds it and the signal, and the stop still ends with the pid file gone."""

from __future__ import annotations

import subprocess

from provision.lab import container
from provision.lab.container import ContainerSpec, LabContainer


def test_a_stop_whose_group_empties_between_the_look_and_the_kill_finishes(tmp_path, monkeypatch):
    supervisor = subprocess.Popen(["sleep", "30"], start_new_session=True)
    ct = LabContainer(ContainerSpec("ct0", 7), tmp_path, tmp_path / "rootfs", tmp_path / "key", tmp_path / "known")
    ct.pidfile.write_text(str(supervisor.pid))
    real_sh = container._sh

    def stale_pgrep(*cmd, check=True):
        """pgrep saw the group's last member just before it was reaped: it answers 'still there' after it is gone."""
        if cmd[0] == "pgrep":
            supervisor.kill()
            supervisor.wait()
            return subprocess.CompletedProcess(cmd, 0)
        return real_sh(*cmd, check=check)

    monkeypatch.setattr(container, "_sh", stale_pgrep)
    ct.stop(timeout=0.3)
    assert not ct.pidfile.exists()
    assert supervisor.returncode is not None
