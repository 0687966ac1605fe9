"""The next boot's line and IOMMU mode (plugins/module_utils/next_boot.py), and the P2P decision made for it
(gpu_p2p.decide with next_boots): a pending or armed line that turns translation on turns P2P off now."""

from __future__ import annotations

from provision.paths import module_util

nb = module_util("next_boot")
p2p = module_util("gpu_p2p")

PT = "BOOT_IMAGE=/boot/vmlinuz-6.8.12-9-pve root=/dev/mapper/pve-root ro quiet iommu=pt"
PROFILE = "BOOT_IMAGE=/boot/vmlinuz-6.8.12-9-pve root=/dev/mapper/pve-root ro quiet iommu=nopt kvm_amd.sev_snp=1"
PASSTHROUGH = {"translates": False, "source": "GPU IOMMU group type identity"}
PHB = {"gpus": ["GPU0", "GPU1"], "links": [{"a": "GPU0", "b": "GPU1", "link": "PHB"}]}
NV18 = {"gpus": ["GPU0", "GPU1"], "links": [{"a": "GPU0", "b": "GPU1", "link": "NV18"}]}
CONTEXT = {
    "boot_id": "b1",
    "cmdline": PT,
    "iommu": PASSTHROUGH["source"],
    "driver_version": "580.95.05",
    "gpus": ["0000:41:00.0", "0000:42:00.0"],
}
HEALTHY = {"verdict": "healthy", "reason": "bit-exact", "context": CONTEXT, "recorded_at": 1.0}


def boots(*lines):
    return [
        {"source": f"line {i}", "cmdline": line, "iommu": nb.boot_iommu(PT, PASSTHROUGH, line)}
        for i, line in enumerate(lines)
    ]


def test_what_a_line_does_to_the_iommu():
    assert nb.translates(PT) is False
    assert nb.translates(PROFILE) is True
    assert nb.translates("ro quiet") is None, "the kernel's built-in default decides"
    assert nb.translates("iommu=pt iommu=nopt") is True, "the last one wins"
    assert nb.translates("iommu.passthrough=1") is False and nb.translates("iommu.passthrough=0") is True
    assert nb.translates("iommu=nopt amd_iommu=off") is False, "an IOMMU that is off translates nothing"


def test_a_line_with_this_boots_iommu_arguments_has_this_boots_measured_mode():
    same = PT.replace("quiet", "quiet site_arg=1")
    assert nb.boot_iommu(PT, PASSTHROUGH, same) == {
        "translates": False,
        "source": "the same IOMMU arguments as this boot",
    }
    assert nb.boot_iommu(PT, PASSTHROUGH, PROFILE) == {"translates": True, "source": "iommu=nopt: translated"}
    assert nb.boot_iommu(PT, PASSTHROUGH, "ro quiet")["translates"] is None
    assert nb.boot_iommu(PT, PASSTHROUGH, None) == {"translates": None, "source": "its line cannot be read here"}


def test_pcie_peers_with_a_pending_translating_line_are_off_now():
    decision = p2p.decide("auto", PHB, PASSTHROUGH, None, CONTEXT, None, boots(PT, PROFILE))
    assert decision["policy"] == "off", decision
    assert "at the next boot: line 1 has iommu=nopt: translated" in decision["reason"], decision


def test_a_healthy_verdict_of_this_boot_does_not_speak_for_the_next():
    assert p2p.decide("auto", PHB, PASSTHROUGH, HEALTHY, CONTEXT, None, boots(PT))["policy"] == "on"
    decision = p2p.decide("auto", PHB, PASSTHROUGH, HEALTHY, CONTEXT, None, boots(PT, PROFILE))
    assert (
        decision["policy"] == "off"
        and "a verdict speaks only for the boot it was taken in, not the next" in decision["reason"]
    )


def test_a_line_that_drops_iommu_pt_or_cannot_be_read_may_translate_and_turns_p2p_off():
    for line in ("BOOT_IMAGE=/boot/vmlinuz root=/dev/sda1 ro quiet", None):
        assert p2p.decide("auto", PHB, PASSTHROUGH, None, CONTEXT, None, boots(line))["policy"] == "off", line


def test_next_boot_as_this_one_nvlink_and_explicit_modes_keep_their_policy():
    assert p2p.decide("auto", PHB, PASSTHROUGH, None, CONTEXT, None, boots(PT, PT))["policy"] == "on"
    assert p2p.decide("auto", NV18, PASSTHROUGH, None, CONTEXT, None, boots(PROFILE))["policy"] == "on"
    assert p2p.decide("on", PHB, PASSTHROUGH, None, CONTEXT, None, boots(PROFILE))["policy"] == "on"


def test_grub_one_shot_and_default_entry_lines():
    custom = (
        "### BEGIN provision trial boot (removed after the trial) ###\n"
        "menuentry 'provision trial boot of a new kernel command line' --id provision-trial {\n"
        "\tlinux\t/boot/vmlinuz-6.1.0-28-amd64 root=UUID=abc ro quiet iommu=nopt\n}\n"
        "### END provision trial boot ###\n"
    )
    assert nb.grub_entry_line(custom, "provision-trial") == "root=UUID=abc ro quiet iommu=nopt"
    assert nb.grub_entry_line(custom, "someone-elses") is None
    env = "# GRUB Environment Block\nnext_entry=provision-trial\n" + "#" * 900
    assert nb.grubenv_next_entry(env) == "provision-trial"
    assert nb.grubenv_next_entry("# GRUB Environment Block\nnext_entry=\n") is None, "GRUB took the one-shot"
    cfg = "menuentry 'Debian' {\n\tlinux\t/boot/vmlinuz-6.1.0-28-amd64 root=UUID=abc ro iommu=pt\n}\n"
    assert nb.grub_default_line(cfg) == "root=UUID=abc ro iommu=pt"
