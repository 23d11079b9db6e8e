//! What the unit tests share: a fresh mesh CA, loaded as an issuer loads it.

use mesh_cert::{
    CaSigner,
    ca::{CA_CERT_FILE, CA_KEY_FILE, ca_init},
};

/// A new CA in a temporary directory (kept while the first value lives), as a signer.
pub(crate) fn signer() -> (tempfile::TempDir, CaSigner) {
    let dir = tempfile::tempdir().expect("tempdir");
    ca_init(dir.path()).expect("ca");
    let signer = CaSigner::load(
        &dir.path().join(CA_CERT_FILE),
        &dir.path().join(CA_KEY_FILE),
    )
    .expect("load ca");
    (dir, signer)
}
