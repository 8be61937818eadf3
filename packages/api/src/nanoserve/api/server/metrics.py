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

from nanoserve.api.kv_events.publisher import KVEventPublisher
from nanoserve.api.server.engine_client import EngineClient
from nanoserve.runtime import RecordingStats, RequestTimes, SpecCounts

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
TOKEN_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
PREFIX = "nanoserve:"
FINISH_REASONS = ("stop", "length", "abort")
# A decode mode that records nothing still exports the graph series, as zeros: a dashboard's
# query must not vanish with the mode.
NO_RECORDINGS = RecordingStats(
    backend="none",
    recordings=0,
    cold_recordings=0,
    replays=0,
    eager_fallback_steps=0,
    shapes=0,
    logits_buffer_bytes=0,
    needed_bytes=0,
    pool_bytes=0,
    pool_sharing_ratio=0.0,
)


def _speculation_metrics(counts: SpecCounts | None) -> Iterator[Metric]:
    """vLLM's spec_decode series; zeros while speculation is off, so queries never vanish."""
    yield _counter(
        "spec_decode_num_drafts",
        "Verify rows (a decoding row with a draft).",
        _of(counts, "drafts"),
    )
    yield _counter(
        "spec_decode_num_draft_tokens", "Draft tokens verified.", _of(counts, "draft_tokens")
    )
    yield _counter(
        "spec_decode_num_accepted_tokens",
        "Draft tokens accepted (each one the target's own token).",
        _of(counts, "accepted_tokens"),
    )
    yield _gauge(
        "spec_decode_acceptance_rate",
        "Accepted draft tokens / draft tokens, since the start.",
        counts.acceptance_rate if counts is not None else 0.0,
    )
    yield _counter(
        "spec_decode_verify_steps",
        "Steps that carried a draft (run eagerly, never from a recording).",
        _of(counts, "verify_steps"),
    )
    per_position = CounterMetricFamily(
        PREFIX + "spec_decode_num_accepted_tokens_per_pos",
        "Accepted draft tokens by their position in the draft.",
        labels=["position"],
    )
    for position, accepted in enumerate(counts.accepted_per_position if counts else ()):
        per_position.add_metric([str(position)], accepted)
    yield per_position


def _of(counts: SpecCounts | None, name: str) -> int:
    return int(getattr(counts, name)) if counts is not None else 0


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(PREFIX + name, doc, value=value)


class _EngineCollector(Collector):
    """Reads one `EngineStatus` per scrape (and the requests not yet handed to the engine)."""

    def __init__(self, engine: Callable[[], EngineClient | None]) -> None:
        self._engine = engine

    def collect(self) -> Iterator[Metric]:
        engine = self._engine()
        if engine is None:
            return
        status = engine.status()
        yield _gauge(
            "num_requests_running", "Requests whose sequences are scheduled.", status.running
        )
        yield _gauge(
            "num_requests_waiting",
            "Requests waiting to be admitted (TotalQueuedRequests).",
            status.waiting_requests + engine.num_pending,
        )
        yield _gauge(
            "kv_cache_usage_perc",
            "Fraction of K/V blocks held by sequences, 0..1 (KVCacheUtilization).",
            status.kv_cache_usage,
        )
        yield _gauge("kv_cache_blocks_total", "Blocks in the K/V pool.", status.pool.num_blocks)
        # vLLM's cache_config_info, as llm-d's core-metrics-extractor reads it (its labels)
        info = GaugeMetricFamily(
            PREFIX + "cache_config_info",
            "The K/V cache's geometry, in the labels.",
            labels=["block_size", "num_gpu_blocks", "cache_dtype"],
        )
        pool = status.pool
        info.add_metric([str(pool.block_size), str(pool.num_blocks), str(pool.kv_cache_dtype)], 1.0)
        yield info
        prefix_cache = status.prefix_cache
        yield _gauge(
            "prefix_cache_hit_rate",
            "Prompt tokens served from the prefix cache / tokens queried.",
            prefix_cache.hit_rate,
        )
        yield _counter("prompt_tokens", "Prompt tokens admitted.", status.prompt_tokens)
        yield _counter("generation_tokens", "Tokens generated.", status.generation_tokens)
        yield _counter(
            "pooling_requests",
            "Pooling requests answered (embeddings, scores).",
            status.pooling_requests,
        )
        yield _counter(
            "pooling_prompt_tokens", "Prompt tokens of pooling requests.", status.pooling_tokens
        )
        yield _counter(
            "prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache.",
            prefix_cache.queried_tokens,
        )
        yield _counter(
            "prefix_cache_hits", "Prompt tokens found in the prefix cache.", prefix_cache.hit_tokens
        )
        finished = CounterMetricFamily(
            PREFIX + "request_success",
            "Finished requests by finish reason.",
            labels=["finished_reason"],
        )
        for reason in FINISH_REASONS:
            finished.add_metric([reason], status.finished.get(reason, 0))
        yield finished
        yield from _recording_metrics(status.recordings or NO_RECORDINGS)
        yield from _speculation_metrics(status.speculation)


def _recording_metrics(stats: RecordingStats) -> Iterator[Metric]:
    yield _counter("graph_recordings", "Decode steps recorded.", stats.recordings)
    yield _counter(
        "graph_cold_recordings",
        "Recordings made while requests were in flight (0 on a warmed server).",
        stats.cold_recordings,
    )
    yield _counter("graph_replays", "Recorded decode steps replayed.", stats.replays)
    yield _counter(
        "decode_eager_fallback_steps",
        "Decode steps of a shape outside the warm list, run eagerly (never recorded live).",
        stats.eager_fallback_steps,
    )
    yield _gauge(
        "graph_needed_bytes",
        "Bytes the recordings held now need at their peaks, summed.",
        stats.needed_bytes,
    )
    yield _gauge(
        "graph_pool_bytes",
        "Bytes of the recordings' shared memory pool (CUDA), discarded probes included.",
        stats.pool_bytes,
    )
    yield _gauge(
        "graph_pool_sharing_ratio",
        "Sum of recordings' needs / shared pool bytes.",
        stats.pool_sharing_ratio,
    )


class _KVEventsCollector(Collector):
    """The KV-event publisher's counts, when events are on (--kv-events-config)."""

    def __init__(self, publisher: Callable[[], KVEventPublisher | None]) -> None:
        self._publisher = publisher

    def collect(self) -> Iterator[Metric]:
        publisher = self._publisher()
        if publisher is None:
            return
        batches, events, dropped_batches, dropped_events = publisher.counts()
        yield _counter("kv_events_batches_published", "KV-event batches sent.", batches)
        yield _counter("kv_events_published", "KV-cache events sent.", events)
        yield _counter(
            "kv_events_batches_dropped",
            "KV-event batches dropped because the publisher's queue was full.",
            dropped_batches,
        )
        yield _counter(
            "kv_events_dropped", "KV-cache events in the dropped batches.", dropped_events
        )
        yield _gauge(
            "kv_events_queue_depth", "Batches waiting for the publisher.", publisher.queue.qsize()
        )
        yield _gauge(
            "kv_events_publisher_up",
            "1 while the publisher thread runs; 0 once it has failed (its batches then drop).",
            float(publisher.alive),
        )


class ServerMetrics:
    def __init__(
        self,
        engine: Callable[[], EngineClient | None],
        kv_events: Callable[[], KVEventPublisher | None] = lambda: None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_EngineCollector(engine))
        self.registry.register(_KVEventsCollector(kv_events))
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
