//! Prometheus metrics: one process-wide set, recorded where things happen and encoded in the
//! text format for `GET /metrics`. Gauges about the fleet (peer states, replication lag, model
//! speed) are filled from the live tables at scrape time, so they are never stale.

use std::sync::OnceLock;

use prometheus_client::{
    encoding::text::encode,
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

type Labels = Vec<(String, String)>;
type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;
type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;

/// The node's metrics.
#[derive(Debug)]
pub(crate) struct Metrics {
    registry: Registry,
    /// Tasks that ended, by status (`completed`, `failed`).
    pub tasks: Family<Labels, Counter>,
    /// Where tasks and front-door chats were placed: `kind` task|chat, `placement`
    /// local|remote|nowhere.
    pub routing: Family<Labels, Counter>,
    /// Front-door requests by path and status code.
    pub http_requests: Family<Labels, Counter>,
    /// Model call latency by model, seconds.
    pub model_latency: HistogramFamily,
    /// Peers by state (set at scrape).
    pub peers: Family<Labels, Gauge>,
    /// Records behind each peer (set at scrape).
    pub lag_records: Family<Labels, Gauge>,
    /// Seconds behind each peer (set at scrape).
    pub lag_seconds: Family<Labels, FloatGauge>,
    /// Decode speed per local model, tokens/s (set at scrape).
    pub tokens_per_second: Family<Labels, FloatGauge>,
    /// Tokens the embedded models of this node generated, by `model`, counted as each is
    /// sampled: how far a generation got while it runs (a chat whose reader stopped reading
    /// stops adding to it). Only the engine counts; a build without it keeps the series empty.
    #[cfg_attr(not(feature = "embedded"), allow(dead_code))]
    pub model_tokens_generated: Family<Labels, Counter>,
    /// Join-token redemptions on this issuer, by outcome (`issued`, or why one was refused).
    pub join_redemptions: Family<Labels, Counter>,
    /// Replicated records refused before they were applied, by `reason`: `signature` (does not
    /// verify), `certificate` (no certificate of the mesh vouches for the origin), `expired`
    /// (written after the origin's certificate expired), `revoked`, `revocation`,
    /// `namespaces`, `writer` (a system namespace its origin may not write), `fenced` (a task
    /// journal's step from an executor superseded by a higher epoch).
    pub memory_records_refused: Family<Labels, Counter>,
    /// Decisions on approvals of this node that it ignored (the call goes on waiting), by
    /// `reason`: `unsigned`, `malformed`, `certificate`, `revoked`, `signature` (the decider's
    /// signed statement does not verify), `mismatch` (it is about another call).
    pub approval_decisions_ignored: Family<Labels, Counter>,
    /// Open connections by `listener` (`grpc`, `http`) and `state` (`open`: all of them;
    /// `handshaking`: gRPC TLS handshakes in progress).
    pub connections: Family<Labels, Gauge>,
    /// Connections closed at accept because a cap was reached, by `listener` and `reason`
    /// (`max_connections`, `max_handshakes`).
    pub connections_refused: Family<Labels, Counter>,
    /// Connections closed because they did not finish their TLS handshake (`phase=handshake`)
    /// or send a request's headers (`phase=headers`) in time, by `listener`.
    pub connections_timed_out: Family<Labels, Counter>,
    /// mDNS adverts that started no dial, by `reason`: `already_dialing` (the claimed id is being
    /// dialed), `cap` (`discovery.max_advert_dials` pending), `failing_address` (every address is
    /// held back after failing), `queue_full` (membership's event queue was full).
    pub adverts_dropped: Family<Labels, Counter>,
    /// Membership (SWIM) datagrams dropped before they could change anything, by reason.
    pub swim_dropped: Family<Labels, Counter>,
    /// Membership datagrams whose certificate and signature were checked (what the screen let
    /// through; a stale, replayed or malformed datagram never gets that far).
    pub swim_signature_checks: Counter,
    /// Front-door requests admitted on this node, by `key` (its name) and `model`.
    pub http_key_requests: Family<Labels, Counter>,
    /// Tokens the models reported for front-door requests on this node, by `key`, `model` and
    /// `kind` (`prompt`, `completion`).
    pub http_key_tokens: Family<Labels, Counter>,
    /// Front-door requests refused by a key's policy on this node, by `key` and `limit`
    /// (`model`, or the limit's setting name).
    pub http_key_refusals: Family<Labels, Counter>,
    /// Steps this node appended to the journals of the tasks it runs.
    pub journal_appends: Counter,
    /// Bytes (values as stored) of those steps.
    pub journal_bytes: Counter,
    /// How long one append took (written and flushed here), seconds.
    pub journal_append_seconds: Histogram,
    /// Tasks this node resumed elsewhere from their journal after the node running them was
    /// lost.
    pub tasks_resumed: Counter,
    /// Chats this node placed on peers that went on on the next peer after the one serving
    /// them failed, by `kind`: `whole` (the next was asked the whole request) or `mid_stream`
    /// (it continued the text already streamed).
    pub chat_failovers: Family<Labels, Counter>,
}

fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 14))
}

/// Label set from pairs.
pub(crate) fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

impl Metrics {
    fn new() -> Self {
        let mut registry = Registry::with_prefix("agentmesh");
        let tasks = Family::default();
        registry.register("tasks", "Tasks that ended, by status", tasks.clone());
        let routing = Family::default();
        registry.register(
            "routing_decisions",
            "Where tasks (kind=task) and front-door chats (kind=chat) were placed",
            routing.clone(),
        );
        let http_requests = Family::default();
        registry.register(
            "http_requests",
            "Front-door requests by path and status",
            http_requests.clone(),
        );
        let model_latency = HistogramFamily::new_with_constructor(latency_histogram);
        registry.register(
            "model_latency_seconds",
            "Latency of one model call, by model",
            model_latency.clone(),
        );
        let peers = Family::default();
        registry.register("peers", "Known peers by state", peers.clone());
        let lag_records = Family::default();
        registry.register(
            "replication_lag_records",
            "Memory records a peer wrote that this node does not hold yet",
            lag_records.clone(),
        );
        let lag_seconds = Family::default();
        registry.register(
            "replication_lag_seconds",
            "How long this node has been behind a peer's memory writes",
            lag_seconds.clone(),
        );
        let tokens_per_second = Family::default();
        registry.register(
            "model_tokens_per_second",
            "Measured decode speed of each model on this node",
            tokens_per_second.clone(),
        );
        let model_tokens_generated = Family::default();
        registry.register(
            "model_tokens_generated",
            "Tokens the embedded models of this node generated, by model, counted as each is sampled",
            model_tokens_generated.clone(),
        );
        let join_redemptions = Family::default();
        registry.register(
            "join_redemptions",
            "Join-token redemptions on this issuer: outcome=issued, or why one was refused (malformed, forged, expired, used_up, busy, store)",
            join_redemptions.clone(),
        );
        let memory_records_refused = Family::default();
        registry.register(
            "memory_records_refused",
            "Replicated memory records refused because their origin's signature does not vouch for them, their origin was revoked, they would create a namespace past memory.max_namespaces, or their origin may not write them (writer), by reason",
            memory_records_refused.clone(),
        );
        let approval_decisions_ignored = Family::default();
        registry.register(
            "approval_decisions_ignored",
            "Decisions on this node's approvals that it ignored because the decider's signed statement is missing, does not verify or is about another call (unsigned, malformed, certificate, revoked, signature, mismatch)",
            approval_decisions_ignored.clone(),
        );
        let connections = Family::default();
        registry.register(
            "connections",
            "Open connections by listener (grpc, http) and state (open: all; handshaking: TLS handshakes in progress)",
            connections.clone(),
        );
        let connections_refused = Family::default();
        registry.register(
            "connections_refused",
            "Connections closed at accept because a cap was reached, by listener and reason (max_connections, max_handshakes)",
            connections_refused.clone(),
        );
        let connections_timed_out = Family::default();
        registry.register(
            "connections_timed_out",
            "Connections closed because their TLS handshake (phase=handshake) or request headers (phase=headers) did not arrive in time, by listener",
            connections_timed_out.clone(),
        );
        let adverts_dropped = Family::default();
        registry.register(
            "discovery_adverts_dropped",
            "mDNS adverts that started no dial, by reason (already_dialing, cap, failing_address, queue_full)",
            adverts_dropped.clone(),
        );
        let swim_dropped = Family::default();
        registry.register(
            "swim_dropped",
            "Membership datagrams dropped unread, by reason (malformed, certificate, revoked, bad_signature, stale, replayed, impersonation; throttled: its source sent too many that failed; busy: the queue for signature checks was full, or the checks strangers get were used up)",
            swim_dropped.clone(),
        );
        let swim_signature_checks = Counter::default();
        registry.register(
            "swim_signature_checks",
            "Membership datagrams whose certificate and signature were checked (those the checks without cryptography let through)",
            swim_signature_checks.clone(),
        );
        let http_key_requests = Family::default();
        registry.register(
            "http_key_requests",
            "Front-door requests admitted on this node, by key name and model",
            http_key_requests.clone(),
        );
        let http_key_tokens = Family::default();
        registry.register(
            "http_key_tokens",
            "Tokens the models reported for front-door requests on this node, by key name, model and kind (prompt, completion)",
            http_key_tokens.clone(),
        );
        let http_key_refusals = Family::default();
        registry.register(
            "http_key_refusals",
            "Front-door requests refused by a key's policy on this node, by key name and limit (model, max_tokens_per_day, max_tokens_per_month, requests_per_minute, tokens_per_minute)",
            http_key_refusals.clone(),
        );
        let journal_appends = Counter::default();
        registry.register(
            "task_journal_appends",
            "Steps this node appended to the journals of the tasks it runs",
            journal_appends.clone(),
        );
        let journal_bytes = Counter::default();
        registry.register(
            "task_journal_bytes",
            "Bytes of the journal steps this node appended",
            journal_bytes.clone(),
        );
        let journal_append_seconds = Histogram::new(exponential_buckets(0.000_05, 1.25, 48));
        registry.register(
            "task_journal_append_seconds",
            "How long one journal append took on this node (written and flushed)",
            journal_append_seconds.clone(),
        );
        let tasks_resumed = Counter::default();
        registry.register(
            "tasks_resumed",
            "Tasks this node resumed on another node from their journal",
            tasks_resumed.clone(),
        );
        let chat_failovers = Family::default();
        registry.register(
            "chat_failovers",
            "Chats placed on peers that went on on the next peer after the one serving them failed, by kind (whole: the next was asked the whole request; mid_stream: it continued the text already streamed)",
            chat_failovers.clone(),
        );
        Self {
            registry,
            journal_appends,
            journal_bytes,
            journal_append_seconds,
            tasks_resumed,
            chat_failovers,
            swim_dropped,
            swim_signature_checks,
            http_key_requests,
            http_key_tokens,
            http_key_refusals,
            connections,
            connections_refused,
            connections_timed_out,
            adverts_dropped,
            join_redemptions,
            tasks,
            routing,
            http_requests,
            model_latency,
            peers,
            lag_records,
            lag_seconds,
            tokens_per_second,
            model_tokens_generated,
            memory_records_refused,
            approval_decisions_ignored,
        }
    }

    /// Counts a routing decision.
    pub(crate) fn routed(&self, kind: &str, placement: &str) {
        self.routing
            .get_or_create(&labels(&[("kind", kind), ("placement", placement)]))
            .inc();
    }

    /// Records one model call's latency.
    pub(crate) fn model_call(&self, model: &str, seconds: f64) {
        self.model_latency
            .get_or_create(&labels(&[("model", model)]))
            .observe(seconds);
    }

    /// The text exposition.
    pub(crate) fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// Gauges read from a module's state when `/metrics` is scraped, rather than kept up to date as
/// the state changes (replication lag per peer): a port the module whose state it is
/// implements, which the front door's scrape calls before it encodes; `server` wires it.
pub(crate) trait ScrapedGauges: Send + Sync + std::fmt::Debug {
    /// Sets the gauges of `metrics` from the state now.
    fn refresh(&self, metrics: &Metrics);
}

/// The process-wide metrics.
pub(crate) fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::new)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorded_values_appear_in_the_exposition() {
        let m = Metrics::new();
        m.routed("chat", "local");
        m.routed("chat", "local");
        m.model_call("tiny", 0.02);
        m.peers.get_or_create(&labels(&[("state", "up")])).set(3);
        let text = m.encode();
        assert!(
            text.contains(r#"agentmesh_routing_decisions_total{kind="chat",placement="local"} 2"#),
            "{text}"
        );
        assert!(text.contains(r#"agentmesh_model_latency_seconds_count{model="tiny"} 1"#));
        assert!(text.contains(r#"agentmesh_peers{state="up"} 3"#));
        assert!(text.ends_with("# EOF\n"));
    }
}
