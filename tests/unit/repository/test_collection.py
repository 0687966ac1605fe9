"""The repository as the Ansible collection provision.pve_sglang, installed the way an AWX or Semaphore user
installs it (ansible-galaxy collection build, then install): it holds no import of the provision package, its
playbooks parse by their FQCN with roles and plugins taken from the installed copy only, and a module with
module_utils runs from it under a Python that has no provision (nor Ansible) on it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.loaders import REPO

BIN = Path(sys.executable).parent
IMPORTS_PROVISION = re.compile(r"^\s*(from\s+provision(\.\w+)*\s+import\b|import\s+provision\b)", re.MULTILINE)
# a Python outside our virtualenv: it cannot import provision (nor ansible); modules need neither
SYSTEM_PYTHON = Path("/usr/bin/python3")


def run(argv: list, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A directory holding the built tarball and collections/, where it is installed."""
    root = tmp_path_factory.mktemp("collection")
    built = run([BIN / "ansible-galaxy", "collection", "build", "--output-path", root, REPO], cwd=root)
    assert built.returncode == 0, built.stdout + built.stderr
    tarball = next(root.glob("provision-pve_sglang-*.tar.gz"))
    done = run([BIN / "ansible-galaxy", "collection", "install", "-p", root / "collections", tarball], cwd=root)
    assert done.returncode == 0, done.stdout + done.stderr
    return root


def ansible_env(root: Path) -> dict[str, str]:
    """Only the installed collection: no roles path into this checkout, no PYTHONPATH, no ansible.cfg of ours."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_") and k != "PYTHONPATH"}
    return {
        **env,
        "ANSIBLE_COLLECTIONS_PATH": str(root / "collections"),
        "ANSIBLE_ROLES_PATH": str(root / "none"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_LOCALHOST_WARNING": "false",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "false",
    }


def test_the_collection_has_the_package_version_and_only_collection_content(installed):
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert yaml.safe_load((REPO / "galaxy.yml").read_text())["version"] == version
    assert (installed / f"provision-pve_sglang-{version}.tar.gz").is_file()
    tree = installed / "collections" / "ansible_collections" / "provision" / "pve_sglang"
    manifest = json.loads((tree / "MANIFEST.json").read_text())
    assert manifest["collection_info"]["version"] == version
    tops = {p.name for p in tree.iterdir()}
    assert tops == {
        "CHANGELOG.md",
        "FILES.json",
        "LICENSE",
        "MANIFEST.json",
        "README.md",
        "changelogs",  # changelog.yaml, which Galaxy reads, and antsibull-changelog's config
        "meta",
        "playbooks",
        "plugins",
        "roles",
        "tests",
    }, tops
    tests = {str(p.relative_to(tree)) for p in (tree / "tests").rglob("*") if p.is_file()}
    assert tests == {"tests/sanity/ignore-2.19.txt"}, "of the tests, only ansible-test's sanity ignores"
    assert (tree / "roles" / "gpu_diag" / "files" / "gpu_p2p_diag.py").is_file()
    assert (tree / "meta" / "execution-environment.yml").is_file()


def test_no_file_of_the_collection_imports_provision(installed):
    tree = installed / "collections" / "ansible_collections"
    offenders = [
        str(p.relative_to(tree))
        for p in tree.rglob("*")
        if p.is_file() and p.suffix in (".py", ".j2", "") and IMPORTS_PROVISION.search(p.read_text(errors="replace"))
    ]
    assert offenders == []
    # the rule above does find such an import
    assert IMPORTS_PROVISION.search("    from provision.sglang_flags import flags_from_wheel\n")


def test_every_playbook_parses_by_its_fqcn_from_the_installed_collection(installed):
    names = [f"provision.pve_sglang.{p.stem}" for p in sorted((REPO / "playbooks").glob("*.yml"))]
    assert "provision.pve_sglang.site" in names
    checked = run([BIN / "ansible-playbook", "--syntax-check", *names], cwd=installed, env=ansible_env(installed))
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.parametrize("kind, folder", [("module", "modules"), ("lookup", "lookup")])
def test_ansible_doc_reads_every_module_and_lookup_of_the_installed_collection(installed, kind, folder):
    """DOCUMENTATION, EXAMPLES and RETURN are YAML that ansible-doc reads without a warning (a ': ' in a plain
    description line, or a ',' in a flow mapping, once made two modules undocumented and one option mistyped)."""
    names = [f"provision.pve_sglang.{p.stem}" for p in sorted((REPO / "plugins" / folder).glob("*.py"))]
    doc = run([BIN / "ansible-doc", "-t", kind, "--json", *names], cwd=installed, env=ansible_env(installed))
    assert doc.returncode == 0 and "WARNING" not in doc.stderr, doc.stderr
    assert sorted(json.loads(doc.stdout)) == names
    # the page a user reads: ansible-doc's text output refuses an option or return value without a description
    # (that --json lets through), and says so on stderr with exit 0
    text = run([BIN / "ansible-doc", "-t", kind, *names], cwd=installed, env=ansible_env(installed))
    assert text.returncode == 0 and "ERROR" not in text.stderr, text.stderr
    assert all(f"({name})" in text.stdout or name in text.stdout for name in names)


@pytest.mark.parametrize("kind", ["filter", "test"])
def test_ansible_doc_reads_every_filter_and_test_of_the_installed_collection(installed, kind):
    """A Jinja2 filter or test is documented in a YAML file named after it beside its Python file
    (plugins/filter/<name>.yml), as several share one Python file. The names are the ones ansible-doc lists."""
    env = ansible_env(installed)
    listed = run([BIN / "ansible-doc", "-t", kind, "-l", "--json", "provision.pve_sglang"], cwd=installed, env=env)
    assert listed.returncode == 0 and "WARNING" not in listed.stderr, listed.stderr
    summaries = json.loads(listed.stdout)
    names = sorted(summaries)
    assert names and all(name.startswith("provision.pve_sglang.") for name in names), names
    assert [name for name, summary in summaries.items() if summary == "UNDOCUMENTED"] == []
    doc = run([BIN / "ansible-doc", "-t", kind, "--json", *names], cwd=installed, env=env)
    assert doc.returncode == 0 and "WARNING" not in doc.stderr, doc.stderr
    docs = json.loads(doc.stdout)
    assert sorted(docs) == names
    lacking = [
        f"{name}: {part}"
        for name, d in docs.items()
        for part, given in (
            ("author", d["doc"].get("author")),
            ("EXAMPLES", (d.get("examples") or "").strip()),
            ("RETURN", (d.get("return") or {}).get("_value")),
        )
        if not given
    ]
    assert lacking == []
    # the page a user reads: the text output refuses an option or return value without a description
    text = run([BIN / "ansible-doc", "-t", kind, *names], cwd=installed, env=env)
    assert text.returncode == 0 and "ERROR" not in text.stderr and "WARNING" not in text.stderr, text.stderr
    assert all(f"> {kind.upper()} {name} " in text.stdout for name in names)


# The keys a module's option may have in its documentation: ansible-test's validate-modules schema for modules
# (ansible_test/_util/controller/sanity/validate-modules/validate_modules/schema.py, ansible-core 2.19,
# list_dict_option_schema l.577-589 and the suboptions of l.697-700). `no_log` is not one: it belongs to the
# argument spec, where Ansible acts on it.
MODULE_OPTION_KEYS = {
    "description",
    "required",
    "choices",
    "aliases",
    "version_added",
    "version_added_collection",
    "default",
    "type",
    "elements",
    "suboptions",
}


def test_every_documented_option_has_only_the_keys_ansible_documents(installed):
    names = [f"provision.pve_sglang.{p.stem}" for p in sorted((REPO / "plugins" / "modules").glob("*.py"))]
    doc = run([BIN / "ansible-doc", "-t", "module", "--json", *names], cwd=installed, env=ansible_env(installed))
    assert doc.returncode == 0, doc.stderr

    def wrong(options: dict, where: str) -> list[str]:
        found = []
        for name, option in (options or {}).items():
            found += [f"{where}{name}: {key}" for key in sorted(set(option) - MODULE_OPTION_KEYS)]
            found += wrong(option.get("suboptions"), f"{where}{name}.")
        return found

    found = [f"{m}: {line}" for m, d in json.loads(doc.stdout).items() for line in wrong(d["doc"]["options"], "")]
    assert found == []


@pytest.mark.skipif(not SYSTEM_PYTHON.exists(), reason="needs a system python3 outside the virtualenv")
def test_a_module_runs_its_module_utils_from_the_collection_without_provision(installed, tmp_path):
    probe = run([SYSTEM_PYTHON, "-c", "import provision"], cwd=tmp_path)
    assert "No module named 'provision'" in probe.stderr, "this check needs a Python that cannot import provision"
    # an sglang 0.5.x wheel as sglang_flag_check reads it: the flags come from its source
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "sglang-0.5.23-py3-none-any.whl", "w") as wheel:
        wheel.writestr("sglang/srt/server_args.py", 'p.add_argument("--model-path")\np.add_argument("--tp-size")\n')
    args = {"version": "0.5.23", "args": ["--tp", "2", "--no-such-flag"], "wheel_dirs": [str(wheels)]}
    module = "provision.pve_sglang.sglang_flag_check"
    interpreter = f"ansible_python_interpreter={SYSTEM_PYTHON}"
    ran = run(
        [BIN / "ansible", "localhost", "-m", module, "-a", json.dumps(args), "-e", interpreter],
        cwd=tmp_path,
        env=ansible_env(installed),
    )
    assert "SGLang 0.5.23 has no flag --no-such-flag" in ran.stdout, ran.stdout + ran.stderr
    assert ran.returncode == 2


@pytest.mark.skipif(os.geteuid() != 0 or not SYSTEM_PYTHON.exists(), reason="the records are owned by root")
def test_site_from_the_installed_collection_records_a_phase_then_skips_it(installed, tmp_path):
    """Without the CLI, the phase fingerprint holds to the installed collection's release (MANIFEST.json)."""
    state = tmp_path / "state"
    host = {
        "ansible_connection": "local",
        "ansible_python_interpreter": str(SYSTEM_PYTHON),
        "provision_state_dir": str(state),
    }
    groups = {"proxmox_hosts": {"hosts": {"node-1": host}}, "gpu_containers": {"hosts": {}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": groups}}))
    argv = [BIN / "ansible-playbook", "-i", tmp_path / "hosts.yml", "provision.pve_sglang.site", "--tags", "verify"]
    first = run(argv, cwd=tmp_path, env=ansible_env(installed))
    assert first.returncode == 0 and "changed=1" in first.stdout, first.stdout + first.stderr
    assert (
        json.loads((state / "verify.json").read_text())["provision_version"]
        == yaml.safe_load((REPO / "galaxy.yml").read_text())["version"]
    )
    second = run(argv, cwd=tmp_path, env=ansible_env(installed))
    assert second.returncode == 0 and "changed=0" in second.stdout, second.stdout + second.stderr
    assert "up to date, skipped: verify" in second.stdout
