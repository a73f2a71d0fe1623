//! Who is on the other end of a connection to the adapter: the uid that
//! owns the peer's socket, as the kernel knows it.
//!
//! - Unix socket: `SO_PEERCRED`, the peer's credentials when it connected.
//! - Loopback TCP: the peer's socket is a socket of this host, and the kernel
//!   records the uid that created it. It is asked for that one socket by its
//!   four addresses with `NETLINK_SOCK_DIAG` (an exact `inet_diag` lookup:
//!   one socket, read atomically, however many sockets the host has; what
//!   `ss -e` shows as `uid:`), and answers its uid, its inode and its
//!   state. A socket with no inode is not open in any process (a
//!   `TIME_WAIT` or orphaned socket, which the kernel reports as uid 0), so
//!   it names nobody and the peer is not identified.
//!
//! `/proc/net/tcp{,6}` holds the same uids, but reading it means reading
//! every socket of the host as text, in pieces between which the table
//! changes (a socket can be missed); the netlink lookup has neither cost.

use std::net::SocketAddr;
use std::os::fd::AsRawFd;

use netlink_packet_core::{NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload};
use netlink_packet_sock_diag::SockDiagMessage;
use netlink_packet_sock_diag::constants::{AF_INET, AF_INET6, IPPROTO_TCP};
use netlink_packet_sock_diag::inet::{ExtensionFlags, InetRequest, SocketId, StateFlags};
use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, recv, sendto,
    setsockopt, socket, sockopt,
};

/// Why a peer could not be identified.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// The kernel was not asked, or did not answer.
    #[error("asking the kernel who owns the peer's socket failed: {0}")]
    Io(#[from] std::io::Error),
    /// No socket of this host has those addresses (the peer is gone).
    #[error("no socket of this host is connected from {0} (the peer closed it)")]
    NotFound(SocketAddr),
    /// The socket exists but no process has it open.
    #[error("the socket {0} is not open in any process (closed or orphaned)")]
    NotOpen(SocketAddr),
    /// The kernel's answer could not be read.
    #[error("the kernel's answer about {peer} could not be read: {why}")]
    Answer {
        /// The peer asked about.
        peer: SocketAddr,
        /// What was wrong with it.
        why: String,
    },
}

/// The uid owning the socket at `peer` connected to `local` (this end), a
/// TCP connection within this host.
pub fn tcp_peer_uid(local: SocketAddr, peer: SocketAddr) -> Result<u32, PeerError> {
    let family = if peer.is_ipv4() { AF_INET } else { AF_INET6 };
    // The peer's own socket: its source is the peer, its destination us.
    let socket_id = SocketId {
        source_port: peer.port(),
        destination_port: local.port(),
        source_address: peer.ip(),
        destination_address: local.ip(),
        interface_id: 0,
        // INET_DIAG_NOCOOKIE: match by addresses alone.
        cookie: [0xff; 8],
    };
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST;
    let mut msg = NetlinkMessage::new(
        header,
        SockDiagMessage::InetRequest(InetRequest {
            family,
            protocol: IPPROTO_TCP,
            extensions: ExtensionFlags::empty(),
            states: StateFlags::all(),
            socket_id,
        })
        .into(),
    );
    msg.finalize();
    let mut out = vec![0u8; msg.buffer_len()];
    msg.serialize(&mut out);

    let fd = socket(
        AddressFamily::Netlink,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkSockDiag,
    )
    .map_err(std::io::Error::from)?;
    // The kernel answers within the send; never wait long for it anyway.
    let timeout = nix::sys::time::TimeVal::new(2, 0);
    setsockopt(&fd, sockopt::ReceiveTimeout, &timeout).map_err(std::io::Error::from)?;
    sendto(
        fd.as_raw_fd(),
        &out,
        &NetlinkAddr::new(0, 0),
        MsgFlags::empty(),
    )
    .map_err(std::io::Error::from)?;
    let mut buf = vec![0u8; 8192];
    let n = recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty()).map_err(std::io::Error::from)?;
    let answer = |why: String| PeerError::Answer { peer, why };
    let reply = NetlinkMessage::<SockDiagMessage>::deserialize(&buf[..n])
        .map_err(|e| answer(e.to_string()))?;
    match reply.payload {
        NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(r)) => {
            let id = &r.header.socket_id;
            if id.source_address != peer.ip()
                || id.source_port != peer.port()
                || id.destination_address != local.ip()
                || id.destination_port != local.port()
            {
                return Err(answer(format!(
                    "it describes {}:{} → {}:{}",
                    id.source_address, id.source_port, id.destination_address, id.destination_port
                )));
            }
            if r.header.inode == 0 {
                return Err(PeerError::NotOpen(peer));
            }
            Ok(r.header.uid)
        }
        NetlinkPayload::Error(e) => match e.code.map(|c| -c.get()) {
            Some(nix::libc::ENOENT) => Err(PeerError::NotFound(peer)),
            Some(errno) => Err(PeerError::Io(std::io::Error::from_raw_os_error(errno))),
            None => Err(answer("an acknowledgement without an answer".into())),
        },
        other => Err(answer(format!("message type {}", other.message_type()))),
    }
}

/// The adapter's own uid: the identity the daemon knows it by.
pub fn own_uid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loopback_peer_is_ours_and_a_closed_one_is_nobody() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let local = listener.local_addr().unwrap();
        let client = std::net::TcpStream::connect(local).unwrap();
        let (_server, peer) = listener.accept().unwrap();
        assert_eq!(client.local_addr().unwrap(), peer);
        assert_eq!(tcp_peer_uid(local, peer).unwrap(), own_uid());
        // The server's own end is found too (and is ours).
        assert_eq!(tcp_peer_uid(peer, local).unwrap(), own_uid());
        drop(client);
        // Closed first by the client: FIN_WAIT/TIME_WAIT, no inode, or gone.
        let r = tcp_peer_uid(local, peer);
        assert!(
            matches!(r, Err(PeerError::NotOpen(_) | PeerError::NotFound(_))),
            "{r:?}"
        );
        // Addresses nobody uses.
        let nobody: SocketAddr = "127.0.0.1:1".parse().unwrap();
        assert!(matches!(
            tcp_peer_uid(local, nobody),
            Err(PeerError::NotFound(_))
        ));
    }

    #[test]
    fn ipv6_loopback_too() {
        let listener = match std::net::TcpListener::bind("[::1]:0") {
            Ok(l) => l,
            // A host (a container) without an IPv6 loopback: what binding
            // it answers there. Anything else is a failure.
            Err(e) if e.raw_os_error() == Some(libc::EADDRNOTAVAIL) => {
                wpd_test_skip::machine_skip(&format!("no IPv6 loopback here: bind [::1]: {e}"));
                return;
            }
            Err(e) => panic!("bind [::1]: {e}"),
        };
        let local = listener.local_addr().unwrap();
        let _client = std::net::TcpStream::connect(local).unwrap();
        let (_server, peer) = listener.accept().unwrap();
        assert_eq!(tcp_peer_uid(local, peer).unwrap(), own_uid());
    }
}
