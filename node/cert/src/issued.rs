//! The CA's record of the certificates it issued, so a person can list them (`mesh-cli ca
//! certs`) and revoke one by the name it was issued to, a prefix of its id, or every one issued
//! for a device (`mesh-cli ca revoke`).
//!
//! Whatever signs with the CA key keeps a copy of each certificate in `<CA dir>/issued/<id>.pem`
//! (the CA dir is the directory of `ca.key`): `mesh-cli ca issue` (with `--install` too), a
//! zero-config node's bootstrap, and an issuer redeeming a join token. The certificate itself is
//! the record (name, role, id, validity), so there is nothing that could disagree with it. Once
//! `mesh-cli ca revoke` has had a node take a revocation, `<id>.revoked` marks it. Certificates
//! issued before this record existed are listed when the CA dir holds their `NAME.pem` (as
//! `ca issue` and a zero-config node leave them); those made for join tokens or installed
//! elsewhere before then are not, and are revoked by id.
//!
//! Bounded: at most [`MAX_ISSUED`] records; expired ones are dropped to make room, and past that
//! issuing is refused rather than leaving a certificate nobody can find again. It decides
//! nothing about trust (the CA's chain and the revocation set do).

use std::{
    fs,
    path::{Path, PathBuf},
};

use mesh_domain::NodeId;

use crate::{
    CertIdentity, CertRole, TlsError,
    layout::{BACKDATED_S, CA_CERT_FILE},
    pem::{pem_certs, read},
};

/// The directory of the records, inside the CA dir.
pub const ISSUED_DIR: &str = "issued";
/// Most records kept: a certificate is about 700 bytes, so 7 MB at most.
pub const MAX_ISSUED: usize = 10_000;
/// What a revoked record's mark ends with.
const REVOKED_SUFFIX: &str = ".revoked";

/// One certificate the CA issued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuedCert {
    /// The name it was issued to (its CN).
    pub name: String,
    /// `node` or `client`; `None` for one issued before certificates had roles.
    pub role: Option<CertRole>,
    /// Its id (SHA-256 of its public key), what the mesh knows it by.
    pub id: NodeId,
    /// When it was issued, Unix seconds.
    pub issued: i64,
    /// When it expires, Unix seconds.
    pub expires: i64,
    /// Whether `mesh-cli ca revoke` had a node take its revocation.
    pub revoked: bool,
}

/// Why a name, id prefix or device does not pick the certificates to revoke.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FindError {
    /// Nothing issued matches.
    #[error(
        "no certificate issued by this CA is named `{target}` or has an id starting with it; `mesh-cli ca certs` lists them ({known})"
    )]
    NoMatch {
        /// What was asked for.
        target: String,
        /// The names known, for the message.
        known: String,
    },
    /// Several certificates match; one must be picked by a longer id prefix.
    #[error("`{target}` matches {} certificates: {}; give a longer id prefix, or --device NAME to revoke every certificate of a device", .matches.len(), .matches.join(", "))]
    Ambiguous {
        /// What was asked for.
        target: String,
        /// `name (id prefix)` of each match.
        matches: Vec<String>,
    },
}

impl IssuedCert {
    fn from_pem(path: &Path, pem: &str) -> Result<Self, TlsError> {
        let der = pem_certs(path, pem)?.swap_remove(0);
        let identity = CertIdentity::from_der(&der).map_err(|e| TlsError::Pem {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        Ok(Self {
            name: identity.common_name.unwrap_or_default(),
            role: identity.role,
            id: identity.id,
            issued: identity.not_before + BACKDATED_S,
            expires: identity.not_after,
            revoked: false,
        })
    }

    /// Whether it was issued for `device`: named as the device's node (`NAME`, the host name
    /// `mesh-node` takes) or as its `mesh-cli` (`NAME-cli`, the name `mesh-cli join` gives).
    pub fn is_for_device(&self, device: &str) -> bool {
        self.name == device || self.name.strip_suffix("-cli") == Some(device)
    }
}

fn records_dir(ca_dir: &Path) -> PathBuf {
    ca_dir.join(ISSUED_DIR)
}

/// Keeps a copy of `cert_pem`, issued by the CA in `ca_dir`; returns its id. Drops expired
/// records when [`MAX_ISSUED`] are kept, and refuses when none has expired.
pub fn record(ca_dir: &Path, cert_pem: &str, now: i64) -> Result<NodeId, TlsError> {
    let dir = records_dir(ca_dir);
    let cert = IssuedCert::from_pem(&dir, cert_pem)?;
    fs::create_dir_all(&dir).map_err(|e| TlsError::io("create", &dir, e))?;
    let file = dir.join(format!("{}.pem", cert.id));
    let kept = own_records(&dir)?;
    if kept.len() >= MAX_ISSUED && !file.exists() {
        let mut left = kept.len();
        for (path, held) in kept.iter().filter(|(_, held)| held.expires < now) {
            remove(path)?;
            remove(&dir.join(format!("{}{REVOKED_SUFFIX}", held.id)))?;
            left -= 1;
        }
        if left >= MAX_ISSUED {
            return Err(TlsError::RecordsFull {
                dir,
                max: MAX_ISSUED,
            });
        }
    }
    // Written aside and renamed, so a record is whole or absent.
    let partial = dir.join(format!(".{}.pem.partial", cert.id));
    fs::write(&partial, cert_pem)
        .and_then(|()| fs::File::open(&partial)?.sync_all())
        .and_then(|()| fs::rename(&partial, &file))
        .map_err(|e| TlsError::io("write", &file, e))?;
    Ok(cert.id)
}

/// Drops the record of `id` (a certificate that was signed but never handed out).
pub fn forget(ca_dir: &Path, id: &NodeId) -> Result<(), TlsError> {
    let dir = records_dir(ca_dir);
    remove(&dir.join(format!("{id}.pem")))?;
    remove(&dir.join(format!("{id}{REVOKED_SUFFIX}")))
}

/// Removes `path` if it is there.
fn remove(path: &Path) -> Result<(), TlsError> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(TlsError::io("remove", path, e)),
        _ => Ok(()),
    }
}

/// Marks `id` revoked (a node took its revocation).
pub fn mark_revoked(ca_dir: &Path, id: &NodeId) -> Result<(), TlsError> {
    let dir = records_dir(ca_dir);
    fs::create_dir_all(&dir).map_err(|e| TlsError::io("create", &dir, e))?;
    let path = dir.join(format!("{id}{REVOKED_SUFFIX}"));
    fs::write(&path, b"").map_err(|e| TlsError::io("write", &path, e))
}

/// The records in `dir`, with their files; a file that cannot be read as a certificate is
/// skipped (one broken copy must not hide the others).
fn own_records(dir: &Path) -> Result<Vec<(PathBuf, IssuedCert)>, TlsError> {
    certificates_in(dir, |_| true)
}

/// Every `*.pem` certificate in `dir` whose file name `keep` accepts.
fn certificates_in(
    dir: &Path,
    keep: impl Fn(&str) -> bool,
) -> Result<Vec<(PathBuf, IssuedCert)>, TlsError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(TlsError::io("list", dir, e)),
    };
    let mut found = Vec::new();
    for entry in entries {
        let path = entry.map_err(|e| TlsError::io("list", dir, e))?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if !name.ends_with(".pem") || name.starts_with('.') || !keep(name) {
            continue;
        }
        if let Ok(cert) = read(&path).and_then(|pem| IssuedCert::from_pem(&path, &pem)) {
            found.push((path, cert));
        }
    }
    Ok(found)
}

/// Every certificate the CA in `ca_dir` is known to have issued: its records, and the
/// certificates lying in the CA dir itself (those issued before the records existed), oldest
/// first.
pub fn list(ca_dir: &Path) -> Result<Vec<IssuedCert>, TlsError> {
    let dir = records_dir(ca_dir);
    let mut all: Vec<IssuedCert> = own_records(&dir)?
        .into_iter()
        .map(|(_, cert)| cert)
        .collect();
    for (_, cert) in certificates_in(ca_dir, |name| name != CA_CERT_FILE)? {
        if !all.iter().any(|known| known.id == cert.id) {
            all.push(cert);
        }
    }
    for cert in &mut all {
        cert.revoked = dir.join(format!("{}{REVOKED_SUFFIX}", cert.id)).exists();
    }
    all.sort_by(|a, b| a.issued.cmp(&b.issued).then(a.name.cmp(&b.name)));
    Ok(all)
}

/// The certificates `target` names among `certs`: every one issued to that name when one is
/// not revoked yet (else the revoked ones, to say so), or the one whose id starts with it.
/// Several live certificates of one name, or several ids with that prefix, are ambiguous.
pub fn find<'a>(certs: &'a [IssuedCert], target: &str) -> Result<Vec<&'a IssuedCert>, FindError> {
    let named: Vec<&IssuedCert> = certs.iter().filter(|c| c.name == target).collect();
    let live: Vec<&IssuedCert> = named.iter().copied().filter(|c| !c.revoked).collect();
    let matches = match (live.len(), named.is_empty()) {
        (1.., _) => live,
        (0, false) => named,
        (0, true) => {
            let prefix = target.to_ascii_lowercase();
            let is_hex = !prefix.is_empty() && prefix.bytes().all(|b| b.is_ascii_hexdigit());
            certs
                .iter()
                .filter(|c| is_hex && c.id.as_str().starts_with(&prefix))
                .collect()
        }
    };
    match matches.len() {
        0 => Err(FindError::NoMatch {
            target: target.to_owned(),
            known: known_names(certs),
        }),
        1 => Ok(matches),
        _ => Err(FindError::Ambiguous {
            target: target.to_owned(),
            matches: matches
                .iter()
                .map(|c| format!("{} ({})", c.name, c.id.short()))
                .collect(),
        }),
    }
}

/// The names in `certs`, for a message.
pub fn known_names(certs: &[IssuedCert]) -> String {
    let mut names: Vec<&str> = certs.iter().map(|c| c.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    if names.is_empty() {
        "none recorded".to_owned()
    } else {
        format!("issued: {}", names.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ca::{ca_init, issue};

    fn now() -> i64 {
        time::OffsetDateTime::now_utc().unix_timestamp()
    }

    #[test]
    fn issuing_records_the_certificate_and_the_ca_dirs_older_files_are_listed_too() {
        let dir = tempfile::tempdir().expect("tempdir");
        ca_init(dir.path()).expect("ca");
        issue(dir.path(), "homeserver", &[], CertRole::Node).expect("issue");
        issue(dir.path(), "homeserver-cli", &[], CertRole::Client).expect("issue");
        // As a certificate issued before the records existed lies in the CA dir: its record
        // is gone, its file is not.
        let (old, _) = issue(dir.path(), "old", &[], CertRole::Node).expect("issue");
        let old_id = list(dir.path())
            .expect("list")
            .into_iter()
            .find(|c| c.name == "old")
            .expect("old")
            .id;
        forget(dir.path(), &old_id).expect("forget");
        assert!(old.exists());

        let certs = list(dir.path()).expect("list");
        let names: Vec<&str> = certs.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(certs.len(), 3, "{names:?}");
        for name in ["homeserver", "homeserver-cli", "old"] {
            assert!(names.contains(&name), "{names:?}");
        }
        let client = certs
            .iter()
            .find(|c| c.name == "homeserver-cli")
            .expect("client");
        assert_eq!(client.role, Some(CertRole::Client));
        assert!((client.issued - now()).abs() < 60, "issued now: {client:?}");
        assert!(client.expires > client.issued + 800 * 86_400);

        let device: Vec<&str> = certs
            .iter()
            .filter(|c| c.is_for_device("homeserver"))
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(device.len(), 2, "{device:?}");
        assert!(!certs[0].revoked);
        mark_revoked(dir.path(), &client.id).expect("mark");
        let certs = list(dir.path()).expect("list");
        assert!(
            certs
                .iter()
                .find(|c| c.name == "homeserver-cli")
                .expect("client")
                .revoked
        );
    }

    #[test]
    fn a_target_is_a_name_or_a_unique_id_prefix() {
        let dir = tempfile::tempdir().expect("tempdir");
        ca_init(dir.path()).expect("ca");
        for name in ["alpha", "beta"] {
            issue(dir.path(), name, &[], CertRole::Node).expect("issue");
        }
        let certs = list(dir.path()).expect("list");
        let alpha = certs.iter().find(|c| c.name == "alpha").expect("alpha");
        assert_eq!(find(&certs, "alpha").expect("by name"), vec![alpha]);
        let twelve = &alpha.id.as_str()[..12];
        assert_eq!(find(&certs, twelve).expect("by prefix"), vec![alpha]);
        assert_eq!(
            find(&certs, &twelve.to_ascii_uppercase()).expect("any case"),
            vec![alpha]
        );
        let err = find(&certs, "gamma").expect_err("unknown");
        assert!(err.to_string().contains("alpha, beta"), "{err}");

        // Two live certificates of one name: ambiguous; once one is revoked, the other.
        let again = tempfile::tempdir().expect("tempdir");
        issue_as(dir.path(), again.path(), "alpha");
        let certs = list(dir.path()).expect("list");
        let err = find(&certs, "alpha").expect_err("two alphas");
        assert!(
            matches!(&err, FindError::Ambiguous { matches, .. } if matches.len() == 2),
            "{err}"
        );
        mark_revoked(dir.path(), &alpha.id).expect("mark");
        let certs = list(dir.path()).expect("list");
        let live = find(&certs, "alpha").expect("the live one");
        assert_ne!(live[0].id, alpha.id);
    }

    /// Issues another certificate named `name` from the CA in `ca_dir`, writing its files into
    /// `elsewhere` (as `--install` does).
    fn issue_as(ca_dir: &Path, elsewhere: &Path, name: &str) {
        crate::ca::issue_at(
            ca_dir,
            name,
            &[],
            CertRole::Node,
            crate::ca::IssueOptions::default(),
            &elsewhere.join("x.pem"),
            &elsewhere.join("x.key"),
        )
        .expect("issue");
    }

    #[test]
    fn the_records_are_bounded_expired_ones_go_first() {
        let dir = tempfile::tempdir().expect("tempdir");
        ca_init(dir.path()).expect("ca");
        let (cert, _) = issue(dir.path(), "one", &[], CertRole::Node).expect("issue");
        let pem = read(&cert).expect("read");
        let (two, _) = issue(dir.path(), "two", &[], CertRole::Node).expect("issue");
        let two = read(&two).expect("read");
        let records = records_dir(dir.path());
        let two_id = IssuedCert::from_pem(&records, &two).expect("parse").id;
        forget(dir.path(), &two_id).expect("forget two");
        // Fill the records with copies of one certificate under made-up ids.
        for i in 1..MAX_ISSUED {
            fs::write(records.join(format!("{i:064x}.pem")), &pem).expect("write");
        }
        let err = record(dir.path(), &two, now()).expect_err("full");
        assert!(matches!(err, TlsError::RecordsFull { .. }), "{err}");
        // Once they have expired (seen from ten years on), they make room.
        record(dir.path(), &two, now() + 3650 * 86_400).expect("room made");
        assert!(own_records(&records).expect("list").len() < 10);
    }
}
