//! Typed arguments and completions of the name-service and connect upcalls (`publish`, `lookup`, `unpublish`, `connect`, `disconnect`).
//!
//! What libpmix hands the host (openpmix v4.2.2):
//! - `publish(proc, info[])`: the client's whole info array, data and directives mixed
//!   (`PMIX_RANGE`, `PMIX_PERSISTENCE`, `PMIX_TIMEOUT`), plus `PMIX_USERID` appended by
//!   libpmix itself (`pmix_server_publish`, src/server/pmix_server_ops.c l.1246). The host
//!   tells them apart by key, as PRRTE's data server does (src/runtime/data_server/ds_publish.c
//!   l.123–135 in prrte v3.0.9): `Published::from_info`.
//! - `lookup(proc, keys, info[])` and `unpublish(proc, keys, info[])`: keys as an argv, the
//!   info only directives (`PMIX_WAIT`, `PMIX_TIMEOUT`, `PMIX_RANGE`, `PMIX_USERID`).
//! - `lookup`'s `pmix_lookup_cbfunc_t` packs the `pmix_pdata_t` array into the client's reply
//!   before it returns and does not thread-shift (`lookup_cbfunc`, src/server/pmix_server.c
//!   l.3231), so [`LookupDone`] owns the array only until the call returns and frees it then.
//! - `connect`/`disconnect(procs, info[])` come once per node, when every local participant
//!   has called (a tracker like a fence's); when every participant is local libpmix completes
//!   them itself and never calls up (`pmix_server_connect`, pmix_server_ops.c l.2017).

use std::ffi::{CStr, CString, c_char, c_void};
use std::time::Duration;

use super::{Proc, Status};
use crate::raw::pmix as raw;

/// A published value: the types Open MPI publishes (strings: port names, member lists) and
/// the plain scalars and byte objects other PMIx clients may.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Datum {
    /// `PMIX_STRING`.
    Str(String),
    /// `PMIX_BYTE_OBJECT`.
    Bytes(Vec<u8>),
    /// `PMIX_BOOL`.
    Bool(bool),
    /// `PMIX_INT`.
    Int(i32),
    /// `PMIX_INT32`.
    I32(i32),
    /// `PMIX_INT64`.
    I64(i64),
    /// `PMIX_UINT32`.
    U32(u32),
    /// `PMIX_UINT64`.
    U64(u64),
    /// `PMIX_SIZE`.
    Size(u64),
}

impl Datum {
    /// Copies a PMIx value; `Err` names the PMIx type when it is not one of ours.
    ///
    /// # Safety
    /// `v` must be a valid `pmix_value_t` (its union member the one its type names).
    pub(crate) unsafe fn from_raw(v: &raw::pmix_value_t) -> Result<Datum, String> {
        let ty = u32::from(v.type_);
        // SAFETY: every union member read is the one `type_` names; strings and byte objects
        // are valid for `v`'s life by the caller's contract; PMIx_Data_type_string returns a
        // static string.
        let d = unsafe {
            match ty {
                raw::PMIX_STRING => {
                    let s = v.data.string;
                    if s.is_null() {
                        Datum::Str(String::new())
                    } else {
                        Datum::Str(CStr::from_ptr(s).to_string_lossy().into_owned())
                    }
                }
                raw::PMIX_BYTE_OBJECT => {
                    let bo = v.data.bo;
                    if bo.bytes.is_null() || bo.size == 0 {
                        Datum::Bytes(Vec::new())
                    } else {
                        Datum::Bytes(std::slice::from_raw_parts(bo.bytes.cast(), bo.size).to_vec())
                    }
                }
                raw::PMIX_BOOL => Datum::Bool(v.data.flag),
                raw::PMIX_INT => Datum::Int(v.data.integer),
                raw::PMIX_INT32 => Datum::I32(v.data.int32),
                raw::PMIX_INT64 => Datum::I64(v.data.int64),
                raw::PMIX_UINT32 => Datum::U32(v.data.uint32),
                raw::PMIX_UINT64 => Datum::U64(v.data.uint64),
                raw::PMIX_SIZE => Datum::Size(v.data.size as u64),
                _ => {
                    // SAFETY: PMIx returns a static string for every type number.
                    let name = super::library::pmix_loaded().PMIx_Data_type_string(v.type_);
                    let name = if name.is_null() {
                        format!("type {ty}")
                    } else {
                        CStr::from_ptr(name).to_string_lossy().into_owned()
                    };
                    return Err(format!("published values of type {name} are not served"));
                }
            }
        };
        Ok(d)
    }

    /// Loads the value into `slot` (`PMIx_Value_load` copies it into PMIx-allocated memory).
    fn load(&self, slot: &mut raw::pmix_value_t) -> Result<(), Status> {
        let pmix = super::library::pmix_loaded();
        let mut load = |data: *const c_void, ty: u32| {
            // SAFETY: `slot` is zeroed (PMIX_UNDEF); `data` points to a live value of the C
            // type `ty` names (a char* itself for strings), which PMIx copies before returning.
            super::check(unsafe { pmix.PMIx_Value_load(slot, data, ty as raw::pmix_data_type_t) })
        };
        match self {
            Datum::Str(s) => {
                let c = CString::new(s.as_str()).map_err(|_| Status::BAD_PARAM)?;
                load(c.as_ptr().cast(), raw::PMIX_STRING)
            }
            Datum::Bytes(b) => {
                let bo = raw::pmix_byte_object_t {
                    bytes: b.as_ptr().cast_mut().cast(),
                    size: b.len(),
                };
                load(
                    (&bo as *const raw::pmix_byte_object_t).cast(),
                    raw::PMIX_BYTE_OBJECT,
                )
            }
            Datum::Bool(x) => load((x as *const bool).cast(), raw::PMIX_BOOL),
            Datum::Int(x) => load((x as *const i32).cast(), raw::PMIX_INT),
            Datum::I32(x) => load((x as *const i32).cast(), raw::PMIX_INT32),
            Datum::I64(x) => load((x as *const i64).cast(), raw::PMIX_INT64),
            Datum::U32(x) => load((x as *const u32).cast(), raw::PMIX_UINT32),
            Datum::U64(x) => load((x as *const u64).cast(), raw::PMIX_UINT64),
            Datum::Size(x) => {
                let n = *x as usize;
                load((&n as *const usize).cast(), raw::PMIX_SIZE)
            }
        }
    }
}

/// The directives of a publish, lookup or unpublish (the info keys that are not data).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Directives {
    /// `PMIX_RANGE` (`pmix_data_range_t`), if given.
    pub range: Option<u8>,
    /// `PMIX_PERSISTENCE` (`pmix_persistence_t`), if given.
    pub persistence: Option<u8>,
    /// `PMIX_WAIT`: a lookup waits until every key is published.
    pub wait: bool,
    /// `PMIX_TIMEOUT` (seconds; 0 or absent: the host's default).
    pub timeout: Option<Duration>,
    /// `PMIX_USERID`, which libpmix adds: the client's effective uid.
    pub uid: Option<u32>,
}

/// `pmix_persistence_t` `PMIX_PERSIST_FIRST_READ`: delete the datum once it was looked up.
pub const PERSIST_FIRST_READ: u8 = raw::PMIX_PERSIST_FIRST_READ as u8;

/// Whether `k` is a directive key ([`Directives`]), never published as data.
fn directive(d: &mut Directives, k: &CStr, v: &raw::pmix_value_t) -> bool {
    let ty = u32::from(v.type_);
    let int = |v: &raw::pmix_value_t| -> Option<i64> {
        // SAFETY: each member read is the one the type names.
        unsafe {
            match u32::from(v.type_) {
                raw::PMIX_INT => Some(i64::from(v.data.integer)),
                raw::PMIX_INT32 => Some(i64::from(v.data.int32)),
                raw::PMIX_UINT32 => Some(i64::from(v.data.uint32)),
                raw::PMIX_UINT16 => Some(i64::from(v.data.uint16)),
                raw::PMIX_UINT8 | raw::PMIX_PERSIST | raw::PMIX_DATA_RANGE => {
                    Some(i64::from(v.data.uint8))
                }
                raw::PMIX_SIZE => Some(v.data.size as i64),
                _ => None,
            }
        }
    };
    let is = |name: &[u8]| k.to_bytes_with_nul() == name;
    if is(raw::PMIX_RANGE) {
        d.range = int(v).map(|n| n as u8);
    } else if is(raw::PMIX_PERSISTENCE) {
        d.persistence = int(v).map(|n| n as u8);
    } else if is(raw::PMIX_WAIT) {
        // A bool (Open MPI) or a count of keys to wait for (the standard; 0 = all): we wait
        // for all either way.
        // SAFETY: read only when the type says PMIX_BOOL.
        d.wait = ty != raw::PMIX_BOOL || unsafe { v.data.flag };
    } else if is(raw::PMIX_TIMEOUT) {
        d.timeout = int(v)
            .filter(|&n| n > 0)
            .map(|n| Duration::from_secs(n as u64));
    } else if is(raw::PMIX_USERID) {
        d.uid = int(v).map(|n| n as u32);
    } else {
        return is(raw::PMIX_GRPID);
    }
    true
}

/// What a client published: its data and directives.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Published {
    /// The data, in the client's order.
    pub data: Vec<(String, Datum)>,
    /// How (range, persistence).
    pub directives: Directives,
}

impl Published {
    /// Splits a publish's info array into data and directives; `Err` names a datum of a
    /// type not served.
    ///
    /// # Safety
    /// `info` must be NULL or point to `ninfo` valid `pmix_info_t`.
    pub(crate) unsafe fn from_info(
        info: *const raw::pmix_info_t,
        ninfo: usize,
    ) -> Result<Published, String> {
        let mut out = Published::default();
        // SAFETY: forwarded contract.
        for i in unsafe { infos(info, ninfo) } {
            // SAFETY: PMIx keys are NUL-terminated within their buffer.
            let k = unsafe { CStr::from_ptr(i.key.as_ptr()) };
            if directive(&mut out.directives, k, &i.value) {
                continue;
            }
            let key = k.to_string_lossy().into_owned();
            // SAFETY: a valid value of a valid info.
            let value = unsafe { Datum::from_raw(&i.value) }.map_err(|e| format!("{key}: {e}"))?;
            out.data.push((key, value));
        }
        Ok(out)
    }
}

/// The directives of a lookup or unpublish's info array (other keys are ignored).
///
/// # Safety
/// `info` must be NULL or point to `ninfo` valid `pmix_info_t`.
pub(crate) unsafe fn directives_from_info(
    info: *const raw::pmix_info_t,
    ninfo: usize,
) -> Directives {
    let mut d = Directives::default();
    // SAFETY: forwarded contract.
    for i in unsafe { infos(info, ninfo) } {
        // SAFETY: PMIx keys are NUL-terminated within their buffer.
        let k = unsafe { CStr::from_ptr(i.key.as_ptr()) };
        directive(&mut d, k, &i.value);
    }
    d
}

/// The `PMIX_TIMEOUT` of a connect or disconnect, if any.
///
/// # Safety
/// `info` must be NULL or point to `ninfo` valid `pmix_info_t`.
pub(crate) unsafe fn timeout_from_info(
    info: *const raw::pmix_info_t,
    ninfo: usize,
) -> Option<Duration> {
    // SAFETY: forwarded contract.
    unsafe { directives_from_info(info, ninfo) }.timeout
}

/// # Safety
/// `info` must be NULL or point to `ninfo` valid `pmix_info_t` that outlive `'a`.
pub(crate) unsafe fn infos<'a>(
    info: *const raw::pmix_info_t,
    ninfo: usize,
) -> &'a [raw::pmix_info_t] {
    if info.is_null() || ninfo == 0 {
        return &[];
    }
    // SAFETY: non-NULL with `ninfo` entries by the contract.
    unsafe { std::slice::from_raw_parts(info, ninfo) }
}

/// Copies a NULL-terminated argv of keys.
///
/// # Safety
/// `keys` must be NULL or a NULL-terminated array of NUL-terminated strings.
pub(crate) unsafe fn keys_from_argv(keys: *mut *mut c_char) -> Vec<String> {
    let mut out = Vec::new();
    if keys.is_null() {
        return out;
    }
    for i in 0.. {
        // SAFETY: the array is NULL-terminated; `i` never passes the NULL.
        let k = unsafe { *keys.add(i) };
        if k.is_null() {
            break;
        }
        // SAFETY: each entry is a NUL-terminated string valid for the call.
        out.push(unsafe { CStr::from_ptr(k) }.to_string_lossy().into_owned());
    }
    out
}

/// One lookup result: who published `key` and its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The publishing process.
    pub owner: Proc,
    /// The key.
    pub key: String,
    /// The value.
    pub value: Datum,
}

/// Completes a lookup (`pmix_lookup_cbfunc_t`) exactly once: with the data given to
/// [`LookupDone::complete`], or with `PMIX_ERROR` and no data if dropped uncompleted.
pub struct LookupDone {
    pub(crate) cbfunc: raw::pmix_lookup_cbfunc_t,
    pub(crate) cbdata: *mut c_void,
}

// SAFETY: the cbdata is libpmix's caddy for this one lookup, touched only by the callback,
// which packs the reply and queues it to libpmix's progress thread (PMIX_SERVER_QUEUE_REPLY),
// so any thread may call it once.
unsafe impl Send for LookupDone {}

impl std::fmt::Debug for LookupDone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LookupDone")
    }
}

impl LookupDone {
    /// Hands PMIx `status` and the data found (an array owned here until the call returns:
    /// libpmix packs it before returning).
    pub fn complete(mut self, status: Status, found: Vec<Found>) {
        self.fire(status, found);
    }

    fn fire(&mut self, status: Status, found: Vec<Found>) {
        let Some(f) = self.cbfunc.take() else { return };
        let mut pdata: Vec<raw::pmix_pdata_t> = Vec::with_capacity(found.len());
        let mut status = status;
        for item in &found {
            let mut p = raw::pmix_pdata_t::default();
            match item.owner.to_raw() {
                Some(owner) => p.proc_ = owner,
                None => status = Status::ERROR,
            }
            let key = item.key.as_bytes();
            if key.len() > raw::PMIX_MAX_KEYLEN as usize || key.contains(&0) {
                status = Status::BAD_PARAM;
            }
            for (dst, &b) in p
                .key
                .iter_mut()
                .zip(key.iter().take(raw::PMIX_MAX_KEYLEN as usize))
            {
                *dst = b as c_char;
            }
            if let Err(s) = item.value.load(&mut p.value) {
                status = s;
            }
            pdata.push(p);
        }
        let (ptr, n) = if pdata.is_empty() || !status.is_success() {
            (std::ptr::null_mut(), 0)
        } else {
            (pdata.as_mut_ptr(), pdata.len())
        };
        // SAFETY: PMIx's pair for this lookup, used once; `ptr[..n]` lives until the call
        // returns, and libpmix's lookup_cbfunc packs it before returning (module doc).
        unsafe { f(status.0, ptr, n, self.cbdata) };
        let pmix = super::library::pmix_loaded();
        for p in pdata.iter_mut() {
            // SAFETY: each value is zeroed or loaded by PMIx_Value_load; freed once here.
            unsafe { pmix.PMIx_Value_destruct(&mut p.value) };
        }
    }
}

impl Drop for LookupDone {
    fn drop(&mut self) {
        self.fire(Status::ERROR, Vec::new());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pmix::info::{InfoArray, Value, key};

    #[test]
    fn publish_info_splits_into_data_and_directives() {
        let mut a = InfoArray::new(&[
            (c"svc", Value::Str("port#1".into())),
            (key::TIMEOUT, Value::U32(7)),
            (c"n", Value::U32(3)),
            (key::WAIT, Value::Bool(true)),
        ])
        .unwrap();
        let (p, n) = (a.as_mut_ptr(), a.len());
        // SAFETY: `a` holds `n` valid entries and outlives the call.
        let got = unsafe { Published::from_info(p, n) }.unwrap();
        assert_eq!(
            got.data,
            vec![
                ("svc".to_string(), Datum::Str("port#1".into())),
                ("n".to_string(), Datum::U32(3)),
            ]
        );
        assert_eq!(got.directives.timeout, Some(Duration::from_secs(7)));
        assert!(got.directives.wait);
        // SAFETY: as above.
        let d = unsafe { directives_from_info(p, n) };
        assert!(d.wait && d.range.is_none());
        // SAFETY: NULL with 0 entries.
        let none = unsafe { directives_from_info(std::ptr::null(), 0) };
        assert_eq!(none, Directives::default());
    }

    #[test]
    fn data_round_trips_through_pmix_values() {
        for d in [
            Datum::Str("a b".into()),
            Datum::Bytes(vec![0, 1, 2]),
            Datum::Bool(true),
            Datum::Int(-3),
            Datum::I64(-1 << 40),
            Datum::U64(1 << 40),
            Datum::Size(12),
        ] {
            let mut v = raw::pmix_value_t::default();
            d.load(&mut v).unwrap();
            // SAFETY: just loaded.
            assert_eq!(unsafe { Datum::from_raw(&v) }.unwrap(), d);
            // SAFETY: loaded by PMIx_Value_load, freed once.
            unsafe { super::super::library::pmix_loaded().PMIx_Value_destruct(&mut v) };
        }
    }

    /// What the fake lookup callback saw: status and (rank, key, value) per pdata.
    type Seen = std::sync::Mutex<Vec<(i32, Vec<(u32, String, Datum)>)>>;

    /// Stands in for libpmix's lookup_cbfunc: copies what it is handed, as libpmix packs it.
    unsafe extern "C" fn seen_cb(
        status: raw::pmix_status_t,
        data: *mut raw::pmix_pdata_t,
        ndata: usize,
        cbdata: *mut c_void,
    ) {
        // SAFETY: the test passes a `&Seen` as cbdata, alive for the call.
        let seen = unsafe { &*(cbdata as *const Seen) };
        let items = if data.is_null() {
            Vec::new()
        } else {
            // SAFETY: `ndata` valid entries for the call (LookupDone's contract).
            unsafe { std::slice::from_raw_parts(data, ndata) }
                .iter()
                .map(|p| {
                    // SAFETY: keys NUL-terminated within their buffer, values loaded by PMIx.
                    let key = unsafe { CStr::from_ptr(p.key.as_ptr()) };
                    // SAFETY: as above.
                    let value = unsafe { Datum::from_raw(&p.value) }.unwrap();
                    (p.proc_.rank, key.to_string_lossy().into_owned(), value)
                })
                .collect()
        };
        seen.lock().unwrap().push((status, items));
    }

    #[test]
    fn lookup_done_hands_pmix_typed_pdata_once_and_errors_when_dropped() {
        let seen: Seen = Default::default();
        let done = |seen: &Seen| LookupDone {
            cbfunc: Some(seen_cb),
            cbdata: (seen as *const Seen).cast_mut().cast(),
        };
        let owner = Proc {
            nspace: "job".into(),
            rank: 3,
        };
        done(&seen).complete(
            Status::SUCCESS,
            vec![
                Found {
                    owner: owner.clone(),
                    key: "port".into(),
                    value: Datum::Str("p#1".into()),
                },
                Found {
                    owner,
                    key: "n".into(),
                    value: Datum::Int(7),
                },
            ],
        );
        drop(done(&seen));
        done(&seen).complete(Status::NOT_FOUND, Vec::new());
        let seen = seen.into_inner().unwrap();
        assert_eq!(
            seen,
            vec![
                (
                    Status::SUCCESS.0,
                    vec![
                        (3, "port".to_string(), Datum::Str("p#1".into())),
                        (3, "n".to_string(), Datum::Int(7)),
                    ]
                ),
                (Status::ERROR.0, vec![]),
                (Status::NOT_FOUND.0, vec![]),
            ]
        );
    }
}
