//! Waiting for a descriptor to become readable, shared by our netlink sockets (route,
//! netfilter requests and monitors): one `poll(2)` with a timeout, retried on `EINTR`.

use std::io;
use std::os::fd::BorrowedFd;
use std::time::Duration;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

/// Waits until `fd` has something to read; `false` when `timeout` passed first. A signal
/// arriving meanwhile restarts the wait with the whole timeout (our callers bound their
/// total wait with a deadline of their own).
pub fn readable(fd: BorrowedFd<'_>, timeout: Duration) -> io::Result<bool> {
    let millis = timeout.as_millis().min(i32::MAX as u128) as i32;
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    loop {
        match poll(
            &mut fds,
            PollTimeout::try_from(millis).unwrap_or(PollTimeout::MAX),
        ) {
            Ok(n) => return Ok(n > 0),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn times_out_when_nothing_comes_and_answers_when_something_does() {
        let (mut a, b) = UnixStream::pair().unwrap();
        assert!(!readable(b.as_fd(), Duration::from_millis(10)).unwrap());
        a.write_all(b"x").unwrap();
        assert!(readable(b.as_fd(), Duration::from_millis(10)).unwrap());
    }
}
