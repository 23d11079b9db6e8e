//! The gossiped `NodeInfo` versions (a node's version rises when its load, health or memory
//! changed; foca spreads the newest of each node) and where each member's fetched `NodeInfo`
//! stands. The fetching itself is in `fetch`.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use foca::{BroadcastHandler, Invalidates};
use mesh_domain::{NodeId, NodeInfo, sync::MutexExt};
use tokio::time::Instant;

use super::member::Member;
use crate::peers::LinkError;

/// A node raises its `NodeInfo` version at most this often, however often its load changes.
pub(super) const VERSION_EVERY: Duration = Duration::from_secs(2);

/// A gossiped `NodeInfo` version: run `bump` of node `id` is at `version`. A restarted node
/// counts again from 1 under a higher bump, so versions compare as `(bump, version)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct InfoVersion {
    pub(super) id: NodeId,
    pub(super) bump: u64,
    pub(super) version: u64,
}

impl Invalidates for InfoVersion {
    fn invalidates(&self, other: &Self) -> bool {
        self.id == other.id && (self.bump, self.version) >= (other.bump, other.version)
    }
}

impl InfoVersion {
    /// 64 id characters, then bump and version big-endian.
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut out = self.id.as_str().as_bytes().to_vec();
        out.extend_from_slice(&self.bump.to_be_bytes());
        out.extend_from_slice(&self.version.to_be_bytes());
        out
    }

    pub(super) fn decode(data: &[u8]) -> Result<Self, BadVersion> {
        if data.len() != 80 {
            return Err(BadVersion("length is not 80"));
        }
        let id = std::str::from_utf8(&data[..64])
            .ok()
            .and_then(|s| NodeId::parse(s).ok())
            .ok_or(BadVersion("not a node id"))?;
        let number = |at: usize| {
            let mut bytes = [0u8; 8];
            bytes.copy_from_slice(&data[at..at + 8]);
            u64::from_be_bytes(bytes)
        };
        Ok(Self {
            id,
            bump: number(64),
            version: number(72),
        })
    }
}

/// A gossiped version item that does not decode.
#[derive(Debug, thiserror::Error)]
#[error("bad NodeInfo version item: {0}")]
pub(super) struct BadVersion(&'static str);

/// The newest `NodeInfo` version heard of per node; ids whose version rose since the loop last
/// looked wait in `raised`.
#[derive(Debug, Default)]
pub(super) struct VersionBook {
    pub(super) latest: HashMap<NodeId, (u64, u64)>,
    pub(super) raised: Vec<NodeId>,
}

/// foca's handler of gossiped versions; it shares its book with the loop (foca owns the
/// handler and lends it to no one).
#[derive(Debug, Default, Clone)]
pub(super) struct Versions {
    pub(super) book: Arc<Mutex<VersionBook>>,
}

impl BroadcastHandler<Member> for Versions {
    type Key = InfoVersion;
    type Error = BadVersion;

    fn receive_item(
        &mut self,
        data: &[u8],
        _sender: Option<&Member>,
    ) -> Result<Option<InfoVersion>, BadVersion> {
        let item = InfoVersion::decode(data)?;
        let mut book = self.book.lock_unpoisoned();
        let newer = book
            .latest
            .get(&item.id)
            .is_none_or(|known| (item.bump, item.version) > *known);
        if !newer {
            return Ok(None);
        }
        book.latest
            .insert(item.id.clone(), (item.bump, item.version));
        book.raised.push(item.id.clone());
        Ok(Some(item))
    }
}

/// Where a member's `NodeInfo` stands.
#[derive(Debug, Default)]
pub(super) struct Fetched {
    /// The run (bump) and `(bump, version)` the table's row was fetched at (`None`: never).
    pub(super) at: Option<(u64, (u64, u64))>,
    /// A fetch is under way.
    pub(super) fetching: bool,
    /// After a failed fetch: not before then, and how long the next wait is.
    pub(super) retry: Option<(Instant, Duration)>,
}

/// A finished `NodeInfo` fetch: the member, the `(bump, version)` it was fetched for, and the
/// info with the fetch's time.
pub(super) type FetchDone = (Member, (u64, u64), Result<(NodeInfo, Duration), LinkError>);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gossiped_version_round_trips_and_orders_by_run_then_version() {
        let id = NodeId::from_spki_der(b"alpha");
        let item = InfoVersion {
            id: id.clone(),
            bump: 7,
            version: 3,
        };
        assert_eq!(InfoVersion::decode(&item.encode()).expect("decodes"), item);
        assert!(InfoVersion::decode(&item.encode()[1..]).is_err());
        let versions = Versions::default();
        let mut handler = versions.clone();
        let newer_run = InfoVersion {
            id: id.clone(),
            bump: 8,
            version: 1,
        };
        assert!(
            handler
                .receive_item(&item.encode(), None)
                .expect("ok")
                .is_some()
        );
        assert!(
            handler
                .receive_item(&item.encode(), None)
                .expect("ok")
                .is_none(),
            "not newer"
        );
        assert!(
            handler
                .receive_item(&newer_run.encode(), None)
                .expect("ok")
                .is_some()
        );
        let stale = InfoVersion {
            id,
            bump: 7,
            version: 9,
        };
        assert!(
            handler
                .receive_item(&stale.encode(), None)
                .expect("ok")
                .is_none(),
            "older run"
        );
        assert_eq!(versions.book.lock_unpoisoned().raised.len(), 2);
    }
}
