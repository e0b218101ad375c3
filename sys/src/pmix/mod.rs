//! Safe wrappers over the OpenPMIx server API: statuses, process names, owned info arrays, the server.
//!
//! - [`Status`]: a `pmix_status_t` with its PMIx name; [`check`] turns return codes into `Result`.
//! - [`Proc`]: an owned `pmix_proc_t` (namespace, rank).
//! - [`info`]: [`info::InfoArray`], an owned `pmix_info_t[]` built from Rust values and
//!   destructed on drop; [`info::key`] holds the `PMIX_*` keys as `&CStr`.
//! - [`gate`]: the accept gate below libpmix's listener: a connection reaches libpmix only if
//!   the embedder's policy admits it ([`gate::install`], done by [`server::Server::init`]).
//! - [`server`]: [`server::Server`] (init once per process, finalize off-thread), the
//!   [`server::Handler`] trait that the module callbacks forward to, and the completion objects
//!   that call PMIx's callback exactly once and keep returned data alive until PMIx releases it.
//!
//! - [`topology`]: the node's hwloc topology without I/O devices, which the server is given so
//!   that it does not discover one with them.
//!
//! Policy (what to register, how fences travel) belongs to the caller (greedy-pmix).

use std::ffi::{CStr, c_char};
use std::fmt;

use crate::raw::pmix as raw;

pub mod gate;
pub mod group;
pub mod info;
pub mod library;
pub mod pubsub;
pub mod server;
pub mod spawn;
pub mod topology;

/// A PMIx status code (`pmix_status_t`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Status(pub i32);

impl Status {
    /// `PMIX_SUCCESS`.
    pub const SUCCESS: Status = Status(raw::PMIX_SUCCESS as i32);
    /// `PMIX_ERROR`: a generic failure.
    pub const ERROR: Status = Status(raw::PMIX_ERROR);
    /// `PMIX_ERR_NOT_SUPPORTED`: the host does not offer this operation.
    pub const NOT_SUPPORTED: Status = Status(raw::PMIX_ERR_NOT_SUPPORTED);
    /// `PMIX_ERR_TIMEOUT`.
    pub const TIMEOUT: Status = Status(raw::PMIX_ERR_TIMEOUT);
    /// `PMIX_ERR_NOT_FOUND`.
    pub const NOT_FOUND: Status = Status(raw::PMIX_ERR_NOT_FOUND);
    /// `PMIX_ERR_OUT_OF_RESOURCE`: a bounded queue was full.
    pub const OUT_OF_RESOURCE: Status = Status(raw::PMIX_ERR_OUT_OF_RESOURCE);
    /// `PMIX_ERR_BAD_PARAM`.
    pub const BAD_PARAM: Status = Status(raw::PMIX_ERR_BAD_PARAM);
    /// `PMIX_EXISTS`: a key published already.
    pub const EXISTS: Status = Status(raw::PMIX_EXISTS);
    /// `PMIX_ERR_NO_PERMISSIONS`: not the caller's to change.
    pub const NO_PERMISSIONS: Status = Status(raw::PMIX_ERR_NO_PERMISSIONS);
    /// `PMIX_OPERATION_SUCCEEDED`: done at once, no callback will follow.
    pub const OPERATION_SUCCEEDED: Status = Status(raw::PMIX_OPERATION_SUCCEEDED);

    /// True for `PMIX_SUCCESS`.
    pub fn is_success(self) -> bool {
        self == Status::SUCCESS
    }

    /// PMIx's own name for the code (`PMIx_Error_string`).
    pub fn name(self) -> String {
        let Ok(pmix) = library::pmix() else {
            return format!("PMIx status {}", self.0);
        };
        // SAFETY: PMIx_Error_string accepts any code and returns a pointer to a static string
        // (pmix_error.c: a table of literals, "UNKNOWN STATUS" otherwise), never NULL.
        let s = unsafe { pmix.PMIx_Error_string(self.0) };
        if s.is_null() {
            return format!("PMIx status {}", self.0);
        }
        // SAFETY: non-NULL and NUL-terminated, static (see above).
        unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
    }
}

impl fmt::Debug for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

impl std::error::Error for Status {}

/// The one place return codes become results: `PMIX_SUCCESS` is `Ok`, anything else `Err`.
pub fn check(rc: raw::pmix_status_t) -> Result<(), Status> {
    if rc == raw::PMIX_SUCCESS as i32 {
        Ok(())
    } else {
        Err(Status(rc))
    }
}

/// `PMIX_RANK_WILDCARD`: every rank of a namespace.
pub const RANK_WILDCARD: u32 = raw::PMIX_RANK_WILDCARD;

/// Longest namespace PMIx stores (`PMIX_MAX_NSLEN`).
pub const MAX_NSLEN: usize = raw::PMIX_MAX_NSLEN as usize;

/// A process name: namespace and rank.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Proc {
    /// The namespace (the job), at most [`MAX_NSLEN`] bytes, no NUL.
    pub nspace: String,
    /// The rank, or [`RANK_WILDCARD`].
    pub rank: u32,
}

impl fmt::Debug for Proc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.rank == RANK_WILDCARD {
            write!(f, "{}:*", self.nspace)
        } else {
            write!(f, "{}:{}", self.nspace, self.rank)
        }
    }
}

impl Proc {
    /// The C form; `None` if the namespace is too long or holds a NUL.
    pub fn to_raw(&self) -> Option<raw::pmix_proc_t> {
        let mut p = raw::pmix_proc_t {
            rank: self.rank,
            ..Default::default()
        };
        let bytes = self.nspace.as_bytes();
        if bytes.len() > MAX_NSLEN || bytes.contains(&0) {
            return None;
        }
        for (dst, &b) in p.nspace.iter_mut().zip(bytes) {
            *dst = b as c_char;
        }
        Some(p)
    }

    /// Copies a C process name (the namespace up to its NUL or [`MAX_NSLEN`]).
    pub fn from_raw(p: &raw::pmix_proc_t) -> Proc {
        let len = p
            .nspace
            .iter()
            .position(|&c| c == 0)
            .unwrap_or(p.nspace.len());
        let bytes: Vec<u8> = p.nspace[..len].iter().map(|&c| c as u8).collect();
        Proc {
            nspace: String::from_utf8_lossy(&bytes).into_owned(),
            rank: p.rank,
        }
    }
}

/// Copies a malloc'd C string PMIx handed over and frees it.
///
/// # Safety
/// `s` must be NULL or a NUL-terminated string allocated with `malloc` that the caller owns.
pub(crate) unsafe fn take_c_string(s: *mut c_char) -> Option<String> {
    if s.is_null() {
        return None;
    }
    // SAFETY: non-NULL and NUL-terminated by the caller's contract.
    let out = unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned();
    // SAFETY: malloc'd and owned by the caller, not used after this.
    unsafe { libc::free(s.cast()) };
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_names_and_procs() {
        assert_eq!(Status::SUCCESS.to_string(), "SUCCESS (0)");
        assert_eq!(Status::NOT_SUPPORTED.to_string(), "NOT-SUPPORTED (-47)");
        assert_eq!(check(0), Ok(()));
        let p = Proc {
            nspace: "job.0".into(),
            rank: 3,
        };
        let raw = p.to_raw().unwrap();
        assert_eq!(Proc::from_raw(&raw), p);
        assert_eq!(format!("{p:?}"), "job.0:3");
        let long = Proc {
            nspace: "x".repeat(MAX_NSLEN + 1),
            rank: 0,
        };
        assert!(long.to_raw().is_none());
    }
}
