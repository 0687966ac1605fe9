"""Which containers a gateway fronts, and the URL it reaches each at: the one rule for the gateway role, the phase
fingerprint of its inputs, provision verify and the rolling restarts.

A gateway fronts one model. Its workers are the hosts of gpu_containers that serve it: the model's served name is
`sglang_served_model_name`, or `sglang_model_path` where that is empty (SGLang's own rule: the path is the name
/v1/models reports). `sglang_gateway_model` names the model; empty, every worker must serve the same one. A worker is
reached at `sglang_gateway_worker_url` where it sets one, else at http://<address>:<sglang_port>, the address being
`sglang_host` where that names one address, else the host's `ansible_host` (a server that listens on every address
is reached where Ansible reaches its host). A server that listens on loopback only cannot be reached, and is refused.
"""

from __future__ import annotations

import ipaddress

# the sglang role's variables a worker is read by; values missing from a host come from the role's defaults
WORKER_VARS = ("sglang_host", "sglang_port", "sglang_served_model_name", "sglang_model_path")
ANY_ADDRESS = ("0.0.0.0", "::", "")


class WorkerError(ValueError):
    """One line naming the gateway, the worker and the variable."""


def served_name(values: dict) -> str:
    return str(values.get("sglang_served_model_name") or values.get("sglang_model_path") or "")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def worker_url(name: str, values: dict, gateway: str) -> str:
    """The URL the gateway reaches a worker at (module docstring)."""
    if values.get("sglang_gateway_worker_url"):
        return str(values["sglang_gateway_worker_url"]).rstrip("/")
    listen = str(values.get("sglang_host") or "")
    if _is_loopback(listen):
        raise WorkerError(
            f"gateway {gateway}: worker {name} listens on {listen} only (sglang_host): set sglang_host to 0.0.0.0 or "
            "an address the gateway reaches, or sglang_gateway_worker_url"
        )
    address = str(values.get("ansible_host") or name) if listen in ANY_ADDRESS else listen
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{int(values['sglang_port'])}"


def workers(gateway: str, candidates: dict[str, dict], model: str = "") -> list[dict]:
    """[{host, url, model}] of the workers `gateway` fronts, by host name; `candidates` maps each gpu_containers host
    to its values of WORKER_VARS (the role's defaults filled in), `ansible_host` and `sglang_gateway_worker_url`."""
    if not candidates:
        raise WorkerError(f"gateway {gateway}: group gpu_containers has no host to send requests to")
    served = {name: served_name(values) for name, values in sorted(candidates.items())}
    if not model:
        models = sorted(set(served.values()))
        if len(models) > 1:
            listed = "; ".join(f"{name}: {m}" for name, m in served.items())
            raise WorkerError(
                f"gateway {gateway}: the containers serve {len(models)} models ({listed}): set sglang_gateway_model "
                "to one of them (one gateway per model)"
            )
        model = models[0]
    chosen = [name for name, m in served.items() if m == model]
    if not chosen:
        raise WorkerError(
            f"gateway {gateway}: no host in gpu_containers serves sglang_gateway_model {model!r} "
            f"(served: {', '.join(sorted(set(served.values())))})"
        )
    return [{"host": name, "url": worker_url(name, candidates[name], gateway), "model": model} for name in chosen]


def not_ready(fronted: list[dict], listed: list[dict]) -> list[str]:
    """'host url (what the gateway says)' for each fronted worker the gateway's list does not show ready and healthy."""
    by_url = {str(w.get("url", "")).rstrip("/"): w for w in listed}
    found = []
    for worker in fronted:
        seen = by_url.get(worker["url"])
        if seen is None:
            found.append(f"{worker['host']} {worker['url']} (not registered)")
        elif seen.get("status") != "ready" or not seen.get("healthy"):
            found.append(f"{worker['host']} {worker['url']} ({seen.get('status')}, healthy={seen.get('healthy')})")
    return found


def gateways_of(worker: str, gateways: dict[str, str], candidates: dict[str, dict]) -> list[dict]:
    """[{gateway, url}]: each gateway (name -> its sglang_gateway_model) that fronts `worker`, with the URL it
    reaches the worker at."""
    found = []
    for gateway, model in sorted(gateways.items()):
        mine = [w for w in workers(gateway, candidates, model) if w["host"] == worker]
        found += [{"gateway": gateway, "url": w["url"]} for w in mine]
    return found


def _views(results: list[dict]) -> list[tuple[str, str, list[dict]]]:
    """(gateway, this worker's URL there, its workers) of each running gateway, from sglang_gateway_info's results
    registered over the worker's gateways (a loop's `results`, each with its `item`: {gateway, url})."""
    return [
        (r["item"]["gateway"], r["item"]["url"], r.get("workers") or [])
        for r in results
        if r.get("running") and isinstance(r.get("item"), dict)
    ]


def listed(results: list[dict]) -> bool:
    """Whether a running gateway lists this worker: its restart then goes through the gateway."""
    return any(any(w.get("url") == url for w in seen) for _gateway, url, seen in _views(results))


def pairs(leaving: list[str], gateways: dict[str, str], candidates: dict[str, dict]) -> list[dict]:
    """[{host, gateway, url}]: each of the `leaving` workers with each gateway that fronts it (gateways_of)."""
    return [dict(pair, host=worker) for worker in leaving for pair in gateways_of(worker, gateways, candidates)]


def outage(results: list[dict], leaving: list[dict]) -> list[str]:
    """'gateway G (model M): h1, h2' for each running gateway (sglang_gateway_info's results, looped over gateway
    names) whose ready and healthy workers are all among the `leaving` pairs, where at least one of them is: taking
    those out leaves the gateway nothing to send requests to."""
    found = []
    for r in results:
        if not r.get("running"):
            continue
        gateway = r.get("item")
        going = {p["url"]: p["host"] for p in leaving if p["gateway"] == gateway}
        healthy = [w for w in r.get("workers") or [] if w.get("status") == "ready" and w.get("healthy")]
        if healthy and all(w.get("url") in going for w in healthy):
            hosts = sorted(going[w["url"]] for w in healthy)
            found.append(f"gateway {gateway} (model {healthy[0].get('model')}): {', '.join(hosts)}")
    return found
