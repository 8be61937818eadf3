"""/metrics: Prometheus text from one registry per app.

Counters and gauges are read from the engine at scrape time (a custom collector), so they can
never drift from it; latency histograms are fed by each request's stream when it ends. The two
gauges the Gateway API Inference Extension's endpoint picker reads are
`nanoserve:num_requests_waiting` (TotalQueuedRequests) and `nanoserve:kv_cache_usage_perc`
(KVCacheUtilization, a fraction 0..1).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from nanoserve.runtime.async_engine import AsyncEngine, RequestTimes

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
TOKEN_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class _EngineCollector(Collector):
    def __init__(self, engine: Callable[[], AsyncEngine | None]) -> None:
        self._engine = engine

    def collect(self) -> Iterator[Metric]:
        async_engine = self._engine()
        if async_engine is None:
            return
        engine = async_engine.engine
        stats = engine.stats()
        prefix = "nanoserve:"

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(prefix + name, doc, value=value)

        yield gauge(
            "num_requests_running", "Requests whose sequences are scheduled.", stats["running"]
        )
        yield gauge(
            "num_requests_waiting",
            "Requests waiting to be admitted (TotalQueuedRequests).",
            stats["waiting_requests"] + async_engine.num_pending,
        )
        yield gauge(
            "kv_cache_usage_perc",
            "Fraction of K/V blocks held by sequences, 0..1 (KVCacheUtilization).",
            stats["kv_cache_usage"],
        )
        yield gauge("kv_cache_blocks_total", "Blocks in the K/V pool.", stats["kv_blocks_total"])
        yield gauge(
            "prefix_cache_hit_rate",
            "Prompt tokens served from the prefix cache / tokens queried.",
            stats["prefix_cache_hit_rate"],
        )
        for name, key, doc in (
            ("prompt_tokens", "prompt_tokens", "Prompt tokens admitted."),
            ("generation_tokens", "generation_tokens", "Tokens generated."),
            (
                "prefix_cache_queries",
                "prefix_cache_queried_tokens",
                "Prompt tokens looked up in the prefix cache.",
            ),
            (
                "prefix_cache_hits",
                "prefix_cache_hit_tokens",
                "Prompt tokens found in the prefix cache.",
            ),
        ):
            yield CounterMetricFamily(prefix + name, doc, value=stats[key])
        finished = CounterMetricFamily(
            prefix + "request_success",
            "Finished requests by finish reason.",
            labels=["finished_reason"],
        )
        for reason in ("stop", "length", "abort"):
            finished.add_metric([reason], stats["finished"].get(reason, 0))
        yield finished
        graphs = stats["graphs"] or {}
        yield CounterMetricFamily(
            prefix + "graph_recordings", "Decode steps recorded.", value=graphs.get("recordings", 0)
        )
        yield CounterMetricFamily(
            prefix + "graph_cold_recordings",
            "Recordings made while requests were in flight (0 on a warmed server).",
            value=graphs.get("cold_recordings", 0),
        )
        yield CounterMetricFamily(
            prefix + "graph_replays",
            "Recorded decode steps replayed.",
            value=graphs.get("replays", 0),
        )
        yield CounterMetricFamily(
            prefix + "decode_eager_fallback_steps",
            "Decode steps of a shape outside the warm list, run eagerly (never recorded live).",
            value=graphs.get("eager_fallback_steps", 0),
        )
        yield gauge(
            "graph_pool_bytes",
            "Bytes of the recordings' shared memory pool (CUDA).",
            graphs.get("pool_bytes", 0),
        )
        yield gauge(
            "graph_pool_sharing_ratio",
            "Sum of recordings' needs / shared pool bytes.",
            graphs.get("pool_sharing_ratio", 0.0),
        )


class ServerMetrics:
    def __init__(self, engine: Callable[[], AsyncEngine | None]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_EngineCollector(engine))
        self.ttft = Histogram(
            "nanoserve:time_to_first_token_seconds",
            "Time to first token.",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.itl = Histogram(
            "nanoserve:inter_token_latency_seconds",
            "Time between consecutive streamed tokens.",
            buckets=TOKEN_BUCKETS,
            registry=self.registry,
        )
        self.e2e = Histogram(
            "nanoserve:e2e_request_latency_seconds",
            "Arrival to last token.",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )

    def observe(self, times: RequestTimes) -> None:
        if times.ttft is not None:
            self.ttft.observe(times.ttft)
        for gap in times.inter_token():
            self.itl.observe(gap)
        if times.token_times:
            self.e2e.observe(times.token_times[-1] - times.arrival)

    def render(self) -> bytes:
        return generate_latest(self.registry)
