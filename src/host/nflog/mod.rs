//! Reading one NFLOG group: the packets the kernel's `-j NFLOG` rules copy to userspace, with
//! their prefix, payload, interfaces and timestamp, on a thread of its own. [`decode`] turns a
//! payload into a flow, [`dedup`] keeps one log line per flow per window, and [`rule`] renders
//! the iptables rule that feeds the group.
//!
//! Crate choice: `netlink-packet-netfilter` (rust-netlink, the family our `netlink-sys` and
//! `netlink-packet-core` come from; 0.4 builds on `netlink-packet-core` 0.9) decodes and
//! encodes the NFLOG (`NFNL_SUBSYS_ULOG`) messages, and our [`crate::host::nfnetlink`] socket
//! carries them. The `nflog` crate binds the C library `libnetfilter_log` (a system library
//! to install, callbacks through FFI, last released 2016), so it was not taken; writing the
//! attribute parsing by hand would duplicate the maintained crate. Two fields the crate keeps
//! private (the packet header's hardware protocol and hook, the timestamp) are read back
//! through its own `emit_value`.
//!
//! What the kernel needs: one config message binding the group (`NFULNL_CFG_CMD_BIND`) that
//! also sets copy-packet mode with the snap length, the socket's flush threshold and timeout
//! (and, when asked, the batch buffer's size: flow logs batch, deny logs do not),
//! and per-group sequence numbers (`NFULNL_CFG_F_SEQ`; not `NFULNL_CFG_F_SEQ_GLOBAL`, whose
//! counter is shared by every group of the namespace, so its gaps are other groups' messages,
//! not our losses). No `PF_BIND`/`PF_UNBIND`: the NFLOG
//! target finds nfnetlink_log by logger type (registered for every family when the module
//! loads), and `PF_BIND` would make it the namespace's default logger for other users of
//! `nf_log` (conntrack's invalid-packet logging, `-j LOG` fallbacks) while `PF_UNBIND` would
//! remove whatever another program bound. The group is unbound when the socket closes (the
//! kernel drops a closed port's instances); [`NflogSocket`] also unbinds explicitly on drop.
//!
//! Guarantees: nothing is opened before [`NflogSocket::open`] or [`Reader::spawn`]; so when
//! deny logging is off, no socket exists. Every packet message read is counted, and so are
//! messages lost: the kernel's per-group sequence numbers show exactly how many never reached
//! us (a gap), and each `ENOBUFS` on the socket (the receive buffer overflowed) is counted as
//! an overrun. A message that does not decode is counted and skipped. A group already bound by
//! another process (say ulogd) is a clear error, not a silent takeover.

pub mod decode;
pub mod dedup;

/// Bytes of each logged packet the kernel copies to us: enough for an IPv6 header with a few
/// extension headers and the transport header. `rules::deny_log` renders `--nflog-size` with
/// the same number.
pub const DEFAULT_SNAP_LEN: u32 = 128;

/// The largest batch buffer nfnetlink_log accepts (`NFULNL_CFG_NLBUFSIZ`).
pub const MAX_BATCH_BYTES: u32 = 128 << 10;

use std::ffi::CString;
use std::io;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use netlink_packet_core::{NetlinkPayload, Nla};
use netlink_packet_netfilter::nflog::{
    ConfigCmd, ConfigFlags, ConfigMode, ConfigNla, PacketNla, Timeout, ULogMessage,
};
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
};
use nix::libc;

use crate::host::nfnetlink::{is_overrun, NfnlSocket};

pub use decode::{DecodeError, Flow, L4};

/// Reader settings. Defaults suit deny logging: small snap length, no batching.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// The NFLOG group (`--nflog-group`) to read.
    pub group: u16,
    /// Bytes of each packet the kernel copies (the rule's `--nflog-size` caps it as well).
    pub snap_len: u32,
    /// Messages the kernel queues before sending them in one datagram. 1 sends each at once:
    /// deny logs are rate-limited in the kernel, so latency matters more than batching.
    pub flush_threshold: u32,
    /// Longest time a queued message waits when `flush_threshold` is above 1.
    pub flush_timeout: Duration,
    /// Size of the kernel's batch buffer (`NFULNL_CFG_NLBUFSIZ`): a batch is sent early when
    /// the next message would not fit. `None` keeps the kernel's default (one page), which
    /// holds some 15 flow-log messages; the kernel takes up to 128 KiB.
    pub batch_bytes: Option<u32>,
    /// Socket receive buffer asked for (the kernel may cap it; see the overrun counter).
    pub receive_buffer: usize,
    /// How often the reader thread looks at its stop flag while no packet arrives.
    pub poll_interval: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            group: 1,
            snap_len: DEFAULT_SNAP_LEN,
            flush_threshold: 1,
            flush_timeout: Duration::from_millis(100),
            batch_bytes: None,
            receive_buffer: 4 << 20,
            poll_interval: Duration::from_millis(200),
        }
    }
}

#[derive(Debug)]
pub enum Error {
    /// Another process (ulogd, another agent) holds the group.
    GroupBusy { group: u16 },
    /// Anything else the kernel or the socket said.
    Io {
        what: &'static str,
        source: io::Error,
    },
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::GroupBusy { group } => write!(
                f,
                "NFLOG group {group} is already bound by another process in this network namespace \
                 (ulogd or another agent?); choose another group"
            ),
            Error::Io { what, source } => write!(f, "{what}: {source}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::GroupBusy { .. } => None,
            Error::Io { source, .. } => Some(source),
        }
    }
}

fn io_err(what: &'static str) -> impl FnOnce(io::Error) -> Error {
    move |source| Error::Io { what, source }
}

/// One packet the kernel logged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogPacket {
    pub group: u16,
    /// Netfilter family of the hook that logged it (`NFPROTO_IPV4` 2, `NFPROTO_IPV6` 10).
    pub family: u8,
    /// The prefix of the rule that logged it (`--nflog-prefix`), lossily UTF-8.
    pub prefix: String,
    /// The start of the packet at its L3 header, at most the snap length.
    pub payload: Vec<u8>,
    /// The link-layer protocol (an ethertype: 0x0800, 0x86dd).
    pub hw_protocol: Option<u16>,
    /// The netfilter hook (0 prerouting, 1 input, 2 forward, 3 output, 4 postrouting).
    pub hook: Option<u8>,
    pub in_ifindex: Option<u32>,
    pub out_ifindex: Option<u32>,
    /// Bridge ports, when the packet crossed a bridge with br_netfilter.
    pub phys_in_ifindex: Option<u32>,
    pub phys_out_ifindex: Option<u32>,
    pub mark: Option<u32>,
    /// When the packet arrived; the kernel sends it for prerouting, input and forward hooks.
    pub timestamp: Option<SystemTime>,
    /// The source hardware address, when the input device has one.
    pub hw_addr: Option<Vec<u8>>,
    /// The per-group sequence number.
    pub seq: Option<u32>,
}

impl LogPacket {
    pub fn flow(&self) -> Result<Flow, DecodeError> {
        decode::decode_for_family(self.family, &self.payload)
    }

    /// The payload's source address, when it is long enough to have one.
    pub fn src(&self) -> Option<IpAddr> {
        self.flow().ok().map(|f| f.src)
    }
}

/// Counters shared with whoever exports metrics; updated by the reader, read from anywhere.
#[derive(Debug, Default)]
pub struct Counters {
    /// Packet messages read and decoded.
    pub received: AtomicU64,
    /// Messages the kernel sequenced but we never got (gaps in the per-group sequence).
    pub lost: AtomicU64,
    /// `ENOBUFS` reports: the socket's receive buffer overflowed at least once each time.
    pub overruns: AtomicU64,
    /// Messages that did not decode as NFLOG packets.
    pub undecodable: AtomicU64,
}

impl Counters {
    pub fn snapshot(&self) -> CountersSnapshot {
        CountersSnapshot {
            received: self.received.load(Ordering::Relaxed),
            lost: self.lost.load(Ordering::Relaxed),
            overruns: self.overruns.load(Ordering::Relaxed),
            undecodable: self.undecodable.load(Ordering::Relaxed),
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CountersSnapshot {
    pub received: u64,
    pub lost: u64,
    pub overruns: u64,
    pub undecodable: u64,
}

/// How many messages a sequence number says were skipped since the last one seen. A number
/// that goes backwards or jumps by more than half the space is a restart (the group was
/// re-bound), not a loss.
pub fn sequence_gap(last: Option<u32>, seq: u32) -> u64 {
    let Some(last) = last else { return 0 };
    let step = seq.wrapping_sub(last);
    if step == 0 || step > u32::MAX / 2 {
        0
    } else {
        u64::from(step - 1)
    }
}

/// A socket bound to one NFLOG group, in the network namespace of the thread that opened it.
/// Dropping it unbinds the group.
#[derive(Debug)]
pub struct NflogSocket {
    socket: NfnlSocket,
    group: u16,
    counters: Arc<Counters>,
    last_seq: Option<u32>,
    /// Whether this socket holds the group (and so unbinds it on drop).
    bound: bool,
}

impl NflogSocket {
    /// Binds `config.group` and configures it. Fails with [`Error::GroupBusy`] when another
    /// socket holds the group.
    pub fn open(config: &Config) -> Result<NflogSocket, Error> {
        let socket = NfnlSocket::open().map_err(io_err("opening a netfilter netlink socket"))?;
        // A refusal only lowers the buffer; overruns are counted either way.
        let _ = socket.set_receive_buffer(config.receive_buffer);
        let mut me = NflogSocket {
            socket,
            group: config.group,
            counters: Arc::new(Counters::default()),
            last_seq: None,
            bound: false,
        };
        let centis = u32::try_from(config.flush_timeout.as_millis() / 10).unwrap_or(u32::MAX);
        let mut nlas = vec![
            ConfigNla::Cmd(ConfigCmd::Bind),
            ConfigNla::Mode(ConfigMode::new_packet(config.snap_len.max(1))),
            ConfigNla::QThresh(config.flush_threshold.max(1)),
            ConfigNla::Timeout(Timeout::new(centis)),
            ConfigNla::Flags(ConfigFlags::SEQ),
        ];
        if let Some(bytes) = config.batch_bytes {
            // The kernel refuses sizes outside [one page, 128 KiB] (ERANGE) and, the bind
            // being in the same message, would refuse the bind with it: clamp here.
            nlas.push(ConfigNla::NlBufSiz(bytes.clamp(4096, MAX_BATCH_BYTES)));
        }
        let request = config_message(config.group, nlas);
        match me.socket.request(request, 0) {
            Ok(()) => {
                me.bound = true;
                Ok(me)
            }
            // EBUSY: bound by another socket; EPERM: the group's instance belongs to another
            // port. Either way it is not ours to unbind on drop.
            Err(e)
                if e.raw_os_error() == Some(libc::EBUSY)
                    || e.raw_os_error() == Some(libc::EPERM) =>
            {
                Err(Error::GroupBusy {
                    group: config.group,
                })
            }
            Err(e) => Err(Error::Io {
                what: "binding the NFLOG group",
                source: e,
            }),
        }
    }

    pub fn counters(&self) -> Arc<Counters> {
        self.counters.clone()
    }

    pub fn group(&self) -> u16 {
        self.group
    }

    /// Waits up to `timeout` for packets and hands each to `each`; returns how many. An
    /// overrun is counted and is not an error: the reader goes on with what comes next.
    pub fn read(
        &mut self,
        timeout: Duration,
        mut each: impl FnMut(LogPacket),
    ) -> Result<usize, Error> {
        if !self
            .socket
            .wait_readable(timeout)
            .map_err(io_err("waiting for NFLOG messages"))?
        {
            return Ok(0);
        }
        let datagram = match self.socket.recv_datagram() {
            Ok(d) => d,
            Err(e) if is_overrun(&e) => {
                self.counters.overruns.fetch_add(1, Ordering::Relaxed);
                return Ok(0);
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
                ) =>
            {
                return Ok(0)
            }
            Err(e) => {
                return Err(Error::Io {
                    what: "reading NFLOG messages",
                    source: e,
                })
            }
        };
        let messages = match datagram.messages() {
            Ok(messages) => messages,
            Err(e) => {
                // A datagram that cannot be framed is counted and dropped; the reader goes on.
                self.counters.undecodable.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(error = %e, "skipping an NFLOG datagram that does not frame");
                return Ok(0);
            }
        };
        let mut count = 0;
        for message in messages {
            let inner = match message.payload {
                Ok(NetlinkPayload::InnerMessage(inner)) => inner,
                // NLMSG_DONE closes a multi-message batch; acknowledgements of our own
                // requests may sit in the backlog.
                Ok(_) => continue,
                Err(e) => {
                    self.counters.undecodable.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(error = %e, "skipping an NFLOG message that does not decode");
                    continue;
                }
            };
            let Some(packet) = packet_of(inner) else {
                continue;
            };
            if packet.group != self.group {
                continue;
            }
            if let Some(seq) = packet.seq {
                let gap = sequence_gap(self.last_seq, seq);
                if gap > 0 {
                    self.counters.lost.fetch_add(gap, Ordering::Relaxed);
                }
                self.last_seq = Some(seq);
            }
            self.counters.received.fetch_add(1, Ordering::Relaxed);
            count += 1;
            each(packet);
        }
        Ok(count)
    }
}

impl Drop for NflogSocket {
    fn drop(&mut self) {
        if !self.bound {
            return;
        }
        let unbind = config_message(self.group, vec![ConfigNla::Cmd(ConfigCmd::Unbind)]);
        if let Err(e) = self.socket.request(unbind, 0) {
            // Closing the socket unbinds it all the same.
            tracing::debug!(error = %e, group = self.group, "unbinding the NFLOG group");
        }
    }
}

fn config_message(group: u16, nlas: Vec<ConfigNla>) -> NetfilterMessage {
    NetfilterMessage::new(
        NetfilterHeader::new(
            NetfilterProtoFamily::Unspec,
            libc::NFNETLINK_V0 as u8,
            group,
        ),
        ULogMessage::Config(nlas),
    )
}

/// The packet a message carries; `None` for other NFLOG messages.
fn packet_of(message: NetfilterMessage) -> Option<LogPacket> {
    let group = message.header.res_id;
    let family = u8::from(message.header.family);
    let NetfilterMessageInner::ULog(ULogMessage::Packet(nlas)) = message.inner else {
        return None;
    };
    let mut p = LogPacket {
        group,
        family,
        prefix: String::new(),
        payload: Vec::new(),
        hw_protocol: None,
        hook: None,
        in_ifindex: None,
        out_ifindex: None,
        phys_in_ifindex: None,
        phys_out_ifindex: None,
        mark: None,
        timestamp: None,
        hw_addr: None,
        seq: None,
    };
    for nla in nlas {
        match nla {
            PacketNla::PacketHdr(hdr) => {
                // struct nfulnl_msg_packet_hdr: be16 hw_protocol, u8 hook, u8 pad.
                let mut b = [0u8; 4];
                if hdr.value_len() == b.len() {
                    hdr.emit_value(&mut b);
                    p.hw_protocol = Some(u16::from_be_bytes([b[0], b[1]]));
                    p.hook = Some(b[2]);
                }
            }
            PacketNla::Prefix(prefix) => p.prefix = prefix_text(prefix),
            PacketNla::Payload(bytes) => p.payload = bytes,
            PacketNla::IfIndexInDev(i) => p.in_ifindex = Some(i),
            PacketNla::IfIndexOutDev(i) => p.out_ifindex = Some(i),
            PacketNla::IfIndexPhysInDev(i) => p.phys_in_ifindex = Some(i),
            PacketNla::IfIndexPhysOutDev(i) => p.phys_out_ifindex = Some(i),
            PacketNla::Mark(m) => p.mark = Some(m),
            PacketNla::Seq(s) => p.seq = Some(s),
            PacketNla::Timestamp(ts) => {
                // struct nfulnl_msg_packet_timestamp: be64 seconds, be64 microseconds.
                let mut b = [0u8; 16];
                if ts.value_len() == b.len() {
                    ts.emit_value(&mut b);
                    let secs = u64::from_be_bytes(b[..8].try_into().unwrap_or_default());
                    let usecs = u64::from_be_bytes(b[8..].try_into().unwrap_or_default());
                    p.timestamp = UNIX_EPOCH
                        .checked_add(Duration::from_secs(secs))
                        .and_then(|t| t.checked_add(Duration::from_micros(usecs)));
                }
            }
            PacketNla::HwAddr(hw) => {
                // struct nfulnl_msg_packet_hw: be16 length, u16 pad, u8[8] address.
                let mut b = vec![0u8; hw.value_len()];
                hw.emit_value(&mut b);
                if b.len() >= 4 {
                    let len = usize::from(u16::from_be_bytes([b[0], b[1]])).min(b.len() - 4);
                    p.hw_addr = Some(b[4..4 + len].to_vec());
                }
            }
            _ => {}
        }
    }
    Some(p)
}

fn prefix_text(prefix: CString) -> String {
    String::from_utf8_lossy(prefix.as_bytes()).into_owned()
}

/// What a reader thread hands packets to.
pub trait PacketSink {
    fn packet(&mut self, packet: LogPacket);
    /// A wait for packets ended (packets came or the poll interval passed).
    fn tick(&mut self) {}
}

/// A closure as a sink that needs no ticks.
struct FnSink<F>(F);

impl<F: FnMut(LogPacket)> PacketSink for FnSink<F> {
    fn packet(&mut self, packet: LogPacket) {
        (self.0)(packet)
    }
}

/// A reader thread: reads the group until stopped, handing every packet to a sink.
#[derive(Debug)]
pub struct Reader {
    stop: Arc<AtomicBool>,
    counters: Arc<Counters>,
    thread: Option<JoinHandle<Result<(), Error>>>,
    failure: Arc<Mutex<Option<String>>>,
}

impl Reader {
    /// Binds the group on the calling thread (so in its network namespace) and starts the
    /// thread. Errors binding the group are returned here, not from the thread.
    pub fn spawn(
        config: Config,
        sink: impl FnMut(LogPacket) + Send + 'static,
    ) -> Result<Reader, Error> {
        Reader::spawn_sink(config, FnSink(sink))
    }

    /// [`Reader::spawn`] with a sink that is also told each time a wait ends (at least every
    /// `poll_interval`), for work that must happen even when no packet comes (lines held back
    /// for a while).
    pub fn spawn_sink(
        config: Config,
        mut sink: impl PacketSink + Send + 'static,
    ) -> Result<Reader, Error> {
        let mut socket = NflogSocket::open(&config)?;
        let counters = socket.counters();
        let stop = Arc::new(AtomicBool::new(false));
        let failure = Arc::new(Mutex::new(None));
        let thread = {
            let stop = stop.clone();
            let failure = failure.clone();
            std::thread::Builder::new()
                .name(format!("nflog-{}", config.group))
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        if let Err(e) = socket.read(config.poll_interval, |p| sink.packet(p)) {
                            if let Ok(mut f) = failure.lock() {
                                *f = Some(e.to_string());
                            }
                            return Err(e);
                        }
                        sink.tick();
                    }
                    Ok(())
                })
                .map_err(io_err("starting the NFLOG reader thread"))?
        };
        Ok(Reader {
            stop,
            counters,
            thread: Some(thread),
            failure,
        })
    }

    pub fn counters(&self) -> Arc<Counters> {
        self.counters.clone()
    }

    /// The error the thread stopped on, if it did.
    pub fn failure(&self) -> Option<String> {
        self.failure.lock().ok().and_then(|f| f.clone())
    }

    /// Stops the thread (within one poll interval) and unbinds the group.
    pub fn stop(mut self) -> Result<(), Error> {
        self.stop_and_join()
    }

    fn stop_and_join(&mut self) -> Result<(), Error> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.take() {
            Some(t) => t.join().unwrap_or_else(|_| {
                Err(Error::Io {
                    what: "the NFLOG reader thread",
                    source: io::Error::other("panicked"),
                })
            }),
            None => Ok(()),
        }
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        let _ = self.stop_and_join();
    }
}

#[cfg(test)]
mod tests {
    use netlink_packet_core::{NetlinkHeader, NetlinkMessage};
    use netlink_packet_netfilter::nflog::{PacketHdr, TimeStamp};

    use super::*;
    use crate::host::nfnetlink::split;

    #[test]
    fn sequence_gaps_count_lost_messages() {
        assert_eq!(sequence_gap(None, 7), 0);
        assert_eq!(sequence_gap(Some(7), 8), 0);
        assert_eq!(sequence_gap(Some(7), 10), 2);
        assert_eq!(sequence_gap(Some(u32::MAX), 1), 1, "wraps");
        assert_eq!(sequence_gap(Some(100), 3), 0, "a restart is not a loss");
        assert_eq!(sequence_gap(Some(5), 5), 0);
    }

    /// A packet message as the kernel builds it, through the crate's own encoder.
    fn kernel_message(family: u8, group: u16, nlas: Vec<PacketNla>) -> Vec<u8> {
        let mut header = NetlinkHeader::default();
        header.sequence_number = 0;
        let mut msg = NetlinkMessage::new(
            header,
            NetlinkPayload::from(NetfilterMessage::new(
                NetfilterHeader::new(family.into(), 0, group),
                ULogMessage::Packet(nlas),
            )),
        );
        msg.finalize();
        let mut buf = vec![0; msg.buffer_len()];
        msg.serialize(&mut buf);
        buf
    }

    #[test]
    fn packet_messages_decode_into_log_packets() {
        let mut payload = vec![
            0x45, 0, 0, 40, 0, 0, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ];
        payload.extend_from_slice(&[0x9c, 0x40, 0x1f, 0x90, 0, 0, 0, 0]);
        // Hardware protocol 0x0800, hook 2 (forward), then a timestamp of 1.5 s after the
        // epoch, encoded as the kernel lays them out.
        let hdr = PacketHdr::parse(&[0x08, 0x00, 2, 0]).unwrap();
        let mut ts_bytes = 1u64.to_be_bytes().to_vec();
        ts_bytes.extend_from_slice(&500_000u64.to_be_bytes());
        let ts = TimeStamp::parse(&ts_bytes).unwrap();
        let bytes = kernel_message(
            2,
            7,
            vec![
                PacketNla::PacketHdr(hdr),
                PacketNla::Prefix(CString::new("npa-pol-in-cali-tw-x").unwrap()),
                PacketNla::IfIndexInDev(3),
                PacketNla::IfIndexOutDev(4),
                PacketNla::Timestamp(ts),
                PacketNla::Seq(41),
                PacketNla::Payload(payload.clone()),
            ],
        );
        let messages = split(&bytes).unwrap();
        assert_eq!(messages.len(), 1);
        let Ok(NetlinkPayload::InnerMessage(inner)) = messages.into_iter().next().unwrap().payload
        else {
            panic!("not an inner message")
        };
        let p = packet_of(inner).unwrap();
        assert_eq!(p.group, 7);
        assert_eq!(p.family, 2);
        assert_eq!(p.prefix, "npa-pol-in-cali-tw-x");
        assert_eq!((p.hw_protocol, p.hook), (Some(0x0800), Some(2)));
        assert_eq!((p.in_ifindex, p.out_ifindex), (Some(3), Some(4)));
        assert_eq!(p.seq, Some(41));
        assert_eq!(p.timestamp, Some(UNIX_EPOCH + Duration::from_millis(1500)));
        let flow = p.flow().unwrap();
        assert_eq!(
            (flow.src_port(), flow.dst_port()),
            (Some(40000), Some(8080))
        );
        assert_eq!(flow.protocol, 6);
    }
}
