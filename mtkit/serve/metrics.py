"""Prometheus metrics of a server (``GET /metrics``), in a registry of its own."""

from __future__ import annotations

from mtkit.serve.batcher import BatchStats

# Request latency buckets, seconds: a short sentence on CPU takes milliseconds, a full request seconds.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class Metrics:
    """The counters, gauges and histograms; ``render()`` gives the text exposition format."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("mtkit_serve_requests", "HTTP requests answered.", ["endpoint", "status"], registry=r)
        self.latency = Histogram("mtkit_serve_request_seconds", "Time from request to answer.", ["endpoint"],
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.sentences = Counter("mtkit_serve_sentences", "Lines translated.", ["model"], registry=r)
        self.src_tokens = Counter("mtkit_serve_source_tokens", "Source tokens translated (with EOS).", ["model"],
                                  registry=r)
        self.tgt_tokens = Counter("mtkit_serve_target_tokens", "Target tokens produced (best hypotheses, with EOS).",
                                  ["model"], registry=r)
        self.batch = Histogram("mtkit_serve_batch_sentences", "Lines decoded together (merged requests).", ["model"],
                               buckets=BATCH_BUCKETS, registry=r)
        self.decode_seconds = Histogram("mtkit_serve_decode_seconds", "Time of one decoding call.", ["model"],
                                        buckets=LATENCY_BUCKETS, registry=r)
        self.queue = Gauge("mtkit_serve_queue_length", "Requests waiting for their model's decoding thread.",
                           ["model"], registry=r)
        self.in_flight = Gauge("mtkit_serve_requests_in_flight", "HTTP requests received and not yet answered.",
                               registry=r)
        self.rejected = Counter("mtkit_serve_rejected", "Requests refused because the queue was full.", ["model"],
                                registry=r)

    def batch_done(self, stats: BatchStats) -> None:
        self.sentences.labels(stats.model).inc(stats.sentences)
        self.src_tokens.labels(stats.model).inc(stats.src_tokens)
        self.tgt_tokens.labels(stats.model).inc(stats.tgt_tokens)
        self.batch.labels(stats.model).observe(stats.sentences)
        self.decode_seconds.labels(stats.model).observe(stats.seconds)

    def render(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST
