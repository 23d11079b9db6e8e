//! Checks `[resources]`, `[[models]]` with `[roles]`, and `[[personas]]`: the hardware the
//! operator declares, the models the node can run and the roles that chain them, and the
//! personas built on those roles. With no models and no roles it adds the zero-config embedded
//! model when its file is in the data dir (the one file it looks at, and only whether it is
//! there). It must not load a model or reach a server: a GGUF path is kept and a base URL is only
//! checked for its scheme. Tool names in `personas[i].tools` are not checked here; the tool
//! registry knows them.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    time::Duration,
};

use mesh_domain::Tier;

use crate::config::{
    defaults::{
        DEFAULT_CONTEXT_WINDOW, DEFAULT_MODEL_NAME, DEFAULT_ROLE, MAX_THREADS, default_model_path,
        default_threads,
    },
    error::{ConfigError, Origin},
    raw::{RawModel, RawPersona, RawResources},
    types::{Backend, GpuDecl, ModelConfig, PersonaConfig, SystemTurns},
    validate::syntax::is_valid_name,
};

/// `resources.gpus`.
pub(super) fn resources(raw: RawResources, origin: &Origin) -> Result<Vec<GpuDecl>, ConfigError> {
    let mut gpus = Vec::new();
    for (i, gpu) in raw.gpus.into_iter().enumerate() {
        if gpu.name.trim().is_empty() || gpu.name.len() > 128 {
            return Err(origin.invalid(
                &format!("resources.gpus[{i}].name"),
                "is empty or longer than 128 characters".into(),
                "name the GPU, e.g. `RTX 4090`",
            ));
        }
        if gpu.vram_mb == 0 {
            return Err(origin.invalid(
                &format!("resources.gpus[{i}].vram_mb"),
                "is 0".into(),
                "give the GPU's memory in MiB, e.g. 24576",
            ));
        }
        gpus.push(GpuDecl {
            name: gpu.name,
            vram_mb: gpu.vram_mb,
        });
    }
    Ok(gpus)
}

/// The models a node runs and the roles that chain them.
#[derive(Debug)]
pub(super) struct ModelSection {
    /// `[[models]]`, or the zero-config embedded model.
    pub(super) models: Vec<ModelConfig>,
    /// `[roles]`, or `chat` → the zero-config model.
    pub(super) role_chains: BTreeMap<String, Vec<String>>,
}

/// `[[models]]` and `[roles]`: every model checked for its backend, every role chain for
/// names of defined models. When both are empty, the zero-config model in `data_dir` is served
/// if deploy/fetch-model.sh put it there (`ModelRegistry` logs how to fetch it otherwise).
pub(super) fn models(
    raw_models: Vec<RawModel>,
    raw_roles: BTreeMap<String, Vec<String>>,
    data_dir: &Path,
    origin: &Origin,
) -> Result<ModelSection, ConfigError> {
    let mut models = Vec::new();
    let mut model_names = BTreeSet::new();
    for (i, raw) in raw_models.into_iter().enumerate() {
        models.push(model(i, raw, &mut model_names, origin)?);
    }

    for (role, chain) in &raw_roles {
        if !is_valid_name(role) {
            return Err(origin.invalid(
                &format!("roles.{role}"),
                "is not a valid role name".into(),
                "use 1-63 letters, digits, `-`, `_`",
            ));
        }
        if chain.is_empty() {
            return Err(origin.invalid(
                &format!("roles.{role}"),
                "is an empty list".into(),
                "list at least one model name, primary first",
            ));
        }
        for (i, model) in chain.iter().enumerate() {
            if !model_names.contains(model) {
                return Err(origin.invalid(
                    &format!("roles.{role}[{i}]"),
                    format!("names model `{model}`, which no [[models]] entry defines"),
                    "add a [[models]] entry with that name, or fix the spelling",
                ));
            }
        }
    }

    let mut role_chains = raw_roles;
    if models.is_empty() && role_chains.is_empty() {
        let path = default_model_path(data_dir);
        if path.is_file() {
            let name = DEFAULT_MODEL_NAME.to_owned();
            role_chains.insert(DEFAULT_ROLE.to_owned(), vec![name.clone()]);
            models.push(ModelConfig {
                name,
                backend: Backend::Embedded {
                    path,
                    threads: default_threads(),
                    context_window: DEFAULT_CONTEXT_WINDOW,
                    timeout: Duration::from_secs(120),
                },
                // The zero-config model is for chats; embeddings cost a second context.
                embeddings: false,
            });
        }
    }
    Ok(ModelSection {
        models,
        role_chains,
    })
}

/// `models[i]`, whose name must not be among `model_names` (the models before it); adds it.
fn model(
    i: usize,
    model: RawModel,
    model_names: &mut BTreeSet<String>,
    origin: &Origin,
) -> Result<ModelConfig, ConfigError> {
    let key = |field: &str| format!("models[{i}].{field}");
    if !is_valid_name(&model.name) {
        return Err(origin.invalid(
            &key("name"),
            format!("is `{}`", model.name),
            "use 1-63 letters, digits, `-`, `_`",
        ));
    }
    if !model_names.insert(model.name.clone()) {
        return Err(origin.invalid(
            &key("name"),
            format!("`{}` is defined twice", model.name),
            "give every model a unique name",
        ));
    }
    let timeout_s = model.timeout_s.unwrap_or(120);
    if timeout_s == 0 || timeout_s > 3600 {
        return Err(origin.invalid(
            &key("timeout_s"),
            format!("is {timeout_s}"),
            "use 1-3600 seconds",
        ));
    }
    let context_window = model
        .context_window
        .unwrap_or(if model.backend == "embedded" {
            DEFAULT_CONTEXT_WINDOW
        } else {
            8192
        });
    if context_window < 256 {
        return Err(origin.invalid(
            &key("context_window"),
            format!("is {context_window}"),
            "give the model's context window in tokens (at least 256)",
        ));
    }
    let system_turns = match model.system_turns.as_deref() {
        None | Some("anywhere") => SystemTurns::Anywhere,
        Some("first") if model.backend == "openai" => SystemTurns::First,
        Some("first") => {
            return Err(origin.invalid(
                &key("system_turns"),
                "is `first` for a model whose backend is not `openai`".into(),
                "remove it: the embedded backend renders system turns wherever they stand",
            ));
        }
        Some(other) => {
            return Err(origin.invalid(
                &key("system_turns"),
                format!("is `{other}`, not `anywhere` or `first`"),
                "write \"first\" when the server's chat template refuses a system message after the first (it then gets one system turn), else leave it out",
            ));
        }
    };
    if model.threads.is_some() && model.backend != "embedded" {
        return Err(origin.invalid(
            &key("threads"),
            "is set for a model whose backend is not `embedded`".into(),
            "remove it: only the embedded backend runs inference in this process",
        ));
    }
    let backend = match model.backend.as_str() {
        "openai" => {
            let base_url = model.base_url.ok_or_else(|| {
                origin.invalid(
                    &key("base_url"),
                    "is missing".into(),
                    "set the server's base URL, e.g. `http://127.0.0.1:11434/v1` for Ollama",
                )
            })?;
            if !(base_url.starts_with("http://") || base_url.starts_with("https://")) {
                return Err(origin.invalid(
                    &key("base_url"),
                    format!("is `{base_url}`, not an http(s) URL"),
                    "write it like `http://127.0.0.1:11434/v1`",
                ));
            }
            let model_name = model.model.filter(|m| !m.is_empty()).ok_or_else(|| {
                origin.invalid(
                    &key("model"),
                    "is missing".into(),
                    "set the model name the server knows, e.g. `qwen2.5-coder:7b`",
                )
            })?;
            Backend::OpenAi {
                base_url,
                model: model_name,
                api_key_env: model.api_key_env,
                context_window,
                timeout: Duration::from_secs(timeout_s),
                system_turns,
            }
        }
        "embedded" => {
            let path = model.path.filter(|p| !p.as_os_str().is_empty()).ok_or_else(|| {
                origin.invalid(
                    &key("path"),
                    "is missing".into(),
                    "set the GGUF file, e.g. `models/SmolLM2-135M-Instruct.Q4_1.gguf` (deploy/fetch-model.sh fetches it)",
                )
            })?;
            let threads = match model.threads {
                None => default_threads(),
                Some(n) if (1..=MAX_THREADS).contains(&n) => n,
                Some(n) => {
                    return Err(origin.invalid(
                        &key("threads"),
                        format!("is {n}"),
                        &format!(
                            "use 1-{MAX_THREADS} (default: the number of CPU cores, {} here)",
                            default_threads()
                        ),
                    ));
                }
            };
            Backend::Embedded {
                path,
                threads,
                context_window,
                timeout: Duration::from_secs(timeout_s),
            }
        }
        other => {
            return Err(origin.invalid(
                &key("backend"),
                format!("is `{other}`"),
                "use `openai` (any OpenAI-compatible server) or `embedded`",
            ));
        }
    };
    Ok(ModelConfig {
        name: model.name,
        backend,
        embeddings: model.embeddings,
    })
}

/// `[[personas]]`: unique names, a role the node serves (`roles`), a known tier.
pub(super) fn personas(
    raw: Vec<RawPersona>,
    roles: &BTreeSet<String>,
    origin: &Origin,
) -> Result<Vec<PersonaConfig>, ConfigError> {
    let mut personas = Vec::new();
    let mut persona_names = BTreeSet::new();
    for (i, persona) in raw.into_iter().enumerate() {
        let key = |field: &str| format!("personas[{i}].{field}");
        if !is_valid_name(&persona.name) || !persona_names.insert(persona.name.clone()) {
            return Err(origin.invalid(
                &key("name"),
                format!("`{}` is invalid or defined twice", persona.name),
                "give every persona a unique name of letters, digits, `-`, `_`",
            ));
        }
        if !roles.contains(&persona.role) {
            return Err(origin.invalid(
                &key("role"),
                format!(
                    "names role `{}`, which this node does not serve",
                    persona.role
                ),
                "add the role to [roles] (role = [\"model\"]) or to node.roles",
            ));
        }
        let max_tier = match persona.max_tier.as_deref() {
            None => Tier::Read,
            Some(text) => Tier::parse(text).ok_or_else(|| {
                origin.invalid(
                    &key("max_tier"),
                    format!("is `{text}`"),
                    "use `read`, `write` or `shell`",
                )
            })?,
        };
        personas.push(PersonaConfig {
            name: persona.name,
            role: persona.role,
            system_prompt: persona.system_prompt,
            tools: persona.tools,
            max_tier,
        });
    }
    Ok(personas)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{
        Config,
        raw::{Overrides, RawConfig},
        validate::tests::{err, parse},
    };

    #[test]
    fn embedded_models_get_their_defaults_and_a_checked_thread_count() {
        let config = parse(
            "[[models]]\nname = \"smol\"\nbackend = \"embedded\"\npath = \"m.gguf\"\n\
             [[models]]\nname = \"two\"\nbackend = \"embedded\"\npath = \"m.gguf\"\nthreads = 2\n\
             context_window = 4096\ntimeout_s = 30\n",
        )
        .expect("valid");
        assert_eq!(
            config.models[0].backend,
            Backend::Embedded {
                path: "m.gguf".into(),
                threads: default_threads(),
                context_window: DEFAULT_CONTEXT_WINDOW,
                timeout: std::time::Duration::from_secs(120),
            }
        );
        assert_eq!(
            config.models[1].backend,
            Backend::Embedded {
                path: "m.gguf".into(),
                threads: 2,
                context_window: 4096,
                timeout: std::time::Duration::from_secs(30),
            }
        );
        for threads in [0, MAX_THREADS + 1] {
            let e = err(&format!(
                "[[models]]\nname = \"m\"\nbackend = \"embedded\"\npath = \"m.gguf\"\nthreads = {threads}\n"
            ));
            assert!(e.contains("`models[0].threads`"), "{e}");
            assert!(e.contains("number of CPU cores"), "{e}");
        }
        let e = err(
            "[[models]]\nname = \"m\"\nbackend = \"openai\"\nbase_url = \"http://x/v1\"\nmodel = \"m\"\nthreads = 2\n",
        );
        assert!(e.contains("`models[0].threads`"), "{e}");
        let e = err("[[models]]\nname = \"m\"\nbackend = \"embedded\"\n");
        assert!(e.contains("`models[0].path`"), "{e}");
        assert!(e.contains("deploy/fetch-model.sh"), "{e}");
    }

    #[test]
    fn system_turns_default_to_anywhere_and_first_is_for_openai_servers() {
        let openai = "[[models]]\nname = \"m\"\nbackend = \"openai\"\nbase_url = \"http://x/v1\"\nmodel = \"m\"\n";
        let turns = |config: Config| match &config.models[0].backend {
            Backend::OpenAi { system_turns, .. } => *system_turns,
            other => panic!("{other:?}"),
        };
        assert_eq!(turns(parse(openai).expect("valid")), SystemTurns::Anywhere);
        assert_eq!(
            turns(parse(&format!("{openai}system_turns = \"first\"\n")).expect("valid")),
            SystemTurns::First
        );
        let e = err(&format!("{openai}system_turns = \"last\"\n"));
        assert!(e.contains("`models[0].system_turns`"), "{e}");
        assert!(e.contains("`last`"), "{e}");
        let e = err(
            "[[models]]\nname = \"m\"\nbackend = \"embedded\"\npath = \"m.gguf\"\nsystem_turns = \"first\"\n",
        );
        assert!(e.contains("`models[0].system_turns`"), "{e}");
    }

    #[test]
    fn embeddings_are_off_unless_a_model_says_so_on_either_backend() {
        let config = parse(
            "[[models]]\nname = \"chat\"\nbackend = \"openai\"\nbase_url = \"http://x/v1\"\nmodel = \"m\"\n\
             [[models]]\nname = \"embed\"\nbackend = \"openai\"\nbase_url = \"http://x/v1\"\nmodel = \"e\"\nembeddings = true\n\
             [[models]]\nname = \"smol\"\nbackend = \"embedded\"\npath = \"m.gguf\"\nembeddings = true\n",
        )
        .expect("valid");
        let embeds: Vec<_> = config
            .models
            .iter()
            .map(|m| (m.name.as_str(), m.embeddings))
            .collect();
        assert_eq!(embeds, [("chat", false), ("embed", true), ("smol", true)]);
        let e = err(
            "[[models]]\nname = \"m\"\nbackend = \"embedded\"\npath = \"m.gguf\"\nembeddings = \"yes\"\n",
        );
        assert!(e.contains("embeddings"), "{e}");
        assert!(e.contains("bool"), "{e}");
        let e = err(
            "[[models]]\nname = \"m\"\nbackend = \"embedded\"\npath = \"m.gguf\"\nembedding = true\n",
        );
        assert!(e.contains("embedding"), "{e}");
    }

    /// Tool names belong to the tool registry, not to config: a persona's list is kept as
    /// written, names config has never heard of included.
    #[test]
    fn persona_tool_lists_are_kept_as_written() {
        let config = parse(
            "[node]\nroles = [\"chat\"]\n[[personas]]\nname = \"p\"\nrole = \"chat\"\n\
             tools = [\"file_read\", \"a_tool_from_a_plugin\"]\n",
        )
        .expect("valid");
        let tools = config.personas[0].tools.clone().expect("a tool list");
        assert_eq!(tools, vec!["file_read", "a_tool_from_a_plugin"]);
    }

    #[test]
    fn zero_config_serves_the_default_embedded_model_only_when_it_was_fetched() {
        let dir = tempfile::tempdir().expect("temp dir");
        let overrides = Overrides {
            data_dir: Some(dir.path().to_owned()),
            ..Overrides::default()
        };
        let config = RawConfig::default()
            .validate(None, &overrides)
            .expect("valid");
        assert!(config.models.is_empty());
        assert!(config.role_chains.is_empty());

        let path = default_model_path(dir.path());
        std::fs::create_dir_all(path.parent().expect("models dir")).expect("mkdir");
        std::fs::write(&path, b"GGUF").expect("write");
        let config = RawConfig::default()
            .validate(None, &overrides)
            .expect("valid");
        assert_eq!(config.models.len(), 1);
        assert_eq!(config.models[0].name, "smollm2-135m");
        assert!(
            matches!(&config.models[0].backend, Backend::Embedded { path: p, .. } if *p == path)
        );
        assert_eq!(config.role_chains["chat"], vec!["smollm2-135m"]);
        assert_eq!(config.roles, vec!["chat"]);

        // Configured models win: the default is not added beside them.
        let path_toml = Path::new("node.toml");
        let config = RawConfig::parse(
            "[[models]]\nname = \"m\"\nbackend = \"openai\"\nbase_url = \"http://x/v1\"\nmodel = \"m\"\n",
            path_toml,
        )
        .expect("parse")
        .validate(Some(path_toml), &overrides)
        .expect("valid");
        assert_eq!(config.models.len(), 1);
        assert_eq!(config.models[0].name, "m");
    }
}
