//! A small synchronous nfnetlink client (`NETLINK_NETFILTER`) over `netlink-sys`, carrying
//! the message types of `netlink-packet-netfilter`: acknowledged requests, dumps read one
//! message at a time, and raw datagram reads for sockets the kernel sends to unasked (an
//! NFLOG group). Shared by [`crate::host::nflog`] and [`crate::host::conntrack`].
//!
//! The socket works in the network namespace of the thread that opens it, as every netlink
//! socket does; nothing here changes namespaces.
//!
//! Guarantees: a request either gets the kernel's acknowledgement, its error (as an
//! [`io::Error`] with the kernel's errno), or a timeout error; a dump either reaches
//! `NLMSG_DONE` or fails. Datagrams the kernel sends while a request waits for its
//! acknowledgement (NFLOG packets arriving during configuration) are kept, not dropped, and
//! returned by [`NfnlSocket::recv_datagram`] first. A message that does not decode is counted
//! and skipped, never a panic.

use std::collections::VecDeque;
use std::io;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST,
};
use netlink_packet_netfilter::NetfilterMessage;
use netlink_sys::{protocols::NETLINK_NETFILTER, Socket, SocketAddr};
use nix::libc;

/// Largest datagram we expect: NFLOG batches are at most 128 KiB (`NFULA_CFG_NLBUFSIZ`
/// maximum) and dump replies are far smaller. A longer one is reported, not truncated
/// silently.
pub const MAX_DATAGRAM: usize = 256 << 10;

/// Length of a netlink message header (`struct nlmsghdr`).
const NLMSG_HDRLEN: usize = 16;

/// How long a request or a dump may take before it is given up on.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// One message of a datagram: its header, and its payload when the crate could decode it.
#[derive(Debug)]
pub struct Received {
    pub header: NetlinkHeader,
    /// `Err` carries the decode error's text (the message is counted as undecodable).
    pub payload: Result<NetlinkPayload<NetfilterMessage>, String>,
}

/// A netfilter netlink socket.
pub struct NfnlSocket {
    socket: Socket,
    seq: u32,
    buf: Vec<u8>,
    /// Datagrams that arrived while a request waited for its acknowledgement.
    backlog: VecDeque<Vec<u8>>,
}

impl std::fmt::Debug for NfnlSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NfnlSocket")
            .field("seq", &self.seq)
            .finish_non_exhaustive()
    }
}

impl NfnlSocket {
    /// A socket in the calling thread's network namespace, bound to a port id the kernel
    /// picks.
    pub fn open() -> io::Result<NfnlSocket> {
        let mut socket = Socket::new(NETLINK_NETFILTER)?;
        socket.bind_auto()?;
        socket.connect(&SocketAddr::new(0, 0))?;
        Ok(NfnlSocket {
            socket,
            seq: 0,
            buf: Vec::with_capacity(MAX_DATAGRAM),
            backlog: VecDeque::new(),
        })
    }

    /// Asks for a receive buffer of `bytes`. As root `SO_RCVBUFFORCE` lifts the
    /// `net.core.rmem_max` cap; otherwise the kernel caps it silently. Returns what the
    /// kernel granted (it reports twice the request, its bookkeeping included).
    pub fn set_receive_buffer(&self, bytes: usize) -> io::Result<usize> {
        let value = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
        let forced = setsockopt_int(&self.socket, libc::SO_RCVBUFFORCE, value);
        if forced.is_err() {
            self.socket.set_rx_buf_sz(value)?;
        }
        self.socket.get_rx_buf_sz()
    }

    /// Sends `message` with `NLM_F_REQUEST | NLM_F_ACK | flags` and waits for the kernel's
    /// acknowledgement or error.
    pub fn request(&mut self, message: NetfilterMessage, flags: u16) -> io::Result<()> {
        let seq = self.send(message, NLM_F_REQUEST | NLM_F_ACK | flags)?;
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        loop {
            let data = self.recv_for_request(deadline)?;
            let mut acked = None;
            let mut unasked = false;
            for message in split(&data)? {
                if message.header.sequence_number != seq {
                    // Sequence 0 is the kernel speaking unasked (an NFLOG packet); anything
                    // else answers an earlier request that was given up on.
                    unasked |= message.header.sequence_number == 0;
                    continue;
                }
                if let Ok(NetlinkPayload::Error(e)) = message.payload {
                    acked = Some(match e.code {
                        None => Ok(()),
                        Some(_) => Err(e.to_io()),
                    });
                }
            }
            if unasked {
                // Kept for the reader, which skips the acknowledgement if it shares the
                // datagram.
                self.backlog.push_back(data);
            }
            if let Some(result) = acked {
                return result;
            }
        }
    }

    /// Sends a dump request (`NLM_F_REQUEST | NLM_F_DUMP`) and hands every reply message to
    /// `each` until `NLMSG_DONE`. Returns how many messages did not decode (skipped).
    pub fn dump(
        &mut self,
        message: NetfilterMessage,
        mut each: impl FnMut(NetfilterMessage),
    ) -> io::Result<u64> {
        let seq = self.send(message, NLM_F_REQUEST | NLM_F_DUMP)?;
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        let mut undecodable = 0;
        loop {
            let data = self.recv_for_request(deadline)?;
            for message in split(&data)? {
                if message.header.sequence_number != seq {
                    // A reply to an earlier request that was given up on.
                    continue;
                }
                match message.payload {
                    Ok(NetlinkPayload::Done(_)) => return Ok(undecodable),
                    Ok(NetlinkPayload::Error(e)) if e.code.is_some() => return Err(e.to_io()),
                    Ok(NetlinkPayload::InnerMessage(inner)) => each(inner),
                    Ok(_) => {}
                    Err(e) => {
                        undecodable += 1;
                        tracing::debug!(error = %e, "skipping a netfilter message that does not decode");
                    }
                }
            }
        }
    }

    /// A dump whose replies are handed over undecoded: `each(message type, payload)` for every
    /// reply message (the payload starts at the `nfgenmsg` header). For large dumps read on a
    /// timer (the rule counters), where decoding every attribute of every message into the
    /// crate's owned types would cost more than the read itself.
    pub fn dump_raw(
        &mut self,
        message: NetfilterMessage,
        mut each: impl FnMut(u16, &[u8]),
    ) -> io::Result<()> {
        let seq = self.send(message, NLM_F_REQUEST | NLM_F_DUMP)?;
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        loop {
            let data = self.recv_for_request(deadline)?;
            let mut offset = 0;
            while offset + NLMSG_HDRLEN <= data.len() {
                let message = netlink_packet_core::NetlinkBuffer::new_checked(&data[offset..])
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
                let len = message.length() as usize;
                if message.sequence_number() == seq {
                    match message.message_type() {
                        netlink_packet_core::NLMSG_DONE => return Ok(()),
                        netlink_packet_core::NLMSG_ERROR => {
                            let payload = message.payload();
                            let code = payload
                                .get(..4)
                                .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
                                .unwrap_or(0);
                            if code != 0 {
                                return Err(io::Error::from_raw_os_error(-code));
                            }
                        }
                        kind => each(kind, message.payload()),
                    }
                }
                offset += (len + 3) & !3;
            }
        }
    }

    fn send(&mut self, message: NetfilterMessage, flags: u16) -> io::Result<u32> {
        self.seq = self.seq.wrapping_add(1).max(1);
        let mut header = NetlinkHeader::default();
        header.flags = flags;
        header.sequence_number = self.seq;
        let mut packet = NetlinkMessage::new(header, NetlinkPayload::from(message));
        packet.finalize();
        let mut buf = vec![0; packet.buffer_len()];
        packet.serialize(&mut buf);
        self.socket.send(&buf, 0)?;
        Ok(self.seq)
    }

    fn recv_for_request(&mut self, deadline: Instant) -> io::Result<Vec<u8>> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            // The socket itself, not the backlog: replies never sit there.
            if left.is_zero() || !self.poll_socket(left)? {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the kernel did not answer a netfilter netlink request in time",
                ));
            }
            match self.recv_raw() {
                Ok(n) => return Ok(self.buf[..n].to_vec()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Reads one datagram (the backlog first), blocking unless the socket is non-blocking.
    /// The slice is valid until the next call.
    pub fn recv_datagram(&mut self) -> io::Result<Datagram<'_>> {
        if let Some(data) = self.backlog.pop_front() {
            self.buf.clear();
            self.buf.extend_from_slice(&data);
            return Ok(Datagram(&self.buf));
        }
        let n = self.recv_raw()?;
        Ok(Datagram(&self.buf[..n]))
    }

    fn recv_raw(&mut self) -> io::Result<usize> {
        self.buf.clear();
        self.buf.reserve(MAX_DATAGRAM);
        let n = self.socket.recv(&mut self.buf, libc::MSG_TRUNC)?;
        if n > self.buf.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "a {n}-byte netlink datagram does not fit the {}-byte receive buffer",
                    self.buf.len()
                ),
            ));
        }
        Ok(n)
    }

    /// Waits until there is something to read (the backlog counts); `false` on timeout.
    pub fn wait_readable(&self, timeout: Duration) -> io::Result<bool> {
        if !self.backlog.is_empty() {
            return Ok(true);
        }
        self.poll_socket(timeout)
    }

    fn poll_socket(&self, timeout: Duration) -> io::Result<bool> {
        super::poll::readable(self.socket.as_fd(), timeout)
    }

    pub fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.socket.as_fd()
    }
}

/// One datagram as the kernel sent it.
#[derive(Clone, Copy, Debug)]
pub struct Datagram<'a>(pub &'a [u8]);

impl Datagram<'_> {
    pub fn messages(&self) -> io::Result<Vec<Received>> {
        split(self.0)
    }
}

/// Whether a receive error means the kernel dropped messages because our buffer was full.
pub fn is_overrun(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::ENOBUFS)
}

fn setsockopt_int(socket: &Socket, option: libc::c_int, value: libc::c_int) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: the descriptor is open for the socket's lifetime and the option value is a
    // c_int on the stack, as SO_RCVBUF(FORCE) expects.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            option,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Splits one datagram into its messages. A length field that runs past the datagram is an
/// error (the rest cannot be framed); a message the crate cannot decode is returned with its
/// error so the caller can count it.
pub fn split(data: &[u8]) -> io::Result<Vec<Received>> {
    let mut out = Vec::new();
    let mut offset = 0;
    while offset + NLMSG_HDRLEN <= data.len() {
        let len = u32::from_ne_bytes([
            data[offset],
            data[offset + 1],
            data[offset + 2],
            data[offset + 3],
        ]) as usize;
        if len < NLMSG_HDRLEN || len > data.len() - offset {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "malformed netlink message: length {len} at offset {offset} of a {}-byte datagram",
                    data.len()
                ),
            ));
        }
        let bytes = &data[offset..offset + len];
        let header = header_of(bytes);
        let payload = NetlinkMessage::<NetfilterMessage>::deserialize(bytes)
            .map(|m| m.payload)
            .map_err(|e| e.to_string());
        out.push(Received { header, payload });
        // Messages are 4-byte aligned (NLMSG_ALIGN).
        offset = offset.saturating_add((len + 3) & !3);
    }
    Ok(out)
}

/// The header fields of a message whose length was already checked to cover a header.
fn header_of(bytes: &[u8]) -> NetlinkHeader {
    let u32_at =
        |i: usize| u32::from_ne_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
    let u16_at = |i: usize| u16::from_ne_bytes([bytes[i], bytes[i + 1]]);
    let mut header = NetlinkHeader::default();
    header.length = u32_at(0);
    header.message_type = u16_at(4);
    header.flags = u16_at(6);
    header.sequence_number = u32_at(8);
    header.port_number = u32_at(12);
    header
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_rejects_a_length_past_the_datagram_and_skips_nothing_else() {
        let mut data = vec![0u8; 20];
        data[..4].copy_from_slice(&40u32.to_ne_bytes());
        assert!(split(&data).is_err());
        data[..4].copy_from_slice(&8u32.to_ne_bytes());
        assert!(split(&data).is_err(), "a length below the header size");
        assert!(split(&[]).unwrap().is_empty());
    }

    #[test]
    fn split_returns_an_undecodable_message_with_its_error() {
        // NLMSG_DONE (type 3) needs a 4-byte payload; a bare header is too short for it,
        // and a netfilter message (type 0x0100) needs its 4-byte nfgenmsg.
        let mut data = Vec::new();
        for message_type in [0x0100u16, 3] {
            data.extend_from_slice(&16u32.to_ne_bytes());
            data.extend_from_slice(&message_type.to_ne_bytes());
            data.extend_from_slice(&0u16.to_ne_bytes());
            data.extend_from_slice(&7u32.to_ne_bytes());
            data.extend_from_slice(&0u32.to_ne_bytes());
        }
        let messages = split(&data).unwrap();
        assert_eq!(messages.len(), 2);
        assert_eq!(messages[0].header.sequence_number, 7);
        assert!(messages[0].payload.is_err());
    }
}
