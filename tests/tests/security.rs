//! Only members of the mesh CA get in: clients and nodes with a certificate from another CA, an
//! expired certificate, or none, are refused by the server (the RPC fails; with TLS 1.3 the
//! TCP+TLS connect itself may still succeed on the client side). Oversized requests and
//! strings are refused with the limit, and the node goes on serving.

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

/// A certificate signed by our own CA whose validity ended yesterday.
fn expired_identity(harness: &Harness) -> TlsFiles {
    let ca_dir = harness.ca_dir();
    let ca_pem = std::fs::read_to_string(ca_dir.join(tls::CA_CERT_FILE)).expect("ca pem");
    let ca_key = rcgen::KeyPair::from_pem(
        &std::fs::read_to_string(ca_dir.join(tls::CA_KEY_FILE)).expect("ca key"),
    )
    .expect("ca key pem");
    let issuer = rcgen::Issuer::from_ca_cert_pem(&ca_pem, ca_key).expect("issuer");
    let mut params = rcgen::CertificateParams::new(vec!["stale".to_owned()]).expect("params");
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::days(30);
    params.not_after = now - time::Duration::days(1);
    params.extended_key_usages = vec![
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = params.signed_by(&key, &issuer).expect("sign");
    let dir = harness.path().join("expired");
    std::fs::create_dir_all(&dir).expect("dir");
    let files = TlsFiles {
        ca: ca_dir.join(tls::CA_CERT_FILE),
        cert: dir.join("stale.pem"),
        key: dir.join("stale.key"),
    };
    std::fs::write(&files.cert, cert.pem()).expect("cert");
    std::fs::write(&files.key, key.serialize_pem()).expect("key");
    files
}

#[tokio::test]
async fn a_client_whose_certificate_expired_is_refused() {
    let harness = Harness::new().expect("harness");
    let node = harness.spawn(NodeOptions::new("alpha")).expect("alpha");
    let ca = harness.client_files().ca.clone();
    let expired = expired_identity(&harness);
    let refused = list_peers(&client(&ca, Some(&expired)), &node.addr).await;
    assert!(
        refused.is_err(),
        "an expired certificate, even from our CA, must be refused"
    );
    // The control: a current certificate from the same CA, through the same code path.
    let member = harness.issue("member").expect("member cert");
    let served = list_peers(&client(&ca, Some(&member)), &node.addr).await;
    assert!(served.is_ok(), "{served:?}");
}

#[test]
fn a_node_given_an_expired_certificate_does_not_start_and_says_it_expired() {
    let harness = Harness::new().expect("harness");
    let mut options = NodeOptions::new("stale");
    options.tls = Some(expired_identity(&harness));
    let refused = harness
        .spawn(options)
        .expect_err("a node with an expired certificate must not start");
    let message = format!("{refused:#}");
    assert!(
        message.contains("exit status: 1")
            && message.contains("stale.pem is out of date")
            && message.contains("expired")
            && message.contains("mesh-cli ca issue"),
        "{message}"
    );
}

#[tokio::test]
async fn oversized_requests_and_strings_are_refused_with_the_limit() {
    use mesh_proto::v1 as pb;
    let harness = Harness::new().expect("harness");
    let node = harness.spawn(NodeOptions::new("alpha")).expect("alpha");
    let member = harness.issue("member").expect("member cert");
    let ca = harness.client_files().ca.clone();
    let channel = client(&ca, Some(&member))
        .connect(&node.addr)
        .await
        .expect("connect")
        .channel;

    // A 2 MiB prompt: over the 1 MiB request limit of the Tasks service.
    let mut tasks = pb::tasks_client::TasksClient::new(channel.clone())
        .max_encoding_message_size(8 * 1024 * 1024);
    let status = tasks
        .submit(pb::SubmitRequest {
            prompt: "x".repeat(2 * 1024 * 1024),
            target: Some(pb::submit_request::Target::Role("chat".into())),
            ..Default::default()
        })
        .await
        .expect_err("an oversized request is refused");
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status:?}");

    // A memory key over 512 bytes and a namespace with a bad character name the field.
    let mut memory = pb::memory_client::MemoryClient::new(channel);
    let status = memory
        .put(pb::MemoryPutRequest {
            namespace: "notes".into(),
            key: "k".repeat(513),
            value: b"v".to_vec(),
        })
        .await
        .expect_err("a long key is refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().starts_with("key"), "{}", status.message());
    let status = memory
        .put(pb::MemoryPutRequest {
            namespace: "../etc".into(),
            key: "k".into(),
            value: b"v".to_vec(),
        })
        .await
        .expect_err("a bad namespace is refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().starts_with("namespace"),
        "{}",
        status.message()
    );
    // The node is still fine.
    assert!(
        list_peers(&client(&ca, Some(&member)), &node.addr)
            .await
            .is_ok()
    );
}
