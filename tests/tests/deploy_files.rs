//! The files under deploy/ that install agentmesh as a service: every example config in
//! deploy/examples loads with the node's own config loader once its placeholder API key is
//! replaced (and is refused before; the directory holds exactly the documented three),
//! `systemd-analyze verify` finds nothing wrong with deploy/systemd/mesh-node.service, whose
//! install lines keep the config 0640 and the key 0600, and the config deploy/Dockerfile bakes
//! into the image loads and matches the ports and volume it declares.
//!
//! The unit test FAILS when `systemd-analyze` is not installed (`deploy/test.sh --setup-only`
//! installs it): checking the unit is the point, so it never passes without checking.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use mesh_node::config::{Backend, Config, Overrides, RawConfig, TlsMode};

/// The examples, as the docs list them.
const EXAMPLES: [&str; 3] = ["gpu-box.toml", "home-server.toml", "laptop.toml"];
/// Where the unit keeps the node's state (`StateDirectory=agentmesh`, `--data-dir`).
const STATE_DIR: &str = "/var/lib/agentmesh";
/// The binary the unit starts.
const INSTALLED_BIN: &str = "/usr/local/bin/mesh-node";

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// The placeholder `gpu-box.toml` holds where its API key goes: the node refuses it.
const PLACEHOLDER_KEY: &str = "REPLACE-ME-with-openssl-rand-hex-32";

/// A key as `openssl rand -hex 16` makes one, for the installed copies of the examples.
const OWN_KEY: &str = "3c1f9e0a7b5d2c8e4f6a1b0d9c7e5f3a";

/// The example `name` as an operator installs it: with the placeholder key replaced by a
/// key of their own, as its comment says.
fn load(name: &str) -> Config {
    let text = fs::read_to_string(deploy_dir().join("examples").join(name))
        .expect("the example is readable");
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join(name);
    fs::write(&path, text.replace(PLACEHOLDER_KEY, OWN_KEY)).expect("write the copy");
    Config::load(Some(&path), &Overrides::default())
        .unwrap_or_else(|e| panic!("deploy/examples/{name} must be a valid config: {e}"))
}

/// The `[[models]]` as written, without the default embedded model a node adds when the
/// machine running the test happens to have it in /var/lib/agentmesh/models.
fn models_in_file(name: &str) -> usize {
    let path = deploy_dir().join("examples").join(name);
    let text = fs::read_to_string(&path).expect("the example is readable");
    RawConfig::parse(&text, &path)
        .expect("the example parses")
        .models
        .len()
}

#[test]
fn the_examples_directory_holds_exactly_the_three_documented_configs() {
    let mut names: Vec<String> = fs::read_dir(deploy_dir().join("examples"))
        .expect("deploy/examples exists")
        .map(|entry| {
            entry
                .expect("a readable directory entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    assert_eq!(
        names, EXAMPLES,
        "deploy/examples must hold exactly the three examples docs/src/operations/running.md lists"
    );
}

#[test]
fn every_example_loads_and_matches_the_systemd_unit() {
    for name in EXAMPLES {
        let config = load(name);
        assert_eq!(
            config.data_dir,
            Path::new(STATE_DIR),
            "{name}: node.data_dir must be the unit's state directory"
        );
        match &config.tls {
            TlsMode::Mtls(files) => {
                for path in [&files.ca, &files.cert, &files.key] {
                    assert!(
                        path.starts_with("/etc/agentmesh/tls"),
                        "{name}: {} is not under /etc/agentmesh/tls",
                        path.display()
                    );
                }
            }
            other => panic!("{name}: expected mTLS files under /etc/agentmesh/tls, got {other:?}"),
        }
        assert!(config.discovery.mdns, "{name}: mDNS is on in every example");
    }
}

#[test]
fn the_laptop_runs_no_model_and_keeps_its_front_door_local() {
    let config = load("laptop.toml");
    assert_eq!(models_in_file("laptop.toml"), 0, "the laptop delegates");
    assert!(
        config.personas.is_empty(),
        "a node without roles has no personas"
    );
    assert!(config.http.listen.addr.ip().is_loopback());
}

#[test]
fn the_gpu_box_serves_ollama_models_on_the_lan_behind_keys() {
    let config = load("gpu-box.toml");
    assert_eq!(models_in_file("gpu-box.toml"), 2);
    for model in &config.models {
        match &model.backend {
            Backend::OpenAi { base_url, .. } => {
                assert_eq!(base_url, "http://127.0.0.1:11434/v1", "{}", model.name);
            }
            other => panic!("{}: expected an openai model, got {other:?}", model.name),
        }
    }
    assert_eq!(config.roles, vec!["chat", "coder"]);
    assert!(
        config.gpus.iter().all(|gpu| gpu.vram_mb > 0) && !config.gpus.is_empty(),
        "the GPU is declared with its VRAM"
    );
    assert!(!config.http.listen.addr.ip().is_loopback());
    assert!(
        !config.http.api_keys.is_empty(),
        "a front door on the LAN needs api_keys"
    );
}

/// The example ships a placeholder key so that it cannot be started as printed: the node
/// names the key and says how to make one.
#[test]
fn the_gpu_box_as_shipped_is_refused_until_its_placeholder_key_is_replaced() {
    let path = deploy_dir().join("examples/gpu-box.toml");
    let text = fs::read_to_string(&path).expect("the example is readable");
    assert!(
        text.contains(PLACEHOLDER_KEY),
        "the placeholder is in the file"
    );
    let message = Config::load(Some(&path), &Overrides::default())
        .expect_err("the placeholder key must be refused")
        .to_string();
    assert!(message.contains("`http.api_keys[0]`"), "{message}");
    assert!(message.contains("openssl rand -hex 32"), "{message}");
}

/// The install lines in the unit's header keep secrets private: the config (it may hold
/// `http.api_keys`) is 0640 for the service's group, the node's key 0600 for the service alone.
#[test]
fn the_units_install_lines_keep_the_config_and_key_private() {
    let unit = fs::read_to_string(deploy_dir().join("systemd/mesh-node.service"))
        .expect("deploy/systemd/mesh-node.service exists");
    let install_line = |target: &str| {
        unit.lines()
            .find(|line| line.contains("install -m") && line.contains(target))
            .unwrap_or_else(|| panic!("no install line for {target}"))
            .to_owned()
    };
    let config = install_line("/etc/agentmesh/mesh-node.toml");
    assert!(config.contains("-m 0640 -g agentmesh"), "{config}");
    let key = install_line("NAME.key");
    assert!(key.contains("-m 0600 -o agentmesh"), "{key}");
}

#[test]
fn the_home_server_runs_the_embedded_model_for_research() {
    let config = load("home-server.toml");
    assert_eq!(models_in_file("home-server.toml"), 1);
    match &config.models[0].backend {
        Backend::Embedded { path, .. } => assert_eq!(
            path,
            Path::new("/var/lib/agentmesh/models/SmolLM2-135M-Instruct.Q4_1.gguf")
        ),
        other => panic!("expected the embedded SmolLM2 model, got {other:?}"),
    }
    assert!(config.roles.iter().any(|role| role == "research"));
    assert!(
        !config
            .local_namespaces
            .iter()
            .any(|ns| ns == "cron" || ns == "cron_firings"),
        "the cron namespaces must stay replicated"
    );
}

#[test]
fn systemd_analyze_verify_finds_nothing_wrong_with_the_unit() {
    let unit_path = deploy_dir().join("systemd/mesh-node.service");
    let unit = fs::read_to_string(&unit_path).expect("deploy/systemd/mesh-node.service exists");
    let exec_start = format!(
        "ExecStart={INSTALLED_BIN} --config /etc/agentmesh/mesh-node.toml --data-dir {STATE_DIR}\n"
    );
    assert_eq!(
        unit.matches(&exec_start).count(),
        1,
        "the unit starts the installed binary with the config in /etc/agentmesh and the state directory: {exec_start}"
    );
    assert!(unit.contains("StateDirectory=agentmesh\n"));

    match Command::new("systemd-analyze").arg("--version").output() {
        Ok(output) => assert!(output.status.success(), "systemd-analyze --version failed"),
        Err(e) => panic!(
            "systemd-analyze is not available ({e}): install the Debian package `systemd` \
             (deploy/test.sh --setup-only installs it)"
        ),
    }

    // verify refuses a unit whose ExecStart binary does not exist; /usr/local/bin/mesh-node
    // is not installed on a build machine, so check a copy that starts the binary just built.
    let built = mesh_tests::bin("mesh-node");
    let dir = tempfile::tempdir().expect("temp dir");
    let copy = dir.path().join("mesh-node.service");
    fs::write(
        &copy,
        unit.replacen(
            &format!("ExecStart={INSTALLED_BIN} "),
            &format!("ExecStart={} ", built.display()),
            1,
        ),
    )
    .expect("write the unit copy");

    let output = Command::new("systemd-analyze")
        .args(["verify", "--recursive-errors=no", "--man=no"])
        .arg(&copy)
        .output()
        .expect("systemd-analyze runs");
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let about_the_unit: Vec<&str> = printed
        .lines()
        .filter(|line| line.contains("mesh-node") || line.contains(&*dir.path().to_string_lossy()))
        .collect();
    assert!(
        about_the_unit.is_empty(),
        "systemd-analyze verify complains about the unit:\n{printed}"
    );
    assert!(
        output.status.success(),
        "systemd-analyze verify failed ({}):\n{printed}",
        output.status
    );
}

/// The file deploy/Dockerfile writes into the image at `path` (its `printf` lines), as a
/// string.
fn dockerfile_file(dockerfile: &str, path: &str) -> String {
    let end = dockerfile
        .find(&format!("> {path}"))
        .unwrap_or_else(|| panic!("the Dockerfile writes {path}"));
    let start = dockerfile[..end]
        .rfind("printf '%s\\n'")
        .expect("with printf");
    dockerfile[start..end]
        .lines()
        .skip(1)
        .filter_map(|l| {
            let quoted = l.trim().trim_end_matches('\\').trim();
            quoted
                .strip_prefix('\'')?
                .strip_suffix('\'')
                .map(str::to_owned)
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The image's config loads with the node's loader, keeps state in the volume, and the ports
/// it exposes are the node's defaults. (Building the image needs a Docker daemon and its base
/// images, so that was verified by hand: docs/src/operations/container.md.)
#[test]
fn the_dockerfile_config_loads_and_its_ports_and_volume_are_the_nodes() {
    use mesh_node::config::{DEFAULT_HTTP_PORT, DEFAULT_PORT};
    let dockerfile = fs::read_to_string(deploy_dir().join("Dockerfile")).expect("Dockerfile");
    let text = dockerfile_file(&dockerfile, "/etc/agentmesh/mesh-node.toml");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("mesh-node.toml");
    fs::write(&path, &text).expect("write");
    let config = Config::load(Some(&path), &Overrides::default())
        .unwrap_or_else(|e| panic!("the Dockerfile's config must load: {e}\n{text}"));
    assert_eq!(config.data_dir, Path::new(STATE_DIR));
    assert_eq!(config.http.listen.addr.port(), DEFAULT_HTTP_PORT);
    assert!(
        dockerfile.contains(&format!(
            "EXPOSE {DEFAULT_PORT}/tcp {DEFAULT_HTTP_PORT}/tcp"
        )),
        "EXPOSE must list the node's default ports"
    );
    assert!(dockerfile.contains(&format!("VOLUME [\"{STATE_DIR}\"]")));
    assert!(dockerfile.contains("ENTRYPOINT [\"mesh-node-entrypoint\"]"));
    // Issue 26, item 3: the image listened on every interface with no key at all
    // (`allow_unauthenticated`); it needs its key now, in the volume.
    assert!(config.http.listen.addr.ip().is_unspecified());
    assert!(config.http.api_keys.is_empty(), "no plain key baked in");
    let [key] = config.http.keys.as_slice() else {
        panic!("one key: {:?}", config.http.keys)
    };
    assert!(
        matches!(&key.secret, mesh_node::config::KeySecret::File(path) if *path == Path::new(STATE_DIR).join("http.key")),
        "{key:?}"
    );
    assert!(key.policy.mcp, "the operator's key reaches /mcp");
    assert!(!text.contains("allow_unauthenticated"), "{text}");
}

/// The image's entrypoint makes the front door's key on first start, owner-only and long
/// enough for the node to take it, keeps it on later starts, and runs `mesh-node` with the
/// arguments given (here `--version`, from the directory the tests' binaries are in).
#[test]
fn the_dockerfile_entrypoint_makes_the_key_once_and_runs_the_node() {
    use std::os::unix::fs::PermissionsExt;
    let dockerfile = fs::read_to_string(deploy_dir().join("Dockerfile")).expect("Dockerfile");
    let script = dockerfile_file(&dockerfile, "/usr/local/bin/mesh-node-entrypoint");
    let dir = tempfile::tempdir().expect("tempdir");
    let entrypoint = dir.path().join("entrypoint");
    fs::write(&entrypoint, format!("{script}\n")).expect("write");
    let key = dir.path().join("http.key");
    let bin_dir = mesh_tests::bin("mesh-node")
        .parent()
        .expect("a directory")
        .to_owned();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let run = || {
        let output = Command::new("sh")
            .arg(&entrypoint)
            .arg("--version")
            .env("AGENTMESH_HTTP_KEY_FILE", &key)
            .env("PATH", &path)
            .output()
            .expect("sh");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(
            String::from_utf8_lossy(&output.stdout).contains("mesh-node"),
            "mesh-node ran"
        );
        fs::read_to_string(&key).expect("the key file")
    };
    let first = run();
    let line = first.lines().next().unwrap_or_default();
    assert!(
        line.starts_with("sk-mesh-") && line.len() == "sk-mesh-".len() + 64,
        "{first:?}"
    );
    let mode = fs::metadata(&key).expect("stat").permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "owner-only, as the node requires");
    assert_eq!(run(), first, "a second start keeps the key");
}

/// Issue 26: the base images are pinned by digest, so a rebuild pulls exactly the images it
/// was made with, not whatever their tags were last pushed to; and both are still build
/// arguments, so an operator can move them on (`--build-arg RUST_IMAGE=…`).
#[test]
fn the_dockerfile_pins_its_base_images_by_digest() {
    let dockerfile = fs::read_to_string(deploy_dir().join("Dockerfile")).expect("Dockerfile");
    for (arg, tag) in [
        ("RUST_IMAGE", "rust:1-bookworm"),
        ("RUNTIME_IMAGE", "debian:bookworm-slim"),
    ] {
        let default = dockerfile
            .lines()
            .find_map(|line| line.strip_prefix(&format!("ARG {arg}=")))
            .unwrap_or_else(|| panic!("`ARG {arg}=…` with a default"));
        let digest = default
            .strip_prefix(&format!("{tag}@sha256:"))
            .unwrap_or_else(|| panic!("{arg} is `{default}`, not {tag}@sha256:…"));
        assert!(
            digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit()),
            "{arg}: `{digest}` is not a SHA-256"
        );
    }
    assert!(dockerfile.contains("FROM ${RUST_IMAGE} AS builder"));
    assert!(dockerfile.contains("FROM ${RUNTIME_IMAGE}\n"));
}
