//! The leading fields of slurmstepd's step record, `stepd_step_rec_t`
//! (`src/slurmd/slurmstepd/slurmstepd_job.h`, internal, not shipped by Debian), up to `gid`:
//! what `mpi_p_slurmstepd_prefork` reads to know, from Slurm and not from the user's launch
//! environment, which step it serves and as whom its tasks run.
//!
//! The record changes in every release; these fields keep their order from 22.05 to 26.05
//! but for two insertions: 23.11 added `node_addrs` and `node_list` after `node_tasks`
//! (`slurmstepd_job.h@slurm-24-11-5-1`), and 25.05 `het_job_step_task_cnts` after
//! `het_job_step_cnt` (`@slurm-26-05-3-1`), and `slurm_step_id_t` grew a leading `sluid` in
//! 24.11. Only a prefix is declared: the plugin reads the record through the pointer Slurm
//! hands it and never creates, copies or sizes one. slurmstepd passes `&step->env` beside the
//! record, so the offset of `env` is checked at run time on every step
//! ([`crate::slurm::step_record`]); the asserts below pin the offsets this declaration gives,
//! counted by hand from each release's header (x86_64, glibc: `pthread_cond_t` 48 bytes,
//! `pthread_mutex_t` 40, every enum 4).

use super::slurm_step_id_t;
use std::ffi::{c_char, c_int, c_void};

/// `stepd_step_rec_t`, up to `gid`. Fields the plugin does not read are private.
#[repr(C)]
pub struct stepd_step_rec_t {
    alias_list: *mut c_char,
    container: *mut c_void,
    state: c_int,
    state_cond: libc::pthread_cond_t,
    state_mutex: libc::pthread_mutex_t,
    /// The step slurmstepd runs.
    pub step_id: slurm_step_id_t,
    array_job_id: u32,
    array_task_id: u32,
    /// Nodes of the step.
    pub nnodes: u32,
    /// Tasks of the step.
    pub ntasks: u32,
    /// This node's index in the step.
    pub nodeid: u32,
    /// Tasks on this node.
    pub node_tasks: u32,
    #[cfg(not(slurm_22_05))]
    node_addrs: *mut c_void,
    #[cfg(not(slurm_22_05))]
    node_list: *mut c_char,
    /// Het job id (the first component's job id), NO_VAL when not a het step.
    pub het_job_id: u32,
    /// Nodes of every component of the het step, NO_VAL when not a het step.
    pub het_job_nnodes: u32,
    /// Nodes of every component, node-index order of `het_job_tids` (srun sorts it when no
    /// node is in two components).
    pub het_job_node_list: *mut c_char,
    /// This component's first node in srun's concatenation of the components' lists.
    pub het_job_node_offset: u32,
    /// Tasks of every component, NO_VAL when not a het step.
    pub het_job_ntasks: u32,
    /// This component's index (Slurm's "het job offset"), NO_VAL when not a het step.
    pub het_job_offset: u32,
    het_job_step_cnt: u32,
    #[cfg(slurm_26_05)]
    het_job_step_task_cnts: *mut u32,
    /// This component's first global rank.
    pub het_job_task_offset: u32,
    /// Tasks per node of the het step (`het_job_nnodes` entries), NULL with one component.
    pub het_job_task_cnts: *mut u16,
    /// Global ranks per node of the het step: `het_job_tids[node][i]`, NULL with one component.
    pub het_job_tids: *mut *mut u32,
    /// Component of each global rank (`het_job_ntasks` entries), or NULL.
    pub het_job_tid_offsets: *mut u32,
    task_cnts: *mut u16,
    cpus_per_task: u32,
    debug: u32,
    job_mem: u64,
    step_mem: u64,
    cpus: u16,
    argc: u32,
    /// The job environment; the hook's `char ***env` is its address.
    pub env: *mut *mut c_char,
    argv: *mut *mut c_char,
    cwd: *mut c_char,
    task_dist: c_int,
    /// This node's NodeName.
    pub node_name: *mut c_char,
    cpu_bind_type: c_int,
    cpu_bind: *mut c_char,
    mem_bind_type: c_int,
    mem_bind: *mut c_char,
    accel_bind_type: u16,
    cpu_freq_min: u32,
    cpu_freq_max: u32,
    cpu_freq_gov: u32,
    switch_step: *mut c_void,
    /// The uid the tasks run as (from the job credential slurmd verified).
    pub uid: u32,
    user_name: *mut c_char,
    pw_gecos: *mut c_char,
    pw_dir: *mut c_char,
    pw_shell: *mut c_char,
    /// The tasks' primary gid.
    pub gid: u32,
}

const _: () = {
    use std::mem::offset_of;
    // (nnodes, env, node_name, uid, gid), counted from each release's slurmstepd_job.h.
    #[cfg(slurm_22_05)]
    let want = (132, 256, 288, 352, 392);
    #[cfg(slurm_24_11)]
    let want = (144, 280, 312, 376, 416);
    #[cfg(slurm_26_05)]
    let want = (144, 288, 320, 384, 424);
    assert!(offset_of!(stepd_step_rec_t, nnodes) == want.0);
    assert!(offset_of!(stepd_step_rec_t, env) == want.1);
    assert!(offset_of!(stepd_step_rec_t, node_name) == want.2);
    assert!(offset_of!(stepd_step_rec_t, uid) == want.3);
    assert!(offset_of!(stepd_step_rec_t, gid) == want.4);
};
