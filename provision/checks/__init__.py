"""The pytest suites that `provision verify` runs, one file per phase, on what each host returned to
playbooks/verify_probe.yml (conftest.py)."""
