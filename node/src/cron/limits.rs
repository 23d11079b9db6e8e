//! The bounds on schedules (`[cron]` in the config): how many schedules, and how many bytes of
//! them, one creator and all creators together may keep. Pure rules over [`Footprint`]s, no
//! I/O: [`ScheduleLimits::room_for`] says whether `Cron.Add` may store one more on this node,
//! and [`ScheduleLimits::held`] which stored schedules the caps hold back when the stored set is
//! past a cap anyway: nodes that each accepted schedules up to the cap before they saw each
//! other's writes, or a node with lower caps than the node that accepted them. A cap never
//! deletes anything (a held schedule stays stored and listed, and fires once there is room),
//! and every node holds back the same schedules given the same set and the same caps. It must
//! not read, write or delete schedules.

use std::collections::HashMap;

use mesh_domain::NodeId;

const MIB: usize = 1 << 20;

/// The caps of `[cron]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ScheduleLimits {
    /// `cron.max_schedules`: schedules of all creators together.
    pub schedules: usize,
    /// `cron.max_schedules_per_creator`.
    pub schedules_per_creator: usize,
    /// `cron.max_mb`, in bytes: the stored records of all schedules together.
    pub bytes: usize,
    /// `cron.max_mb_per_creator`, in bytes.
    pub bytes_per_creator: usize,
}

impl Default for ScheduleLimits {
    fn default() -> Self {
        Self {
            schedules: 1000,
            schedules_per_creator: 100,
            bytes: 16 * MIB,
            bytes_per_creator: 4 * MIB,
        }
    }
}

/// What the caps count of one schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Footprint<'a> {
    /// The id of its creator's certificate; `None` for schedules created without one
    /// (insecure mode, older versions), which share one creator's caps.
    pub creator: Option<&'a NodeId>,
    /// When it was created (Unix ms): older schedules keep their room.
    pub created_at_ms: i64,
    /// Its id, which orders schedules created in the same millisecond.
    pub id: &'a str,
    /// The size of its stored record.
    pub bytes: usize,
}

/// One cap of `[cron]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Cap {
    /// `cron.max_schedules`.
    Schedules,
    /// `cron.max_schedules_per_creator`.
    SchedulesPerCreator,
    /// `cron.max_mb`.
    Bytes,
    /// `cron.max_mb_per_creator`.
    BytesPerCreator,
}

impl Cap {
    /// Its config key.
    pub(crate) fn key(self) -> &'static str {
        match self {
            Self::Schedules => "cron.max_schedules",
            Self::SchedulesPerCreator => "cron.max_schedules_per_creator",
            Self::Bytes => "cron.max_mb",
            Self::BytesPerCreator => "cron.max_mb_per_creator",
        }
    }

    fn per_creator(self) -> bool {
        matches!(self, Self::SchedulesPerCreator | Self::BytesPerCreator)
    }
}

/// Schedules and bytes counted so far.
#[derive(Debug, Clone, Copy, Default)]
struct Tally {
    schedules: usize,
    bytes: usize,
}

impl Tally {
    fn add(&mut self, footprint: &Footprint<'_>) {
        self.schedules = self.schedules.saturating_add(1);
        self.bytes = self.bytes.saturating_add(footprint.bytes);
    }
}

impl ScheduleLimits {
    fn limit(&self, cap: Cap) -> usize {
        match cap {
            Cap::Schedules => self.schedules,
            Cap::SchedulesPerCreator => self.schedules_per_creator,
            Cap::Bytes => self.bytes,
            Cap::BytesPerCreator => self.bytes_per_creator,
        }
    }

    /// The cap as the config states it.
    fn stated(&self, cap: Cap) -> String {
        match cap {
            Cap::Schedules | Cap::SchedulesPerCreator => self.limit(cap).to_string(),
            Cap::Bytes | Cap::BytesPerCreator => format!("{} (MiB)", self.limit(cap) / MIB),
        }
    }

    /// The first cap that `footprint` passes, given what its creator and everyone already
    /// count.
    fn passed(
        &self,
        creator: Tally,
        all: Tally,
        footprint: &Footprint<'_>,
    ) -> Option<(Cap, usize)> {
        let more = |tally: Tally| {
            let mut tally = tally;
            tally.add(footprint);
            tally
        };
        let (creator, all) = (more(creator), more(all));
        [
            (Cap::SchedulesPerCreator, creator.schedules),
            (Cap::BytesPerCreator, creator.bytes),
            (Cap::Schedules, all.schedules),
            (Cap::Bytes, all.bytes),
        ]
        .into_iter()
        .find(|(cap, would)| *would > self.limit(*cap))
    }

    /// Whether `new` fits beside `stored`: every stored schedule counts, held ones too, so a
    /// node past a cap takes none until enough are removed. The refusal names the cap, its key,
    /// and both ways out.
    pub(crate) fn room_for(
        &self,
        stored: &[Footprint<'_>],
        new: &Footprint<'_>,
    ) -> Result<(), String> {
        let (mut creator, mut all) = (Tally::default(), Tally::default());
        for footprint in stored {
            all.add(footprint);
            if footprint.creator == new.creator {
                creator.add(footprint);
            }
        }
        let Some((cap, would)) = self.passed(creator, all, new) else {
            return Ok(());
        };
        let whose = if cap.per_creator() {
            "your certificate"
        } else {
            "the fleet"
        };
        let what = match cap {
            Cap::Schedules | Cap::SchedulesPerCreator => format!("{would} schedules"),
            Cap::Bytes | Cap::BytesPerCreator => {
                format!("{} KiB of schedules", would.div_ceil(1024))
            }
        };
        Err(format!(
            "this schedule would give {whose} {what}, more than `{key}` = {stated} allows on this \
             node; remove schedules first (`mesh-cli cron ls` lists them, `mesh-cli cron rm NAME` \
             removes one), or raise `{key}` in the node's config",
            key = cap.key(),
            stated = self.stated(cap),
        ))
    }

    /// For each of `stored`, in the order given, the cap that holds it back, if any. The
    /// schedules are taken oldest first (by `created_at_ms`, then id); each is active when it
    /// fits within its creator's caps and the total caps together with the active ones taken
    /// before it, and held otherwise. So the oldest schedules keep their room, and the same set
    /// gives the same answer on every node, whatever order it was read in.
    pub(crate) fn held(&self, stored: &[Footprint<'_>]) -> Vec<Option<Cap>> {
        let mut order: Vec<usize> = (0..stored.len()).collect();
        order.sort_by_key(|&i| (stored[i].created_at_ms, stored[i].id));
        let mut creators: HashMap<Option<&NodeId>, Tally> = HashMap::new();
        let mut all = Tally::default();
        let mut held = vec![None; stored.len()];
        for i in order {
            let footprint = &stored[i];
            let creator = creators.entry(footprint.creator).or_default();
            match self.passed(*creator, all, footprint) {
                Some((cap, _)) => held[i] = Some(cap),
                None => {
                    creator.add(footprint);
                    all.add(footprint);
                }
            }
        }
        held
    }

    /// Why a schedule is held back by `cap`, for listings.
    pub(crate) fn held_because(&self, cap: Cap) -> String {
        let whose = if cap.per_creator() {
            "its creator's older schedules"
        } else {
            "older schedules"
        };
        format!(
            "held back: {whose} fill `{key}` = {stated} on this node; it fires once older ones are \
             removed (`mesh-cli cron rm NAME`) or `{key}` is raised",
            key = cap.key(),
            stated = self.stated(cap),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn creator(name: &str) -> NodeId {
        NodeId::from_spki_der(name.as_bytes())
    }

    fn footprint<'a>(creator: &'a NodeId, at: i64, id: &'a str, bytes: usize) -> Footprint<'a> {
        Footprint {
            creator: Some(creator),
            created_at_ms: at,
            id,
            bytes,
        }
    }

    /// `n` schedules of `who` of 1000 bytes each, created at 0, 1, 2, ...
    fn of<'a>(who: &'a NodeId, ids: &'a [String], n: usize) -> Vec<Footprint<'a>> {
        (0..n)
            .map(|i| footprint(who, i as i64, &ids[i], 1000))
            .collect()
    }

    /// The ids of the held schedules, in the order given.
    fn held_ids(limits: &ScheduleLimits, stored: &[Footprint<'_>]) -> Vec<String> {
        stored
            .iter()
            .zip(limits.held(stored))
            .filter(|(_, held)| held.is_some())
            .map(|(f, _)| f.id.to_owned())
            .collect()
    }

    const SMALL: ScheduleLimits = ScheduleLimits {
        schedules: 5,
        schedules_per_creator: 3,
        bytes: 4 * MIB,
        bytes_per_creator: 2 * MIB,
    };

    #[test]
    fn one_more_schedule_is_refused_past_each_cap_naming_it_and_the_ways_out() {
        let (alice, bob, carol) = (creator("alice"), creator("bob"), creator("carol"));
        let ids: Vec<String> = (0..10).map(|i| format!("s{i}")).collect();
        let new = |who| footprint(who, 100, "new", 1000);
        let cases = [
            (of(&alice, &ids, 2), new(&alice), None),
            (
                of(&alice, &ids, 3),
                new(&alice),
                Some("cron.max_schedules_per_creator"),
            ),
            // Another creator has room of its own...
            (
                [of(&alice, &ids, 3), of(&bob, &ids, 1)].concat(),
                new(&bob),
                None,
            ),
            // ...until the fleet's is used up.
            (
                [of(&alice, &ids, 3), of(&bob, &ids, 2)].concat(),
                new(&carol),
                Some("cron.max_schedules"),
            ),
            (
                of(&alice, &ids, 1),
                footprint(&alice, 100, "big", 2 * MIB),
                Some("cron.max_mb_per_creator"),
            ),
            (
                vec![footprint(&bob, 1, "b", 2 * MIB)],
                footprint(&carol, 100, "big", 2 * MIB),
                None,
            ),
            (
                vec![
                    footprint(&alice, 0, "a", 2 * MIB),
                    footprint(&bob, 1, "b", 2 * MIB - 1000),
                ],
                footprint(&carol, 100, "c", 2000),
                Some("cron.max_mb"),
            ),
        ];
        for (i, (stored, new, refused)) in cases.into_iter().enumerate() {
            let result = SMALL.room_for(&stored, &new);
            match refused {
                None => assert!(result.is_ok(), "case {i}: {result:?}"),
                Some(key) => {
                    let message = result.expect_err("refused");
                    assert!(message.contains(&format!("`{key}`")), "case {i}: {message}");
                    assert!(message.contains("mesh-cli cron rm"), "case {i}: {message}");
                    assert!(message.contains("raise"), "case {i}: {message}");
                }
            }
        }
    }

    /// Two nodes that did not see each other each accepted alice's schedules up to the cap:
    /// together they hold more than it. Every node holds back the same newest ones, whatever
    /// order it reads them in; none is dropped, and a removal lets the oldest held one fire.
    #[test]
    fn past_a_cap_the_oldest_schedules_fire_and_the_rest_are_held_the_same_everywhere() {
        let (alice, bob) = (creator("alice"), creator("bob"));
        let ids: Vec<String> = (0..7).map(|i| format!("s{i}")).collect();
        // One node accepted s0, s2, s4, the other s1, s3, s5 (interleaved in time); bob has s6.
        let mut stored: Vec<Footprint<'_>> = (0..6)
            .map(|i| footprint(&alice, i as i64 * 10, &ids[i], 1000))
            .collect();
        stored.push(footprint(&bob, 5, &ids[6], 1000));
        assert_eq!(held_ids(&SMALL, &stored), ["s3", "s4", "s5"]);
        assert!(
            SMALL
                .held(&stored)
                .iter()
                .flatten()
                .all(|cap| *cap == Cap::SchedulesPerCreator)
        );
        let mut reversed = stored.clone();
        reversed.reverse();
        assert_eq!(
            held_ids(&SMALL, &reversed),
            ["s5", "s4", "s3"],
            "the order they are read in does not matter"
        );
        // alice removes s1: s3 fires, s4 and s5 stay held.
        stored.remove(1);
        assert_eq!(held_ids(&SMALL, &stored), ["s4", "s5"]);
        // The fleet's cap holds back the newest of everyone's: s0, s6 (bob's) and s2 fire.
        let fleet = ScheduleLimits {
            schedules: 3,
            ..SMALL
        };
        assert_eq!(held_ids(&fleet, &stored), ["s3", "s4", "s5"]);
        assert!(
            fleet
                .held(&stored)
                .iter()
                .flatten()
                .all(|cap| *cap == Cap::Schedules)
        );
        let why = fleet.held_because(Cap::Schedules);
        assert!(why.contains("`cron.max_schedules` = 3"), "{why}");
    }
}
