//! A person's signed acts: an operator's `mesh-cli` signs a statement (a decision on an
//! approval, a front-door key; see `mesh_domain::statement`) with the key of its own client
//! certificate ([`sign`]), and any node checks it ([`OriginVerifier::verify_statement`]): the
//! certificate chains to the mesh CA and was valid at the time the statement is checked for, it
//! is a client certificate, it was not revoked by then, and the signature is over the
//! statement's bytes. A node that relays or stores the statement holds no key that signs in the
//! person's name, so it cannot forge one or alter what it says.
//!
//! This module checks signatures and certificates; what a statement must say to be acted on is
//! for its reader (the approvals, the front-door keys, the memory's writer rules).

use std::time::Duration;

use mesh_domain::{
    CertRole, Principal,
    statement::{MAX_STATEMENT, Signed, StatementKind},
};
use rustls::pki_types::{CertificateDer, UnixTime};

use crate::{
    cert::CertIdentity,
    origin::{MAX_CERTIFICATE_BYTES, OriginError, OriginSigner, OriginVerifier, verify_raw},
};

/// Longest signature accepted (an Ed25519 one is 64 bytes, an ECDSA P-256 one at most 72).
const MAX_SIGNATURE: usize = 255;

/// Why a statement was not believed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StatementError {
    /// This node has no CA (insecure mode): nobody's statement can be checked.
    #[error("this node has no CA to check a signed statement against (insecure mode)")]
    NoCa,
    /// Too large, or a certificate that does not parse.
    #[error("malformed signed statement: {0}")]
    Malformed(String),
    /// The certificate does not chain to the mesh CA, or was not valid at the time checked.
    #[error(
        "the signer's certificate ({0}) was not issued by this mesh's CA, or was not valid then"
    )]
    NotFromCa(String),
    /// A node's (or a legacy) certificate: only a person signs these.
    #[error(
        "the signer's certificate ({0}) is not a client certificate: only an operator's mesh-cli signs a {1}"
    )]
    NotAClient(String, &'static str),
    /// The mesh CA revoked the certificate before the time checked.
    #[error("the signer's certificate ({0}) was revoked by the mesh CA")]
    Revoked(String),
    /// The signature is not the certificate key's over these bytes.
    #[error(
        "the signature of {0} does not verify over the statement (altered, or not signed by it)"
    )]
    BadSignature(String),
}

impl StatementError {
    /// A short label for counting refusals by reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NoCa | Self::Malformed(_) => "malformed",
            Self::NotFromCa(_) | Self::NotAClient(..) => "certificate",
            Self::Revoked(_) => "revoked",
            Self::BadSignature(_) => "signature",
        }
    }
}

/// Signs `statement` (its JSON bytes) of `kind` with `signer`'s key, carrying its certificate.
pub fn sign(
    signer: &OriginSigner,
    kind: StatementKind,
    statement: Vec<u8>,
) -> Result<Signed, OriginError> {
    let signature = signer.sign(&mesh_domain::statement::signed_bytes(kind, &statement))?;
    Ok(Signed {
        statement,
        signature,
        certificate: signer.certificate().to_vec(),
    })
}

impl OriginVerifier {
    /// Checks that `signed` is a statement of `kind` made by a client certificate of the mesh
    /// CA that was valid and not revoked at `at_ms` (Unix ms); returns who signed it.
    pub fn verify_statement(
        &self,
        kind: StatementKind,
        signed: &Signed,
        at_ms: u64,
    ) -> Result<Principal, StatementError> {
        let clients = self.clients().ok_or(StatementError::NoCa)?;
        if signed.statement.len() > MAX_STATEMENT
            || signed.signature.len() > MAX_SIGNATURE
            || signed.certificate.len() > MAX_CERTIFICATE_BYTES
        {
            return Err(StatementError::Malformed(format!(
                "at most {MAX_STATEMENT} bytes of statement, {MAX_SIGNATURE} of signature and {MAX_CERTIFICATE_BYTES} of certificate"
            )));
        }
        let identity = CertIdentity::from_der(&signed.certificate)
            .map_err(|e| StatementError::Malformed(e.to_string()))?;
        let principal = identity.principal();
        let who = principal.to_string();
        if identity.role != Some(CertRole::Client) {
            return Err(StatementError::NotAClient(who, kind.name()));
        }
        let at = UnixTime::since_unix_epoch(Duration::from_millis(at_ms));
        clients
            .verify_client_cert(
                &CertificateDer::from(signed.certificate.as_slice()),
                &[],
                at,
            )
            .map_err(|_| StatementError::NotFromCa(who.clone()))?;
        if self
            .revoked()
            .revoked_at(&identity.id)
            .is_some_and(|revoked| revoked <= at_ms)
        {
            return Err(StatementError::Revoked(who));
        }
        verify_raw(
            &signed.certificate,
            &signed.signed_bytes(kind),
            &signed.signature,
        )
        .map_err(|_| StatementError::BadSignature(who))?;
        Ok(principal)
    }
}

#[cfg(test)]
mod tests {
    use mesh_domain::time::now_ms;

    use super::*;
    use crate::{
        Revocation,
        ca::ca_init,
        test_support::{member, verifier_of},
    };

    #[test]
    fn only_a_clients_signature_over_the_exact_statement_verifies() {
        let dir = tempfile::tempdir().expect("tempdir");
        let other = tempfile::tempdir().expect("tempdir");
        ca_init(dir.path()).expect("ca");
        ca_init(other.path()).expect("ca");
        let (_, node_signer) = member(dir.path(), "alpha", CertRole::Node);
        let (ada_identity, ada) = member(dir.path(), "ada", CertRole::Client);
        let (_, stranger) = member(other.path(), "eve", CertRole::Client);
        let verifier = verifier_of(dir.path());
        let kind = StatementKind::ApprovalDecision;
        let now = now_ms();

        let signed = sign(&ada, kind, br#"{"approve":true}"#.to_vec()).expect("sign");
        let by = verifier
            .verify_statement(kind, &signed, now)
            .expect("ada's");
        assert_eq!(by.name, "ada");
        assert_eq!(by.id, ada_identity.id);

        let refused = |signed: &Signed, kind| verifier.verify_statement(kind, signed, now);
        // Another kind of statement over the same bytes.
        assert!(matches!(
            refused(&signed, StatementKind::KeyAdd),
            Err(StatementError::BadSignature(_))
        ));
        // Altered after signing.
        let altered = Signed {
            statement: br#"{"approve":false}"#.to_vec(),
            ..signed.clone()
        };
        assert!(matches!(
            refused(&altered, kind),
            Err(StatementError::BadSignature(_))
        ));
        // Signed by a node in ada's name: its key is not ada's.
        let forged = Signed {
            signature: node_signer.sign(&signed.signed_bytes(kind)).expect("sign"),
            ..signed.clone()
        };
        assert!(matches!(
            refused(&forged, kind),
            Err(StatementError::BadSignature(_))
        ));
        // A node's own statement, and a client of another mesh.
        let by_node = sign(&node_signer, kind, b"{}".to_vec()).expect("sign");
        assert!(matches!(
            refused(&by_node, kind),
            Err(StatementError::NotAClient(..))
        ));
        let foreign = sign(&stranger, kind, b"{}".to_vec()).expect("sign");
        assert!(matches!(
            refused(&foreign, kind),
            Err(StatementError::NotFromCa(_))
        ));
        // Checked for a time after the certificate expires.
        assert!(matches!(
            verifier.verify_statement(kind, &signed, u64::MAX / 4),
            Err(StatementError::NotFromCa(_))
        ));
        // Revoked before the time checked, but not before an earlier one.
        verifier
            .revoked()
            .insert(Revocation {
                id: ada_identity.id.clone(),
                name: "ada".into(),
                revoked_at_ms: now,
                reason: String::new(),
            })
            .expect("revoke");
        assert!(matches!(
            refused(&signed, kind),
            Err(StatementError::Revoked(_))
        ));
        assert!(verifier.verify_statement(kind, &signed, now - 1).is_ok());
        // Without a CA nothing can be checked.
        assert_eq!(
            OriginVerifier::self_certified().verify_statement(kind, &signed, now),
            Err(StatementError::NoCa)
        );
    }
}
