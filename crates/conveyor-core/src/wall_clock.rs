//! The wall clock the runtimes read: `SystemTime::now`, unless the current thread set another.
//!
//! A simulation runs the real runtimes on tokio's paused clock, where the system's wall clock does not
//! follow tokio time: every wall-clock time a runtime computes (a claim's lease end, a record's expiry,
//! the time a batch arrived) would carry real, unrepeatable time, and a seed would not replay exactly.
//! [`set_for_thread`] gives the current thread a clock of its own (the simulator's: a virtual epoch
//! plus tokio's elapsed time) for as long as its guard lives; every runtime's wall-clock read goes
//! through [`now`]. Production never sets one: [`now`] is then `SystemTime::now`.

use std::cell::RefCell;
use std::time::SystemTime;

use crate::delay::Clock;

thread_local! {
    static THREAD_CLOCK: RefCell<Option<Clock>> = const { RefCell::new(None) };
}

/// The wall clock now: the current thread's clock ([`set_for_thread`]), or the system's.
pub fn now() -> SystemTime {
    THREAD_CLOCK
        .with(|clock| clock.borrow().clone())
        .map_or_else(SystemTime::now, |clock| clock())
}

/// Makes `clock` the current thread's wall clock until the guard drops (the previous one back then).
/// For simulations on a current-thread runtime: tasks on other threads keep the system clock.
#[must_use = "the clock is the thread's only while the guard lives"]
pub fn set_for_thread(clock: Clock) -> ThreadClockGuard {
    let previous = THREAD_CLOCK.with(|current| current.replace(Some(clock)));
    ThreadClockGuard { previous }
}

/// Restores the thread's previous wall clock when dropped ([`set_for_thread`]).
pub struct ThreadClockGuard {
    previous: Option<Clock>,
}

impl std::fmt::Debug for ThreadClockGuard {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("ThreadClockGuard")
            .field("restores_a_clock", &self.previous.is_some())
            .finish()
    }
}

impl Drop for ThreadClockGuard {
    fn drop(&mut self) {
        let previous = self.previous.take();
        THREAD_CLOCK.with(|current| *current.borrow_mut() = previous);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    #[test]
    fn a_thread_clock_is_read_until_its_guard_drops() {
        let fixed = UNIX_EPOCH + Duration::from_secs(4_102_444_800);
        {
            let _guard = set_for_thread(Arc::new(move || fixed));
            assert_eq!(now(), fixed);
            let other = std::thread::spawn(now).join().unwrap_or(fixed);
            assert_ne!(other, fixed, "another thread keeps the system clock");
        }
        assert!(now() < fixed, "the system clock is back after the guard");
    }
}
