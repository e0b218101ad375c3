//! Slurm 24.11 plugin ABI (Debian 13 trixie: 24.11.5), from `slurm/slurm.h@slurm-24-11-5-1`
//! and `src/interfaces/mpi.h:61-77@slurm-24-11-5-1`; the asserts below are
//! `sys/abi/offsets.c` compiled against the release's installed slurm.h.
//!
//! The structs are declared with every release's in `hooks.rs` (with what changed since
//! 22.05); here is what is 24.11's own: `slurm_kill_job_step`, which 24.11 gave a `flags`
//! argument (`slurm.h:3830-3831`), and the step layout's asserts, with `front_end` (the
//! asserts 24.11 shares with 26.05 are in `hooks.rs`).

#![allow(non_camel_case_types)]

use std::ffi::c_int;

unsafe extern "C" {
    /// Asks slurmctld to send `signal` to every task of a step (public `slurm.h:3830`);
    /// `flags` are `KILL_*`, 0 for none. 0 = sent.
    pub fn slurm_kill_job_step(job_id: u32, step_id: u32, signal: u16, flags: u16) -> c_int;
}

const _: () = {
    use super::{config_key_pair_t, slurm_step_layout_t};
    use std::mem::{offset_of, size_of};
    // sys/abi/offsets.c against slurm.h of Slurm 24.11.5 (x86_64)
    assert!(size_of::<slurm_step_layout_t>() == 88);
    assert!(offset_of!(slurm_step_layout_t, node_cnt) == 40);
    assert!(offset_of!(slurm_step_layout_t, node_list) == 48);
    assert!(offset_of!(slurm_step_layout_t, tasks) == 64);
    assert!(offset_of!(slurm_step_layout_t, task_cnt) == 72);
    assert!(offset_of!(slurm_step_layout_t, tids) == 80);
    assert!(size_of::<config_key_pair_t>() == 16);
    assert!(offset_of!(config_key_pair_t, value) == 8);
};
