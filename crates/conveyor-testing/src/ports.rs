//! Ports for a process a test starts later: picked below the kernel's ephemeral range.
//!
//! A port from `bind(0)` comes from the ephemeral range (32768–60999 on Linux), the same range every
//! outgoing connection on the machine takes its source port from. Released and bound again seconds
//! later (a worker's operations endpoint, chromedriver, an emulator), it can be taken in between by
//! any of the connections the other test binaries running at the same time open: the process under
//! test then fails to listen. A port below the range is never handed out that way; only another test
//! picking the same one in the same seconds could collide, and the picks are random.

use std::net::{Ipv4Addr, TcpListener};

use anyhow::Context as _;

/// The ports picked from: registered ports below Linux's default ephemeral range.
const PICKED_FROM: std::ops::Range<u16> = 20_000..32_768;

/// A port nothing listens on now on any interface, below the ephemeral range.
pub fn free_port() -> anyhow::Result<u16> {
    for _ in 0..200 {
        let port = fastrand::u16(PICKED_FROM);
        if TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)).is_ok() {
            return Ok(port);
        }
    }
    // Everything tried is taken: fall back to the kernel's pick.
    let listener = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0)).context("no free port")?;
    Ok(listener.local_addr()?.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_port_is_below_the_ephemeral_range_and_can_be_bound() {
        let port = free_port().unwrap();
        assert!(PICKED_FROM.contains(&port), "{port}");
        TcpListener::bind(("127.0.0.1", port)).unwrap();
    }
}
