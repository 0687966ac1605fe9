"""The Proxmox VE API from the controller, one way for every module that calls it (proxmox_lxc_gpu, pve_node_guests).

One login (a ticket for a user's password, or an API token; TLS verified against the system's CAs or
`ca_file`, or not at all when `validate_certs` is false), one bounded retry with backoff for an API that is down,
cut off or answers 5xx/59x, and PVE's refusals turned into one line that says what to do. The caller names what it
was doing (`what`) and, for a 403, where the privilege is needed (`grant_on`); the module adds its own prefix
("CT 101 on pve1: ", "pve1: ").

`p` is the module's params: api_host, api_port, api_user, api_password, api_totp_secret, api_token_id,
api_token_secret, validate_certs, ca_file, retries (and for proxmox_lxc_gpu's ssh backend: backend, ssh_*).
proxmoxer is imported only when a call is made, so this file loads without it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import struct
import time

RETRYABLE_STATUS = (500, 502, 503, 595, 596, 597, 598, 599)
MODIFIED = "detected modified configuration"
DEVICE_MISSING = re.compile(r"Device (\S+) does not exist")
CERTIFICATE_FAILED = re.compile(r"CERTIFICATE_VERIFY_FAILED|certificate verify failed", re.I)
CHECK_LOGIN = "check proxmox_api_user and proxmox_api_password (or the API token), then run again"
# proxmoxer's words when PVE asked for a second factor and refused the one it was given (or none)
SECOND_FACTOR_REFUSED = "missing Two Factor Authentication"
RUN_AGAIN = "run again once it answers"
UNVERIFIED = "proxmox_api_validate_certs is false: the PVE API's TLS certificate is NOT verified"

# The module options every API module takes, as AnsibleModule's argument_spec (DOCUMENTATION lists them too).
ARGUMENT_SPEC = dict(
    api_host=dict(type="str", required=True),
    api_port=dict(type="int", default=8006),
    api_user=dict(type="str", default="root@pam"),
    api_password=dict(type="str", no_log=True),
    api_totp_secret=dict(type="str", no_log=True),
    api_token_id=dict(type="str", no_log=False),
    api_token_secret=dict(type="str", no_log=True),
    validate_certs=dict(type="bool", default=True),
    ca_file=dict(type="path"),
    retries=dict(type="int", default=3),
)


# ... and those of every module that works on one container.
CT_ARGUMENT_SPEC = dict(
    ARGUMENT_SPEC,
    node=dict(type="str", required=True),
    vmid=dict(type="int", required=True),
)


class ApiFailure(Exception):
    pass


class TaskFailed(ApiFailure):
    """A PVE task that ended with an error exitstatus."""


def proxmoxer_modules():
    """(proxmoxer, ResourceException), or an ApiFailure that says proxmoxer is missing."""
    try:
        import proxmoxer
        from proxmoxer.core import ResourceException

        return proxmoxer, ResourceException
    except ImportError as exc:
        raise ApiFailure(
            f"proxmoxer is not installed for the controller's Python ({os.sys.executable}); it comes with provision"
        ) from exc


def totp(secret: str, at: float | None = None, step: int = 30, digits: int = 6) -> str:
    """The TOTP code of a base32 secret at `at` (now): RFC 6238 over HMAC-SHA1, PVE's TOTP (30 s steps, 6
    digits, SHA-1: what PVE's TOTP enrolment sets)."""
    key = base64.b32decode(secret.replace(" ", "").upper() + "=" * (-len(secret.replace(" ", "")) % 8))
    counter = int((time.time() if at is None else at) // step)
    mac = hmac.new(key, struct.pack(">Q", counter), hashlib.sha1).digest()
    offset = mac[-1] & 0x0F
    code = (struct.unpack(">I", mac[offset : offset + 4])[0] & 0x7FFFFFFF) % 10**digits
    return str(code).zfill(digits)


def _second_factor(p) -> dict:
    """proxmoxer's arguments for the second factor PVE asks of a user with TOTP: the code of api_totp_secret
    (ignored where PVE asks for none). A secret that is not base32 is an ApiFailure naming the variable."""
    if not p.get("api_totp_secret"):
        return {}
    try:
        return dict(otp=totp(p["api_totp_secret"]))  # proxmoxer answers it as `totp:<code>`
    except (ValueError, base64.binascii.Error) as exc:
        raise ApiFailure(
            "proxmox_api_totp_secret is not a base32 TOTP secret (as PVE's TOTP enrolment shows it)"
        ) from exc


def _refused_login(p, where: str, exc: Exception) -> ApiFailure:
    """The one line for a login PVE refused: a second factor it asked for and did not get (or did not accept)
    says which variable gives it; anything else, the user and password."""
    if SECOND_FACTOR_REFUSED not in str(exc):
        return ApiFailure(f"authentication failed for {p['api_user']} at {where}: {CHECK_LOGIN} ({exc})")
    if p.get("api_totp_secret"):
        return ApiFailure(
            f"{p['api_user']} at {where} refused the TOTP code of proxmox_api_totp_secret: check that it is the "
            "secret of the user's TOTP entry and that this controller's clock is right (PVE locks a user's TOTP after "
            "repeated refused codes; pveum user tfa unlock lifts it)"
        )
    return ApiFailure(
        f"{p['api_user']} at {where} asks for a second factor (TFA): set proxmox_api_totp_secret to the secret of its "
        "TOTP entry, or use an API token (and gpu_passthrough_api_backend: ssh for devN entries)"
    )


def _asks_second_factor(p, where: str, kwargs: dict, proxmoxer) -> bool:
    """Whether PVE asks this user for a second factor at login: the first step of the ticket login alone. proxmoxer
    answers a second-factor request with whatever code it holds (none: `totp:None`), and PVE locks a user's TOTP after
    repeated refused codes, so no code is sent where there is none to send. A login PVE refuses or does not answer
    fails here, as proxmoxer's would."""
    import requests

    url = f"{where}/api2/json/access/ticket"
    data = {"username": p["api_user"], "password": p["api_password"]}
    answer = requests.post(url, data=data, verify=kwargs["verify_ssl"], timeout=kwargs["timeout"])
    if answer.status_code != 200:
        raise proxmoxer.AuthenticationError(
            f"Couldn't authenticate user: {p['api_user']} to {url} code: {answer.status_code}"
        )
    return bool((answer.json().get("data") or {}).get("NeedTFA"))


def _login_args(p, where: str) -> dict:
    """proxmoxer.ProxmoxAPI's arguments for this login: TLS as the params say, and a token, or a password (with the
    second factor's code where there is a TOTP secret)."""
    kwargs = dict(port=p["api_port"], user=p["api_user"], timeout=30, service="PVE")
    kwargs["verify_ssl"] = (p["ca_file"] or True) if p["validate_certs"] else False
    if p["api_token_id"]:
        if not p["api_token_secret"]:
            raise ApiFailure("proxmox_api_token_id is set but proxmox_api_token_secret is empty")
        return dict(kwargs, token_name=p["api_token_id"], token_value=p["api_token_secret"])
    if not p["api_password"]:
        raise ApiFailure(f"no credentials for {where}: set proxmox_api_password (or a token)")
    return dict(kwargs, password=p["api_password"], **_second_factor(p))


def require_host(p) -> None:
    """An empty or unset proxmox_api_host (plain ansible-playbook has no inventory check) is one line naming it."""
    if not p["api_host"] and not (p.get("backend") == "ssh" and p.get("ssh_host")):
        raise ApiFailure("proxmox_api_host is empty or not set: set it to the PVE API's address (name or IP)")


def connect(p):
    """A logged-in proxmoxer.ProxmoxAPI. A login PVE did not answer (5xx/59x) is raised as ResourceException, so
    that with_retries tries again; a refused one, or a certificate that does not verify, is an ApiFailure."""
    require_host(p)
    proxmoxer = proxmoxer_modules()[0]
    if p.get("backend", "https") == "ssh":
        return connect_ssh(p, proxmoxer)
    where = f"https://{p['api_host']}:{p['api_port']}"
    kwargs = _login_args(p, where)
    try:
        if not p["api_token_id"] and not p.get("api_totp_secret") and _asks_second_factor(p, where, kwargs, proxmoxer):
            raise _refused_login(p, where, proxmoxer.AuthenticationError(SECOND_FACTOR_REFUSED))
        api = proxmoxer.ProxmoxAPI(p["api_host"], backend="https", **kwargs)
        if p["api_token_id"]:
            api.version.get()  # tokens are checked on the first request, not at construction
        return api
    except proxmoxer.AuthenticationError as exc:
        code = re.search(r"code: (\d+)", str(exc))
        if code and int(code.group(1)) in RETRYABLE_STATUS:  # PVE did not answer the login: not a refusal
            ResourceException = proxmoxer_modules()[1]
            raise ResourceException(int(code.group(1)), "while logging in", str(exc)) from exc
        raise _refused_login(p, where, exc) from exc
    except Exception as exc:  # requests' SSLError and ConnectionError, without importing requests here
        text = str(exc)
        if "SSL" in type(exc).__name__ or CERTIFICATE_FAILED.search(text):
            cause = text.split("(Caused by", maxsplit=1)[0].strip()
            raise ApiFailure(
                f"TLS verification of {where} failed ({cause}): set proxmox_api_ca_file "
                "to the CA that signed the PVE certificate (on a node: /etc/pve/pve-root-ca.pem)"
            ) from exc
        status = getattr(exc, "status_code", None)
        if status == 401:
            raise ApiFailure(f"authentication failed for {p['api_user']} at {where}: {CHECK_LOGIN} ({exc})") from exc
        raise


def connect_ssh(p, proxmoxer):
    """pvesh on the node over ssh (as root@pam, so devN changes are allowed), host key checked."""
    import paramiko
    from proxmoxer.backends import ssh_paramiko

    known_hosts = p["ssh_known_hosts"] or os.path.expanduser("~/.ssh/known_hosts")
    host = p["ssh_host"] or p["api_host"]

    def checked_connect(session):
        client = paramiko.SSHClient()
        client.load_host_keys(known_hosts)
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        client.connect(
            session.host,
            port=session.port,
            username=session.user,
            key_filename=session.private_key_file,
            allow_agent=True,
            look_for_keys=not session.private_key_file,
            timeout=30,
        )
        return client

    ssh_paramiko.SshParamikoSession._connect = checked_connect
    try:
        return proxmoxer.ProxmoxAPI(
            host,
            backend="ssh_paramiko",
            user=p["ssh_user"],
            port=p["ssh_port"],
            private_key_file=p["ssh_private_key_file"],
            service="PVE",
        )
    except paramiko.SSHException as exc:
        raise ApiFailure(
            f"ssh to {host}:{p['ssh_port']} refused (host key checked against {known_hosts}): {exc}"
        ) from exc


def lost_connection(exc):
    """A request the network lost (reset, timed out, TLS cut short): worth another attempt. A certificate that
    does not verify is no such thing."""
    name = type(exc).__name__
    lost = "Connection" in name or "Timeout" in name or "SSL" in name
    return lost and not CERTIFICATE_FAILED.search(str(exc))


def with_retries(p, what, call, explain=None, grant_on="/", still_failing=None):
    """Bounded retry, with backoff, for an API that is down, cut off or answers 5xx/59x. Every other refusal is an
    ApiFailure that says what to do (`explain(exc)`'s, for the refusals the caller knows, else `refused`'s).
    "detected modified configuration" is re-raised: the caller reads the config again. After the last attempt,
    `still_failing(last)` may name what to do about the last answer (else: run again once the API answers)."""
    ResourceException = proxmoxer_modules()[1]
    delay, last = 1.0, None
    for attempt in range(1, p["retries"] + 1):
        try:
            return call()
        except ResourceException as exc:
            if MODIFIED in str(exc):
                raise
            if exc.status_code not in RETRYABLE_STATUS or DEVICE_MISSING.search(str(exc)):
                raise ((explain and explain(exc)) or refused(p, what, exc, grant_on)) from exc
            last = exc
        except ApiFailure:
            raise
        except Exception as exc:
            if not lost_connection(exc):
                raise
            last = exc
        if attempt < p["retries"]:
            time.sleep(delay)
            delay *= 2
    todo = (still_failing and still_failing(last)) or RUN_AGAIN
    raise ApiFailure(
        f"{what} failed {p['retries']} times; the PVE API at {p['api_host']}:{p['api_port']} keeps failing "
        f"({last}): {todo}"
    )


def refused(p, what, exc, grant_on):
    """PVE's refusal of `what`, which no retry changes, with what to do."""
    if exc.status_code == 401:
        todo = "the login is no longer valid: " + CHECK_LOGIN
    elif exc.status_code == 403:
        todo = f"{p['api_user']} lacks the privilege PVE names: grant it on {grant_on}, then run again"
    else:
        todo = "fix what PVE names, then run again"
    return ApiFailure(f"{what} was refused ({exc}): {todo}")


def wait_task(p, api, node, upid, what, retry=None, timeout_variable="the module's task_timeout"):
    """Wait for a task (`what` names it in messages) and check its exitstatus (proxmoxer's blocking_status does
    neither reliably); each read through `retry` (with_retries by default). Past p["task_timeout"], PVE's task goes
    on: the error says so, and names the variable that raises the limit."""
    retry = retry or with_retries
    deadline = time.monotonic() + p["task_timeout"]
    while True:
        status = retry(p, f"reading the status of {what}", api.nodes(node).tasks(upid).status.get)
        if status.get("status") == "stopped":
            exitstatus = status.get("exitstatus", "")
            if exitstatus == "OK" or str(exitstatus).startswith("WARNINGS"):
                return exitstatus
            log = retry(p, f"reading the log of {what}", lambda: api.nodes(node).tasks(upid).log.get(limit=50))
            tail = " | ".join(line.get("t", "") for line in log[-5:])
            raise TaskFailed(f"{what} (task {upid}) ended with exitstatus {exitstatus!r}: {tail}")
        if time.monotonic() > deadline:
            raise ApiFailure(
                f"{what} (task {upid}) is still running after {p['task_timeout']}s; PVE goes on with it: run again "
                f"once it has ended, or raise {timeout_variable}"
            )
        time.sleep(1)


def run_module(module, where, run, failures=(ApiFailure,)):
    """`run(module)`'s result. A failure the module knows (`failures`) fails it with one line after `where`
    ("CT 101 on pve1: "); any other exception with its type, message and traceback."""
    import traceback

    try:
        return run(module)
    except failures as exc:
        module.fail_json(msg=where + one_line(exc))
    except Exception as exc:
        module.fail_json(msg=f"{where}{type(exc).__name__}: {one_line(exc)}", exception=traceback.format_exc())


def one_line(text):
    """A message as one line (PVE's answers and task logs may hold several)."""
    return " ".join(str(text).split())
