//! Real mDNS, only ever inside network namespaces these tests create (loopback-only, or several
//! hosts on a bridge in a namespace of its own). Needs root; CI runs as root.

use std::{
    io::Write,
    process::{Command, Stdio},
    time::Duration,
};

use mesh_tests::{Harness, Lan, Netns, NodeOptions, bin, python3, wait_for};

const DEADLINE: Duration = Duration::from_secs(15);

/// A python-zeroconf browser: prints every `_agentmesh._tcp` instance with its TXT as JSON.
const BROWSE: &str = r#"
import json, sys, time
from zeroconf import ServiceBrowser, ServiceListener, Zeroconf
want = int(sys.argv[1])
zc = Zeroconf()
found = {}
class Listener(ServiceListener):
    def add_service(self, zc, kind, name):
        info = zc.get_service_info(kind, name, timeout=3000)
        if info:
            found[name] = {
                "port": info.port,
                "txt": {k.decode(): (v or b"").decode() for k, v in info.properties.items()},
            }
    update_service = add_service
    def remove_service(self, zc, kind, name):
        pass
ServiceBrowser(zc, "_agentmesh._tcp.local.", Listener())
deadline = time.time() + 15
while time.time() < deadline and len(found) < want:
    time.sleep(0.05)  # poll until found or the deadline
zc.close()
print(json.dumps(found))
"#;

/// Advertises a fake agentmesh instance that claims `id` and points at `port`, with a wrong `fp`,
/// until its stdin closes.
const SPOOF: &str = r#"
import socket, sys
from zeroconf import ServiceInfo, Zeroconf
node_id, port = sys.argv[1], int(sys.argv[2])
info = ServiceInfo(
    "_agentmesh._tcp.local.",
    "impostor._agentmesh._tcp.local.",
    addresses=[socket.inet_aton("127.0.0.1")],
    port=port,
    properties={"id": node_id, "v": "1", "roles": "coder", "gpu": "1", "fp": "0" * 64},
    server="impostor.local.",
)
zc = Zeroconf()
zc.register_service(info)
print("registered", flush=True)
sys.stdin.read()
zc.unregister_service(info)
zc.close()
"#;

/// `python3 -c` inside `ns`, with the tests' Python (which has zeroconf).
fn python(ns: &Netns) -> Command {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns.name()])
        .arg(python3())
        .arg("-c");
    cmd
}

#[test]
fn three_nodes_in_one_namespace_find_each_other_by_mdns() {
    let ns = Netns::new().expect("netns");
    let harness = Harness::new().expect("harness");
    let nodes: Vec<_> = ["alpha", "beta", "gamma"]
        .into_iter()
        .map(|name| {
            harness
                .spawn(NodeOptions::new(name).mdns_in(&ns))
                .expect("node")
        })
        .collect();
    let refs: Vec<_> = nodes.iter().collect();
    harness.wait_all_up(&refs, DEADLINE).expect("mesh by mDNS");
    // No static peers are configured, so every peer came from an advert, either directly or
    // because the advertised node dialed in first; at least one view shows the mDNS path.
    let mut sources = Vec::new();
    for node in &nodes {
        let status = harness.status(node).expect("status");
        for peer in status["nodes"].as_array().expect("nodes").iter().skip(1) {
            sources.push(peer["source"].as_str().expect("source").to_owned());
        }
    }
    assert!(sources.iter().any(|s| s == "mdns"), "{sources:?}");
    assert!(
        sources
            .iter()
            .all(|s| ["mdns", "dial-in", "exchange"].contains(&s.as_str())),
        "{sources:?}"
    );
}

#[test]
fn python_zeroconf_sees_the_advert_and_its_txt_keys() {
    let ns = Netns::new().expect("netns");
    let harness = Harness::new().expect("harness");
    let node = harness
        .spawn(NodeOptions::new("alpha").mdns_in(&ns))
        .expect("node");
    let output = python(&ns)
        .arg(BROWSE)
        .arg("1")
        .output()
        .expect("run python3 (deploy/test.sh --setup-only installs zeroconf)");
    assert!(
        output.status.success(),
        "python-zeroconf browser failed (did `deploy/test.sh --setup-only` install zeroconf?): {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let found: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json");
    let advert = &found["alpha._agentmesh._tcp.local."];
    assert!(advert.is_object(), "advert not seen: {found:#}");
    let port: u64 = node
        .addr
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .expect("port");
    assert_eq!(advert["port"], port);
    let txt = &advert["txt"];
    let status = harness.status(&node).expect("status");
    let own = &status["nodes"][0];
    assert_eq!(txt["id"], own["id"]);
    assert_eq!(txt["fp"], own["cert_fingerprint"]);
    assert_eq!(txt["v"], "1");
    assert_eq!(txt["gpu"], "0");
    assert!(txt.get("roles").is_some(), "{txt:#}");
}

#[test]
fn an_advert_whose_fp_does_not_match_the_certificate_brings_in_only_the_real_member() {
    let ns = Netns::new().expect("netns");
    let harness = Harness::new().expect("harness");
    // beta does not advertise; the impostor advert claims beta's id with a wrong fingerprint.
    let beta = harness
        .spawn(NodeOptions::new("beta").in_netns(&ns))
        .expect("beta");
    let alpha = harness
        .spawn(NodeOptions::new("alpha").mdns_in(&ns))
        .expect("alpha");
    let beta_id = harness.status(&beta).expect("status")["nodes"][0]["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let port = beta.addr.rsplit_once(':').expect("port").1.to_owned();
    let mut spoof = python(&ns)
        .arg(SPOOF)
        .arg(&beta_id)
        .arg(&port)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("python3 with zeroconf");

    // The advert only says where to announce: membership takes in whoever answers there with
    // signed datagrams, so alpha lists beta under beta's own certificate, never the advert's.
    let beta_fp = harness.status(&beta).expect("status")["nodes"][0]["cert_fingerprint"]
        .as_str()
        .expect("fp")
        .to_owned();
    let listed = wait_for("alpha to list beta", DEADLINE, || {
        let status = harness.status(&alpha).ok()?;
        let nodes = status["nodes"].as_array()?.clone();
        (nodes.len() > 1).then_some(nodes)
    });
    drop(spoof.stdin.take().map(|mut s| s.write_all(b"")));
    let _ = spoof.kill();
    let _ = spoof.wait();
    let nodes = listed.unwrap_or_else(|e| panic!("{e}\n{}", alpha.log_text()));
    assert_eq!(nodes.len(), 2, "{nodes:?}");
    assert_eq!(nodes[1]["id"], beta_id.as_str());
    assert_eq!(
        nodes[1]["cert_fingerprint"],
        beta_fp.as_str(),
        "the advert's fingerprint changes nothing"
    );
}

#[test]
fn three_hosts_on_a_bridge_discover_each_other_and_talk_mtls_across_it() {
    let lan = Lan::new(3).expect("lan");
    let harness = Harness::new().expect("harness");
    let nodes: Vec<_> = ["alpha", "beta", "gamma"]
        .into_iter()
        .enumerate()
        .map(|(i, name)| {
            let mut options = NodeOptions::new(name).mdns_in(&lan.hosts[i]);
            options.listen = "0.0.0.0:7700".into();
            harness.spawn(options).expect("node")
        })
        .collect();
    let refs: Vec<_> = nodes.iter().collect();
    harness
        .wait_all_up(&refs, DEADLINE)
        .expect("mesh across the bridge");
    for (i, node) in nodes.iter().enumerate() {
        let status = harness.status(node).expect("status");
        for peer in status["nodes"].as_array().expect("nodes").iter().skip(1) {
            let addr = peer["addr"].as_str().expect("addr");
            assert!(
                addr.starts_with("10.77.0.") && addr.ends_with(":7700"),
                "host {i} reaches {} at {addr}, not across the bridge",
                peer["name"]
            );
        }
    }
    // mesh-cli on one host reaches a node on another host over mTLS.
    let output = Command::new("ip")
        .args(["netns", "exec", lan.hosts[0].name()])
        .arg(bin("mesh-cli"))
        .args(["--node", &format!("{}:7700", Lan::addr(2))])
        .arg("--ca")
        .arg(&harness.client_files().ca)
        .arg("--cert")
        .arg(&harness.client_files().cert)
        .arg("--key")
        .arg(&harness.client_files().key)
        .args(["nodes", "show", "gamma", "--json"])
        .output()
        .expect("mesh-cli");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
