//! Safe wrappers over the libslurmfull exports the plugins use: Slurm's logger, owned
//! hostlists, and the xmalloc'd hostlist array a route plugin hands back.
//!
//! Every function here calls into the process that loaded the plugin (srun, slurmd, slurmctld,
//! sbcast, slurmstepd), so it only works inside such a process; unit tests elsewhere must not
//! call it (the symbols resolve only at `dlopen`).

use crate::raw::slurm as raw;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::ptr::NonNull;

/// Slurm's logger: the message goes wherever the loading process logs (slurmd's `SlurmdLogFile`,
/// slurmctld's log, srun's stderr), filtered by that process's level.
pub mod log {
    use super::raw;
    use std::ffi::CString;

    /// Logs at `error` level.
    pub fn error(msg: &str) {
        let msg = c_message(msg);
        // SAFETY: the format is a literal "%s" with exactly one C-string argument, so no
        // conversion in `msg` is interpreted; both strings are NUL-terminated and live
        // across the call; the logger copies what it keeps.
        unsafe { raw::slurm_error(c"%s".as_ptr(), msg.as_ptr()) }
    }

    /// Logs at `info` level (the daemons' default).
    pub fn info(msg: &str) {
        let msg = c_message(msg);
        // SAFETY: as in `error`: literal "%s" format, one live NUL-terminated argument.
        unsafe { raw::slurm_info(c"%s".as_ptr(), msg.as_ptr()) }
    }

    /// Logs at `verbose` level.
    pub fn verbose(msg: &str) {
        let msg = c_message(msg);
        // SAFETY: as in `error`: literal "%s" format, one live NUL-terminated argument.
        unsafe { raw::slurm_verbose(c"%s".as_ptr(), msg.as_ptr()) }
    }

    /// Logs at `debug` level.
    pub fn debug(msg: &str) {
        let msg = c_message(msg);
        // SAFETY: as in `error`: literal "%s" format, one live NUL-terminated argument.
        unsafe { raw::slurm_debug(c"%s".as_ptr(), msg.as_ptr()) }
    }

    /// The message as a C string; an interior NUL (never expected) becomes '?' rather than
    /// dropping the line.
    fn c_message(msg: &str) -> CString {
        CString::new(msg.replace('\0', "?")).unwrap_or_default()
    }
}

/// An owned Slurm `hostlist_t`, destroyed on drop unless handed to Slurm with
/// [`Hostlist::into_raw`].
#[derive(Debug)]
pub struct Hostlist(NonNull<c_void>);

impl Hostlist {
    /// An empty hostlist; `None` if Slurm could not allocate it.
    pub fn new() -> Option<Hostlist> {
        // SAFETY: hostlist_create(NULL) returns a new empty list (hostlist.c:1785-1795
        // @slurm-22-05-8-1) or NULL; the result is owned by no one else.
        let hl = unsafe { raw::slurm_hostlist_create(std::ptr::null()) };
        NonNull::new(hl).map(Hostlist)
    }

    /// Takes ownership of a hostlist; `None` for NULL.
    ///
    /// # Safety
    /// `hl` must be NULL or a live hostlist that nothing else destroys or uses afterwards.
    pub unsafe fn from_raw(hl: raw::hostlist_t) -> Option<Hostlist> {
        NonNull::new(hl).map(Hostlist)
    }

    /// Gives the hostlist to C; the receiver must `hostlist_destroy` it.
    pub fn into_raw(self) -> raw::hostlist_t {
        let hl = self.0.as_ptr();
        std::mem::forget(self);
        hl
    }

    /// Appends one host name; false if Slurm refused it.
    pub fn push(&mut self, host: &CStr) -> bool {
        // SAFETY: self.0 is a live hostlist we own; `host` is NUL-terminated and only read
        // (hostlist_push_host copies it into its ranges).
        unsafe { raw::slurm_hostlist_push_host(self.0.as_ptr(), host.as_ptr()) == 1 }
    }

    /// Number of hosts.
    pub fn count(&self) -> usize {
        // SAFETY: self.0 is a live hostlist we own.
        let n = unsafe { raw::slurm_hostlist_count(self.0.as_ptr()) };
        usize::try_from(n).unwrap_or(0)
    }
}

impl Drop for Hostlist {
    fn drop(&mut self) {
        // SAFETY: we own the list (from_raw/new contract) and drop runs once.
        unsafe { raw::slurm_hostlist_destroy(self.0.as_ptr()) }
    }
}

/// Shifts every host out of a hostlist the caller does not own, in order, leaving it empty
/// (what a route plugin's split must do with its input, slurm_route.c@slurm-22-05-8-1).
///
/// # Safety
/// `hl` must be a live hostlist that no other thread uses during the call.
pub unsafe fn drain_hostlist(hl: raw::hostlist_t) -> Vec<CString> {
    let mut hosts = Vec::new();
    if hl.is_null() {
        return hosts;
    }
    // SAFETY: hl is live and ours for the call (contract above).
    let n = unsafe { raw::slurm_hostlist_count(hl) };
    hosts.reserve(usize::try_from(n).unwrap_or(0));
    loop {
        // SAFETY: as above; hostlist_shift returns a malloc'd name or NULL when empty.
        let name = unsafe { raw::slurm_hostlist_shift(hl) };
        if name.is_null() {
            break;
        }
        // SAFETY: `name` is a NUL-terminated string malloc'd by hostlist_shift; we copy it and
        // then free it with the allocator it came from.
        unsafe {
            hosts.push(CStr::from_ptr(name).to_owned());
            libc::free(name.cast());
        }
    }
    hosts
}

/// An xmalloc'd array of owned hostlists, as `route_p_split_hostlist` returns through `sp_hl`:
/// the caller (forward.c) destroys each list and `xfree`s the array.
#[derive(Debug)]
pub struct HostlistArray {
    ptr: NonNull<raw::hostlist_t>,
    len: usize,
}

impl HostlistArray {
    /// Moves `lists` into a new xmalloc'd array; `None` if Slurm could not allocate it (the
    /// lists are then destroyed). An empty `lists` still gets a one-slot array, so the caller
    /// always has something to `xfree`.
    pub fn new(lists: Vec<Hostlist>) -> Option<HostlistArray> {
        let slots = lists.len().max(1);
        // SAFETY: plain allocation call; `try_ = true` makes it return NULL instead of
        // calling fatal() on failure, `clear = true` zeroes the slots; the strings are
        // static and only read.
        let ptr = unsafe {
            raw::slurm_xcalloc(
                slots,
                size_of::<raw::hostlist_t>(),
                true,
                true,
                c"greedy-sys/src/slurm.rs".as_ptr(),
                0,
                c"HostlistArray::new".as_ptr(),
            )
        };
        let ptr = NonNull::new(ptr.cast::<raw::hostlist_t>())?;
        let len = lists.len();
        for (i, list) in lists.into_iter().enumerate() {
            // SAFETY: the block holds `slots` ≥ len pointer-sized, aligned slots (xcalloc
            // returns malloc-aligned memory) and i < len.
            unsafe { ptr.as_ptr().add(i).write(list.into_raw()) };
        }
        Some(HostlistArray { ptr, len })
    }

    /// Number of hostlists.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the array holds no hostlist.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Hands the array to C: the array pointer and its length. The receiver destroys each
    /// hostlist and `xfree`s the array.
    pub fn into_raw(self) -> (*mut raw::hostlist_t, c_int) {
        let out = (
            self.ptr.as_ptr(),
            c_int::try_from(self.len).unwrap_or(c_int::MAX),
        );
        std::mem::forget(self);
        out
    }
}

impl Drop for HostlistArray {
    fn drop(&mut self) {
        for i in 0..self.len {
            // SAFETY: slots 0..len hold hostlists this array owns (written in `new`).
            unsafe { raw::slurm_hostlist_destroy(self.ptr.as_ptr().add(i).read()) };
        }
        let mut block = self.ptr.as_ptr().cast::<c_void>();
        // SAFETY: the block came from slurm_xcalloc and is freed once, here.
        unsafe { raw::slurm_xfree(&mut block) };
    }
}

/// Slurm's own TreeWidth split (route/default), for when the caller's plan cannot be trusted.
///
/// # Safety
/// The arguments must be those Slurm passed to `route_p_split_hostlist`: a live `hl` no other
/// thread uses, and writable `sp_hl` and `count`.
pub unsafe fn split_hostlist_treewidth(
    hl: raw::hostlist_t,
    sp_hl: *mut *mut raw::hostlist_t,
    count: *mut c_int,
    tree_width: u16,
) -> c_int {
    // SAFETY: forwarded unchanged under the caller's contract.
    unsafe { raw::slurm_route_split_hostlist_treewidth(hl, sp_hl, count, tree_width) }
}

/// Reads a NUL-terminated C string Slurm owns, lossily as UTF-8; `None` for NULL.
///
/// # Safety
/// `s` must be NULL or point to a NUL-terminated string that lives for the call.
pub unsafe fn read_c_str(s: *const c_char) -> Option<String> {
    if s.is_null() {
        return None;
    }
    // SAFETY: non-NULL and NUL-terminated per the contract.
    Some(unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned())
}
