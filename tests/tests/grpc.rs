//! Standard gRPC tooling works against a node: `grpc.health.v1` (grpc_health_probe) and server
//! reflection v1 (grpcurl), on the same mTLS port as the agentmesh services.

use mesh_tests::{Harness, NodeOptions};
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
