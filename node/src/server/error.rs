//! Why a node did not start: [`StartError`], one variant per thing start-up can find wrong,
//! each saying how to fix it.

use std::{io, net::SocketAddr, path::PathBuf};

use mesh_cert::TlsError;

use crate::{api_keys, config::ConfigError};

/// Errors starting a node.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// No port could be bound. (The OS error is in the message, not a `source`: printed with
    /// its causes, the error would say it twice.)
    #[error("cannot listen on {addr}: {}{hint}", io_words(error))]
    Bind {
        /// What was tried.
        addr: SocketAddr,
        /// The OS error.
        error: io::Error,
        /// A hint on how to fix it.
        hint: &'static str,
    },
    /// Certificates could not be loaded or created.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The data dir cannot be created.
    #[error("cannot create data dir {}: {}; set node.data_dir or --data-dir to a writable directory", path.display(), io_words(error))]
    DataDir {
        path: PathBuf,
        /// The OS error.
        error: io::Error,
    },
    /// Two hooks claim the same stage and order.
    #[error("hooks: {0}")]
    Hooks(String),
    /// The node was given a client certificate, which may never serve as a node.
    #[error(
        "{} is a client certificate (role `client`): a node needs one issued with `mesh-cli ca issue --role node`", .0.display()
    )]
    ClientCertificate(PathBuf),
    /// The configuration asks for something this node does not have (found once the parts it
    /// names exist, such as the tool table).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Another process holds the data dir's database (sled locks it while open).
    #[error("the data dir {} is in use: another mesh-node runs on it (its database, {}, is locked); stop that node, or start this one with another --data-dir", data_dir.display(), db.display())]
    DataDirInUse {
        /// The data dir.
        data_dir: PathBuf,
        /// The locked database.
        db: PathBuf,
    },
    /// The sled database could not be opened.
    #[error("cannot open the database in {}: {error}", path.display())]
    Storage {
        /// The database directory.
        path: PathBuf,
        /// sled's error.
        error: sled::Error,
    },
    /// A configured front-door key cannot be used (its key file).
    #[error(transparent)]
    Keys(#[from] api_keys::KeysError),
    /// The node was given a name that is not its certificate's: its peers would refuse its
    /// `NodeInfo`, so it does not start as someone it cannot prove to be.
    #[error(
        "this node is named `{name}` (node.name in {file}, or --name), but its certificate was issued to `{issued}`; peers refuse a node whose name is not its certificate's. Set `name = \"{issued}\"` under [node] (or drop node.name and --name), or give this node a certificate issued for `{name}`: `mesh-cli ca issue --role node --name {name}` where the CA key is, or `mesh-node --join TOKEN` into a fresh data dir"
    )]
    NameNotCertificates {
        /// The name given.
        name: String,
        /// The name the certificate was issued for.
        issued: String,
        /// The config file (the name was given there or with `--name`).
        file: String,
    },
    /// The certificate carries no usable node name.
    #[error(
        "this node's certificate {problem}; issue one with `mesh-cli ca issue --role node --name NAME`"
    )]
    CertificateName {
        /// What is wrong with it.
        problem: String,
    },
}

/// An OS error in words: `Address already in use`, without the `(os error 98)` that only a
/// programmer can use.
fn io_words(error: &io::Error) -> String {
    let text = error.to_string();
    match text.rfind(" (os error ") {
        Some(at) if text.ends_with(')') => text[..at].to_owned(),
        _ => text,
    }
}
