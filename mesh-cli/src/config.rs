//! `mesh-cli config`: a node's runtime settings (tier caps, the approval policy, declared GPUs,
//! the front door's loopback exemption), changed without editing its config file or restarting
//! it. The node checks, keeps and applies them; this only prints.

use anyhow::anyhow;
use clap::Subcommand;
use mesh_proto::v1 as pb;
use serde_json::{Value, json};

use crate::{ConnArgs, channel, print_table};

#[derive(Debug, Subcommand)]
pub(crate) enum ConfigCommand {
    /// Show the node's runtime settings: the value in effect, where it comes from (`runtime`:
    /// set with `config set`; `file`: the node's config file; `default`), and the file's value
    /// when a runtime setting wins over it.
    Show {
        /// Print JSON (`{"settings": [{"key", "value", "source", "file", "runtime",
        /// "about"}]}`) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Set a runtime setting of the node: checked as the config file's value would be, kept
    /// in its data dir (it wins over the config file and survives restarts), and applied at
    /// once, without a restart. Operators only: the mesh-cli certificate of the node's own
    /// machine, or a client certificate the node lets run `shell` tasks.
    ///
    /// VALUE is TOML (`"shell"`, `["write", "shell"]`, `300`, `true`) or a shorthand: a bare
    /// word, `a,b` for a list, `NAME:VRAM_MiB,…` for GPUs. Examples: `config set
    /// security.client_max_tier shell`, `config set approval.tiers shell`, `config set
    /// resources.gpus "RTX 4090:24576"`, `config set http.loopback_without_key true`. `config
    /// show` lists the keys.
    Set {
        /// The key, as the config file spells it (`section.field`).
        #[arg(value_name = "KEY")]
        setting: String,
        value: String,
    },
    /// Remove a runtime setting: the config file's value (or the default) applies again, at
    /// once. Operators only.
    Unset {
        #[arg(value_name = "KEY")]
        setting: String,
    },
}

/// A value the node sent as JSON text (`null` for none).
fn value(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or(Value::Null)
}

/// Where a value came from, for people.
fn source(setting: &pb::Setting) -> &str {
    match setting.source.as_str() {
        "runtime" => "runtime (config set)",
        "file" => "the config file",
        other => other,
    }
}

pub(crate) async fn run(conn: &ConnArgs, command: ConfigCommand) -> anyhow::Result<()> {
    let mut client = pb::settings_client::SettingsClient::new(channel(conn).await?);
    let fail = |call: &'static str| {
        let node = conn.node.clone();
        move |s: tonic::Status| anyhow!("{call} on {node}: {}", s.message())
    };
    match command {
        ConfigCommand::Show { json } => {
            let settings = client
                .show(pb::SettingsShowRequest {})
                .await
                .map_err(fail("Settings.Show"))?
                .into_inner()
                .settings;
            if json {
                let list: Vec<Value> = settings
                    .iter()
                    .map(|s| {
                        json!({
                            "key": s.key,
                            "value": value(&s.value_json),
                            "source": s.source,
                            "file": value(&s.file_json),
                            "runtime": value(&s.runtime_json),
                            "about": s.about,
                        })
                    })
                    .collect();
                out!(
                    "{}",
                    serde_json::to_string_pretty(&json!({ "settings": list }))?
                );
                return Ok(());
            }
            let rows: Vec<[String; 4]> = settings
                .iter()
                .map(|s| {
                    let note = match (s.source.as_str(), s.file_json.is_empty()) {
                        ("runtime", false) => {
                            format!("wins over the config file's {}", s.file_json)
                        }
                        _ => s.about.clone(),
                    };
                    [s.key.clone(), s.value_json.clone(), s.source.clone(), note]
                })
                .collect();
            print_table(&["KEY", "VALUE", "SOURCE", "NOTE"], &rows);
            out!(
                "\nset with `mesh-cli config set KEY VALUE` (applied at once, kept across restarts; wins over the config file), undo with `mesh-cli config unset KEY`"
            );
        }
        ConfigCommand::Set { setting, value } => {
            let set = client
                .set(pb::SettingsSetRequest {
                    key: setting,
                    value,
                })
                .await
                .map_err(fail("Settings.Set"))?
                .into_inner();
            let over = if set.file_json.is_empty() {
                String::new()
            } else {
                format!("; it wins over the config file's {}", set.file_json)
            };
            out!(
                "{} = {} on {}: applied now, no restart needed, and kept in the node's data dir{over}",
                set.key,
                set.value_json,
                conn.node
            );
        }
        ConfigCommand::Unset { setting } => {
            let unset = client
                .unset(pb::SettingsUnsetRequest { key: setting })
                .await
                .map_err(fail("Settings.Unset"))?
                .into_inner();
            out!(
                "{} = {} on {} (from {}): applied now",
                unset.key,
                unset.value_json,
                conn.node,
                source(&unset)
            );
        }
    }
    Ok(())
}
