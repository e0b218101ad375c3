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

/// Copies a NULL or NUL-terminated C string; `None` for NULL.
///
/// # Safety
/// `s` must be NULL or NUL-terminated and valid for the call.
unsafe fn opt_string(s: *const std::ffi::c_char) -> Option<String> {
    (!s.is_null()).then(|| {
        // SAFETY: non-NULL, so NUL-terminated and valid by the contract.
        unsafe { std::ffi::CStr::from_ptr(s) }
            .to_string_lossy()
            .into_owned()
    })
}

/// Copies a NULL-terminated argv-style array (NULL: empty).
///
/// # Safety
/// `a` must be NULL or a NULL-terminated array of NUL-terminated strings valid for the call.
unsafe fn argv(a: *mut *mut std::ffi::c_char) -> Vec<String> {
    // SAFETY: the same shape as lookup's keys.
    unsafe { super::pubsub::keys_from_argv(a) }
}

/// The entries of an info array whose values are of [`Datum`]'s types, in order; others
/// (directives of types greedy does not read, such as `PMIX_PROC` or data arrays) are left
/// out.
///
/// # Safety
/// `info` must be NULL or point to `ninfo` valid `pmix_info_t`.
pub(crate) unsafe fn data_of(info: *const raw::pmix_info_t, ninfo: usize) -> Vec<(String, Datum)> {
    // SAFETY: forwarded contract.
    unsafe { super::pubsub::infos(info, ninfo) }
        .iter()
        .filter_map(|i| {
            // SAFETY: PMIx keys are NUL-terminated within their buffer; the value is valid.
            let key = unsafe { std::ffi::CStr::from_ptr(i.key.as_ptr()) };
            // SAFETY: as above.
            let value = unsafe { Datum::from_raw(&i.value) }.ok()?;
            Some((key.to_string_lossy().into_owned(), value))
        })
        .collect()
}

impl App {
    /// Copies one `pmix_app_t` (a negative `maxprocs` counts as 0).
    ///
    /// # Safety
    /// `a` must be a valid `pmix_app_t` whose pointers are NULL or valid for the call.
    pub(crate) unsafe fn from_raw(a: &raw::pmix_app_t) -> App {
        // SAFETY: forwarded contract, field by field.
        let (cmd, argv, env, cwd, info) = unsafe {
            (
                opt_string(a.cmd).unwrap_or_default(),
                argv(a.argv),
                argv(a.env),
                opt_string(a.cwd),
                data_of(a.info, a.ninfo),
            )
        };
        let env = env
            .into_iter()
            .map(|kv| match kv.split_once('=') {
                Some((k, v)) => (k.to_string(), v.to_string()),
                None => (kv, String::new()),
            })
            .collect();
        App {
            cmd,
            argv,
            env,
            cwd: cwd.filter(|c| !c.is_empty()),
            maxprocs: u32::try_from(a.maxprocs).unwrap_or(0),
            info,
        }
    }

    /// Copies `napps` apps (NULL: none).
    ///
    /// # Safety
    /// `apps` must be NULL or point to `napps` valid `pmix_app_t`.
    pub(crate) unsafe fn all_from_raw(apps: *const raw::pmix_app_t, napps: usize) -> Vec<App> {
        if apps.is_null() || napps == 0 {
            return Vec::new();
        }
        // SAFETY: non-NULL with `napps` entries by the contract; each valid.
        unsafe { std::slice::from_raw_parts(apps, napps) }
            .iter()
            // SAFETY: each entry is a valid app by the contract.
            .map(|a| unsafe { App::from_raw(a) })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::{CStr, CString, c_char};

    use super::*;
    use crate::pmix::info::{InfoArray, Value};

    fn c_argv(items: &[&str]) -> (Vec<CString>, Vec<*mut c_char>) {
        let owned: Vec<CString> = items.iter().map(|s| CString::new(*s).unwrap()).collect();
        let mut ptrs: Vec<*mut c_char> = owned.iter().map(|c| c.as_ptr().cast_mut()).collect();
        ptrs.push(std::ptr::null_mut());
        (owned, ptrs)
    }

    #[test]
    fn an_app_is_copied_with_env_split_at_the_first_equals_and_typed_info() {
        let cmd = CString::new("/bin/prog").unwrap();
        let cwd = CString::new("/tmp/w").unwrap();
        let (_a, mut argv) = c_argv(&["/bin/prog", "-x", "a b"]);
        let (_e, mut env) = c_argv(&["OMPI_PARENT_PORT=p:1=2", "BARE"]);
        let mut info = InfoArray::new(&[
            (c"pmix.host", Value::Str("n1,n2".into())),
            (c"pmix.rank", Value::Rank(3)),
            (c"n", Value::U32(2)),
        ])
        .unwrap();
        let app = raw::pmix_app_t {
            cmd: cmd.as_ptr().cast_mut(),
            argv: argv.as_mut_ptr(),
            env: env.as_mut_ptr(),
            cwd: cwd.as_ptr().cast_mut(),
            maxprocs: 2,
            info: info.as_mut_ptr(),
            ninfo: info.len(),
        };
        // SAFETY: every pointer above is alive for the call.
        let got = unsafe { App::all_from_raw(&app, 1) };
        assert_eq!(
            got,
            vec![App {
                cmd: "/bin/prog".into(),
                argv: vec!["/bin/prog".into(), "-x".into(), "a b".into()],
                env: vec![
                    ("OMPI_PARENT_PORT".into(), "p:1=2".into()),
                    ("BARE".into(), String::new())
                ],
                cwd: Some("/tmp/w".into()),
                maxprocs: 2,
                // The rank (PMIX_PROC_RANK) is no Datum type: left out.
                info: vec![
                    ("pmix.host".into(), Datum::Str("n1,n2".into())),
                    ("n".into(), Datum::U32(2)),
                ],
            }]
        );
        let empty = raw::pmix_app_t {
            maxprocs: -1,
            ..app
        };
        let bare = raw::pmix_app_t {
            cmd: std::ptr::null_mut(),
            argv: std::ptr::null_mut(),
            env: std::ptr::null_mut(),
            cwd: std::ptr::null_mut(),
            info: std::ptr::null_mut(),
            ninfo: 0,
            ..empty
        };
        // SAFETY: NULL pointers only.
        let got = unsafe { App::from_raw(&bare) };
        assert_eq!((got.cmd.as_str(), got.maxprocs, got.cwd), ("", 0, None));
        // SAFETY: NULL with no entries.
        assert!(unsafe { App::all_from_raw(std::ptr::null(), 3) }.is_empty());
    }

    type Seen = std::sync::Mutex<Vec<(i32, String)>>;

    /// Stands in for libpmix's spawn_cbfunc: copies the status and namespace.
    unsafe extern "C" fn seen_cb(status: raw::pmix_status_t, ns: *mut c_char, cbdata: *mut c_void) {
        // SAFETY: the test passes a `&Seen`, alive for the call; `ns` is NUL-terminated.
        let seen = unsafe { &*(cbdata as *const Seen) };
        // SAFETY: SpawnDone passes a NUL-terminated buffer.
        let ns = unsafe { CStr::from_ptr(ns) }.to_string_lossy().into_owned();
        seen.lock().unwrap().push((status, ns));
    }

    #[test]
    fn spawn_done_answers_once_and_errors_when_dropped() {
        let seen: Seen = Default::default();
        let done = |seen: &Seen| SpawnDone {
            cbfunc: Some(seen_cb),
            cbdata: (seen as *const Seen).cast_mut().cast(),
        };
        done(&seen).started("job.1");
        done(&seen).failed(Status::NOT_FOUND);
        drop(done(&seen));
        let long = "x".repeat(raw::PMIX_MAX_NSLEN as usize + 9);
        done(&seen).started(&long);
        let seen = seen.into_inner().unwrap();
        assert_eq!(seen[0], (Status::SUCCESS.0, "job.1".into()));
        assert_eq!(seen[1], (Status::NOT_FOUND.0, String::new()));
        assert_eq!(seen[2], (Status::ERROR.0, String::new()));
        assert_eq!(seen[3].1.len(), raw::PMIX_MAX_NSLEN as usize);
    }
}
