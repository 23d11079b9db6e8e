//! What a certificate says about who presents it: the node id (the hash of its public key), the
//! fingerprint of the certificate itself, its name, its role and its expiry. Nothing here
//! decides trust; that is the CA's chain, checked in [`crate::chain`], and the node's admission.
//!
//! The role is the subject's organizational unit (OU), which `mesh-cli ca issue --role` sets to
//! `agentmesh-node` or `agentmesh-client`; a client certificate also lacks the server-auth
//! extended key usage, so TLS itself refuses it on the serving side. A certificate issued
//! before roles existed has no such OU: it is a legacy certificate, trusted least.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mesh_domain::{CertRole, NodeId, Principal};
use sha2::{Digest, Sha256};
use x509_parser::prelude::{FromDer, X509Certificate};

/// What a certificate says about the node presenting it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertIdentity {
    /// The node id (hash of the public key).
    pub id: NodeId,
    /// Hex SHA-256 of the whole certificate (DER): the mDNS TXT `fp`.
    pub fingerprint: String,
    /// The certificate's common name, which `mesh-cli ca issue` sets to the node name.
    pub common_name: Option<String>,
    /// What the certificate is for; `None` for a legacy certificate issued without a role.
    pub role: Option<CertRole>,
    /// Unix seconds from which the certificate is valid.
    pub not_before: i64,
    /// Unix seconds after which the certificate is no longer valid.
    pub not_after: i64,
}

impl CertIdentity {
    /// Derives the identity from a DER certificate.
    pub fn from_der(der: &[u8]) -> Result<Self, CertError> {
        let (_, cert) =
            X509Certificate::from_der(der).map_err(|e| CertError::BadCertificate(e.to_string()))?;
        let common_name = cert
            .subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .map(str::to_owned);
        let role = cert
            .subject()
            .iter_organizational_unit()
            .filter_map(|ou| ou.as_str().ok())
            .find_map(role_of_unit);
        Ok(Self {
            id: NodeId::from_spki_der(cert.public_key().raw),
            fingerprint: hex::encode(Sha256::digest(der)),
            common_name,
            role,
            not_before: cert.validity().not_before.timestamp(),
            not_after: cert.validity().not_after.timestamp(),
        })
    }
}

/// The subject OU that carries a certificate's role.
pub fn role_unit(role: CertRole) -> &'static str {
    match role {
        CertRole::Node => "agentmesh-node",
        CertRole::Client => "agentmesh-client",
    }
}

fn role_of_unit(unit: &str) -> Option<CertRole> {
    [CertRole::Node, CertRole::Client]
        .into_iter()
        .find(|role| role_unit(*role) == unit)
}

impl CertIdentity {
    /// How long from `now` the certificate stays valid; `None` once it has expired. As TLS
    /// (webpki) checks it: valid through the whole second `not_after`.
    pub fn valid_for(&self, now: SystemTime) -> Option<Duration> {
        let end = u64::try_from(self.not_after)
            .ok()
            .and_then(|secs| secs.checked_add(1))
            .and_then(|secs| UNIX_EPOCH.checked_add(Duration::from_secs(secs)))?;
        end.duration_since(now).ok().filter(|left| !left.is_zero())
    }

    /// The holder of the certificate, as admission and the task lineage name it.
    pub fn principal(&self) -> Principal {
        Principal {
            id: self.id.clone(),
            name: self.common_name.clone().unwrap_or_default(),
            role: self.role,
        }
    }
}

/// Errors reading a certificate.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// A certificate could not be parsed.
    #[error("cannot parse certificate: {0}")]
    BadCertificate(String),
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::PublicKeyData;

    #[test]
    fn a_certificate_is_valid_through_the_second_of_its_not_after() {
        let key = rcgen::KeyPair::generate().expect("generate key");
        let cert = rcgen::CertificateParams::new(vec!["a".into()])
            .expect("params")
            .self_signed(&key)
            .expect("sign");
        let identity = CertIdentity::from_der(cert.der()).expect("parse");
        let end = UNIX_EPOCH
            + Duration::from_secs(u64::try_from(identity.not_after).expect("after 1970"));
        assert_eq!(
            identity.valid_for(end - Duration::from_secs(10)),
            Some(Duration::from_secs(11))
        );
        assert_eq!(
            identity.valid_for(end + Duration::from_millis(400)),
            Some(Duration::from_millis(600))
        );
        assert_eq!(identity.valid_for(end + Duration::from_secs(1)), None);
        assert_eq!(identity.valid_for(end + Duration::from_secs(3600)), None);
        let ancient = CertIdentity {
            not_after: -5,
            ..identity
        };
        assert_eq!(ancient.valid_for(UNIX_EPOCH), None);
    }

    #[test]
    fn identity_is_the_hash_of_the_public_key_not_of_the_certificate() {
        let key = rcgen::KeyPair::generate().expect("generate key");
        let one = rcgen::CertificateParams::new(vec!["a".into()])
            .expect("params")
            .self_signed(&key)
            .expect("sign");
        let two = rcgen::CertificateParams::new(vec!["b".into()])
            .expect("params")
            .self_signed(&key)
            .expect("sign");
        let one = CertIdentity::from_der(one.der()).expect("parse");
        let two = CertIdentity::from_der(two.der()).expect("parse");
        assert_eq!(one.id, two.id, "same key, same id");
        assert_ne!(one.fingerprint, two.fingerprint, "different certificates");
        assert_eq!(
            one.id,
            NodeId::from_spki_der(&key.subject_public_key_info())
        );
    }
}
