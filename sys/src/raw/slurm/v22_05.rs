//! Slurm 22.05 plugin ABI, from `slurm/slurm.h` and
//! `src/common/slurm_mpi.h:61-78@slurm-22-05-8-1`; the asserts below are `sys/abi/offsets.c`
//! compiled against the release's installed slurm.h (Debian 12: 22.05.8).

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int};

/// `slurm_addr_t`.
pub type slurm_addr_t = libc::sockaddr_storage;

/// `slurm_step_id_t` (before 24.11 added a leading `sluid`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct slurm_step_id_t {
    /// Job id.
    pub job_id: u32,
    /// Heterogeneous component, NO_VAL when not a het step.
    pub step_het_comp: u32,
    /// Step id.
    pub step_id: u32,
}

/// `slurm_step_layout_t`: where the step's tasks run.
#[repr(C)]
#[derive(Debug)]
pub struct slurm_step_layout_t {
    /// Front-end node name, or NULL.
    pub front_end: *mut c_char,
    /// Number of nodes.
    pub node_cnt: u32,
    /// Node names, a hostlist expression.
    pub node_list: *mut c_char,
    /// Plane size for plane distribution.
    pub plane_size: u16,
    /// Lowest protocol version of the step's nodes.
    pub start_protocol_ver: u16,
    /// Tasks on each node (`node_cnt` entries).
    pub tasks: *mut u16,
    /// Total tasks.
    pub task_cnt: u32,
    /// Task distribution.
    pub task_dist: u32,
    /// Global task ids per node: `tids[node][i]`.
    pub tids: *mut *mut u32,
}

/// `mpi_plugin_client_info_t`, given to `mpi_p_client_prelaunch` in srun.
#[repr(C)]
#[derive(Debug)]
pub struct mpi_plugin_client_info_t {
    /// Het job id, NO_VAL when not het.
    pub het_job_id: u32,
    /// Task offset of this component, NO_VAL when not het.
    pub het_job_task_offset: u32,
    /// The step.
    pub step_id: slurm_step_id_t,
    /// Its layout.
    pub step_layout: *mut slurm_step_layout_t,
}

/// `mpi_plugin_task_info_t`, given to `mpi_p_slurmstepd_task` in each task.
#[repr(C)]
#[derive(Debug)]
pub struct mpi_plugin_task_info_t {
    /// srun's address.
    pub client: *mut slurm_addr_t,
    /// Global rank.
    pub gtaskid: u32,
    /// Rank on this node.
    pub ltaskid: i32,
    /// Ranks on this node.
    pub ltasks: u32,
    /// Nodes of the step.
    pub nnodes: u32,
    /// This node's index in the step.
    pub nodeid: u32,
    /// Ranks of the step.
    pub ntasks: u32,
    /// This node's address.
    pub self_: *mut slurm_addr_t,
    /// The step.
    pub step_id: slurm_step_id_t,
}

/// The name 23.02 gave [`mpi_plugin_client_info_t`] (same layout): what every release's
/// module calls the prelaunch hook's struct.
pub type mpi_step_info_t = mpi_plugin_client_info_t;
/// The name 23.02 gave [`mpi_plugin_task_info_t`] (same layout until 23.11 removed `self`).
pub type mpi_task_info_t = mpi_plugin_task_info_t;

unsafe extern "C" {
    /// Asks slurmctld to send `signal` to every task of a step (public `slurm.h:3560`); 0 = sent.
    pub fn slurm_kill_job_step(job_id: u32, step_id: u32, signal: u16) -> c_int;
}

const _: () = {
    use super::config_key_pair_t;
    use std::mem::{offset_of, size_of};
    // sys/abi/offsets.c against slurm.h of Slurm 22.05.8 (x86_64)
    assert!(size_of::<slurm_step_id_t>() == 12);
    assert!(offset_of!(slurm_step_id_t, job_id) == 0);
    assert!(offset_of!(slurm_step_id_t, step_het_comp) == 4);
    assert!(offset_of!(slurm_step_id_t, step_id) == 8);
    assert!(size_of::<slurm_step_layout_t>() == 56);
    assert!(offset_of!(slurm_step_layout_t, node_cnt) == 8);
    assert!(offset_of!(slurm_step_layout_t, node_list) == 16);
    assert!(offset_of!(slurm_step_layout_t, tasks) == 32);
    assert!(offset_of!(slurm_step_layout_t, task_cnt) == 40);
    assert!(offset_of!(slurm_step_layout_t, tids) == 48);
    assert!(size_of::<mpi_plugin_client_info_t>() == 32);
    assert!(offset_of!(mpi_plugin_client_info_t, step_id) == 8);
    assert!(offset_of!(mpi_plugin_client_info_t, step_layout) == 24);
    assert!(size_of::<mpi_plugin_task_info_t>() == 56);
    assert!(offset_of!(mpi_plugin_task_info_t, gtaskid) == 8);
    assert!(offset_of!(mpi_plugin_task_info_t, ltaskid) == 12);
    assert!(offset_of!(mpi_plugin_task_info_t, nodeid) == 24);
    assert!(offset_of!(mpi_plugin_task_info_t, ntasks) == 28);
    assert!(offset_of!(mpi_plugin_task_info_t, step_id) == 40);
    assert!(size_of::<config_key_pair_t>() == 16);
    assert!(offset_of!(config_key_pair_t, value) == 8);
};
