//! The certificate gate: the one place that refuses a caller by its certificate, before any
//! handler runs.
//!
//! An issuer completes the TLS handshake with a caller that presents no certificate, so that a
//! joining device can reach `Join` (a certificate that is presented must chain to the mesh CA;
//! TLS checks that). This layer, in front of every service, answers every other path
//! `UNAUTHENTICATED` for such a caller. It answers every path `PERMISSION_DENIED` for a caller
//! whose certificate the mesh CA revoked, and `UNAUTHENTICATED` for one whose certificate has
//! expired (TLS checks expiry only in the handshake, and an HTTP/2 connection outlives it). It
//! ends any response it is still streaming to a caller (a `WatchInfo`, a task's events) as soon
//! as the caller's certificate is revoked or expires. In insecure mode (no TLS) it lets
//! everything through, as the node does then anyway.

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
    time::SystemTime,
};

use http_body::Frame;
use mesh_cert::{CertIdentity, RevokedSet};
use mesh_domain::{BoxFuture, NodeId};
use tonic::{
    Status,
    body::Body,
    codegen::{Bytes, http},
    transport::server::{TcpConnectInfo, TlsConnectInfo},
};

/// The path prefix of the one service a caller without a certificate may reach.
const OPEN_SERVICE: &str = "/agentmesh.v1.Join/";

/// What a revoked caller is told.
const REVOKED: &str = "your certificate was revoked by the mesh CA; this mesh no longer accepts it (ask the mesh's operator for a new one)";

/// What a caller whose certificate expired is told.
const EXPIRED: &str = "your certificate has expired; this mesh no longer accepts it (ask the mesh's operator for a new one)";

/// Why the gate refuses a caller with a certificate, or ends what it streams to one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// The mesh CA revoked the certificate.
    Revoked,
    /// The certificate's time is up.
    Expired,
}

impl Refusal {
    /// Why `caller` may not call at `now`, if it may not.
    fn of(caller: &CertIdentity, revoked: &RevokedSet, now: SystemTime) -> Option<Self> {
        if revoked.contains(&caller.id) {
            Some(Self::Revoked)
        } else if caller.valid_for(now).is_none() {
            Some(Self::Expired)
        } else {
            None
        }
    }

    fn code(self) -> tonic::Code {
        match self {
            Self::Revoked => tonic::Code::PermissionDenied,
            Self::Expired => tonic::Code::Unauthenticated,
        }
    }

    /// The message, printable ASCII (so `grpc-message` may carry it as is).
    fn message(self) -> &'static str {
        match self {
            Self::Revoked => REVOKED,
            Self::Expired => EXPIRED,
        }
    }
}

/// Wraps every service of the server in a [`CertificateGate`].
#[derive(Debug, Clone)]
pub(crate) struct CertificateGateLayer {
    /// Whether the server speaks TLS (there are no certificates otherwise).
    tls: bool,
    /// The certificates the mesh CA revoked.
    revoked: RevokedSet,
}

impl CertificateGateLayer {
    /// A gate for a server with (`tls`) or without TLS, refusing the certificates in `revoked`.
    pub(crate) fn new(tls: bool, revoked: RevokedSet) -> Self {
        Self { tls, revoked }
    }
}

impl<S> tower::Layer<S> for CertificateGateLayer {
    type Service = CertificateGate<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CertificateGate {
            inner,
            tls: self.tls,
            revoked: self.revoked.clone(),
        }
    }
}

/// Refuses a request without a client certificate unless it is for `Join`, and every request
/// with a revoked or expired one.
#[derive(Debug, Clone)]
pub(crate) struct CertificateGate<S> {
    inner: S,
    tls: bool,
    revoked: RevokedSet,
}

/// Whether a request with this path from a caller with (`has_certificate`) or without a
/// certificate may go on.
fn admits(tls: bool, path: &str, has_certificate: bool) -> bool {
    !tls || has_certificate || path.starts_with(OPEN_SERVICE)
}

impl<S, B> tower::Service<http::Request<B>> for CertificateGate<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<Body>> + Send,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let caller: Option<Option<CertIdentity>> = request
            .extensions()
            .get::<TlsConnectInfo<TcpConnectInfo>>()
            .and_then(TlsConnectInfo::peer_certs)
            .and_then(|certs| certs.first().cloned())
            // A certificate TLS accepted but that does not parse has no id to revoke.
            .map(|first| CertIdentity::from_der(&first).ok());
        if !admits(self.tls, request.uri().path(), caller.is_some()) {
            let refusal = Status::unauthenticated(
                "a client certificate from the mesh CA is required (only Join may be called without one)",
            )
            .into_http();
            return Box::pin(async move { Ok(refusal) });
        }
        let Some(Some(identity)) = caller else {
            return Box::pin(self.inner.call(request));
        };
        if let Some(refusal) = Refusal::of(&identity, &self.revoked, SystemTime::now()) {
            let refusal = Status::new(refusal.code(), refusal.message()).into_http();
            return Box::pin(async move { Ok(refusal) });
        }
        let revoked = self.revoked.clone();
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|body| {
                Body::new(EndsWhenRefused {
                    inner: body,
                    refused: Box::pin(until_refused(revoked, identity)),
                    ended: false,
                })
            }))
        })
    }
}

/// Resolves, saying why, once `caller` is revoked or its certificate expires.
async fn until_refused(revoked: RevokedSet, caller: CertIdentity) -> Refusal {
    let expired = async {
        // The timer runs on the monotonic clock and expiry on the wall clock: check again.
        while let Some(left) = caller.valid_for(SystemTime::now()) {
            tokio::time::sleep(left).await;
        }
    };
    tokio::select! {
        () = until_revoked(revoked, caller.id.clone()) => Refusal::Revoked,
        () = expired => Refusal::Expired,
    }
}

/// Resolves once `id` is in `revoked`.
async fn until_revoked(revoked: RevokedSet, id: NodeId) {
    let mut changed = revoked.subscribe();
    loop {
        if revoked.contains(&id) {
            return;
        }
        if changed.changed().await.is_err() {
            // The set is gone with the node: nothing is revoked any more.
            std::future::pending::<()>().await;
        }
    }
}

/// A response body that ends with the gate's refusal (`PERMISSION_DENIED` or
/// `UNAUTHENTICATED`) as soon as the caller is revoked or its certificate expires: a long-lived
/// stream to a certificate does not outlive it.
struct EndsWhenRefused {
    inner: Body,
    refused: Pin<Box<dyn Future<Output = Refusal> + Send>>,
    /// Set once the refusal's trailers went out; the body ends after them.
    ended: bool,
}

impl http_body::Body for EndsWhenRefused {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        if self.ended {
            return Poll::Ready(None);
        }
        if let Poll::Ready(refusal) = self.refused.as_mut().poll(cx) {
            self.ended = true;
            let mut trailers = http::HeaderMap::new();
            trailers.insert(
                "grpc-status",
                http::HeaderValue::from(refusal.code() as i32),
            );
            trailers.insert(
                "grpc-message",
                http::HeaderValue::from_static(refusal.message()),
            );
            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
        }
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    #[test]
    fn a_revoked_or_expired_certificate_is_refused_and_says_why() {
        let dir = tempfile::tempdir().expect("tempdir");
        mesh_cert::ca::ca_init(dir.path()).expect("ca");
        let (cert, key) =
            mesh_cert::ca::issue(dir.path(), "laptop", &[], mesh_cert::CertRole::Client)
                .expect("issue");
        let tls = mesh_tls::MeshTls::load(&mesh_tls::TlsFiles {
            ca: dir.path().join(mesh_cert::ca::CA_CERT_FILE),
            cert,
            key,
        })
        .expect("load");
        let caller = tls.identity().clone();
        let revoked = tls.revoked().clone();
        let end =
            UNIX_EPOCH + Duration::from_secs(u64::try_from(caller.not_after).expect("after 1970"));
        assert_eq!(Refusal::of(&caller, &revoked, SystemTime::now()), None);
        assert_eq!(
            Refusal::of(&caller, &revoked, end),
            None,
            "valid through its last second"
        );
        assert_eq!(
            Refusal::of(&caller, &revoked, end + Duration::from_secs(1)),
            Some(Refusal::Expired)
        );
        revoked
            .insert(mesh_cert::Revocation {
                id: caller.id.clone(),
                name: "laptop".into(),
                revoked_at_ms: 1,
                reason: String::new(),
            })
            .expect("revoke");
        for now in [SystemTime::now(), end + Duration::from_secs(1)] {
            assert_eq!(Refusal::of(&caller, &revoked, now), Some(Refusal::Revoked));
        }
        for refusal in [Refusal::Revoked, Refusal::Expired] {
            assert!(
                refusal.message().bytes().all(|b| (0x20..0x7f).contains(&b)),
                "grpc-message carries printable ASCII as is"
            );
        }
    }

    #[test]
    fn only_join_is_open_to_a_caller_without_a_certificate() {
        let cases = [
            (true, "/agentmesh.v1.Join/Redeem", false, true),
            (true, "/agentmesh.v1.Join/GetCa", false, true),
            (true, "/agentmesh.v1.Node/GetInfo", false, false),
            (true, "/agentmesh.v1.Tasks/Submit", false, false),
            (true, "/agentmesh.v1.Tools/Call", false, false),
            (true, "/agentmesh.v1.JoinX/Redeem", false, false),
            (true, "/grpc.health.v1.Health/Check", false, false),
            (true, "/agentmesh.v1.Node/GetInfo", true, true),
            (false, "/agentmesh.v1.Node/GetInfo", false, true),
        ];
        for (tls, path, cert, expected) in cases {
            assert_eq!(admits(tls, path, cert), expected, "{tls} {path} {cert}");
        }
    }
}
