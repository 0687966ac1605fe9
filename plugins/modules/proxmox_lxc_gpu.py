#!/usr/bin/python
"""Ansible module: put a host's NVIDIA device nodes into an LXC container's devN entries via the PVE API."""

from __future__ import annotations

DOCUMENTATION = r"""
module: proxmox_lxc_gpu
short_description: Pass NVIDIA device nodes into a Proxmox LXC container as devN entries (proxmoxer)
description:
  - Reads the container config with its digest, keeps unrelated devN/mpN/... entries, puts the NVIDIA
    entries into free slots and writes with the digest, retrying a bounded number of times when PVE answers
    "detected modified configuration". Restarts the container only when a change is left pending (PVE 8, or an
    edited entry on PVE 9; a new entry hot-plugs on PVE 9). Waits for every task and checks its exitstatus.
  - Runs on the controller. Supports check mode and diff. Passwords and token secrets are never returned.
options:
  api_host: {type: str, required: true}
  api_port: {type: int, default: 8006}
  api_user: {type: str, default: root@pam}
  api_password: {type: str, no_log: true}
  api_token_id: {type: str}
  api_token_secret: {type: str, no_log: true}
  validate_certs: {type: bool, default: true}
  ca_file: {type: path}
  backend: {type: str, choices: [https, ssh], default: https, description: ssh runs pvesh on the node as root}
  ssh_host: {type: str}
  ssh_port: {type: int, default: 22}
  ssh_user: {type: str, default: root}
  ssh_private_key_file: {type: path}
  ssh_known_hosts: {type: path, description: known_hosts file; unknown or changed host keys are refused}
  node: {type: str, required: true}
  vmid: {type: int, required: true}
  nodes: {type: list, elements: dict, required: true, description: "the host's device nodes (path, type, mode)"}
  gpus: {type: raw, default: all, description: all, or a list of GPU indices}
  mode: {type: str, default: "0666"}
  uid: {type: int}
  gid: {type: int}
  restart: {type: str, choices: [auto, never], default: auto}
  nesting:
    type: bool
    default: true
    description: "set features: nesting=1, which systemd needs to sandbox units in an unprivileged CT"
  retries: {type: int, default: 3}
  task_timeout: {type: int, default: 300}
"""

EXAMPLES = r"""
- name: Pass all GPUs into CT 101
  proxmox_lxc_gpu:
    api_host: pve.example.net
    api_user: root@pam
    api_password: "{{ lookup('env', 'PROXMOX_PASSWORD') }}"
    node: pve1
    vmid: 101
    nodes: "{{ discovered_nodes }}"
"""

RETURN = r"""
entries: {description: devN -> value of the NVIDIA entries after the run, type: dict, returned: always}
set: {description: entries written, type: dict, returned: always}
deleted: {description: entries deleted, type: list, returned: always}
restarted: {description: whether the container was rebooted to apply pending changes, type: bool, returned: always}
pending: {description: device paths whose devN entry the running CT does not have yet, type: list, returned: always}
nesting_pending: {description: whether the running CT lacks features nesting=1, type: bool, returned: always}
"""

import os
import re
import time
import traceback

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.provision.pve_sglang.plugins.module_utils.gpu_devices import (
    DeviceError,
    desired_entries,
    is_ours,
    parse_entry,
    plan,
    select_nodes,
)

TOKEN_DEVN_HELP = (
    "PVE lets only root@pam change devN entries, and an API token ({token}) is refused even when it belongs to "
    "root@pam (HTTP 403). Use a ticket login instead (proxmox_api_user: root@pam with proxmox_api_password from "
    "the environment or vault, and no proxmox_api_token_id), or gpu_passthrough_api_backend: ssh, which runs "
    "pvesh on the node as root over ssh with its host key checked"
)
MODIFIED = "detected modified configuration"
DEVICE_MISSING = re.compile(r"Device (\S+) does not exist")
RETRYABLE_STATUS = (500, 502, 503, 595, 596, 597, 598, 599)


class ApiFailure(Exception):
    pass


def _proxmoxer():
    try:
        import proxmoxer
        from proxmoxer.core import ResourceException

        return proxmoxer, ResourceException
    except ImportError as exc:
        raise ApiFailure(
            f"proxmoxer is not installed for the controller's Python ({os.sys.executable}); it comes with provision"
        ) from exc


def connect(p):
    proxmoxer, _ = _proxmoxer()
    if p["backend"] == "ssh":
        return connect_ssh(p, proxmoxer)
    where = f"https://{p['api_host']}:{p['api_port']}"
    kwargs = dict(port=p["api_port"], user=p["api_user"], timeout=30, service="PVE")
    kwargs["verify_ssl"] = (p["ca_file"] or True) if p["validate_certs"] else False
    if p["api_token_id"]:
        if not p["api_token_secret"]:
            raise ApiFailure("proxmox_api_token_id is set but proxmox_api_token_secret is empty")
        kwargs.update(token_name=p["api_token_id"], token_value=p["api_token_secret"])
    else:
        if not p["api_password"]:
            raise ApiFailure(f"no credentials for {where}: set proxmox_api_password (or a token)")
        kwargs["password"] = p["api_password"]
    try:
        api = proxmoxer.ProxmoxAPI(p["api_host"], backend="https", **kwargs)
        if p["api_token_id"]:
            api.version.get()  # tokens are checked on the first request, not at construction
        return api
    except proxmoxer.AuthenticationError as exc:
        raise ApiFailure(
            f"authentication failed for {p['api_user']} at {where} (wrong password or user?): {exc}"
        ) from exc
    except Exception as exc:  # requests' SSLError and ConnectionError, without importing requests here
        text = str(exc)
        if "SSL" in type(exc).__name__ or "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text:
            raise ApiFailure(
                f"TLS verification of {where} failed ({text.split('(Caused by')[0].strip()}): set proxmox_api_ca_file "
                "to the CA that signed the PVE certificate (on a node: /etc/pve/pve-root-ca.pem)"
            ) from exc
        status = getattr(exc, "status_code", None)
        if status == 401:
            raise ApiFailure(f"authentication failed for {p['api_user']} at {where}: {exc}") from exc
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


def with_retries(p, what, call):
    """Bounded retry for an API that is down or answers 5xx/59x; 4xx and modified-config are not retried here."""
    _, ResourceException = _proxmoxer()
    delay, last = 1.0, None
    for attempt in range(1, p["retries"] + 1):
        try:
            return call()
        except ResourceException as exc:
            if exc.status_code not in RETRYABLE_STATUS or MODIFIED in str(exc) or DEVICE_MISSING.search(str(exc)):
                raise
            last = exc
        except ApiFailure:
            raise
        except Exception as exc:
            if "Connection" not in type(exc).__name__ and "Timeout" not in type(exc).__name__:
                raise
            last = exc
        if attempt < p["retries"]:
            time.sleep(delay)
            delay *= 2
    raise ApiFailure(
        f"{what} failed {p['retries']} times; the PVE API at {p['api_host']}:{p['api_port']} keeps failing: {last}"
    )


def wait_task(p, api, node, upid):
    """Wait for a task and check its exitstatus (proxmoxer's blocking_status does neither reliably)."""
    deadline = time.monotonic() + p["task_timeout"]
    while True:
        status = with_retries(p, "reading task status", lambda: api.nodes(node).tasks(upid).status.get())
        if status.get("status") == "stopped":
            exitstatus = status.get("exitstatus", "")
            if exitstatus == "OK" or str(exitstatus).startswith("WARNINGS"):
                return exitstatus
            log = with_retries(p, "reading the task log", lambda: api.nodes(node).tasks(upid).log.get(limit=50))
            tail = " | ".join(line.get("t", "") for line in log[-5:])
            raise ApiFailure(f"task {upid} ended with exitstatus {exitstatus!r}: {tail}")
        if time.monotonic() > deadline:
            raise ApiFailure(f"task {upid} still running after {p['task_timeout']}s")
        time.sleep(1)


def wanted_features(features, nesting):
    """The CT's `features` string with nesting=1 added (other flags kept), or None when nothing is to change."""
    parts = [f for f in str(features or "").split(",") if f]
    flags = dict(f.split("=", 1) if "=" in f else (f, "") for f in parts)
    if not nesting or flags.get("nesting") == "1":
        return None
    flags["nesting"] = "1"
    return ",".join(f"{key}={value}" for key, value in sorted(flags.items()))


def diff_lines(entries):
    return "".join(f"{k}: {v}\n" for k, v in sorted(entries.items(), key=lambda kv: int(kv[0][3:])))


def write_config(p, api, ct, config, body):
    """PUT the change with the config's digest; PVE's refusals become one-line errors."""
    _, ResourceException = _proxmoxer()
    try:
        with_retries(p, "writing the container config", lambda: ct.config.put(**dict(body, digest=config["digest"])))
    except ResourceException as exc:
        text = str(exc)
        missing = DEVICE_MISSING.search(text)
        if missing:  # LXC/Tools.pm get_device_mode_and_rdev: the path is not on the node; no retry helps
            raise ApiFailure(
                f"PVE refused devN for {missing.group(1)}: it does not exist on node {p['node']}. Make it there first "
                "(the gpu phase's provision-nvidia-nodes.service does at boot) or leave that GPU out "
                "(gpu_passthrough_gpus)"
            ) from exc
        if exc.status_code == 403 and p["api_token_id"] and p["backend"] == "https":
            raise ApiFailure(TOKEN_DEVN_HELP.format(token=f"{p['api_user']}!{p['api_token_id']}")) from exc
        if exc.status_code == 403:
            raise ApiFailure(
                f"PVE refused the devN change (403): {exc}. Only root@pam may change devN entries."
            ) from exc
        if exc.status_code == 400:
            raise ApiFailure(f"PVE rejected the devN entries: {exc} {exc.errors or ''}") from exc
        raise


def run(module):
    """Plan the CT's devN entries and nesting, write them with the config's digest, then restart for what is
    pending."""
    p = module.params
    gpus = p["gpus"]
    if isinstance(gpus, str) and gpus != "all":
        gpus = [g for g in gpus.split(",") if g.strip()]
    selected = select_nodes(p["nodes"], gpus)
    wanted = desired_entries(selected, p["mode"], p["uid"], p["gid"])
    api = with_retries(p, "connecting", lambda: connect(p))
    ct = api.nodes(p["node"]).lxc(p["vmid"])
    result = write_with_digest(module, api, ct, wanted)
    return restart_for_pending(module, api, ct, wanted, result)


def write_with_digest(module, api, ct, wanted):
    """Read the config, plan, and PUT the change with the digest read; when the config changed in between (PVE
    refuses the digest), read and plan again, up to `retries` more times."""
    p = module.params
    _, ResourceException = _proxmoxer()
    result = dict(changed=False, restarted=False, set={}, deleted=[], attempts=0)
    for attempt in range(1, p["retries"] + 2):
        # GET config merges pending changes in; what the CT runs with is current=1 (pve-guest-common
        # load_current_config). Write towards the merged view; restart while the running one differs.
        config = with_retries(p, "reading the container config", lambda: ct.config.get())
        body = plan_body(module, config, wanted, result, attempt)
        if body is None:
            return result
        try:
            write_config(p, api, ct, config, body)
            return result
        except ResourceException as exc:
            if MODIFIED in str(exc) and attempt <= p["retries"]:
                continue  # someone changed the config between our read and write: read again
            raise
    raise ApiFailure(f"the container config kept changing underneath ({p['retries'] + 1} attempts)")


def plan_body(module, config, wanted, result, attempt):
    """The PUT body that brings `config` to the wanted entries and nesting, the plan noted in `result` (with a
    diff when asked); None when nothing is to change, or in check mode."""
    p = module.params
    change = plan(config, wanted)
    features = wanted_features(config.get("features"), p["nesting"])
    result["entries"] = {k: v for k, v in change["after"].items() if is_ours(parse_entry(v).get("path", ""))}
    if not change["set"] and not change["delete"] and features is None:
        return None
    result.update(changed=True, set=change["set"], deleted=change["delete"], attempts=attempt)
    if features is not None:
        result["features"] = features
    if module._diff:
        header = f"CT {p['vmid']} devN ({p['node']})"
        result["diff"] = dict(before=diff_lines(change["before"]), after=diff_lines(change["after"]),
                              before_header=header, after_header=header)  # fmt: skip
    if module.check_mode:
        return None
    body = dict(change["set"])
    if features is not None:
        body["features"] = features
    if change["delete"]:
        body["delete"] = ",".join(change["delete"])
    return body


def restart_for_pending(module, api, ct, wanted, result):
    """Reboot a running CT whose running config lacks our entries or nesting (PVE 8 applies no devN change
    hot; PVE 9 only adds new ones; features always wait). Left as is when asked not to, and said."""
    p = module.params
    running = with_retries(p, "reading the running config", lambda: ct.config.get(current=1))
    in_effect = plan(running, wanted)
    result["pending"] = sorted(
        {parse_entry(v)["path"] for v in in_effect["set"].values()}
        | {parse_entry(running[k]).get("path", k) for k in in_effect["delete"]}
    )
    result["nesting_pending"] = wanted_features(running.get("features"), p["nesting"]) is not None
    if not result["pending"] and not result["nesting_pending"]:
        return result
    status = with_retries(p, "reading the container status", lambda: ct.status.current.get())
    if status.get("status") != "running":
        return result  # the next start applies them
    if p["restart"] == "auto" and module.check_mode:
        result.update(changed=True, would_restart=True)
    elif p["restart"] == "auto":
        upid = with_retries(p, "rebooting the container", lambda: ct.status.reboot.post())
        result["restart_exitstatus"] = wait_task(p, api, p["node"], upid)
        result.update(restarted=True, changed=True, pending=[], nesting_pending=False)
    elif result["nesting_pending"] and not module.check_mode:
        raise ApiFailure(
            f"CT {p['vmid']} on {p['node']} runs without features: nesting=1 (now set, pending until it restarts); "
            "systemd in the container cannot sandbox the SGLang unit without it. Restart it "
            f"(pct reboot {p['vmid']} on {p['node']}) and run again, or set gpu_passthrough_restart: auto"
        )
    return result


def main():
    module = AnsibleModule(
        argument_spec=dict(
            api_host=dict(type="str", required=True),
            api_port=dict(type="int", default=8006),
            api_user=dict(type="str", default="root@pam"),
            api_password=dict(type="str", no_log=True),
            api_token_id=dict(type="str", no_log=False),
            api_token_secret=dict(type="str", no_log=True),
            validate_certs=dict(type="bool", default=True),
            ca_file=dict(type="path"),
            backend=dict(type="str", choices=["https", "ssh"], default="https"),
            ssh_host=dict(type="str"),
            ssh_port=dict(type="int", default=22),
            ssh_user=dict(type="str", default="root"),
            ssh_private_key_file=dict(type="path"),
            ssh_known_hosts=dict(type="path"),
            node=dict(type="str", required=True),
            vmid=dict(type="int", required=True),
            nodes=dict(type="list", elements="dict", required=True),
            gpus=dict(type="raw", default="all"),
            mode=dict(type="str", default="0666"),
            uid=dict(type="int"),
            gid=dict(type="int"),
            restart=dict(type="str", choices=["auto", "never"], default="auto"),
            nesting=dict(type="bool", default=True),
            retries=dict(type="int", default=3),
            task_timeout=dict(type="int", default=300),
        ),
        supports_check_mode=True,
    )
    if not module.params["validate_certs"] and module.params["backend"] == "https":
        module.warn("proxmox_api_validate_certs is false: the PVE API's TLS certificate is NOT verified")
    try:
        result = run(module)
    except (ApiFailure, DeviceError) as exc:
        module.fail_json(msg=str(exc))
    except Exception as exc:
        module.fail_json(msg=f"{type(exc).__name__}: {exc}", exception=traceback.format_exc())
    module.exit_json(**result)


if __name__ == "__main__":
    main()
