//! The stored schedules, decoded once per change. [`ScheduleTable`] keeps every schedule of the
//! memory namespace `cron` decoded, checked as `Cron.Add` checks a new one, and parsed; it
//! re-reads the namespace only after the memory says it changed ([`Memory::changes_in`]), and
//! even then decodes only the records it does not hold yet (a new stamp or writer). Each
//! re-read also settles which schedules the caps hold back ([`ScheduleLimits::held`]). It must
//! not write the memory, fire anything or decide ownership.

use std::{
    collections::{BTreeMap, HashSet},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use mesh_domain::{NodeId, keys::CRON_SCHEDULES, sync::MutexExt};
use tokio::sync::watch;

use super::{
    error::CronError,
    limits::{Footprint, ScheduleLimits},
    schedule::{Schedule, check_name},
    timetable::Timetable,
};
use crate::memory::{Entry, Memory};

/// Records read from the memory at once while re-reading the namespace.
const READ_PAGE: usize = 256;
/// Bytes of records read from the memory at once (one record more than fits is still read).
const READ_BYTES: usize = 4 << 20;

/// A stored schedule that passed the checks, with its timetable parsed.
#[derive(Debug)]
pub(crate) struct Parsed {
    /// The schedule, with `origin` set to the node that wrote its record.
    pub schedule: Schedule,
    /// Its expression in its time zone.
    pub timetable: Timetable,
    /// The size of its stored record, which the byte caps count.
    pub bytes: usize,
}

impl Parsed {
    fn footprint(&self) -> Footprint<'_> {
        footprint(&self.schedule, self.bytes)
    }
}

fn footprint(schedule: &Schedule, bytes: usize) -> Footprint<'_> {
    Footprint {
        creator: schedule.creator.as_ref().map(|c| &c.id),
        created_at_ms: schedule.created_at_ms,
        id: &schedule.id,
        bytes,
    }
}

/// A stored schedule as listings show it.
#[derive(Debug, Clone)]
pub(crate) struct StoredSchedule {
    /// The schedule and its timetable.
    pub parsed: Arc<Parsed>,
    /// Why the caps hold it back (it never fires while they do); `None` when it fires.
    pub held: Option<String>,
}

/// The schedules that may fire, as of one re-read ([`ScheduleTable::active`]).
#[derive(Debug, Clone)]
pub(crate) struct Active {
    /// Changes whenever the schedules may have: owners need computing again only then.
    pub generation: u64,
    /// The schedules that passed the checks and are not held back, by name.
    pub schedules: Arc<Vec<Arc<Parsed>>>,
}

/// One record of the namespace, as last read.
#[derive(Debug, Clone)]
struct Cached {
    /// The record's stamp: with `origin`, a record read again unchanged is not decoded again.
    hlc: u64,
    /// The node that wrote the record.
    origin: NodeId,
    /// The schedule, or why `Cron.Add` would refuse it.
    parsed: Result<Arc<Parsed>, String>,
    /// Why the caps hold it back.
    held: Option<String>,
}

/// What the last re-read found.
#[derive(Debug, Default)]
struct Snapshot {
    /// Every record, by name (the key).
    by_name: BTreeMap<String, Cached>,
    /// The schedules that may fire (valid and not held), by name.
    active: Arc<Vec<Arc<Parsed>>>,
    /// Counts re-reads that changed anything, so the scheduler recomputes owners only then.
    generation: u64,
    /// False until the namespace was read, and after a read failed.
    read: bool,
}

/// The stored schedules of this node's memory, decoded once per change.
#[derive(Debug)]
pub(crate) struct ScheduleTable {
    memory: Arc<Memory>,
    /// The caps of `[cron]`.
    limits: ScheduleLimits,
    /// Moves when the namespace changed after the last re-read.
    changes: Mutex<watch::Receiver<u64>>,
    /// Held while re-reading, so readers see one re-read's result whole.
    snapshot: Mutex<Snapshot>,
    /// Stored schedules refused, with why, so each is logged once (names no longer stored are
    /// forgotten at each re-read).
    refused: Mutex<HashSet<(String, String)>>,
    /// Records decoded so far.
    decoded: AtomicU64,
}

impl ScheduleTable {
    /// The schedules stored in `memory`, held back past `limits`.
    pub(crate) fn new(memory: Arc<Memory>, limits: ScheduleLimits) -> Self {
        Self {
            changes: Mutex::new(memory.changes_in(CRON_SCHEDULES)),
            memory,
            limits,
            snapshot: Mutex::default(),
            refused: Mutex::default(),
            decoded: AtomicU64::new(0),
        }
    }

    /// Runs `f` on the schedules as stored now, re-reading them first if they changed.
    fn read<T>(&self, f: impl FnOnce(&Snapshot) -> T) -> Result<T, CronError> {
        let mut snapshot = self.snapshot.lock_unpoisoned();
        let changed = {
            let mut changes = self.changes.lock_unpoisoned();
            // Marked before the re-read: a change during it moves the mark again.
            let changed = changes.has_changed().unwrap_or(false);
            changes.mark_unchanged();
            changed
        };
        if changed || !snapshot.read {
            snapshot.read = false;
            self.reload(&mut snapshot)?;
            snapshot.read = true;
        }
        Ok(f(&snapshot))
    }

    /// Reads the namespace again, decoding the records not held yet.
    fn reload(&self, snapshot: &mut Snapshot) -> Result<(), CronError> {
        let mut by_name = BTreeMap::new();
        let mut changed = false;
        let mut after = String::new();
        loop {
            let page = self
                .memory
                .page(CRON_SCHEDULES, "", &after, READ_PAGE, READ_BYTES)?;
            for entry in page.entries {
                let cached = match snapshot.by_name.get(&entry.key) {
                    Some(held)
                        if held.hlc == entry.record.hlc && held.origin == entry.record.origin =>
                    {
                        held.clone()
                    }
                    _ => {
                        changed = true;
                        self.decode(&entry)
                    }
                };
                by_name.insert(entry.key, cached);
            }
            match page.next_after {
                Some(last) => after = last,
                None => break,
            }
        }
        // Nothing decoded and as many records as before: the same records.
        if !changed && by_name.len() == snapshot.by_name.len() && snapshot.generation > 0 {
            return Ok(());
        }
        self.settle(&mut by_name);
        self.refused
            .lock_unpoisoned()
            .retain(|(name, _)| by_name.contains_key(name));
        snapshot.active = Arc::new(
            by_name
                .values()
                .filter(|cached| cached.held.is_none())
                .filter_map(|cached| cached.parsed.as_ref().ok().cloned())
                .collect(),
        );
        snapshot.by_name = by_name;
        snapshot.generation += 1;
        Ok(())
    }

    /// Marks the schedules the caps hold back.
    fn settle(&self, by_name: &mut BTreeMap<String, Cached>) {
        let valid: Vec<Arc<Parsed>> = by_name
            .values()
            .filter_map(|cached| cached.parsed.as_ref().ok().cloned())
            .collect();
        let footprints: Vec<Footprint<'_>> = valid.iter().map(|p| p.footprint()).collect();
        let held = self.limits.held(&footprints);
        let count = held.iter().flatten().count();
        let mut held = held.into_iter();
        for cached in by_name.values_mut() {
            if cached.parsed.is_ok() {
                cached.held = held
                    .next()
                    .flatten()
                    .map(|cap| self.limits.held_because(cap));
            }
        }
        if count > 0 {
            tracing::warn!(
                held = count,
                "schedules held back by the caps of [cron]: they never fire until older ones are removed (`mesh-cli cron ls` shows which)"
            );
        }
    }

    /// Decodes and checks one record; a refused one is logged once per name and reason.
    fn decode(&self, entry: &Entry) -> Cached {
        self.decoded.fetch_add(1, Ordering::Relaxed);
        let record = &entry.record;
        let parsed = serde_json::from_slice::<Schedule>(&record.value)
            .map_err(|e| e.to_string())
            .and_then(|mut schedule| {
                // Listed and removed by its name, which must be the key it is stored under.
                if schedule.name != entry.key {
                    return Err(format!(
                        "name: `{}` is stored under the key `{}`",
                        schedule.name, entry.key
                    ));
                }
                let timetable = schedule.check()?;
                schedule.origin = Some(record.origin.clone());
                Ok(Arc::new(Parsed {
                    schedule,
                    timetable,
                    bytes: record.value.len(),
                }))
            });
        if let Err(why) = &parsed
            && self
                .refused
                .lock_unpoisoned()
                .insert((entry.key.clone(), why.clone()))
        {
            tracing::warn!(schedule = %entry.key, writer = %record.origin.short(), error = %why, "ignoring a stored schedule that Cron.Add would refuse; it never fires");
        }
        Cached {
            hlc: record.hlc,
            origin: record.origin.clone(),
            parsed,
            held: None,
        }
    }

    /// Every stored schedule that passed the checks, by name.
    pub(crate) fn schedules(&self) -> Result<Vec<StoredSchedule>, CronError> {
        Ok(self.page("", usize::MAX, usize::MAX)?.0)
    }

    /// The stored schedules that passed the checks and sort after the name `after`, by name: at
    /// most `limit`, and no more than `max_bytes` of records (the first is always taken). The
    /// name of the last one when more remain.
    pub(crate) fn page(
        &self,
        after: &str,
        limit: usize,
        max_bytes: usize,
    ) -> Result<(Vec<StoredSchedule>, Option<String>), CronError> {
        self.read(|snapshot| {
            let mut page: Vec<StoredSchedule> = Vec::new();
            let mut bytes = 0usize;
            let mut next_after = None;
            let from = std::ops::Bound::Excluded(after.to_owned());
            for cached in snapshot
                .by_name
                .range((from, std::ops::Bound::Unbounded))
                .map(|(_, cached)| cached)
            {
                let Ok(parsed) = &cached.parsed else { continue };
                bytes = bytes.saturating_add(parsed.bytes);
                if !page.is_empty() && (page.len() >= limit || bytes > max_bytes) {
                    next_after = page.last().map(|s| s.parsed.schedule.name.clone());
                    break;
                }
                page.push(StoredSchedule {
                    parsed: parsed.clone(),
                    held: cached.held.clone(),
                });
            }
            (page, next_after)
        })
    }

    /// The schedule named `name`: `NotFound` when there is none, `Invalid` when its record is
    /// one `Cron.Add` would refuse.
    pub(crate) fn get(&self, name: &str) -> Result<StoredSchedule, CronError> {
        check_name(name)?;
        self.read(|snapshot| match snapshot.by_name.get(name) {
            None => Err(CronError::NotFound(name.to_owned())),
            Some(cached) => match &cached.parsed {
                Ok(parsed) => Ok(StoredSchedule {
                    parsed: parsed.clone(),
                    held: cached.held.clone(),
                }),
                Err(why) => Err(CronError::Invalid(format!(
                    "stored schedule `{name}` is not valid: {why}"
                ))),
            },
        })?
    }

    /// The schedules that may fire (passed the checks, not held back).
    pub(crate) fn active(&self) -> Result<Active, CronError> {
        self.read(|snapshot| Active {
            generation: snapshot.generation,
            schedules: snapshot.active.clone(),
        })
    }

    /// Whether `schedule`, whose record takes `bytes`, fits beside the stored schedules (held
    /// ones count too); the refusal names the cap and the ways out.
    pub(crate) fn room_for(&self, schedule: &Schedule, bytes: usize) -> Result<(), CronError> {
        self.read(|snapshot| {
            let stored: Vec<Footprint<'_>> = snapshot
                .by_name
                .values()
                .filter_map(|cached| cached.parsed.as_ref().ok())
                .map(|parsed| parsed.footprint())
                .collect();
            self.limits
                .room_for(&stored, &footprint(schedule, bytes))
                .map_err(CronError::Full)
        })?
    }

    /// How many records were decoded so far: once per record written, not per read.
    #[cfg(test)]
    pub(super) fn decoded(&self) -> u64 {
        self.decoded.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use mesh_domain::{CertRole, Principal};

    use super::*;
    use crate::cron::schedule::{Overlap, tests::schedule};

    pub(in crate::cron) fn open_memory() -> (tempfile::TempDir, Arc<Memory>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::open(dir.path()).expect("db");
        let (memory, _writes) = Memory::open(
            Arc::new(crate::storage::SledStore::new(db)),
            Arc::new(mesh_cert::OriginSigner::generate().expect("signer")),
            Arc::new(mesh_cert::OriginVerifier::self_certified()),
            crate::memory::MemoryOptions::default(),
        );
        (dir, memory)
    }

    async fn store(memory: &Memory, schedule: &Schedule) {
        let value = serde_json::to_vec(schedule).expect("json");
        memory
            .put(CRON_SCHEDULES, &schedule.name, Some(value))
            .await
            .expect("put");
    }

    fn names(stored: &[StoredSchedule]) -> Vec<&str> {
        stored
            .iter()
            .map(|s| s.parsed.schedule.name.as_str())
            .collect()
    }

    /// Issue 26, point 7: every node decoded and parsed every schedule twice a second. A
    /// record is decoded once when it is written, whatever reads follow.
    #[tokio::test]
    async fn a_schedule_is_decoded_once_per_write_and_not_per_read() {
        let (_dir, memory) = open_memory();
        let table = ScheduleTable::new(memory.clone(), ScheduleLimits::default());
        for name in ["a", "b", "c"] {
            store(&memory, &schedule(name, "* * * * *", Overlap::Skip, 60)).await;
        }
        let first = table.active().expect("active");
        assert_eq!(first.schedules.len(), 3);
        for _ in 0..10 {
            assert_eq!(table.active().expect("active").generation, first.generation);
            table.schedules().expect("list");
            table.get("b").expect("get");
        }
        assert_eq!(table.decoded(), 3);
        // A write elsewhere is not a change of the schedules.
        memory
            .put("notes", "k", Some(b"v".to_vec()))
            .await
            .expect("put");
        assert_eq!(table.active().expect("active").generation, first.generation);
        // One more: only it is decoded. A removal decodes nothing.
        store(&memory, &schedule("d", "* * * * *", Overlap::Skip, 60)).await;
        let second = table.active().expect("active");
        assert_ne!(second.generation, first.generation);
        assert_eq!(second.schedules.len(), 4);
        assert_eq!(table.decoded(), 4);
        memory.put(CRON_SCHEDULES, "a", None).await.expect("remove");
        assert_eq!(names(&table.schedules().expect("list")), ["b", "c", "d"]);
        assert_eq!(table.decoded(), 4);
    }

    #[tokio::test]
    async fn schedules_past_a_cap_are_listed_as_held_and_never_active() {
        let (_dir, memory) = open_memory();
        let limits = ScheduleLimits {
            schedules_per_creator: 2,
            ..ScheduleLimits::default()
        };
        let table = ScheduleTable::new(memory.clone(), limits);
        let alice = Principal {
            id: NodeId::from_spki_der(b"alice"),
            name: "alice".into(),
            role: Some(CertRole::Client),
        };
        // As two nodes that had not seen each other's writes would hold them.
        for (i, name) in ["new", "old", "mid"].iter().enumerate() {
            let mut s = schedule(name, "* * * * *", Overlap::Skip, 60);
            s.creator = Some(alice.clone());
            s.created_at_ms = [30, 10, 20][i];
            store(&memory, &s).await;
        }
        let listed = table.schedules().expect("list");
        let held: Vec<(&str, bool)> = listed
            .iter()
            .map(|s| (s.parsed.schedule.name.as_str(), s.held.is_some()))
            .collect();
        assert_eq!(held, [("mid", false), ("new", true), ("old", false)]);
        let why = listed[1].held.clone().expect("held");
        assert!(why.contains("cron.max_schedules_per_creator"), "{why}");
        let active = table.active().expect("active").schedules;
        let active: Vec<&str> = active.iter().map(|p| p.schedule.name.as_str()).collect();
        assert_eq!(active, ["mid", "old"]);
        assert!(
            table
                .room_for(&schedule("more", "* * * * *", Overlap::Skip, 60), 100)
                .is_ok(),
            "alice's schedules do not count against another creator's cap"
        );
        let mut more = schedule("more", "* * * * *", Overlap::Skip, 60);
        more.creator = Some(alice);
        assert!(matches!(
            table.room_for(&more, 100),
            Err(CronError::Full(_))
        ));
        // Removing an old one lets the held one fire.
        memory
            .put(CRON_SCHEDULES, "old", None)
            .await
            .expect("remove");
        assert!(
            table
                .schedules()
                .expect("list")
                .iter()
                .all(|s| s.held.is_none())
        );
    }

    #[tokio::test]
    async fn a_listing_comes_in_pages_cut_by_count_or_bytes() {
        let (_dir, memory) = open_memory();
        let table = ScheduleTable::new(memory.clone(), ScheduleLimits::default());
        for i in 0..5 {
            store(
                &memory,
                &schedule(&format!("s{i}"), "* * * * *", Overlap::Skip, 60),
            )
            .await;
        }
        let (first, next) = table.page("", 2, usize::MAX).expect("page");
        assert_eq!(
            (names(&first), next.as_deref()),
            (vec!["s0", "s1"], Some("s1"))
        );
        let (rest, next) = table.page("s1", 10, usize::MAX).expect("page");
        assert_eq!((names(&rest), next), (vec!["s2", "s3", "s4"], None));
        // A budget smaller than one record still gives one per page.
        let (one, next) = table.page("s3", 10, 1).expect("page");
        assert_eq!((names(&one), next.as_deref()), (vec!["s4"], None));
        let (one, next) = table.page("", 10, 1).expect("page");
        assert_eq!((names(&one), next.as_deref()), (vec!["s0"], Some("s0")));
        // A record stored under another name than its own is refused, and not listed.
        let mut renamed = schedule("other", "* * * * *", Overlap::Skip, 60);
        renamed.name = "elsewhere".into();
        let value = serde_json::to_vec(&renamed).expect("json");
        memory
            .put(CRON_SCHEDULES, "other", Some(value))
            .await
            .expect("put");
        let error = table.get("other").expect_err("refused").to_string();
        assert!(error.contains("stored under the key"), "{error}");
        assert_eq!(table.schedules().expect("list").len(), 5);
    }
}
