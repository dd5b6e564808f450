//! The one netfilter netlink client (`NETLINK_NETFILTER`), over `netlink-sys`. It speaks two
//! ways: with the message types of `netlink-packet-netfilter` (acknowledged requests, dumps
//! read one message at a time, raw datagram reads for sockets the kernel sends to unasked,
//! an NFLOG group: [`crate::host::nflog`], [`crate::host::conntrack`]), and undecoded, as
//! [`RawMessage`]s (requests built as bytes, dumps, and multicast event reads: the rule
//! counters and the change watchers of `dataplane::watch`, which read two or three
//! attributes per message where decoding every one would cost ~50 times as much).
//!
//! The socket works in the network namespace of the thread that opens it, as every netlink
//! socket does; nothing here changes namespaces.
//!
//! Guarantees: a request either gets the kernel's acknowledgement, its error (as an
//! [`io::Error`] with the kernel's errno), or a timeout error; a dump either reaches
//! `NLMSG_DONE` or fails. Datagrams the kernel sends while a request waits for its
//! acknowledgement (NFLOG packets arriving during configuration) are kept, not dropped, and
//! returned by [`NfnlSocket::recv_datagram`] first. A message that does not decode is counted
//! and skipped, never a panic; a datagram too long for the buffer is an error, never cut.
use std::collections::VecDeque;
use std::io;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use netlink_packet_core::{
    NetlinkBuffer, NetlinkHeader, NetlinkMessage, NetlinkPayload, NLMSG_DONE, NLMSG_ERROR,
    NLMSG_NOOP, NLMSG_OVERRUN, NLM_F_ACK, NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST,
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

    /// A non-blocking socket receiving the multicast events of `groups`, with a receive
    /// buffer of `rcvbuf` bytes (forced past `rmem_max` when we may; a smaller one only costs
    /// the reader a full read after an overrun).
    pub fn monitor(groups: &[u32], rcvbuf: usize) -> io::Result<NfnlSocket> {
        let mut socket = Socket::new(NETLINK_NETFILTER)?;
        socket.bind_auto()?;
        for group in groups {
            socket.add_membership(*group)?;
        }
        socket.set_non_blocking(true)?;
        let socket = NfnlSocket {
            socket,
            seq: 0,
            buf: Vec::with_capacity(MAX_DATAGRAM),
            backlog: VecDeque::new(),
        };
        let _ = socket.set_receive_buffer(rcvbuf);
        Ok(socket)
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
    /// crate's owned types would cost more than the read itself. A dump the kernel marks
    /// interrupted by a concurrent change is read to its end all the same: counters are
    /// read again on the next tick.
    pub fn dump_raw(
        &mut self,
        message: NetfilterMessage,
        mut each: impl FnMut(u16, &[u8]),
    ) -> io::Result<()> {
        let seq = self.send(message, NLM_F_REQUEST | NLM_F_DUMP)?;
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        loop {
            let data = self.recv_for_request(deadline)?;
            for message in raw_messages(&data) {
                let message = message?;
                if message.seq != seq {
                    continue;
                }
                match message.msg_type {
                    NLMSG_DONE => return Ok(()),
                    NLMSG_ERROR => ack_result(message.payload)?,
                    kind => each(kind, message.payload),
                }
            }
        }
    }

    /// Sends `payload` (nfgenmsg and attributes, built as bytes) as one message of `msg_type`
    /// with `NLM_F_REQUEST | flags`, then hands every reply message to `each` until the reply
    /// is complete: `NLMSG_DONE` for a dump, the first reply (or acknowledgement) otherwise.
    /// Each reply datagram may take up to [`REQUEST_TIMEOUT`]. A kernel error is returned as
    /// the `io::Error` of its errno (ipset's own codes, 4096 and up, come through as raw OS
    /// errors too); a dump the kernel marks interrupted by a concurrent change is an
    /// `Interrupted` error, so the caller reads it again whole.
    pub fn exchange(
        &mut self,
        msg_type: u16,
        flags: u16,
        payload: &[u8],
        mut each: impl FnMut(&RawMessage<'_>) -> io::Result<()>,
    ) -> io::Result<()> {
        let seq = self.send_raw(msg_type, NLM_F_REQUEST | flags, payload)?;
        let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        loop {
            let n = self.recv_reply(Instant::now() + REQUEST_TIMEOUT)?;
            let mut answered = false;
            for message in raw_messages(&self.buf[..n]) {
                let message = message?;
                if message.seq != seq {
                    // A late reply to an earlier request that was given up on.
                    continue;
                }
                if message.flags & NLM_F_DUMP_INTR != 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::Interrupted,
                        "the dump was interrupted by a concurrent change",
                    ));
                }
                match message.msg_type {
                    NLMSG_NOOP => {}
                    NLMSG_DONE => return Ok(()),
                    NLMSG_ERROR => return ack_result(message.payload),
                    NLMSG_OVERRUN => return Err(io::Error::from_raw_os_error(libc::ENOBUFS)),
                    _ => {
                        each(&message)?;
                        answered = true;
                    }
                }
            }
            if answered && !dump {
                return Ok(());
            }
        }
    }

    /// One datagram if one is pending (non-blocking sockets: [`NfnlSocket::monitor`]), `None`
    /// when none is. Lost events come back as `Err` with `ENOBUFS` ([`is_overrun`]).
    pub fn recv_pending(&mut self) -> io::Result<Option<&[u8]>> {
        if let Some(data) = self.backlog.pop_front() {
            self.buf.clear();
            self.buf.extend_from_slice(&data);
            return Ok(Some(&self.buf));
        }
        match self.recv_raw() {
            Ok(n) => Ok(Some(&self.buf[..n])),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(Some(&[])),
            Err(e) => Err(e),
        }
    }

    fn next_seq(&mut self) -> u32 {
        // Never 0: sequence 0 is the kernel speaking unasked.
        self.seq = self.seq.wrapping_add(1).max(1);
        self.seq
    }

    fn send(&mut self, message: NetfilterMessage, flags: u16) -> io::Result<u32> {
        let seq = self.next_seq();
        let mut header = NetlinkHeader::default();
        header.flags = flags;
        header.sequence_number = seq;
        let mut packet = NetlinkMessage::new(header, NetlinkPayload::from(message));
        packet.finalize();
        let mut buf = vec![0; packet.buffer_len()];
        packet.serialize(&mut buf);
        self.socket.send(&buf, 0)?;
        Ok(seq)
    }

    fn send_raw(&mut self, msg_type: u16, flags: u16, payload: &[u8]) -> io::Result<u32> {
        let seq = self.next_seq();
        let len = NLMSG_HDRLEN + payload.len();
        let mut out = vec![0u8; len];
        let mut header = NetlinkBuffer::new(&mut out[..]);
        header.set_length(len as u32);
        header.set_message_type(msg_type);
        header.set_flags(flags);
        header.set_sequence_number(seq);
        header.set_port_number(0);
        out[NLMSG_HDRLEN..].copy_from_slice(payload);
        self.socket.send(&out, 0)?;
        Ok(seq)
    }

    /// Waits for the next datagram of a reply until `deadline` and reads it into `self.buf`;
    /// returns its length.
    fn recv_reply(&mut self, deadline: Instant) -> io::Result<usize> {
        // Each read of a dump makes the kernel fill the next datagram before the read
        // returns (`netlink_recvmsg` → `netlink_dump`), so the next one is almost always
        // waiting: try it first and poll only when nothing is. An IP set header dump is
        // one datagram per set (`ip_set_dump_do` ends its message after each set), so a
        // poll before every read doubled the syscalls of the 1.5 s set check.
        match self.recv_raw_flags(libc::MSG_DONTWAIT) {
            Ok(n) => return Ok(n),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(e),
        }
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
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        }
    }

    fn recv_for_request(&mut self, deadline: Instant) -> io::Result<Vec<u8>> {
        let n = self.recv_reply(deadline)?;
        Ok(self.buf[..n].to_vec())
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
        self.recv_raw_flags(0)
    }

    fn recv_raw_flags(&mut self, flags: libc::c_int) -> io::Result<usize> {
        self.buf.clear();
        self.buf.reserve(MAX_DATAGRAM);
        let n = self.socket.recv(&mut self.buf, libc::MSG_TRUNC | flags)?;
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

/// One message of a datagram, undecoded.
#[derive(Clone, Copy, Debug)]
pub struct RawMessage<'a> {
    pub msg_type: u16,
    pub flags: u16,
    pub seq: u32,
    /// From the `nfgenmsg` header on.
    pub payload: &'a [u8],
}

impl RawMessage<'_> {
    /// The subsystem (`NFNL_SUBSYS_*`) and its message type.
    pub fn nfnl_type(&self) -> (u8, u8) {
        ((self.msg_type >> 8) as u8, self.msg_type as u8)
    }
}

/// The messages of one datagram, in order, bounds-checked by netlink-packet-core; stops at
/// the first malformed one (an `InvalidData` error naming its offset).
pub fn raw_messages(data: &[u8]) -> RawMessages<'_> {
    RawMessages { data, pos: 0 }
}

pub struct RawMessages<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Iterator for RawMessages<'a> {
    type Item = io::Result<RawMessage<'a>>;

    fn next(&mut self) -> Option<Self::Item> {
        let rest = self.data.get(self.pos..).unwrap_or_default();
        if rest.is_empty() {
            return None;
        }
        let buf = match NetlinkBuffer::new_checked(rest) {
            Ok(buf) => buf,
            Err(e) => {
                let at = self.pos;
                self.pos = self.data.len();
                return Some(Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("at byte {at}: {e}"),
                )));
            }
        };
        let len = buf.length() as usize;
        let message = RawMessage {
            msg_type: buf.message_type(),
            flags: buf.flags(),
            seq: buf.sequence_number(),
            payload: buf.payload(),
        };
        // Messages are 4-byte aligned (NLMSG_ALIGN); the last one may end unpadded.
        self.pos = self.pos.saturating_add((len + 3) & !3);
        Some(Ok(message))
    }
}

/// `NLMSG_ERROR`: errno 0 is an acknowledgement.
fn ack_result(payload: &[u8]) -> io::Result<()> {
    let code = payload
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .map(i32::from_ne_bytes)
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                "a netlink error message shorter than its error code",
            )
        })?;
    match code {
        0 => Ok(()),
        c => Err(io::Error::from_raw_os_error(c.saturating_neg())),
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
    fn raw_messages_walks_aligned_messages_and_stops_at_garbage() {
        let mut data = Vec::new();
        for (ty, payload) in [(0x0a0fu16, &[1u8, 2, 3][..]), (NLMSG_DONE, &[0u8; 4][..])] {
            let len = 16 + payload.len();
            data.extend_from_slice(&(len as u32).to_ne_bytes());
            data.extend_from_slice(&ty.to_ne_bytes());
            data.extend_from_slice(&0u16.to_ne_bytes());
            data.extend_from_slice(&7u32.to_ne_bytes());
            data.extend_from_slice(&0u32.to_ne_bytes());
            data.extend_from_slice(payload);
            data.resize((data.len() + 3) & !3, 0);
        }
        let msgs: Vec<_> = raw_messages(&data).collect::<Result<_, _>>().unwrap();
        assert_eq!(msgs.len(), 2);
        assert_eq!(msgs[0].nfnl_type(), (10, 15));
        assert_eq!(msgs[0].payload, &[1, 2, 3]);
        assert_eq!(msgs[1].msg_type, NLMSG_DONE);

        // A length field past the end, a length below the header, a short tail.
        let mut bad = data.clone();
        bad[0] = 200;
        assert!(raw_messages(&bad).next().unwrap().is_err());
        let mut bad = data.clone();
        bad[0] = 3;
        assert!(raw_messages(&bad).next().unwrap().is_err());
        let cut = &data[..data.len() - 2];
        let results: Vec<_> = raw_messages(cut).collect();
        assert!(results[0].is_ok());
        assert!(results[1].is_err());
        assert!(raw_messages(&[]).next().is_none());
        assert!(raw_messages(&[1, 2, 3]).next().unwrap().is_err());
    }

    #[test]
    fn kernel_errors_become_io_errors() {
        assert!(ack_result(&0i32.to_ne_bytes()).is_ok());
        let e = ack_result(&(-libc::ENOENT).to_ne_bytes()).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
        assert!(ack_result(&[1]).is_err());
        assert!(ack_result(&i32::MIN.to_ne_bytes()).is_err());
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
