//! Finding peers: where a node might be, never whether to trust it.
//!
//! A [`Discovery`] source emits [`DiscoveryEvent`]s: `Seen` (an address to dial, with the
//! identity it claims when the source knows one) and `Gone` (a peer said goodbye). Two sources
//! exist: [`Mdns`] (advertise `_agentmesh._tcp.local.` and browse for it) and [`StaticPeers`]
//! (addresses from config, re-offered periodically so a peer that starts later or restarts is
//! still found). The `peers` module dials what is seen and decides trust through TLS; this module
//! opens no gRPC connections and keeps no peer state.
//!
//! Adverts are unauthenticated, so the mDNS source never lets their number slow it down: an
//! advert names at most [`MAX_ADVERT_ADDRS`] addresses, an event that finds membership's queue
//! full is dropped (counted) rather than waited for, and when mdns-sd ends the browse because
//! its own queue overflowed (it does that when events come faster than they are read), the
//! source browses again, which also offers every advert in its cache once more. Browsing again
//! is also how adverts that membership dropped at its cap are offered again: membership
//! notifies `reoffer`, and the source browses again at most every [`REOFFER_INTERVAL`].

use std::{collections::HashMap, sync::Arc, time::Duration};

use mdns_sd::{IfKind, ServiceDaemon, ServiceEvent, ServiceInfo};
use mesh_domain::{BoxFuture, NodeId};
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

use crate::metrics::{labels, metrics};

/// The DNS-SD service type every node advertises.
pub(crate) const SERVICE_TYPE: &str = "_agentmesh._tcp.local.";
/// TXT records stay under this many bytes; the full picture comes from `GetInfo`.
pub(crate) const MAX_TXT_BYTES: usize = 400;
/// How often static peers are offered again to the dialer.
pub(crate) const STATIC_REOFFER_INTERVAL: Duration = Duration::from_secs(1);
/// Addresses taken from one advert (best first); an advert may list any number.
pub(crate) const MAX_ADVERT_ADDRS: usize = 4;
/// Wait before browsing again after mdns-sd ended a browse.
const REBROWSE_DELAY: Duration = Duration::from_secs(1);
/// At most one warning per this period that mdns-sd ended a browse.
const OVERFLOW_WARNING_INTERVAL: Duration = Duration::from_secs(60);
/// Adverts dropped by membership are offered again at most this often (each time is a fresh
/// browse: one query on the LAN, and every cached advert read again).
pub(crate) const REOFFER_INTERVAL: Duration = Duration::from_secs(3);

/// How a peer became known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PeerSource {
    /// An mDNS advertisement.
    Mdns,
    /// `discovery.static_peers`.
    Static,
    /// Another peer's `ListPeers`.
    Exchange,
    /// The peer dialed us and introduced itself.
    DialIn,
}

impl PeerSource {
    /// The wire/display name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Mdns => "mdns",
            Self::Static => "static",
            Self::Exchange => "exchange",
            Self::DialIn => "dial-in",
        }
    }
}

/// Who a discovered peer claims to be; checked against its certificate when dialed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The node id it advertises.
    pub id: NodeId,
    /// Certificate fingerprint it advertises (mDNS `fp`); `None` when the source has none.
    pub fingerprint: Option<String>,
}

/// Something a discovery source noticed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiscoveryEvent {
    /// A peer may be reachable at these `host:port` addresses (best first).
    Seen {
        /// Addresses to try in order.
        addrs: Vec<String>,
        /// Advertised name, if known.
        name: Option<String>,
        /// Advertised identity, if known.
        claim: Option<Claim>,
        /// Where this came from.
        source: PeerSource,
    },
    /// The peer advertised under `name` sent an mDNS goodbye.
    Gone {
        /// Instance (node) name.
        name: String,
    },
}

/// A source of peers. `run` emits events until `cancel` fires, then cleans up (for mDNS: sends
/// goodbye packets) before returning.
pub(crate) trait Discovery: Send + Sync + 'static {
    /// Short name for logs (`mdns`, `static`).
    fn name(&self) -> &'static str;
    /// Runs the source.
    fn run(
        self: Arc<Self>,
        events: mpsc::Sender<DiscoveryEvent>,
        cancel: CancellationToken,
    ) -> BoxFuture<'static, ()>;
}

/// Offers the configured static peers to the dialer at start and then every second.
#[derive(Debug, Clone)]
pub(crate) struct StaticPeers {
    peers: Vec<String>,
}

impl StaticPeers {
    /// `peers` are `host:port` strings, already validated by config.
    pub(crate) fn new(peers: Vec<String>) -> Self {
        Self { peers }
    }
}

impl Discovery for StaticPeers {
    fn name(&self) -> &'static str {
        "static"
    }

    fn run(
        self: Arc<Self>,
        events: mpsc::Sender<DiscoveryEvent>,
        cancel: CancellationToken,
    ) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            let mut tick = tokio::time::interval(STATIC_REOFFER_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = cancel.cancelled() => return,
                    _ = tick.tick() => {}
                }
                for addr in &self.peers {
                    let event = DiscoveryEvent::Seen {
                        addrs: vec![addr.clone()],
                        name: None,
                        claim: None,
                        source: PeerSource::Static,
                    };
                    if events.send(event).await.is_err() {
                        return;
                    }
                }
            }
        })
    }
}

/// What a node puts in its mDNS advertisement.
#[derive(Debug, Clone)]
pub(crate) struct Advert {
    /// Instance name (the node name).
    pub name: String,
    /// Node id.
    pub id: NodeId,
    /// The gRPC port actually bound.
    pub port: u16,
    /// Roles served.
    pub roles: Vec<String>,
    /// Number of GPUs.
    pub gpus: usize,
    /// Certificate fingerprint (empty in insecure mode).
    pub fingerprint: String,
}

impl Advert {
    /// TXT properties, with the role list cut so the record stays under [`MAX_TXT_BYTES`].
    pub(crate) fn txt(&self) -> Vec<(String, String)> {
        let fixed = [
            ("id".to_owned(), self.id.to_string()),
            ("v".to_owned(), mesh_proto::PROTOCOL_MAJOR.to_string()),
            ("gpu".to_owned(), self.gpus.to_string()),
            ("fp".to_owned(), self.fingerprint.clone()),
        ];
        // Each TXT string is a length byte + "key=value".
        let used: usize = fixed.iter().map(|(k, v)| 2 + k.len() + v.len()).sum();
        let budget = MAX_TXT_BYTES.saturating_sub(used + 2 + "roles".len());
        let mut roles = String::new();
        for role in &self.roles {
            let extra = role.len() + usize::from(!roles.is_empty());
            if roles.len() + extra > budget {
                break;
            }
            if !roles.is_empty() {
                roles.push(',');
            }
            roles.push_str(role);
        }
        let mut txt = fixed.to_vec();
        txt.push(("roles".into(), roles));
        txt
    }
}

/// mDNS advertisement and browsing through mdns-sd.
///
/// mdns-sd joins the multicast group on every up interface as soon as its daemon thread starts
/// (0.21 has no constructor that avoids it); `interfaces` only narrows what is used afterwards.
/// Tests and the demo therefore run mDNS only inside network namespaces they create.
pub(crate) struct Mdns {
    daemon: ServiceDaemon,
    advert: Advert,
    own_id: NodeId,
    reoffer: Arc<Notify>,
}

impl std::fmt::Debug for Mdns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mdns")
            .field("advert", &self.advert)
            .finish_non_exhaustive()
    }
}

impl Mdns {
    /// Starts the mDNS daemon, restricted to `interfaces` when not empty. `reoffer` is notified
    /// by membership when it dropped adverts it wants offered again.
    pub(crate) fn new(
        advert: Advert,
        interfaces: &[String],
        reoffer: Arc<Notify>,
    ) -> Result<Self, mdns_sd::Error> {
        let daemon = ServiceDaemon::new()?;
        if !interfaces.is_empty() {
            daemon.disable_interface(IfKind::All)?;
            for name in interfaces {
                daemon.enable_interface(IfKind::Name(name.clone()))?;
            }
        }
        let own_id = advert.id.clone();
        Ok(Self {
            daemon,
            advert,
            own_id,
            reoffer,
        })
    }

    fn register(&self) -> Result<String, mdns_sd::Error> {
        let host = format!("{}.local.", self.advert.name);
        let txt: HashMap<String, String> = self.advert.txt().into_iter().collect();
        let info = ServiceInfo::new(
            SERVICE_TYPE,
            &self.advert.name,
            &host,
            "",
            self.advert.port,
            txt,
        )?
        .enable_addr_auto();
        let fullname = info.get_fullname().to_owned();
        self.daemon.register(info)?;
        Ok(fullname)
    }

    /// Turns a resolved service into a `Seen` event, or `None` for ourselves, another protocol
    /// major, or a malformed advert.
    fn seen(&self, service: &mdns_sd::ResolvedService) -> Option<DiscoveryEvent> {
        let version = service.get_property_val_str("v")?;
        if version != mesh_proto::PROTOCOL_MAJOR.to_string() {
            tracing::debug!(fullname = %service.fullname, version, "ignoring advert of another protocol major");
            return None;
        }
        let id = match service.get_property_val_str("id").map(NodeId::parse) {
            Some(Ok(id)) => id,
            _ => {
                tracing::warn!(fullname = %service.fullname, "ignoring mDNS advert without a valid `id`");
                return None;
            }
        };
        if id == self.own_id {
            return None;
        }
        let fingerprint = service
            .get_property_val_str("fp")
            .filter(|fp| !fp.is_empty())
            .map(str::to_owned);
        let mut ips: Vec<std::net::IpAddr> = service
            .get_addresses()
            .iter()
            .map(|ip| ip.to_ip_addr())
            .collect();
        // IPv4 first, then IPv6 without link-local scope trouble; loopback last unless alone.
        ips.sort_by_key(|ip| (ip.is_loopback(), ip.is_ipv6(), *ip));
        let addrs: Vec<String> = ips
            .iter()
            .take(MAX_ADVERT_ADDRS)
            .map(|ip| std::net::SocketAddr::new(*ip, service.get_port()).to_string())
            .collect();
        if addrs.is_empty() {
            return None;
        }
        Some(DiscoveryEvent::Seen {
            addrs,
            name: Some(instance_name(&service.fullname)),
            claim: Some(Claim { id, fingerprint }),
            source: PeerSource::Mdns,
        })
    }

    /// Browses until `cancel` or until membership is gone, browsing again whenever mdns-sd ends
    /// the browse (its queue overflowed in a flood of adverts) and when membership asks for its
    /// dropped adverts again (at most every [`REOFFER_INTERVAL`]).
    async fn browse(&self, events: &mpsc::Sender<DiscoveryEvent>, cancel: &CancellationToken) {
        let mut last_warning: Option<tokio::time::Instant> = None;
        loop {
            let browsed = tokio::time::Instant::now();
            let mut reoffer = false;
            let receiver = match self.daemon.browse(SERVICE_TYPE) {
                Ok(receiver) => receiver,
                Err(e) => {
                    tracing::error!(error = %e, "mdns: browse failed; only static peers will be found");
                    cancel.cancelled().await;
                    return;
                }
            };
            loop {
                let event = tokio::select! {
                    () = cancel.cancelled() => return,
                    () = self.reoffer.notified(), if !reoffer => {
                        reoffer = true;
                        continue;
                    }
                    () = tokio::time::sleep_until(browsed + REOFFER_INTERVAL), if reoffer => break,
                    event = receiver.recv_async() => match event {
                        Ok(event) => event,
                        Err(_) => break,
                    },
                };
                let out = match event {
                    ServiceEvent::ServiceResolved(service) => self.seen(&service),
                    ServiceEvent::ServiceRemoved(_, fullname) => Some(DiscoveryEvent::Gone {
                        name: instance_name(&fullname),
                    }),
                    _ => None,
                };
                let Some(out) = out else { continue };
                // Waiting here would let mdns-sd's queue overflow, which ends the browse.
                match events.try_send(out) {
                    Ok(()) => {}
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        metrics()
                            .adverts_dropped
                            .get_or_create(&labels(&[("reason", "queue_full")]))
                            .inc();
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => return,
                }
            }
            if reoffer {
                tracing::debug!("mdns: offering the cached adverts again");
            } else if last_warning.is_none_or(|at| at.elapsed() >= OVERFLOW_WARNING_INTERVAL) {
                // A flood may end every browse; one warning a minute says so.
                last_warning = Some(tokio::time::Instant::now());
                tracing::warn!(
                    "mdns: the browse ended (adverts came faster than they were read); browsing again"
                );
            } else {
                tracing::debug!("mdns: the browse ended again; browsing again");
            }
            // However often it ends or is asked for, a browse (a query on the LAN, and the whole
            // cache read again) is repeated at most every REBROWSE_DELAY.
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep_until(browsed + REBROWSE_DELAY) => {}
            }
        }
    }
}

impl Discovery for Mdns {
    fn name(&self) -> &'static str {
        "mdns"
    }

    fn run(
        self: Arc<Self>,
        events: mpsc::Sender<DiscoveryEvent>,
        cancel: CancellationToken,
    ) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            let fullname = match self.register() {
                Ok(fullname) => Some(fullname),
                Err(e) => {
                    tracing::error!(error = %e, "mdns: advertise failed; peers can still dial this node");
                    None
                }
            };
            self.browse(&events, &cancel).await;

            // Goodbye: unregister sends the TTL=0 announcement peers act on.
            if let Some(fullname) = fullname
                && let Ok(done) = self.daemon.unregister(&fullname)
            {
                let _ = tokio::time::timeout(Duration::from_secs(1), done.recv_async()).await;
            }
            if let Ok(done) = self.daemon.shutdown() {
                let _ = tokio::time::timeout(Duration::from_secs(1), done.recv_async()).await;
            }
        })
    }
}

/// `alpha._agentmesh._tcp.local.` → `alpha`.
fn instance_name(fullname: &str) -> String {
    fullname
        .strip_suffix(SERVICE_TYPE)
        .map(|s| s.trim_end_matches('.'))
        .unwrap_or(fullname)
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn advert(roles: Vec<String>) -> Advert {
        Advert {
            name: "alpha".into(),
            id: NodeId::from_spki_der(b"key"),
            port: 7700,
            roles,
            gpus: 2,
            fingerprint: "f".repeat(64),
        }
    }

    #[test]
    fn txt_has_the_contract_keys() {
        let txt: HashMap<_, _> = advert(vec!["coder".into(), "chat".into()])
            .txt()
            .into_iter()
            .collect();
        assert_eq!(txt["v"], "1");
        assert_eq!(txt["gpu"], "2");
        assert_eq!(txt["roles"], "coder,chat");
        assert_eq!(txt["id"].len(), 64);
        assert_eq!(txt["fp"].len(), 64);
    }

    #[test]
    fn txt_stays_under_the_limit_however_many_roles() {
        let roles = (0..100).map(|i| format!("role-number-{i}")).collect();
        let txt = advert(roles).txt();
        let size: usize = txt.iter().map(|(k, v)| 2 + k.len() + v.len()).sum();
        assert!(size <= MAX_TXT_BYTES, "{size}");
        let roles = &txt.iter().find(|(k, _)| k == "roles").expect("roles").1;
        assert!(roles.starts_with("role-number-0,role-number-1"));
        assert!(!roles.ends_with(','));
    }

    #[test]
    fn instance_names_are_cut_from_full_names() {
        assert_eq!(instance_name("alpha._agentmesh._tcp.local."), "alpha");
        assert_eq!(instance_name("odd"), "odd");
    }
}
