"""root@pam with a TOTP second factor, as PVE asks for it at login (provision/lab/pve_tfa.py, from pve-access-control):
every API module logs in with the code of `api_totp_secret` (plugins/module_utils/pve_api.py), and a login PVE
refuses for its second factor is one line naming the variable, before anything is written."""

from __future__ import annotations

import base64

import pytest

from provision.lab.pve_tfa import accepts, code_at, totp_pve
from tests.faults import Row
from tests.unit import collection
from tests.unit.plugins.modules.test_proxmox_lxc_gpu_faults import (
    HOST_NODES,
    PREFIX,
    Clock,
    Served,
    clocked,
    faulty_pve_class,
    ours,
    run,
)

SECRET = base64.b32encode(b"provision-lab-totp-1").decode().rstrip("=")
RFC_SECRET = base64.b32encode(b"12345678901234567890").decode()  # RFC 6238 appendix B's SHA-1 key
# RFC 6238 appendix B, SHA-1: (time, 8-digit code); PVE's codes are the last 6 digits
RFC_VECTORS = [
    (59, "94287082"),
    (1111111109, "07081804"),
    (1111111111, "14050471"),
    (1234567890, "89005924"),
    (2000000000, "69279037"),
    (20000000000, "65353130"),
]
ASKS = (
    f"{PREFIX}root@pam at https://127.0.0.1:… asks for a second factor (TFA): set proxmox_api_totp_secret to the "
    "secret of its TOTP entry, or use an API token (and gpu_passthrough_api_backend: ssh for devN entries)"
)
REFUSED = (
    f"{PREFIX}root@pam at https://127.0.0.1:… refused the TOTP code of proxmox_api_totp_secret: check that it is the "
    "secret of the user's TOTP entry and that this controller's clock is right (PVE locks a user's TOTP after "
    "repeated refused codes; pveum user tfa unlock lifts it)"
)
NOT_BASE32 = f"{PREFIX}proxmox_api_totp_secret is not a base32 TOTP secret (as PVE's TOTP enrolment shows it)"
PASSWORD = "pve-lab-password-7d1c"  # not a word of the messages, which Ansible would mask as a no_log value


@pytest.fixture
def served(pki):
    served = Served(*pki, pve_class=totp_pve(faulty_pve_class()))
    served.pve.totp_secrets["root@pam"] = SECRET
    served.pve.password = PASSWORD
    yield served
    served.stop()


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    from fakepve.certs import make_cert

    return make_cert(str(tmp_path_factory.mktemp("pve-pki")), hosts=("127.0.0.1",))[:2]


@pytest.mark.parametrize(("at", "code"), RFC_VECTORS)
def test_the_client_and_the_stand_in_compute_rfc_6238s_codes(at, code):
    module = collection.module("proxmox_lxc_gpu")
    assert module.pve_api.totp(RFC_SECRET, at, digits=8) == code
    assert module.pve_api.totp(RFC_SECRET, at) == code_at(RFC_SECRET, at // 30) == code[2:]
    assert accepts(RFC_SECRET, code[2:], at + 30) and not accepts(RFC_SECRET, code[2:], at + 90)


def test_with_the_totp_secret_the_module_logs_in_and_converges(served, monkeypatch):
    module = clocked(monkeypatch, "proxmox_lxc_gpu", Clock())
    result = run(module, served, api_password=PASSWORD, api_totp_secret=SECRET)
    assert not result.get("failed") and result["changed"], result.get("msg")
    served.idle()
    assert ours(served.state()["running"]) == {n["path"] for n in HOST_NODES}
    assert SECRET not in str(result) and module.pve_api.totp(SECRET) not in result.get("msg", "")


# (id, what the inventory gives, the line the user sees, the codes PVE is sent: each refused one counts toward its
# TOTP lockout)
CASES = [
    ("no-secret", {}, ASKS, []),
    (
        "wrong-secret",
        {"api_totp_secret": base64.b32encode(b"another-users-secret").decode()},
        REFUSED,
        [("root@pam", False)],
    ),
    ("not-base32", {"api_totp_secret": "not a secret!"}, NOT_BASE32, []),
]


@pytest.mark.parametrize(("given", "sees", "answers"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_second_factor_pve_asks_for_and_does_not_get_is_one_line_before_anything_is_written(
    given, sees, answers, served, monkeypatch
):
    module = clocked(monkeypatch, "proxmox_lxc_gpu", Clock())
    before = served.state()
    result = run(module, served, api_password=PASSWORD, **given)
    assert result.get("failed") and result["msg"] == sees.replace("127.0.0.1:…", f"127.0.0.1:{served.pve.port}")
    assert served.state() == before, "nothing was written"
    assert [p for _, p, _ in served.pve.requests if not p.endswith("/access/ticket")] == [], "no call but the login"
    assert served.pve.answers == answers, "no code is sent where there is none to send"


@pytest.mark.parametrize("name", ["pve_node_guests", "proxmox_lxc_ct", "proxmox_lxc_mount"])
def test_every_api_module_takes_the_totp_secret(name):
    assert collection.module(name).pve_api.ARGUMENT_SPEC["api_totp_secret"] == {"type": "str", "no_log": True}


FAULT_ROWS = [
    Row(
        f"root@pam with a TOTP second factor, {label}",
        "gpu",
        f"`{sees}`",
        "config unchanged (same digest), no reboot",
        "yes: with proxmox_api_totp_secret the run logs in and converges",
        "tests/unit/plugins/module_utils/test_pve_api_tfa.py::"
        f"test_a_second_factor_pve_asks_for_and_does_not_get_is_one_line_before_anything_is_written[{case_id}]",
        True,
        True,
        "hard fault: the PVE API",
    )
    for case_id, label, sees in [
        ("no-secret", "no proxmox_api_totp_secret", ASKS),
        ("wrong-secret", "another secret's code", REFUSED),
        ("not-base32", "a proxmox_api_totp_secret that is not base32", NOT_BASE32),
    ]
]
