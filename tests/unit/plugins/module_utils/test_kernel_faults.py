"""The GPU DMA fault lines that fail verify and bench (plugins/module_utils/kernel_faults.py)."""

from __future__ import annotations

from provision.checks.support import kernel_faults
from provision.checks.test_container import fault_window

# journalctl -k -o short-unix lines. The messages follow the kernel's formats: drivers/iommu/amd/iommu.c
# (amd_iommu_report_page_fault, amd_iommu_report_rmp_fault, with dev_fmt "AMD-Vi: ") and the NVIDIA
# driver's Xid report (Xid 79: "GPU has fallen off the bus", NVIDIA's Xid catalog).
LOG = """\
1764619100.000001 pve1 kernel: nvidia 0000:41:00.0: AMD-Vi: Event logged [IO_PAGE_FAULT domain=0x0019 address=0x3fffe000 flags=0x0020]
1764619200.500000 pve1 kernel: AMD-Vi: Event logged [RMP_PAGE_FAULT device=0000:41:00.0 vmg_tag=0x0000, gpa=0x1f2000, flags_rmp=0x0002, flags=0x0021]
1764619300.250000 pve1 kernel: NVRM: Xid (PCI:0000:41:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
1764619400.000000 pve1 kernel: usb 1-1: new high-speed USB device number 2 using xhci_hcd
"""  # noqa: E501


def test_each_kind_is_found_with_its_utc_time():
    found = kernel_faults.faults(LOG)
    assert len(found) == 3
    assert found[0].startswith("2025-12-01T19:58:20Z kernel: nvidia 0000:41:00.0: AMD-Vi: Event logged [IO_PAGE_FAULT")
    assert "RMP_PAGE_FAULT" in found[1] and "NVRM: Xid" in found[2]


def test_only_lines_since_the_start_count():
    assert kernel_faults.faults(LOG, since=1764619200.5) == kernel_faults.faults(LOG)[1:]
    assert kernel_faults.faults(LOG, since=1764619301) == []


def test_journalctl_with_nothing_to_show_is_not_an_error_but_a_failure_is():
    assert kernel_faults.read_result(1, "-- No entries --\n", "") == ("-- No entries --\n", None)
    text, error = kernel_faults.read_result(1, "", "Failed to open journal: Permission denied")
    assert text is None and "Permission denied" in error
    assert kernel_faults.journal_argv(1764619200.9)[-2:] == ["--since", "@1764619200"]


def test_the_window_is_the_whole_boot_after_restarts_systemd_made_by_itself():
    assert fault_window({"started_at": "1764619200", "restarts": "0"}) == (1764619200.0, "since sglang started")
    since, words = fault_window({"started_at": "1764619300", "restarts": "2"})
    assert since is None and words == "this boot (sglang restarted 2 time(s) by itself)"
    # the Xid that crashed the server before its restart still counts
    assert len(kernel_faults.faults(LOG, since)) == 3


# the node's other devices: a NIC under the translating IOMMU (dev_err: driver and BDF), an NVMe drive whose
# fault the IOMMU could not tie to a PCI device (pr_err: "device=" in the event), another container's GPU
FOREIGN = """\
1764619500.000000 pve1 kernel: mlx5_core 0000:c1:00.0: AMD-Vi: Event logged [IO_PAGE_FAULT domain=0x0021 address=0x7f3c0000 flags=0x0000]
1764619501.000000 pve1 kernel: AMD-Vi: Event logged [IO_PAGE_FAULT device=0000:02:00.0 domain=0x0010 address=0x1000 flags=0x0000]
1764619502.000000 pve1 kernel: NVRM: Xid (PCI:0000:81:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
1764619503.000000 pve1 kernel: AMD-Vi: Event logged [IO_PAGE_FAULT domain=0x0010 address=0x2000 flags=0x0000]
"""  # noqa: E501


def test_each_line_names_its_device_as_the_kernel_prints_it():
    devices = [kernel_faults.device(line) for line in kernel_faults.faults(LOG + FOREIGN)]
    assert devices == ["0000:41:00.0", "0000:41:00.0", "0000:41:00", "0000:c1:00.0", "0000:02:00.0", "0000:81:00", None]


def test_only_the_containers_gpus_and_unnamed_devices_count_against_it():
    # bus ids as nvidia-smi prints them in the container (8-digit domain)
    own, other = kernel_faults.of_devices(kernel_faults.faults(LOG + FOREIGN), ["00000000:41:00.0", "00000000:42:00.0"])
    assert len(own) == 4 and own[-1].endswith("[IO_PAGE_FAULT domain=0x0010 address=0x2000 flags=0x0000]")
    assert [kernel_faults.device(line) for line in other] == ["0000:c1:00.0", "0000:02:00.0", "0000:81:00"]
    # without the GPUs (a record from before they were recorded), every line counts
    assert kernel_faults.of_devices(kernel_faults.faults(FOREIGN), None) == (kernel_faults.faults(FOREIGN), [])
