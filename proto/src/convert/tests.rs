//! Round trips and refusals of the conversions.

use mesh_domain::{
    Evaluation, EventKind, Gpu, Health, HealthStatus, Load, ModelInfo, NodeId, NodeInfo,
    PersonaInfo, Resources, TaskEvent, TaskSpec, Tier, mcp::McpToolInfo,
};

use crate::v1 as pb;

fn sample() -> NodeInfo {
    NodeInfo {
        name: "alpha".into(),
        id: NodeId::from_spki_der(b"alpha"),
        version: "0.1.0".into(),
        protocol: 1,
        addrs: vec!["127.0.0.1:7700".into()],
        roles: vec!["coder".into()],
        labels: [("site".to_owned(), "home".to_owned())].into(),
        personas: vec![PersonaInfo {
            name: "reviewer".into(),
            role: "coder".into(),
        }],
        models: vec![ModelInfo {
            name: "qwen".into(),
            backend: "openai".into(),
            model: "qwen2.5".into(),
            base_url: "http://x/v1".into(),
            tokens_per_s: 42.5,
            embeds: true,
        }],
        role_chains: [("coder".to_owned(), vec!["qwen".to_owned()])].into(),
        resources: Resources {
            cpu_count: 8,
            memory_total_bytes: 1 << 34,
            memory_available_bytes: 1 << 33,
            cpu_load: 0.5,
            gpus: vec![Gpu {
                name: "RTX".into(),
                vram_mb: 24576,
                vram_free_mb: Some(100),
                source: "declared".into(),
            }],
        },
        load: Load {
            running: 1,
            queued: 2,
            workers: 2,
            queue_capacity: 16,
        },
        health: Health {
            status: HealthStatus::Degraded,
            reasons: vec!["mdns: off".into()],
        },
        cert_fingerprint: "ab".repeat(32),
        started_at_ms: 42,
        remote_max_tier: Tier::Write,
        memory_seq: 9,
        mcp_tools: vec![McpToolInfo {
            name: "time__get_current_time".into(),
            description: "Now, in a time zone.".into(),
            input_schema: serde_json::json!({"type": "object", "properties": {"timezone": {"type": "string"}}}).into(),
            tier: Tier::Read,
        }]
        .into(),
        draining: true,
    }
}

#[test]
fn node_info_round_trips_through_protobuf() {
    let info = sample();
    let back = NodeInfo::try_from(pb::NodeInfo::from(&info)).expect("valid");
    assert_eq!(back, info);
}

#[test]
fn malformed_node_info_names_the_field() {
    type Mutation = Box<dyn Fn(&mut pb::NodeInfo)>;
    let cases: Vec<(Mutation, &str)> = vec![
        (Box::new(|i| i.id = "nope".into()), "id"),
        (Box::new(|i| i.name = String::new()), "name"),
        (Box::new(|i| i.name = "x".repeat(64)), "name"),
        (Box::new(|i| i.roles = vec!["r".into(); 1000]), "roles"),
        (Box::new(|i| i.addrs = vec!["a".repeat(5000)]), "addrs"),
        (
            Box::new(|i| i.mcp_tools[0].name = "no_server".into()),
            "mcp_tools.name",
        ),
        (
            Box::new(|i| i.mcp_tools[0].name = "fs__read.file".into()),
            "mcp_tools.name",
        ),
        (
            Box::new(|i| i.mcp_tools[0].input_schema = "[1]".into()),
            "mcp_tools.input_schema",
        ),
        (
            Box::new(|i| i.mcp_tools[0].input_schema = "{".into()),
            "mcp_tools.input_schema",
        ),
        (
            Box::new(|i| {
                i.mcp_tools[0].input_schema =
                    format!(r#"{{"description": "{}"}}"#, "x".repeat(9000))
            }),
            "mcp_tools.input_schema",
        ),
        (
            Box::new(|i| i.mcp_tools[0].description = "d".repeat(2000)),
            "mcp_tools.description",
        ),
        (
            Box::new(|i| {
                let tool = i.mcp_tools[0].clone();
                i.mcp_tools = vec![tool; 129];
            }),
            "mcp_tools",
        ),
        (
            Box::new(|i| {
                let mut tool = i.mcp_tools[0].clone();
                tool.input_schema = format!(r#"{{"description": "{}"}}"#, "x".repeat(7000));
                i.mcp_tools = vec![tool; 10];
            }),
            "mcp_tools",
        ),
    ];
    for (mutate, field) in cases {
        let mut wire = pb::NodeInfo::from(&sample());
        mutate(&mut wire);
        let status = NodeInfo::try_from(wire).expect_err(field);
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().starts_with(field), "{}", status.message());
    }
}

#[test]
fn submit_requests_are_validated_field_by_field() {
    let good = pb::SubmitRequest {
        prompt: "hi".into(),
        target: Some(pb::submit_request::Target::Role("chat".into())),
        ..Default::default()
    };
    let spec = TaskSpec::try_from(good.clone()).expect("valid");
    assert_eq!(spec.tier, Tier::Read);
    assert_eq!(spec.timeout, None);

    let cases: Vec<(pb::SubmitRequest, &str)> = vec![
        (
            pb::SubmitRequest {
                prompt: " ".into(),
                ..good.clone()
            },
            "prompt",
        ),
        (
            pb::SubmitRequest {
                target: None,
                ..good.clone()
            },
            "target",
        ),
        (
            pb::SubmitRequest {
                target: Some(pb::submit_request::Target::Role("r".repeat(64))),
                ..good.clone()
            },
            "role",
        ),
        (
            pb::SubmitRequest {
                tier: 42,
                ..good.clone()
            },
            "tier",
        ),
        (
            pb::SubmitRequest {
                timeout_s: 90_000,
                ..good.clone()
            },
            "timeout_s",
        ),
        (
            pb::SubmitRequest {
                prompt: "x".repeat(mesh_domain::task::MAX_PROMPT_BYTES + 1),
                ..good.clone()
            },
            "prompt",
        ),
        (
            pb::SubmitRequest {
                lineage: Some(pb::Lineage {
                    task_id: "victim/../x".into(),
                    ..Default::default()
                }),
                ..good.clone()
            },
            "lineage.task_id",
        ),
        (
            pb::SubmitRequest {
                lineage: Some(pb::Lineage {
                    parent_id: "0192c5d2-7e4f-7a3b-9c1d-2e3f4a5b6c7d\0".into(),
                    ..Default::default()
                }),
                ..good.clone()
            },
            "lineage.parent_id",
        ),
        (
            pb::SubmitRequest {
                evaluate: Some(pb::Evaluation {
                    role: "judge".into(),
                    threshold: Some(1.5),
                    attempts: None,
                }),
                ..good.clone()
            },
            "evaluate.threshold",
        ),
        (
            pb::SubmitRequest {
                evaluate: Some(pb::Evaluation {
                    role: "judge".into(),
                    threshold: None,
                    attempts: Some(0),
                }),
                ..good.clone()
            },
            "evaluate.attempts",
        ),
        (
            pb::SubmitRequest {
                evaluate: Some(pb::Evaluation {
                    role: "judge".into(),
                    threshold: None,
                    attempts: Some(6),
                }),
                ..good.clone()
            },
            "evaluate.attempts",
        ),
        (
            pb::SubmitRequest {
                evaluate: Some(pb::Evaluation::default()),
                ..good.clone()
            },
            "evaluate.role",
        ),
        (
            pb::SubmitRequest {
                tool: "rm -rf /".into(),
                ..good.clone()
            },
            "tool",
        ),
        (
            pb::SubmitRequest {
                tool: "t".repeat(65),
                ..good.clone()
            },
            "tool",
        ),
    ];
    for (request, field) in cases {
        let status = TaskSpec::try_from(request).expect_err(field);
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().starts_with(field), "{}", status.message());
    }
}

/// An evaluation's unset threshold and attempts take the defaults, and it and the demanded
/// tool survive the trip a forwarded task takes (spec → request → spec).
#[test]
fn an_evaluation_defaults_and_a_forwarded_spec_round_trips() {
    let request = pb::SubmitRequest {
        prompt: "hi".into(),
        target: Some(pb::submit_request::Target::Role("chat".into())),
        evaluate: Some(pb::Evaluation {
            role: "judge".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let spec = TaskSpec::try_from(request).expect("valid");
    assert_eq!(spec.evaluate, Some(Evaluation::new("judge")));
    let custom = TaskSpec {
        evaluate: Some(Evaluation {
            role: "judge".into(),
            threshold: 0.0,
            attempts: 5,
        }),
        tool: Some("time__get_current_time".into()),
        ..spec
    };
    let back = TaskSpec::try_from(pb::SubmitRequest::from(&custom)).expect("valid");
    assert_eq!(back, custom);
}

/// A relayed `Evaluated` event is checked like every event from a peer.
#[test]
fn a_relayed_score_out_of_range_is_refused() {
    let event = |score| pb::TaskEvent {
        kind: Some(pb::task_event::Kind::Evaluated(pb::Evaluated {
            attempt: 1,
            score,
            ..Default::default()
        })),
        ..Default::default()
    };
    for bad in [1.5, -0.5, f64::NAN] {
        let status = TaskEvent::try_from(event(Some(bad))).expect_err("out of range");
        assert!(
            status.message().starts_with("evaluated.score"),
            "{status:?}"
        );
    }
    let unscored = TaskEvent::try_from(event(None)).expect("an unscored attempt");
    assert!(matches!(
        unscored.kind,
        EventKind::Evaluated {
            score: None,
            error: None,
            ..
        }
    ));
}
