//! Standard gRPC tooling works against a node: `grpc.health.v1` (grpc_health_probe) and server
//! reflection v1 (grpcurl) and v1alpha (the official `grpcio-reflection` client, older grpcurl,
//! Postman), on the same mTLS port as the agentmesh services, and behind the same certificate
//! gate.

use std::{path::Path, process::Command};

use mesh_cert::ca;
use mesh_tests::{Harness, NodeOptions, python3};
use mesh_tls::TlsFiles;
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

/// The official Python clients on gRPC's own TLS (grpcio): `grpc_health.v1`'s `Health.Check`,
/// then reflection v1alpha (the `grpcio-reflection` client speaks no other) listing the
/// services and looking one up; with `cert` and `key` empty it calls without a client
/// certificate. Prints `{"health": ..., "services": [...], "methods": [...]}` or
/// `{"code": ..., "details": ...}`.
const GRPCIO_CLIENTS: &str = r#"
import json, sys, grpc
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
addr, ca, cert, key = sys.argv[1:5]
read = lambda path: open(path, "rb").read() if path else None
credentials = grpc.ssl_channel_credentials(read(ca), read(key), read(cert))
with grpc.secure_channel(addr, credentials) as channel:
    try:
        health = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=10
        )
        database = ProtoReflectionDescriptorDatabase(channel)
        services = list(database.get_services())
        node = DescriptorPool(database).FindServiceByName("agentmesh.v1.Node")
        print(json.dumps({
            "health": health_pb2.HealthCheckResponse.ServingStatus.Name(health.status),
            "services": services,
            "methods": [m.name for m in node.methods],
        }))
    except grpc.RpcError as e:
        print(json.dumps({"code": e.code().name, "details": e.details()}))
"#;

/// `mesh-cli ca issue --role ROLE --name NAME` with the harness CA, with `--key-type` when
/// given: a certificate made as an operator makes one.
fn issued_files(harness: &Harness, name: &str, role: &str, key_type: Option<&str>) -> TlsFiles {
    let output = Command::new(mesh_tests::bin("mesh-cli"))
        .args(["ca", "issue", "--role", role, "--name", name])
        .args(key_type.iter().flat_map(|t| ["--key-type", t]))
        .arg("--dir")
        .arg(harness.ca_dir())
        .output()
        .expect("run mesh-cli");
    assert!(
        output.status.success(),
        "mesh-cli ca issue failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    TlsFiles {
        ca: harness.ca_dir().join(ca::CA_CERT_FILE),
        cert: harness.ca_dir().join(format!("{name}.pem")),
        key: harness.ca_dir().join(format!("{name}.key")),
    }
}

/// Runs [`GRPCIO_CLIENTS`] against `addr` presenting `files` (none: no client certificate).
fn grpcio_clients(addr: &str, ca: &Path, files: Option<&TlsFiles>) -> serde_json::Value {
    let path = |p: &Path| p.to_str().expect("utf-8 path").to_owned();
    let (cert, key) = files.map_or_else(Default::default, |f| (path(&f.cert), path(&f.key)));
    let output = Command::new(python3())
        .args(["-c", GRPCIO_CLIENTS, addr, &path(ca), &cert, &key])
        .output()
        .expect("run python3 (deploy/test.sh --setup-only installs grpcio-reflection and grpcio-health-checking)");
    assert!(
        output.status.success(),
        "the grpcio clients failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("json")
}

/// grpcio's health and reflection clients work with the client certificates mesh-cli makes:
/// `ca issue` with its default key (Ed25519) and with `--key-type p256`, and `mesh-cli join`.
/// Regression (issue 26): the Ed25519 keys were PKCS#8 v2, which grpcio cannot read ("Failed to
/// create security handshaker"). Regression: reflection v1alpha answered UNIMPLEMENTED, so the
/// official grpcio-reflection client, older grpcurl and Postman could not list the services. A
/// caller without a client certificate (the node is an issuer, so its handshake succeeds) is
/// refused by the gate.
///
/// The node's own certificate is P-256 (`ca issue --role node --key-type p256`): BoringSSL, in
/// grpcio, verifies no Ed25519 handshake signature, so it cannot talk to an Ed25519 server.
#[test]
fn grpcio_health_and_reflection_work_with_client_certificates_mesh_cli_makes() {
    let harness = Harness::new().expect("harness");
    let mut options = NodeOptions::new("alpha").issuer();
    options.tls = Some(issued_files(&harness, "alpha", "node", Some("p256")));
    let node = harness.spawn(options).expect("alpha");
    let ca = harness.ca_dir().join(ca::CA_CERT_FILE);

    let home = tempfile::tempdir().expect("tempdir");
    let token = Command::new(mesh_tests::bin("mesh-cli"))
        .args([
            "token", "create", "--role", "client", "--issuer", &node.addr,
        ])
        .arg("--dir")
        .arg(harness.ca_dir())
        .output()
        .expect("run mesh-cli");
    assert!(token.status.success(), "token create");
    let joined = Command::new(mesh_tests::bin("mesh-cli"))
        .args(["join", "-", "--name", "joined-tool"])
        .env("HOME", home.path())
        .env("XDG_CONFIG_HOME", home.path().join("config"))
        .env_remove("MESH_JOIN_TOKEN")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child
                .stdin
                .take()
                .expect("piped stdin")
                .write_all(&token.stdout)?;
            child.wait_with_output()
        })
        .expect("run mesh-cli join");
    assert!(
        joined.status.success(),
        "mesh-cli join: {}",
        String::from_utf8_lossy(&joined.stderr)
    );

    let clients = [
        (
            "ca issue (Ed25519)",
            issued_files(&harness, "grpc-tool", "client", None),
        ),
        (
            "ca issue --key-type p256",
            issued_files(&harness, "grpc-tool-p256", "client", Some("p256")),
        ),
        (
            "mesh-cli join (Ed25519)",
            mesh_join::bootstrap::user_cli_files(&home.path().join("config/agentmesh")),
        ),
    ];
    for (what, files) in &clients {
        let answer = grpcio_clients(&node.addr, &ca, Some(files));
        assert_eq!(answer["health"], "SERVING", "{what}: {answer}");
        let services: Vec<&str> = answer["services"]
            .as_array()
            .unwrap_or_else(|| panic!("{what}: no services: {answer}"))
            .iter()
            .filter_map(serde_json::Value::as_str)
            .collect();
        for expected in [
            "agentmesh.v1.Node",
            "agentmesh.v1.Tasks",
            "agentmesh.v1.Models",
            "grpc.health.v1.Health",
        ] {
            assert!(
                services.contains(&expected),
                "{what}: {expected} missing: {answer}"
            );
        }
        assert!(
            answer["methods"].as_array().is_some_and(|m| !m.is_empty()),
            "{what}: the Node service's descriptor came through: {answer}"
        );
    }

    let refused = grpcio_clients(&node.addr, &ca, None);
    assert_eq!(refused["code"], "UNAUTHENTICATED", "{refused}");
}
