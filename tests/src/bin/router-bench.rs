//! Router ranking cost: `router::rank` over 50 peers (plus the local node), the work done for
//! every submitted task. Prints min / median / p99 of single calls after a warm-up.
//!
//! Run: `cargo run --release -p mesh-tests --bin router-bench`

use std::{collections::BTreeMap, hint::black_box, time::Instant};

use mesh_domain::{
    Gpu, Health, Load, ModelInfo, NodeId, NodeInfo, PeerState, PersonaInfo, Requirements,
    Resources, Target, Tier,
};
use mesh_node::testing::{Candidate, rank};

fn node(i: usize) -> NodeInfo {
    let roles: Vec<String> = match i % 3 {
        0 => vec!["coder".into(), "chat".into()],
        1 => vec!["chat".into()],
        _ => vec!["research".into()],
    };
    NodeInfo {
        name: format!("node-{i:02}"),
        id: NodeId::from_spki_der(format!("node-{i}").as_bytes()),
        version: "0.1.0".into(),
        protocol: 1,
        addrs: vec![format!("10.0.0.{i}:7700")],
        roles: roles.clone(),
        labels: [(
            "site".to_owned(),
            if i.is_multiple_of(2) {
                "home"
            } else {
                "office"
            }
            .to_owned(),
        )]
        .into(),
        personas: vec![PersonaInfo {
            name: "reviewer".into(),
            role: "coder".into(),
        }],
        models: vec![ModelInfo {
            name: format!("model-{i}"),
            backend: "openai".into(),
            model: "m".into(),
            base_url: String::new(),
            tokens_per_s: 0.0,
            embeds: false,
        }],
        role_chains: roles
            .iter()
            .map(|r| (r.clone(), vec![format!("model-{i}")]))
            .collect::<BTreeMap<_, _>>(),
        resources: Resources {
            cpu_count: 8,
            memory_total_bytes: 1 << 35,
            memory_available_bytes: 1 << 34,
            cpu_load: 0.5,
            gpus: (0..i % 3)
                .map(|g| Gpu {
                    name: format!("gpu{g}"),
                    vram_mb: 8192 * (1 + (i as u64 % 4)),
                    vram_free_mb: Some(4096),
                    source: "declared".into(),
                })
                .collect(),
        },
        load: Load {
            running: (i % 3) as u32,
            queued: (i % 2) as u32,
            workers: 2,
            queue_capacity: 16,
        },
        health: Health::default(),
        cert_fingerprint: "ab".repeat(32),
        started_at_ms: 0,
        remote_max_tier: Tier::Read,
        memory_seq: 0,
        mcp_tools: Default::default(),
        draining: false,
    }
}

fn main() {
    let infos: Vec<NodeInfo> = (0..51).map(node).collect();
    let candidates: Vec<Candidate<'_>> = infos
        .iter()
        .enumerate()
        .map(|(i, info)| Candidate {
            info,
            state: if i % 10 == 9 {
                PeerState::Down
            } else {
                PeerState::Up
            },
            local: i == 0,
            rtt_ms: Some(1.0 + i as f64 / 10.0),
            addr: info.addrs.first().map_or("", String::as_str),
        })
        .collect();
    let target = Target::Role("coder".into());
    let require = Requirements {
        gpu: true,
        min_vram_mb: Some(2048),
        labels: [("site".to_owned(), "home".to_owned())].into(),
        on: None,
    };
    for _ in 0..10_000 {
        black_box(rank(black_box(&target), Tier::Read, &require, &candidates));
    }
    let mut samples = Vec::with_capacity(20_000);
    for _ in 0..20_000 {
        let started = Instant::now();
        black_box(rank(black_box(&target), Tier::Read, &require, &candidates));
        samples.push(started.elapsed().as_nanos() as f64 / 1000.0);
    }
    samples.sort_by(f64::total_cmp);
    let pick = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize];
    println!("router::rank, 50 peers + local, {} calls", samples.len());
    println!(
        "  min {:.2} µs   median {:.2} µs   p99 {:.2} µs",
        samples[0],
        pick(0.5),
        pick(0.99)
    );
}
