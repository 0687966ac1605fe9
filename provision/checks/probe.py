"""What `provision verify` reads on one host, in one command.

This file runs on the target, standard library only: playbooks/verify_probe.yml runs
`python3 -c <this source> <request>` through the inventory's own connection (ansible.builtin.raw). It
prints one JSON object, with the smoke question it was given (`question`), which the smoke check then
names. The checks in `test_host.py` and `test_container.py` then decide on the
controller from that object, so a host costs one command however many checks it has.

The request names the state directory (the host's provision_state_dir), the records to read in it
and, for a container, the smoke question; the API key is read on the target from the service's
root-only file and never leaves it, and `/server_info`'s `api_key` and `launch_command` (where
SGLang echoes `--api-key`) are dropped before printing. The journal tail of a failed unit has the
key replaced too: SGLang logs it at startup.
"""

import base64
import json
import os
import stat
import subprocess
import sys
import urllib.parse


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def run(argv):
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except OSError as e:
        return {"rc": 127, "stdout": "", "stderr": str(e)}
    return {"rc": p.returncode, "stdout": p.stdout, "stderr": p.stderr[-2000:]}


def read_bytes(path):
    """A file's bytes in base64 (an EFI variable), or None."""
    try:
        with open(path, "rb") as f:
            return base64.b64encode(f.read()).decode()
    except OSError:
        return None


def nvidia_nodes():
    nodes = {}
    for name in sorted(os.listdir("/dev")):
        if name.startswith("nvidia"):
            st = os.lstat("/dev/" + name)
            nodes[name] = {"char": stat.S_ISCHR(st.st_mode), "major": os.major(st.st_rdev) if st.st_rdev else None}
    return nodes


def gpu_groups():
    """{bus: its IOMMU group's type} for every NVIDIA GPU the driver sees (identity: not translated), as the
    gpu_p2p_node module reads them for the P2P decision."""
    groups = {}
    gpus = "/proc/driver/nvidia/gpus"
    for bus in sorted(os.listdir(gpus)) if os.path.isdir(gpus) else []:
        kind = read(f"/sys/bus/pci/devices/{bus.lower()}/iommu_group/type")
        if kind:
            groups[bus.lower()] = kind.strip()
    return groups


def pve_devices(conf_dir="/etc/pve/lxc"):
    """{vmid: {path: is a device node here}} for every devN of this node's CTs (the running section of
    <vmid>.conf): PVE's prestart hook refuses to start a CT whose devN path is missing on its node."""
    out = {}
    for name in sorted(os.listdir(conf_dir)) if os.path.isdir(conf_dir) else []:
        if not name.endswith(".conf"):
            continue
        for line in (read(os.path.join(conf_dir, name)) or "").splitlines():
            if line.startswith("["):  # [pve:pending] or a snapshot: not what the next start uses
                break
            key, _, value = line.partition(":")
            if key.startswith("dev") and key[3:].isdigit():
                path = value.strip().split(",")[0].replace("path=", "", 1)
                try:
                    mode = os.stat(path).st_mode
                    out.setdefault(name[:-5], {})[path] = stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                except OSError:
                    out.setdefault(name[:-5], {})[path] = False
    return out


def api_key(state):
    """The key from the service's root-only file (None without one)."""
    if not state.get("api_key_file"):
        return None
    try:
        with open(state["api_key_file"]) as f:
            return json.load(f)["api-key"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def scrub(text, secret, placeholder="<redacted>"):
    """text with the secret replaced as logs write it: literal, JSON- and repr-escaped, URL-quoted,
    base64 (the same spellings as roles/sglang/files/service_probe.py)."""
    if not secret:
        return text
    encoded = base64.b64encode(secret.encode()).decode()
    forms = {
        secret,
        json.dumps(secret)[1:-1],
        repr(secret)[1:-1],
        urllib.parse.quote(secret, safe=""),
        encoded,
        encoded.rstrip("="),
    }
    for form in sorted((f for f in forms if f), key=len, reverse=True):
        text = text.replace(form, placeholder)
    return text


def api_call(state, method, path, body=None, key=None):
    """One request to the server, at the URL the sglang role recorded for it (plugins/module_utils/local_url.py),
    with the service's key, or with `key` where one is given."""
    if not state.get("url"):
        return {"status": 0, "body": "the service record has no url"}
    headers = {"Content-Type": "application/json"}
    key = key or api_key(state)
    if key:
        headers["Authorization"] = "Bearer " + key
    # imported here: urllib.request (http.client, email) was most of the probe's imports on a slow host, and only a
    # container with a service record calls the server
    from urllib import error as url_error
    from urllib import request as url_request

    data = json.dumps(body).encode() if body is not None else None
    req = url_request.Request(state["url"] + path, data, headers, method=method)
    try:
        with url_request.urlopen(req, timeout=120) as r:
            return {"status": r.status, "body": r.read().decode()}
    except url_error.HTTPError as e:
        return {"status": e.code, "body": e.read().decode()[:2000]}
    except OSError as e:
        return {"status": 0, "body": str(e)}


def _scrub_server_info(answer):
    try:
        info = json.loads(answer["body"])
    except ValueError:
        return answer
    for key in ("api_key", "launch_command"):
        info.pop(key, None)
    return {"status": answer["status"], "body": json.dumps(info)}


def service(state, env_values=()):
    """The unit's state; of its main process, the argv flags, the environment's names, and the values of only
    the names asked for (the P2P-off environment): other values may be secrets."""
    name = state["service"]
    out = {
        "enabled": run(["systemctl", "is-enabled", name])["rc"] == 0,
        "active": run(["systemctl", "is-active", name])["rc"] == 0,
    }
    pid = run(["systemctl", "show", "-p", "MainPID", "--value", name])["stdout"].strip()
    out["main_pid"] = pid
    started = run(["systemctl", "show", "-p", "ActiveEnterTimestamp", "--value", "--timestamp=unix", name])
    out["started_at"] = started["stdout"].strip().lstrip("@") or None
    out["restarts"] = run(["systemctl", "show", "-p", "NRestarts", "--value", name])["stdout"].strip()
    if pid not in ("", "0"):
        environ = read(f"/proc/{pid}/environ") or ""
        env = dict(e.split("=", 1) for e in environ.split("\0") if "=" in e)
        out["env_names"], out["env_values"] = sorted(env), {n: env.get(n) for n in env_values}
        out["argv_flags"] = [a for a in (read(f"/proc/{pid}/cmdline") or "").split("\0") if a.startswith("--")]
    if not out["active"]:
        tail = run(["journalctl", "-u", name, "-n", "5", "--no-pager", "-o", "cat"])["stdout"]
        out["journal"] = scrub(tail, api_key(state))
    return out


def sglang(state, question, env_values=(), max_tokens=256):
    out = {"service": service(state, env_values)}
    if not state.get("url"):  # recorded by an older provision: the checks ask for the sglang phase again
        out["stale"] = "has no url (an older provision wrote it): run provision apply --tags sglang"
    out["health"] = api_call(state, "GET", "/health")
    out["server_info"] = _scrub_server_info(api_call(state, "GET", "/server_info"))
    out["models"] = api_call(state, "GET", "/v1/models")
    try:
        model = json.loads(out["models"]["body"])["data"][0]["id"]
    except (ValueError, KeyError, IndexError, TypeError):
        model = state.get("served_model_name")
    chat = {
        "model": model,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    out["chat"] = api_call(state, "POST", "/v1/chat/completions", chat)
    out["model_config"] = read(state["model_path"] + "/config.json") if state.get("model_path") else None
    out["weights_bytes"] = weights_total_size(state.get("model_path"))
    return out


def gateway(state, question, max_tokens=256):
    """SGLang's gateway, as the sglang_gateway role recorded it: its unit, readiness, its view of the workers (asked
    with the control-plane key from its file), and the smoke question asked through it with the workers' key."""
    keys = {}
    for name, path in (("api", state.get("secrets_file")), ("control", state.get("control_key_file"))):
        text = read(path) if path else None
        try:
            keys[name] = json.loads(text)["api_key"] if name == "api" else text.strip().split(":", 3)[-1]
        except (AttributeError, ValueError, KeyError, TypeError):
            keys[name] = None
    out = {"service": service(state)}
    if not out["service"]["active"]:
        out["service"]["journal"] = scrub(scrub(out["service"].get("journal", ""), keys["api"]), keys["control"])
    out["readiness"] = api_call(state, "GET", "/readiness")
    out["workers"] = api_call(state, "GET", "/workers", key=keys["control"])
    chat = {"messages": [{"role": "user", "content": question}], "max_tokens": max_tokens, "temperature": 0}
    chat["model"] = state.get("model")  # the gateway routes by it, and refuses a request without one
    out["chat"] = api_call(state, "POST", "/v1/chat/completions", chat, key=keys["api"])
    return out


def weights_total_size(model_path):
    """metadata.total_size of the checkpoint's model.safetensors.index.json (None without one): the
    capacity check moves each GPU's share of it when it predicts another tensor-parallel size."""
    text = read(model_path + "/model.safetensors.index.json") if model_path else None
    try:
        return int(json.loads(text)["metadata"]["total_size"]) if text else None
    except (ValueError, KeyError, TypeError):
        return None


def main(request):
    state_dir = request.get("state_dir", "")
    out = {
        "boot_id": (read("/proc/sys/kernel/random/boot_id") or "").strip(),
        "proc_cmdline": read("/proc/cmdline"),
        "state_dir": state_dir,
        "question": request.get("question"),
        "files": {name: read(os.path.join(state_dir, name)) for name in request["files"]},
        "binary_files": {path: read_bytes(path) for path in request.get("binary_files", [])},
        "nvidia_nodes": nvidia_nodes(),
        "nvidia_module": read("/proc/driver/nvidia/version"),
        "pve_devices": pve_devices(),
        "gpu_groups": gpu_groups(),
        "commands": {" ".join(argv): run(argv) for argv in request["commands"]},
    }
    state_text = out["files"].get(request.get("sglang_state", ""))
    if state_text:
        out["sglang"] = sglang(
            json.loads(state_text), request["question"], request.get("env_values", []), request.get("max_tokens", 256)
        )
    gateway_text = out["files"].get(request.get("gateway_state", ""))
    if gateway_text:
        out["gateway"] = gateway(json.loads(gateway_text), request["question"], request.get("max_tokens", 256))
    return out


if __name__ == "__main__":
    print(json.dumps(main(json.loads(base64.b64decode(sys.argv[1])))))
