//! The loop's datagrams: a received one is screened without cryptography and queued for its
//! signature check, or dropped and counted; a checked one is handed to foca if it speaks for
//! its sealer; ours are sealed and sent.

use std::net::SocketAddr;

use foca::{Codec, PostcardCodec};
use tokio::time::Instant;

#[cfg(doc)]
use super::inbox::DROP_LOG_EVERY;
use super::{
    inbox::{Checked, Job},
    member::Member,
    run::Run,
};
#[cfg(doc)]
use crate::peers::budget::FailingSources;
use crate::peers::envelope::Refusal;

/// What a node logs the first time it hears `name` at `from`, a node of another mesh. A node
/// with members is in a fleet, so the stranger is the one to bring in. A node alone in its
/// mesh may be the stray itself (a device started without `--join` makes a CA of its own), so
/// it says first how *it* joins the other mesh, then the way round.
pub(super) fn foreign_hint(name: &str, from: SocketAddr, alone: bool) -> String {
    let other = format!(
        "`{name}` at {from} belongs to another mesh (its certificate is not from this mesh's CA)"
    );
    let bring_in = format!(
        "to bring `{name}` in, run `mesh-cli token create --role node` where this mesh's CA key is and start `{name}` with `mesh-node --join TOKEN`"
    );
    if alone {
        format!(
            "{other}, and this node is alone in a mesh of its own (a device started without --join makes its own CA). If this device belongs to `{name}`'s mesh: run `mesh-cli token create --role node` on that mesh's issuer, stop this node, move its data dir's `tls` directory aside, and start it with `mesh-node --join TOKEN`. Or, {bring_in}"
        )
    } else {
        format!("{other}; {bring_in}")
    }
}

impl Run<'_> {
    /// Screens a received datagram without cryptography and queues it for its signature check
    /// (a live member's in the members' queue), or drops it and counts why.
    pub(super) fn screen(&mut self, datagram: &[u8], from: SocketAddr) {
        let known = match self.parts.opener.screen(datagram) {
            Ok(known) => known,
            Err(refusal) => return self.refused(&refusal, from, true),
        };
        let now = Instant::now().into_std();
        if !self.failing.admits(from, now) {
            return self.drop_unchecked("throttled", from);
        }
        let member = known.is_some_and(|id| {
            self.foca
                .iter_members()
                .any(|m| m.id().addr == from && m.id().id == id)
        });
        let queue = if member {
            &self.to_check.members
        } else if self.stranger_checks.take(now) {
            &self.to_check.strangers
        } else {
            return self.drop_unchecked("busy", from);
        };
        let job = Job {
            datagram: datagram.into(),
            from,
        };
        if queue.try_send(job).is_err() {
            self.drop_unchecked("busy", from);
        }
    }

    /// A datagram dropped before its signature check for want of room (`busy`) or because its
    /// source fails too often (`throttled`).
    pub(super) fn drop_unchecked(&mut self, reason: &'static str, from: SocketAddr) {
        self.drops.inc(reason);
        if let Some(count) = self.drop_log.note(std::time::Instant::now()) {
            tracing::debug!(reason, %from, count, "membership datagrams dropped unchecked");
        }
    }

    /// Counts a refused datagram against its source and names a node of another mesh once.
    /// `screened`: refused by the screen, at no cost, so possibly at a flood's rate: logged at
    /// most every [`DROP_LOG_EVERY`]; one refused after its check is logged each time (a source
    /// gets few checks: [`FailingSources`]).
    pub(super) fn refused(&mut self, refusal: &Refusal, from: SocketAddr, screened: bool) {
        self.drops.inc(refusal.reason());
        self.failing.failed(from, Instant::now().into_std());
        if let Refusal::Foreign { name, fingerprint } = refusal
            && self.foreign.first_meeting(name, fingerprint)
        {
            let alone = self.parts.table.up_peers().is_empty();
            tracing::warn!(
                node = name.as_str(),
                addr = %from,
                "{}",
                foreign_hint(name, from, alone)
            );
        }
        if !screened {
            tracing::debug!(%refusal, %from, "membership datagram dropped");
        } else if let Some(count) = self.drop_log.note(std::time::Instant::now()) {
            tracing::debug!(%refusal, %from, count, "membership datagrams dropped by the screen");
        }
    }

    /// A checked datagram: handed to foca if it opened and speaks for its sealer.
    pub(super) fn deliver(&mut self, checked: Checked) {
        let (sender, payload) = match checked.result {
            Ok(opened) => opened,
            Err(refusal) => return self.refused(&refusal, checked.from, false),
        };
        // The message must speak for its sealer: nobody announces, acks or leaves as another.
        let header: Result<foca::Header<Member>, _> =
            PostcardCodec.decode_header(payload.as_slice());
        let failed = match header {
            Ok(header) if header.src.id == sender => None,
            Ok(_) => {
                tracing::debug!(sender = %sender.short(), "membership datagram names another node as its source");
                Some("impersonation")
            }
            Err(_) => Some("malformed"),
        };
        if let Some(reason) = failed {
            self.drops.inc(reason);
            self.failing.failed(checked.from, Instant::now().into_std());
            return;
        }
        if self.parts.table.is_revoked(&sender) {
            self.drops.inc("revoked");
            return;
        }
        self.parts.table.heard(&sender);
        if let Err(e) = self.foca.handle_data(payload.as_slice(), &mut self.runtime) {
            tracing::debug!(error = %e, "membership message");
        }
    }

    pub(super) async fn send(&self, addr: SocketAddr, payload: &[u8]) {
        let datagram = match self.parts.sealer.seal(payload) {
            Ok(datagram) => datagram,
            Err(e) => {
                tracing::warn!(error = %e, "seal membership datagram");
                return;
            }
        };
        if let Err(e) = self.parts.socket.send_to(&datagram, addr).await {
            tracing::debug!(%addr, error = %e, "send membership datagram");
        }
    }
}
