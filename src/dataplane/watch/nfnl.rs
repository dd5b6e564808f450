//! A NETLINK_NETFILTER socket (netlink-sys) for the ipset and nf_tables primitives:
//! requests, dumps read until `NLMSG_DONE`, non-blocking event reads, and walking the
//! messages and attributes of a datagram with netlink-packet-core's bounds-checked buffers.
//!
//! Messages are walked here rather than decoded into a crate's message types because what the
//! watchers need is two or three attributes per message (a table and chain name, a set name
//! and a few counters): netlink-packet-netfilter decodes every expression of a rule and every
//! element of a set, some 50 times the CPU of the walk per event on the captured events
//! (`benches/change_detect.rs`: ~6 µs against ~0.1 µs), for each of kube-proxy's commits;
//! an attribute it cannot parse anywhere in a rule fails the whole event; and it has no ipset
//! messages.

use std::io;
use std::os::fd::AsFd;
use std::time::Duration;

use netlink_packet_core::{
    NetlinkBuffer, NlasIterator, NLMSG_DONE, NLMSG_ERROR, NLMSG_NOOP, NLMSG_OVERRUN, NLM_F_DUMP,
    NLM_F_DUMP_INTR, NLM_F_REQUEST,
};
use netlink_sys::{protocols::NETLINK_NETFILTER, Socket, SocketAddr};
use nix::libc;

use super::Malformed;

pub(crate) const NFNL_SUBSYS_IPSET: u8 = 6;
pub(crate) const NFNL_SUBSYS_NFTABLES: u8 = 10;
/// The nf_tables multicast group (`NFNLGRP_NFTABLES`).
pub(crate) const NFNLGRP_NFTABLES: u32 = 7;
/// `struct nfgenmsg`: family, version, resource id (big endian).
pub(crate) const NFGENMSG_LEN: usize = 4;
const NLMSG_HDRLEN: usize = 16;

/// Larger than any datagram the kernel builds for us: dump parts are at most 32 KiB, event
/// batches at most a page or two.
const RECV_BUF: usize = 128 << 10;
/// How long a request may take before it is given up on.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// One netlink message of a datagram.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Msg<'a> {
    pub msg_type: u16,
    pub flags: u16,
    pub seq: u32,
    pub payload: &'a [u8],
}

impl<'a> Msg<'a> {
    /// The subsystem (`NFNL_SUBSYS_*`) and its message type.
    pub fn nfnl_type(&self) -> (u8, u8) {
        ((self.msg_type >> 8) as u8, self.msg_type as u8)
    }

    /// The `nfgenmsg` family and the attributes after it.
    pub fn nfgen(&self, what: &'static str) -> Result<(u8, &'a [u8]), Malformed> {
        if self.payload.len() < NFGENMSG_LEN {
            return Err(Malformed::new(
                what,
                format!("{} bytes, shorter than nfgenmsg", self.payload.len()),
            ));
        }
        Ok((self.payload[0], &self.payload[NFGENMSG_LEN..]))
    }
}

/// The messages of one datagram, in order; stops at the first malformed one.
pub(crate) fn messages(data: &[u8]) -> Messages<'_> {
    Messages { data, pos: 0 }
}

pub(crate) struct Messages<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Iterator for Messages<'a> {
    type Item = Result<Msg<'a>, Malformed>;

    fn next(&mut self) -> Option<Self::Item> {
        let rest = self.data.get(self.pos..).unwrap_or_default();
        if rest.is_empty() {
            return None;
        }
        let buf = match NetlinkBuffer::new_checked(rest) {
            Ok(buf) => buf,
            Err(e) => {
                self.pos = self.data.len();
                return Some(Err(Malformed::new(
                    "netlink message",
                    format!("at byte {}: {e}", self.pos),
                )));
            }
        };
        let len = buf.length() as usize;
        let msg = Msg {
            msg_type: buf.message_type(),
            flags: buf.flags(),
            seq: buf.sequence_number(),
            payload: buf.payload(),
        };
        // Messages are 4-byte aligned (NLMSG_ALIGN); the last one may end unpadded.
        self.pos = self.pos.saturating_add((len + 3) & !3);
        Some(Ok(msg))
    }
}

/// The attributes of `data` as `(type without flags, value)`; stops at the first malformed one.
pub(crate) fn attrs(data: &[u8]) -> impl Iterator<Item = Result<(u16, &[u8]), Malformed>> {
    NlasIterator::new(data).map(|nla| {
        let nla = nla.map_err(|e| Malformed::new("netlink attribute", e.to_string()))?;
        let (kind, len) = (nla.kind(), nla.length() as usize);
        // new_checked made sure 4 <= len <= the buffer's length.
        let value = nla.into_inner().get(4..len).unwrap_or_default();
        Ok((kind, value))
    })
}

/// A NUL-terminated (or not) string attribute.
pub(crate) fn attr_str<'a>(what: &'static str, value: &'a [u8]) -> Result<&'a str, Malformed> {
    let end = value.iter().position(|&b| b == 0).unwrap_or(value.len());
    std::str::from_utf8(&value[..end])
        .map_err(|e| Malformed::new(what, format!("name is not UTF-8: {e}")))
}

/// A big-endian u32 attribute (ipset and nf_tables send numbers in network order).
pub(crate) fn attr_be32(what: &'static str, value: &[u8]) -> Result<u32, Malformed> {
    let bytes: [u8; 4] = value
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| Malformed::new(what, format!("{} bytes for a u32", value.len())))?;
    Ok(u32::from_be_bytes(bytes))
}

/// A NETLINK_NETFILTER socket in the calling thread's network namespace.
pub(crate) struct NfnlSocket {
    socket: Socket,
    seq: u32,
    buf: Vec<u8>,
}

impl NfnlSocket {
    /// A socket for requests.
    pub fn open() -> io::Result<NfnlSocket> {
        let mut socket = Socket::new(NETLINK_NETFILTER)?;
        socket.bind_auto()?;
        socket.connect(&SocketAddr::new(0, 0))?;
        Ok(NfnlSocket {
            socket,
            seq: 0,
            buf: Vec::with_capacity(RECV_BUF),
        })
    }

    /// A non-blocking socket receiving the events of `groups`, with a receive buffer of
    /// `rcvbuf` bytes (forced past `rmem_max` when we may; a smaller one only costs a full
    /// read after an overrun).
    pub fn monitor(groups: &[u32], rcvbuf: usize) -> io::Result<NfnlSocket> {
        let mut socket = Socket::new(NETLINK_NETFILTER)?;
        let forced = nix::sys::socket::setsockopt(
            &socket.as_fd(),
            nix::sys::socket::sockopt::RcvBufForce,
            &rcvbuf,
        );
        if forced.is_err() {
            let _ = socket.set_rx_buf_sz(rcvbuf);
        }
        socket.bind_auto()?;
        for group in groups {
            socket.add_membership(*group)?;
        }
        socket.set_non_blocking(true)?;
        Ok(NfnlSocket {
            socket,
            seq: 0,
            buf: Vec::with_capacity(RECV_BUF),
        })
    }

    pub fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.socket.as_fd()
    }

    /// Sends `payload` (nfgenmsg and attributes) as one message of `msg_type` with
    /// `NLM_F_REQUEST | flags`, then hands every reply message to `each` until the reply is
    /// complete: `NLMSG_DONE` for a dump, the first reply (or acknowledgement) otherwise. A
    /// kernel error is returned as the `io::Error` of its errno (ipset's own codes, 4096 and
    /// up, come through as raw OS errors too).
    pub fn exchange(
        &mut self,
        msg_type: u16,
        flags: u16,
        payload: &[u8],
        mut each: impl FnMut(&Msg<'_>) -> Result<(), Malformed>,
    ) -> io::Result<()> {
        let seq = self.send(msg_type, NLM_F_REQUEST | flags, payload)?;
        let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        loop {
            if !wait_readable(&self.socket, REPLY_TIMEOUT)? {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the kernel did not answer a netfilter netlink request in time",
                ));
            }
            let n = self.recv()?;
            let mut answered = false;
            for msg in messages(&self.buf[..n]) {
                let msg = msg?;
                if msg.seq != seq {
                    // A late reply to an earlier request that was given up on.
                    continue;
                }
                if msg.flags & NLM_F_DUMP_INTR != 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::Interrupted,
                        "the dump was interrupted by a concurrent change",
                    ));
                }
                match msg.msg_type {
                    NLMSG_NOOP => {}
                    NLMSG_DONE => return Ok(()),
                    NLMSG_ERROR => return ack_result(msg.payload),
                    NLMSG_OVERRUN => {
                        return Err(io::Error::from_raw_os_error(libc::ENOBUFS));
                    }
                    _ => {
                        each(&msg)?;
                        answered = true;
                    }
                }
            }
            if answered && !dump {
                return Ok(());
            }
        }
    }

    /// One datagram if one is pending (non-blocking sockets), `None` when none is. Lost
    /// events come back as `Err` with `ENOBUFS`.
    pub fn recv_pending(&mut self) -> io::Result<Option<&[u8]>> {
        match self.recv() {
            Ok(n) => Ok(Some(&self.buf[..n])),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(Some(&[])),
            Err(e) => Err(e),
        }
    }

    /// Waits until the socket has something to read; `false` on timeout.
    pub fn wait_readable(&self, timeout: Duration) -> io::Result<bool> {
        wait_readable(&self.socket, timeout)
    }

    fn send(&mut self, msg_type: u16, flags: u16, payload: &[u8]) -> io::Result<u32> {
        self.seq = self.seq.wrapping_add(1);
        let len = NLMSG_HDRLEN + payload.len();
        let mut out = vec![0u8; len];
        let mut header = NetlinkBuffer::new(&mut out[..]);
        header.set_length(len as u32);
        header.set_message_type(msg_type);
        header.set_flags(flags);
        header.set_sequence_number(self.seq);
        header.set_port_number(0);
        out[NLMSG_HDRLEN..].copy_from_slice(payload);
        self.socket.send(&out, 0)?;
        Ok(self.seq)
    }

    /// Reads one datagram into `self.buf`; returns its length. A datagram larger than the
    /// buffer is an error (it was cut, and a cut message cannot be trusted).
    fn recv(&mut self) -> io::Result<usize> {
        self.buf.clear();
        self.buf.reserve(RECV_BUF);
        let n = self.socket.recv(&mut self.buf, libc::MSG_TRUNC)?;
        if n > self.buf.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a {n}-byte netlink datagram did not fit the receive buffer"),
            ));
        }
        Ok(n)
    }
}

fn wait_readable(socket: &Socket, timeout: Duration) -> io::Result<bool> {
    crate::host::poll::readable(socket.as_fd(), timeout)
}

/// `NLMSG_ERROR`: errno 0 is an acknowledgement.
fn ack_result(payload: &[u8]) -> io::Result<()> {
    let code = payload
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .map(i32::from_ne_bytes)
        .ok_or_else(|| Malformed::new("netlink error message", "shorter than its error code"))?;
    match code {
        0 => Ok(()),
        c => Err(io::Error::from_raw_os_error(c.saturating_neg())),
    }
}

/// An nfgenmsg header for a request: family, version 0, resource id 0.
pub(crate) fn nfgenmsg(family: u8) -> [u8; NFGENMSG_LEN] {
    [family, 0, 0, 0]
}

/// Appends one attribute (4-byte aligned) to `out`.
pub(crate) fn push_attr(out: &mut Vec<u8>, kind: u16, value: &[u8]) {
    let len = 4 + value.len();
    out.extend_from_slice(&(len as u16).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(value);
    out.resize(out.len() + ((4 - len % 4) % 4), 0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_walks_aligned_messages_and_stops_at_garbage() {
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
        let msgs: Vec<_> = messages(&data).collect::<Result<_, _>>().unwrap();
        assert_eq!(msgs.len(), 2);
        assert_eq!(msgs[0].nfnl_type(), (10, 15));
        assert_eq!(msgs[0].payload, &[1, 2, 3]);
        assert_eq!(msgs[1].msg_type, NLMSG_DONE);

        // A length field past the end, a length below the header, a short tail.
        let mut bad = data.clone();
        bad[0] = 200;
        assert!(messages(&bad).next().unwrap().is_err());
        let mut bad = data.clone();
        bad[0] = 3;
        assert!(messages(&bad).next().unwrap().is_err());
        let cut = &data[..data.len() - 2];
        let results: Vec<_> = messages(cut).collect();
        assert!(results[0].is_ok());
        assert!(results[1].is_err());
        assert!(messages(&[]).next().is_none());
        assert!(messages(&[1, 2, 3]).next().unwrap().is_err());
    }

    #[test]
    fn attrs_round_trip_and_reject_truncation() {
        let mut out = Vec::new();
        push_attr(&mut out, 2, b"filter\0");
        push_attr(&mut out, 0x4000 | 5, &42u32.to_be_bytes());
        let got: Vec<_> = attrs(&out).collect::<Result<_, _>>().unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].0, 2);
        assert_eq!(attr_str("t", got[0].1).unwrap(), "filter");
        assert_eq!(got[1].0, 5, "flags are masked off the type");
        assert_eq!(attr_be32("t", got[1].1).unwrap(), 42);
        assert!(attr_be32("t", &[1, 2]).is_err());
        assert!(attr_str("t", &[0xff, 0xfe]).is_err());
        // An attribute claiming more bytes than there are.
        let mut bad = out.clone();
        bad[0] = 60;
        assert!(attrs(&bad).next().unwrap().is_err());
        assert!(attrs(&out[..3]).next().unwrap().is_err());
    }

    #[test]
    fn kernel_errors_become_io_errors() {
        assert!(ack_result(&0i32.to_ne_bytes()).is_ok());
        let e = ack_result(&(-libc::ENOENT).to_ne_bytes()).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
        assert!(ack_result(&[1]).is_err());
        assert!(ack_result(&i32::MIN.to_ne_bytes()).is_err());
    }
}
