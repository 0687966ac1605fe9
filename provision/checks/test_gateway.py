"""Checks for SGLang's gateway (group sglang_gateways): its service, every worker registered and healthy in its view,
and a request answered through it. Each decides from the gateway's probe (conftest.py), read once per run."""

from __future__ import annotations

import json

import pytest

from provision.checks.support import GATEWAY_STATE, SMOKE_EXPECT, smoke_failure, smoke_question


def _gateway(target) -> dict:
    found = target.data.get("gateway")
    assert found is not None, f"{target.path(GATEWAY_STATE)} is missing: run provision apply --tags gateway"
    return found


def test_gateway_enabled(host, target):
    """The gateway's unit starts at boot (testinfra: host.service)."""
    _gateway(target)
    name = target.json(GATEWAY_STATE)["service"]
    assert host.service(name).is_enabled, f"the {name} unit is not enabled: it will not come back after a reboot"


def test_gateway_active(target):
    """The gateway's unit is running."""
    unit = _gateway(target)["service"]
    if not unit["active"]:
        tail = unit.get("journal", "").splitlines()[-5:]
        pytest.fail(f"the gateway's unit is not running; journal: {' | '.join(tail)}")


def test_gateway_listening(host, target):
    """The gateway listens on its configured address and port (testinfra: host.socket; a wildcard address counts)."""
    _gateway(target)
    state = target.json(GATEWAY_STATE)
    where = f"[{state['host']}]:{state['port']}" if ":" in state["host"] else f"{state['host']}:{state['port']}"
    assert host.socket(f"tcp://{state['host']}:{state['port']}").is_listening, f"nothing listens on {where}"


def test_every_worker_registered_and_healthy(target, record_property):
    """The gateway lists every worker the inventory gives it (as recorded at apply), each ready and healthy, and
    nothing else."""
    state = target.json(GATEWAY_STATE)
    answer = _gateway(target)["workers"]
    assert answer["status"] == 200, f"GET /workers answered {answer['status']}: {answer['body'][:200]}"
    listed = {str(w["url"]).rstrip("/"): w for w in json.loads(answer["body"]).get("workers", [])}
    wanted = {w["url"]: w["host"] for w in state["workers"]}
    problems = [f"{host} {url} is not registered" for url, host in wanted.items() if url not in listed]
    problems += [
        f"{wanted[url]} {url} is {w.get('status')}, healthy={w.get('is_healthy')}"
        for url, w in listed.items()
        if url in wanted and not (w.get("status") == "ready" and w.get("is_healthy"))
    ]
    problems += [f"{url} is registered but not in the inventory's workers" for url in listed if url not in wanted]
    assert not problems, "; ".join(problems) + ": run provision apply"
    record_property("note", f"{len(wanted)} worker(s) ready and healthy: {', '.join(sorted(wanted.values()))}")


def test_answers_through_the_gateway(target):
    """A chat completion sent through the gateway is answered, with the smoke question's answer."""
    answer = _gateway(target)["chat"]
    question = target.data.get("question") or smoke_question(target.vars)  # what the probe asked, rendered once
    expect = str(target.vars.get("verify_smoke_expect") or SMOKE_EXPECT)
    failure = smoke_failure(answer["status"], answer["body"], question, expect)
    assert failure is None, f"through the gateway: {failure}"
