//! Whether an interface of a given name exists in the node's network namespace: one
//! `SIOCGIFINDEX` ioctl on a socket kept open for the purpose.
//!
//! Why not libc's `if_nametoindex`: it opens and closes a socket for every name it is asked,
//! three syscalls and a socket allocation each time. The agent asks for every local pod
//! without an interface every 30 s (`agent::unnamed`); at 1500 such pods that was 11 % of an
//! idle agent's CPU (issue 40's profile). With the socket kept it is one syscall per name.
//! The answer is the kernel's at the moment of the call, in the namespace the probe was
//! opened in.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use nix::libc;
use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};

/// A kept socket that answers "is there an interface named so?".
#[derive(Debug)]
pub struct IfaceProbe {
    socket: OwnedFd,
}

impl IfaceProbe {
    /// Opens the probe's socket (a Unix datagram socket: every kernel has the family, and the
    /// ioctl asks the namespace, not the socket's protocol, as glibc's own lookup does).
    pub fn open() -> io::Result<IfaceProbe> {
        let socket = socket(
            AddressFamily::Unix,
            SockType::Datagram,
            SockFlag::SOCK_CLOEXEC,
            None,
        )?;
        Ok(IfaceProbe { socket })
    }

    /// Whether an interface named `name` exists now. A name no interface can have (empty,
    /// too long, with a NUL) is simply absent.
    pub fn exists(&self, name: &str) -> bool {
        let bytes = name.as_bytes();
        if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ || bytes.contains(&0) {
            return false;
        }
        // SAFETY: `ifreq` is plain data, valid all zero.
        let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
        for (slot, byte) in request.ifr_name.iter_mut().zip(bytes) {
            *slot = *byte as libc::c_char;
        }
        // SAFETY: SIOCGIFINDEX reads the NUL-terminated name (the rest of `ifr_name` is
        // zero) and writes the index into the request, which lives across the call.
        let rc = unsafe { libc::ioctl(self.socket.as_raw_fd(), libc::SIOCGIFINDEX, &mut request) };
        rc == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_exists_and_impossible_names_do_not() {
        let probe = IfaceProbe::open().unwrap();
        assert!(probe.exists("lo"));
        assert!(!probe.exists("npa-no-such0"));
        assert!(!probe.exists(""));
        assert!(!probe.exists("a-name-longer-than-ifnamsiz"));
        assert!(!probe.exists("lo\0x"));
        // The same answers as libc's lookup, which opens a socket per name.
        for name in ["lo", "npa-no-such0"] {
            assert_eq!(
                probe.exists(name),
                nix::net::if_::if_nametoindex(name).is_ok()
            );
        }
    }
}
