//! Reading and writing the PEM files of certificates and keys: every error names the file, and a
//! new file is never written over an old one.

use std::{fs, path::Path};

use rustls::pki_types::{CertificateDer, pem::PemObject};

use crate::TlsError;

/// The certificates in `pem` (the text of `path`); at least one, or an error naming the file.
pub fn pem_certs(path: &Path, pem: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs: Vec<_> = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::Pem {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            path: path.to_owned(),
            reason: "no CERTIFICATE block found".into(),
        });
    }
    Ok(certs)
}

pub fn read(path: &Path) -> Result<String, TlsError> {
    fs::read_to_string(path).map_err(|e| TlsError::io("read", path, e))
}

/// Writes `contents` to `path`, which must not exist yet, and syncs it; `private` makes it
/// readable by its owner only (a key).
pub fn write_new(path: &Path, contents: &[u8], private: bool) -> Result<(), TlsError> {
    use std::io::Write;
    let mut options = fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    if private {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    #[cfg(not(unix))]
    let _ = private;
    let mut file = options
        .open(path)
        .map_err(|e| TlsError::io("create", path, e))?;
    file.write_all(contents)
        .and_then(|()| file.sync_all())
        .map_err(|e| TlsError::io("write", path, e))
}
