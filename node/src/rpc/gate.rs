//! The certificate gate: the one place that refuses a caller without a client certificate.
//!
//! An issuer completes the TLS handshake with a caller that presents no certificate, so that a
//! joining device can reach `Join` (a certificate that is presented must chain to the mesh CA;
//! TLS checks that). This layer, in front of every service, answers every other path
//! `UNAUTHENTICATED` for such a caller, before any handler runs. In insecure mode (no TLS) it
//! lets everything through, as the node does then anyway.

use std::task::{Context, Poll};

use mesh_domain::BoxFuture;
use tonic::{
    Status,
    body::Body,
    codegen::http,
    transport::server::{TcpConnectInfo, TlsConnectInfo},
};

/// The path prefix of the one service a caller without a certificate may reach.
const OPEN_SERVICE: &str = "/agentmesh.v1.Join/";

/// Wraps every service of the server in a [`CertificateGate`].
#[derive(Debug, Clone, Copy)]
pub struct CertificateGateLayer {
    /// Whether the server speaks TLS (there are no certificates otherwise).
    tls: bool,
}

impl CertificateGateLayer {
    /// A gate for a server with (`tls`) or without TLS.
    pub fn new(tls: bool) -> Self {
        Self { tls }
    }
}

impl<S> tower::Layer<S> for CertificateGateLayer {
    type Service = CertificateGate<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CertificateGate {
            inner,
            tls: self.tls,
        }
    }
}

/// Refuses a request without a client certificate unless it is for `Join`.
#[derive(Debug, Clone)]
pub struct CertificateGate<S> {
    inner: S,
    tls: bool,
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
        let has_certificate = request
            .extensions()
            .get::<TlsConnectInfo<TcpConnectInfo>>()
            .and_then(TlsConnectInfo::peer_certs)
            .is_some_and(|certs| !certs.is_empty());
        if admits(self.tls, request.uri().path(), has_certificate) {
            Box::pin(self.inner.call(request))
        } else {
            let refusal = Status::unauthenticated(
                "a client certificate from the mesh CA is required (only Join may be called without one)",
            )
            .into_http();
            Box::pin(async move { Ok(refusal) })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_join_is_open_to_a_caller_without_a_certificate() {
        let cases = [
            (true, "/agentmesh.v1.Join/Redeem", false, true),
            (true, "/agentmesh.v1.Join/GetCa", false, true),
            (true, "/agentmesh.v1.Node/GetInfo", false, false),
            (true, "/agentmesh.v1.Tasks/Submit", false, false),
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
