//! Typed arguments and completion of the `spawn` upcall (`PMIx_Spawn`, what Open MPI's `MPI_Comm_spawn` sends).
//!
//! What libpmix hands the host (openpmix v4.2, `pmix_server.h` `pmix_server_spawn_fn_t`): the
//! requesting process, the job-level info array (`PMIX_MAPBY`, `PMIX_TIMEOUT`, …) and one
//! `pmix_app_t` per program (`cmd`, `argv` with argv\[0\], `env` as `K=V` strings, `cwd`,
//! `maxprocs`, per-app info such as `PMIX_HOST`, `PMIX_WDIR`); the host answers once, through
//! `pmix_spawn_cbfunc_t`, after every process of the new namespace started, with that
//! namespace ([`SpawnDone`]).

use std::ffi::c_void;

use super::Status;
use super::pubsub::Datum;
use crate::raw::pmix as raw;

/// One program of a `PMIx_Spawn`, copied out of its `pmix_app_t`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct App {
    /// The program (`cmd`).
    pub cmd: String,
    /// Its arguments, argv\[0\] included (Open MPI puts the program first).
    pub argv: Vec<String>,
    /// Variables for its processes (`env`, `K=V` split at the first `=`).
    pub env: Vec<(String, String)>,
    /// Its working directory (`cwd`), if given.
    pub cwd: Option<String>,
    /// How many processes (`maxprocs`).
    pub maxprocs: u32,
    /// Its info entries whose values are one of [`Datum`]'s types, in order.
    pub info: Vec<(String, Datum)>,
}

/// Completes a spawn (`pmix_spawn_cbfunc_t`) exactly once: dropped unanswered, it reports
/// `PMIX_ERROR`, so the requester never waits for ever.
pub struct SpawnDone {
    pub(crate) cbfunc: raw::pmix_spawn_cbfunc_t,
    pub(crate) cbdata: *mut c_void,
}

// SAFETY: as `OpDone`: libpmix thread-shifts the spawn callback onto its progress thread and
// nothing else on our side refers to `cbdata`.
unsafe impl Send for SpawnDone {}

impl std::fmt::Debug for SpawnDone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SpawnDone")
    }
}

impl SpawnDone {
    /// Every process of namespace `nspace` started.
    pub fn started(mut self, nspace: &str) {
        self.fire(Status::SUCCESS, nspace);
    }

    /// The spawn failed with `status` (nothing of it runs).
    pub fn failed(mut self, status: Status) {
        self.fire(status, "");
    }

    fn fire(&mut self, status: Status, nspace: &str) {
        let Some(f) = self.cbfunc.take() else { return };
        // A namespace is at most PMIX_MAX_NSLEN bytes; the callback copies it.
        let mut name = [0 as std::ffi::c_char; raw::PMIX_MAX_NSLEN as usize + 1];
        for (dst, &b) in name
            .iter_mut()
            .zip(nspace.as_bytes().iter().take(raw::PMIX_MAX_NSLEN as usize))
        {
            *dst = b as std::ffi::c_char;
        }
        // SAFETY: `f` and `cbdata` came together from PMIx for this one spawn and are used once
        // (the Option is taken); `name` is NUL-terminated and outlives the call.
        unsafe { f(status.0, name.as_mut_ptr(), self.cbdata) };
    }
}

impl Drop for SpawnDone {
    fn drop(&mut self) {
        self.fire(Status::ERROR, "");
    }
}
