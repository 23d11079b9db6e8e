//! Binding: the gRPC listener the node is started on and the front door's, with the port
//! fallback (7700, else the next free port up to 7710 when the port was not chosen), and the
//! addresses the node advertises for a listener.

use std::{io, net::SocketAddr};

use tokio::net::TcpListener;

use super::error::StartError;
use crate::config::{Config, LAST_FALLBACK_PORT, Listen};

/// Binds the listener `listen` asks for. When the port was not chosen explicitly and is taken,
/// tries the following ports up to 7710.
pub async fn bind(listen: Listen) -> Result<TcpListener, StartError> {
    bind_up_to(listen, LAST_FALLBACK_PORT).await
}

/// Pending connections the kernel queues for a listener before the node accepts them (capped
/// by `net.core.somaxconn`). The default of 128 overflows under a burst of connections (an
/// idle-socket flood, many clients at once) while the node is busy, and a connection dropped
/// from the queue waits a second or more for its SYN to be sent again, however idle the node
/// is a moment later.
const LISTEN_BACKLOG: u32 = 4096;

/// A listener on `addr` with [`LISTEN_BACKLOG`] (and `SO_REUSEADDR`, as `TcpListener::bind`
/// sets it, so a restarted node gets its port back at once).
fn listen_on(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Binds `listen`; when its port was not chosen, the next free one up to `last_fallback`.
pub(super) async fn bind_up_to(
    listen: Listen,
    last_fallback: u16,
) -> Result<TcpListener, StartError> {
    let last = if listen.fallback {
        last_fallback.max(listen.addr.port())
    } else {
        listen.addr.port()
    };
    let mut addr = listen.addr;
    loop {
        match listen_on(addr) {
            Ok(listener) => return Ok(listener),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse && addr.port() < last => {
                tracing::info!(port = addr.port(), "port taken; trying the next one");
                addr.set_port(addr.port() + 1);
            }
            Err(source) => {
                let hint = if source.kind() == io::ErrorKind::AddrInUse {
                    "; another mesh-node may be running: stop it, or choose another port with --listen"
                } else {
                    ""
                };
                return Err(StartError::Bind {
                    addr,
                    error: source,
                    hint,
                });
            }
        }
    }
}

/// The address `listener` is bound to.
pub(super) fn bound_addr(
    listener: &TcpListener,
    config: &Config,
) -> Result<SocketAddr, StartError> {
    listener.local_addr().map_err(|error| StartError::Bind {
        addr: config.listen.addr,
        error,
        hint: "",
    })
}

/// `addr`, or one `ip:port` per interface address when listening on a wildcard.
pub(super) fn advertised_addrs(addr: SocketAddr) -> Vec<String> {
    if !addr.ip().is_unspecified() {
        return vec![addr.to_string()];
    }
    let mut addrs: Vec<String> = if_addrs::get_if_addrs()
        .unwrap_or_default()
        .into_iter()
        .map(|iface| iface.ip())
        .filter(|ip| ip.is_ipv4() == addr.is_ipv4() || addr.is_ipv6())
        .map(|ip| SocketAddr::new(ip, addr.port()).to_string())
        .collect();
    addrs.sort();
    addrs.truncate(16);
    addrs
}
