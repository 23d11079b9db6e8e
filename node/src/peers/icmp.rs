//! "Nobody listens there": the ICMP port-unreachable answers to membership datagrams. When a
//! node's process dies but its host stays up (a crash, SIGKILL, an upgrade gone wrong), the
//! host answers every datagram sent to the dead port with ICMP port unreachable. Linux hands
//! those to a UDP socket that asked for them (`IP_RECVERR` / `IPV6_RECVERR`) on its error queue;
//! [`take_unreachable`] reads one and names the address that did not listen, and membership
//! suspects the member there at once instead of after a failed probe period.
//!
//! ICMP is not authenticated: a stranger on the LAN can forge one. That only raises a
//! suspicion, which a live member refutes within a round trip, so the worst a forger gets is
//! the churn of a refutation. Other systems: the error queue is Linux's; elsewhere the probes
//! alone find a dead member.

use std::{io, net::SocketAddr};

use tokio::net::UdpSocket;

/// Asks the kernel to queue ICMP errors about datagrams `socket` sent.
#[cfg(target_os = "linux")]
pub(crate) fn enable(socket: &UdpSocket) -> io::Result<()> {
    use nix::sys::socket::{setsockopt, sockopt};

    match socket.local_addr()? {
        SocketAddr::V4(_) => setsockopt(socket, sockopt::Ipv4RecvErr, &true),
        SocketAddr::V6(_) => setsockopt(socket, sockopt::Ipv6RecvErr, &true),
    }
    .map_err(io::Error::from)
}

/// Elsewhere: nothing to enable; the probes find a dead member.
#[cfg(not(target_os = "linux"))]
pub fn enable(_socket: &UdpSocket) -> io::Result<()> {
    Ok(())
}

/// Takes one error off `socket`'s error queue: `Some(addr)` when it is an ICMP port unreachable
/// for a datagram sent to `addr`, `None` for any other error (a local one such as a datagram
/// too large, or another ICMP type), `WouldBlock` when the queue is empty.
#[cfg(target_os = "linux")]
pub(crate) fn take_unreachable(socket: &UdpSocket) -> io::Result<Option<SocketAddr>> {
    use std::os::fd::AsRawFd;

    use nix::{
        libc,
        sys::socket::{ControlMessageOwned, MsgFlags, SockaddrStorage, recvmsg},
    };

    // The original datagram's first bytes come back too; they are not needed.
    let mut data = [0u8; 64];
    let mut iov = [io::IoSliceMut::new(&mut data)];
    let mut control = nix::cmsg_space!(libc::sock_extended_err, libc::sockaddr_in6);
    let msg = recvmsg::<SockaddrStorage>(
        socket.as_raw_fd(),
        &mut iov,
        Some(&mut control),
        MsgFlags::MSG_ERRQUEUE | MsgFlags::MSG_DONTWAIT,
    )
    .map_err(io::Error::from)?;
    let refused = msg.cmsgs().map_err(io::Error::from)?.any(|c| match c {
        ControlMessageOwned::Ipv4RecvErr(e, _) | ControlMessageOwned::Ipv6RecvErr(e, _) => {
            (e.ee_origin == libc::SO_EE_ORIGIN_ICMP || e.ee_origin == libc::SO_EE_ORIGIN_ICMP6)
                && e.ee_errno == libc::ECONNREFUSED as u32
        }
        _ => false,
    });
    let addr = msg.address.and_then(|a| {
        a.as_sockaddr_in()
            .map(|v4| SocketAddr::V4((*v4).into()))
            .or_else(|| a.as_sockaddr_in6().map(|v6| SocketAddr::V6((*v6).into())))
    });
    Ok(addr.filter(|_| refused))
}

/// Elsewhere: the queue is always empty.
#[cfg(not(target_os = "linux"))]
pub fn take_unreachable(_socket: &UdpSocket) -> io::Result<Option<SocketAddr>> {
    Err(io::ErrorKind::WouldBlock.into())
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use std::time::Duration;

    use tokio::io::Interest;

    use super::*;

    #[tokio::test]
    async fn a_datagram_to_a_closed_port_is_reported_with_its_address() {
        let socket = UdpSocket::bind("127.0.0.1:0").await.expect("bind");
        enable(&socket).expect("enable");
        // A port nobody listens on: bound, noted, closed.
        let closed = UdpSocket::bind("127.0.0.1:0").await.expect("bind");
        let dead = closed.local_addr().expect("addr");
        drop(closed);
        socket.send_to(b"ping", dead).await.expect("send");
        let reported = tokio::time::timeout(
            Duration::from_secs(5),
            socket.async_io(Interest::ERROR, || take_unreachable(&socket)),
        )
        .await
        .expect("an error is queued within 5 s")
        .expect("read the error queue");
        assert_eq!(reported, Some(dead));
        // Nothing more queued.
        assert_eq!(
            take_unreachable(&socket).map_err(|e| e.kind()),
            Err(io::ErrorKind::WouldBlock)
        );
    }
}
