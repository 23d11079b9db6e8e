//! Standard gRPC tooling works against a node: `grpc.health.v1` (grpc_health_probe) and server
//! reflection v1 (grpcurl) and v1alpha (the official `grpcio-reflection` client, older grpcurl,
//! Postman), on the same mTLS port as the agentmesh services, and behind the same certificate
//! gate.

use std::process::Command;

use mesh_identity::{TlsFiles, ca};
use mesh_tests::{Harness, NodeOptions, python3};
use tokio_stream::StreamExt;
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};
use tonic_reflection::pb::v1::{
    ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
    server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
};

#[tokio::test]
async fn health_and_reflection_answer_over_mtls() {
    let harness = Harness::new().expect("harness");
    let node = harness.spawn(NodeOptions::new("alpha")).expect("alpha");
    let channel = harness.member_channel(&node).await.expect("connect");

    let mut health = HealthClient::new(channel.clone());
    for service in ["", "agentmesh.v1.Node"] {
        let status = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .expect("health check")
            .into_inner()
            .status;
        assert_eq!(status, ServingStatus::Serving as i32, "service {service:?}");
    }

    let mut reflection = ServerReflectionClient::new(channel);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = reflection
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .expect("reflection")
        .into_inner();
    let response = responses
        .next()
        .await
        .expect("one response")
        .expect("ok response");
    let Some(MessageResponse::ListServicesResponse(list)) = response.message_response else {
        panic!("unexpected reflection answer: {response:?}");
    };
    let names: Vec<_> = list.service.into_iter().map(|s| s.name).collect();
    for expected in ["agentmesh.v1.Node", "grpc.health.v1.Health"] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} missing from {names:?}"
        );
    }
}

/// Lists the node's services with the official Python `grpcio-reflection` client, which speaks
/// reflection v1alpha only, and looks one service up through it; with `cert` and `key` empty it
/// calls without a client certificate. Prints `{"services": [...], "methods": [...]}` or
/// `{"code": ..., "details": ...}`.
const REFLECT_V1ALPHA: &str = r#"
import json, sys, grpc
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
addr, ca, cert, key = sys.argv[1:5]
read = lambda path: open(path, "rb").read() if path else None
credentials = grpc.ssl_channel_credentials(read(ca), read(key), read(cert))
with grpc.secure_channel(addr, credentials) as channel:
    database = ProtoReflectionDescriptorDatabase(channel)
    try:
        services = list(database.get_services())
        node = DescriptorPool(database).FindServiceByName("agentmesh.v1.Node")
        print(json.dumps({"services": services, "methods": [m.name for m in node.methods]}))
    except grpc.RpcError as e:
        print(json.dumps({"code": e.code().name, "details": e.details()}))
"#;

/// A certificate with an ECDSA P-256 key for `name` in `role`, made as an operator makes one:
/// `mesh-cli ca issue --key-type p256` with the harness CA. gRPC's own TLS stack (BoringSSL, in
/// grpcio) offers no Ed25519 signatures, so it cannot handshake with the default Ed25519
/// certificates, the node's included.
fn p256_files(harness: &Harness, name: &str, role: &str) -> TlsFiles {
    let output = Command::new(mesh_tests::bin("mesh-cli"))
        .args([
            "ca",
            "issue",
            "--key-type",
            "p256",
            "--role",
            role,
            "--name",
            name,
            "--dir",
        ])
        .arg(harness.ca_dir())
        .output()
        .expect("run mesh-cli");
    assert!(
        output.status.success(),
        "mesh-cli ca issue --key-type p256 failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let files = TlsFiles {
        ca: harness.ca_dir().join(ca::CA_CERT_FILE),
        cert: harness.ca_dir().join(format!("{name}.pem")),
        key: harness.ca_dir().join(format!("{name}.key")),
    };
    let key = std::fs::read_to_string(&files.key).expect("key");
    let key = rcgen::KeyPair::from_pem(&key).expect("a PEM key");
    assert!(
        key.is_compatible(&rcgen::PKCS_ECDSA_P256_SHA256),
        "not a P-256 key"
    );
    files
}

fn reflect_v1alpha(addr: &str, ca: &str, cert: &str, key: &str) -> serde_json::Value {
    let output = Command::new(python3())
        .args(["-c", REFLECT_V1ALPHA, addr, ca, cert, key])
        .output()
        .expect("run python3 (deploy/test.sh --setup-only installs grpcio-reflection)");
    assert!(
        output.status.success(),
        "the reflection client failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("json")
}

/// Regression: reflection v1alpha answered UNIMPLEMENTED, so the official grpcio-reflection
/// client, older grpcurl and Postman could not list the services. A caller without a client
/// certificate (the node is an issuer, so its handshake succeeds) is refused by the gate.
#[test]
fn reflection_v1alpha_lists_the_services_to_a_member_and_refuses_a_caller_without_a_certificate() {
    let harness = Harness::new().expect("harness");
    let mut options = NodeOptions::new("alpha").issuer();
    options.tls = Some(p256_files(&harness, "alpha", "node"));
    let node = harness.spawn(options).expect("alpha");
    let client = p256_files(&harness, "grpc-tool", "client");
    let path = |p: &std::path::Path| p.to_str().expect("utf-8 path").to_owned();
    let (ca, cert, key) = (path(&client.ca), path(&client.cert), path(&client.key));

    let listed = reflect_v1alpha(&node.addr, &ca, &cert, &key);
    let services: Vec<&str> = listed["services"]
        .as_array()
        .unwrap_or_else(|| panic!("no services: {listed}"))
        .iter()
        .filter_map(serde_json::Value::as_str)
        .collect();
    for expected in [
        "agentmesh.v1.Node",
        "agentmesh.v1.Tasks",
        "agentmesh.v1.Models",
        "grpc.health.v1.Health",
    ] {
        assert!(services.contains(&expected), "{expected} missing: {listed}");
    }
    assert!(
        listed["methods"].as_array().is_some_and(|m| !m.is_empty()),
        "the Node service's descriptor came through: {listed}"
    );

    let refused = reflect_v1alpha(&node.addr, &ca, "", "");
    assert_eq!(refused["code"], "UNAUTHENTICATED", "{refused}");
}
