"""deploy/llm-d: the manifests name only what nanoserve serves. Every metric the EPP's
core-metrics-extractor reads is in /metrics (with its labels), every route it or the probes
call answers, the pods carry the labels llm-d selects on, and the Deployment's command line
parses into the settings it means (KV events on the ports the pool discovery dials)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from nanoserve.api.cli import build_parser, serve_settings
from tests.api.fake_engine import FakeEngine
from tests.api.fake_server import fake_server

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "llm-d"


def documents(name: str) -> list[dict[str, Any]]:
    return list(yaml.safe_load_all((DEPLOY / name).read_text()))


def by_kind(name: str, kind: str) -> dict[str, Any]:
    [doc] = [d for d in documents(name) if d["kind"] == kind]
    return doc


def plugin(config: dict[str, Any], kind: str) -> dict[str, Any]:
    [found] = [p for p in config["plugins"] if p["type"] == kind]
    return found.get("parameters", {})


def container() -> dict[str, Any]:
    deployment = by_kind("nanoserve.yaml", "Deployment")
    [found] = deployment["spec"]["template"]["spec"]["containers"]
    return found


def test_the_epp_config_is_llm_d_s() -> None:
    config = by_kind("epp-config.yaml", "EndpointPickerConfig")
    assert config["apiVersion"] == "llm-d.ai/v1alpha1"
    named = {p["type"] for p in config["plugins"]}
    referenced = {
        ref["pluginRef"] for profile in config["schedulingProfiles"] for ref in profile["plugins"]
    } | {
        ref["pluginRef"]
        for source in config["dataLayer"]["sources"]
        for ref in [source, *source.get("extractors", [])]
    }
    assert referenced <= named


@pytest.mark.anyio
async def test_every_metric_the_extractor_reads_is_served() -> None:
    config = by_kind("epp-config.yaml", "EndpointPickerConfig")
    [engine] = plugin(config, "core-metrics-extractor")["engineConfigs"]
    assert engine["name"] == "nanoserve"
    names = [v for k, v in engine.items() if k.endswith("Spec")]
    async with fake_server(FakeEngine()) as (client, _):
        text = (await client.get("/metrics")).text
    served = set(re.findall(r"^(nanoserve:[a-z_]+)", text, re.MULTILINE))
    assert names and set(names) <= served
    info = re.search(r"^nanoserve:cache_config_info\{(.*)\} 1\.0$", text, re.MULTILINE)
    assert info is not None
    labels = dict(re.findall(r'(\w+)="([^"]*)"', info.group(1)))
    # the extractor's two labels, beside vLLM's others (cache_dtype)
    assert {engine["cacheBlockSizeLabelName"], engine["cacheNumBlocksLabelName"]} <= set(labels)
    assert set(labels) == {"block_size", "num_gpu_blocks", "cache_dtype"}


@pytest.mark.anyio
async def test_every_route_named_is_served() -> None:
    config = by_kind("epp-config.yaml", "EndpointPickerConfig")
    producer = plugin(config, "token-producer")
    probes = [container()[p]["httpGet"]["path"] for p in ("readinessProbe", "livenessProbe")]
    chat = {"messages": [{"role": "user", "content": "Hi"}]}
    async with fake_server(FakeEngine()) as (client, _):
        # the token-producer posts these two, as llm-d's vLLM tokenizer does
        completion = await client.post("/v1/completions/render", json={"prompt": "Hi"})
        rendered = await client.post("/v1/chat/completions/render", json=chat)
        health = [await client.get(path) for path in probes]
    assert producer["vllm"]["url"] == "http://nanoserve:8000"
    assert completion.status_code == 200 and completion.json()[0]["token_ids"]
    assert rendered.status_code == 200 and rendered.json()["token_ids"]
    assert all(r.status_code == 200 for r in health)


def test_the_pods_and_the_pool_agree() -> None:
    deployment = by_kind("nanoserve.yaml", "Deployment")
    pool = by_kind("nanoserve.yaml", "InferencePool")
    service = by_kind("nanoserve.yaml", "Service")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels["llm-d.ai/inference-serving"] == "true"
    assert labels["llm-d.ai/engine-type"] == "nanoserve"
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert pool["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    ports = {p["name"]: p["containerPort"] for p in container()["ports"]}
    assert [p["number"] for p in pool["spec"]["targetPorts"]] == [ports["http"]]
    config = by_kind("epp-config.yaml", "EndpointPickerConfig")
    discovery = plugin(config, "precise-prefix-cache-producer")["kvEventsConfig"]
    selector = discovery["podDiscoveryConfig"]["podLabelSelector"]
    key, value = selector.split("=")
    assert labels[key] == value
    assert discovery["podDiscoveryConfig"]["socketPort"] == ports["kv-events"]


def test_the_command_line_parses_into_what_it_means() -> None:
    args = [a.replace("$(POD_IP)", "10.0.0.7") for a in container()["args"]]
    settings = serve_settings(build_parser().parse_args(args))
    events = settings.kv_events
    assert events.enabled and events.publisher == "zmq" and events.binds
    assert events.endpoint == "tcp://*:5557" and events.replay_endpoint == "tcp://*:5558"
    assert events.topic == "kv@10.0.0.7:8000@SmolLM2-135M-Instruct"
    assert events.topic.split("@")[2] == settings.engine.served_model_name
    config = by_kind("epp-config.yaml", "EndpointPickerConfig")
    assert plugin(config, "token-producer")["modelName"] == settings.engine.served_model_name
    block = plugin(config, "precise-prefix-cache-producer")["tokenProcessorConfig"]["blockSize"]
    assert settings.engine.block_size == block
