//! Identity: who the node is (its TLS material, name and id, the signer of its records and the
//! verifier of its peers'), whether it is an issuer of join tokens, which certificates operate
//! it, and what revocations mean for it and its peers.

use std::{net::SocketAddr, path::Path, sync::Arc, time::Duration};

use mesh_cert::{
    CertIdentity, CertRole, OriginSigner, OriginVerifier, RevokedSet, TlsError,
    ca::{self, CaSigner},
    origin,
};
use mesh_domain::{HealthStatus, NodeId, PeerState};
use mesh_join::bootstrap;
use mesh_tls::{Dialer, MeshTls, TlsFiles};
use tokio_util::sync::CancellationToken;

use super::{error::StartError, loops::Loops};
use crate::{
    capabilities::Capabilities,
    config::{Config, TlsMode},
    issuer::Issuer,
    memory::Memory,
    peers::PeerTable,
    storage::{SledStore, Store},
    supervise::no_error,
};

/// Who this node is: what step 2 of start-up loads.
#[derive(Debug)]
pub(super) struct NodeIdentity {
    /// Its mTLS material; `None` with `--insecure`.
    pub(super) tls: Option<MeshTls>,
    pub(super) id: NodeId,
    /// Signs this node's records (its certificate's key).
    pub(super) signer: Arc<OriginSigner>,
    /// Verifies its peers' records (the same CA).
    pub(super) verifier: Arc<OriginVerifier>,
    /// Its certificate's fingerprint, advertised over mDNS (empty without TLS).
    pub(super) fingerprint: String,
    /// The CA it signs join-token certificates with, if it is an issuer (taken by [`issuer`]).
    issuer_ca: Option<CaSigner>,
    /// The gRPC server's side of mTLS; an issuer's also lets a caller without a certificate
    /// through, for `Join` (the certificate gate refuses it everything else).
    pub(super) server_tls: Option<Arc<rustls::ServerConfig>>,
    /// Dials peers with this node's certificate (plain TCP with `--insecure`).
    pub(super) dialer: Dialer,
}

impl NodeIdentity {
    /// Whether the node runs with mTLS (not `--insecure`).
    pub(super) fn secure(&self) -> bool {
        self.tls.is_some()
    }

    /// When its certificate expires (seconds since the epoch), if it has one.
    pub(super) fn not_after(&self) -> Option<i64> {
        self.tls.as_ref().map(|tls| tls.identity().not_after)
    }
}

/// Loads the node's identity as `config.tls` says: mTLS files, the zero-config CA in the data
/// dir (created on first start), or `--insecure`'s stable key. The node takes its
/// certificate's name (`config.name` is set to it).
pub(super) fn load(config: &mut Config, addr: SocketAddr) -> Result<NodeIdentity, StartError> {
    let (tls, signer, verifier, fingerprint) = match &config.tls {
        TlsMode::Insecure => {
            tracing::warn!(
                "--insecure: plain TCP, no authentication; anyone who can reach {addr} can use this node"
            );
            (
                None,
                origin::insecure_identity(&config.data_dir)?,
                OriginVerifier::self_certified(),
                String::new(),
            )
        }
        TlsMode::Mtls(files) => load_tls(files)?,
        TlsMode::Bootstrap => load_tls(&bootstrap_tls(&config.data_dir, &config.name)?)?,
    };
    if let Some(tls) = &tls {
        config.name = node_name(config, tls.identity())?;
    }
    let id = signer.id().clone();
    let issuer_ca = issuer_ca(config)?;
    // The handshake refuses a revoked certificate.
    let server_tls = match &tls {
        Some(tls) => Some(tls.server_config(issuer_ca.is_some())?),
        None => None,
    };
    let dialer = match &tls {
        Some(tls) => tls.dialer(),
        None => Dialer::Plain,
    };
    Ok(NodeIdentity {
        tls,
        id,
        signer: Arc::new(signer),
        verifier: Arc::new(verifier),
        fingerprint,
        issuer_ca,
        server_tls,
        dialer,
    })
}

/// The issuer of join tokens, on a node that holds its CA's key (it serves `Join`).
pub(super) fn issuer(
    identity: &mut NodeIdentity,
    store: &Arc<SledStore>,
    peers: &Arc<PeerTable>,
) -> Option<Arc<Issuer>> {
    identity.issuer_ca.take().map(|ca| {
        tracing::info!("this node is an issuer: add a device with `mesh-cli token create`, then `mesh-node --join TOKEN` on it");
        let store: Arc<dyn Store> = store.clone();
        Arc::new(Issuer::new(ca, store, peers.clone()))
    })
}

/// The ids of the certificates that operate this node, read again at each call.
///
/// The client certificates of this node's own machine are its operators (they may change its
/// settings and the fleet's front-door keys); there are none without TLS. Read again at each
/// decision: `mesh-cli join` on this machine after the node started makes an operator at once.
pub(super) fn operators(
    config: &Config,
    identity: &NodeIdentity,
) -> impl Fn() -> Vec<NodeId> + Send + Sync + 'static {
    let operators = match &identity.tls {
        Some(_) => bootstrap::operator_certificates(&config.data_dir),
        None => Vec::new(),
    };
    for operator in &operators {
        tracing::info!(
            operator = operator.common_name.as_deref().unwrap_or_default(),
            id = %operator.id.short(),
            "this machine's client certificate operates this node: it may change its settings (mesh-cli config) and the fleet's front-door keys"
        );
    }
    let operators_of = identity.secure().then(|| config.data_dir.clone());
    move || {
        operators_of.as_deref().map_or_else(Vec::new, |data_dir| {
            bootstrap::operator_certificates(data_dir)
                .into_iter()
                .map(|o| o.id)
                .collect()
        })
    }
}

/// Spawns `revocations`: a peer whose certificate is revoked (loaded at start, or learned from
/// any path) leaves the table's live rows at once; its session ends at its next beat.
pub(super) fn watch_revocations(
    identity: &NodeIdentity,
    caps: &Arc<Capabilities>,
    peers: &Arc<PeerTable>,
    static_peers: &[String],
    memory: &Memory,
    loops: &mut Loops,
) {
    let (revoked, peers, caps) = (memory.revoked().clone(), peers.clone(), caps.clone());
    let probe = Arc::new(RevocationProbe {
        dialer: identity.dialer.clone(),
        addrs: static_peers.to_vec(),
    });
    loops
        .supervisor
        .spawn("revocations", loops.background.clone(), move |cancel| {
            no_error(follow_revocations(
                revoked.clone(),
                peers.clone(),
                caps.clone(),
                probe.clone(),
                cancel,
            ))
        });
}

/// The CA this node signs join-token certificates with, if it is an issuer: `tls.ca_key` with
/// the configured CA, or a zero-config node's own CA when its key is in the data dir.
fn issuer_ca(config: &Config) -> Result<Option<CaSigner>, StartError> {
    let (ca, key) = match (&config.tls, &config.ca_key) {
        (TlsMode::Mtls(files), Some(key)) => (files.ca.clone(), key.clone()),
        (TlsMode::Bootstrap, _) => (
            bootstrap::tls_dir(&config.data_dir).join(ca::CA_CERT_FILE),
            bootstrap::ca_key(&config.data_dir),
        ),
        _ => return Ok(None),
    };
    if config.tls == TlsMode::Bootstrap && !key.exists() {
        // A node that joined with a token holds no CA key.
        return Ok(None);
    }
    Ok(Some(CaSigner::load(&ca, &key)?))
}

/// The node's TLS material, the signer of its records (its certificate's key) and the verifier
/// of peers' records (the same CA), and its certificate's fingerprint.
type Identity = (Option<MeshTls>, OriginSigner, OriginVerifier, String);

fn load_tls(files: &TlsFiles) -> Result<Identity, StartError> {
    let tls = MeshTls::load(files)?;
    match tls.identity().role {
        Some(CertRole::Node) => {}
        Some(CertRole::Client) => {
            return Err(StartError::ClientCertificate(files.cert.clone()));
        }
        None => tracing::warn!(
            cert = %files.cert.display(),
            "this node's certificate carries no role (issued before roles existed): peers trust it \
             least; issue a new one with `mesh-cli ca issue --role node`"
        ),
    }
    let signer = tls.origin_signer().map_err(|e| TlsError::KeyMismatch {
        path: files.key.clone(),
        reason: e.to_string(),
    })?;
    let verifier = tls.origin_verifier()?;
    let fingerprint = tls.identity().fingerprint.clone();
    Ok((Some(tls), signer, verifier, fingerprint))
}

/// The name this node runs under: the one its certificate was issued for, which is what its
/// peers check its `NodeInfo` against. A host name that differs gives way to it (logged); a
/// name the user gave (`node.name`, `--name`) that differs is an error naming both fixes.
fn node_name(config: &Config, certificate: &CertIdentity) -> Result<String, StartError> {
    let Some(issued) = certificate.common_name.as_deref() else {
        return Err(StartError::CertificateName {
            problem: "names no node (it has no common name)".into(),
        });
    };
    if !crate::config::is_valid_node_name(issued) {
        return Err(StartError::CertificateName {
            problem: format!(
                "is issued to `{issued}`, which is not a valid node name (1-63 ASCII letters, digits, `-` or `_`)"
            ),
        });
    }
    if issued == config.name {
        return Ok(config.name.clone());
    }
    if config.name_from_host {
        tracing::info!(
            host = %config.name,
            name = issued,
            "this node runs as `{issued}`, the name its certificate was issued for, not as its host name `{}`; set node.name to say so and silence this",
            config.name
        );
        return Ok(issued.to_owned());
    }
    Err(StartError::NameNotCertificates {
        name: config.name.clone(),
        issued: issued.to_owned(),
        file: config.source.as_ref().map_or_else(
            || "no config file".into(),
            |path| path.display().to_string(),
        ),
    })
}

/// Zero-config TLS: a CA of this node's own under `<data_dir>/tls`, created on first start with
/// a certificate for the node and one for the local `mesh-cli`.
fn bootstrap_tls(data_dir: &Path, name: &str) -> Result<TlsFiles, StartError> {
    let (files, created) = bootstrap::bootstrap(data_dir, name)?;
    if created {
        let dir = bootstrap::tls_dir(data_dir);
        tracing::info!(dir = %dir.display(), "created a new mesh CA for this node; to add a device, run `mesh-cli token create` here and `mesh-node --join TOKEN` there");
    }
    Ok(files)
}

/// What a node whose own certificate was revoked says, in its health (`certificate: …`) and
/// its log.
pub const OWN_CERTIFICATE_REVOKED: &str = "this node's certificate was revoked by the mesh CA, so the fleet refuses it; to rejoin, run `mesh-cli token create` where the CA key is and restart this node with `mesh-node --join TOKEN`";

/// How often a node with no peer up asks the nodes it dials at start whether they refuse its
/// certificate as revoked.
const REVOCATION_PROBE_INTERVAL: Duration = Duration::from_secs(10);

/// Most of those nodes asked in one round.
const REVOCATION_PROBES: usize = 4;

/// Where a node that hears from nobody asks whether its certificate was revoked: the static
/// peers and the issuer it joined with (a revoked node's datagrams are dropped in silence,
/// but a TLS handshake is refused with `certificate_revoked`).
struct RevocationProbe {
    dialer: Dialer,
    addrs: Vec<String>,
}

impl RevocationProbe {
    /// The first address whose node refuses this node's certificate as revoked.
    async fn refused_at(&self) -> Option<&str> {
        for addr in self.addrs.iter().take(REVOCATION_PROBES) {
            if self.dialer.certificate_refusal(addr).await
                == Some(mesh_tls::CertificateRefusal::Revoked)
            {
                return Some(addr);
            }
        }
        None
    }
}

/// Marks every revoked certificate's peer row `revoked`, now and after every new revocation;
/// and finds out whether this node's own certificate was revoked, from a revocation it holds
/// or, while no peer is up, from `probe`. A revoked node is `unhealthy` and says so once.
async fn follow_revocations(
    revoked: RevokedSet,
    peers: Arc<PeerTable>,
    caps: Arc<Capabilities>,
    probe: Arc<RevocationProbe>,
    stop: CancellationToken,
) {
    let mut changed = revoked.subscribe();
    let mut tick = tokio::time::interval(REVOCATION_PROBE_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut own_revoked = false;
    let learn = |how: &str| {
        tracing::warn!(how, "{OWN_CERTIFICATE_REVOKED}");
        caps.set_check(
            "certificate",
            Some((HealthStatus::Unhealthy, OWN_CERTIFICATE_REVOKED.to_owned())),
        );
        true
    };
    loop {
        for revocation in revoked.list() {
            peers.revoke(&revocation.id);
        }
        if !own_revoked && revoked.contains(caps.id()) {
            own_revoked = learn("a revocation signed by the mesh CA reached this node");
        }
        tokio::select! {
            () = stop.cancelled() => return,
            result = changed.changed() => if result.is_err() { return },
            _ = tick.tick() => {
                let alone = !peers.snapshot().iter().any(|p| p.state == PeerState::Up);
                if !own_revoked && alone && let Some(addr) = probe.refused_at().await {
                    own_revoked = learn(&format!("{addr} refuses this node's certificate as revoked"));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Overrides;

    /// A config naming the node `name` (`None`: no name given, the host's), and a certificate
    /// issued to `issued`.
    fn named(name: Option<&str>, issued: Option<&str>) -> (Config, CertIdentity) {
        let file = std::path::Path::new("node.toml");
        let text = name.map_or_else(String::new, |n| format!("[node]\nname = \"{n}\"\n"));
        let config = crate::config::RawConfig::parse(&text, file)
            .expect("parse")
            .validate(Some(file), &Overrides::default())
            .expect("valid");
        let certificate = CertIdentity {
            id: NodeId::from_spki_der(b"key"),
            fingerprint: String::new(),
            common_name: issued.map(str::to_owned),
            role: Some(CertRole::Node),
            not_before: 0,
            not_after: 0,
        };
        (config, certificate)
    }

    /// Issue 26: a node runs under its certificate's name. A host name gives way to it; a name
    /// the user gave that differs stops the start, naming both and the fixes.
    #[test]
    fn a_node_runs_under_its_certificates_name() {
        let (config, cert) = named(Some("alpha"), Some("alpha"));
        assert_eq!(node_name(&config, &cert).expect("the same"), "alpha");

        let (config, cert) = named(None, Some("alpha"));
        assert!(config.name_from_host);
        assert_eq!(
            node_name(&config, &cert).expect("the host's gives way"),
            "alpha"
        );

        let (config, cert) = named(Some("a"), Some("evil"));
        let refused = node_name(&config, &cert).expect_err("given, and not the certificate's");
        let message = refused.to_string();
        for part in [
            "named `a`",
            "node.toml",
            "issued to `evil`",
            "name = \"evil\"",
            "mesh-cli ca issue --role node --name a",
            "mesh-node --join TOKEN",
        ] {
            assert!(message.contains(part), "`{part}` missing: {message}");
        }

        let (config, cert) = named(None, None);
        let message = node_name(&config, &cert).expect_err("no name").to_string();
        assert!(message.contains("names no node"), "{message}");
        let (config, cert) = named(None, Some("gpu.lan"));
        let message = node_name(&config, &cert)
            .expect_err("not a node name")
            .to_string();
        assert!(
            message.contains("`gpu.lan`, which is not a valid node name"),
            "{message}"
        );
    }
}
