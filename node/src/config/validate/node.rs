//! Checks `[node]`, `[discovery]`, `[tls]` and `[http]`: who the node is, where it listens and
//! keeps its state, how it finds and authenticates its peers, and where its front door is. The
//! flags (`--name`, `--listen`, `--data-dir`, `--static-peer`, `--no-mdns`, `--insecure`,
//! `--insecure-allow-remote`) are applied here. It must not touch the network or the certificate
//! files: an address is parsed, never bound; a certificate path is kept, never read.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
    path::PathBuf,
    time::Duration,
};

use mesh_join::bootstrap::default_data_dir;
use mesh_tls::TlsFiles;

use crate::config::{
    defaults::{
        DEFAULT_DRAIN_ON_STOP_S, DEFAULT_HTTP_PORT, DEFAULT_PORT, MAX_ADVERT_DIALS,
        MAX_DRAIN_ON_STOP_S, MAX_FAILING_ADDRS, default_name,
    },
    error::{ConfigError, Origin},
    raw::{Overrides, RawDiscovery, RawHttp, RawNode, RawTls},
    types::{Discovery, HttpConfig, Listen, TlsMode},
    validate::syntax::{is_host_port, is_valid_name},
};

/// The `[node]` keys that say who the node is and where it listens and keeps its state.
#[derive(Debug)]
pub(super) struct NodeSection {
    /// `node.name` or `--name`, else the host name.
    pub(super) name: String,
    /// Whether `name` is the host name (neither `node.name` nor `--name` was given).
    pub(super) name_from_host: bool,
    /// `node.listen` or `--listen`, else the default port with fallback.
    pub(super) listen: Listen,
    /// `node.data_dir` or `--data-dir`, else the platform's data dir.
    pub(super) data_dir: PathBuf,
    /// `node.labels`.
    pub(super) labels: BTreeMap<String, String>,
}

/// `node.name`, `node.listen`, `node.data_dir` and `node.labels`; a flag wins over the file.
/// `node.roles` and `node.min_free_disk_mb` have functions of their own ([`served_roles`],
/// [`min_free_disk`]).
pub(super) fn node(
    raw: &RawNode,
    overrides: &Overrides,
    origin: &Origin,
) -> Result<NodeSection, ConfigError> {
    let given = overrides.name.clone().or_else(|| raw.name.clone());
    let name_from_host = given.is_none();
    let name = given.unwrap_or_else(default_name);
    if !is_valid_name(&name) {
        return Err(origin.invalid(
            "node.name",
            format!("is `{name}`, which is not a valid node name"),
            "use 1-63 ASCII letters, digits, `-` or `_` (it is the mDNS instance name)",
        ));
    }

    let listen = match overrides.listen.clone().or_else(|| raw.listen.clone()) {
        None => Listen {
            addr: SocketAddr::from(([0, 0, 0, 0], DEFAULT_PORT)),
            fallback: true,
        },
        Some(text) => Listen {
            addr: text.parse().map_err(|_| {
                origin.invalid(
                    "node.listen",
                    format!("is `{text}`, not an IP:port address"),
                    "write it like `0.0.0.0:7700` or `127.0.0.1:7700` (`[::]:7700` for IPv6)",
                )
            })?,
            fallback: false,
        },
    };

    let data_dir = match overrides.data_dir.clone().or_else(|| raw.data_dir.clone()) {
        Some(dir) if dir.as_os_str().is_empty() => {
            return Err(origin.invalid(
                "node.data_dir",
                "is empty".into(),
                "set a directory the node may write to, or remove the key for the default",
            ));
        }
        Some(dir) => dir,
        None => default_data_dir().ok_or_else(|| {
            origin.invalid(
                "node.data_dir",
                "has no default on this platform".into(),
                "set node.data_dir or pass --data-dir",
            )
        })?,
    };

    let mut labels = BTreeMap::new();
    for (key, value) in &raw.labels {
        if key.is_empty() || key.len() > 63 || value.len() > 253 {
            return Err(origin.invalid(
                &format!("node.labels.{key}"),
                "is too long or empty".into(),
                "use label keys of 1-63 characters and values of at most 253",
            ));
        }
        labels.insert(key.clone(), value.clone());
    }

    Ok(NodeSection {
        name,
        name_from_host,
        listen,
        data_dir,
        labels,
    })
}

/// `node.roles`, added to the roles that have a model chain (`role_chains`): every role the
/// node serves.
pub(super) fn served_roles(
    role_chains: &BTreeMap<String, Vec<String>>,
    node_roles: Vec<String>,
    origin: &Origin,
) -> Result<BTreeSet<String>, ConfigError> {
    let mut roles: BTreeSet<String> = role_chains.keys().cloned().collect();
    for (i, role) in node_roles.into_iter().enumerate() {
        if !is_valid_name(&role) {
            return Err(origin.invalid(
                &format!("node.roles[{i}]"),
                format!("is `{role}`"),
                "use 1-63 letters, digits, `-`, `_`",
            ));
        }
        roles.insert(role);
    }
    Ok(roles)
}

/// `node.min_free_disk_mb` (default 100), in bytes.
pub(super) fn min_free_disk(
    min_free_disk_mb: Option<u64>,
    origin: &Origin,
) -> Result<u64, ConfigError> {
    let min_free_disk_mb = min_free_disk_mb.unwrap_or(100);
    min_free_disk_mb.checked_mul(1 << 20).ok_or_else(|| {
        origin.invalid(
            "node.min_free_disk_mb",
            format!("is {min_free_disk_mb} MiB, more than any disk holds"),
            "give the free space to keep in MiB, e.g. 100, or 0 to turn the floor off",
        )
    })
}

/// `node.drain_on_stop_s` (default 10, at most [`MAX_DRAIN_ON_STOP_S`]).
pub(super) fn drain_on_stop(
    drain_on_stop_s: Option<u64>,
    origin: &Origin,
) -> Result<Duration, ConfigError> {
    match drain_on_stop_s.unwrap_or(DEFAULT_DRAIN_ON_STOP_S) {
        seconds @ 0..=MAX_DRAIN_ON_STOP_S => Ok(Duration::from_secs(seconds)),
        seconds => Err(origin.invalid(
            "node.drain_on_stop_s",
            format!("is {seconds} s, more than {MAX_DRAIN_ON_STOP_S} s (an hour)"),
            "give the seconds a stopping node may wait for its running tasks, e.g. 10, or 0 to leave at once; keep it under the stop timeout of whatever runs the node (systemd's TimeoutStopSec)",
        )),
    }
}

/// `[discovery]`, with `--static-peer` added to the file's peers and `--no-mdns` turning mDNS
/// off.
pub(super) fn discovery(
    raw: RawDiscovery,
    overrides: &Overrides,
    origin: &Origin,
) -> Result<Discovery, ConfigError> {
    let mut static_peers = raw.static_peers;
    static_peers.extend(overrides.static_peers.iter().cloned());
    for (i, peer) in static_peers.iter().enumerate() {
        if !is_host_port(peer) {
            return Err(origin.invalid(
                &format!("discovery.static_peers[{i}]"),
                format!("is `{peer}`, not host:port"),
                "write peers like `192.168.1.20:7700` or `gpu-box.lan:7700`",
            ));
        }
    }
    static_peers.dedup();
    for (i, ifname) in raw.interfaces.iter().enumerate() {
        if ifname.is_empty() {
            return Err(origin.invalid(
                &format!("discovery.interfaces[{i}]"),
                "is empty".into(),
                "list interface names as `ip link` shows them, e.g. `eth0`",
            ));
        }
    }
    // Each pending dial may hold a socket, so the cap stays well under the open-files limit.
    if !(1..=MAX_ADVERT_DIALS).contains(&raw.max_advert_dials) {
        return Err(origin.invalid(
            "discovery.max_advert_dials",
            format!(
                "is {}, not between 1 and {MAX_ADVERT_DIALS}",
                raw.max_advert_dials
            ),
            "give the number of nodes that may appear on the LAN at once, e.g. the default 64",
        ));
    }
    if !(1..=MAX_FAILING_ADDRS).contains(&raw.max_failing_addrs) {
        return Err(origin.invalid(
            "discovery.max_failing_addrs",
            format!(
                "is {}, not between 1 and {MAX_FAILING_ADDRS}",
                raw.max_failing_addrs
            ),
            "give how many failing addresses to hold back, e.g. the default 4096",
        ));
    }
    Ok(Discovery {
        mdns: raw.mdns && !overrides.no_mdns,
        interfaces: raw.interfaces,
        static_peers,
        max_advert_dials: raw.max_advert_dials,
        max_failing_addrs: raw.max_failing_addrs,
    })
}

/// `[tls]`, with `--insecure` and `--insecure-allow-remote`. Plain TCP is refused on a
/// non-loopback `listen` address unless remote use is allowed explicitly. `tls.ca_key` (an
/// issuer) goes only with the three certificate paths.
pub(super) fn tls(
    raw: RawTls,
    overrides: &Overrides,
    listen: Listen,
    origin: &Origin,
) -> Result<(TlsMode, Option<PathBuf>), ConfigError> {
    let ca_key = raw.ca_key.clone();
    let insecure = raw.insecure || overrides.insecure;
    let allow_remote = raw.insecure_allow_remote || overrides.insecure_allow_remote;
    let tls = match (insecure, raw.ca, raw.cert, raw.key) {
        (true, None, None, None) => TlsMode::Insecure,
        (true, ..) if overrides.insecure => TlsMode::Insecure,
        (true, ..) => {
            return Err(origin.invalid(
                "tls.insecure",
                "is true while tls.ca / tls.cert / tls.key are also set".into(),
                "choose one: remove tls.insecure, or remove the certificate paths",
            ));
        }
        (false, None, None, None) => TlsMode::Bootstrap,
        (false, Some(ca), Some(cert), Some(key)) => TlsMode::Mtls(TlsFiles { ca, cert, key }),
        (false, ca, cert, _) => {
            let missing = if ca.is_none() {
                "tls.ca"
            } else if cert.is_none() {
                "tls.cert"
            } else {
                "tls.key"
            };
            return Err(origin.invalid(
                missing,
                "is missing".into(),
                "set all three of tls.ca, tls.cert and tls.key (see `mesh-cli ca --help`), or none to use the node's own CA in its data dir",
            ));
        }
    };
    if tls == TlsMode::Insecure && !listen.addr.ip().is_loopback() && !allow_remote {
        return Err(origin.invalid(
            "tls.insecure",
            format!(
                "is set while listening on {}, which is not a loopback address",
                listen.addr
            ),
            "listen on 127.0.0.1, use mTLS, or add --insecure-allow-remote if you accept unauthenticated plain-text traffic on your network",
        ));
    }
    match (&tls, &ca_key) {
        (TlsMode::Insecure, Some(_)) => Err(origin.invalid(
            "tls.ca_key",
            "is set on an insecure node".into(),
            "an issuer hands out certificates over TLS only: remove tls.ca_key or tls.insecure",
        )),
        (TlsMode::Bootstrap, Some(_)) => Err(origin.invalid(
            "tls.ca_key",
            "is set without tls.ca, tls.cert and tls.key".into(),
            "set all three with it, or remove it: a zero-config node is an issuer already when its data dir holds the CA key (tls/ca.key)",
        )),
        _ => Ok((tls, ca_key)),
    }
}

/// `[http]`: the front door stays on loopback unless `http.listen` says otherwise (`--listen`
/// moves the gRPC server only).
pub(super) fn http(raw: RawHttp, origin: &Origin) -> Result<HttpConfig, ConfigError> {
    let listen = match raw.listen {
        None => Listen {
            addr: SocketAddr::from(([127, 0, 0, 1], DEFAULT_HTTP_PORT)),
            fallback: true,
        },
        Some(text) => Listen {
            addr: text.parse().map_err(|_| {
                origin.invalid(
                    "http.listen",
                    format!("is `{text}`, not an IP:port address"),
                    "write it like `127.0.0.1:7780` (loopback only) or `0.0.0.0:7780` (with http.api_keys)",
                )
            })?,
            fallback: false,
        },
    };
    for (i, key) in raw.api_keys.iter().enumerate() {
        if let Some(problem) = weak_api_key(key) {
            return Err(origin.invalid(
                &format!("http.api_keys[{i}]"),
                problem.into(),
                "make a key nobody can guess, e.g. with `openssl rand -hex 32`, and give it to the front door's clients",
            ));
        }
    }
    let keys = super::keys::http_keys(raw.keys, origin)?;
    match (
        raw.api_keys.is_empty() && keys.is_empty(),
        raw.allow_unauthenticated,
    ) {
        (true, false) if !listen.addr.ip().is_loopback() => {
            return Err(origin.invalid(
                "http.api_keys",
                format!(
                    "is empty while http.listen is {}, which is not a loopback address: anyone who can reach it could use every model of the mesh",
                    listen.addr
                ),
                "set http.api_keys (make each key with `openssl rand -hex 32`), listen on 127.0.0.1, or set http.allow_unauthenticated = true if everyone who can reach that address may use the front door",
            ));
        }
        (false, true) => {
            return Err(origin.invalid(
                "http.allow_unauthenticated",
                "is true while http.api_keys or [[http.keys]] are also set".into(),
                "choose one: remove http.allow_unauthenticated to require the keys, or remove the keys",
            ));
        }
        _ => {}
    }
    let allowed_hosts = each(
        &raw.allowed_hosts,
        origin,
        ("http.allowed_hosts", "a host name"),
        mesh_domain::origin::host_port,
        "write a name or address as clients put it in `Host`, with or without a port: `mesh.example.com`, `mesh-node:7780`, `[fd00::5]`",
    )?;
    let allowed_origins = each(
        &raw.allowed_origins,
        origin,
        ("http.allowed_origins", "a web origin"),
        mesh_domain::origin::origin,
        "write the origin of the page as a browser sends it, `scheme://host[:port]` with no path: `https://chat.example.com`, `http://localhost:3000` (`null` and `*` are not allowed)",
    )?;
    Ok(HttpConfig {
        listen,
        api_keys: raw.api_keys,
        keys,
        allowed_hosts,
        allowed_origins,
        unknown_fields: super::clients::unknown_fields(raw.unknown_fields.as_deref(), origin)?,
        model_aliases: super::clients::model_aliases(raw.model_aliases, origin)?,
        loopback_without_key: raw.loopback_without_key,
    })
}

/// Every entry of the list `key` read by `parse`; the first that is not `what` is an error
/// naming it (`key[i]`) with `fix`.
fn each<T>(
    list: &[String],
    origin: &Origin,
    (key, what): (&str, &str),
    parse: impl Fn(&str) -> Option<T>,
    fix: &str,
) -> Result<Vec<T>, ConfigError> {
    list.iter()
        .enumerate()
        .map(|(i, text)| {
            parse(text).ok_or_else(|| {
                origin.invalid(
                    &format!("{key}[{i}]"),
                    format!("is `{text}`, not {what}"),
                    fix,
                )
            })
        })
        .collect()
}

/// The shortest API key accepted: 16 characters (64 bits of hex), so that a short password
/// typed by hand is refused.
const MIN_API_KEY_LEN: usize = 16;

/// The words of placeholders that examples, tutorials and templates put where a key goes,
/// compared with a key lowercased and stripped of everything but letters and digits. A key
/// from `openssl rand -hex` (digits and a-f) never contains one; a random base64 key does once
/// in about a billion.
const PLACEHOLDER_WORDS: [&str; 9] = [
    "changeme",
    "replaceme",
    "yourapikey",
    "yourkey",
    "apikeyhere",
    "placeholder",
    "secret",
    "password",
    "example",
];

/// Why `key` is no key to guard the front door with (too short, has whitespace, a known
/// placeholder such as `changeme` or `sk-xxxx…`), or `None` for a key that looks random. Pure,
/// so the rule is tested with a table.
fn weak_api_key(key: &str) -> Option<&'static str> {
    if key.chars().any(char::is_whitespace) {
        return Some("contains whitespace");
    }
    if key.chars().count() < MIN_API_KEY_LEN {
        return Some("is shorter than 16 characters");
    }
    let plain: String = key
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect();
    if PLACEHOLDER_WORDS.iter().any(|word| plain.contains(word)) {
        return Some(
            "is a placeholder (a word such as `changeme`, `replace-me` or `secret`), not a key",
        );
    }
    // `sk-xxxxxxxxxxxxxxxx`, `0000000000000000`: one character makes up more than half the key.
    // A random hex key of 16 characters does so about twice in a million times, a longer one
    // practically never.
    let most_common = key
        .chars()
        .map(|c| key.chars().filter(|&d| d == c).count())
        .max()
        .unwrap_or(0);
    if most_common * 2 > key.chars().count() {
        return Some("repeats one character for more than half its length, like a placeholder");
    }
    None
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::{
        raw::RawConfig,
        validate::tests::{err, parse},
    };

    #[test]
    fn the_front_door_listens_on_loopback_unless_an_address_is_given() {
        let loopback = SocketAddr::from(([127, 0, 0, 1], DEFAULT_HTTP_PORT));
        let texts = [
            "",
            "[node]\nlisten = \"0.0.0.0:7700\"\n",
            "[http]\n",
            "[http]\napi_keys = [\"0123456789abcdef\"]\n",
        ];
        for text in texts {
            let http = parse(text).expect("valid").http;
            assert_eq!(http.listen.addr, loopback, "{text:?}");
            assert!(http.listen.fallback, "{text:?}");
        }
        // The `--listen` flag moves the gRPC server only.
        let path = Path::new("node.toml");
        let overrides = Overrides {
            listen: Some("0.0.0.0:7700".into()),
            ..Overrides::default()
        };
        let config = RawConfig::parse("", path)
            .expect("parse")
            .validate(Some(path), &overrides)
            .expect("valid");
        assert!(config.listen.addr.ip().is_unspecified());
        assert_eq!(config.http.listen.addr, loopback);
        // Only an explicit address leaves loopback.
        let http = parse("[http]\nlisten = \"0.0.0.0:7780\"\nallow_unauthenticated = true\n")
            .expect("valid")
            .http;
        assert!(http.listen.addr.ip().is_unspecified());
        assert!(!http.listen.fallback);
    }

    #[test]
    fn a_front_door_beyond_loopback_needs_keys_or_explicit_permission() {
        let key = "3c1f9e0a7b5d2c8e4f6a1b0d9c7e5f3a";
        for listen in ["0.0.0.0:7780", "192.168.1.20:7780", "[::]:7780"] {
            let open = format!("[http]\nlisten = \"{listen}\"\n");
            let message = err(&open);
            assert!(message.contains("`http.api_keys` is empty"), "{message}");
            assert!(message.contains(listen), "{message}");
            assert!(message.contains("http.allow_unauthenticated"), "{message}");
            assert!(message.contains("openssl rand -hex 32"), "{message}");
            parse(&format!("{open}api_keys = [\"{key}\"]\n")).expect("keys guard it");
            parse(&format!("{open}allow_unauthenticated = true\n")).expect("allowed");
        }
        for loopback in ["127.0.0.1:7780", "127.0.0.1:0", "[::1]:7780"] {
            parse(&format!("[http]\nlisten = \"{loopback}\"\n")).expect("loopback is fine");
        }
        let both = format!("[http]\napi_keys = [\"{key}\"]\nallow_unauthenticated = true\n");
        let message = err(&both);
        assert!(
            message.contains("`http.allow_unauthenticated`"),
            "{message}"
        );
        assert!(message.contains("choose one"), "{message}");
    }

    #[test]
    fn allowed_hosts_and_origins_are_read_into_one_form_and_bad_ones_named() {
        let http = parse(
            "[http]\nallowed_hosts = [\"Mesh-Node:7780\", \"mesh.example.com\"]\nallowed_origins = [\"HTTPS://Chat.Example.com:443\"]\n",
        )
        .expect("valid")
        .http;
        assert_eq!(http.allowed_hosts[0].host, "mesh-node");
        assert_eq!(http.allowed_hosts[0].port, Some(7780));
        assert_eq!(http.allowed_hosts[1].port, None);
        assert_eq!(http.allowed_origins, ["https://chat.example.com"]);
        assert!(
            parse("[http]\n")
                .expect("valid")
                .http
                .allowed_origins
                .is_empty()
        );
        for (text, named) in [
            (
                "allowed_hosts = [\"ok\", \"http://x\"]",
                "`http.allowed_hosts[1]` is `http://x`, not a host name",
            ),
            (
                "allowed_origins = [\"null\"]",
                "`http.allowed_origins[0]` is `null`, not a web origin",
            ),
            (
                "allowed_origins = [\"https://a.example/app\"]",
                "`http.allowed_origins[0]`",
            ),
        ] {
            let message = err(&format!("[http]\n{text}\n"));
            assert!(message.contains(named), "{text}: {message}");
        }
    }

    #[test]
    fn weak_api_keys_are_refused_by_index_with_how_to_make_one() {
        let table = [
            ("changeme", Some("shorter than 16")),
            ("0123456789abcde", Some("shorter than 16")),
            ("two words here, long", Some("whitespace")),
            ("changeme-changeme-1", Some("placeholder")),
            ("CHANGE-ME-please-now", Some("placeholder")),
            ("REPLACE-ME-with-openssl-rand-hex-24", Some("placeholder")),
            ("your-api-key-goes-here", Some("placeholder")),
            ("my-super-secret-key", Some("placeholder")),
            ("password1234567890", Some("placeholder")),
            ("example-key-0123456789", Some("placeholder")),
            ("sk-xxxxxxxxxxxxxxxxxxxx", Some("repeats one character")),
            ("0000000000000000", Some("repeats one character")),
            ("0123456789abcdef", None),
            ("test-key-0123456789", None),
            ("3c1f9e0a7b5d2c8e4f6a1b0d9c7e5f3a", None),
            ("sk-proj-Qm9uZXlCYWRnZXJUb2tlbg", None),
        ];
        for (key, expected) in table {
            let problem = weak_api_key(key);
            match expected {
                None => assert_eq!(problem, None, "{key}"),
                Some(part) => assert!(
                    problem.is_some_and(|p| p.contains(part)),
                    "{key}: {problem:?}, expected {part:?}"
                ),
            }
        }
        let message =
            err("[http]\napi_keys = [\"3c1f9e0a7b5d2c8e4f6a1b0d9c7e5f3a\", \"changeme\"]\n");
        assert!(message.contains("`http.api_keys[1]`"), "{message}");
        assert!(message.contains("openssl rand -hex 32"), "{message}");
    }

    #[test]
    fn insecure_needs_loopback_or_explicit_permission() {
        let text = "[node]\nlisten = \"127.0.0.1:7700\"\n[tls]\ninsecure = true";
        assert_eq!(
            parse(text).expect("loopback is fine").tls,
            TlsMode::Insecure
        );
        let remote = "[node]\nlisten = \"0.0.0.0:7700\"\n[tls]\ninsecure = true\ninsecure_allow_remote = true";
        assert_eq!(parse(remote).expect("allowed").tls, TlsMode::Insecure);
    }

    #[test]
    fn ca_key_needs_the_three_certificate_paths() {
        let issuer =
            "[tls]\nca = \"ca.pem\"\ncert = \"n.pem\"\nkey = \"n.key\"\nca_key = \"ca.key\"";
        assert_eq!(
            parse(issuer).expect("issuer").ca_key,
            Some(PathBuf::from("ca.key"))
        );
        for text in [
            "[tls]\nca_key = \"ca.key\"",
            "[node]\nlisten = \"127.0.0.1:7700\"\n[tls]\ninsecure = true\nca_key = \"ca.key\"",
        ] {
            let err = parse(text).expect_err(text).to_string();
            assert!(err.contains("tls.ca_key"), "{err}");
        }
    }

    /// Issue 26: whether the name was given or is the host's decides what a certificate of
    /// another name does at start (see `server::node_name`).
    #[test]
    fn a_name_nobody_gave_is_the_host_name_and_says_so() {
        let path = Path::new("node.toml");
        let given = RawConfig::parse("[node]\nname = \"file\"", path)
            .expect("parse")
            .validate(Some(path), &Overrides::default())
            .expect("valid");
        assert!(!given.name_from_host);
        let host = RawConfig::parse("[node]\n", path)
            .expect("parse")
            .validate(Some(path), &Overrides::default())
            .expect("valid");
        assert!(host.name_from_host);
        assert_eq!(host.name, crate::config::defaults::default_name());
    }

    #[test]
    fn flags_override_the_file() {
        let path = Path::new("node.toml");
        let raw = RawConfig::parse(
            "[node]\nname = \"file\"\nlisten = \"127.0.0.1:7000\"\n[discovery]\nstatic_peers = [\"a:1\"]",
            path,
        )
        .expect("parse");
        let overrides = Overrides {
            name: Some("flag".into()),
            listen: Some("127.0.0.1:0".into()),
            static_peers: vec!["b:2".into()],
            no_mdns: true,
            insecure: true,
            ..Overrides::default()
        };
        let config = raw.validate(Some(path), &overrides).expect("valid");
        assert_eq!(config.name, "flag");
        assert!(!config.name_from_host);
        assert_eq!(config.listen.addr.port(), 0);
        assert_eq!(config.discovery.static_peers, vec!["a:1", "b:2"]);
        assert!(!config.discovery.mdns);
        assert_eq!(config.tls, TlsMode::Insecure);
    }
}
