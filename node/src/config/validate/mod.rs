//! [`RawConfig::validate`]: applies the command-line flags and checks the file section by section,
//! stopping at the first mistake, into a [`Config`]. The checks live in the files below, one
//! function per section, each returning its validated part or a [`ConfigError`] that names the
//! key, the file and the fix:
//! - `node.rs`: `[node]`, `[discovery]`, `[tls]`, `[http]` (who the node is, how it is reached);
//! - `models.rs`: `[resources]`, `[[models]]` with `[roles]`, `[[personas]]` (what it runs);
//! - `limits.rs`: `[security]`, `[tasks]`, `[tools]`, `[memory]`, `[connections]` (the bounds
//!   work and callers run within);
//! - `keys.rs`: `[[http.keys]]` (the front door's named keys and their policies);
//! - `clients.rs`: `http.unknown_fields`, `http.model_aliases` (how the front door meets its
//!   clients' fields and model names);
//! - `approval.rs`: `[approval]` (which tool calls wait for a person);
//! - `cron.rs`: `[cron]` (how many schedules the node keeps);
//! - `mcp.rs`: `[[mcp]]` (the MCP servers whose tools the node offers);
//! - `syntax.rs`: the shape of names and `host:port` peers, shared by the above.
//!
//! It must not read certificates, load models or open sockets; the one file it looks at is the
//! zero-config model's (only whether it is there).

mod approval;
mod clients;
mod cron;
mod keys;
mod limits;
mod mcp;
mod models;
mod node;
mod syntax;

use std::path::Path;

pub use syntax::is_valid_name;

use crate::config::{
    error::{ConfigError, Origin},
    raw::{Overrides, RawConfig},
    types::Config,
};

impl RawConfig {
    /// Applies overrides and checks every value.
    ///
    /// The order of the steps decides which mistake a file with several is told about: it is
    /// kept as the node has always reported them, so `node.roles` comes after `[roles]` (it adds
    /// to the roles the chains define) and `node.min_free_disk_mb` comes last.
    pub fn validate(
        self,
        path: Option<&Path>,
        overrides: &Overrides,
    ) -> Result<Config, ConfigError> {
        self.validate_as(path, &Origin::new(path), overrides)
    }

    /// [`RawConfig::validate`], its errors naming `origin` (the runtime settings' file, when
    /// they were laid over the config file).
    pub(in crate::config) fn validate_as(
        self,
        path: Option<&Path>,
        origin: &Origin,
        overrides: &Overrides,
    ) -> Result<Config, ConfigError> {
        let origin = origin.clone();
        let node_section = node::node(&self.node, overrides, &origin)?;
        let discovery = node::discovery(self.discovery, overrides, &origin)?;
        let (tls, ca_key) = node::tls(self.tls, overrides, node_section.listen, &origin)?;
        let gpus = models::resources(self.resources, &origin)?;
        let model_section =
            models::models(self.models, self.roles, &node_section.data_dir, &origin)?;
        let roles = node::served_roles(&model_section.role_chains, self.node.roles, &origin)?;
        let personas = models::personas(self.personas, &roles, &origin)?;
        let security = limits::security(self.security, &origin)?;
        let tasks = limits::tasks(self.tasks, &origin)?;
        let tool_roots = limits::tools(self.tools, &node_section.data_dir, &origin)?;
        let memory = limits::memory(self.memory, &origin)?;
        let http = node::http(self.http, &origin)?;
        let min_free_disk = node::min_free_disk(self.node.min_free_disk_mb, &origin)?;
        let drain_on_stop = node::drain_on_stop(self.node.drain_on_stop_s, &origin)?;
        let connections = limits::connections(self.connections, &origin)?;
        let approval = approval::approval(self.approval, &origin)?;
        let cron = cron::cron(self.cron, &origin)?;
        let mcp = mcp::servers(self.mcp, &origin)?;

        Ok(Config {
            source: path.map(Path::to_owned),
            name: node_section.name,
            name_from_host: node_section.name_from_host,
            listen: node_section.listen,
            data_dir: node_section.data_dir,
            min_free_disk,
            drain_on_stop,
            roles: roles.into_iter().collect(),
            labels: node_section.labels,
            discovery,
            tls,
            ca_key,
            gpus,
            models: model_section.models,
            role_chains: model_section.role_chains,
            personas,
            remote_max_tier: security.remote_max_tier,
            client_max_tier: security.client_max_tier,
            mcp_max_tier: security.mcp_max_tier,
            tasks,
            tool_roots,
            local_namespaces: memory.local_namespaces,
            max_clock_skew: memory.max_clock_skew,
            tombstone_window: memory.tombstone_window,
            sync_interval: memory.sync_interval,
            max_namespaces: memory.max_namespaces,
            memory_fanout: memory.fanout,
            http,
            connections,
            approval,
            cron,
            mcp,
            layers: Default::default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use mesh_domain::Tier;

    use super::*;
    use crate::config::{defaults::DEFAULT_PORT, types::TlsMode};

    /// `text` as the file `node.toml`, with no flags.
    pub(super) fn parse(text: &str) -> Result<Config, ConfigError> {
        let path = Path::new("node.toml");
        RawConfig::parse(text, path)?.validate(Some(path), &Overrides::default())
    }

    /// The message `text` is rejected with.
    pub(super) fn err(text: &str) -> String {
        parse(text)
            .expect_err("config must be rejected")
            .to_string()
    }

    #[test]
    fn empty_file_gives_the_documented_defaults() {
        let config = parse("").expect("valid");
        assert_eq!(config.listen.addr.port(), DEFAULT_PORT);
        assert!(config.listen.fallback);
        assert!(config.discovery.mdns);
        assert_eq!(config.discovery.max_advert_dials, 64);
        assert_eq!(config.discovery.max_failing_addrs, 4096);
        assert_eq!(config.tls, TlsMode::Bootstrap);
        assert_eq!(config.remote_max_tier, Tier::Read);
        assert_eq!(config.mcp_max_tier, Tier::Read);
        assert_eq!(config.drain_on_stop, std::time::Duration::from_secs(10));
        assert!(!config.name.is_empty());
    }

    /// Issue 30, item 5: how long a stopping node drains, in seconds; 0 leaves at once, and
    /// more than an hour (or not a number of seconds) is refused naming the key and the fix.
    #[test]
    fn drain_on_stop_takes_seconds_up_to_an_hour() {
        let drain = |text: &str| parse(&format!("[node]\ndrain_on_stop_s = {text}"));
        assert_eq!(
            drain("0").expect("valid").drain_on_stop,
            std::time::Duration::ZERO
        );
        assert_eq!(drain("3600").expect("valid").drain_on_stop.as_secs(), 3600);
        let too_long = drain("3601").expect_err("too long").to_string();
        assert!(too_long.contains("node.drain_on_stop_s"), "{too_long}");
        assert!(
            too_long.contains("is 3601 s, more than 3600 s"),
            "{too_long}"
        );
        assert!(too_long.contains("TimeoutStopSec"), "{too_long}");
        for bad in ["\"10s\"", "-1"] {
            let error = drain(bad).expect_err(bad).to_string();
            assert!(error.contains("drain_on_stop_s"), "{bad}: {error}");
        }
    }

    #[test]
    fn a_full_config_parses() {
        let config = parse(
            r#"
            [node]
            name = "gpu-box"
            listen = "0.0.0.0:7700"
            data_dir = "/var/lib/agentmesh"
            roles = ["chat"]
            labels = { site = "home" }

            [discovery]
            mdns = false
            interfaces = ["eth0"]
            static_peers = ["10.0.0.2:7700", "laptop.lan:7700"]

            [tls]
            ca = "ca.pem"
            cert = "gpu-box.pem"
            key = "gpu-box.key"

            [[resources.gpus]]
            name = "RTX 4090"
            vram_mb = 24576

            [[models]]
            name = "qwen-coder"
            backend = "openai"
            base_url = "http://127.0.0.1:11434/v1"
            model = "qwen2.5-coder:7b"

            [roles]
            coder = ["qwen-coder"]

            [[personas]]
            name = "reviewer"
            role = "coder"
            system_prompt = "You review code."

            [security]
            remote_max_tier = "write"
            mcp_max_tier = "write"
            "#,
        )
        .expect("valid");
        assert_eq!(config.name, "gpu-box");
        assert!(!config.listen.fallback);
        assert_eq!(config.roles, vec!["chat", "coder"]);
        assert_eq!(config.discovery.static_peers.len(), 2);
        assert!(matches!(config.tls, TlsMode::Mtls(_)));
        assert_eq!(config.gpus[0].vram_mb, 24576);
        assert_eq!(config.remote_max_tier, Tier::Write);
        assert_eq!(config.mcp_max_tier, Tier::Write);
        assert_eq!(config.personas[0].role, "coder");
    }

    #[test]
    fn every_invalid_value_names_its_key() {
        let cases = [
            ("[node]\nlisten = \"nowhere\"", "node.listen"),
            ("[node]\nname = \"bad name!\"", "node.name"),
            (
                "[discovery]\nstatic_peers = [\"no-port\"]",
                "discovery.static_peers[0]",
            ),
            (
                "[discovery]\nstatic_peers = [\"1.2.3.4:0\"]",
                "discovery.static_peers[0]",
            ),
            (
                "[discovery]\nmax_advert_dials = 0",
                "discovery.max_advert_dials",
            ),
            (
                "[discovery]\nmax_failing_addrs = 2000000",
                "discovery.max_failing_addrs",
            ),
            ("[tls]\nca = \"ca.pem\"", "tls.cert"),
            ("[tls]\ninsecure = true", "tls.insecure"),
            (
                "[[resources.gpus]]\nname = \"x\"\nvram_mb = 0",
                "resources.gpus[0].vram_mb",
            ),
            (
                "[[models]]\nname = \"m\"\nbackend = \"magic\"",
                "models[0].backend",
            ),
            (
                "[[models]]\nname = \"m\"\nbackend = \"openai\"",
                "models[0].base_url",
            ),
            ("[roles]\ncoder = [\"ghost\"]", "roles.coder[0]"),
            (
                "[[personas]]\nname = \"p\"\nrole = \"nobody\"",
                "personas[0].role",
            ),
            (
                "[security]\nremote_max_tier = \"root\"",
                "security.remote_max_tier",
            ),
            (
                "[security]\nmcp_max_tier = \"admin\"",
                "security.mcp_max_tier",
            ),
        ];
        for (text, key) in cases {
            let message = err(text);
            assert!(message.contains(&format!("`{key}`")), "{key}: {message}");
            assert!(message.contains("node.toml"), "{key}: {message}");
        }
    }
}
