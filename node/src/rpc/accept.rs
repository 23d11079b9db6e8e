//! The gRPC server's TLS accept loop: takes the TCP connections the listener accepts, runs each
//! TLS handshake in a task of its own (so one slow handshake never holds up the next caller),
//! and hands the finished connections to tonic ([`TlsIncoming`]).
//!
//! The handshake's client verifier ([`mesh_tls::MeshTls::server_config`]) refuses a
//! certificate the mesh CA revoked. A connection that was open before its certificate was
//! revoked is closed here: every accepted connection whose certificate has an id is registered
//! (one entry per open connection, gone when it closes), and when the revoked set learns an id,
//! every open connection of that id ends at once ([`RevocableStream`] fails its reads and
//! writes, so hyper drops the connection and the socket closes). The verifier also refuses an
//! expired certificate, but only in the handshake: a connection is closed the same way
//! [`EXPIRED_CONNECTION_GRACE`] after its certificate expires. This module decides nothing
//! about who may call what: that is the TLS verifier and [`super::gate`].
//!
//! Nothing is owed to a caller before its handshake is done, so a connection that has not
//! finished it within `connections.handshake_timeout_s` is closed, and the listener holds at
//! most `connections.grpc_max_connections` connections, of which at most
//! `connections.grpc_max_handshakes` still handshaking ([`ConnectionCap`]): a socket over
//! either cap is closed as soon as it is accepted. Idle sockets that never send a byte thus
//! cost a bounded number of descriptors for a bounded time, and the node keeps answering.

use std::{
    collections::HashMap,
    convert::Infallible,
    io,
    net::SocketAddr,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::{Duration, SystemTime},
};

use mesh_cert::{CertIdentity, RevokedSet};
use mesh_domain::{NodeId, sync::MutexExt};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::TcpStream,
    sync::mpsc,
    task::JoinSet,
};
use tokio_rustls::{TlsAcceptor, server::TlsStream};
use tokio_stream::{Stream, StreamExt, wrappers::ReceiverStream};
use tokio_util::{
    sync::{CancellationToken, WaitForCancellationFutureOwned},
    task::AbortOnDropHandle,
};
use tonic::transport::server::{Connected, TcpConnectInfo, TcpIncoming, TlsConnectInfo};

use crate::{
    config::ConnectionLimits,
    connections::{ACCEPT_BACKOFF, Cap, ConnectionCap, ConnectionSlot},
    metrics::{labels, metrics},
};

/// Finished handshakes waiting for tonic to take them; tonic takes each at once, so this only
/// smooths bursts.
const HANDED_OVER: usize = 16;

/// How long after its certificate expires a connection is closed. The certificate gate ends
/// the connection's calls at the expiry itself, with a status that says why; closing the
/// socket only after that lets the status reach the caller rather than a broken connection.
pub const EXPIRED_CONNECTION_GRACE: Duration = Duration::from_secs(2);

/// The bounds of one listener: how long a handshake may take, and the two caps.
#[derive(Debug)]
struct Bounds {
    handshake_timeout: Duration,
    /// Every open connection, from accept until tonic drops it.
    open: ConnectionCap,
    /// Connections still in their handshake.
    handshaking: ConnectionCap,
}

/// The TLS connections of one listener, for `serve_with_incoming_shutdown`. Dropping it (tonic
/// does when it stops accepting) stops the accept loop and every handshake still in flight;
/// connections already handed over stay tonic's to drain.
#[derive(Debug)]
pub struct TlsIncoming {
    connections: ReceiverStream<Result<RevocableStream, Infallible>>,
    /// The accept loop, ended when this is dropped.
    _accept: AbortOnDropHandle<()>,
}

impl TlsIncoming {
    /// Starts accepting on `tcp` with `tls` (whose verifier refuses what `revoked` holds) within
    /// `limits`, and closes an accepted connection as soon as `revoked` learns its certificate.
    pub fn new(
        tcp: TcpIncoming,
        tls: Arc<rustls::ServerConfig>,
        revoked: RevokedSet,
        limits: &ConnectionLimits,
    ) -> Self {
        let bounds = Bounds {
            handshake_timeout: limits.handshake_timeout,
            open: ConnectionCap::new("grpc", Cap::Connections, limits.grpc_max_connections),
            handshaking: ConnectionCap::new("grpc", Cap::Handshakes, limits.grpc_max_handshakes),
        };
        let (tx, rx) = mpsc::channel(HANDED_OVER);
        let accept = tokio::spawn(accept_loop(
            tcp,
            TlsAcceptor::from(tls),
            revoked,
            bounds,
            tx,
        ));
        Self {
            connections: ReceiverStream::new(rx),
            _accept: AbortOnDropHandle::new(accept),
        }
    }
}

impl Stream for TlsIncoming {
    type Item = Result<RevocableStream, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut self.connections).poll_next(cx)
    }
}

/// Accepts TCP connections, starts a handshake task for each (or closes it at once when a cap
/// is reached), and closes the open connections of every certificate the revoked set learns.
async fn accept_loop(
    mut tcp: TcpIncoming,
    acceptor: TlsAcceptor,
    revoked: RevokedSet,
    bounds: Bounds,
    tx: mpsc::Sender<Result<RevocableStream, Infallible>>,
) {
    let open = OpenConnections::default();
    let mut handshakes = JoinSet::new();
    let mut changes = revoked.subscribe();
    loop {
        tokio::select! {
            accepted = tcp.next() => match accepted {
                Some(Ok(stream)) => {
                    // Over a cap the stream is dropped here, which closes the socket.
                    if let Some(slot) = bounds.open.admit()
                        && let Some(handshaking) = bounds.handshaking.admit()
                    {
                        handshakes.spawn(handshake(
                            acceptor.clone(),
                            Accepted { tcp: stream, slot, handshaking },
                            bounds.handshake_timeout,
                            revoked.clone(),
                            open.clone(),
                            tx.clone(),
                        ));
                    }
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "accept a gRPC connection");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
                None => return,
            },
            // Reaps finished handshakes, so the set holds only those in flight.
            Some(_) = handshakes.join_next(), if !handshakes.is_empty() => {}
            changed = changes.changed() => {
                if changed.is_err() {
                    // The set's sender lives as long as the set, which we hold: cannot happen.
                    return;
                }
                open.close_revoked(&revoked);
            }
            // tonic stopped accepting.
            () = tx.closed() => return,
        }
    }
}

/// An accepted socket with its places under the listener's caps.
struct Accepted {
    tcp: TcpStream,
    /// Held for as long as the connection is open.
    slot: ConnectionSlot,
    /// Held until the handshake ends.
    handshaking: ConnectionSlot,
}

/// One TLS handshake, closed when it takes longer than `timeout`; the connection goes to tonic,
/// registered under its certificate's id.
async fn handshake(
    acceptor: TlsAcceptor,
    accepted: Accepted,
    timeout: Duration,
    revoked: RevokedSet,
    open: OpenConnections,
    tx: mpsc::Sender<Result<RevocableStream, Infallible>>,
) {
    let Accepted {
        tcp,
        slot,
        handshaking,
    } = accepted;
    let remote = tcp.peer_addr().ok();
    let tls = match tokio::time::timeout(timeout, acceptor.accept(tcp)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            log_refused(remote, &e);
            return;
        }
        Err(_) => {
            metrics()
                .connections_timed_out
                .get_or_create(&labels(&[("listener", "grpc"), ("phase", "handshake")]))
                .inc();
            tracing::debug!(
                ?remote,
                ?timeout,
                "TLS handshake not finished in time: closed"
            );
            return;
        }
    };
    drop(handshaking);
    let identity = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|certs| certs.first())
        .and_then(|cert| CertIdentity::from_der(cert).ok());
    // The verifier has just checked the certificate's validity; a zero is only the rest of its
    // last second.
    let expires_in = identity
        .as_ref()
        .map(|identity| identity.valid_for(SystemTime::now()).unwrap_or_default());
    let registration = identity.map(|identity| open.register(identity.id));
    if let Some(registration) = &registration
        && revoked.contains(&registration.id)
    {
        // Revoked after the verifier's check but before the registration, which that
        // revocation's sweep therefore missed.
        registration.closed.cancel();
    }
    let watch = registration.zip(expires_in);
    let _ = tx.send(Ok(RevocableStream::new(tls, watch, slot))).await;
}

/// A refused revoked certificate is worth the operator's eye; anything else (a port scanner, a
/// client of another mesh, a dropped connection) is noise at the default level.
fn log_refused(remote: Option<SocketAddr>, e: &io::Error) {
    let revoked = e.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>())
        == Some(&rustls::Error::InvalidCertificate(
            rustls::CertificateError::Revoked,
        ));
    if revoked {
        tracing::info!(
            ?remote,
            "TLS handshake refused: the client's certificate is revoked"
        );
    } else {
        tracing::debug!(?remote, error = %e, "TLS handshake failed");
    }
}

/// The open connections by certificate id, each with the token that closes it. One entry per
/// open connection: a [`Registration`] removes its own when the connection is dropped.
#[derive(Debug, Clone, Default)]
struct OpenConnections {
    inner: Arc<Mutex<ByCertificate>>,
}

#[derive(Debug, Default)]
struct ByCertificate {
    /// The key of the next registration.
    next: u64,
    open: HashMap<NodeId, HashMap<u64, CancellationToken>>,
}

impl OpenConnections {
    fn register(&self, id: NodeId) -> Registration {
        let closed = CancellationToken::new();
        let mut inner = self.inner.lock_unpoisoned();
        let key = inner.next;
        inner.next += 1;
        inner
            .open
            .entry(id.clone())
            .or_default()
            .insert(key, closed.clone());
        Registration {
            open: self.clone(),
            id,
            key,
            closed,
        }
    }

    /// Closes every open connection whose certificate is in `revoked`.
    fn close_revoked(&self, revoked: &RevokedSet) {
        let inner = self.inner.lock_unpoisoned();
        for (id, connections) in &inner.open {
            if revoked.contains(id) {
                tracing::info!(id = %id.short(), connections = connections.len(), "certificate revoked: closing its connections");
                connections.values().for_each(CancellationToken::cancel);
            }
        }
    }
}

/// One open connection's entry in [`OpenConnections`], removed when dropped.
#[derive(Debug)]
struct Registration {
    open: OpenConnections,
    id: NodeId,
    key: u64,
    /// Cancelled to close the connection.
    closed: CancellationToken,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut inner = self.open.inner.lock_unpoisoned();
        if let Some(connections) = inner.open.get_mut(&self.id) {
            connections.remove(&self.key);
            if connections.is_empty() {
                inner.open.remove(&self.id);
            }
        }
    }
}

/// An accepted TLS connection that fails every read and write once its certificate is revoked,
/// or [`EXPIRED_CONNECTION_GRACE`] after it expires.
/// It reports the same connection info as the TLS stream it wraps, so handlers still read the
/// caller's certificate (`peer_certs`) and address (`remote_addr`).
#[derive(Debug)]
pub struct RevocableStream {
    inner: TlsStream<TcpStream>,
    /// None for a caller without a certificate (who reaches `Join` only) or whose certificate
    /// has no id.
    watch: Option<Watch>,
    /// The connection's place under `connections.grpc_max_connections`, given back when tonic
    /// drops the connection.
    _slot: ConnectionSlot,
}

#[derive(Debug)]
struct Watch {
    registration: Registration,
    /// Wakes the connection's task when it is closed, even while it waits idle for a read.
    closed: Pin<Box<WaitForCancellationFutureOwned>>,
    /// Ends once the certificate has expired (and the grace after it has passed).
    expired: Pin<Box<tokio::time::Sleep>>,
}

impl RevocableStream {
    /// `watch`: the connection's registration under its certificate's id, and how long the
    /// certificate is still valid.
    fn new(
        inner: TlsStream<TcpStream>,
        watch: Option<(Registration, Duration)>,
        slot: ConnectionSlot,
    ) -> Self {
        let watch = watch.map(|(registration, expires_in)| Watch {
            closed: Box::pin(registration.closed.clone().cancelled_owned()),
            expired: Box::pin(tokio::time::sleep(
                expires_in.saturating_add(EXPIRED_CONNECTION_GRACE),
            )),
            registration,
        });
        Self {
            inner,
            watch,
            _slot: slot,
        }
    }

    /// An error once the connection was closed; else registers `cx` to be woken when it is.
    fn check_open(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        let Some(watch) = &mut self.watch else {
            return Ok(());
        };
        if watch.registration.closed.is_cancelled() || watch.closed.as_mut().poll(cx).is_ready() {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the caller's certificate was revoked by the mesh CA",
            ));
        }
        if watch.expired.is_elapsed() || watch.expired.as_mut().poll(cx).is_ready() {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the caller's certificate has expired",
            ));
        }
        Ok(())
    }
}

impl AsyncRead for RevocableStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.check_open(cx)?;
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for RevocableStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.check_open(cx)?;
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.check_open(cx)?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.check_open(cx)?;
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl Connected for RevocableStream {
    type ConnectInfo = TlsConnectInfo<TcpConnectInfo>;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use mesh_cert::{CertRole, ca};
    use mesh_tls::{MeshTls, TlsFiles};
    use tokio::net::TcpListener;

    use super::*;
    use crate::connections::test_support::closed_within;

    /// Sockets that never start their TLS handshake: past `grpc_max_handshakes` one is closed
    /// at once (while those before it are still open) and counted, and the others are closed
    /// when the handshake timeout passes. Without the cap the third outlives the first; without
    /// the timeout the first two stay open.
    #[tokio::test]
    async fn silent_sockets_are_closed_after_the_handshake_timeout_and_past_the_cap_at_once() {
        mesh_tls::install_crypto_provider();
        let dir = tempfile::tempdir().expect("tempdir");
        ca::ca_init(dir.path()).expect("ca");
        let (cert, key) = ca::issue(dir.path(), "acceptor", &[], CertRole::Node).expect("issue");
        let tls = MeshTls::load(&TlsFiles {
            ca: dir.path().join(ca::CA_CERT_FILE),
            cert,
            key,
        })
        .expect("load");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let refused = || {
            metrics()
                .connections_refused
                .get_or_create(&labels(&[
                    ("listener", "grpc"),
                    ("reason", "max_handshakes"),
                ]))
                .get()
        };
        let before = refused();
        let _incoming = TlsIncoming::new(
            TcpIncoming::from(listener),
            tls.server_config(false).expect("server config"),
            tls.revoked().clone(),
            &ConnectionLimits {
                handshake_timeout: Duration::from_secs(1),
                grpc_max_handshakes: 2,
                ..ConnectionLimits::default()
            },
        );
        let mut first = TcpStream::connect(addr).await.expect("connect");
        let mut second = TcpStream::connect(addr).await.expect("connect");
        let mut third = TcpStream::connect(addr).await.expect("connect");
        assert!(
            closed_within(&mut third, Duration::from_secs(5)).await,
            "the socket past the cap stayed open"
        );
        let mut buf = [0u8; 8];
        assert!(
            matches!(first.try_read(&mut buf), Err(e) if e.kind() == io::ErrorKind::WouldBlock),
            "the socket past the cap was not closed at once: the first, accepted before it, is closed too"
        );
        assert!(refused() > before, "the refusal was not counted");
        for (name, tcp) in [("first", &mut first), ("second", &mut second)] {
            assert!(
                closed_within(tcp, Duration::from_secs(5)).await,
                "the {name} socket outlived its handshake timeout"
            );
        }
    }
}
