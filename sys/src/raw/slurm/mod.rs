//! The Slurm plugin ABI of the release whose headers were found at build time.
//!
//! Public types (`slurm.h`) and the internal MPI-plugin structs (`src/common/slurm_mpi.h`, from
//! 23.02 `src/interfaces/mpi.h`, which Debian does not ship) are declared once for every
//! release, in `hooks` (and `stepd`), a field only some releases have gated by their cfg
//! (`slurm_22_05`, `slurm_24_11`, `slurm_26_05`); the hook structs go by their 23.02 names,
//! [`mpi_step_info_t`] and [`mpi_task_info_t`]. Each release's module (`v22_05`, `v24_11`,
//! `v26_05`, gated by its cfg) keeps what is its own, and the `const` size/offset asserts that
//! `sys/abi/offsets.c` prints from the release's real headers. The functions are libslurmfull
//! exports that slurmd, slurmstepd, srun and slurmctld already carry, resolved when the
//! plugin is loaded (research/slurm-plugin-api.md §3); those whose signature changed between
//! releases (`slurm_kill_job_step`) are declared in the release modules.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_void};

#[cfg(slurm_22_05)]
mod v22_05;
#[cfg(slurm_22_05)]
pub use v22_05::*;
#[cfg(slurm_24_11)]
mod v24_11;
#[cfg(slurm_24_11)]
pub use v24_11::*;
#[cfg(slurm_26_05)]
mod v26_05;
#[cfg(slurm_26_05)]
pub use v26_05::*;
mod hooks;
pub use hooks::*;
mod stepd;
pub use stepd::stepd_step_rec_t;

/// `SLURM_VERSION_NUMBER` of the Slurm built against: a plugin's `plugin_version` must equal it.
pub const VERSION_NUMBER: u32 = parse_u32(env!("GREEDY_SLURM_VERSION_NUMBER"));

/// The same release as text, e.g. `22.05.8`.
pub const VERSION: &str = env!("GREEDY_SLURM_VERSION");

/// Opaque `hostlist_t` (`struct hostlist *`).
pub type hostlist_t = *mut c_void;

// libslurmfull exports (env.c, hostlist.c, list.c, xstring.c, read_config.c aliases and
// slurm.h), unchanged from 22.05 to 26.05 (checked at slurm-24-11-5-1 and slurm-26-05-3-1;
// `hostlist_t` became a struct type whose pointer the functions take, the same ABI).
unsafe extern "C" {
    /// Sets `name=value` in an xmalloc'd env array; 1 on success.
    pub fn slurm_env_array_overwrite(
        env: *mut *mut *mut c_char,
        name: *const c_char,
        value: *const c_char,
    ) -> c_int;
    /// The value of `name` in an env array, or NULL (points into the array).
    pub fn slurm_getenvp(env: *mut *mut c_char, name: *const c_char) -> *mut c_char;
    /// Removes `name` from an env array.
    pub fn slurm_unsetenvp(env: *mut *mut c_char, name: *const c_char);
    /// A hostlist from an expression such as `n[1-4]`; NULL on a parse error.
    pub fn slurm_hostlist_create(hostlist: *const c_char) -> hostlist_t;
    /// Number of hosts in a hostlist.
    pub fn slurm_hostlist_count(hl: hostlist_t) -> c_int;
    /// Frees a hostlist.
    pub fn slurm_hostlist_destroy(hl: hostlist_t);
    /// Appends one host name; returns the number of hosts added.
    pub fn slurm_hostlist_push_host(hl: hostlist_t, host: *const c_char) -> c_int;
    /// Removes and returns the first host, `malloc`ed (free with `libc::free`), or NULL.
    pub fn slurm_hostlist_shift(hl: hostlist_t) -> *mut c_char;
    /// The ranged string of a hostlist, `malloc`ed (free with `libc::free`).
    pub fn slurm_hostlist_ranged_string_malloc(hl: hostlist_t) -> *mut c_char;
    /// Slurm's allocator (`xcalloc`): memory Slurm will `xfree`.
    pub fn slurm_xcalloc(
        count: usize,
        size: usize,
        clear: bool,
        try_: bool,
        file: *const c_char,
        line: c_int,
        func: *const c_char,
    ) -> *mut c_void;
    /// Frees xmalloc'd memory and sets `*item` to NULL.
    pub fn slurm_xfree(item: *mut *mut c_void);
    /// NodeAddr of a NodeName from slurm.conf, xmalloc'd; NULL when unknown.
    pub fn slurm_conf_get_address(node_name: *const c_char) -> *mut c_char;
    /// A new Slurm `List` whose items `destroy` frees (public `slurm.h`).
    pub fn slurm_list_create(destroy: Option<unsafe extern "C" fn(*mut c_void)>) -> *mut c_void;
    /// Appends `item` to `list`; returns `item`.
    pub fn slurm_list_append(list: *mut c_void, item: *mut c_void) -> *mut c_void;
    /// An xmalloc'd copy of a C string.
    pub fn slurm_xstrdup(s: *const c_char) -> *mut c_char;
    /// Frees a [`config_key_pair_t`] and its strings (read_config.c).
    pub fn slurm_destroy_config_key_pair(pair: *mut c_void);
}

/// One `Key = Value` of `scontrol show config` (src/common/read_config.h, unchanged since
/// 15.08): both strings xmalloc'd, freed by [`slurm_destroy_config_key_pair`].
#[repr(C)]
pub struct config_key_pair_t {
    /// The key.
    pub name: *mut c_char,
    /// Its value.
    pub value: *mut c_char,
}

// libslurmfull's logger (src/common/log.h, `slurm_`-prefixed aliases), present in every
// process that loads a plugin; messages go wherever that process logs (slurmd's log file,
// srun's stderr) and are filtered by its configured level.
unsafe extern "C" {
    /// `error()`: logged at every level above quiet.
    pub fn slurm_error(fmt: *const c_char, ...);
    /// `info()`: the daemons' default level.
    pub fn slurm_info(fmt: *const c_char, ...);
    /// `verbose()`: one level above info.
    pub fn slurm_verbose(fmt: *const c_char, ...);
    /// `debug()`: `SlurmdDebug=debug` and above.
    pub fn slurm_debug(fmt: *const c_char, ...);
}

// The route plugin interface of 22.05 and 23.02 (src/common/slurm_route.c@slurm-22-05-8-1);
// the route plugin was removed in 23.11, and with it this function.
#[cfg(slurm_22_05)]
unsafe extern "C" {
    /// Slurm's own TreeWidth split (what route/default does): consumes `hl`, sets `*sp_hl` to an
    /// xmalloc'd array of `*count` hostlists the caller destroys; returns 0.
    pub fn slurm_route_split_hostlist_treewidth(
        hl: hostlist_t,
        sp_hl: *mut *mut hostlist_t,
        count: *mut c_int,
        tree_width: u16,
    ) -> c_int;
}

/// `SLURM_SUCCESS`.
pub const SLURM_SUCCESS: c_int = 0;
/// `SLURM_ERROR`.
pub const SLURM_ERROR: c_int = -1;

const fn parse_u32(s: &str) -> u32 {
    let bytes = s.as_bytes();
    let mut value = 0u32;
    let mut i = 0;
    while i < bytes.len() {
        value = value * 10 + (bytes[i] - b'0') as u32;
        i += 1;
    }
    value
}
