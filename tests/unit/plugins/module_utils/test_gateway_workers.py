"""Which workers a gateway fronts and where it reaches them, a server's gateways, the outage rule and the gateway's
capacity: the rules in plugins/module_utils/gateway_workers.py and provision/capacity.py, as the roles, the phase
fingerprint, verify and bench apply them."""

from __future__ import annotations

import pytest

from provision import capacity
from provision.paths import module_util, role_default

gw = module_util("gateway_workers")

DEFAULT_PORT = role_default("sglang", "sglang_port")


def worker(address: str, listen: str = "0.0.0.0", model: str = "", path: str = "/srv/models/qwen", **more) -> dict:
    values = {"sglang_host": listen, "sglang_port": DEFAULT_PORT, "sglang_served_model_name": model}
    return {**values, "sglang_model_path": path, "ansible_host": address, **more}


def test_every_worker_of_the_one_model_at_its_ansible_host():
    fronted = gw.workers("gw", {"b": worker("10.0.0.12"), "a": worker("10.0.0.11")})
    assert fronted == [
        {"host": "a", "url": "http://10.0.0.11:30000", "model": "/srv/models/qwen"},
        {"host": "b", "url": "http://10.0.0.12:30000", "model": "/srv/models/qwen"},
    ]


def test_a_server_on_one_address_is_reached_there_and_ipv6_in_brackets():
    fronted = gw.workers("gw", {"a": worker("ct-a.example", listen="192.0.2.7"), "b": worker("x", listen="fd00::2")})
    assert [w["url"] for w in fronted] == ["http://192.0.2.7:30000", "http://[fd00::2]:30000"]


def test_a_worker_url_set_on_the_host_wins():
    fronted = gw.workers("gw", {"a": worker("10.0.0.11", sglang_gateway_worker_url="https://a.example:8443/")})
    assert fronted[0]["url"] == "https://a.example:8443"


@pytest.mark.parametrize("listen", ["127.0.0.1", "::1", "localhost", "127.0.1.1"])
def test_a_server_on_loopback_is_refused_naming_it_and_the_variable(listen):
    with pytest.raises(gw.WorkerError) as caught:
        gw.workers("gw", {"a": worker("10.0.0.11", listen=listen)})
    assert str(caught.value) == (
        f"gateway gw: worker a listens on {listen} only (sglang_host): set sglang_host to 0.0.0.0 or an address the "
        "gateway reaches, or sglang_gateway_worker_url"
    )


def test_two_models_without_a_choice_are_refused_naming_each_hosts_model():
    with pytest.raises(gw.WorkerError) as caught:
        gw.workers("gw", {"a": worker("h1", model="m1"), "b": worker("h2", model="m2")})
    assert str(caught.value) == (
        "gateway gw: the containers serve 2 models (a: m1; b: m2): set sglang_gateway_model to one of them "
        "(one gateway per model)"
    )


def test_the_chosen_model_picks_its_workers_and_an_unknown_one_is_refused():
    both = {"a": worker("h1", model="m1"), "b": worker("h2", model="m2"), "c": worker("h3", model="m1")}
    assert [w["host"] for w in gw.workers("gw", both, "m1")] == ["a", "c"]
    with pytest.raises(gw.WorkerError, match="no host in gpu_containers serves sglang_gateway_model 'm3'"):
        gw.workers("gw", both, "m3")
    with pytest.raises(gw.WorkerError, match="group gpu_containers has no host"):
        gw.workers("gw", {})


def test_a_servers_gateways_are_those_of_its_model():
    candidates = {"a": worker("h1", model="m1"), "b": worker("h2", model="m2")}
    gateways = {"gw1": "m1", "gw2": "m2", "gw3": "m1"}
    assert gw.pairs(["a"], gateways, candidates) == [
        {"gateway": "gw1", "url": "http://h1:30000", "host": "a"},
        {"gateway": "gw3", "url": "http://h1:30000", "host": "a"},
    ]
    only_b = [{"gateway": "gw2", "url": "http://h2:30000", "host": "b"}]
    assert gw.pairs(["a", "b"], {"gw2": "m2"}, candidates) == only_b


def view(gateway: str, *workers: tuple[str, str, bool], running: bool = True) -> dict:
    listed = [{"url": url, "status": status, "healthy": healthy, "model": "m"} for url, status, healthy in workers]
    return {"item": gateway, "running": running, "workers": listed}


def test_an_outage_is_a_gateway_whose_every_healthy_worker_leaves():
    a, b = ("http://a:1", "ready", True), ("http://b:1", "ready", True)
    leaving_a = [{"host": "a", "gateway": "gw", "url": "http://a:1"}]
    assert gw.outage([view("gw", a, b)], leaving_a) == []
    assert gw.outage([view("gw", a, ("http://b:1", "not_ready", False))], leaving_a) == ["gateway gw (model m): a"]
    both = [*leaving_a, {"host": "b", "gateway": "gw", "url": "http://b:1"}]
    assert gw.outage([view("gw", a, b)], both) == ["gateway gw (model m): a, b"]  # a node holding both
    # nothing healthy to lose, or a gateway that does not run: no outage to refuse
    assert gw.outage([view("gw", ("http://a:1", "not_ready", False))], leaving_a) == []
    assert gw.outage([view("gw", a, running=False)], leaving_a) == []


def test_not_ready_names_each_worker_and_what_the_gateway_says():
    fronted = [
        {"host": "a", "url": "http://a:1"},
        {"host": "b", "url": "http://b:1"},
        {"host": "c", "url": "http://c:1"},
    ]
    listed = [{"url": "http://a:1/", "status": "ready", "healthy": True}, {"url": "http://b:1", "status": "pending"}]
    assert gw.not_ready(fronted, listed) == ["b http://b:1 (pending, healthy=None)", "c http://c:1 (not registered)"]


def test_a_gateway_capacity_is_its_workers_summed_in_the_same_terms():
    one = capacity.compute(
        {"max_total_num_tokens": 780820, "kv_cache_dtype": "bf16"}, {"data": [{"max_model_len": 262144}]}
    ).to_dict()
    fleet = capacity.fleet({"sglang-01": one, "sglang-02": one})
    assert fleet["summary"] == (
        "1,561,640 tokens over 2 worker(s) ≈ 5.96 × 262,144-token sessions ≈ 47.7 × 32K sessions"
    )
    partial = capacity.fleet({"sglang-01": one, "sglang-02": None})
    assert partial["unknown"] == ["sglang-02"] and partial["summary"].endswith("(no capacity for sglang-02)")
    assert capacity.fleet({"sglang-01": None})["summary"] == "unknown: no capacity for sglang-01"
