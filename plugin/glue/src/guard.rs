//! Panic-catching for `extern "C"` entry points: a panic must never unwind into Slurm
//! (undefined behaviour, and it would take down slurmd or slurmctld).
//!
//! Each entry point runs its body inside [`catch`]. A panic is caught, its message reported
//! through the plugin's logger exactly once (the default panic hook is silenced for the plugin,
//! because it writes to the daemon's stderr, which is usually /dev/null), and the entry point
//! returns the fallback the caller chose.

use std::any::Any;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Once;

/// Runs `body`; if it panics, calls `report` once with `"<entry>: panic: <message>"` and
/// returns `fallback`.
///
/// `body` is wrapped in [`AssertUnwindSafe`]: a caught panic leaves at most a half-built value
/// behind, which the entry points drop, and shared state is only behind locks whose poisoning
/// the readers handle.
pub fn catch<T>(
    entry: &str,
    fallback: T,
    report: impl FnOnce(&str),
    body: impl FnOnce() -> T,
) -> T {
    quiet_panic_hook();
    match panic::catch_unwind(AssertUnwindSafe(body)) {
        Ok(value) => value,
        Err(payload) => {
            report(&format!(
                "{entry}: panic: {}",
                panic_message(payload.as_ref())
            ));
            fallback
        }
    }
}

/// The text of a panic payload (`panic!` with a literal or a formatted message).
pub fn panic_message(payload: &(dyn Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "(no message)"
    }
}

/// Silences the default hook once: it would print a second, differently formatted report to
/// the daemon's stderr, which is usually /dev/null. A cdylib carries its own copy of std, so
/// this hook sees only the panics of the plugin that installed it, never the host process's or
/// another plugin's.
fn quiet_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| panic::set_hook(Box::new(|_| {})));
}
#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    #[test]
    fn returns_the_body_value_without_reporting() {
        let reports = RefCell::new(Vec::new());
        let v = catch("e", 0, |m| reports.borrow_mut().push(m.to_string()), || 7);
        assert_eq!(v, 7);
        assert!(reports.borrow().is_empty());
    }

    #[test]
    fn a_panic_becomes_the_fallback_and_one_report() {
        let reports = RefCell::new(Vec::new());
        let v = catch(
            "route_p_split_hostlist",
            -1,
            |m| reports.borrow_mut().push(m.to_string()),
            || -> i32 { panic!("index {} out of range", 3) },
        );
        assert_eq!(v, -1);
        assert_eq!(
            *reports.borrow(),
            ["route_p_split_hostlist: panic: index 3 out of range"]
        );
    }
}
