//! Only members of the mesh CA get in: clients and nodes with a certificate from another CA, or
//! with none, are refused by the server (the RPC fails; with TLS 1.3 the TCP+TLS connect itself
//! may still succeed on the client side).

use std::{sync::Arc, time::Duration};

use mesh_node::{
    rpc::PeerClient,
    tls::{self, Dialer, TlsFiles},
};
use mesh_tests::{Harness, NodeOptions, wait_for};
use rustls::{
    ClientConfig, RootCertStore,
    crypto::ring,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
};

fn certs(path: &std::path::Path) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_file_iter(path)
        .expect("pem")
        .collect::<Result<_, _>>()
        .expect("certs")
}

/// A client that trusts our CA (so it accepts the server) but presents `identity`, or nothing.
fn client(ca: &std::path::Path, identity: Option<&TlsFiles>) -> Dialer {
    let mut roots = RootCertStore::empty();
    for cert in certs(ca) {
        roots.add(cert).expect("root");
    }
    let builder = ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots);
    let mut config = match identity {
        Some(files) => builder
            .with_client_auth_cert(
                certs(&files.cert),
                PrivateKeyDer::from_pem_file(&files.key).expect("key"),
            )
            .expect("client cert"),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Dialer::Tls(Arc::new(config))
}

async fn list_peers(dialer: &Dialer, addr: &str) -> anyhow::Result<usize> {
    let connection = dialer.connect(addr).await?;
    let fleet = PeerClient::new(connection.channel).list_peers().await?;
    Ok(fleet.peers.len())
}

fn foreign_identity(harness: &Harness, name: &str) -> TlsFiles {
    let dir = harness.path().join("foreign-ca");
    if !dir.join(tls::CA_CERT_FILE).exists() {
        tls::ca_init(&dir).expect("foreign ca");
    }
    let (cert, key) = tls::issue(&dir, name, &[]).expect("foreign cert");
    TlsFiles {
        ca: dir.join(tls::CA_CERT_FILE),
        cert,
        key,
    }
}

#[tokio::test]
async fn clients_from_another_ca_or_without_a_certificate_are_refused() {
    let harness = Harness::new().expect("harness");
    let node = harness.spawn(NodeOptions::new("alpha")).expect("alpha");
    let ca = harness.client_files().ca.clone();

    // The control: our own client certificate works through the same code path.
    let member = harness.issue("member").expect("member cert");
    let ok = list_peers(&client(&ca, Some(&member)), &node.addr).await;
    assert!(ok.is_ok(), "a mesh member is served: {ok:?}");

    let foreign = foreign_identity(&harness, "mallory");
    let refused = list_peers(&client(&ca, Some(&foreign)), &node.addr).await;
    assert!(
        refused.is_err(),
        "a certificate from another CA must be refused"
    );

    let anonymous = list_peers(&client(&ca, None), &node.addr).await;
    assert!(
        anonymous.is_err(),
        "a client without a certificate must be refused"
    );
}

#[test]
fn a_node_from_another_ca_never_joins_the_fleet() {
    let harness = Harness::new().expect("harness");
    let alpha = harness.spawn(NodeOptions::new("alpha")).expect("alpha");
    let mut options = NodeOptions::new("mallory").peer(&alpha.addr);
    options.tls = Some(foreign_identity(&harness, "mallory"));
    let mallory = harness
        .spawn(options)
        .expect("mallory starts with its own CA");

    // Wait until mallory has really tried (and failed) to dial alpha, then look at both tables.
    wait_for("mallory's failed dial", Duration::from_secs(15), || {
        mallory.log_text().contains("dial peer").then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", mallory.log_text()));
    let names = |status: serde_json::Value| -> Vec<String> {
        status["nodes"]
            .as_array()
            .expect("nodes")
            .iter()
            .filter_map(|n| n["name"].as_str().map(str::to_owned))
            .collect()
    };
    assert_eq!(names(harness.status(&alpha).expect("status")), ["alpha"]);
    // mesh-cli with our CA cannot even talk to mallory: its server certificate is foreign too.
    assert!(harness.status(&mallory).is_err());
}
