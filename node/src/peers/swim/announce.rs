//! Finding members: announcing this node to where discovery points (static peers, mDNS
//! adverts through the [`AdvertGuard`], at most every [`ANNOUNCE_EVERY`] per address), and the
//! push-pull repair (a random member's list of members, announced to where it names members
//! this node lacks).

use std::{net::SocketAddr, time::Duration};

use mesh_domain::{NodeId, sync::MutexExt};
use rand::seq::IndexedRandom;
use tokio::time::Instant;

use super::{
    member::Member,
    run::{Listed, REPAIR_AGAIN, REPAIR_EVERY, Run},
};
#[cfg(doc)]
use crate::peers::adverts::AdvertGuard;
use crate::{
    discovery::{Claim, PeerSource},
    metrics::{labels, metrics},
    peers::adverts::Dropped,
};

/// The same address is announced to at most this often (static peers are offered every
/// second; an advert may repeat).
pub(super) const ANNOUNCE_EVERY: Duration = Duration::from_secs(2);
/// An mDNS advert's announce that brings no member of the advertised id within this long has
/// failed (it counts against the address, as a refused dial did).
pub(super) const ADVERT_ANSWER_WITHIN: Duration = Duration::from_secs(3);
/// Most addresses whose last announce is remembered.
pub(super) const MAX_ANNOUNCED: usize = 1024;
/// Most members announced to after one list (a member's list is not trusted to be short).
pub(super) const MAX_REPAIR_ANNOUNCES: usize = 256;

impl Run<'_> {
    /// A discovery event: announce to it, through [`AdvertGuard`] when it is an mDNS advert.
    pub(super) fn discovered(
        &mut self,
        addrs: Vec<String>,
        claim: Option<&Claim>,
        source: PeerSource,
    ) {
        if let Some(claim) = claim
            && (claim.id == self.foca.identity().id || self.alive(&claim.id))
        {
            return;
        }
        if source != PeerSource::Mdns {
            self.announce(&addrs, source);
            return;
        }
        // An advert always claims an id (`Mdns::seen`); one without is nothing to announce to.
        let Some(id) = claim.map(|c| c.id.clone()) else {
            return;
        };
        let now = std::time::Instant::now();
        let admitted = {
            let mut guard = self.parts.adverts.lock_unpoisoned();
            match guard.admit(&id, &addrs, now) {
                Ok(usable) => Ok(usable),
                Err(why) => {
                    metrics()
                        .adverts_dropped
                        .get_or_create(&labels(&[("reason", why.as_str())]))
                        .inc();
                    if why == Dropped::Cap
                        && let Some(dropped) = guard.note_cap_drop(now)
                    {
                        tracing::warn!(
                            dropped,
                            pending = guard.pending(),
                            "mDNS adverts dropped: as many advert dials as discovery.max_advert_dials allows are pending (a flood of adverts, or raise the limit for a LAN where that many nodes appear at once)"
                        );
                    }
                    Err(why)
                }
            }
        };
        let Ok(usable) = admitted else { return };
        let Some(addr) = usable.first().cloned() else {
            self.parts.adverts.lock_unpoisoned().release(&id);
            return;
        };
        self.advert_pending
            .insert(id, (addr.clone(), Instant::now() + ADVERT_ANSWER_WITHIN));
        self.announce(&[addr], source);
    }

    /// Advert announces whose member did not come within [`ADVERT_ANSWER_WITHIN`]: a failure
    /// of the address; the pending place is freed.
    pub(super) fn expire_adverts(&mut self) {
        let now = Instant::now();
        let expired: Vec<NodeId> = self
            .advert_pending
            .iter()
            .filter(|(_, (_, until))| *until <= now)
            .map(|(id, _)| id.clone())
            .collect();
        if expired.is_empty() {
            return;
        }
        let mut guard = self.parts.adverts.lock_unpoisoned();
        for id in expired {
            if let Some((addr, _)) = self.advert_pending.remove(&id) {
                guard.failed(&addr, now.into_std());
                guard.release(&id);
            }
        }
    }

    /// An advertised member came: the advert was true.
    pub(super) fn advert_answered(&mut self, id: &NodeId) {
        if let Some((addr, _)) = self.advert_pending.remove(id) {
            let mut guard = self.parts.adverts.lock_unpoisoned();
            guard.succeeded(&addr);
            guard.release(id);
        }
    }

    /// Announces to the first parseable address of a discovery event, at most every
    /// [`ANNOUNCE_EVERY`] per address, and not to an address of a live member.
    pub(super) fn announce(&mut self, addrs: &[String], source: PeerSource) {
        let Some(addr) = addrs.iter().find_map(|a| a.parse::<SocketAddr>().ok()) else {
            tracing::debug!(
                ?addrs,
                source = source.as_str(),
                "no IP address to announce to"
            );
            return;
        };
        if addr == self.foca.identity().addr
            || self.foca.iter_members().any(|m| m.id().addr == addr)
        {
            return;
        }
        let now = Instant::now();
        if self
            .announced
            .get(&addr)
            .is_some_and(|(at, _)| now.duration_since(*at) < ANNOUNCE_EVERY)
        {
            return;
        }
        if self.announced.len() >= MAX_ANNOUNCED {
            self.announced.clear();
        }
        self.announced.insert(addr, (now, source));
        tracing::debug!(%addr, source = source.as_str(), "announcing to a candidate member");
        if let Err(e) = self.foca.announce(Member::at(addr), &mut self.runtime) {
            tracing::debug!(error = %e, "announce");
        }
    }

    /// When due and none runs, asks one random live member for its members
    /// ([`REPAIR_EVERY`]).
    pub(super) fn repair_view(&mut self) {
        let now = Instant::now();
        if now < self.next_repair || !self.repair.is_empty() {
            return;
        }
        let members: Vec<Member> = self.foca.iter_members().map(|m| m.id().clone()).collect();
        let Some(member) = members.choose(&mut self.rng).cloned() else {
            return;
        };
        self.next_repair = now + REPAIR_EVERY;
        let link = self.parts.link.clone();
        self.repair
            .spawn(async move { link.members(&member.addr.to_string(), &member.id).await });
    }

    /// A member's list came: announce to the members in it this node does not know.
    pub(super) fn listed(&mut self, listed: Listed) {
        let members = match listed {
            Ok(members) => members,
            Err(e) => {
                tracing::debug!(error = %e, "list a member's members");
                self.next_repair = self.next_repair.min(Instant::now() + REPAIR_AGAIN);
                return;
            }
        };
        let own = self.foca.identity().id.clone();
        let unknown: Vec<String> = members
            .into_iter()
            .filter(|(id, _)| *id != own && !self.alive(id) && !self.parts.table.is_revoked(id))
            .map(|(_, addr)| addr)
            .take(MAX_REPAIR_ANNOUNCES)
            .collect();
        if !unknown.is_empty() {
            tracing::debug!(
                count = unknown.len(),
                "announcing to members gossip did not bring"
            );
            self.next_repair = self.next_repair.min(Instant::now() + REPAIR_AGAIN);
        }
        for addr in unknown {
            self.announce(&[addr], PeerSource::Exchange);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use mesh_domain::NodeInfo;
    use tokio::net::UdpSocket;

    use super::*;
    use crate::peers::{
        LinkError, PeerLink, PeerTable,
        adverts::AdvertGuard,
        envelope::{Opener, Sealer},
        swim::{
            member::lan_config,
            run::{Membership, MembershipParts},
        },
    };

    fn member(n: u8) -> Member {
        Member {
            id: NodeId::from_spki_der(&[n]),
            addr: SocketAddr::from(([127, 0, 0, 1], 7000 + u16::from(n))),
            bump: 1,
        }
    }

    /// A link that reaches nobody.
    #[derive(Debug)]
    struct NoLink;

    impl PeerLink for NoLink {
        fn info<'a>(
            &'a self,
            _: &'a str,
            _: &'a NodeId,
        ) -> mesh_domain::BoxFuture<'a, Result<NodeInfo, LinkError>> {
            Box::pin(async { Err(LinkError::Failed("no link".into())) })
        }

        fn members<'a>(
            &'a self,
            _: &'a str,
            _: &'a NodeId,
        ) -> mesh_domain::BoxFuture<'a, Result<Vec<(NodeId, String)>, LinkError>> {
            Box::pin(async { Err(LinkError::Failed("no link".into())) })
        }
    }

    /// Issue 17: the push-pull repair. A member's list makes the node announce itself to the
    /// members in it that it lacks, and to no one else (not itself, not a member it has).
    #[tokio::test]
    async fn a_members_list_makes_the_node_announce_to_the_members_it_lacks() {
        let signer = Arc::new(mesh_cert::OriginSigner::generate().expect("key"));
        let socket = Arc::new(UdpSocket::bind("127.0.0.1:0").await.expect("bind"));
        let own_addr = socket.local_addr().expect("addr");
        let membership = Membership::new(MembershipParts {
            own: Member {
                id: signer.id().clone(),
                addr: own_addr,
                bump: 1,
            },
            socket,
            sealer: Arc::new(Sealer::new(signer.clone())),
            opener: Arc::new(Opener::new(Arc::new(
                mesh_cert::OriginVerifier::self_certified(),
            ))),
            link: Arc::new(NoLink),
            table: Arc::new(PeerTable::default()),
            changes: tokio::sync::watch::channel(0).1,
            config: lan_config(),
            adverts: AdvertGuard::new(64, 64, Arc::new(tokio::sync::Notify::new())),
        });
        let mut run = membership.start();
        let known = member(1);
        run.foca
            .apply_many(
                std::iter::once(foca::Member::alive(known.clone())),
                true,
                &mut run.runtime,
            )
            .expect("apply");
        while run.runtime.to_send().is_some() {}
        let lacking = member(2);
        run.listed(Ok(vec![
            (signer.id().clone(), own_addr.to_string()),
            (known.id.clone(), known.addr.to_string()),
            (lacking.id.clone(), lacking.addr.to_string()),
        ]));
        let mut sent = Vec::new();
        while let Some((to, _)) = run.runtime.to_send() {
            sent.push(to.addr);
        }
        assert_eq!(sent, [lacking.addr], "announced to the lacking member only");
        assert!(
            run.next_repair <= Instant::now() + REPAIR_AGAIN,
            "a list that named a stranger is asked for again soon"
        );
    }
}
