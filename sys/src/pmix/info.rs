//! Owned `pmix_info_t` arrays built from Rust values, and the `PMIX_*` keys as C strings.

use std::ffi::{CStr, CString, c_void};

use super::{Status, check};
use crate::raw::pmix as raw;

/// The `PMIX_*` attribute keys the shim uses, as `&CStr` (pmix_common.h defines them as strings).
pub mod key {
    use crate::raw::pmix as raw;
    use std::ffi::CStr;

    macro_rules! keys {
        ($($(#[$doc:meta])* $name:ident = $raw:ident;)*) => {$(
            $(#[$doc])*
            pub const $name: &CStr = match CStr::from_bytes_with_nul(raw::$raw) {
                Ok(k) => k,
                Err(_) => panic!("PMIx keys are NUL-terminated literals"),
            };
        )*};
    }

    keys! {
        /// `pmix.spawned` (bool).
        SPAWNED = PMIX_SPAWNED;
        /// `pmix.tmpdir` (string).
        TMPDIR = PMIX_TMPDIR;
        /// `pmix.nsdir` (string).
        NSDIR = PMIX_NSDIR;
        /// `pmix.procdir` (string).
        PROCDIR = PMIX_PROCDIR;
        /// `pmix.tdir.rmclean` (bool).
        TDIR_RMCLEAN = PMIX_TDIR_RMCLEAN;
        /// `pmix.jobid` (string).
        JOBID = PMIX_JOBID;
        /// `pmix.nodeid` (u32).
        NODEID = PMIX_NODEID;
        /// `pmix.univ.size` (u32).
        UNIV_SIZE = PMIX_UNIV_SIZE;
        /// `pmix.ndosub` (bool): more processes on the node than its CPUs.
        NODE_OVERSUBSCRIBED = PMIX_NODE_OVERSUBSCRIBED;
        /// `pmix.job.size` (u32).
        JOB_SIZE = PMIX_JOB_SIZE;
        /// `pmix.job.napps` (u32).
        JOB_NUM_APPS = PMIX_JOB_NUM_APPS;
        /// `pmix.app.size` (u32).
        APP_SIZE = PMIX_APP_SIZE;
        /// `pmix.local.size` (u32).
        LOCAL_SIZE = PMIX_LOCAL_SIZE;
        /// `pmix.node.size` (u32).
        NODE_SIZE = PMIX_NODE_SIZE;
        /// `pmix.max.size` (u32).
        MAX_PROCS = PMIX_MAX_PROCS;
        /// `pmix.num.nodes` (u32).
        NUM_NODES = PMIX_NUM_NODES;
        /// `pmix.nmap` (string, `PMIx_generate_regex`).
        NODE_MAP = PMIX_NODE_MAP;
        /// `pmix.pmap` (string, `PMIx_generate_ppn`).
        PROC_MAP = PMIX_PROC_MAP;
        /// `pmix.anlmap` (string, the PMI `(vector,...)` mapping).
        ANL_MAP = PMIX_ANL_MAP;
        /// `pmix.lpeers` (string, comma-separated local ranks).
        LOCAL_PEERS = PMIX_LOCAL_PEERS;
        /// `pmix.lldr` (rank).
        LOCALLDR = PMIX_LOCALLDR;
        /// `pmix.pdata` (data array of info, one per rank).
        PROC_DATA = PMIX_PROC_DATA;
        /// `pmix.rank` (rank).
        RANK = PMIX_RANK;
        /// `pmix.appnum` (u32).
        APPNUM = PMIX_APPNUM;
        /// `pmix.aldr` (rank).
        APPLDR = PMIX_APPLDR;
        /// `pmix.grank` (rank).
        GLOBAL_RANK = PMIX_GLOBAL_RANK;
        /// `pmix.apprank` (rank).
        APP_RANK = PMIX_APP_RANK;
        /// `pmix.lrank` (u16).
        LOCAL_RANK = PMIX_LOCAL_RANK;
        /// `pmix.nrank` (u16).
        NODE_RANK = PMIX_NODE_RANK;
        /// `pmix.hname` (string).
        HOSTNAME = PMIX_HOSTNAME;
        /// `pmix.locstr` (string, `PMIx_server_generate_locality_string`).
        LOCALITY_STRING = PMIX_LOCALITY_STRING;
        /// `pmix.cpuset` (string, `PMIx_server_generate_cpuset_string`).
        CPUSET = PMIX_CPUSET;
        /// `pmix.srvr.tmpdir` (string).
        SERVER_TMPDIR = PMIX_SERVER_TMPDIR;
        /// `pmix.sys.tmpdir` (string).
        SYSTEM_TMPDIR = PMIX_SYSTEM_TMPDIR;
        /// `pmix.srvr.tool` (bool): accept tool connections, write their rendezvous files.
        SERVER_TOOL_SUPPORT = PMIX_SERVER_TOOL_SUPPORT;
        /// `pmix.srvr.sys` (bool): act as the node's system server (rendezvous file).
        SERVER_SYSTEM_SUPPORT = PMIX_SERVER_SYSTEM_SUPPORT;
        /// `pmix.srvr.remote` (bool): listen beyond loopback.
        SERVER_REMOTE_CONNECTIONS = PMIX_SERVER_REMOTE_CONNECTIONS;
        /// `pmix.topo2` (topology): the node's hardware topology, given to the server.
        TOPOLOGY2 = PMIX_TOPOLOGY2;
        /// `pmix.srv.nspace` (string).
        SERVER_NSPACE = PMIX_SERVER_NSPACE;
        /// `pmix.srv.rank` (rank).
        SERVER_RANK = PMIX_SERVER_RANK;
        /// `pmix.collect` (bool).
        COLLECT_DATA = PMIX_COLLECT_DATA;
        /// `pmix.req.key` (string): the key a direct-modex requester waits for.
        REQUIRED_KEY = PMIX_REQUIRED_KEY;
        /// `pmix.optional` (bool): a missing key is not an error to chase.
        OPTIONAL = PMIX_OPTIONAL;
        /// `pmix.immediate` (bool): answer from local data, never ask the host.
        IMMEDIATE = PMIX_IMMEDIATE;
        /// `pmix.timeout` (int, seconds).
        TIMEOUT = PMIX_TIMEOUT;
        /// `pmix.wait` (bool): a lookup waits until the keys are published.
        WAIT = PMIX_WAIT;
        /// `pmix.parent` (proc): the process that spawned this one's namespace.
        PARENT_ID = PMIX_PARENT_ID;
        /// `pmix.host` (string, comma-separated): hosts a spawned app may run on.
        HOST = PMIX_HOST;
        /// `pmix.wdir` (string): a spawned app's working directory.
        WDIR = PMIX_WDIR;
        /// `pmix.log.stderr` (string): a message a client logs for the standard error.
        LOG_STDERR = PMIX_LOG_STDERR;
        /// `pmix.grp.actxid` (bool): a group construct asks the host for a context id.
        GROUP_ASSIGN_CONTEXT_ID = PMIX_GROUP_ASSIGN_CONTEXT_ID;
        /// `pmix.grp.ctxid` (size): the context id the host assigned a group.
        GROUP_CONTEXT_ID = PMIX_GROUP_CONTEXT_ID;
        /// `pmix.grp.endpt` (byte object): a server's packed contribution to a group.
        GROUP_ENDPT_DATA = PMIX_GROUP_ENDPT_DATA;
    }
}

/// A value of one `pmix_info_t`.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `PMIX_BOOL`.
    Bool(bool),
    /// `PMIX_STRING` (no interior NUL).
    Str(String),
    /// `PMIX_UINT32`.
    U32(u32),
    /// `PMIX_UINT16`.
    U16(u16),
    /// `PMIX_PROC_RANK`.
    Rank(u32),
    /// `PMIX_DATA_ARRAY` of `PMIX_INFO` (PMIx deep-copies it).
    Infos(Vec<(&'static CStr, Value)>),
    /// `PMIX_TOPO`: an hwloc topology that outlives every use PMIx makes of it.
    Topology(super::topology::Topology),
    /// `PMIX_REGEX`: a node or process map as libpmix generated it.
    Regex(Regex),
    /// `PMIX_PROC`: a process name (a namespace of at most `PMIX_MAX_NSLEN` bytes).
    Proc(super::Proc),
    /// `PMIX_SIZE`.
    Size(usize),
    /// `PMIX_BYTE_OBJECT` (PMIx copies the bytes into memory of its own).
    Bytes(Vec<u8>),
}

/// A node or process map as `PMIx_generate_regex`/`PMIx_generate_ppn` made it, only ever built
/// from their output ([`Server::generate_regex`](super::server::Server::generate_regex)): text
/// (`pmix[…]` from preg/native, `raw:…` from preg/raw) or, for an input over
/// `pcompress_base_limit` (4 KiB: about 500 host names), preg/compress's zlib blob: `blob:`,
/// NUL, `component=zlib:`, NUL, `size=N:`, NUL, then N bytes. A blob is not a C string, so it is
/// registered as `PMIX_REGEX`, whose load copies each form by its own length rule
/// (`pmix_preg.copy`), as PRRTE registers `PMIX_NODE_MAP`; as `PMIX_STRING` it would be cut at
/// its first NUL.
#[derive(Clone, PartialEq, Eq)]
pub struct Regex {
    /// The bytes, then zeros: preg/compress's `copy` reads 5 bytes past the blob it measures
    /// (its prefix length counts `size=` twice, preg_compress.c@v4.2.2), and must stay inside
    /// this allocation.
    bytes: Box<[u8]>,
    /// How many of `bytes` are the value (a text's NUL included).
    len: usize,
}

/// Zeros after a regex's bytes (see [`Regex::bytes`]).
const REGEX_SLACK: usize = 8;

impl Regex {
    /// The regex in `buf`, which libpmix generated: its length by its form; `None` for a form
    /// this module does not know (registering a part of it would give the ranks a wrong map).
    pub(crate) fn from_generated(buf: &[u8]) -> Option<Regex> {
        let len = Self::claimed_len(buf)?;
        let mut bytes = Vec::with_capacity(len + REGEX_SLACK);
        bytes.extend_from_slice(buf.get(..len)?);
        bytes.resize(len + REGEX_SLACK, 0);
        Some(Regex {
            bytes: bytes.into_boxed_slice(),
            len,
        })
    }

    /// The length the regex starting `buf` has by its form, which `buf` may not hold whole
    /// (a blob's header, NUL-terminated fields, says how long its data is); `None` for a form
    /// this module does not know.
    pub(crate) fn claimed_len(buf: &[u8]) -> Option<usize> {
        let field = |at: usize| -> Option<(&[u8], usize)> {
            let rest = buf.get(at..)?;
            let end = rest.iter().position(|&b| b == 0)?;
            Some((&rest[..end], at + end + 1))
        };
        let (first, at) = field(0)?;
        if first != b"blob:" {
            return (first.starts_with(b"pmix") || first.starts_with(b"raw:")).then_some(at);
        }
        let (component, at) = field(at)?;
        let (size, at) = field(at)?;
        if component != b"component=zlib:" {
            return None;
        }
        let n: usize = std::str::from_utf8(size.strip_prefix(b"size=")?.strip_suffix(b":")?)
            .ok()?
            .parse()
            .ok()?;
        at.checked_add(n)
    }

    /// True for preg/compress's zlib blob.
    pub fn is_compressed(&self) -> bool {
        self.bytes.starts_with(b"blob:\0")
    }

    /// Its length in bytes (a text's NUL included).
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty (never, for a regex libpmix made).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The text form, `None` for a blob.
    pub fn as_text(&self) -> Option<&str> {
        if self.is_compressed() {
            return None;
        }
        std::str::from_utf8(&self.bytes[..self.len - 1]).ok()
    }
}

impl std::fmt::Debug for Regex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.as_text() {
            Some(text) => write!(f, "Regex({text:?})"),
            None => write!(f, "Regex(zlib blob, {} bytes)", self.len),
        }
    }
}

/// An owned array of `pmix_info_t`: every value is loaded by `PMIx_Info_load` (which copies
/// strings and arrays into PMIx-allocated memory) and destructed on drop.
///
/// The array does not move while it lives (a boxed slice), so a pointer handed to PMIx stays
/// valid for as long as the `InfoArray` does.
pub struct InfoArray(Box<[raw::pmix_info_t]>);

// SAFETY: the array exclusively owns its elements and what they point to (copies made by
// PMIx_Info_load); nothing else refers to them, so moving it to another thread is sound.
unsafe impl Send for InfoArray {}
// SAFETY: through `&InfoArray` only the length can be read; every access to the entries
// (handing a pointer to PMIx) needs `&mut`, so shared references cannot race.
unsafe impl Sync for InfoArray {}

impl std::fmt::Debug for InfoArray {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "InfoArray({} entries)", self.0.len())
    }
}

impl InfoArray {
    /// Builds the array; fails on a string with an interior NUL, a PMIx load error, or a
    /// libpmix that cannot be opened (`PMIX_ERR_INIT`).
    pub fn new(entries: &[(&CStr, Value)]) -> Result<InfoArray, Status> {
        let pmix = super::library::pmix().map_err(|_| Status(raw::PMIX_ERR_INIT))?;
        // On failure, the entries loaded so far are destructed by Drop (a zeroed
        // pmix_value_t has type PMIX_UNDEF, whose destruct is a no-op).
        let mut built = InfoArray(
            (0..entries.len())
                .map(|_| raw::pmix_info_t::default())
                .collect(),
        );
        for (slot, (k, v)) in built.0.iter_mut().zip(entries) {
            load(pmix, slot, k, v)?;
        }
        Ok(built)
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Pointer to the first entry, for PMIx calls that take `pmix_info_t info[]`; valid while
    /// `self` lives and is not mutated through other means.
    pub(crate) fn as_mut_ptr(&mut self) -> *mut raw::pmix_info_t {
        if self.0.is_empty() {
            std::ptr::null_mut()
        } else {
            self.0.as_mut_ptr()
        }
    }
}

impl Drop for InfoArray {
    fn drop(&mut self) {
        if self.0.is_empty() {
            return;
        }
        let pmix = super::library::pmix_loaded();
        for info in self.0.iter_mut() {
            // SAFETY: each value was zeroed (PMIX_UNDEF, nothing to free) or loaded by
            // PMIx_Info_load, which allocated what it points to; destruct frees exactly that,
            // once, since the array is dropped once.
            unsafe { pmix.PMIx_Value_destruct(&mut info.value) };
        }
    }
}

/// Loads one entry with `PMIx_Info_load`, which copies the key and the value.
fn load(pmix: &raw::Pmix, slot: &mut raw::pmix_info_t, k: &CStr, v: &Value) -> Result<(), Status> {
    let load_ptr = |slot: &mut raw::pmix_info_t, data: *const c_void, ty: u32| {
        // SAFETY: `slot` is a valid zeroed or previously unloaded pmix_info_t; `k` is
        // NUL-terminated; `data` points to a live value of the C type that `ty` names (see each
        // caller), which PMIx copies (strdup for strings, memcpy for numbers, a deep copy for
        // data arrays: bfrops_base_value_load) before returning.
        check(unsafe { pmix.PMIx_Info_load(slot, k.as_ptr(), data, ty as raw::pmix_data_type_t) })
    };
    match v {
        Value::Bool(b) => load_ptr(slot, (b as *const bool).cast(), raw::PMIX_BOOL),
        Value::U32(n) | Value::Rank(n) => {
            let ty = if matches!(v, Value::Rank(_)) {
                raw::PMIX_PROC_RANK
            } else {
                raw::PMIX_UINT32
            };
            load_ptr(slot, (n as *const u32).cast(), ty)
        }
        Value::U16(n) => load_ptr(slot, (n as *const u16).cast(), raw::PMIX_UINT16),
        Value::Str(s) => {
            let c = CString::new(s.as_str()).map_err(|_| Status::BAD_PARAM)?;
            // For PMIX_STRING, PMIx takes the char* itself as `data` and strdups it.
            load_ptr(slot, c.as_ptr().cast(), raw::PMIX_STRING)
        }
        // PMIx copies it by its form (pmix_preg.copy), reading within `bytes` (Regex's slack).
        Value::Regex(regex) => load_ptr(slot, regex.bytes.as_ptr().cast(), raw::PMIX_REGEX),
        Value::Topology(topo) => {
            let source = c"hwloc";
            let topology = raw::pmix_topology_t {
                source: source.as_ptr().cast_mut(),
                topology: topo.as_ptr(),
            };
            // PMIx copies the struct (strdup of `source`); the topology itself lives for ever.
            load_ptr(
                slot,
                (&topology as *const raw::pmix_topology_t).cast(),
                raw::PMIX_TOPO,
            )
        }
        Value::Proc(p) => {
            let p = p.to_raw().ok_or(Status::BAD_PARAM)?;
            // PMIx copies the struct.
            load_ptr(slot, (&p as *const raw::pmix_proc_t).cast(), raw::PMIX_PROC)
        }
        Value::Size(n) => load_ptr(slot, (n as *const usize).cast(), raw::PMIX_SIZE),
        Value::Bytes(b) => {
            let bo = raw::pmix_byte_object_t {
                bytes: b.as_ptr().cast_mut().cast(),
                size: b.len(),
            };
            // PMIx mallocs a copy of the bytes (bfrops_base_value_load), so a receiver may
            // take and free them (libpmix's group callback does: PMIX_LOAD_BUFFER).
            load_ptr(
                slot,
                (&bo as *const raw::pmix_byte_object_t).cast(),
                raw::PMIX_BYTE_OBJECT,
            )
        }
        Value::Infos(entries) => {
            let entries: Vec<(&CStr, Value)> =
                entries.iter().map(|(k, v)| (*k, v.clone())).collect();
            let mut inner = InfoArray::new(&entries)?;
            let darray = raw::pmix_data_array_t {
                type_: raw::PMIX_INFO as raw::pmix_data_type_t,
                size: inner.len(),
                array: inner.as_mut_ptr().cast(),
            };
            // PMIx deep-copies the array, so `inner` can be dropped afterwards.
            load_ptr(
                slot,
                (&darray as *const raw::pmix_data_array_t).cast(),
                raw::PMIX_DATA_ARRAY,
            )
        }
    }
}

/// Finds entry `k` of PMIx type `ty` in an info array PMIx passed in; `None` if absent or of
/// another type.
///
/// # Safety
/// `info` must be NULL (with `ninfo` 0) or point to `ninfo` valid `pmix_info_t` that outlive `'a`.
unsafe fn find<'a>(
    info: *const raw::pmix_info_t,
    ninfo: usize,
    k: &CStr,
    ty: u32,
) -> Option<&'a raw::pmix_value_t> {
    if info.is_null() {
        return None;
    }
    // SAFETY: non-NULL and `ninfo` valid entries by the caller's contract.
    let infos = unsafe { std::slice::from_raw_parts(info, ninfo) };
    let entry = infos.iter().find(|i| {
        // SAFETY: PMIx keys are NUL-terminated within their fixed-size buffer.
        let key = unsafe { CStr::from_ptr(i.key.as_ptr()) };
        key == k
    })?;
    (entry.value.type_ == ty as raw::pmix_data_type_t).then_some(&entry.value)
}

/// Reads a bool entry `k` from an info array PMIx passed in; `None` if absent or not a bool.
///
/// # Safety
/// `info` must be NULL (with `ninfo` 0) or point to `ninfo` valid `pmix_info_t`.
pub(crate) unsafe fn find_bool(
    info: *const raw::pmix_info_t,
    ninfo: usize,
    k: &CStr,
) -> Option<bool> {
    // SAFETY: forwarded caller contract.
    let value = unsafe { find(info, ninfo, k, raw::PMIX_BOOL) }?;
    // SAFETY: the union's `flag` member is the active one when the type says PMIX_BOOL.
    Some(unsafe { value.data.flag })
}

/// Reads a string entry `k` from an info array PMIx passed in; `None` if absent, NULL or not
/// a string.
///
/// # Safety
/// `info` must be NULL (with `ninfo` 0) or point to `ninfo` valid `pmix_info_t`.
pub(crate) unsafe fn find_string(
    info: *const raw::pmix_info_t,
    ninfo: usize,
    k: &CStr,
) -> Option<String> {
    // SAFETY: forwarded caller contract.
    let value = unsafe { find(info, ninfo, k, raw::PMIX_STRING) }?;
    // SAFETY: the union's `string` member is the active one when the type says PMIX_STRING.
    let s = unsafe { value.data.string };
    // SAFETY: a non-NULL PMIX_STRING value is a NUL-terminated string owned by the array.
    (!s.is_null()).then(|| unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::Regex;

    /// A blob laid out as preg/compress's `pack_blob` lays it out.
    fn blob(data: &[u8]) -> Vec<u8> {
        let mut b = b"blob:\0component=zlib:\0".to_vec();
        b.extend_from_slice(format!("size={}:\0", data.len()).as_bytes());
        b.extend_from_slice(data);
        b
    }

    #[test]
    fn regex_lengths_follow_each_form() {
        let text = Regex::from_generated(b"pmix[n[1:0-2]]\0garbage").unwrap();
        assert_eq!(text.as_text(), Some("pmix[n[1:0-2]]"));
        assert_eq!(text.len(), 15);
        assert!(!text.is_compressed());
        assert_eq!(Regex::from_generated(b"raw:0,1;2\0").unwrap().len(), 10);

        // Binary data with NULs of its own, then bytes that are not the blob's.
        let mut buf = blob(b"\x78\0\x01\0z");
        let whole = buf.len();
        buf.extend_from_slice(b"after");
        let compressed = Regex::from_generated(&buf).unwrap();
        assert!(compressed.is_compressed());
        assert_eq!(compressed.len(), whole);
        assert_eq!(compressed.as_text(), None);
        // PMIx's copy over-reads; the slack after the value is zeros.
        assert!(compressed.bytes[whole..].iter().all(|&b| b == 0));
        assert!(compressed.bytes.len() >= whole + 5);
    }

    #[test]
    fn unknown_or_short_regexes_are_refused() {
        for bad in [
            &b"n0,n1\0"[..],
            b"pmix[n[1:0-2]]",
            b"blob:\0component=lz4:\0size=1:\0x",
            b"blob:\0component=zlib:\0size=x:\0x",
            b"blob:\0component=zlib:\0size=1:",
        ] {
            assert!(Regex::from_generated(bad).is_none(), "{bad:?}");
        }
        // Claims more bytes than there are.
        let short = blob(b"abcd");
        assert!(Regex::from_generated(&short[..short.len() - 1]).is_none());
    }

    use super::*;

    #[test]
    fn build_and_read_back() {
        let mut a = InfoArray::new(&[
            (key::JOB_SIZE, Value::U32(16)),
            (key::COLLECT_DATA, Value::Bool(true)),
            (key::HOSTNAME, Value::Str("n1".into())),
            (
                key::PROC_DATA,
                Value::Infos(vec![
                    (key::RANK, Value::Rank(3)),
                    (key::LOCAL_RANK, Value::U16(1)),
                ]),
            ),
        ])
        .unwrap();
        assert_eq!(a.len(), 4);
        let p = a.as_mut_ptr();
        // SAFETY: `a` holds 4 valid entries and outlives the call.
        assert_eq!(unsafe { find_bool(p, 4, key::COLLECT_DATA) }, Some(true));
        // SAFETY: as above.
        assert_eq!(unsafe { find_bool(p, 4, key::JOB_SIZE) }, None);
        // SAFETY: as above.
        let host = unsafe { find_string(p, 4, key::HOSTNAME) };
        assert_eq!(host.as_deref(), Some("n1"));
        // SAFETY: as above.
        assert_eq!(unsafe { find_string(p, 4, key::COLLECT_DATA) }, None);
        assert!(InfoArray::new(&[(key::HOSTNAME, Value::Str("a\0b".into()))]).is_err());
    }
}
