//! PMIx groups as the host sees them: the `group` upcall's typed request ([`GroupRequest`]) and its completion with results ([`GroupDone`]).
//!
//! libpmix 4.2.2 (src/server/pmix_server_ops.c `pmix_server_grpconstruct` l.4111–4489,
//! `pmix_server_grpdestruct` l.4491–4630) gathers the group's local members itself, then calls
//! the host's `group` once per server with the sorted members and the first caller's
//! directives (it completes a group of local members only, without a context id, without the
//! host). A construct's directives carry `PMIX_GROUP_ASSIGN_CONTEXT_ID` when the members want
//! a context id (Open MPI 5's `MPI_Comm_create_from_group`,
//! `MPI_Intercomm_create_from_groups` and sessions: ompi/communicator/comm_cid.c@v5.0.10
//! l.343–404), `PMIX_TIMEOUT`, and `PMIX_GROUP_ENDPT_DATA`: this server's packed
//! contribution (its members' modex data and any `PMIX_GROUP_INFO` they gave, each as a
//! `(uint32 index, byte object)` pair). The host completes once every member's server has
//! called: results `PMIX_GROUP_CONTEXT_ID` (size, the same for every member) and
//! `PMIX_GROUP_ENDPT_DATA`, the concatenation of every server's contribution (libpmix reads
//! pairs until the end: `_grpcbfunc` l.3793–4070). libpmix takes the bytes of the returned
//! byte object (PMIX_LOAD_BUFFER clears the pointer and frees them later), so the results
//! are PMIx-allocated copies ([`super::info::InfoArray`]), and the array itself stays alive
//! until libpmix calls the release function. A destruct returns no results. The upcall is
//! installed only where every client can read libpmix's answer ([`Groups`]).

use std::ffi::{CStr, c_char, c_void};
use std::time::Duration;

use super::info::{InfoArray, Value, find_bool, key};
use super::pubsub::{self, Datum};
use super::{Proc, Status};
use crate::raw::pmix as raw;

/// When the host serves groups. libpmix before 4.2.4 answers a construct with the status and
/// the context id only; clients from 4.2.4 on (Open MPI 5 bundles OpenPMIx 5) read the final
/// membership first (src/client/pmix_client_group.c@v5.0.10 l.1114–1130) and fail to unpack
/// such an answer, where without the upcall they get a clean `PMIX_ERR_NOT_SUPPORTED`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Groups {
    /// Only with a libpmix whose answer every client reads (4.2.4 and later).
    #[default]
    Compatible,
    /// Always: the clients are known to be of the server's own libpmix version.
    Always,
}

impl Groups {
    /// Whether the `group` upcall is installed with the libpmix named `version`
    /// (`PMIx_Get_version`: "OpenPMIx 4.2.2rc2, repo rev: …").
    pub fn served(self, version: &str) -> bool {
        if self == Groups::Always {
            return true;
        }
        let numbers: Vec<u32> = version
            .split(|c: char| !c.is_ascii_digit())
            .filter(|w| !w.is_empty())
            .take(3)
            .filter_map(|w| w.parse().ok())
            .collect();
        numbers.len() == 3 && (numbers[0], numbers[1], numbers[2]) >= (4, 2, 4)
    }
}

/// What the members do (`pmix_group_operation_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GroupOp {
    /// `PMIx_Group_construct`.
    Construct,
    /// `PMIx_Group_destruct`.
    Destruct,
}

impl GroupOp {
    /// The operation PMIx named, `None` for one this host does not know.
    pub fn from_raw(op: raw::pmix_group_operation_t) -> Option<GroupOp> {
        match op {
            raw::pmix_group_operation_t_PMIX_GROUP_CONSTRUCT => Some(GroupOp::Construct),
            raw::pmix_group_operation_t_PMIX_GROUP_DESTRUCT => Some(GroupOp::Destruct),
            _ => None,
        }
    }
}

/// The directives of a group operation the host acts on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupDirectives {
    /// `PMIX_GROUP_ASSIGN_CONTEXT_ID`: answer with a context id unique among the groups of
    /// the processes' family.
    pub assign_context_id: bool,
    /// `PMIX_TIMEOUT`.
    pub timeout: Option<Duration>,
    /// `PMIX_GROUP_ENDPT_DATA`: this server's contribution, to be concatenated with the other
    /// servers' and returned.
    pub endpoint_data: Vec<u8>,
}

impl GroupDirectives {
    /// Reads the directives from an info array PMIx passed in.
    ///
    /// # Safety
    /// `info` must be NULL (with `ninfo` 0) or point to `ninfo` valid `pmix_info_t`.
    pub(crate) unsafe fn from_info(info: *const raw::pmix_info_t, ninfo: usize) -> Self {
        // SAFETY: forwarded caller contract (every read below).
        let assign = unsafe { find_bool(info, ninfo, key::GROUP_ASSIGN_CONTEXT_ID) };
        // SAFETY: as above.
        let timeout = unsafe { pubsub::timeout_from_info(info, ninfo) };
        // SAFETY: as above.
        let endpoint_data = unsafe { pubsub::infos(info, ninfo) }
            .iter()
            .filter(|i| {
                // SAFETY: PMIx keys are NUL-terminated within their buffer.
                let k = unsafe { CStr::from_ptr(i.key.as_ptr()) };
                k == key::GROUP_ENDPT_DATA
            })
            // SAFETY: the value belongs to a valid entry.
            .find_map(|i| match unsafe { Datum::from_raw(&i.value) } {
                Ok(Datum::Bytes(b)) => Some(b),
                _ => None,
            })
            .unwrap_or_default();
        GroupDirectives {
            assign_context_id: assign.unwrap_or(false),
            timeout,
            endpoint_data,
        }
    }
}

/// One call of the host's `group` upcall, copied out of PMIx's arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupRequest {
    /// Construct or destruct.
    pub op: GroupOp,
    /// The group's name as its members chose it (Open MPI: a per-communicator tag).
    pub id: String,
    /// Every member, sorted by libpmix.
    pub procs: Vec<Proc>,
    /// What the members asked for.
    pub directives: GroupDirectives,
}

/// What a completed group operation returns to libpmix.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupResults {
    /// `PMIX_GROUP_CONTEXT_ID`, when one was asked for.
    pub context_id: Option<u64>,
    /// `PMIX_GROUP_ENDPT_DATA`: every member server's contribution, concatenated.
    pub endpoint_data: Vec<u8>,
}

impl GroupResults {
    /// The info array handed to libpmix.
    fn to_info(&self) -> Result<InfoArray, Status> {
        let mut entries = Vec::new();
        if let Some(id) = self.context_id {
            let id = usize::try_from(id).map_err(|_| Status::BAD_PARAM)?;
            entries.push((key::GROUP_CONTEXT_ID, Value::Size(id)));
        }
        if !self.endpoint_data.is_empty() {
            entries.push((
                key::GROUP_ENDPT_DATA,
                Value::Bytes(self.endpoint_data.clone()),
            ));
        }
        InfoArray::new(&entries)
    }
}

/// Completes a group operation (`pmix_info_cbfunc_t`) exactly once: with
/// [`GroupDone::complete`]'s status and results, or `PMIX_ERROR` if dropped uncompleted.
pub struct GroupDone {
    pub(crate) cbfunc: raw::pmix_info_cbfunc_t,
    pub(crate) cbdata: *mut c_void,
}

// SAFETY: libpmix's `grpcbfunc` thread-shifts onto its progress thread (PMIX_THREADSHIFT)
// before touching the tracker that `cbdata` is, so any thread may call it once.
unsafe impl Send for GroupDone {}

impl std::fmt::Debug for GroupDone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GroupDone")
    }
}

impl GroupDone {
    /// Hands PMIx `status` and `results`; they stay alive until PMIx releases them.
    pub fn complete(mut self, status: Status, results: GroupResults) {
        self.fire(status, &results);
    }

    /// Fails the operation with `status` (no results).
    pub fn failed(mut self, status: Status) {
        self.fire(status, &GroupResults::default());
    }

    fn fire(&mut self, status: Status, results: &GroupResults) {
        let Some(f) = self.cbfunc.take() else { return };
        let (status, infos) = match results.to_info() {
            Ok(a) => (status, Some(a).filter(|a| !a.is_empty())),
            Err(s) => (s, None),
        };
        let Some(infos) = infos else {
            // SAFETY: PMIx's pair for this operation, used once; no results to release.
            unsafe {
                f(
                    status.0,
                    std::ptr::null_mut(),
                    0,
                    self.cbdata,
                    None,
                    std::ptr::null_mut(),
                )
            };
            return;
        };
        let keep = Box::into_raw(Box::new(infos));
        // SAFETY: `keep` is a live Box<InfoArray> until release_infos(keep) runs.
        let (ptr, n) = unsafe { ((*keep).as_mut_ptr(), (*keep).len()) };
        // SAFETY: PMIx's pair, used once; `ptr[..n]` stays valid until PMIx calls
        // `release_infos(keep)` once it has processed the results (module doc).
        unsafe {
            f(
                status.0,
                ptr,
                n,
                self.cbdata,
                Some(release_infos),
                keep.cast(),
            )
        };
    }
}

impl Drop for GroupDone {
    fn drop(&mut self) {
        self.fire(Status::ERROR, &GroupResults::default());
    }
}

/// Frees results handed to PMIx by [`GroupDone`].
///
/// # Safety
/// `cbdata` must be the `Box<InfoArray>` pointer made by `GroupDone::fire`, released once.
unsafe extern "C" fn release_infos(cbdata: *mut c_void) {
    // SAFETY: by the contract above.
    drop(unsafe { Box::from_raw(cbdata.cast::<InfoArray>()) });
}

/// Copies the `group` upcall's arguments.
///
/// # Safety
/// `grp` must be NULL or a NUL-terminated string, `procs` NULL or `nprocs` valid entries,
/// `info` NULL or `ninfo` valid entries, all valid for the call.
pub(crate) unsafe fn request_from_raw(
    op: raw::pmix_group_operation_t,
    grp: *const c_char,
    procs: *const raw::pmix_proc_t,
    nprocs: usize,
    info: *const raw::pmix_info_t,
    ninfo: usize,
) -> Result<GroupRequest, Status> {
    let op = GroupOp::from_raw(op).ok_or(Status::NOT_SUPPORTED)?;
    if grp.is_null() || procs.is_null() || nprocs == 0 {
        return Err(Status::BAD_PARAM);
    }
    // SAFETY: non-NULL and NUL-terminated by the contract.
    let id = unsafe { CStr::from_ptr(grp) }
        .to_string_lossy()
        .into_owned();
    // SAFETY: `nprocs` valid entries by the contract.
    let procs = unsafe { std::slice::from_raw_parts(procs, nprocs) }
        .iter()
        .map(Proc::from_raw)
        .collect();
    // SAFETY: forwarded contract.
    let directives = unsafe { GroupDirectives::from_info(info, ninfo) };
    Ok(GroupRequest {
        op,
        id,
        procs,
        directives,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// What the fake libpmix callback saw: status, context id, endpoint bytes, and the
    /// release pair to call later.
    type Seen = (
        i32,
        Option<usize>,
        Vec<u8>,
        raw::pmix_release_cbfunc_t,
        usize,
    );
    static SEEN: Mutex<Vec<Seen>> = Mutex::new(Vec::new());

    unsafe extern "C" fn fake_cb(
        status: raw::pmix_status_t,
        info: *mut raw::pmix_info_t,
        ninfo: usize,
        _cbdata: *mut c_void,
        release: raw::pmix_release_cbfunc_t,
        relcb: *mut c_void,
    ) {
        let mut id = None;
        let mut bytes = Vec::new();
        // SAFETY: the array GroupDone handed over, valid until released.
        for i in unsafe { pubsub::infos(info, ninfo) } {
            // SAFETY: as above.
            let k = unsafe { CStr::from_ptr(i.key.as_ptr()) };
            // SAFETY: as above.
            match unsafe { Datum::from_raw(&i.value) } {
                Ok(Datum::Size(n)) if k == key::GROUP_CONTEXT_ID => id = Some(n as usize),
                Ok(Datum::Bytes(b)) if k == key::GROUP_ENDPT_DATA => bytes = b,
                other => panic!("unexpected result {k:?}: {other:?}"),
            }
        }
        SEEN.lock()
            .unwrap()
            .push((status, id, bytes, release, relcb as usize));
    }

    fn take_seen() -> Vec<Seen> {
        std::mem::take(&mut *SEEN.lock().unwrap())
    }

    /// Results reach libpmix typed, stay alive until released; a dropped completion is an
    /// error without results. (One test: the fake callback's record is shared.)
    #[test]
    fn results_are_handed_over_and_released_once() {
        let done = GroupDone {
            cbfunc: Some(fake_cb),
            cbdata: std::ptr::null_mut(),
        };
        let results = GroupResults {
            context_id: Some(7),
            endpoint_data: b"AB".to_vec(),
        };
        done.complete(Status::SUCCESS, results);
        let seen = take_seen();
        assert_eq!(seen.len(), 1);
        let (status, id, bytes, release, relcb) = seen[0].clone();
        assert_eq!((status, id), (Status::SUCCESS.0, Some(7)));
        assert_eq!(bytes, b"AB");
        let release = release.expect("results come with a release function");
        // SAFETY: the pair handed to the callback, called once as libpmix would.
        unsafe { release(relcb as *mut c_void) };

        drop(GroupDone {
            cbfunc: Some(fake_cb),
            cbdata: std::ptr::null_mut(),
        });
        let seen = take_seen();
        assert_eq!(seen.len(), 1);
        assert_eq!((seen[0].0, seen[0].1), (Status::ERROR.0, None));
        assert!(seen[0].2.is_empty() && seen[0].3.is_none());
    }

    #[test]
    fn groups_are_served_by_libpmix_from_4_2_4_or_when_told() {
        let served = |v| Groups::Compatible.served(v);
        assert!(!served("OpenPMIx 4.2.2rc2, repo rev: v4.2.2rc2"));
        assert!(!served("OpenPMIx 4.2.3, repo rev: x"));
        assert!(served("OpenPMIx 4.2.4, repo rev: x"));
        assert!(served("OpenPMIx 5.0.7, repo rev: v5.0.7"));
        assert!(!served(""));
        assert!(Groups::Always.served("OpenPMIx 4.2.2"));
    }

    #[test]
    fn requests_are_copied_typed() {
        let infos = InfoArray::new(&[
            (key::GROUP_ASSIGN_CONTEXT_ID, Value::Bool(true)),
            (key::TIMEOUT, Value::U32(30)),
            (key::GROUP_ENDPT_DATA, Value::Bytes(b"blob".to_vec())),
        ]);
        let mut infos = infos.unwrap();
        let procs: Vec<raw::pmix_proc_t> = [("ns", 0), ("ns", 3)]
            .iter()
            .map(|&(n, r)| {
                Proc {
                    nspace: n.into(),
                    rank: r,
                }
                .to_raw()
                .unwrap()
            })
            .collect();
        let grp = c"tag.1";
        // SAFETY: all arguments live across the call with the lengths given.
        let req = unsafe {
            request_from_raw(
                raw::pmix_group_operation_t_PMIX_GROUP_CONSTRUCT,
                grp.as_ptr(),
                procs.as_ptr(),
                procs.len(),
                infos.as_mut_ptr(),
                infos.len(),
            )
        }
        .unwrap();
        assert_eq!(req.op, GroupOp::Construct);
        assert_eq!(req.id, "tag.1");
        assert_eq!(req.procs.len(), 2);
        assert_eq!(req.procs[1].rank, 3);
        assert_eq!(
            req.directives,
            GroupDirectives {
                assign_context_id: true,
                timeout: Some(Duration::from_secs(30)),
                endpoint_data: b"blob".to_vec(),
            }
        );
        // SAFETY: NULL arrays with zero lengths.
        let bare = unsafe {
            request_from_raw(
                raw::pmix_group_operation_t_PMIX_GROUP_DESTRUCT,
                grp.as_ptr(),
                procs.as_ptr(),
                1,
                std::ptr::null(),
                0,
            )
        }
        .unwrap();
        assert_eq!(bare.op, GroupOp::Destruct);
        assert_eq!(bare.directives, GroupDirectives::default());
        // SAFETY: as above.
        let bad =
            unsafe { request_from_raw(9, grp.as_ptr(), procs.as_ptr(), 1, std::ptr::null(), 0) };
        assert_eq!(bad, Err(Status::NOT_SUPPORTED));
        // SAFETY: as above.
        let none =
            unsafe { request_from_raw(0, grp.as_ptr(), std::ptr::null(), 0, std::ptr::null(), 0) };
        assert_eq!(none, Err(Status::BAD_PARAM));
    }
}
