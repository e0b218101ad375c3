//! Safe wrappers over the libslurmfull exports the plugins use: Slurm's logger, owned
//! hostlists, the xmalloc'd hostlist array a route plugin hands back, and for the MPI plugin
//! the hook env ([`Env`]), NodeAddr lookup, step kill, and copies of the hook structs.
//!
//! Every function here calls into the process that loaded the plugin (srun, slurmd, slurmctld,
//! sbcast, slurmstepd), so it only works inside such a process; unit tests elsewhere must not
//! call it (the symbols resolve only at `dlopen`).

use crate::raw::slurm as raw;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::os::fd::RawFd;
use std::ptr::NonNull;

pub mod release;

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

/// Number of hosts in a hostlist the caller does not own.
///
/// # Safety
/// `hl` must be NULL or a live hostlist that no other thread uses during the call.
pub unsafe fn hostlist_count(hl: raw::hostlist_t) -> usize {
    if hl.is_null() {
        return 0;
    }
    // SAFETY: hl is live and ours for the call (contract above).
    let n = unsafe { raw::slurm_hostlist_count(hl) };
    usize::try_from(n).unwrap_or(0)
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

    /// One hostlist per range of `hosts`, in order: the sub-lists a forwarding split returns.
    /// `None` if a range is out of bounds or Slurm could not allocate or take a name.
    pub fn from_ranges(
        hosts: &[CString],
        ranges: &[std::ops::Range<usize>],
    ) -> Option<HostlistArray> {
        let mut lists = Vec::with_capacity(ranges.len());
        for r in ranges {
            let mut list = Hostlist::new()?;
            for host in hosts.get(r.clone())? {
                if !list.push(host) {
                    return None;
                }
            }
            lists.push(list);
        }
        HostlistArray::new(lists)
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
/// Only in releases with a route plugin interface (22.05, 23.02).
///
/// # Safety
/// The arguments must be those Slurm passed to `route_p_split_hostlist`: a live `hl` no other
/// thread uses, and writable `sp_hl` and `count`.
#[cfg(slurm_22_05)]
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

/// A job environment Slurm hands a hook (`char ***env`): an xmalloc'd array that only Slurm's
/// env functions may grow or shrink (libc `realloc`/`free` on it corrupt the heap;
/// research/slurm-plugin-api.md §3).
#[derive(Debug)]
pub struct Env<'a> {
    env: *mut *mut *mut c_char,
    _hook: std::marker::PhantomData<&'a mut ()>,
}

impl<'a> Env<'a> {
    /// Borrows the hook's `env` argument; `None` for NULL.
    ///
    /// # Safety
    /// `env` must be NULL or the `char ***env` Slurm passed to the running hook: `*env` NULL or
    /// an xmalloc'd, NULL-terminated array of `NAME=value` strings, used by no other thread
    /// while the returned value lives.
    pub unsafe fn from_raw(env: *mut *mut *mut c_char) -> Option<Env<'a>> {
        (!env.is_null()).then_some(Env {
            env,
            _hook: std::marker::PhantomData,
        })
    }

    /// The value of `name`, lossily as UTF-8.
    pub fn get(&self, name: &str) -> Option<String> {
        let name = CString::new(name).ok()?;
        // SAFETY: `self.env` is the live hook argument (from_raw contract), so `*self.env` is
        // NULL or a NULL-terminated array; getenvp handles a NULL array and returns a pointer
        // into it, which we copy at once.
        unsafe {
            let array = *self.env;
            if array.is_null() {
                return None;
            }
            read_c_str(raw::slurm_getenvp(array, name.as_ptr()))
        }
    }

    /// Sets `name=value`, replacing any earlier value; false if Slurm refused (or a NUL byte).
    pub fn set(&mut self, name: &str, value: &str) -> bool {
        let (Ok(name), Ok(value)) = (CString::new(name), CString::new(value)) else {
            return false;
        };
        // SAFETY: `self.env` is the live hook argument; env_array_overwrite grows the array
        // with xrealloc (allocating it when `*env` is NULL) and copies both strings.
        unsafe { raw::slurm_env_array_overwrite(self.env, name.as_ptr(), value.as_ptr()) == 1 }
    }

    /// Removes every `name=` entry.
    pub fn unset(&mut self, name: &str) {
        let Ok(name) = CString::new(name) else { return };
        // SAFETY: as in `get`; unsetenvp shifts entries within the array and xfrees the
        // removed strings, which only this array owned.
        unsafe {
            let array = *self.env;
            if !array.is_null() {
                raw::slurm_unsetenvp(array, name.as_ptr());
            }
        }
    }
}

/// The `NodeAddr` slurm.conf gives `node` (its NodeName when no NodeAddr is set); `None` when
/// the node is unknown. Use this, never DNS on the NodeName, to reach a node's daemon host.
pub fn conf_get_address(node: &str) -> Option<String> {
    let name = CString::new(node).ok()?;
    // SAFETY: `name` is NUL-terminated and only read; the result is NULL or an xmalloc'd
    // string that we own and free below.
    let addr = unsafe { raw::slurm_conf_get_address(name.as_ptr()) };
    // SAFETY: NULL or a NUL-terminated string, live until freed just after.
    let text = unsafe { read_c_str(addr) };
    if !addr.is_null() {
        let mut block = addr.cast::<c_void>();
        // SAFETY: `addr` came from xmalloc (read_config.c: xstrdup) and is freed once.
        unsafe { raw::slurm_xfree(&mut block) };
    }
    text
}

/// `pairs` as the Slurm `List` of `config_key_pair_t` that an MPI plugin's
/// `conf_get_printable` returns for `scontrol show config` (Slurm frees it). NULL when Slurm
/// could not allocate; pairs with a NUL inside are left out.
pub fn config_key_pairs(pairs: &[(&str, String)]) -> *mut c_void {
    // SAFETY: the destructor is Slurm's own for exactly these items.
    let list = unsafe { raw::slurm_list_create(Some(raw::slurm_destroy_config_key_pair)) };
    if list.is_null() {
        return list;
    }
    for (name, value) in pairs {
        let (Ok(name), Ok(value)) = (CString::new(*name), CString::new(value.as_str())) else {
            continue;
        };
        // SAFETY: plain allocation; `try_ = true` returns NULL instead of calling fatal().
        let item = unsafe {
            raw::slurm_xcalloc(
                1,
                size_of::<raw::config_key_pair_t>(),
                true,
                true,
                c"greedy-sys/src/slurm.rs".as_ptr(),
                0,
                c"config_key_pairs".as_ptr(),
            )
        }
        .cast::<raw::config_key_pair_t>();
        if item.is_null() {
            continue;
        }
        // SAFETY: `item` is a zeroed, aligned config_key_pair_t we own; xstrdup copies the
        // NUL-terminated strings into Slurm's allocator; the list takes ownership of `item`.
        unsafe {
            (*item).name = raw::slurm_xstrdup(name.as_ptr());
            (*item).value = raw::slurm_xstrdup(value.as_ptr());
            raw::slurm_list_append(list, item.cast());
        }
    }
    list
}

/// Whether this process runs with effective uid 0 (slurmstepd's hooks before the tasks fork).
pub fn running_as_root() -> bool {
    effective_uid() == 0
}

/// This process's effective uid; async-signal-safe (the task hook runs after fork).
pub fn effective_uid() -> u32 {
    // SAFETY: geteuid cannot fail and has no preconditions.
    unsafe { libc::geteuid() }
}

/// Asks slurmctld to send `signal` to every task of step `job_id.step_id` on every node;
/// false when the request failed. (The C signature differs per release: 24.11 added `flags`,
/// 25.11 takes a `slurm_step_id_t *`; this is the same request in each.)
pub fn kill_job_step(job_id: u32, step_id: u32, signal: u16) -> bool {
    #[cfg(slurm_22_05)]
    // SAFETY: plain values; the call only sends an RPC with them.
    let rc = unsafe { raw::slurm_kill_job_step(job_id, step_id, signal) };
    #[cfg(slurm_24_11)]
    // SAFETY: plain values (`flags` 0: no KILL_* flag); the call only sends an RPC with them.
    let rc = unsafe { raw::slurm_kill_job_step(job_id, step_id, signal, 0) };
    #[cfg(slurm_26_05)]
    let rc = {
        // As Slurm's own slurm_pmi_kill_job_step fills it (src/api/slurm_pmi.c@slurm-26-05-3-1):
        // no sluid, not a het component.
        let mut id = raw::slurm_step_id_t {
            sluid: 0,
            job_id,
            step_het_comp: NO_VAL,
            step_id,
        };
        // SAFETY: `id` is a live, initialised slurm_step_id_t of this release's layout; the
        // call only copies it into the request (cancel.c) and sends an RPC.
        unsafe { raw::slurm_kill_job_step(&mut id, signal, 0) }
    };
    rc == raw::SLURM_SUCCESS
}

/// Slurm's `NO_VAL`: "no value" in a `uint32_t` field (slurm.h).
const NO_VAL: u32 = 0xffff_fffe;

/// What `mpi_p_client_prelaunch` needs from srun's step: its id and where its ranks run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepLayout {
    /// Job id (of this component, in a het step).
    pub job_id: u32,
    /// In a het step (`srun A : B`), the het job id and this component's first rank; srun
    /// then gives every component the layout of the whole het step (step_launch.c
    /// `_rebuild_mpi_layout`), and `ranks` are global.
    pub het: Option<HetClient>,
    /// Step id.
    pub step_id: u32,
    /// The step's nodes, a hostlist expression, in node-index order once expanded.
    pub node_list: String,
    /// `ranks[node]`: the global ranks on each node, as Slurm placed them.
    pub ranks: Vec<Vec<u32>>,
}

/// srun's view of one component of a het step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HetClient {
    /// The het job id (the first component's job id; the same in every component), or the
    /// job id of a het step inside one allocation.
    pub het_job_id: u32,
    /// This component's first global rank.
    pub task_offset: u32,
}

/// Copies the step layout out of the client info srun passes to `mpi_p_client_prelaunch`;
/// `None` when a pointer in it is NULL.
///
/// # Safety
/// `info` must be NULL or point to the live client info of the running hook
/// (`mpi_plugin_client_info_t` in 22.05, `mpi_step_info_t` since 23.02),
/// whose `step_layout` (when non-NULL) has `node_cnt` entries in `tasks` and `tids`, and
/// `tasks[i]` entries in `tids[i]` (slurm_step_layout.c builds it so).
pub unsafe fn client_step_layout(info: *const raw::mpi_step_info_t) -> Option<StepLayout> {
    // SAFETY: NULL or live (contract).
    let info = unsafe { info.as_ref() }?;
    // SAFETY: NULL or the live layout (contract).
    let layout = unsafe { info.step_layout.as_ref() }?;
    // SAFETY: NULL or a NUL-terminated string owned by the layout.
    let node_list = unsafe { read_c_str(layout.node_list) }?;
    if layout.tasks.is_null() || layout.tids.is_null() {
        return None;
    }
    let mut ranks = Vec::with_capacity(layout.node_cnt as usize);
    for node in 0..layout.node_cnt as usize {
        // SAFETY: node < node_cnt, the length of `tasks` and `tids` (contract).
        let (n, tids) = unsafe { (*layout.tasks.add(node), *layout.tids.add(node)) };
        if tids.is_null() {
            return None;
        }
        // SAFETY: tids[node] holds tasks[node] entries (contract).
        ranks.push(unsafe { std::slice::from_raw_parts(tids, n as usize) }.to_vec());
    }
    // srun sets the task offset for every het step, the het job id only for a het job: the
    // components of a het step inside one allocation share the job id (srun_job.c
    // `create_srun_job`, `local_het_step`).
    let het_job_id = match info.het_job_id {
        0 | NO_VAL => info.step_id.job_id,
        id => id,
    };
    let het = (info.het_job_task_offset != NO_VAL).then_some(HetClient {
        het_job_id,
        task_offset: info.het_job_task_offset,
    });
    Some(StepLayout {
        job_id: info.step_id.job_id,
        het,
        step_id: info.step_id.step_id,
        node_list,
        ranks,
    })
}

/// The rank a task hook runs for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskInfo {
    /// Global rank.
    pub gtaskid: u32,
    /// Rank index on this node.
    pub ltaskid: i32,
    /// This node's index in the step.
    pub nodeid: u32,
    /// Ranks in the step.
    pub ntasks: u32,
}

/// Copies the task info `mpi_p_slurmstepd_task` receives; `None` for NULL.
///
/// # Safety
/// `info` must be NULL or point to the live task info of the running hook
/// (`mpi_plugin_task_info_t` in 22.05, `mpi_task_info_t` since 23.02, without `self` since
/// 23.11: the release's own declaration in [`raw`] is used, so the fields read are right).
pub unsafe fn task_info(info: *const raw::mpi_task_info_t) -> Option<TaskInfo> {
    // SAFETY: NULL or live (contract).
    let info = unsafe { info.as_ref() }?;
    Some(TaskInfo {
        gtaskid: info.gtaskid,
        ltaskid: info.ltaskid,
        nodeid: info.nodeid,
        ntasks: info.ntasks,
    })
}

/// What slurmstepd itself knows of the step it runs (`stepd_step_rec_t`, from the launch
/// request and credential slurmd verified): the authority a root stepd acts on, where the
/// launch environment is only what the user's srun sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepRecord {
    /// Job id.
    pub job_id: u32,
    /// Step id.
    pub step_id: u32,
    /// Nodes of the step.
    pub nnodes: u32,
    /// Tasks of the step.
    pub ntasks: u32,
    /// This node's index in the step.
    pub nodeid: u32,
    /// Tasks on this node.
    pub node_tasks: u32,
    /// The uid the tasks run as.
    pub uid: u32,
    /// Their primary gid.
    pub gid: u32,
    /// This node's NodeName.
    pub node_name: String,
    /// The whole het step this component belongs to, when it is one of several components
    /// launched by one srun (`srun A : B`).
    pub het: Option<HetRecord>,
}

/// slurmstepd's record of the het step a component belongs to: what srun sent every
/// component's launch (`het_job_*` in `stepd_step_rec_t`), the same on every node of every
/// component.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HetRecord {
    /// The het job id (the first component's job id).
    pub het_job_id: u32,
    /// This component's index.
    pub component: u32,
    /// This component's first global rank.
    pub task_offset: u32,
    /// Nodes of all components, a hostlist expression in the order of `ranks`.
    pub node_list: String,
    /// `ranks[node]`: global ranks on each node of the het step.
    pub ranks: Vec<Vec<u32>>,
    /// The component of each global rank, when Slurm sent it.
    pub rank_components: Option<Vec<u32>>,
}

/// Copies the step record `mpi_p_slurmstepd_prefork` receives, after checking that this
/// build's declaration of it matches the running slurmstepd: slurmstepd passes `&step->env`
/// as `env`, so the declared offset of `env` must land exactly there. An error says what
/// disagrees (a NULL record, a layout of another release, counts that cannot be).
///
/// # Safety
/// `step` must be NULL or the live record of the running prefork hook, and `env` the hook's
/// `char ***env` argument.
pub unsafe fn step_record(
    step: *const raw::stepd_step_rec_t,
    env: *mut *mut *mut c_char,
) -> Result<StepRecord, String> {
    if step.is_null() {
        return Err("slurmstepd passed no step record".into());
    }
    // SAFETY: `step` is non-NULL and live (contract); only the field's address is taken.
    let env_field = unsafe { std::ptr::addr_of!((*step).env) };
    if env_field.cast::<c_void>() != env.cast::<c_void>().cast_const() {
        return Err(format!(
            "slurmstepd's step record does not have this build's layout (env at offset {}, \
             expected {}): is mpi_greedy.so built for Slurm {}?",
            (env as usize).wrapping_sub(step as usize),
            std::mem::offset_of!(raw::stepd_step_rec_t, env),
            raw::VERSION
        ));
    }
    // SAFETY: live (contract), and the check above shows the declared prefix matches it.
    let s = unsafe { &*step };
    // SAFETY: NULL or a NUL-terminated string the record owns.
    let node_name = unsafe { read_c_str(s.node_name) }.unwrap_or_default();
    let record = StepRecord {
        job_id: s.step_id.job_id,
        step_id: s.step_id.step_id,
        nnodes: s.nnodes,
        ntasks: s.ntasks,
        nodeid: s.nodeid,
        node_tasks: s.node_tasks,
        uid: s.uid,
        gid: s.gid,
        node_name,
        // SAFETY: `s` is the live record (above); its het arrays are as slurmstepd_job.c
        // built them from the launch request.
        het: unsafe { het_record(s) },
    };
    if record.nodeid >= record.nnodes || record.node_tasks > record.ntasks {
        return Err(format!("slurmstepd's step record cannot be: {record:?}"));
    }
    Ok(record)
}

/// The het step of a record whose component is one of several (`het_job_offset` set and
/// per-node arrays present: srun sends them only with two components or more).
///
/// # Safety
/// `s` must be a live record whose `het_job_task_cnts` and `het_job_tids`, when non-NULL, hold
/// `het_job_nnodes` entries, `het_job_tids[i]` `het_job_task_cnts[i]` entries, and
/// `het_job_tid_offsets`, when non-NULL, `het_job_ntasks` (slurmstepd_job.c copies them so).
unsafe fn het_record(s: &raw::stepd_step_rec_t) -> Option<HetRecord> {
    if s.het_job_offset == NO_VAL
        || s.het_job_nnodes == NO_VAL
        || s.het_job_ntasks == NO_VAL
        || s.het_job_task_offset == NO_VAL
        || s.het_job_task_cnts.is_null()
        || s.het_job_tids.is_null()
    {
        return None;
    }
    // SAFETY: NULL or a NUL-terminated string the record owns.
    let node_list = unsafe { read_c_str(s.het_job_node_list) }?;
    let mut ranks = Vec::with_capacity(s.het_job_nnodes as usize);
    for node in 0..s.het_job_nnodes as usize {
        // SAFETY: node < het_job_nnodes, the length of both arrays (contract).
        let (n, tids) = unsafe { (*s.het_job_task_cnts.add(node), *s.het_job_tids.add(node)) };
        if tids.is_null() {
            return None;
        }
        // SAFETY: het_job_tids[node] holds het_job_task_cnts[node] entries (contract).
        ranks.push(unsafe { std::slice::from_raw_parts(tids, n as usize) }.to_vec());
    }
    let rank_components = (!s.het_job_tid_offsets.is_null()).then(|| {
        // SAFETY: non-NULL, het_job_ntasks entries (contract).
        unsafe { std::slice::from_raw_parts(s.het_job_tid_offsets, s.het_job_ntasks as usize) }
            .to_vec()
    });
    let id = if s.het_job_id != 0 && s.het_job_id != NO_VAL {
        s.het_job_id
    } else {
        s.step_id.job_id
    };
    Some(HetRecord {
        het_job_id: id,
        component: s.het_job_offset,
        task_offset: s.het_job_task_offset,
        node_list,
        ranks,
        rank_components,
    })
}

/// Lets a descriptor survive `exec` (clears `FD_CLOEXEC`): the task hook runs in the forked
/// task just before exec, and keeps exactly its own PMI socket this way. `fcntl` is
/// async-signal-safe, as code after fork in a threaded process must be.
pub fn keep_across_exec(fd: std::os::fd::RawFd) -> std::io::Result<()> {
    // SAFETY: F_GETFD/F_SETFD only read and change the descriptor's flags; an invalid `fd`
    // yields EBADF, which we report.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFD);
        if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// CPUs 0 to 1023 as bits, word `i` bit `j` for CPU `64 i + j`.
pub type CpuBits = [u64; 16];

/// The CPUs the calling thread may run on; async-signal-safe (one syscall, no allocation).
pub fn affinity() -> Option<CpuBits> {
    // SAFETY: cpu_set_t is plain bits, all-zero valid; the kernel writes at most its size.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a live cpu_set_t of the size passed.
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
    if rc != 0 {
        return None;
    }
    let mut bits = [0u64; 16];
    for cpu in 0..bits.len() * 64 {
        // SAFETY: `cpu` is below CPU_SETSIZE (1024 = 16 words of 64), inside `set`.
        if unsafe { libc::CPU_ISSET(cpu, &set) } {
            bits[cpu / 64] |= 1 << (cpu % 64);
        }
    }
    Some(bits)
}

/// In a forked task: closes this process's copy of a pipe's `write_fd`, then waits until
/// every other holder has closed theirs too (EOF on `read_fd`), at most `timeout`; whether
/// they did. Async-signal-safe (close and poll only), as code after fork in a threaded
/// process must be.
pub fn wait_closed(read_fd: RawFd, write_fd: RawFd, timeout: std::time::Duration) -> bool {
    // SAFETY: closes this process's own copy of the descriptor (the parent keeps its own).
    unsafe { libc::close(write_fd) };
    let mut pfd = libc::pollfd {
        fd: read_fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = c_int::try_from(timeout.as_millis()).unwrap_or(c_int::MAX);
    loop {
        // SAFETY: one live pollfd. Nobody writes to the pipe: it becomes readable (POLLHUP)
        // only when the last write end is closed.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n >= 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return n > 0;
        }
    }
}

/// Splits a task that slurmstepd just forked (called in the task hook, before exec) so that
/// how its program ends is known for certain: slurmstepd reaps its children itself, so a
/// `waitid` beside it loses the race for the status about as often as it wins.
///
/// The new child returns `Ok(())` and goes on to exec the program. The calling process, the
/// one slurmstepd knows as the task, becomes its watcher and never returns: it keeps only
/// `report_fd` open, ignores every signal it can (Slurm signals the whole step, so the program
/// gets them), waits for the child, writes `record(code)` to `report_fd` in one `write(2)`
/// (`code` = the exit code, or 128 + the signal), and then ends the same way the program did,
/// so slurmstepd and srun see the program's own status.
pub fn watch_exec<R: AsRef<[u8]>>(
    report_fd: RawFd,
    record: impl FnOnce(i32) -> R,
) -> std::io::Result<()> {
    // SAFETY: the task is single-threaded here (a fresh fork of slurmstepd); the child only
    // returns into slurmstepd's exec path, as if no fork had happened.
    let child = unsafe { libc::fork() };
    if child < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if child == 0 {
        return Ok(());
    }
    // The watcher: from here on only async-signal-safe calls, no allocation.
    // SAFETY: plain fd and signal-disposition calls on this process's own table; report_fd
    // moves to 0, every other descriptor (stdio, slurmstepd's sockets) is closed, so the
    // watcher holds no pipe or socket open past the program.
    unsafe {
        if libc::dup2(report_fd, 0) < 0 {
            libc::_exit(1);
        }
        libc::syscall(libc::SYS_close_range, 1u32, u32::MAX, 0u32);
        for sig in 1..libc::SIGRTMAX() {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP && sig != libc::SIGCHLD {
                libc::signal(sig, libc::SIG_IGN);
            }
        }
    }
    let mut status = 0;
    loop {
        // SAFETY: waits for our own child; `status` is a live int.
        let rc = unsafe { libc::waitpid(child, &mut status, 0) };
        if rc == child {
            break;
        }
        if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            // SAFETY: ends this process without running anything of slurmstepd's.
            unsafe { libc::_exit(1) };
        }
    }
    let signal = libc::WIFSIGNALED(status).then(|| libc::WTERMSIG(status));
    let code = signal.map_or_else(|| libc::WEXITSTATUS(status), |sig| 128 + sig);
    let bytes = record(code);
    let bytes = bytes.as_ref();
    // SAFETY: one write from a live buffer to fd 0 (the report pipe): atomic up to 4096 bytes.
    unsafe { libc::write(0, bytes.as_ptr().cast(), bytes.len()) };
    if let Some(sig) = signal {
        let no_core = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: this process dies by the program's signal (no core: the program dumped
        // its own); unblocked and default, so the kill ends it here.
        unsafe {
            libc::setrlimit(libc::RLIMIT_CORE, &no_core);
            libc::signal(sig, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, sig);
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::kill(libc::getpid(), sig);
        }
    }
    // SAFETY: ends this process with the program's exit code (or 128+signal if the signal
    // did not end it), running nothing of slurmstepd's.
    unsafe { libc::_exit(code) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A zeroed record with the fields prefork reads set; `env` is `&record.env`, as
    /// slurmstepd passes it.
    fn record() -> Box<std::mem::MaybeUninit<raw::stepd_step_rec_t>> {
        let mut rec = Box::new(std::mem::MaybeUninit::<raw::stepd_step_rec_t>::zeroed());
        let p = rec.as_mut_ptr();
        // SAFETY: `p` points to a zeroed record (every field an integer or pointer: zero is
        // valid); only plain fields are written.
        unsafe {
            (*p).step_id.job_id = 100;
            (*p).step_id.step_id = 3;
            (*p).nnodes = 4;
            (*p).ntasks = 8;
            (*p).nodeid = 1;
            (*p).node_tasks = 2;
            (*p).uid = 1234;
            (*p).gid = 99;
            (*p).node_name = c"n2".as_ptr().cast_mut();
        }
        rec
    }

    #[test]
    fn the_record_is_read_when_env_sits_at_the_declared_offset() {
        let mut rec = record();
        let p = rec.as_mut_ptr();
        // SAFETY: `p` is live; only the field's address is taken.
        let env = unsafe { std::ptr::addr_of_mut!((*p).env) };
        // SAFETY: a live record and its own env field, as the hook's contract asks.
        let got = unsafe { step_record(p, env) }.unwrap();
        assert_eq!(
            (got.job_id, got.step_id, got.nodeid, got.uid, got.gid),
            (100, 3, 1, 1234, 99)
        );
        assert_eq!(got.node_name, "n2");
    }

    #[test]
    fn a_record_of_another_layout_or_impossible_counts_is_refused() {
        let mut rec = record();
        let p = rec.as_mut_ptr();
        // SAFETY: `p` is live; only the field's address is taken, then moved one pointer on.
        let shifted = unsafe { std::ptr::addr_of_mut!((*p).env).add(1) }.cast();
        // SAFETY: a live record; the env pointer is checked, never dereferenced, when wrong.
        let e = unsafe { step_record(p, shifted) }.unwrap_err();
        assert!(e.contains("layout"), "{e}");
        // SAFETY: as above; then a node index past the node count.
        unsafe { (*p).nodeid = 4 };
        // SAFETY: a live record and its own env field.
        let e = unsafe { step_record(p, std::ptr::addr_of_mut!((*p).env)) }.unwrap_err();
        assert!(e.contains("cannot be"), "{e}");
        // SAFETY: NULL is allowed by the contract.
        assert!(unsafe { step_record(std::ptr::null(), shifted) }.is_err());
    }
}
