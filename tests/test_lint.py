"""ruff and ansible-lint (profile production) are part of the test suite; ruff covers the package, the tests,
and the Python of the roles and plugins."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
PYTHON_TREES = ["provision", "tests", "roles", "plugins"]


def _tool(name: str) -> str:
    path = BIN / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if not found:
        pytest.fail(f"{name} is not installed: run .ci/setup (it installs the test extras)")
    return found


def test_ruff_check():
    proc = subprocess.run([_tool("ruff"), "check", *PYTHON_TREES], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_format():
    proc = subprocess.run([_tool("ruff"), "format", "--check", *PYTHON_TREES], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ansible_lint_production_profile():
    proc = subprocess.run(
        [_tool("ansible-lint"), "--profile", "production", "playbooks", "roles"],
        cwd=REPO,
        capture_output=True,
        text=True,
        # ansible refuses a non-blocking stdin (CI hands one down); the linter needs none
        stdin=subprocess.DEVNULL,
        env={"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(Path.home()), "ANSIBLE_NOCOLOR": "1"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_changelog_fragments_pass_antsibull_changelog_and_the_changelog_is_generated(tmp_path):
    """Each change is a fragment under changelogs/fragments that `antsibull-changelog lint` accepts, and CHANGELOG.md
    is what `antsibull-changelog generate` writes from changelogs/changelog.yaml (docs/reference.md, "Releasing")."""
    tool = _tool("antsibull-changelog")
    lint = subprocess.run([tool, "lint"], cwd=REPO, capture_output=True, text=True)
    assert lint.returncode == 0 and not lint.stdout.strip(), lint.stdout + lint.stderr
    copy = tmp_path / "collection"
    copy.mkdir()
    for name in ("galaxy.yml", "CHANGELOG.md"):
        shutil.copy(REPO / name, copy / name)
    shutil.copytree(REPO / "changelogs", copy / "changelogs")
    generate = subprocess.run([tool, "generate"], cwd=copy, capture_output=True, text=True)
    assert generate.returncode == 0, generate.stdout + generate.stderr
    assert (copy / "CHANGELOG.md").read_text() == (REPO / "CHANGELOG.md").read_text(), (
        "CHANGELOG.md is not what antsibull-changelog generates from changelogs/changelog.yaml: run "
        "`antsibull-changelog generate`"
    )


# radon's cyclomatic complexity above which a function must be split; the tests and the lab's stand-ins (which
# imitate other programs' code) are not held to it
MAX_COMPLEXITY = 15
COMPLEXITY_TREES = ["provision", "roles", "plugins"]
COMPLEXITY_EXEMPT = [REPO / "provision" / "lab" / "standin"]


def _functions(blocks):
    """radon's functions, methods and closures, however deep (a method is listed beside its class too)."""
    for block in blocks:
        yield block
        yield from _functions([*getattr(block, "methods", []), *getattr(block, "closures", [])])
        yield from _functions(getattr(block, "inner_classes", []))


def test_no_function_is_more_complex_than_the_limit():
    try:
        from radon.complexity import cc_visit
        from radon.visitors import Function
    except ImportError:
        pytest.fail("radon is not installed: run .ci/setup (it installs the test extras)")
    too_complex = set()
    for tree in COMPLEXITY_TREES:
        for path in (REPO / tree).rglob("*.py"):
            if any(path.is_relative_to(exempt) for exempt in COMPLEXITY_EXEMPT):
                continue
            for block in _functions(cc_visit(path.read_text())):
                if isinstance(block, Function) and block.complexity > MAX_COMPLEXITY:
                    where = f"{path.relative_to(REPO)}:{block.lineno} {block.fullname}"
                    too_complex.add(f"{where} ({block.complexity})")
    assert not too_complex, f"above {MAX_COMPLEXITY}, split them:\n" + "\n".join(sorted(too_complex))


# ansible-test fetches pip's bootstrap script from ci-files.testing.ansible.com, which CI cannot reach (only the
# package index): this one bootstraps pip with ensurepip, then installs from the index what ansible-test asks for
GET_PIP = """\
import subprocess, sys
subprocess.check_call([sys.executable, "-m", "ensurepip", "--upgrade", "--default-pip"])
wanted = [arg for arg in sys.argv[1:] if not arg.startswith("-")]
subprocess.check_call([sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "-q", *wanted])
"""


def test_ansible_test_sanity_passes_on_the_built_collection(tmp_path):
    """The collection as ansible-galaxy builds and installs it, checked by ansible-test sanity with this Python:
    every test passes, with only tests/sanity/ignore-2.19.txt's entries (each carries its reason). Its
    requirements go into venvs under a home of their own, kept between runs on one machine."""
    home = Path.home() / ".cache" / "provision" / "ansible-test"
    cache = home / ".ansible" / "test" / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    for version in ("24_2",):  # the pip ansible-test 2.19 bootstraps
        (cache / f"get_pip_{version}.py").write_text(GET_PIP)
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(home), "ANSIBLE_NOCOLOR": "1"}
    # the machine's package index settings and proxies reach the requirements' installs
    env |= {k: v for k, v in os.environ.items() if k.startswith("PIP_") or k.lower().endswith("_proxy")}
    run = {"capture_output": True, "text": True, "env": env, "stdin": subprocess.DEVNULL}
    built = subprocess.run(
        [_tool("ansible-galaxy"), "collection", "build", "--output-path", str(tmp_path), str(REPO)], **run
    )
    assert built.returncode == 0, built.stdout + built.stderr
    installed = subprocess.run(
        [
            _tool("ansible-galaxy"),
            "collection",
            "install",
            "-p",
            str(tmp_path / "c"),
            *map(str, tmp_path.glob("*.tar.gz")),
        ],
        **run,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    proc = subprocess.run(
        [_tool("ansible-test"), "sanity", "--python", python, "--local", "--color", "no"],
        cwd=tmp_path / "c" / "ansible_collections" / "provision" / "pve_sglang",
        **run,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-6000:]


# ruff's marker that keeps a statement's layout (spelled in two parts, so that this file does not carry it)
FMT_SKIP = "# fmt" + ": skip"


def test_the_formatter_owns_the_layout():
    """The marker only where a table reads better aligned: at most 40 in all, each under a comment that says why."""
    marked = []
    for tree in PYTHON_TREES:
        for path in sorted((REPO / tree).rglob("*.py")):
            lines = path.read_text().splitlines()
            marked += [(path, n, lines[n - 1] if n else "") for n, line in enumerate(lines) if FMT_SKIP in line]
    assert len(marked) <= 40, f"{len(marked)} markers"
    unexplained = [f"{p.relative_to(REPO)}:{n + 1}" for p, n, above in marked if not above.lstrip().startswith("#")]
    assert unexplained == [], "a marker without a comment line above it that says why"
