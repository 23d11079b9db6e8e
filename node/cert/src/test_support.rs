//! What the unit tests share: members of a made-up mesh, and the verifier of its CA, built from
//! the files as a node's TLS loader builds them (`mesh-tls` owns that loader).

use std::{path::Path, sync::Arc};

use rustls::RootCertStore;

use crate::{
    CertIdentity, CertRole, OriginSigner, OriginVerifier, RevokedSet,
    ca::{CA_CERT_FILE, issue},
    pem::{pem_certs, read},
};

/// Issues `name` in `role` from the CA in `dir`: who its certificate says it is, and the signer
/// of its key.
pub(crate) fn member(dir: &Path, name: &str, role: CertRole) -> (CertIdentity, OriginSigner) {
    let (cert, key) = issue(dir, name, &[], role).expect("issue");
    let der = pem_certs(&cert, &read(&cert).expect("read cert"))
        .expect("pem")
        .swap_remove(0);
    let signer = OriginSigner::new(&read(&key).expect("read key"), der.to_vec()).expect("signer");
    (CertIdentity::from_der(&der).expect("identity"), signer)
}

/// The origin verifier of the CA in `dir`, with an empty revoked set of its own.
pub(crate) fn verifier_of(dir: &Path) -> OriginVerifier {
    let path = dir.join(CA_CERT_FILE);
    let certs = pem_certs(&path, &read(&path).expect("read ca")).expect("pem");
    let revoked = RevokedSet::new(&certs);
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots.add(cert).expect("a CA certificate");
    }
    OriginVerifier::new(Arc::new(roots), revoked).expect("verifier")
}
