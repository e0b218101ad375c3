//! libpmix and libhwloc, opened on first use instead of linked: a process maps them (and
//! libpmix's libevent, libmunge and libudev) only once it serves PMIx or binds ranks, so srun,
//! slurmd, slurmctld and a greedyd serving PMI-1 alone pay no dynamic loading for them.
//!
//! Both are opened `RTLD_NOW | RTLD_GLOBAL`, as linking them would: every symbol is bound at
//! once (a missing one fails the load, naming it, not a later call) and libpmix's own plugins
//! see its symbols. Neither is ever closed: libpmix keeps threads and pointers into itself
//! until the process ends.

use std::fmt;
use std::sync::OnceLock;

use crate::raw::pmix::{self as raw_pmix, hwloc as raw_hwloc};

/// Why a library could not be opened: its path and the loader's words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadError {
    /// The path opened.
    pub library: &'static str,
    /// What `dlopen` (or the first missing symbol) said.
    pub reason: String,
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot load {}: {}", self.library, self.reason)
    }
}

impl std::error::Error for LoadError {}

/// libpmix's functions, opened on the first call.
pub fn pmix() -> Result<&'static raw_pmix::Pmix, LoadError> {
    static PMIX: OnceLock<Result<raw_pmix::Pmix, LoadError>> = OnceLock::new();
    PMIX.get_or_init(|| {
        // SAFETY: libpmix's initialisers only set up its own globals; the struct checks that
        // every symbol exists with the type its header declares (bindgen, from that header).
        open(raw_pmix::LIBRARY, |l| unsafe {
            raw_pmix::Pmix::from_library(l)
        })
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// libhwloc's functions, opened on the first call.
pub fn hwloc() -> Result<&'static raw_hwloc::Hwloc, LoadError> {
    static HWLOC: OnceLock<Result<raw_hwloc::Hwloc, LoadError>> = OnceLock::new();
    HWLOC
        .get_or_init(|| {
            // SAFETY: as for libpmix: initialisers touch hwloc's own globals only.
            open(raw_hwloc::LIBRARY, |l| unsafe {
                raw_hwloc::Hwloc::from_library(l)
            })
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// libpmix's functions where libpmix was necessarily opened before: in what libpmix called or
/// handed us (callbacks, completions, its values), or a [`super::server::Server`]'s methods.
pub(crate) fn pmix_loaded() -> &'static raw_pmix::Pmix {
    pmix().expect("libpmix is open wherever libpmix calls us or a Server exists")
}

/// libhwloc's functions where hwloc was necessarily opened before: a
/// [`super::topology::Topology`]'s methods (only an opened hwloc made one).
pub(crate) fn hwloc_loaded() -> &'static raw_hwloc::Hwloc {
    hwloc().expect("a Topology exists only once hwloc opened")
}

fn open<T>(
    path: &'static str,
    bind: impl FnOnce(libloading::Library) -> Result<T, libloading::Error>,
) -> Result<T, LoadError> {
    use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
    let failed = |e: libloading::Error| LoadError {
        library: path,
        reason: e.to_string(),
    };
    // SAFETY: opening runs the library's initialisers, which is what linking it would do.
    let library = unsafe { Library::open(Some(path), RTLD_NOW | RTLD_GLOBAL) }.map_err(failed)?;
    bind(library.into()).map_err(failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_libraries_open_and_stay_open() {
        let pmix = pmix().expect("libpmix opens");
        assert!(std::ptr::eq(pmix, pmix_loaded()));
        let hwloc = hwloc().expect("libhwloc opens");
        assert!(std::ptr::eq(hwloc, hwloc_loaded()));
    }

    #[test]
    fn a_missing_library_is_named() {
        let e = open("/nonexistent/libpmix.so.2", Ok).unwrap_err();
        assert_eq!(e.library, "/nonexistent/libpmix.so.2");
        assert!(
            e.to_string()
                .starts_with("cannot load /nonexistent/libpmix.so.2: "),
            "{e}"
        );
    }
}
