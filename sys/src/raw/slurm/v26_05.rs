//! Slurm 26.05 plugin ABI (Debian forky: 26.05.5), from `slurm/slurm.h@slurm-26-05-3-1` and
//! `src/interfaces/mpi.h:62-78@slurm-26-05-3-1`; the asserts below are `sys/abi/offsets.c`
//! compiled against the release's installed slurm.h (26.05.5: the mirror's newest tag is
//! 26.05.3, whose `slurm.h` and `mpi.h` declare the same layouts).
//!
//! The structs are declared with every release's in `hooks.rs` (the MPI hook structs are
//! those of 24.11, `mpi.h` unchanged but for line numbers; the step layout lost `front_end`
//! in 25.05), as are the asserts 26.05 shares with 24.11. Here is what is 26.05's own,
//! hidden by `crate::slurm`:
//! - 25.11 made `slurm_kill_job_step` take the step as a `slurm_step_id_t *`
//!   (`slurm.h:3952-3953@slurm-26-05-3-1`; `slurm_pmi.c:398-409` fills it with `sluid` 0
//!   and `step_het_comp` NO_VAL);
//! - the step layout's offsets, without `front_end`.

#![allow(non_camel_case_types)]

use super::slurm_step_id_t;
use std::ffi::c_int;

unsafe extern "C" {
    /// Asks slurmctld to send `signal` to every task of a step (public `slurm.h:3952`);
    /// `flags` are `KILL_*`, 0 for none. 0 = sent. `step_id` is only read.
    pub fn slurm_kill_job_step(step_id: *mut slurm_step_id_t, signal: u16, flags: u16) -> c_int;
}

const _: () = {
    use super::{config_key_pair_t, slurm_step_layout_t};
    use std::mem::{offset_of, size_of};
    // sys/abi/offsets.c against slurm.h of Slurm 26.05.5 (x86_64)
    assert!(size_of::<slurm_step_layout_t>() == 80);
    assert!(offset_of!(slurm_step_layout_t, node_cnt) == 32);
    assert!(offset_of!(slurm_step_layout_t, node_list) == 40);
    assert!(offset_of!(slurm_step_layout_t, tasks) == 56);
    assert!(offset_of!(slurm_step_layout_t, task_cnt) == 64);
    assert!(offset_of!(slurm_step_layout_t, tids) == 72);
    assert!(size_of::<config_key_pair_t>() == 16);
    assert!(offset_of!(config_key_pair_t, value) == 8);
};
