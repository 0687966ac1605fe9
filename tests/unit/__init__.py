"""Unit tests, in the tree of the source each one tests: tests/unit/provision/ for provision/ (its checks/ and lab/
too, and the lab's standin/ and overlay/), tests/unit/plugins/<kind>/ for plugins/<kind>/, tests/unit/roles/<role>/
for a role's scripts and tasks files. A file is test_<file>.py for <file>, or test_<file>_<aspect>.py for one aspect
of it. The pages' tests are in tests/unit/docs/, and those of the repository as a whole in tests/unit/repository/."""

from pathlib import Path

# real files the tests read: bootloader configurations, models' config.json, `nvidia-smi topo -m` outputs
FIXTURES = Path(__file__).parent / "fixtures"
