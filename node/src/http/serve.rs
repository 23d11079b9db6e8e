//! The front door's own accept loop ([`serve`]), which bounds connections before they send a
//! request (`[connections]`: a header timeout and a cap), as `axum::serve` does not.

use std::sync::Arc;

use axum::Router;
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::conn::auto,
};

use crate::{
    config::ConnectionLimits,
    connections::{ACCEPT_BACKOFF, Cap, ConnectionCap, ConnectionSlot},
    metrics::{labels, metrics},
};

/// How long in-flight front-door requests may finish once the node is leaving.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Serves the front door (`app`: [`router`]) on `listener` until `stop`; in-flight requests
/// then get [`SHUTDOWN_GRACE`] to finish.
///
/// The accept loop is the node's own rather than `axum::serve`'s, for the bounds `axum::serve`
/// does not offer: at most `connections.http_max_connections` open connections (one over is
/// closed as soon as it is accepted), and a connection that has not sent a complete request's
/// headers within `connections.header_timeout_s` of opening, or of its last response (an idle
/// keep-alive connection), is closed (hyper's header read timeout). It speaks HTTP/1.1 only,
/// as OpenAI clients do; the version sniffing of HTTP/2 would wait for bytes without a timeout.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    limits: ConnectionLimits,
    stop: tokio_util::sync::CancellationToken,
) {
    let cap = ConnectionCap::new("http", Cap::Connections, limits.http_max_connections);
    let mut builder = auto::Builder::new(TokioExecutor::new()).http1_only();
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    let builder = Arc::new(builder);
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, remote)) => {
                    // Over the cap the socket is dropped here, which closes it.
                    if let Some(slot) = cap.admit() {
                        // Streamed chunks go out at once, not after a delayed ACK.
                        let _ = tcp.set_nodelay(true);
                        connections.spawn(connection(
                            builder.clone(),
                            tcp,
                            remote,
                            app.clone(),
                            slot,
                            stop.clone(),
                        ));
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept a front-door connection");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
            // Reaps finished connections, so the set holds only open ones.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            () = stop.cancelled() => break,
        }
    }
    // No new connections; each open one finishes its request in flight and closes.
    drop(listener);
    let drained = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(SHUTDOWN_GRACE, drained).await.is_err() {
        tracing::warn!("front-door requests did not finish within the grace period; closing them");
        connections.shutdown().await;
    }
}

/// Serves one front-door connection until it closes, or until `stop` (then it finishes the
/// request in flight and closes).
async fn connection(
    builder: Arc<auto::Builder<TokioExecutor>>,
    tcp: tokio::net::TcpStream,
    remote: std::net::SocketAddr,
    app: Router,
    slot: ConnectionSlot,
    stop: tokio_util::sync::CancellationToken,
) {
    // Every request knows where its connection came from (the key check's loopback exemption).
    let app = tower::ServiceExt::map_request(
        app,
        move |mut request: axum::http::Request<hyper::body::Incoming>| {
            request
                .extensions_mut()
                .insert(axum::extract::ConnectInfo(remote));
            request
        },
    );
    let service = hyper_util::service::TowerToHyperService::new(app);
    let conn = builder.serve_connection(TokioIo::new(tcp), service);
    tokio::pin!(conn);
    let result = tokio::select! {
        result = conn.as_mut() => result,
        () = stop.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        let timed_out = e
            .downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_timeout);
        if timed_out {
            metrics()
                .connections_timed_out
                .get_or_create(&labels(&[("listener", "http"), ("phase", "headers")]))
                .inc();
            tracing::debug!(%remote, "front-door connection sent no request headers in time: closed");
        } else {
            tracing::debug!(%remote, error = %e, "front-door connection ended with an error");
        }
    }
    drop(slot);
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use axum::routing::get;
    use tokio::{
        io::{AsyncReadExt, AsyncWriteExt},
        net::TcpStream,
    };
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::connections::test_support::closed_within;

    /// A front door answering `GET /ping` with `pong`, served with `limits`.
    async fn pong_door(limits: ConnectionLimits) -> (std::net::SocketAddr, CancellationToken) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let stop = CancellationToken::new();
        let app = Router::new().route("/ping", get(|| async { "pong" }));
        tokio::spawn(serve(listener, app, limits, stop.clone()));
        (addr, stop)
    }

    /// Sends one keep-alive `GET /ping` and reads its answer.
    async fn ping(tcp: &mut TcpStream) -> std::io::Result<()> {
        tcp.write_all(b"GET /ping HTTP/1.1\r\nhost: door\r\n\r\n")
            .await?;
        let mut answer = Vec::new();
        let mut buf = [0u8; 512];
        while !answer.ends_with(b"pong") {
            let n = tcp.read(&mut buf).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            answer.extend_from_slice(&buf[..n]);
        }
        Ok(())
    }

    /// An idle keep-alive connection (and one that never sends a byte) is closed once the
    /// header timeout passes, not before: without hyper's header read timeout both stay open.
    #[tokio::test]
    async fn idle_and_silent_connections_are_closed_after_the_header_timeout() {
        let header_timeout = Duration::from_millis(400);
        let (addr, stop) = pong_door(ConnectionLimits {
            header_timeout,
            ..ConnectionLimits::default()
        })
        .await;
        let mut keep_alive = TcpStream::connect(addr).await.expect("connect");
        let mut silent = TcpStream::connect(addr).await.expect("connect");
        ping(&mut keep_alive).await.expect("first request");
        ping(&mut keep_alive)
            .await
            .expect("a second request on the same connection");
        let idle_since = Instant::now();
        assert!(
            closed_within(&mut keep_alive, Duration::from_secs(5)).await,
            "an idle keep-alive connection stayed open"
        );
        assert!(
            idle_since.elapsed() >= header_timeout - Duration::from_millis(50),
            "closed after {:?}, before the header timeout",
            idle_since.elapsed()
        );
        assert!(
            closed_within(&mut silent, Duration::from_secs(5)).await,
            "a connection that never sent a byte stayed open"
        );
        stop.cancel();
    }

    /// Past `http_max_connections` a new connection is closed at once and counted; once one
    /// closes, the next is served. Without the cap the third connection is served.
    #[tokio::test]
    async fn past_the_cap_a_front_door_connection_is_closed_at_once_and_counted() {
        let (addr, stop) = pong_door(ConnectionLimits {
            http_max_connections: 2,
            ..ConnectionLimits::default()
        })
        .await;
        let refused = || {
            metrics()
                .connections_refused
                .get_or_create(&labels(&[
                    ("listener", "http"),
                    ("reason", "max_connections"),
                ]))
                .get()
        };
        let before = refused();
        let mut first = TcpStream::connect(addr).await.expect("connect");
        let mut second = TcpStream::connect(addr).await.expect("connect");
        // Answered: both hold their slots.
        ping(&mut first).await.expect("first served");
        ping(&mut second).await.expect("second served");
        let mut third = TcpStream::connect(addr).await.expect("connect");
        assert!(
            closed_within(&mut third, Duration::from_secs(2)).await,
            "the connection past the cap was served"
        );
        assert!(refused() > before, "the refusal was not counted");
        ping(&mut first).await.expect("the first is still served");
        drop(second);
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let mut next = TcpStream::connect(addr).await.expect("connect");
            if ping(&mut next).await.is_ok() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "a closed connection never gave its slot back"
            );
            tokio::time::sleep(Duration::from_millis(20)).await; // poll again until the deadline
        }
        stop.cancel();
    }
}
