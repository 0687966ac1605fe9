"""`provision verify` on SEV-SNP: the check's verdict from a node's records, and the note a passing check
carries into the report ("SNP not proven" in the lab)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from provision import verify
from provision.checks.test_host import snp_verdict

LAB_GAPS = ["kernel 6.1.0-57-amd64 is older than 6.11, the first with SEV-SNP host support"]


def test_proven_passes():
    assert snp_verdict({"snp_required": True}, {"sev_snp": "proven", "sev_snp_missing": []}) == (True, "SEV-SNP proven")


def test_required_and_not_proven_fails_naming_each_gap():
    passes, note = snp_verdict(
        {"snp_required": True},
        {"sev_snp": "not proven", "sev_snp_missing": [*LAB_GAPS, "dmesg has no 'AMD-Vi: IOMMU SNP support enabled'"]},
    )
    assert not passes
    assert note == (
        "SEV-SNP is required but not proven: kernel 6.1.0-57-amd64 is older than 6.11, the first with SEV-SNP host "
        "support; dmesg has no 'AMD-Vi: IOMMU SNP support enabled'"
    )


def test_not_required_passes_and_says_snp_not_proven():
    passes, note = snp_verdict({"snp_required": False}, {"sev_snp": "not proven", "sev_snp_missing": LAB_GAPS})
    assert passes and note.startswith("SNP not proven (not required: kernel_cmdline_snp_required is false): kernel")


def test_records_from_before_the_proof_fail():
    passes, note = snp_verdict({"add": []}, {"sev_snp": "not supported (kvm_amd not loaded)"})
    assert not passes and "run provision apply --tags kernel" in note


def test_a_passing_checks_note_reaches_the_report(tmp_path):
    (tmp_path / "test_x.py").write_text(
        textwrap.dedent(
            """
            import pytest

            @pytest.mark.parametrize("host_name", ["pve-grub"])
            def test_sev_snp_proven(host_name, record_property):
                record_property("note", "SNP not proven (not required)")

            @pytest.mark.parametrize("host_name", ["pve-grub"])
            def test_plain(host_name):
                pass
            """
        )
    )
    junit = tmp_path / "out.xml"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-o",
            "addopts=",
            "-o",
            "junit_family=xunit1",
            f"--junitxml={junit}",
            str(tmp_path / "test_x.py"),
        ],
        check=True,
        capture_output=True,
        cwd=tmp_path,
    )
    checks = {c.name: c for c in verify._parse_junit(junit)}
    assert (
        checks["test_sev_snp_proven"].passed and checks["test_sev_snp_proven"].reason == "SNP not proven (not required)"
    )
    assert checks["test_plain"].reason == "" and checks["test_plain"].host == "pve-grub"
