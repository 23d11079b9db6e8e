//! Runtime settings: the keys an operator changes with `mesh-cli config set` instead of editing
//! the file and restarting (the tier caps, the approval policy, declared GPUs, the front door's
//! loopback exemption), kept in `<data_dir>/settings.toml` in the file's own syntax and laid over
//! the file whenever the configuration is read ([`Config::load`], [`Config::with_runtime`]).
//!
//! Precedence: a runtime setting wins over the file's value of the same key; it is the later,
//! explicit act of an operator, and `mesh-cli config show` shows both and which is in effect
//! (`mesh-cli config unset KEY` goes back to the file's). A value is checked by the same
//! validation as the file's ([`RawConfig::validate`]), so it is refused with the same message,
//! naming the key. Every key listed in [`SETTABLE`] applies without a restart; keys that need
//! one are not runtime settings (they stay in the file). This file says which keys there are,
//! how a command line's text becomes a value, and what each is in a [`Config`]; it applies
//! nothing to a running node (the `settings` module does).

use std::{
    fs, io,
    path::{Path, PathBuf},
};

use mesh_domain::Tier;
use toml::{Table, Value};

use crate::config::{
    error::{ConfigError, Origin},
    layers::{Layers, RuntimeSettings},
    raw::{Overrides, RawConfig},
    types::Config,
};

/// The runtime settings' file in the data dir.
pub const SETTINGS_FILE: &str = "settings.toml";
/// Longest value text accepted from a command line.
pub const MAX_VALUE_BYTES: usize = 4096;

/// How a command line writes a key's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// One word (a tier).
    Word,
    /// A list: TOML (`["a", "b"]`) or words separated by commas (`a,b`).
    Words,
    /// A whole number.
    Number,
    /// `true` or `false`.
    Switch,
    /// GPUs: TOML (`[{name = "RTX 4090", vram_mb = 24576}]`) or `NAME:VRAM_MiB` items separated
    /// by commas.
    Gpus,
}

/// A key `mesh-cli config set` may change.
#[derive(Debug)]
pub struct Settable {
    /// The key, as the file spells it (`section.field`).
    pub key: &'static str,
    shape: Shape,
    /// What it does, for `config show` and error messages.
    pub about: &'static str,
    /// Its value in a configuration.
    value: fn(&Config) -> Value,
}

fn tier(tier: Tier) -> Value {
    Value::String(tier.to_string())
}

fn words<'a>(words: impl IntoIterator<Item = &'a String>) -> Value {
    Value::Array(words.into_iter().cloned().map(Value::String).collect())
}

fn number(n: u64) -> Value {
    Value::Integer(i64::try_from(n).unwrap_or(i64::MAX))
}

/// Every runtime setting.
pub const SETTABLE: &[Settable] = &[
    Settable {
        key: "security.client_max_tier",
        shape: Shape::Word,
        about: "highest tier an operator's client certificate may run here (read, write, shell)",
        value: |c| tier(c.client_max_tier),
    },
    Settable {
        key: "security.remote_max_tier",
        shape: Shape::Word,
        about: "highest tier a task from another node may run here (read, write, shell)",
        value: |c| tier(c.remote_max_tier),
    },
    Settable {
        key: "security.mcp_max_tier",
        shape: Shape::Word,
        about: "highest tier a caller of the front door's /mcp may run (read, write, shell)",
        value: |c| tier(c.mcp_max_tier),
    },
    Settable {
        key: "approval.tiers",
        shape: Shape::Words,
        about: "tool calls of these tiers wait for a person's approval",
        value: |c| Value::Array(c.approval.tiers.iter().map(|t| tier(*t)).collect()),
    },
    Settable {
        key: "approval.tools",
        shape: Shape::Words,
        about: "calls of these tools wait for a person's approval",
        value: |c| words(&c.approval.tools),
    },
    Settable {
        key: "approval.servers",
        shape: Shape::Words,
        about: "calls of these MCP servers' tools wait for a person's approval",
        value: |c| words(&c.approval.servers),
    },
    Settable {
        key: "approval.timeout_s",
        shape: Shape::Number,
        about: "seconds a call waits for a decision before it is denied",
        value: |c| number(c.approval.timeout.as_secs()),
    },
    Settable {
        key: "approval.max_pending",
        shape: Shape::Number,
        about: "calls that may wait for approval here at once",
        value: |c| number(c.approval.max_pending as u64),
    },
    Settable {
        key: "resources.gpus",
        shape: Shape::Gpus,
        about: "GPUs declared besides those nvidia-smi reports (NAME:VRAM_MiB,...)",
        value: |c| {
            Value::Array(
                c.gpus
                    .iter()
                    .map(|gpu| {
                        let mut entry = Table::new();
                        entry.insert("name".into(), Value::String(gpu.name.clone()));
                        entry.insert("vram_mb".into(), number(gpu.vram_mb));
                        Value::Table(entry)
                    })
                    .collect(),
            )
        },
    },
    Settable {
        key: "http.loopback_without_key",
        shape: Shape::Switch,
        about: "the front door lets callers on this machine (loopback) in without a key",
        value: |c| Value::Boolean(c.http.loopback_without_key),
    },
];

/// The runtime setting `key`, if it is one.
pub(super) fn settable(key: &str) -> Option<&'static Settable> {
    SETTABLE.iter().find(|s| s.key == key)
}

/// The message for a key that is not a runtime setting.
fn not_settable(origin: &Origin, key: &str) -> ConfigError {
    let keys: Vec<&str> = SETTABLE.iter().map(|s| s.key).collect();
    origin.invalid(
        key,
        "is not a runtime setting".into(),
        &format!(
            "runtime settings are {}; every other key is set in the config file (--config) and takes effect when the node restarts",
            keys.join(", ")
        ),
    )
}

/// `table`'s value at `section.field`.
fn lookup<'a>(table: &'a Table, key: &str) -> Option<&'a Value> {
    let (section, field) = key.split_once('.')?;
    table.get(section)?.as_table()?.get(field)
}

/// Where a runtime setting came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// `mesh-cli config set` (the settings file).
    Runtime,
    /// The config file.
    File,
    /// Neither: the default.
    Default,
}

impl Source {
    /// `runtime`, `file` or `default`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Runtime => "runtime",
            Self::File => "file",
            Self::Default => "default",
        }
    }
}

/// A runtime setting as `mesh-cli config show` lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct Shown {
    pub key: &'static str,
    /// What it does.
    pub about: &'static str,
    /// The value in effect.
    pub value: Value,
    /// Where that value came from.
    pub source: Source,
    /// The config file's value, if it sets one.
    pub file: Option<Value>,
    /// The runtime value, if one is set.
    pub runtime: Option<Value>,
}

impl RuntimeSettings {
    /// Reads `<data_dir>/settings.toml` (none yet: no runtime settings), checking that every
    /// key in it is a runtime setting of the right shape.
    pub fn load(data_dir: &Path) -> Result<Self, ConfigError> {
        let path = data_dir.join(SETTINGS_FILE);
        let text = match fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
            Err(source) => return Err(ConfigError::Read { path, source }),
        };
        let table: Table = toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.clone(),
            message: e.to_string().trim_end().to_owned(),
        })?;
        let origin = Origin::new(Some(&path));
        for (section, fields) in &table {
            let Some(fields) = fields.as_table() else {
                return Err(not_settable(&origin, section));
            };
            for (field, value) in fields {
                let key = format!("{section}.{field}");
                let setting = settable(&key).ok_or_else(|| not_settable(&origin, &key))?;
                check_shape(setting, value, &origin)?;
            }
        }
        Ok(Self { path, table })
    }

    /// The file they are kept in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether none is set.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// These settings with `key` set to the value `text` says (TOML, or the shorthands a
    /// command line allows: a bare word, `a,b` for a list, `NAME:MiB` for GPUs). Only the
    /// shape is checked here; the value itself by [`Config::with_runtime`].
    pub fn with(&self, key: &str, text: &str) -> Result<Self, ConfigError> {
        let origin = Origin::named("mesh-cli config set");
        let setting = settable(key).ok_or_else(|| not_settable(&origin, key))?;
        if text.len() > MAX_VALUE_BYTES {
            return Err(origin.invalid(
                key,
                format!("is {} bytes long, more than {MAX_VALUE_BYTES}", text.len()),
                "give a shorter value",
            ));
        }
        let value = read_value(setting, text, &origin)?;
        check_shape(setting, &value, &origin)?;
        let mut table = self.table.clone();
        let (section, field) = key.split_once('.').unwrap_or((key, ""));
        let entry = table
            .entry(section)
            .or_insert_with(|| Value::Table(Table::new()));
        if let Value::Table(fields) = entry {
            fields.insert(field.to_owned(), value);
        }
        Ok(Self {
            path: self.path.clone(),
            table,
        })
    }

    /// These settings without `key` (the file's value, or the default, applies again).
    pub fn without(&self, key: &str) -> Result<Self, ConfigError> {
        let origin = Origin::named("mesh-cli config unset");
        settable(key).ok_or_else(|| not_settable(&origin, key))?;
        let mut table = self.table.clone();
        if let Some((section, field)) = key.split_once('.')
            && let Some(Value::Table(fields)) = table.get_mut(section)
        {
            fields.remove(field);
            if fields.is_empty() {
                table.remove(section);
            }
        }
        Ok(Self {
            path: self.path.clone(),
            table,
        })
    }

    /// Writes them to their file, whole or not at all (written aside, then renamed).
    pub fn save(&self) -> io::Result<()> {
        let text = toml::to_string(&self.table).map_err(io::Error::other)?;
        let header = "# Runtime settings, written by `mesh-cli config set`; they win over the config file.\n";
        let mut partial = self.path.as_os_str().to_owned();
        partial.push(".partial");
        let partial = PathBuf::from(partial);
        fs::write(&partial, format!("{header}{text}"))?;
        fs::File::open(&partial)?.sync_all()?;
        fs::rename(&partial, &self.path)
    }

    /// Lays these settings over `file`.
    fn over(&self, mut file: Table) -> Table {
        for (section, fields) in &self.table {
            let Some(fields) = fields.as_table() else {
                continue;
            };
            let target = file
                .entry(section.clone())
                .or_insert_with(|| Value::Table(Table::new()));
            if let Value::Table(target) = target {
                for (field, value) in fields {
                    target.insert(field.clone(), value.clone());
                }
            }
        }
        file
    }
}

/// The value a command line's `text` stands for, in the shape `setting` takes.
fn read_value(setting: &Settable, text: &str, origin: &Origin) -> Result<Value, ConfigError> {
    let toml = toml::from_str::<Table>(&format!("v = {text}"))
        .ok()
        .and_then(|mut t| t.remove("v"));
    let list = || {
        Value::Array(
            text.split(',')
                .map(str::trim)
                .filter(|word| !word.is_empty())
                .map(|word| Value::String(word.to_owned()))
                .collect(),
        )
    };
    Ok(match (setting.shape, toml) {
        (Shape::Word, None) => Value::String(text.trim().to_owned()),
        (Shape::Words, None | Some(Value::String(_))) => list(),
        (Shape::Gpus, None | Some(Value::String(_))) => {
            let mut gpus = Vec::new();
            for (i, item) in text.split(',').map(str::trim).enumerate() {
                let vram = item
                    .rsplit_once(':')
                    .and_then(|(name, vram)| Some((name.trim(), vram.trim().parse::<i64>().ok()?)))
                    .filter(|(name, _)| !name.is_empty());
                let Some((name, vram)) = vram else {
                    return Err(origin.invalid(
                        &format!("{}[{i}]", setting.key),
                        format!("is `{item}`, not NAME:VRAM_MiB"),
                        "write each GPU as its name and its VRAM in MiB, e.g. `RTX 4090:24576`, several separated by commas",
                    ));
                };
                let mut entry = Table::new();
                entry.insert("name".into(), Value::String(name.to_owned()));
                entry.insert("vram_mb".into(), Value::Integer(vram));
                gpus.push(Value::Table(entry));
            }
            Value::Array(gpus)
        }
        (_, Some(value)) => value,
        (_, None) => Value::String(text.to_owned()),
    })
}

/// Whether `value` is what `setting` takes, as the file's reader sees it: read alone into
/// the file's structure, so a wrong type is named with its key.
fn check_shape(setting: &Settable, value: &Value, origin: &Origin) -> Result<(), ConfigError> {
    let mut table = Table::new();
    let (section, field) = setting.key.split_once('.').unwrap_or((setting.key, ""));
    let mut fields = Table::new();
    fields.insert(field.to_owned(), value.clone());
    table.insert(section.to_owned(), Value::Table(fields));
    table.try_into::<RawConfig>().map(drop).map_err(|e| {
        let expected = match setting.shape {
            Shape::Word => "one word",
            Shape::Words => "a list (`a,b` or `[\"a\", \"b\"]`)",
            Shape::Number => "a whole number",
            Shape::Switch => "`true` or `false`",
            Shape::Gpus => "GPUs as `NAME:VRAM_MiB,...`",
        };
        origin.invalid(
            setting.key,
            format!("is {value}, not {expected} ({})", e.message().trim_end()),
            &format!("give {expected}: {}", setting.about),
        )
    })
}

impl Config {
    /// This configuration with `runtime` laid over its file instead of the settings it has:
    /// every value checked again, as when the node starts. An error names the key.
    pub fn with_runtime(&self, runtime: RuntimeSettings) -> Result<Config, ConfigError> {
        let origin = Origin::named(&format!(
            "{} (mesh-cli config set)",
            runtime.path().display()
        ));
        let raw: RawConfig = runtime
            .over(self.layers.file.clone())
            .try_into()
            .map_err(|e| origin.invalid("settings", e.message().to_owned(), "check the value"))?;
        let mut config =
            raw.validate_as(self.source.as_deref(), &origin, &self.layers.overrides)?;
        config.layers = Layers {
            file: self.layers.file.clone(),
            overrides: self.layers.overrides.clone(),
            runtime,
        };
        Ok(config)
    }

    /// Every runtime setting: its value here, and where it came from.
    pub fn runtime_settings(&self) -> Vec<Shown> {
        SETTABLE
            .iter()
            .map(|setting| {
                let file = lookup(&self.layers.file, setting.key).cloned();
                let runtime = lookup(&self.layers.runtime.table, setting.key).cloned();
                let source = match (&runtime, &file) {
                    (Some(_), _) => Source::Runtime,
                    (None, Some(_)) => Source::File,
                    (None, None) => Source::Default,
                };
                Shown {
                    key: setting.key,
                    about: setting.about,
                    value: (setting.value)(self),
                    source,
                    file,
                    runtime,
                }
            })
            .collect()
    }
}

/// Reads the configuration: the file (if any) with the flags, then the runtime settings of
/// the data dir it names laid over it.
pub(super) fn load(path: Option<&Path>, overrides: &Overrides) -> Result<Config, ConfigError> {
    let (raw, file) = match path {
        Some(path) => {
            let text = fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.to_owned(),
                source,
            })?;
            let raw = RawConfig::parse(&text, path)?;
            // Parsed once more as a plain table, to lay runtime settings over it.
            let file = toml::from_str::<Table>(&text).map_err(|e| ConfigError::Parse {
                path: path.to_owned(),
                message: e.to_string(),
            })?;
            (raw, file)
        }
        None => (RawConfig::default(), Table::new()),
    };
    let mut config = raw.validate(path, overrides)?;
    config.layers = Layers {
        file,
        overrides: overrides.clone(),
        runtime: RuntimeSettings::default(),
    };
    let runtime = RuntimeSettings::load(&config.data_dir)?;
    if runtime.is_empty() {
        config.layers.runtime = runtime;
        return Ok(config);
    }
    config.with_runtime(runtime)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A configuration from `file` (TOML) with `settings` (TOML) in its data dir.
    fn load_with(file: &str, settings: &str) -> (tempfile::TempDir, Result<Config, ConfigError>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("data");
        fs::create_dir_all(&data).expect("data dir");
        let path = dir.path().join("node.toml");
        fs::write(
            &path,
            format!(
                "[node]\ndata_dir = {:?}\n{file}",
                data.display().to_string()
            ),
        )
        .expect("write config");
        if !settings.is_empty() {
            fs::write(data.join(SETTINGS_FILE), settings).expect("write settings");
        }
        let config = Config::load(Some(&path), &Overrides::default());
        (dir, config)
    }

    fn shown<'a>(config: &'a [Shown], key: &str) -> &'a Shown {
        config.iter().find(|s| s.key == key).expect("listed")
    }

    #[test]
    fn a_runtime_setting_wins_over_the_file_and_both_are_shown() {
        let (_dir, config) = load_with(
            "[security]\nclient_max_tier = \"write\"\n[approval]\ntimeout_s = 60\n",
            "[security]\nclient_max_tier = \"shell\"\n",
        );
        let config = config.expect("valid");
        assert_eq!(config.client_max_tier, Tier::Shell);
        let settings = config.runtime_settings();
        let client = shown(&settings, "security.client_max_tier");
        assert_eq!(client.source, Source::Runtime);
        assert_eq!(client.value, Value::String("shell".into()));
        assert_eq!(client.file, Some(Value::String("write".into())));
        let timeout = shown(&settings, "approval.timeout_s");
        assert_eq!(
            (timeout.source, timeout.value.clone()),
            (Source::File, Value::Integer(60))
        );
        let mcp = shown(&settings, "security.mcp_max_tier");
        assert_eq!(
            (mcp.source, mcp.value.clone()),
            (Source::Default, Value::String("read".into()))
        );
    }

    #[test]
    fn command_line_values_take_shorthands_and_bad_ones_name_the_key() {
        let (_dir, config) = load_with("", "");
        let config = config.expect("valid");
        let runtime = config.layers.runtime.clone();
        let set = |key: &str, text: &str| {
            runtime
                .with(key, text)
                .and_then(|runtime| config.with_runtime(runtime))
        };
        let changed = set("approval.tiers", "write, shell").expect("a list of words");
        assert_eq!(changed.approval.tiers.len(), 2);
        let changed = set("resources.gpus", "RTX 4090:24576,A2000:6144").expect("gpus");
        assert_eq!(changed.gpus.len(), 2);
        assert_eq!(changed.gpus[0].name, "RTX 4090");
        assert_eq!(changed.gpus[1].vram_mb, 6144);
        let changed = set("resources.gpus", r#"[{name = "X", vram_mb = 1024}]"#).expect("toml");
        assert_eq!(changed.gpus[0].name, "X");
        let changed = set("http.loopback_without_key", "true").expect("switch");
        assert!(changed.http.loopback_without_key);
        assert_eq!(
            set("security.client_max_tier", "\"shell\"")
                .expect("quoted")
                .client_max_tier,
            Tier::Shell
        );

        for (key, text, named) in [
            (
                "security.client_max_tier",
                "root",
                "`security.client_max_tier`",
            ),
            ("approval.tiers", "write,root", "`approval.tiers[1]`"),
            ("approval.timeout_s", "soon", "`approval.timeout_s`"),
            ("approval.timeout_s", "100000", "`approval.timeout_s`"),
            (
                "http.loopback_without_key",
                "yes",
                "`http.loopback_without_key`",
            ),
            ("resources.gpus", "RTX 4090", "`resources.gpus[0]`"),
            ("resources.gpus", "X:0", "`resources.gpus[0].vram_mb`"),
            ("tasks.workers", "4", "`tasks.workers`"),
        ] {
            let message = set(key, text).expect_err(text).to_string();
            assert!(message.contains(named), "{key} {text}: {message}");
        }
        let message = set("tasks.workers", "4")
            .expect_err("not settable")
            .to_string();
        assert!(message.contains("config file"), "{message}");
    }

    #[test]
    fn a_bad_settings_file_is_refused_at_start_naming_the_file_and_the_key() {
        for (settings, named) in [
            ("[tasks]\nworkers = 4\n", "`tasks.workers`"),
            (
                "[security]\nclient_max_tier = \"root\"\n",
                "`security.client_max_tier`",
            ),
            (
                "[security]\nclient_max_tier = 5\n",
                "`security.client_max_tier`",
            ),
            ("nonsense = 1\n", "`nonsense`"),
        ] {
            let (_dir, config) = load_with("", settings);
            let message = config.expect_err(settings).to_string();
            assert!(message.contains(named), "{settings}: {message}");
            assert!(message.contains(SETTINGS_FILE), "{settings}: {message}");
        }
    }

    #[test]
    fn settings_are_saved_whole_and_read_back_and_unset_goes_back_to_the_file() {
        let (dir, config) = load_with("[approval]\ntiers = [\"write\"]\n", "");
        let config = config.expect("valid");
        let runtime = config
            .layers
            .runtime
            .with("approval.tiers", "shell")
            .expect("set");
        runtime.save().expect("save");
        let data = dir.path().join("data");
        assert_eq!(RuntimeSettings::load(&data).expect("load"), runtime);
        let changed = config.with_runtime(runtime.clone()).expect("valid");
        assert_eq!(
            changed.approval.tiers.iter().copied().collect::<Vec<_>>(),
            vec![Tier::Shell]
        );
        let back = changed
            .with_runtime(runtime.without("approval.tiers").expect("unset"))
            .expect("valid");
        assert_eq!(
            back.approval.tiers.iter().copied().collect::<Vec<_>>(),
            vec![Tier::Write]
        );
        assert!(back.layers.runtime.is_empty());
    }
}
