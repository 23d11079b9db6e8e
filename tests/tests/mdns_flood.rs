//! A flood of spoofed mDNS adverts, only ever inside a network namespace this test creates: the
//! nodes' open files and memory stay bounded and the real nodes stay (and come) up. Needs root;
//! CI runs as root.
//!
//! The adverts are sent as raw mDNS response packets built with python-zeroconf's DNS classes
//! (registering 10,000 services one by one takes minutes: each is probed and announced with
//! delays), four services to a packet, each complete (PTR, SRV, TXT, A) so a node resolves it
//! from the packet alone. Half point at 400 listeners the script holds open (the kernel accepts
//! the TCP connection; nothing ever speaks TLS), half at random ports of random 127/8 addresses
//! (refused), each with a random claimed id and name.

use std::{
    io::{BufRead, BufReader, Write},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use mesh_tests::{Harness, Netns, NodeOptions, NodeProcess, python3, wait_for};

/// Spoofed adverts sent.
const ADVERTS: usize = 10_000;
/// Open files the flood may add to a node. A node dials at most `discovery.max_advert_dials`
/// (64 by default) adverts at once, one socket each; the rest is the normal churn of a node.
/// Without the cap every advert starts a session and the count reaches the thousands.
const MAX_EXTRA_FDS: usize = 150;
/// Memory the flood may add to a node: mdns-sd's cache of 10,000 adverts and the bounded
/// tables of the dialer stay in tens of MB.
const MAX_EXTRA_RSS_KB: u64 = 100 * 1024;
/// How long the real nodes may take to (re)connect.
const DEADLINE: Duration = Duration::from_secs(20);
/// How long resources are watched after the flood began: longer than a spoofed advert's dial
/// session can live (3 attempts of at most 2 s each, with back-off between).
const WATCH: Duration = Duration::from_secs(8);

const FLOOD: &str = r#"
import os, random, socket, sys, time
from zeroconf import ServiceInfo
from zeroconf._protocol.outgoing import DNSOutgoing
from zeroconf.const import _FLAGS_AA, _FLAGS_QR_RESPONSE

count = int(sys.argv[1])
TYPE = "_agentmesh._tcp.local."
holes = []
for _ in range(400):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(4096)
    holes.append(s)
ports = [s.getsockname()[1] for s in holes]
tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
tx.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton("127.0.0.1"))
tx.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)

def spoof(i):
    name = "spoof-%d-%s" % (i, os.urandom(3).hex())
    if i % 2:
        addr, port = "127.0.0.1", random.choice(ports)
    else:
        addr = "127.%d.%d.%d" % (random.randint(1, 254), random.randint(0, 254), random.randint(1, 254))
        port = random.randint(20000, 60000)
    return ServiceInfo(
        TYPE, name + "." + TYPE,
        addresses=[socket.inet_aton(addr)], port=port, server=name + ".local.",
        properties={"id": os.urandom(32).hex(), "v": "1", "fp": os.urandom(32).hex(),
                    "roles": "chat", "gpu": "0"},
    )

def send(first, last):
    for start in range(first, last, 4):
        out = DNSOutgoing(_FLAGS_QR_RESPONSE | _FLAGS_AA)
        for i in range(start, min(start + 4, last)):
            info = spoof(i)
            for record in [info.dns_pointer(), info.dns_service(), info.dns_text(), *info.dns_addresses()]:
                out.add_answer_at_time(record, 0)
        for packet in out.packets():
            tx.sendto(packet, ("224.0.0.251", 5353))
        if start % 400 == 0:
            time.sleep(0.01)  # pace the sender so the receivers' socket buffers take most of it

# Half the flood, then the rest once the test has started a real node in the middle of it.
send(0, count // 2)
print("half", flush=True)
sys.stdin.readline()
send(count // 2, count)
print("sent", flush=True)
sys.stdin.read()  # hold the listeners open until the test ends

"#;

/// Raises each node's peak open files and memory in `peak` to what it uses now.
fn sample(nodes: &[&NodeProcess], peak: &mut [(usize, u64)]) {
    for (node, peak) in nodes.iter().zip(peak.iter_mut()) {
        let (fds, rss) = (node.open_fds(), node.rss_kib());
        *peak = (peak.0.max(fds), peak.1.max(rss));
    }
}

#[test]
fn a_flood_of_spoofed_adverts_leaves_sockets_and_memory_bounded_and_real_peers_up() {
    let ns = Netns::new().expect("netns");
    // Alone, as the flood is the test (see `Harness::alone`).
    let harness = Harness::alone().expect("harness");
    let alpha = harness
        .spawn(NodeOptions::new("alpha").mdns_in(&ns))
        .expect("alpha");
    let beta = harness
        .spawn(NodeOptions::new("beta").mdns_in(&ns))
        .expect("beta");
    harness
        .wait_all_up(&[&alpha, &beta], DEADLINE)
        .expect("alpha and beta by mDNS");
    let baseline: Vec<_> = [&alpha, &beta]
        .map(|node| (node.open_fds(), node.rss_kib()))
        .into();

    let mut flood = Command::new("ip")
        .args(["netns", "exec", ns.name()])
        .arg(python3())
        .arg("-c")
        .arg(FLOOD)
        .arg(ADVERTS.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 with zeroconf (deploy/test.sh --setup-only installs it)");
    let started = Instant::now();
    let mut lines = BufReader::new(flood.stdout.take().expect("stdout")).lines();
    let half = lines.next().and_then(Result::ok);
    // A real node that appears in the middle of the flood: its advert goes out between the two
    // halves, and it is found by mDNS like any other.
    let gamma = harness
        .spawn(NodeOptions::new("gamma").mdns_in(&ns))
        .expect("gamma");
    let mut stdin = flood.stdin.take().expect("stdin");
    let _ = stdin.write_all(b"go\n");
    let sent = lines.next().and_then(Result::ok);
    let flood_took = started.elapsed();

    // Until gamma is up everywhere, and at least as long as a spoofed advert's dial session can
    // live: sample resources, and see that alpha and beta never stop listing each other up.
    let mut peak = baseline.clone();
    let mut lapses = Vec::new();
    let up = wait_for("gamma to be listed up everywhere", DEADLINE, || {
        sample(&[&alpha, &beta], &mut peak);
        for (observer, other) in [(&alpha, &beta), (&beta, &alpha)] {
            let state = harness.state_of(observer, &other.name);
            if state.as_deref() != Some("up") {
                lapses.push(format!("{} saw {} {state:?}", observer.name, other.name));
            }
        }
        let gamma_up = harness
            .wait_all_up(&[&alpha, &beta, &gamma], Duration::ZERO)
            .is_ok();
        (gamma_up && started.elapsed() >= WATCH).then_some(())
    });
    let up_after = harness.wait_all_up(&[&alpha, &beta, &gamma], DEADLINE);

    drop(stdin);
    let _ = flood.kill();
    let flood_out = flood.wait_with_output().expect("flood script");
    assert_eq!(
        (half.as_deref(), sent.as_deref()),
        (Some("half"), Some("sent")),
        "flood script failed: {}",
        String::from_utf8_lossy(&flood_out.stderr)
    );
    eprintln!(
        "flood of {ADVERTS} adverts sent in {flood_took:?}; baseline {baseline:?}, peak {peak:?}"
    );

    let logs = alpha.log_text();
    let tail = logs.lines().rev().take(40).collect::<Vec<_>>().join("\n");
    up.unwrap_or_else(|e| panic!("{e}\nalpha's last log lines, newest first:\n{tail}"));
    up_after.unwrap_or_else(|e| panic!("after the flood: {e}"));
    assert!(
        lapses.is_empty(),
        "alpha and beta lost each other in the flood: {lapses:?}"
    );
    for (i, name) in ["alpha", "beta"].into_iter().enumerate() {
        let (fds, rss) = peak[i];
        let (base_fds, base_rss) = baseline[i];
        assert!(
            fds < base_fds + MAX_EXTRA_FDS,
            "{name}: {fds} open files at the peak, {base_fds} before the flood"
        );
        assert!(
            rss < base_rss + MAX_EXTRA_RSS_KB,
            "{name}: {rss} kB resident at the peak, {base_rss} kB before the flood"
        );
    }
    // The flood reached the cap (so the bound above was tested), and no spoofed node is listed.
    assert!(
        logs.contains("mDNS adverts dropped"),
        "alpha never reached the advert-dial cap: the flood did not arrive"
    );
    let status = harness.status(&alpha).expect("status");
    eprintln!(
        "alpha: {} browses again, {} re-offers, {} cap log lines; peers {:?}",
        logs.matches("browse ended").count(),
        logs.matches("offering the cached adverts again").count(),
        logs.matches("mDNS adverts dropped").count(),
        status["nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|n| format!("{} {} {}", n["name"], n["source"], n["state"]))
            .collect::<Vec<_>>()
    );
    let names: Vec<_> = status["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| n["name"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(names, ["alpha", "beta", "gamma"]);
}
