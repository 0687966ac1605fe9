"""The lab's PVE container bodies: devN parsing and the node read, as the prestart hook needs them; a created CT's
link, and what a create writes into its rootfs."""

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap

import pytest

from provision.lab.ctbody import has_nesting, parse_dev, parse_node_read
from tests.loaders import REPO


def test_a_devn_entry_without_mode_gets_pves_default_0660():
    assert parse_dev("/dev/nvidia0") == {"path": "/dev/nvidia0", "mode": 0o660, "uid": 0, "gid": 0}
    assert parse_dev("path=/dev/nvidia-uvm,mode=0666,uid=100,gid=44") == {
        "path": "/dev/nvidia-uvm",
        "mode": 0o666,
        "uid": 100,
        "gid": 44,
    }


def test_nesting_is_read_from_the_features_string():
    assert has_nesting({"features": "keyctl=1,nesting=1"})
    assert not has_nesting({"features": "nesting=0"}) and not has_nesting({})


def test_node_read_tells_device_nodes_from_missing_paths_and_files():
    found, version, cmdline = parse_node_read(
        "ok|c3|0|character special file|/dev/nvidia0\n"
        "ok|1ff|1|character special file|/dev/nvidia-uvm-tools\n"
        "missing|-|-|-|/dev/nvidia7\n"
        "ok|0|0|regular file|/dev/not-a-device\n"
        "--- version\nNVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05\n"
        "--- cmdline\nBOOT_IMAGE=/boot/vmlinuz-6.1.0-28-amd64 root=UUID=abc ro iommu=pt\n"
    )
    assert found == {
        "/dev/nvidia0": (195, 0),
        "/dev/nvidia-uvm-tools": (511, 1),
        "/dev/nvidia7": None,
        "/dev/not-a-device": None,
    }
    assert "580.95.05" in version and "--- cmdline" not in version
    assert cmdline == "BOOT_IMAGE=/boot/vmlinuz-6.1.0-28-amd64 root=UUID=abc ro iommu=pt\n"
    assert parse_node_read("--- version\n") == ({}, None, None)


def _free(*busy: int):
    return lambda index: index in busy


def test_a_created_cts_link_is_the_next_one_neither_this_lab_nor_this_machine_holds():
    from provision.lab.ctbody import net_index

    dhcp = "name=eth0,bridge=vmbr0,ip=dhcp,type=veth"
    assert net_index(dhcp, {1}, _free(), first=1) == 2
    assert net_index(None, {1, 2}, _free(3), first=1) == 4, "another lab's namespace or link holds 3"
    assert net_index("name=eth0,bridge=vmbr0", set(), _free(), first=7) == 7, "no ip= is DHCP, from the lab's own"


def test_a_static_net0_must_name_a_free_lab_link():
    from provision.lab.ctbody import net_index

    assert net_index("name=eth0,bridge=vmbr0,ip=10.213.9.2/30,gw=10.213.9.1", {1}, _free(), first=1) == 9
    for ip, why in (
        ("192.168.1.50/24", "the lab's links are"),
        ("10.213.1.2/30", "is taken"),
        ("10.213.5.2/30", "is taken"),
        ("10.213.300.2/30", "the lab's links are"),
    ):
        with pytest.raises(ValueError, match=why):
            net_index(f"name=eth0,ip={ip}", {1}, _free(5), first=1)
    with pytest.raises(ValueError, match="no free lab link"):
        net_index("ip=dhcp", set(range(1, 256)), _free(), first=1)


def test_a_body_record_round_trips_through_another_process(tmp_path):
    from provision.lab.container import ContainerSpec, LabContainer

    body = LabContainer(
        ContainerSpec(name="ct150", index=3, created=True),
        tmp_path / "ct150",
        tmp_path / "rootfs",
        tmp_path / "key",
        tmp_path / "kh",
        read_only_binds={"/srv/x": tmp_path / "x"},
    )
    again = LabContainer.from_record(json.loads(json.dumps(body.record())))
    assert again.record() == body.record() and again.spec == body.spec
    assert again.host_key == tmp_path / "ct150" / "upper" / "etc" / "ssh" / "ssh_host_ed25519_key"


def test_post_create_writes_roots_keys_in_pves_block_and_fresh_host_keys(tmp_path):
    from provision.lab.container import ContainerSpec, LabContainer

    body = LabContainer(
        ContainerSpec(name="ct150.lab.example", index=3, created=True),
        tmp_path / "ct150",
        tmp_path / "rootfs",
        tmp_path / "key",
        tmp_path / "kh",
    )
    body.dir.mkdir()
    keys = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDfakefakefakefakefakefakefakefakefakefakefake a@b\nssh-rsa AAAAB3 c@d"
    body.post_create(keys)
    upper = body.dir / "upper"
    authorized = upper / "root" / ".ssh" / "authorized_keys"
    assert authorized.read_text() == f"# --- BEGIN PVE ---\n{keys}\n# --- END PVE ---\n"
    assert stat.S_IMODE(authorized.stat().st_mode) == 0o700 and stat.S_IMODE((upper / "root").stat().st_mode) == 0o700
    for kind in ("rsa", "ecdsa", "ed25519"):
        private, public = upper / f"etc/ssh/ssh_host_{kind}_key", upper / f"etc/ssh/ssh_host_{kind}_key.pub"
        assert stat.S_IMODE(private.stat().st_mode) == 0o600 and stat.S_IMODE(public.stat().st_mode) == 0o644
        assert public.read_text().split()[2] == "root@ct150", "commented root@<hostname without domain>"
        derived = subprocess.run(["ssh-keygen", "-y", "-f", str(private)], capture_output=True, text=True, check=True)
        assert derived.stdout.split()[:2] == public.read_text().split()[:2], "a pair"
    assert body.known_hosts_line().split()[1:] == (upper / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()[:2]
    assert not list(body.dir.glob("tmp*")), "the key files made outside the CT are gone"
    other = LabContainer(
        ContainerSpec(name="ct151", index=4, created=True),
        tmp_path / "ct151",
        tmp_path / "rootfs",
        tmp_path / "key",
        tmp_path / "kh",
    )
    other.dir.mkdir()
    other.post_create(None)
    assert not (other.dir / "upper" / "root").exists(), "no ssh-public-keys: no authorized_keys"
    assert other.known_hosts_line() != body.known_hosts_line()


NVRM = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build\n"


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="a bind mount needs root and unshare")
def test_a_driver_the_node_loads_after_the_ct_started_shows_through_the_ct_s_bound_proc_driver(tmp_path):
    """The CT shares its node's kernel: a module the node loads while the CT runs is in the CT's /proc/driver. The
    body's copy is bound into the CT at start (nspawn --bind-ro); a refresh must show through that bind."""
    from provision.lab.container import PROC_DRIVER_STAGE, ContainerSpec, LabContainer

    body = LabContainer(
        ContainerSpec(name="ct", index=250), tmp_path / "ct", tmp_path / "rootfs", tmp_path / "key", tmp_path / "kh"
    )
    body.configure([], nesting=True, driver_version=None)  # started before the node had a driver
    stage = body.dir / "proc-driver"
    assert f"--bind-ro={stage}:{PROC_DRIVER_STAGE}" in body.nspawn_command()
    inside = tmp_path / "inside"  # where the CT sees it
    inside.mkdir()
    refresh = tmp_path / "refresh.py"  # run where the stage is bound at `inside`, as nspawn binds it
    refresh.write_text(
        textwrap.dedent("""
        import sys
        from pathlib import Path
        from provision.lab.container import ContainerSpec, LabContainer
        body_dir, inside, version = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
        body = LabContainer(ContainerSpec(name="ct", index=250), body_dir, Path("r"), Path("k"), Path("h"))
        body.configure([], nesting=True, driver_version=version)  # the node loaded its module
        print((inside / "nvidia" / "version").read_text(), end="")
        body.show_node_driver(None)  # and unloaded it
        print(sorted(inside.iterdir()))
    """)
    )
    script = 'mount --bind -o ro "$1" "$2" && exec "$3" "$4" "$5" "$2" "$6"'
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [
            "unshare",
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            "sh",
            str(stage),
            str(inside),
            sys.executable,
            str(refresh),
            str(body.dir),
            NVRM,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == NVRM + "[]\n", "loaded, then unloaded: both seen through the bind"
