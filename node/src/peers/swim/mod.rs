//! Membership by SWIM: the `foca` crate runs the protocol (a constant number of probes per
//! period, indirect probes, suspicion that a live member refutes by raising its incarnation,
//! membership changes piggybacked on the probes and gossip), over UDP on the node's port, every
//! datagram sealed with the node's key ([`super::envelope`]). [`Membership::run`] owns foca and
//! its socket and timers; it turns foca's members into the [`PeerTable`](super::PeerTable)'s rows.
//!
//! A member's identity is its node id, its address and a start stamp that a restart (or a
//! rejoin after being declared down) raises. Capabilities do not travel in SWIM messages:
//! each node gossips a small version number of its `NodeInfo` (raised at most every
//! [`VERSION_EVERY`] when its load, health or memory write sequence changed), and a node fetches a peer's full
//! `NodeInfo` over the mTLS `Node.GetInfo` only when that number changes ([`PeerLink`](super::PeerLink)).
//! Discovery (static peers, mDNS adverts) only says where a first member may be: the node
//! announces itself there. On shutdown the node leaves (a goodbye every member hears), so peers
//! mark it down at once.
//!
//! A received datagram is screened on the loop, without cryptography
//! ([`super::envelope::Opener::screen`]: layout, stamp window, replay mark), and its source's
//! failures are counted ([`super::budget`]); what passes waits for its certificate and
//! signature check on a task of its own (`inbox`), in one of two bounded queues:
//! one for datagrams from a live member's address with that member's certificate, served
//! first, one for everyone else, which gets at most [`STRANGER_CHECKS_PER_SECOND`]. A full
//! queue drops the datagram. So the loop that answers probes never spends a signature check on
//! a stranger, a flood of made-up signatures cannot delay the members' probes and acks behind
//! it, and what it costs is bounded however many sources it comes from.
//!
//! This module decides membership only; it routes nothing and trusts nothing a datagram says
//! before [`super::envelope::Opener`] has checked who sealed it.
//!
//! The files: `member` (who a member is, foca's settings), `versions` (the gossiped `NodeInfo`
//! versions, where each fetch stands), `inbox` (the signature checker and its queues, drop
//! counters), `run` ([`Membership`], the loop, liveness, the table's sync), `datagrams`
//! (screening, delivering, sending), `announce` (announces, mDNS adverts, the push-pull
//! repair) and `fetch` (our version raised, members' `NodeInfo` fetched).

mod announce;
mod datagrams;
mod fetch;
mod inbox;
mod member;
mod run;
mod versions;

pub use inbox::STRANGER_CHECKS_PER_SECOND;
pub(crate) use inbox::enlarge_receive_buffer;
pub use member::{Member, lan_config};
pub use run::{Membership, MembershipParts};
