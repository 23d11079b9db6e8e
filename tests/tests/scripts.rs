//! The deploy scripts are safe to run as root on a shared machine (issue 16): `netns-fleet.sh`
//! uses its fleet directory (by default under `/tmp`) only when it is a real directory of its
//! own user that nobody else can write, and `fetch-model.sh` never writes the model through a
//! link planted where it goes. Both refuse before they touch anything, so these tests need no
//! network and start no node. `netns-fleet.sh up` also refuses a fleet larger than the machine's
//! neighbour (ARP) table, which every namespace shares (issue 17).

use std::{
    fs,
    os::unix::fs::{PermissionsExt, symlink},
    path::{Path, PathBuf},
    process::{Command, Output},
};

use mesh_tests::require_root;

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(name)
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// `netns-fleet.sh status` with `FLEET_DIR` set to `dir`.
fn fleet_status(dir: &Path) -> Output {
    Command::new(script("netns-fleet.sh"))
        .arg("status")
        .env("FLEET_DIR", dir)
        .env("FLEET_NAME", "amscript")
        .output()
        .expect("run netns-fleet.sh")
}

#[test]
fn the_fleet_script_refuses_a_directory_someone_else_could_have_made() {
    require_root();
    let tmp = tempfile::tempdir().expect("tempdir");

    // Writable by everyone, as a directory made in /tmp by another hand could be.
    let open = tmp.path().join("open");
    fs::create_dir(&open).expect("mkdir");
    fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).expect("chmod");
    let output = fleet_status(&open);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("can be written by others"),
        "{}",
        stderr(&output)
    );

    // Another user's.
    let theirs = tmp.path().join("theirs");
    fs::create_dir(&theirs).expect("mkdir");
    fs::set_permissions(&theirs, fs::Permissions::from_mode(0o700)).expect("chmod");
    rustix::fs::chown(
        &theirs,
        Some(rustix::fs::Uid::from_raw(65534)),
        Some(rustix::fs::Gid::from_raw(65534)),
    )
    .expect("chown to nobody");
    let output = fleet_status(&theirs);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("belongs to another user"),
        "{}",
        stderr(&output)
    );

    // A link to a directory of ours.
    let ours = tmp.path().join("ours");
    fs::create_dir(&ours).expect("mkdir");
    fs::set_permissions(&ours, fs::Permissions::from_mode(0o700)).expect("chmod");
    let link = tmp.path().join("link");
    symlink(&ours, &link).expect("symlink");
    let output = fleet_status(&link);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("not a directory of its own"),
        "{}",
        stderr(&output)
    );

    // The control: our own private directory gets past the check (to "no fleet is up").
    let output = fleet_status(&ours);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("no fleet `amscript` is up"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn the_model_fetcher_never_writes_through_a_planted_link() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let victim = tmp.path().join("victim");
    fs::write(&victim, "keep me").expect("victim");
    let fetch = |dir: &Path| {
        Command::new(script("fetch-model.sh"))
            .arg("--dir")
            .arg(dir)
            .output()
            .expect("run fetch-model.sh")
    };

    // A link where the model goes.
    let models = tmp.path().join("models");
    fs::create_dir(&models).expect("mkdir");
    symlink(&victim, models.join("SmolLM2-135M-Instruct.Q4_1.gguf")).expect("symlink");
    let output = fetch(&models);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("is a symbolic link"),
        "{}",
        stderr(&output)
    );

    // The directory itself a link.
    let linked = tmp.path().join("linked-models");
    symlink(tmp.path(), &linked).expect("symlink");
    let output = fetch(&linked);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("is a symbolic link"),
        "{}",
        stderr(&output)
    );
    assert_eq!(fs::read_to_string(&victim).expect("victim"), "keep me");
}

#[test]
fn the_fleet_script_refuses_more_hosts_than_the_neighbour_table_holds() {
    require_root();
    let cap: usize = fs::read_to_string("/proc/sys/net/ipv4/neigh/default/gc_thresh3")
        .expect("read gc_thresh3")
        .trim()
        .parse()
        .expect("gc_thresh3 is a number");
    // The fewest hosts whose full mesh of ARP entries, n × (n − 1), overflows the table.
    let hosts = (2..)
        .find(|n: &usize| n * (n - 1) > cap)
        .unwrap_or(usize::MAX);
    if hosts > 200 {
        eprintln!(
            "gc_thresh3 = {cap} fits the script's 200 hosts: nothing to refuse on this machine"
        );
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("fleet");
    let output = Command::new(script("netns-fleet.sh"))
        .args(["up", &hosts.to_string()])
        .env("FLEET_DIR", &dir)
        .env("FLEET_NAME", "amarp")
        // Were the check missing, the script stops here instead, before creating anything.
        .env("FLEET_BIN", tmp.path().join("no-such-dir"))
        .output()
        .expect("run netns-fleet.sh");
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("gc_thresh3") && stderr(&output).contains("sysctl -w"),
        "names the limit and how to raise it: {}",
        stderr(&output)
    );
    assert!(!dir.exists(), "nothing was created");
}
