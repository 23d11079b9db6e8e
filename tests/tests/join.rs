//! Joining in two commands: `mesh-cli token create` where the CA key is, `mesh-node --join
//! TOKEN` (or `mesh-cli join TOKEN`) on the new device. Real processes on loopback with mDNS
//! off, and one test with real mDNS inside a network namespace.

use std::{
    path::Path,
    process::{Command, Stdio},
    sync::Arc,
    time::Duration,
};

use mesh_cert::{
    CertIdentity, CertRole,
    ca::{self, CaSigner},
};
use mesh_join::token::{JoinToken, TokenKey, unix_now};
use mesh_proto::v1 as pb;
use mesh_tests::{Harness, Netns, NodeOptions, NodeProcess, TokenVia, bin, wait_for};
use mesh_tls::Dialer;
use rustls::pki_types::pem::PemObject;

const DEADLINE: Duration = Duration::from_secs(15);

/// `mesh-cli token create` with the harness CA for `issuer`.
fn create_token(h: &Harness, issuer: &NodeProcess, args: &[&str]) -> String {
    let output = Command::new(bin("mesh-cli"))
        .args(["token", "create", "--dir"])
        .arg(h.ca_dir())
        .args(["--issuer", &issuer.addr])
        .args(args)
        .output()
        .expect("run mesh-cli");
    assert!(
        output.status.success(),
        "token create: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .expect("utf-8")
        .trim()
        .to_owned()
}

/// `mesh-node --join TOKEN` on a fresh data dir, expected to fail: its stderr. A node that
/// joins instead runs until killed, so it is given a deadline.
fn join_fails(dir: &Path, token: &str) -> String {
    join_fails_as(dir, "newcomer", token)
}

/// [`join_fails`] for a node named `name`.
fn join_fails_as(dir: &Path, name: &str, token: &str) -> String {
    let stderr = dir.join("stderr");
    let mut child = Command::new(bin("mesh-node"))
        .args(["--name", name, "--listen", "127.0.0.1:0", "--no-mdns"])
        .arg("--data-dir")
        .arg(dir)
        .args(["--join", token])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr).expect("stderr file"))
        .spawn()
        .expect("run mesh-node");
    let exited = wait_for("mesh-node --join to give up", DEADLINE, || {
        child.try_wait().ok().flatten()
    });
    let text = std::fs::read_to_string(&stderr).unwrap_or_default();
    let Ok(status) = exited else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("mesh-node joined instead of refusing the token:\n{text}");
    };
    assert_eq!(status.code(), Some(1), "must fail: {text}");
    text
}

#[test]
fn a_node_joins_with_a_token_and_rejoins_without_it_and_the_token_is_then_used_up() {
    let h = Harness::new().expect("harness");
    let alpha = h.spawn(NodeOptions::new("alpha").issuer()).expect("issuer");
    let token = create_token(&h, &alpha, &["--ttl", "10m"]);

    let mut beta = h
        .spawn(NodeOptions::new("beta").join(&token))
        .expect("joiner");
    h.wait_all_up(&[&alpha, &beta], DEADLINE)
        .expect("the joined node is in the mesh");

    // Its key was made here and stays private; it got a node certificate from the mesh CA; it
    // holds no CA key.
    let tls = beta.data_dir.join("tls");
    let cert = std::fs::read_to_string(tls.join("beta.pem")).expect("certificate");
    let der = rustls::pki_types::CertificateDer::from_pem_slice(cert.as_bytes()).expect("pem");
    let identity = CertIdentity::from_der(&der).expect("parse");
    assert_eq!(identity.role, Some(CertRole::Node));
    assert_eq!(identity.common_name.as_deref(), Some("beta"));
    assert_eq!(
        std::fs::read(tls.join("ca.pem")).expect("ca"),
        std::fs::read(h.ca_dir().join(ca::CA_CERT_FILE)).expect("harness ca")
    );
    assert!(!tls.join(ca::CA_KEY_FILE).exists());
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(tls.join("beta.key"))
        .expect("key")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    assert!(
        alpha
            .metrics()
            .expect("metrics")
            .contains(r#"agentmesh_join_redemptions_total{outcome="issued"} 1"#),
        "the issuer counted the redemption"
    );

    // A restart needs no token: the node uses its certificate and dials its issuer again.
    beta.signal("TERM").expect("stop");
    beta.wait_exit(DEADLINE).expect("stopped");
    let beta = h
        .spawn(NodeOptions::new("beta").join(&token))
        .expect("with the same token again: already a member, nothing is redeemed");
    h.wait_all_up(&[&alpha, &beta], DEADLINE).expect("back");
    drop(beta);
    let beta = h
        .spawn(NodeOptions::new("beta").zero_config_tls())
        .expect("without --join");
    h.wait_all_up(&[&alpha, &beta], DEADLINE).expect("back");

    // A one-use token is now used up: another device is refused, saying so.
    let fresh = tempfile::tempdir().expect("tempdir");
    let stderr = join_fails(fresh.path(), &token);
    assert!(stderr.contains("already been used"), "{stderr}");
    assert!(!fresh.path().join("tls").join("newcomer.pem").exists());
}

/// Issue 26: the issuer does not issue a node certificate for a name it or a live member
/// holds (its holder's peers would refuse the newcomer), says so with the way out, and the
/// token is not used up: the same token then joins a node under a free name.
#[test]
fn the_issuer_refuses_a_name_a_live_member_holds_and_keeps_the_token() {
    let h = Harness::new().expect("harness");
    let alpha = h.spawn(NodeOptions::new("alpha").issuer()).expect("issuer");
    let beta = h
        .spawn(NodeOptions::new("beta").peer(&alpha.addr))
        .expect("beta");
    h.wait_all_up(&[&alpha, &beta], DEADLINE)
        .expect("alpha and beta");
    let token = create_token(&h, &alpha, &["--ttl", "10m"]);
    for name in ["beta", "alpha"] {
        let fresh = tempfile::tempdir().expect("tempdir");
        let stderr = join_fails_as(fresh.path(), name, &token);
        let refusal = format!("cannot issue a node certificate for `{name}`");
        for part in [refusal.as_str(), "held by", "--name"] {
            assert!(stderr.contains(part), "`{part}` missing:\n{stderr}");
        }
        assert!(
            !fresh
                .path()
                .join("tls")
                .join(format!("{name}.pem"))
                .exists()
        );
    }
    assert!(
        alpha
            .metrics()
            .expect("metrics")
            .contains(r#"agentmesh_join_redemptions_total{outcome="name_in_use"} 2"#),
        "both refusals counted"
    );
    let gamma = h
        .spawn(NodeOptions::new("gamma").join(&token))
        .expect("the one use is still there");
    h.wait_all_up(&[&alpha, &beta, &gamma], DEADLINE)
        .expect("gamma joined");
}

#[test]
fn an_expired_token_is_refused_saying_so() {
    let h = Harness::new().expect("harness");
    let alpha = h.spawn(NodeOptions::new("alpha").issuer()).expect("issuer");
    let ca = CaSigner::load(
        &h.ca_dir().join(ca::CA_CERT_FILE),
        &h.ca_dir().join(ca::CA_KEY_FILE),
    )
    .expect("ca");
    let token = JoinToken {
        ca_fingerprint: ca.fingerprint().to_owned(),
        secret: TokenKey::of(&ca)
            .mint(ca.fingerprint(), CertRole::Node, unix_now() - 60, 1)
            .expect("mint"),
        issuer: alpha.addr.clone(),
    };
    let fresh = tempfile::tempdir().expect("tempdir");
    let stderr = join_fails(fresh.path(), &token.to_string());
    assert!(stderr.contains("expired"), "{stderr}");
    assert!(
        alpha
            .metrics()
            .expect("metrics")
            .contains(r#"agentmesh_join_redemptions_total{outcome="expired"} 1"#),
        "refused by the issuer"
    );
}

#[test]
fn a_token_pinning_another_ca_is_refused_before_its_secret_is_sent() {
    let h = Harness::new().expect("harness");
    let alpha = h.spawn(NodeOptions::new("alpha").issuer()).expect("issuer");
    // A token of another mesh pointed at alpha: alpha's CA does not match its pin.
    let other = tempfile::tempdir().expect("tempdir");
    ca::ca_init(other.path()).expect("other ca");
    let output = Command::new(bin("mesh-cli"))
        .args(["token", "create", "--dir"])
        .arg(other.path())
        .args(["--issuer", &alpha.addr])
        .output()
        .expect("run mesh-cli");
    assert!(output.status.success());
    let token = String::from_utf8(output.stdout).expect("utf-8");

    let fresh = tempfile::tempdir().expect("tempdir");
    let stderr = join_fails(fresh.path(), token.trim());
    // alpha never saw a redemption attempt (a malformed, forged or any other one would count).
    let metrics = alpha.metrics().expect("metrics");
    assert!(
        !metrics.contains("agentmesh_join_redemptions_total{"),
        "{metrics}"
    );
    assert!(stderr.contains("secret was not sent"), "{stderr}");
}

#[test]
fn a_malformed_token_or_one_for_a_client_is_refused_with_what_to_do() {
    let h = Harness::new().expect("harness");
    let alpha = h.spawn(NodeOptions::new("alpha").issuer()).expect("issuer");
    let fresh = tempfile::tempdir().expect("tempdir");
    let output = Command::new(bin("mesh-node"))
        .args(["--no-mdns", "--join", "K10abc::server:secret"])
        .arg("--data-dir")
        .arg(fresh.path())
        .output()
        .expect("run mesh-node");
    assert_eq!(output.status.code(), Some(2), "bad usage");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("does not start with `agentmesh-join:`"),
        "{stderr}"
    );

    let client = create_token(&h, &alpha, &["--role", "client"]);
    let stderr = join_fails(fresh.path(), &client);
    assert!(stderr.contains("mesh-cli join TOKEN"), "{stderr}");
}

#[test]
fn an_operator_joins_mesh_cli_with_a_client_token() {
    let h = Harness::new().expect("harness");
    let alpha = h.spawn(NodeOptions::new("alpha").issuer()).expect("issuer");
    let token = create_token(&h, &alpha, &["--role", "client", "--uses", "2"]);
    let home = tempfile::tempdir().expect("tempdir");
    let cli = |args: &[&str]| {
        Command::new(bin("mesh-cli"))
            .args(args)
            .env("HOME", home.path())
            .env("XDG_CONFIG_HOME", home.path().join("config"))
            .env_remove("MESH_NODE")
            .output()
            .expect("run mesh-cli")
    };
    let output = cli(&["join", &token, "--name", "laptop"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let dir = home.path().join("config").join("agentmesh");
    let files = mesh_join::bootstrap::user_cli_files(&dir);
    let tls = mesh_tls::MeshTls::load(&files).expect("the written files load");
    assert_eq!(tls.identity().role, Some(CertRole::Client));

    // The certificate works: status through it.
    let (ca, cert, key) = (
        files.ca.display().to_string(),
        files.cert.display().to_string(),
        files.key.display().to_string(),
    );
    let args = [
        "--node",
        &alpha.addr,
        "--ca",
        &ca,
        "--cert",
        &cert,
        "--key",
        &key,
        "status",
        "--json",
    ];
    let output = cli(&args);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    // Joining again would overwrite the files: refused, naming the file.
    let output = cli(&["join", &token]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("already exists"), "{stderr}");
    // A node token is not for mesh-cli.
    let node_token = create_token(&h, &alpha, &[]);
    let stderr = String::from_utf8_lossy(&cli(&["join", &node_token]).stderr).into_owned();
    assert!(stderr.contains("mesh-node --join TOKEN"), "{stderr}");
}

/// A client that presents no certificate and trusts the harness CA.
fn certless(h: &Harness) -> Dialer {
    let pem = std::fs::read(h.ca_dir().join(ca::CA_CERT_FILE)).expect("ca");
    let mut roots = rustls::RootCertStore::empty();
    for der in rustls::pki_types::CertificateDer::pem_slice_iter(&pem) {
        roots.add(der.expect("pem")).expect("add");
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    Dialer::Tls(Arc::new(config))
}

#[tokio::test]
async fn a_caller_without_a_certificate_reaches_only_join() {
    let h = Harness::new().expect("harness");
    let alpha = h.spawn(NodeOptions::new("alpha").issuer()).expect("issuer");
    let beta = h.spawn(NodeOptions::new("beta")).expect("not an issuer");
    let channel = certless(&h)
        .connect(&alpha.addr)
        .await
        .expect("an issuer completes the handshake without a client certificate")
        .channel;

    let ca = pb::join_client::JoinClient::new(channel.clone())
        .get_ca(pb::GetCaRequest {})
        .await
        .expect("Join is open");
    assert!(ca.get_ref().ca_pem.contains("BEGIN CERTIFICATE"));

    let mut refusals = Vec::new();
    refusals.push((
        "Node.GetInfo",
        pb::node_client::NodeClient::new(channel.clone())
            .get_info(pb::GetInfoRequest {})
            .await
            .map(|_| ()),
    ));
    refusals.push((
        "Node.ListPeers",
        pb::node_client::NodeClient::new(channel.clone())
            .list_peers(pb::ListPeersRequest {})
            .await
            .map(|_| ()),
    ));
    refusals.push((
        "Node.WatchPeers",
        pb::node_client::NodeClient::new(channel.clone())
            .watch_peers(pb::WatchPeersRequest {})
            .await
            .map(|_| ()),
    ));
    refusals.push((
        "Tasks.List",
        pb::tasks_client::TasksClient::new(channel.clone())
            .list(pb::ListTasksRequest::default())
            .await
            .map(|_| ()),
    ));
    refusals.push((
        "Memory.Get",
        pb::memory_client::MemoryClient::new(channel.clone())
            .get(pb::MemoryGetRequest::default())
            .await
            .map(|_| ()),
    ));
    refusals.push((
        "Memory.Namespaces",
        pb::memory_client::MemoryClient::new(channel.clone())
            .namespaces(pb::MemoryNamespacesRequest {})
            .await
            .map(|_| ()),
    ));
    refusals.push((
        "Memory.Sync",
        pb::memory_client::MemoryClient::new(channel.clone())
            .sync(pb::MemorySyncRequest::default())
            .await
            .map(|_| ()),
    ));
    refusals.push((
        "Cron.List",
        pb::cron_client::CronClient::new(channel.clone())
            .list(pb::CronListRequest::default())
            .await
            .map(|_| ()),
    ));
    refusals.push((
        "Models.Chat",
        pb::models_client::ModelsClient::new(channel.clone())
            .chat(pb::ChatCall::default())
            .await
            .map(|_| ()),
    ));
    refusals.push((
        "Models.Embed",
        pb::models_client::ModelsClient::new(channel.clone())
            .embed(pb::EmbedCall::default())
            .await
            .map(|_| ()),
    ));
    refusals.push((
        "Health.Check",
        tonic_health::pb::health_client::HealthClient::new(channel.clone())
            .check(tonic_health::pb::HealthCheckRequest::default())
            .await
            .map(|_| ()),
    ));
    for (call, result) in refusals {
        let status = result.expect_err(call);
        assert_eq!(
            status.code(),
            tonic::Code::Unauthenticated,
            "{call}: {status:?}"
        );
    }

    // A node that is not an issuer still requires a certificate in the handshake itself.
    let refused = match certless(&h).connect(&beta.addr).await {
        Err(_) => true,
        Ok(connection) => pb::node_client::NodeClient::new(connection.channel)
            .get_info(pb::GetInfoRequest {})
            .await
            .is_err_and(|s| s.code() != tonic::Code::Unauthenticated),
    };
    assert!(refused, "a non-issuer refuses the TLS handshake");
}

/// The issuer here is a CA box outside the mesh (mDNS off, no peers), so the joined node can
/// find the running mesh only by mDNS.
#[test]
fn a_node_joins_a_running_mesh_found_by_mdns_in_a_namespace() {
    let ns = Netns::new().expect("netns");
    let h = Harness::new().expect("harness");
    let alpha = h
        .spawn(NodeOptions::new("alpha").issuer().in_netns(&ns))
        .expect("issuer");
    let gamma = h
        .spawn(NodeOptions::new("gamma").mdns_in(&ns))
        .expect("member");
    let delta = h
        .spawn(NodeOptions::new("delta").mdns_in(&ns))
        .expect("member");
    h.wait_all_up(&[&gamma, &delta], DEADLINE).expect("mesh");
    let token = create_token(&h, &alpha, &[]);
    let beta = h
        .spawn(NodeOptions::new("beta").join(&token).mdns_in(&ns))
        .expect("joiner");
    h.wait_all_up(&[&beta, &gamma, &delta], DEADLINE)
        .expect("the joined node is in the running mesh");
    // Nobody told beta of gamma or delta, nor them of beta: the first sighting between beta
    // and the mesh was an mDNS advert (the other side then saw a dial-in, and the third node
    // may have been passed on by peer exchange).
    let source = |observer: &NodeProcess, name: &str| {
        let status = h.status(observer).expect("status");
        status["nodes"]
            .as_array()
            .expect("nodes")
            .iter()
            .find(|n| n["name"] == name)
            .and_then(|n| n["source"].as_str().map(str::to_owned))
            .expect("listed")
    };
    let sources = [
        source(&beta, "gamma"),
        source(&gamma, "beta"),
        source(&beta, "delta"),
        source(&delta, "beta"),
    ];
    assert!(sources.contains(&"mdns".to_owned()), "{sources:?}");
}

/// Regression (issue 26): the issuer's one budget of 30 attempts a minute was spent before the
/// MAC was checked, so 35 calls without a certificate and with a made-up secret locked a real
/// join out for a minute; and the caller's name was logged as sent, so a name with a line break
/// wrote a forged line into the issuer's log. Now the MAC comes first (forgeries are limited
/// per address and apart), and the name is logged escaped.
#[tokio::test(flavor = "multi_thread")]
async fn forged_redemptions_lock_out_no_real_join_and_a_callers_name_is_logged_escaped() {
    let h = Harness::new().expect("harness");
    let alpha = h
        .spawn(NodeOptions::new("alpha").issuer().human_log())
        .expect("issuer");
    let other = tempfile::tempdir().expect("tempdir");
    ca::ca_init(other.path()).expect("other CA");
    let other = CaSigner::load(
        &other.path().join(ca::CA_CERT_FILE),
        &other.path().join(ca::CA_KEY_FILE),
    )
    .expect("other CA");
    let forged = mesh_join::token::create_token(
        &other,
        CertRole::Node,
        Duration::from_secs(600),
        1,
        &alpha.addr,
    )
    .expect("token")
    .secret
    .to_string();
    let channel = certless(&h)
        .connect(&alpha.addr)
        .await
        .expect("an issuer takes a caller without a certificate")
        .channel;
    let mut join = pb::join_client::JoinClient::new(channel);
    let injected = "evil\nFORGED-LINE INFO mesh_node::issuer: issued a certificate";
    let mut codes = Vec::new();
    for n in 0..35 {
        let refused = join
            .redeem(pb::RedeemRequest {
                secret: forged.clone(),
                name: if n == 0 { injected.into() } else { "x".into() },
                csr_pem: String::new(),
            })
            .await
            .expect_err("a forged secret");
        codes.push(refused.code());
    }
    assert!(
        codes[..30]
            .iter()
            .all(|c| *c == tonic::Code::PermissionDenied),
        "{codes:?}"
    );
    assert!(
        codes[30..]
            .iter()
            .all(|c| *c == tonic::Code::ResourceExhausted),
        "{codes:?}"
    );

    // A real join from the same address goes through at once.
    let token = create_token(&h, &alpha, &[]);
    let beta = h
        .spawn(NodeOptions::new("beta").join(&token))
        .expect("the real join");
    h.wait_all_up(&[&alpha, &beta], DEADLINE).expect("joined");

    let log = alpha.log_text();
    assert!(
        log.lines().all(|line| !line.starts_with("FORGED-LINE")),
        "the name wrote a line of its own:\n{log}"
    );
    assert!(
        log.contains(r"evil\nFORGED-LINE"),
        "the name is logged, escaped:\n{log}"
    );
}

/// A join token given on standard input (`--join -`) or in `MESH_JOIN_TOKEN` joins the node as
/// one given as an argument does, and never shows in the process's command line, which every
/// local user can read (`ps`, `/proc/PID/cmdline`); `mesh-cli join -` reads it from standard
/// input too.
#[test]
fn a_join_token_on_stdin_or_in_the_environment_works_and_is_not_in_the_command_line() {
    let h = Harness::new().expect("harness");
    let alpha = h.spawn(NodeOptions::new("alpha").issuer()).expect("issuer");
    let token = create_token(&h, &alpha, &["--uses", "2"]);
    let secret = token
        .split(':')
        .nth(2)
        .and_then(|rest| rest.split('@').next())
        .expect("the secret part")
        .to_owned();
    let mut joined = Vec::new();
    for (name, via) in [("beta", TokenVia::Stdin), ("gamma", TokenVia::Environment)] {
        let node = h
            .spawn(NodeOptions::new(name).join(&token).join_via(via))
            .unwrap_or_else(|e| panic!("{name} joins with the token via {via:?}: {e}"));
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", node.pid())).expect("cmdline");
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        assert!(
            !cmdline.contains(&secret) && !cmdline.contains("agentmesh-join:"),
            "{via:?}: the token is in the command line: {cmdline}"
        );
        assert!(cmdline.contains("mesh-node"), "{cmdline}");
        joined.push(node);
    }
    h.wait_all_up(&[&alpha, &joined[0], &joined[1]], DEADLINE)
        .expect("both joined");

    // mesh-cli join -: the token from standard input; nothing on stdin is refused, saying so.
    let client = create_token(&h, &alpha, &["--role", "client"]);
    let home = tempfile::tempdir().expect("tempdir");
    let join = |stdin: &str| {
        let mut child = Command::new(bin("mesh-cli"))
            .args(["join", "-", "--name", "laptop"])
            .env("HOME", home.path())
            .env("XDG_CONFIG_HOME", home.path().join("config"))
            .env_remove("MESH_JOIN_TOKEN")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run mesh-cli");
        use std::io::Write;
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(stdin.as_bytes())
            .expect("write the token");
        child.wait_with_output().expect("mesh-cli join")
    };
    let empty = join("");
    assert_eq!(empty.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&empty.stderr);
    assert!(stderr.contains("standard input held no token"), "{stderr}");
    let output = join(&format!("{client}\n"));
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let files = mesh_join::bootstrap::user_cli_files(&home.path().join("config/agentmesh"));
    mesh_tls::MeshTls::load(&files).expect("the joined files load");
}
