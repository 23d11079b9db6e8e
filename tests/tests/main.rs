//! The integration tests: real `mesh-node` and `mesh-cli` processes over real sockets, one
//! module per area. One binary rather than one per file, because each links the whole node (see
//! `tests/Cargo.toml`). Run one area with `cargo test -p mesh-tests --test mesh <area>::`, e.g.
//! `cargo test -p mesh-tests --test mesh approvals::`.

mod agent;
mod anthropic;
mod approvals;
mod client_compat;
mod coding_agents;
mod connections;
mod cron;
mod cron_bounds;
mod cross_site;
mod deploy_files;
mod disk_full;
mod drain;
mod durable;
mod embedded;
mod embeddings;
mod error_texts;
mod evaluate;
mod faults;
mod fleet;
mod fleet_cli;
mod front_door;
mod front_door_failover;
mod grpc;
mod hostile_soak;
mod join;
mod key_files;
mod keys;
mod mcp;
mod mcp_server;
mod mdns;
mod mdns_flood;
mod membership_flood;
mod memory;
mod netns_fleet;
mod node_names;
mod ollama;
mod operator;
mod responses;
mod revocation;
mod routing;
mod run_cli;
mod scripts;
mod security;
mod swim_sim;
mod trust;
mod tutorial;
