//! The PMIx server: init once per process, the module callbacks (forwarded to a [`Handler`]), and the host-side calls.
//!
//! PMIx runs its own progress thread and calls the module's `extern "C"` callbacks there
//! (research/pmix-pmi.md §1, Threading). The trampolines here copy every argument (PMIx owns
//! them only for the call), catch panics (reported once through
//! [`Handler::callback_panicked`]), and hand the handler a completion object:
//! - [`OpDone`] calls a `pmix_op_cbfunc_t` exactly once: with the status given to
//!   [`OpDone::complete`], or with `PMIX_ERROR` if dropped uncompleted;
//! - [`ModexDone`] calls a `pmix_modex_cbfunc_t` exactly once, handing PMIx a buffer that stays
//!   alive until PMIx calls the release function (PMIx does not copy it).
//!
//! Both may be completed from any thread, at any later time: PMIx thread-shifts these
//! callbacks onto its own thread (`modex_cbfunc`, `op_cbfunc` in pmix_server.c@v4.2.2). The
//! trampolines therefore always return `PMIX_SUCCESS`: the outcome, even a refusal, travels
//! through the callback.
//!
//! Host-side calls that take a callback ([`Server::register_nspace`],
//! [`Server::register_client`], [`Server::dmodex_request`], …) return at once; the closure runs
//! later on PMIx's thread and must not block. Their arguments (the info array) are kept alive
//! until then. Calls without callback block and must never be made from a callback.
//!
//! - [`LookupDone`] calls a `pmix_lookup_cbfunc_t` exactly once with typed results
//!   ([`super::pubsub`]: the publish/lookup/unpublish/connect/disconnect contracts).
//!
//! - [`GroupDone`] calls a `pmix_info_cbfunc_t` exactly once with a group's results
//!   ([`super::group`]: the group construct/destruct contract).
//!
//! Module entries left NULL (job control, …; groups on libpmix before 4.2.4, unless
//! [`ServerConfig::groups`] says [`Groups::Always`]) are answered
//! `PMIX_ERR_NOT_SUPPORTED` by the library itself; `tool_connected` refuses every tool. The
//! name-service, connect, group and spawn entries forward to [`Handler`] methods whose defaults answer
//! `PMIX_ERR_NOT_SUPPORTED`.
//!
//! Lifecycle: [`Server::init`] installs the accept gate ([`super::gate`]) before libpmix
//! starts listening, and fails if it cannot; finalize runs on a detached thread
//! ([`Server::finalize`], [`Server::finalize_within`], and drop), so no caller, `Drop`
//! included, can be held by a `PMIx_server_finalize` that never returns.

use std::any::Any;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock, mpsc};
use std::time::Duration;

use super::gate::{self, GateError, Policy};
use super::group::{GroupDone, GroupRequest, Groups};
use super::info::{InfoArray, Regex, Value, find_bool, find_string, key};
use super::library::{self, LoadError};
use super::pubsub::{self, Datum, Directives, LookupDone, Published};
use super::spawn::{App, SpawnDone};
use super::{Proc, Status, check, take_c_string};
use crate::raw::pmix as raw;

/// What the server's owner does when PMIx calls up. Every method runs on PMIx's progress
/// thread and must return quickly: hand the work elsewhere and complete later.
pub trait Handler: Send + Sync + 'static {
    /// A registered client connected (a notification: PMIx 4.2 passes no callback).
    fn client_connected(&self, proc_: Proc) {
        let _ = proc_;
    }
    /// A client called `PMIx_Finalize`; it stays blocked until `done` completes.
    fn client_finalized(&self, proc_: Proc, done: OpDone);
    /// A client's `PMIx_Log`; `stderr` is the message it asks to be printed on standard error
    /// (`PMIX_LOG_STDERR`), if any. By default declined ([`decline_log`]), so that the client
    /// prints it itself. Called with libpmix's lock held: complete `done` on another thread.
    fn log(&self, proc_: Proc, stderr: Option<String>, done: OpDone) {
        let _ = (proc_, stderr);
        decline_log(done);
    }
    /// A client called `PMIx_Abort(status, msg, targets)`; `targets` `None` means the whole
    /// namespace.
    fn abort(
        &self,
        proc_: Proc,
        status: i32,
        msg: String,
        targets: Option<Vec<Proc>>,
        done: OpDone,
    );
    /// Every local participant of a fence has entered it. `data` is this node's blob;
    /// `done` must receive the concatenation of every participating node's blob.
    fn fence(&self, procs: Vec<Proc>, collect: bool, data: Vec<u8>, done: ModexDone);
    /// A local client wants the data of a remote process: fetch its blob from its node
    /// (which calls [`Server::dmodex_request`]) and complete `done` with it. `required_key`
    /// is the key the client asked for (`PMIX_REQUIRED_KEY`): the blob is useless to it
    /// until the process has posted that key.
    fn direct_modex(&self, proc_: Proc, required_key: Option<String>, done: ModexDone);
    /// A client published `what.data` (`PMIx_Publish`). Default: not supported.
    fn publish(&self, proc_: Proc, what: Published, done: OpDone) {
        let _ = (proc_, what);
        done.complete(Status::NOT_SUPPORTED);
    }
    /// A client looks `keys` up (`PMIx_Lookup`); with `directives.wait`, answer once all are
    /// published (or the timeout passed). Default: not supported.
    fn lookup(&self, proc_: Proc, keys: Vec<String>, directives: Directives, done: LookupDone) {
        let _ = (proc_, keys, directives);
        done.complete(Status::NOT_SUPPORTED, Vec::new());
    }
    /// A client withdraws `keys` (`PMIx_Unpublish`). Default: not supported.
    fn unpublish(&self, proc_: Proc, keys: Vec<String>, directives: Directives, done: OpDone) {
        let _ = (proc_, keys, directives);
        done.complete(Status::NOT_SUPPORTED);
    }
    /// Every local participant of `PMIx_Connect(procs)` has called; complete `done` once
    /// every participant's node has (`timeout`: the client's `PMIX_TIMEOUT`). Default: not
    /// supported.
    fn connect(&self, procs: Vec<Proc>, timeout: Option<Duration>, done: OpDone) {
        let _ = (procs, timeout);
        done.complete(Status::NOT_SUPPORTED);
    }
    /// As [`Handler::connect`], for `PMIx_Disconnect`. Default: not supported.
    fn disconnect(&self, procs: Vec<Proc>, timeout: Option<Duration>, done: OpDone) {
        let _ = (procs, timeout);
        done.complete(Status::NOT_SUPPORTED);
    }
    /// Every local member of group `request.id` has called `PMIx_Group_construct` or
    /// `PMIx_Group_destruct`; complete `done` once every member's server has, with the
    /// results the directives ask for ([`super::group`]). Default: not supported.
    fn group(&self, request: GroupRequest, done: GroupDone) {
        let _ = request;
        done.failed(Status::NOT_SUPPORTED);
    }
    /// A client asked to start `apps` as a new namespace (`PMIx_Spawn`), with `job_info` the
    /// job-level directives; complete `done` once every process started, or with the
    /// failure. Default: not supported.
    fn spawn(
        &self,
        requester: Proc,
        job_info: Vec<(String, Datum)>,
        apps: Vec<App>,
        done: SpawnDone,
    ) {
        let _ = (requester, job_info, apps);
        done.failed(Status::NOT_SUPPORTED);
    }
    /// A callback (this handler's method or a host-call closure) panicked; `message` is the
    /// panic's text. Called once per panic, on PMIx's thread.
    fn callback_panicked(&self, callback: &'static str, message: String);
}

/// Completes a PMIx operation that reports only a status (`pmix_op_cbfunc_t`).
pub struct OpDone {
    cbfunc: raw::pmix_op_cbfunc_t,
    cbdata: *mut c_void,
}

// SAFETY: PMIx thread-shifts its op callbacks onto its progress thread (the cbdata is its own
// caddy object, touched only there), so calling them from any thread is allowed (research
// §1 Threading); nothing else refers to `cbdata` on our side.
unsafe impl Send for OpDone {}

impl std::fmt::Debug for OpDone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OpDone")
    }
}

impl OpDone {
    /// Reports `status` to PMIx.
    pub fn complete(mut self, status: Status) {
        self.fire(status);
    }

    fn fire(&mut self, status: Status) {
        if let Some(f) = self.cbfunc.take() {
            // SAFETY: `f` and `cbdata` came together from PMIx for this one operation and are
            // used once (the Option is taken).
            unsafe { f(status.0, self.cbdata) };
        }
    }
}

impl Drop for OpDone {
    fn drop(&mut self) {
        self.fire(Status::ERROR);
    }
}

/// Completes a fence or a direct modex (`pmix_modex_cbfunc_t`) with data.
pub struct ModexDone {
    cbfunc: raw::pmix_modex_cbfunc_t,
    cbdata: *mut c_void,
}

// SAFETY: as for OpDone: PMIx thread-shifts modex callbacks (`modex_cbfunc`,
// pmix_server.c@v4.2.2), so any thread may complete them.
unsafe impl Send for ModexDone {}

impl std::fmt::Debug for ModexDone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ModexDone")
    }
}

impl ModexDone {
    /// Hands `data` to PMIx with `status`; the buffer lives until PMIx releases it.
    pub fn complete(mut self, status: Status, data: Vec<u8>) {
        self.fire(status, data);
    }

    fn fire(&mut self, status: Status, data: Vec<u8>) {
        let Some(f) = self.cbfunc.take() else { return };
        if data.is_empty() {
            // SAFETY: `f`/`cbdata` are PMIx's pair for this operation, used once; no data, so
            // no release function.
            unsafe {
                f(
                    status.0,
                    std::ptr::null(),
                    0,
                    self.cbdata,
                    None,
                    std::ptr::null_mut(),
                )
            };
            return;
        }
        let boxed = Box::new(data);
        let (ptr, len) = (boxed.as_ptr(), boxed.len());
        let keep = Box::into_raw(boxed);
        // SAFETY: `ptr[..len]` stays valid until `release_vec(keep)` runs, which PMIx calls
        // once after processing (it does not copy the data: research §1 fence_nb contract).
        unsafe {
            f(
                status.0,
                ptr.cast(),
                len,
                self.cbdata,
                Some(release_vec),
                keep.cast(),
            )
        };
    }
}

impl Drop for ModexDone {
    fn drop(&mut self) {
        self.fire(Status::ERROR, Vec::new());
    }
}

/// Frees a buffer handed to PMIx by [`ModexDone::complete`].
///
/// # Safety
/// `cbdata` must be the `Box<Vec<u8>>` pointer made there, released once.
unsafe extern "C" fn release_vec(cbdata: *mut c_void) {
    // SAFETY: by the contract above, a Box<Vec<u8>> leaked by `fire`, freed exactly once.
    drop(unsafe { Box::from_raw(cbdata.cast::<Vec<u8>>()) });
}

/// The handler the trampolines forward to; set by [`Server::init`], cleared once finalize returns.
static HANDLER: RwLock<Option<Arc<dyn Handler>>> = RwLock::new(None);
/// PMIx supports one server per process, initialised once.
static INITIALIZED: AtomicBool = AtomicBool::new(false);

fn handler() -> Option<Arc<dyn Handler>> {
    HANDLER.read().unwrap_or_else(|p| p.into_inner()).clone()
}

fn panic_text(p: Box<dyn Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic with a non-string payload".into())
}

/// Runs `f` with the handler, catching a panic and reporting it once. Without a handler (the
/// server is finalizing) `f` is dropped, and with it any completion: PMIx gets an error.
fn forward(callback: &'static str, f: impl FnOnce(&dyn Handler)) {
    let Some(h) = handler() else { return };
    if let Err(p) = catch_unwind(AssertUnwindSafe(|| f(&*h))) {
        report_panic(&*h, callback, p);
    }
}

fn report_panic(h: &dyn Handler, callback: &'static str, p: Box<dyn Any + Send>) {
    let text = panic_text(p);
    // A panicking report must not unwind into C either.
    let _ = catch_unwind(AssertUnwindSafe(|| h.callback_panicked(callback, text)));
}

/// Copies `n` process names from a PMIx array.
///
/// # Safety
/// `procs` must be NULL or point to `n` valid `pmix_proc_t`.
unsafe fn procs_from_raw(procs: *const raw::pmix_proc_t, n: usize) -> Vec<Proc> {
    if procs.is_null() {
        return Vec::new();
    }
    // SAFETY: non-NULL with `n` valid entries by the contract.
    unsafe { std::slice::from_raw_parts(procs, n) }
        .iter()
        .map(Proc::from_raw)
        .collect()
}

/// The upcalls this host serves. `job_control` stays NULL on purpose: libpmix 5.0.2 to 6.1
/// runs the cleanup a client registers through `PMIx_Job_control` (`PMIX_REGISTER_CLEANUP`,
/// `..._DIR`) with the server's uid and without checking who owns the paths (openpmix
/// `pmix_execute_epilog` since `fbad401dd`), and in slurmstepd that uid is root; every release
/// refuses such a request before reading it while the host has no `job_control`.
fn host_module(serve_groups: bool) -> raw::pmix_server_module_t {
    raw::pmix_server_module_t {
        client_connected: Some(on_client_connected),
        client_finalized: Some(on_client_finalized),
        abort: Some(on_abort),
        fence_nb: Some(on_fence),
        direct_modex: Some(on_direct_modex),
        tool_connected: Some(on_tool_connected),
        publish: Some(on_publish),
        lookup: Some(on_lookup),
        unpublish: Some(on_unpublish),
        connect: Some(on_connect),
        disconnect: Some(on_disconnect),
        spawn: Some(on_spawn),
        group: if serve_groups { Some(on_group) } else { None },
        log: Some(on_log),
        ..Default::default()
    }
}

/// `log`: handed to the handler ([`Handler::log`]) with the message the client wants on its
/// standard error. Open MPI 5 sends every error message there (`PMIx_Log_nb`,
/// opal/util/show_help.c `local_delivery`@v5.0.8) and prints it itself only when the log fails;
/// with the entry NULL, libpmix 4.2 drops the message and answers success (its `stdfd`
/// channel writes only in gateway servers, plog_stdfd.c@v4.2.2 l.114). libpmix calls this
/// with the lock its completion takes held (plog_base_stubs.c `pmix_plog_base_log`), so the
/// answer must come from another thread.
unsafe extern "C" fn on_log(
    client: *const raw::pmix_proc_t,
    data: *const raw::pmix_info_t,
    ndata: usize,
    _directives: *const raw::pmix_info_t,
    _ndirs: usize,
    cbfunc: raw::pmix_op_cbfunc_t,
    cbdata: *mut c_void,
) {
    let mut done = Some(OpDone { cbfunc, cbdata });
    // SAFETY: PMIx passes a valid proc (or NULL) and `ndata` valid infos for the call.
    let p = (!client.is_null()).then(|| unsafe { procs_from_raw(client, 1) });
    // SAFETY: as above.
    let stderr = unsafe { find_string(data, ndata, key::LOG_STDERR) };
    if let Some(p) = p.and_then(|p| p.into_iter().next()) {
        forward("log", |h| {
            if let Some(done) = done.take() {
                h.log(p, stderr, done);
            }
        });
    }
    if let Some(done) = done {
        decline_log(done);
    }
}

/// Declines a client's log (`NOT_SUPPORTED`, the client then prints its message itself), on a
/// thread of its own: libpmix holds the lock the completion takes while it asks. Not
/// completed if no thread can start (answering here would deadlock).
pub fn decline_log(done: OpDone) {
    let done = std::mem::ManuallyDrop::new(done);
    let _ = std::thread::Builder::new()
        .name("greedy-pmix-log".into())
        .spawn(move || std::mem::ManuallyDrop::into_inner(done).complete(Status::NOT_SUPPORTED));
}

/// `client_connected`: a notification in PMIx 4.2 (cbfunc NULL).
unsafe extern "C" fn on_client_connected(
    proc_: *const raw::pmix_proc_t,
    _server_object: *mut c_void,
    cbfunc: raw::pmix_op_cbfunc_t,
    cbdata: *mut c_void,
) -> raw::pmix_status_t {
    let done = OpDone { cbfunc, cbdata };
    // SAFETY: PMIx passes a valid proc for the duration of the call.
    let p = unsafe { procs_from_raw(proc_, 1) };
    forward("client_connected", |h| {
        if let Some(p) = p.into_iter().next() {
            h.client_connected(p);
        }
    });
    done.complete(Status::SUCCESS);
    Status::SUCCESS.0
}

/// `tool_connected`: every tool is refused. With the entry NULL, libpmix 4.2 accepts a tool
/// that names itself (`process_tool_request`, ptl_base_connection_hdlr.c@v4.2.2 l.795–806:
/// "just process it locally"), attached to a registered rank if it claims one. Only
/// connections the accept gate admitted get this far; tool support (rendezvous files) stays
/// off ([`Server::init`]). Note: libpmix's refusal path (`process_cbfunc`'s `error:`) unlinks
/// the namespace the tool claimed, so a job process that poses as a tool can break its own
/// job; it cannot reach another.
///
/// # Safety
/// Called by PMIx with its callback and cbdata for this one request.
unsafe extern "C" fn on_tool_connected(
    _info: *mut raw::pmix_info_t,
    _ninfo: usize,
    cbfunc: raw::pmix_tool_connection_cbfunc_t,
    cbdata: *mut c_void,
) {
    let Some(cb) = cbfunc else { return };
    // `cnct_cbfunc` reads the proc's name before thread-shifting: hand it a valid empty one.
    let mut nobody = raw::pmix_proc_t::default();
    // SAFETY: PMIx's callback and cbdata for this request, called once; `cnct_cbfunc`
    // copies `nobody` and thread-shifts, so calling it from inside the upcall is allowed.
    unsafe { cb(Status::NOT_SUPPORTED.0, &mut nobody, cbdata) };
}

unsafe extern "C" fn on_client_finalized(
    proc_: *const raw::pmix_proc_t,
    _server_object: *mut c_void,
    cbfunc: raw::pmix_op_cbfunc_t,
    cbdata: *mut c_void,
) -> raw::pmix_status_t {
    let done = OpDone { cbfunc, cbdata };
    // SAFETY: PMIx passes a valid proc for the duration of the call.
    let p = unsafe { procs_from_raw(proc_, 1) };
    forward("client_finalized", move |h| match p.into_iter().next() {
        Some(p) => h.client_finalized(p, done),
        None => done.complete(Status::BAD_PARAM),
    });
    Status::SUCCESS.0
}

#[allow(clippy::too_many_arguments)] // the C signature
unsafe extern "C" fn on_abort(
    proc_: *const raw::pmix_proc_t,
    _server_object: *mut c_void,
    status: c_int,
    msg: *const c_char,
    procs: *mut raw::pmix_proc_t,
    nprocs: usize,
    cbfunc: raw::pmix_op_cbfunc_t,
    cbdata: *mut c_void,
) -> raw::pmix_status_t {
    let done = OpDone { cbfunc, cbdata };
    // SAFETY: PMIx passes a valid proc for the duration of the call.
    let p = unsafe { procs_from_raw(proc_, 1) };
    let msg = if msg.is_null() {
        String::new()
    } else {
        // SAFETY: non-NULL message strings from PMIx are NUL-terminated and live for the call.
        unsafe { CStr::from_ptr(msg) }
            .to_string_lossy()
            .into_owned()
    };
    // SAFETY: `procs` is NULL or holds `nprocs` entries, valid for the call.
    let targets = (!procs.is_null()).then(|| unsafe { procs_from_raw(procs, nprocs) });
    forward("abort", move |h| match p.into_iter().next() {
        Some(p) => h.abort(p, status, msg, targets, done),
        None => done.complete(Status::BAD_PARAM),
    });
    Status::SUCCESS.0
}

#[allow(clippy::too_many_arguments)] // the C signature
unsafe extern "C" fn on_fence(
    procs: *const raw::pmix_proc_t,
    nprocs: usize,
    info: *const raw::pmix_info_t,
    ninfo: usize,
    data: *mut c_char,
    ndata: usize,
    cbfunc: raw::pmix_modex_cbfunc_t,
    cbdata: *mut c_void,
) -> raw::pmix_status_t {
    let done = ModexDone { cbfunc, cbdata };
    // SAFETY: PMIx passes `nprocs` procs, valid for the call.
    let procs = unsafe { procs_from_raw(procs, nprocs) };
    // SAFETY: `info` holds `ninfo` entries, valid for the call.
    let collect = unsafe { find_bool(info, ninfo, key::COLLECT_DATA) }.unwrap_or(false);
    let data = if data.is_null() || ndata == 0 {
        Vec::new()
    } else {
        // SAFETY: `data[..ndata]` is PMIx's buffer, valid for the call; copied here because
        // PMIx frees it when we return.
        unsafe { std::slice::from_raw_parts(data.cast::<u8>(), ndata) }.to_vec()
    };
    forward("fence_nb", move |h| h.fence(procs, collect, data, done));
    Status::SUCCESS.0
}

unsafe extern "C" fn on_direct_modex(
    proc_: *const raw::pmix_proc_t,
    info: *const raw::pmix_info_t,
    ninfo: usize,
    cbfunc: raw::pmix_modex_cbfunc_t,
    cbdata: *mut c_void,
) -> raw::pmix_status_t {
    let done = ModexDone { cbfunc, cbdata };
    // SAFETY: PMIx passes a valid proc for the duration of the call.
    let p = unsafe { procs_from_raw(proc_, 1) };
    // SAFETY: `info` holds `ninfo` entries, valid for the call.
    let required_key = unsafe { find_string(info, ninfo, key::REQUIRED_KEY) };
    forward("direct_modex", move |h| match p.into_iter().next() {
        Some(p) => h.direct_modex(p, required_key, done),
        None => done.complete(Status::BAD_PARAM, Vec::new()),
    });
    Status::SUCCESS.0
}

unsafe extern "C" fn on_publish(
    proc_: *const raw::pmix_proc_t,
    info: *const raw::pmix_info_t,
    ninfo: usize,
    cbfunc: raw::pmix_op_cbfunc_t,
    cbdata: *mut c_void,
) -> raw::pmix_status_t {
    let done = OpDone { cbfunc, cbdata };
    // SAFETY: PMIx passes a valid proc for the duration of the call.
    let p = unsafe { procs_from_raw(proc_, 1) };
    // SAFETY: `info` holds `ninfo` entries, valid for the call.
    let what = unsafe { Published::from_info(info, ninfo) };
    forward("publish", move |h| match (p.into_iter().next(), what) {
        (Some(p), Ok(what)) => h.publish(p, what, done),
        (Some(p), Err(why)) => {
            tracing::warn!(?p, "publish refused: {why}");
            done.complete(Status::NOT_SUPPORTED)
        }
        (None, _) => done.complete(Status::BAD_PARAM),
    });
    Status::SUCCESS.0
}

unsafe extern "C" fn on_lookup(
    proc_: *const raw::pmix_proc_t,
    keys: *mut *mut c_char,
    info: *const raw::pmix_info_t,
    ninfo: usize,
    cbfunc: raw::pmix_lookup_cbfunc_t,
    cbdata: *mut c_void,
) -> raw::pmix_status_t {
    let done = LookupDone { cbfunc, cbdata };
    // SAFETY: PMIx passes a valid proc, a NULL-terminated argv of keys and `ninfo` infos,
    // all valid for the call.
    let (p, keys, directives) = unsafe {
        (
            procs_from_raw(proc_, 1),
            pubsub::keys_from_argv(keys),
            pubsub::directives_from_info(info, ninfo),
        )
    };
    forward("lookup", move |h| match p.into_iter().next() {
        Some(p) => h.lookup(p, keys, directives, done),
        None => done.complete(Status::BAD_PARAM, Vec::new()),
    });
    Status::SUCCESS.0
}

unsafe extern "C" fn on_unpublish(
    proc_: *const raw::pmix_proc_t,
    keys: *mut *mut c_char,
    info: *const raw::pmix_info_t,
    ninfo: usize,
    cbfunc: raw::pmix_op_cbfunc_t,
    cbdata: *mut c_void,
) -> raw::pmix_status_t {
    let done = OpDone { cbfunc, cbdata };
    // SAFETY: as for on_lookup.
    let (p, keys, directives) = unsafe {
        (
            procs_from_raw(proc_, 1),
            pubsub::keys_from_argv(keys),
            pubsub::directives_from_info(info, ninfo),
        )
    };
    forward("unpublish", move |h| match p.into_iter().next() {
        Some(p) => h.unpublish(p, keys, directives, done),
        None => done.complete(Status::BAD_PARAM),
    });
    Status::SUCCESS.0
}

unsafe extern "C" fn on_connect(
    procs: *const raw::pmix_proc_t,
    nprocs: usize,
    info: *const raw::pmix_info_t,
    ninfo: usize,
    cbfunc: raw::pmix_op_cbfunc_t,
    cbdata: *mut c_void,
) -> raw::pmix_status_t {
    let done = OpDone { cbfunc, cbdata };
    // SAFETY: `procs` holds `nprocs` and `info` `ninfo` entries, valid for the call.
    let (procs, timeout) = unsafe {
        (
            procs_from_raw(procs, nprocs),
            pubsub::timeout_from_info(info, ninfo),
        )
    };
    forward("connect", move |h| h.connect(procs, timeout, done));
    Status::SUCCESS.0
}

unsafe extern "C" fn on_disconnect(
    procs: *const raw::pmix_proc_t,
    nprocs: usize,
    info: *const raw::pmix_info_t,
    ninfo: usize,
    cbfunc: raw::pmix_op_cbfunc_t,
    cbdata: *mut c_void,
) -> raw::pmix_status_t {
    let done = OpDone { cbfunc, cbdata };
    // SAFETY: as for on_connect.
    let (procs, timeout) = unsafe {
        (
            procs_from_raw(procs, nprocs),
            pubsub::timeout_from_info(info, ninfo),
        )
    };
    forward("disconnect", move |h| h.disconnect(procs, timeout, done));
    Status::SUCCESS.0
}

/// `group`: a construct or destruct, copied into a [`GroupRequest`].
unsafe extern "C" fn on_group(
    op: raw::pmix_group_operation_t,
    grp: *mut c_char,
    procs: *const raw::pmix_proc_t,
    nprocs: usize,
    info: *const raw::pmix_info_t,
    ninfo: usize,
    cbfunc: raw::pmix_info_cbfunc_t,
    cbdata: *mut c_void,
) -> raw::pmix_status_t {
    let done = GroupDone { cbfunc, cbdata };
    // SAFETY: PMIx passes the group's name, `nprocs` members and `ninfo` directives, valid
    // for the call.
    let request = unsafe { super::group::request_from_raw(op, grp, procs, nprocs, info, ninfo) };
    forward("group", move |h| match request {
        Ok(r) => h.group(r, done),
        Err(s) => done.failed(s),
    });
    Status::SUCCESS.0
}

/// `spawn`: the apps and job info copied into typed values ([`super::spawn`]).
unsafe extern "C" fn on_spawn(
    proc_: *const raw::pmix_proc_t,
    job_info: *const raw::pmix_info_t,
    ninfo: usize,
    apps: *const raw::pmix_app_t,
    napps: usize,
    cbfunc: raw::pmix_spawn_cbfunc_t,
    cbdata: *mut c_void,
) -> raw::pmix_status_t {
    let done = SpawnDone { cbfunc, cbdata };
    // SAFETY: PMIx passes a valid proc, `ninfo` infos and `napps` apps, valid for the call.
    let (p, job_info, apps) = unsafe {
        (
            procs_from_raw(proc_, 1),
            super::spawn::data_of(job_info, ninfo),
            App::all_from_raw(apps, napps),
        )
    };
    forward("spawn", move |h| match p.into_iter().next() {
        Some(p) => h.spawn(p, job_info, apps, done),
        None => done.failed(Status::BAD_PARAM),
    });
    Status::SUCCESS.0
}

/// What a host-side call keeps alive until its callback runs.
struct OpCtx {
    what: &'static str,
    _keep: Option<InfoArray>,
    done: Box<dyn FnOnce(Status) + Send>,
}

/// Runs the closure of a host-side call that reported only a status.
///
/// # Safety
/// `cbdata` must be a `Box<OpCtx>` leaked by [`Server::op_call`], used once.
unsafe extern "C" fn op_done(status: raw::pmix_status_t, cbdata: *mut c_void) {
    // SAFETY: by the contract above.
    let ctx = unsafe { Box::from_raw(cbdata.cast::<OpCtx>()) };
    let OpCtx { what, _keep, done } = *ctx;
    if let Err(p) = catch_unwind(AssertUnwindSafe(|| done(Status(status))))
        && let Some(h) = handler()
    {
        report_panic(&*h, what, p);
    }
}

type DmodexCallback = Box<dyn FnOnce(Result<Vec<u8>, Status>) + Send>;

/// Runs the closure of [`Server::dmodex_request`] with a copy of the data.
///
/// # Safety
/// `cbdata` must be a `Box<DmodexCallback>` leaked by `dmodex_request`, used once; `data` is
/// NULL or `sz` bytes valid for the call.
unsafe extern "C" fn dmodex_done(
    status: raw::pmix_status_t,
    data: *mut c_char,
    sz: usize,
    cbdata: *mut c_void,
) {
    // SAFETY: by the contract above.
    let done = unsafe { Box::from_raw(cbdata.cast::<DmodexCallback>()) };
    let result = match check(status) {
        Err(e) => Err(e),
        Ok(()) if data.is_null() || sz == 0 => Ok(Vec::new()),
        // SAFETY: `data[..sz]` is valid for the call (PMIx frees it afterwards): copy it.
        Ok(()) => Ok(unsafe { std::slice::from_raw_parts(data.cast::<u8>(), sz) }.to_vec()),
    };
    if let Err(p) = catch_unwind(AssertUnwindSafe(move || done(result)))
        && let Some(h) = handler()
    {
        report_panic(&*h, "dmodex_request", p);
    }
}

/// Identity, directories and admission policy of the server.
#[derive(Clone)]
pub struct ServerConfig {
    /// `PMIX_SERVER_TMPDIR` and `PMIX_SYSTEM_TMPDIR`: where PMIx puts its rendezvous files;
    /// one per server, so several servers on one machine do not meet.
    pub tmpdir: PathBuf,
    /// `PMIX_HOSTNAME`: the name this node has in the job's node map.
    pub hostname: String,
    /// `PMIX_NODEID`: this node's index in the job.
    pub nodeid: u32,
    /// `PMIX_SERVER_NSPACE`: the server's own namespace (its clients see it in their URI).
    pub server_nspace: String,
    /// `PMIX_SERVER_RANK`: the server's rank in that namespace.
    pub server_rank: u32,
    /// Which connections may reach libpmix at all ([`gate`]): `admit(peer, local)`.
    pub admit: Policy,
    /// When the `group` upcall is installed ([`Groups`]).
    pub groups: Groups,
}

impl std::fmt::Debug for ServerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerConfig")
            .field("tmpdir", &self.tmpdir)
            .field("hostname", &self.hostname)
            .field("nodeid", &self.nodeid)
            .field("server_nspace", &self.server_nspace)
            .field("server_rank", &self.server_rank)
            .finish_non_exhaustive()
    }
}

/// Why [`Server::init`] failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum InitError {
    /// A PMIx server already ran in this process (PMIx keeps process-wide state).
    AlreadyInitialized,
    /// The environment would weaken PMIx's own checks (`PMIX_MCA_psec` naming `none`).
    InsecureEnvironment(String),
    /// The accept gate could not be installed: serving PMIx unguarded is refused.
    Gate(GateError),
    /// libpmix (or its hwloc) could not be opened.
    Library(LoadError),
    /// PMIx refused (building the init info, or `PMIx_server_init`).
    Pmix(Status),
}

impl std::fmt::Display for InitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InitError::AlreadyInitialized => {
                write!(f, "a PMIx server already ran in this process")
            }
            InitError::InsecureEnvironment(why) => write!(f, "refusing to start PMIx: {why}"),
            InitError::Gate(e) => e.fmt(f),
            InitError::Library(e) => e.fmt(f),
            InitError::Pmix(s) => write!(f, "PMIx_server_init: {s}"),
        }
    }
}

impl std::error::Error for InitError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            InitError::Gate(e) => Some(e),
            InitError::Library(e) => Some(e),
            InitError::Pmix(s) => Some(s),
            _ => None,
        }
    }
}

impl From<Status> for InitError {
    fn from(s: Status) -> Self {
        InitError::Pmix(s)
    }
}

/// `PMIX_MCA_psec` in this process's environment selects the server's security modules;
/// `none` accepts any client without a credential (research/endpoint-security.md §2.2).
fn check_psec_env() -> Result<(), InitError> {
    match std::env::var("PMIX_MCA_psec") {
        // `^a,b` excludes the listed modules; any other list includes them.
        Ok(v) if !v.trim_start().starts_with('^') && v.split(',').any(|m| m.trim() == "none") => {
            Err(InitError::InsecureEnvironment(format!(
                "PMIX_MCA_psec={v} names the `none` security module; unset it"
            )))
        }
        _ => Ok(()),
    }
}

/// The job-data stores the server opens: the hash store only (PMIx's MCA parameter `gds`).
/// By default it also opens the ds12 and ds21 shared-memory stores (directories, segment files
/// and locks under its tmpdir) for clients that pick them; greedy's clients keep the job's data
/// in hash (greedy-pmix `CLIENT_STORE`), so that work bought nothing: 0.5 ms of the server's
/// start and 0.3 ms of its finalize here, per node and step.
const SERVER_STORES: (&str, &str) = ("PMIX_MCA_gds", "hash");

/// Readies the process for [`Server::init`]: loads the machine's topology
/// ([`Topology::this_machine`](super::topology::Topology::this_machine)) and sets
/// [`SERVER_STORES`] in the environment unless the user set it (libpmix reads it at init).
/// Call it where no other thread reads or writes the environment: greedyd's `main` before its
/// runtime starts; slurmstepd's prefork, where Slurm's own mpi/pmix sets its `PMIX_*`
/// variables too (`pmixp_info.c`). The process's own environment reaches no rank (greedyd
/// clears it for them; slurmstepd gives tasks the job's).
pub fn prepare_process() {
    super::topology::Topology::this_machine();
    set_default(SERVER_STORES);
}

/// Readies a process that starts libpmix and hwloc later, if at all, from any thread (greedyd
/// knows only from its job's Start whether it serves PMIx or binds ranks): sets
/// [`SERVER_STORES`] and hwloc's plugin path ([`super::topology`]) in the environment, for
/// the life of the process, unless the user set them, and opens nothing. Call it where no
/// other thread exists yet; what the process starts must not inherit its environment.
pub fn prepare_environment() {
    set_default(SERVER_STORES);
    set_default(super::topology::NO_PLUGINS);
}

/// Sets `name` to `value` unless the environment has it. Callers run where no other thread
/// touches the environment (see theirs).
fn set_default((name, value): (&str, &str)) {
    if std::env::var_os(name).is_none() {
        // SAFETY: the caller runs this where no other thread touches the environment.
        unsafe { std::env::set_var(name, value) };
    }
}

/// The process's PMIx server: initialised by [`Server::init`]; finalized by
/// [`Server::finalize`] or [`Server::finalize_within`], or on drop, always on a thread of its
/// own so that no caller can be held by it; never, once [`Server::leave_to_exit`] was called.
pub struct Server {
    /// libpmix's functions (open: the server exists).
    pmix: &'static raw::Pmix,
    /// Set by [`Server::leave_to_exit`]: never finalized.
    left: AtomicBool,
    /// The init info (PMIx may keep pointers into it); `None` once finalize has started.
    init_info: Option<InfoArray>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("init_info", &self.init_info)
            .finish_non_exhaustive()
    }
}

/// A bound client's place on its node, as PMIx tells it to the client and its local peers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Locality {
    /// `PMIX_LOCALITY_STRING`: the topology objects it runs on (`SK0:L3:L2:L1:CR0:HT0-1`).
    pub locality: String,
    /// `PMIX_CPUSET`: its CPUs (`hwloc:0x…`).
    pub cpuset: String,
}

impl Server {
    /// Initialises the PMIx server (once per process) with `handler` behind its callbacks.
    ///
    /// First installs the accept gate with `config.admit` ([`gate::install`]): libpmix's
    /// listener starts inside `PMIx_server_init`, so the gate is in place before any client
    /// can connect, and a gate that cannot be installed fails the init (fail closed). Tool
    /// connections are refused (`tool_connected`), and no tool or system rendezvous file is
    /// written (`PMIX_SERVER_TOOL_SUPPORT`, `PMIX_SERVER_SYSTEM_SUPPORT` false); the listener
    /// stays on loopback (`PMIX_SERVER_REMOTE_CONNECTIONS` false).
    pub fn init(handler: Arc<dyn Handler>, config: &ServerConfig) -> Result<Server, InitError> {
        check_psec_env()?;
        let pmix = library::pmix().map_err(InitError::Library)?;
        if INITIALIZED.swap(true, Ordering::SeqCst) {
            // PMIx keeps process-wide state: a second server (even after finalize) is refused.
            return Err(InitError::AlreadyInitialized);
        }
        gate::install(config.admit.clone()).map_err(InitError::Gate)?;
        let tmp = config.tmpdir.to_string_lossy().into_owned();
        let mut entries = vec![
            (key::SERVER_TMPDIR, Value::Str(tmp.clone())),
            (key::SYSTEM_TMPDIR, Value::Str(tmp)),
            (key::HOSTNAME, Value::Str(config.hostname.clone())),
            (key::NODEID, Value::U32(config.nodeid)),
            (key::SERVER_NSPACE, Value::Str(config.server_nspace.clone())),
            (key::SERVER_RANK, Value::Rank(config.server_rank)),
            (key::SERVER_TOOL_SUPPORT, Value::Bool(false)),
            (key::SERVER_SYSTEM_SUPPORT, Value::Bool(false)),
            (key::SERVER_REMOTE_CONNECTIONS, Value::Bool(false)),
        ];
        // Spares the server its own discovery, I/O devices included (topology.rs).
        if let Some(topo) = super::topology::Topology::this_machine() {
            entries.push((key::TOPOLOGY2, Value::Topology(topo)));
        }
        let mut init_info = InfoArray::new(&entries)?;
        *HANDLER.write().unwrap_or_else(|p| p.into_inner()) = Some(handler);
        let module = host_module(config.groups.served(&gate::libpmix_version()));
        // PMIx copies the module table (`pmix_host_server = *module`); leak one anyway, so the
        // pointer stays valid whatever the library version does with it.
        let module: &'static mut raw::pmix_server_module_t = Box::leak(Box::new(module));
        let n = init_info.len();
        // SAFETY: `module` lives forever; `init_info` holds `n` valid entries and lives in the
        // returned Server; the callbacks are `extern "C"` functions that never unwind.
        let rc = unsafe { pmix.PMIx_server_init(module, init_info.as_mut_ptr(), n) };
        if let Err(e) = check(rc) {
            *HANDLER.write().unwrap_or_else(|p| p.into_inner()) = None;
            return Err(InitError::Pmix(e));
        }
        let server = Server {
            pmix,
            left: AtomicBool::new(false),
            init_info: Some(init_info),
        };
        // PMIx_server_init may have loaded components: none may accept past the gate.
        // (Dropping the server finalizes it in the background.)
        gate::verify().map_err(InitError::Gate)?;
        Ok(server)
    }

    /// Starts `PMIx_server_finalize` on a detached thread and returns at once; `done` runs
    /// on that thread with its status once it returns, which may be never: libpmix's
    /// finalize waits for its progress thread, which a client can hold (a blocking read in
    /// libpmix ≤ 6.1's connection handler, research/endpoint-security.md §2.3). Nobody ever
    /// joins the thread. If no thread can be started, finalize is skipped and `done` is
    /// dropped uncalled.
    pub fn finalize(mut self, done: impl FnOnce(Status) + Send + 'static) {
        self.start_finalize(done);
    }

    /// [`Server::finalize`], waiting at most `limit`: `Some(status)` if it returned in time,
    /// `None` if it was left behind.
    pub fn finalize_within(self, limit: Duration) -> Option<Status> {
        let (tx, rx) = mpsc::channel();
        self.finalize(move |s| {
            let _ = tx.send(s);
        });
        rx.recv_timeout(limit).ok()
    }

    /// Leaves the server running until the process exits: no finalize, now or on drop. For a
    /// process that ends with its last job (greedyd): `PMIx_server_finalize` costs it ≈ 0.4 ms
    /// of CPU per job and host, and leaves nothing that the exit does not (libpmix has no exit
    /// handlers; its threads and sockets end with the process; with tool and system support
    /// off it wrote no rendezvous file, and the tmpdir is the embedder's to remove).
    pub fn leave_to_exit(&self) {
        self.left.store(true, Ordering::SeqCst);
    }

    fn start_finalize(&mut self, done: impl FnOnce(Status) + Send + 'static) {
        let Some(init_info) = self.init_info.take() else {
            return;
        };
        if self.left.load(Ordering::SeqCst) {
            // libpmix may still point into it until the process ends.
            std::mem::forget(init_info);
            return;
        }
        let pmix = self.pmix;
        let spawned = std::thread::Builder::new()
            .name("pmix-finalize".into())
            .spawn(move || {
                // SAFETY: the server was initialised by `init`; this runs once (the info was
                // taken above) and on a thread of its own, never from a PMIx callback.
                let rc = unsafe { pmix.PMIx_server_finalize() };
                *HANDLER.write().unwrap_or_else(|p| p.into_inner()) = None;
                drop(init_info);
                done(Status(rc));
            });
        // Without a thread, finalizing here could block the caller for ever: skip it (the
        // process's exit ends libpmix's threads).
        let _ = spawned;
    }

    /// Leaks `ctx` as cbdata for `call`, reclaiming it when the call does not call back.
    fn op_call(
        ctx: OpCtx,
        call: impl FnOnce(raw::pmix_op_cbfunc_t, *mut c_void) -> raw::pmix_status_t,
    ) -> Result<(), Status> {
        let ptr = Box::into_raw(Box::new(ctx));
        let rc = call(Some(op_done), ptr.cast());
        if rc == raw::PMIX_SUCCESS as i32 {
            return Ok(()); // op_done will run
        }
        // SAFETY: PMIx did not take the callback (it returned at once), so `ptr` is still ours.
        let ctx = unsafe { Box::from_raw(ptr) };
        if rc == raw::PMIX_OPERATION_SUCCEEDED {
            (ctx.done)(Status::SUCCESS);
            Ok(())
        } else {
            Err(Status(rc))
        }
    }

    /// Registers namespace `nspace` with `nlocalprocs` local processes and its job info;
    /// `done` runs on PMIx's thread once registered. `info` is kept alive until then (PMIx
    /// does not copy it).
    pub fn register_nspace(
        &self,
        nspace: &str,
        nlocalprocs: u32,
        mut info: InfoArray,
        done: impl FnOnce(Status) + Send + 'static,
    ) -> Result<(), Status> {
        let ns = CString::new(nspace).map_err(|_| Status::BAD_PARAM)?;
        let (ptr, n) = (info.as_mut_ptr(), info.len());
        let ctx = OpCtx {
            what: "register_nspace",
            _keep: Some(info),
            done: Box::new(done),
        };
        Self::op_call(ctx, |cb, cbdata| {
            // SAFETY: `ns` is NUL-terminated and lives for the call (PMIx copies it); `ptr`
            // points to `n` entries owned by `ctx`, which lives until `op_done` runs (moving
            // the InfoArray does not move its boxed entries).
            unsafe {
                self.pmix.PMIx_server_register_nspace(
                    ns.as_ptr(),
                    nlocalprocs as c_int,
                    ptr,
                    n,
                    cb,
                    cbdata,
                )
            }
        })
    }

    /// Deregisters a namespace; `done` runs on PMIx's thread.
    pub fn deregister_nspace(&self, nspace: &str, done: impl FnOnce(Status) + Send + 'static) {
        let Ok(ns) = CString::new(nspace) else {
            done(Status::BAD_PARAM);
            return;
        };
        let ctx = OpCtx {
            what: "deregister_nspace",
            _keep: None,
            done: Box::new(done),
        };
        let ptr = Box::into_raw(Box::new(ctx));
        // SAFETY: `ns` lives for the call; PMIx always calls `op_done` once with `ptr`
        // (pmix_server.c@v4.2.2: at once when not initialised, else after the thread shift).
        unsafe {
            self.pmix
                .PMIx_server_deregister_nspace(ns.as_ptr(), Some(op_done), ptr.cast())
        };
    }

    /// Registers a local client (before it is started) that will run as `owner` (uid, gid),
    /// or as this process's uid and gid; PMIx refuses a connection from any other uid.
    /// `done` runs on PMIx's thread.
    pub fn register_client(
        &self,
        proc_: &Proc,
        owner: Option<(u32, u32)>,
        done: impl FnOnce(Status) + Send + 'static,
    ) -> Result<(), Status> {
        let p = proc_.to_raw().ok_or(Status::BAD_PARAM)?;
        // SAFETY: getuid/getgid cannot fail and have no preconditions.
        let (uid, gid) = owner.unwrap_or_else(|| unsafe { (libc::getuid(), libc::getgid()) });
        let ctx = OpCtx {
            what: "register_client",
            _keep: None,
            done: Box::new(done),
        };
        Self::op_call(ctx, |cb, cbdata| {
            // SAFETY: `p` lives for the call (PMIx copies the name); no server object.
            unsafe {
                self.pmix.PMIx_server_register_client(
                    &p,
                    uid,
                    gid,
                    std::ptr::null_mut(),
                    cb,
                    cbdata,
                )
            }
        })
    }

    /// Deregisters a local client; `done` runs on PMIx's thread.
    pub fn deregister_client(&self, proc_: &Proc, done: impl FnOnce(Status) + Send + 'static) {
        let Some(p) = proc_.to_raw() else {
            done(Status::BAD_PARAM);
            return;
        };
        let ctx = OpCtx {
            what: "deregister_client",
            _keep: None,
            done: Box::new(done),
        };
        let ptr = Box::into_raw(Box::new(ctx));
        // SAFETY: `p` lives for the call; PMIx always calls `op_done` once with `ptr`.
        unsafe {
            self.pmix
                .PMIx_server_deregister_client(&p, Some(op_done), ptr.cast())
        };
    }

    /// The environment variables a registered client needs (`PMIx_server_setup_fork`), as
    /// `(name, value)` pairs to add to its environment. Synchronous; never call it from a
    /// PMIx callback.
    pub fn setup_fork(&self, proc_: &Proc) -> Result<Vec<(String, String)>, Status> {
        let p = proc_.to_raw().ok_or(Status::BAD_PARAM)?;
        let mut env: *mut *mut c_char = std::ptr::null_mut();
        // SAFETY: `p` lives for the call; `env` starts as an empty (NULL) argv that PMIx
        // extends with malloc'd strings (pmix_setenv), which we free below.
        let rc = unsafe { self.pmix.PMIx_server_setup_fork(&p, &mut env) };
        let mut out = Vec::new();
        if !env.is_null() {
            let mut i = 0;
            loop {
                // SAFETY: `env` is a NULL-terminated array PMIx built; `i` never passes the NULL.
                let s = unsafe { *env.add(i) };
                if s.is_null() {
                    break;
                }
                // SAFETY: each entry is a malloc'd NUL-terminated "NAME=value" we now own.
                if let Some(kv) = unsafe { take_c_string(s) }
                    && let Some((k, v)) = kv.split_once('=')
                {
                    out.push((k.to_string(), v.to_string()));
                }
                i += 1;
            }
            // SAFETY: the array itself was malloc'd by PMIx's argv helpers and is ours.
            unsafe { libc::free(env.cast()) };
        }
        check(rc)?;
        Ok(out)
    }

    /// Asks PMIx for the modex data of local process `proc_` (for a remote node's direct
    /// modex); `done` runs on PMIx's thread once the process has committed its data.
    pub fn dmodex_request(
        &self,
        proc_: &Proc,
        done: impl FnOnce(Result<Vec<u8>, Status>) + Send + 'static,
    ) -> Result<(), Status> {
        let p = proc_.to_raw().ok_or(Status::BAD_PARAM)?;
        let cb: DmodexCallback = Box::new(done);
        let ptr = Box::into_raw(Box::new(cb));
        // SAFETY: `p` lives for the call; `ptr` is reclaimed exactly once, by dmodex_done or
        // below when PMIx refuses at once (it then does not call back).
        let rc = unsafe {
            self.pmix
                .PMIx_server_dmodex_request(&p, Some(dmodex_done), ptr.cast())
        };
        if rc != raw::PMIX_SUCCESS as i32 {
            // SAFETY: PMIx refused, so it will not call dmodex_done: `ptr` is still ours.
            drop(unsafe { Box::from_raw(ptr) });
            return Err(Status(rc));
        }
        Ok(())
    }

    /// Whether local process `proc_` has posted (committed) `key`: a `PMIx_Get` answered from
    /// this server's own store (`PMIX_IMMEDIATE`, `PMIX_OPTIONAL`: never asks the host, so
    /// never loops back into [`Handler::direct_modex`]). Blocks briefly on PMIx's thread:
    /// never call it from a callback.
    pub fn has_key(&self, proc_: &Proc, key: &str) -> Result<bool, Status> {
        let p = proc_.to_raw().ok_or(Status::BAD_PARAM)?;
        let k = CString::new(key).map_err(|_| Status::BAD_PARAM)?;
        let mut directives = InfoArray::new(&[
            (key::IMMEDIATE, Value::Bool(true)),
            (key::OPTIONAL, Value::Bool(true)),
        ])?;
        let mut val: *mut raw::pmix_value_t = std::ptr::null_mut();
        // SAFETY: `p`, `k` and `directives` live for the call; on success PMIx stores a
        // malloc'd value in `val` that we own and free below.
        let rc = unsafe {
            self.pmix.PMIx_Get(
                &p,
                k.as_ptr(),
                directives.as_mut_ptr(),
                directives.len(),
                &mut val,
            )
        };
        if !val.is_null() {
            // SAFETY: one malloc'd value PMIx handed us: free its contents, then itself (what
            // the PMIX_VALUE_RELEASE macro does).
            unsafe {
                self.pmix.PMIx_Value_destruct(val);
                libc::free(val.cast());
            }
        }
        match Status(rc) {
            Status::SUCCESS => Ok(true),
            Status::NOT_FOUND => Ok(false),
            other => Err(other),
        }
    }

    /// Where a local client bound to `cpus` (the operating system's CPU numbers) runs, as
    /// PMIx describes it to its peers: `PMIX_LOCALITY_STRING` and `PMIX_CPUSET`
    /// (`PMIx_server_generate_locality_string`, `…_cpuset_string`), for the client's
    /// job-level data. Needs the server's topology (from `init`).
    pub fn locality_of(&self, cpus: &[u32]) -> Result<Locality, Status> {
        // libpmix depends on this hwloc: it opens whenever the server does.
        let hwloc = library::hwloc().map_err(|_| Status::ERROR)?;
        // SAFETY: allocates an empty bitmap we own (NULL if out of memory).
        let bitmap = unsafe { hwloc.hwloc_bitmap_alloc() };
        if bitmap.is_null() {
            return Err(Status::ERROR);
        }
        for &cpu in cpus {
            // SAFETY: `bitmap` is ours and alive; setting a bit may grow it.
            unsafe { hwloc.hwloc_bitmap_set(bitmap, cpu) };
        }
        let set = raw::pmix_cpuset_t {
            source: c"hwloc".as_ptr().cast_mut(),
            bitmap: bitmap.cast(),
        };
        let describe = |f: unsafe extern "C" fn(
            *const raw::pmix_cpuset_t,
            *mut *mut c_char,
        ) -> raw::pmix_status_t| {
            let mut out: *mut c_char = std::ptr::null_mut();
            // SAFETY: `set` (its source a static string, its bitmap ours) lives for the call,
            // which only reads it; on success PMIx stores a malloc'd string we own in `out`.
            check(unsafe { f(&set, &mut out) })?;
            // SAFETY: malloc'd NUL-terminated string (or NULL) owned by us.
            unsafe { take_c_string(out) }.ok_or(Status::ERROR)
        };
        let locality = describe(self.pmix.PMIx_server_generate_locality_string);
        let cpuset = describe(self.pmix.PMIx_server_generate_cpuset_string);
        // SAFETY: allocated above; PMIx kept no reference to it.
        unsafe { hwloc.hwloc_bitmap_free(bitmap) };
        Ok(Locality {
            locality: locality?,
            cpuset: cpuset?,
        })
    }

    /// The hosts of registered namespace `nspace` as libpmix reads them back from its node map
    /// (`PMIx_Resolve_nodes`): what its clients will be told, in node-map order.
    pub fn resolve_nodes(&self, nspace: &str) -> Result<Vec<String>, Status> {
        let ns = CString::new(nspace).map_err(|_| Status::BAD_PARAM)?;
        let mut list: *mut c_char = std::ptr::null_mut();
        // SAFETY: `ns` is NUL-terminated and lives for the call; on success PMIx stores a
        // malloc'd comma-separated string in `list` that we own.
        check(unsafe { self.pmix.PMIx_Resolve_nodes(ns.as_ptr(), &mut list) })?;
        // SAFETY: malloc'd NUL-terminated string (or NULL) owned by us.
        let list = unsafe { take_c_string(list) }.ok_or(Status::NOT_FOUND)?;
        Ok(list.split(',').map(str::to_string).collect())
    }

    /// `PMIx_generate_regex` over a comma-separated host list: the `PMIX_NODE_MAP` value.
    pub fn generate_regex(&self, hosts: &str) -> Result<Regex, Status> {
        Self::generate(hosts, self.pmix.PMIx_generate_regex)
    }

    /// `PMIx_generate_ppn` over `r,r;r,r` (ranks per node, nodes in node-map order): the
    /// `PMIX_PROC_MAP` value.
    pub fn generate_ppn(&self, ranks: &str) -> Result<Regex, Status> {
        Self::generate(ranks, self.pmix.PMIx_generate_ppn)
    }

    fn generate(
        input: &str,
        f: unsafe extern "C" fn(*const c_char, *mut *mut c_char) -> raw::pmix_status_t,
    ) -> Result<Regex, Status> {
        let c = CString::new(input).map_err(|_| Status::BAD_PARAM)?;
        let mut out: *mut c_char = std::ptr::null_mut();
        // SAFETY: `c` is NUL-terminated and lives for the call; on success PMIx stores a
        // malloc'd buffer in `out` that we own.
        check(unsafe { f(c.as_ptr(), &mut out) })?;
        if out.is_null() {
            return Err(Status::ERROR);
        }
        // The buffer is a C string, or preg/compress's blob: three C strings, then as many
        // bytes as the third says (`Regex`). Only what the header vouches for is read.
        // SAFETY: PMIx's output starts with a NUL-terminated field, whatever its form.
        let first = unsafe { CStr::from_ptr(out) };
        let mut header = first.to_bytes_with_nul().len();
        if first.to_bytes() == b"blob:" {
            for _ in 0..2 {
                // SAFETY: a blob's first field is followed by two more NUL-terminated ones.
                header += unsafe { CStr::from_ptr(out.add(header)) }
                    .to_bytes_with_nul()
                    .len();
            }
        }
        // SAFETY: `header` bytes were just read as NUL-terminated fields of the buffer.
        let head = unsafe { std::slice::from_raw_parts(out.cast::<u8>(), header) };
        let regex = Regex::claimed_len(head).and_then(|len| {
            // SAFETY: PMIx allocated the buffer with the length its header claims (pack_blob in
            // preg_compress.c@v4.2.2), or it is the C string just measured (`len == header`).
            let whole = unsafe { std::slice::from_raw_parts(out.cast::<u8>(), len) };
            Regex::from_generated(whole)
        });
        // SAFETY: malloc'd by PMIx and owned by us; not used after this.
        unsafe { libc::free(out.cast()) };
        regex.ok_or(Status::NOT_SUPPORTED)
    }
}

impl Drop for Server {
    /// Finalizes in the background ([`Server::finalize`]): dropping never blocks.
    fn drop(&mut self) {
        self.start_finalize(|_| {});
    }
}

#[cfg(test)]
mod tests {
    /// A client's registered cleanup would run as root in slurmstepd if the host served job
    /// control ([`super::host_module`]): whoever adds it must guard that first.
    #[test]
    fn the_host_serves_no_job_control() {
        let module = super::host_module(true);
        assert!(module.job_control.is_none());
        assert!(module.client_connected.is_some() && module.fence_nb.is_some());
        assert!(module.spawn.is_some() && module.group.is_some());
    }
}
