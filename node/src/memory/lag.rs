//! The replication-lag gauges (`agentmesh_replication_lag_records`, `…_seconds`), read at each
//! `/metrics` scrape from what this node holds of each peer's writes ([`Memory::lag`]):
//! [`LagGauges`], the memory's side of the `metrics::ScrapedGauges` port.

use std::sync::Arc;

use super::store::Memory;
use crate::{
    metrics::{Metrics, ScrapedGauges, labels},
    peers::PeerTable,
};

/// How far behind this node is on each peer of the peer table.
#[derive(Debug)]
pub(crate) struct LagGauges {
    /// This node's memory.
    pub(crate) memory: Arc<Memory>,
    /// The peers, with the latest write sequence each advertises.
    pub(crate) peers: Arc<PeerTable>,
}

impl ScrapedGauges for LagGauges {
    fn refresh(&self, metrics: &Metrics) {
        metrics.lag_records.clear();
        metrics.lag_seconds.clear();
        for peer in self.peers.snapshot() {
            let (records, behind_ms) = self.memory.lag(&peer.info.id, peer.info.memory_seq);
            let peer_label = labels(&[("peer", &peer.info.name)]);
            metrics
                .lag_records
                .get_or_create(&peer_label)
                .set(i64::try_from(records).unwrap_or(i64::MAX));
            metrics
                .lag_seconds
                .get_or_create(&peer_label)
                .set(behind_ms as f64 / 1000.0);
        }
    }
}
