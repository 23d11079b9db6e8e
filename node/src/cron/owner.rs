//! Who fires a schedule, and under which task id: [`owner`] (rendezvous hashing of the
//! schedule id over the live nodes), [`owner_of`] (among the nodes that accept the schedule's
//! tier from its writer) and [`task_id_for`] (a firing's task id, the same on every node). Pure
//! functions of ids, no I/O: it must not read the peer table or the memory (the scheduler hands
//! it the live nodes).

use mesh_domain::{NodeId, Tier};
use sha2::{Digest, Sha256};

use super::schedule::Schedule;

fn score(schedule_id: &str, node: &NodeId) -> [u8; 32] {
    let mut hash = Sha256::new();
    hash.update(schedule_id.as_bytes());
    hash.update([0]);
    hash.update(node.as_str().as_bytes());
    hash.finalize().into()
}

/// The owner of a schedule among `nodes`: the highest rendezvous score, the same on every
/// node that sees the same live set; when the owner leaves only its schedules move.
pub(super) fn owner<'a>(
    schedule_id: &str,
    nodes: impl IntoIterator<Item = &'a NodeId>,
) -> Option<&'a NodeId> {
    nodes
        .into_iter()
        .max_by_key(|node| (score(schedule_id, node), *node))
}

/// A node that may own schedules: live as this node sees the fleet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LiveNode {
    pub id: NodeId,
    pub name: String,
    /// Its `security.remote_max_tier`, as it advertises it.
    pub remote_max_tier: Tier,
}

/// The owner of `schedule` among the `live` nodes. A firing is admitted on its owner as a task
/// from the node that wrote the schedule, so a node other than that one would refuse a
/// schedule above its `remote_max_tier`: the owner is chosen ([`owner`]) among the writer and
/// the nodes that accept the schedule's tier from another node, and among all live nodes only
/// when none of those is live (its firings then fail, with the reason, in the history).
pub(crate) fn owner_of<'a>(schedule: &Schedule, live: &'a [LiveNode]) -> Option<&'a LiveNode> {
    let accepts = |node: &&LiveNode| {
        schedule.origin.as_ref() == Some(&node.id) || schedule.task.tier <= node.remote_max_tier
    };
    let id = owner(&schedule.id, live.iter().filter(accepts).map(|n| &n.id))
        .or_else(|| owner(&schedule.id, live.iter().map(|n| &n.id)))?;
    live.iter().find(|node| &node.id == id)
}

/// The task id of a firing: a UUIDv7 whose time is the scheduled time and whose other bits
/// come from hashing the firing id, so it is the same on every node and sorts with other tasks
/// by time.
pub(super) fn task_id_for(fire_id: &str, scheduled_ms: i64) -> String {
    let digest = Sha256::digest(fire_id.as_bytes());
    let mut bytes = [0u8; 10];
    bytes.copy_from_slice(&digest[..10]);
    uuid::Builder::from_unix_timestamp_millis(u64::try_from(scheduled_ms).unwrap_or(0), &bytes)
        .into_uuid()
        .to_string()
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::cron::schedule::{Overlap, tests::schedule};

    #[test]
    fn the_owner_is_the_same_everywhere_and_only_its_schedules_move_when_it_leaves() {
        let nodes: Vec<NodeId> = (0..5)
            .map(|i| NodeId::from_spki_der(format!("node{i}").as_bytes()))
            .collect();
        let ids: Vec<String> = (0..200).map(|i| format!("schedule-{i}")).collect();
        let before: Vec<&NodeId> = ids
            .iter()
            .map(|id| owner(id, nodes.iter()).expect("owner"))
            .collect();
        let reversed: Vec<&NodeId> = ids
            .iter()
            .map(|id| owner(id, nodes.iter().rev()).expect("owner"))
            .collect();
        assert_eq!(before, reversed, "order of the live set does not matter");
        for node in &nodes {
            let share = before.iter().filter(|o| **o == node).count();
            assert!((15..=70).contains(&share), "{share} of 200 on one node");
        }
        let gone = &nodes[2];
        let after: Vec<&NodeId> = ids
            .iter()
            .map(|id| owner(id, nodes.iter().filter(|n| *n != gone)).expect("owner"))
            .collect();
        for (b, a) in before.iter().zip(&after) {
            if *b != gone {
                assert_eq!(b, a, "a schedule moved although its owner stayed");
            }
        }
    }

    #[test]
    fn a_schedule_is_owned_by_its_writer_or_a_node_that_accepts_its_tier_from_others() {
        let node = |name: &str, remote_max_tier| LiveNode {
            id: NodeId::from_spki_der(name.as_bytes()),
            name: name.into(),
            remote_max_tier,
        };
        let (laptop, gpu, server) = (
            node("laptop", Tier::Read),
            node("gpu", Tier::Read),
            node("server", Tier::Write),
        );
        let at_tier = |id: usize, tier, origin: &LiveNode| {
            let mut s = schedule(&format!("s{id}"), "* * * * *", Overlap::Skip, 60);
            s.id = format!("schedule-{id}");
            s.task.tier = tier;
            s.origin = Some(origin.id.clone());
            s
        };
        let fleet = [laptop.clone(), gpu.clone(), server.clone()];
        let mut owners = HashSet::new();
        for i in 0..200 {
            // Read: anyone; every node ends up owning some.
            owners.insert(
                owner_of(&at_tier(i, Tier::Read, &laptop), &fleet)
                    .expect("owner")
                    .name
                    .clone(),
            );
            // Write, written by the laptop: the laptop or the server, never gpu.
            let owner = owner_of(&at_tier(i, Tier::Write, &laptop), &fleet).expect("owner");
            assert_ne!(owner.name, "gpu", "schedule {i}");
            // Shell: only its writer accepts it.
            let owner = owner_of(&at_tier(i, Tier::Shell, &gpu), &fleet).expect("owner");
            assert_eq!(owner.name, "gpu", "schedule {i}");
        }
        assert_eq!(owners.len(), 3, "{owners:?}");
        // With its writer gone and nobody accepting its tier, someone still owns it (and its
        // firings fail with the reason in the history instead of never happening).
        let without_gpu = [laptop, server];
        assert!(owner_of(&at_tier(1, Tier::Shell, &gpu), &without_gpu).is_some());
    }
}
