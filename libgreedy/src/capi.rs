//! The C ABI (`include/greedy/libi.h`): thin wrappers over [`FrontEnd`], [`Session`] and
//! [`Member`]. Every entry returns 0 or -1 with the reason in `greedy_last_error`, catches
//! panics (none crosses into C), and hands out buffers from `malloc`, freed by `greedy_free`.
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::ptr;
use std::time::Duration;

use crate::{Backend, Distribution, Error, FrontEnd, HostGroup, Member, Session};

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Runs `body`, turning an error or a panic into -1 and the thread's last error.
fn entry(body: impl FnOnce() -> Result<(), String>) -> c_int {
    let outcome = catch_unwind(AssertUnwindSafe(body))
        .unwrap_or_else(|_| Err("libgreedy: internal error (a panic was caught)".into()));
    let (code, message) = match outcome {
        Ok(()) => (0, String::new()),
        Err(why) => (-1, why),
    };
    let message = CString::new(message.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|last| *last.borrow_mut() = message);
    code
}

fn fail(e: Error) -> String {
    e.to_string()
}

/// A C string argument, required.
///
/// # Safety
/// `s` is null or points to a NUL-terminated string.
unsafe fn text(s: *const c_char, what: &str) -> Result<String, String> {
    if s.is_null() {
        return Err(format!("{what} is NULL"));
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    let s = unsafe { CStr::from_ptr(s) };
    s.to_str()
        .map(str::to_string)
        .map_err(|_| format!("{what} is not UTF-8"))
}

/// A NULL-terminated array of C strings (NULL: empty).
///
/// # Safety
/// `list` is null or a NULL-terminated array of NUL-terminated strings.
unsafe fn texts(list: *const *const c_char, what: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    if list.is_null() {
        return Ok(out);
    }
    for i in 0.. {
        // SAFETY: the array is NULL-terminated, so every index up to the NULL is in it.
        let item = unsafe { *list.add(i) };
        if item.is_null() {
            break;
        }
        // SAFETY: a non-NULL entry is a NUL-terminated string.
        out.push(unsafe { text(item, what) }?);
    }
    Ok(out)
}

/// `len` bytes at `data` (NULL with 0 is empty).
///
/// # Safety
/// `data` points to `len` readable bytes, or `len` is 0.
unsafe fn bytes<'a>(data: *const c_void, len: usize) -> Result<&'a [u8], String> {
    match (data.is_null(), len) {
        (_, 0) => Ok(&[]),
        (true, _) => Err("a buffer is NULL with a non-zero length".into()),
        // SAFETY: the caller's contract.
        (false, _) => Ok(unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) }),
    }
}

/// Copies `data` into a `malloc`ed buffer.
fn to_c(data: &[u8]) -> Result<*mut c_void, String> {
    // SAFETY: malloc of at least one byte; checked for NULL below.
    let buffer = unsafe { libc::malloc(data.len().max(1)) };
    if buffer.is_null() {
        return Err(format!("out of memory for {} bytes", data.len()));
    }
    // SAFETY: `buffer` holds at least `data.len()` bytes and does not overlap `data`.
    unsafe { ptr::copy_nonoverlapping(data.as_ptr(), buffer.cast::<u8>(), data.len()) };
    Ok(buffer)
}

/// Writes through an out-pointer that must not be NULL.
///
/// # Safety
/// `out` is null or valid for writes of a `T`.
unsafe fn put<T>(out: *mut T, value: T, what: &str) -> Result<(), String> {
    if out.is_null() {
        return Err(format!("{what} is NULL"));
    }
    // SAFETY: non-null and writable by the caller's contract.
    unsafe { out.write(value) };
    Ok(())
}

/// `data` in a `malloc`ed buffer at `out`, its length at `len`.
///
/// # Safety
/// `out` and `len` are valid for writes.
unsafe fn put_bytes(data: &[u8], out: *mut *mut c_void, len: *mut usize) -> Result<(), String> {
    // SAFETY: the caller's contract.
    unsafe {
        put(len, data.len(), "len")?;
        put(out, to_c(data)?, "out")
    }
}

/// Several buffers back to back plus their lengths (`size_t[n]`), both `malloc`ed.
///
/// # Safety
/// `out` and `lens` are valid for writes.
unsafe fn put_many(
    parts: Option<Vec<Vec<u8>>>,
    out: *mut *mut c_void,
    lens: *mut *mut usize,
) -> Result<(), String> {
    let Some(parts) = parts else {
        // SAFETY: the caller's contract.
        unsafe { put(out, ptr::null_mut(), "out")? };
        // SAFETY: the caller's contract.
        return unsafe { put(lens, ptr::null_mut(), "lens") };
    };
    let sizes: Vec<u8> = parts.iter().flat_map(|p| p.len().to_ne_bytes()).collect();
    let data = to_c(&parts.concat())?;
    let sizes = to_c(&sizes)?;
    // SAFETY: the caller's contract.
    unsafe {
        put(out, data, "out")?;
        put(lens, sizes.cast::<usize>(), "lens")
    }
}

/// A front end.
pub struct GreedyFe(FrontEnd);

/// `greedy_fe_init`.
///
/// # Safety
/// `fe` is valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn greedy_fe_init(fe: *mut *mut GreedyFe) -> c_int {
    entry(|| {
        let handle = Box::into_raw(Box::new(GreedyFe(FrontEnd::new())));
        // SAFETY: the caller's contract.
        unsafe { put(fe, handle, "fe") }
    })
}

/// `greedy_fe_finalize`.
///
/// # Safety
/// `fe` came from `greedy_fe_init` and is not used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn greedy_fe_finalize(fe: *mut GreedyFe) -> c_int {
    entry(|| {
        if !fe.is_null() {
            // SAFETY: made by Box::into_raw in greedy_fe_init, freed once.
            drop(unsafe { Box::from_raw(fe) });
        }
        Ok(())
    })
}

/// `greedy_host`.
#[repr(C)]
pub struct GreedyHost {
    name: *const c_char,
    count: c_uint,
}

/// `greedy_proc_dist`.
#[repr(C)]
pub struct GreedyProcDist {
    program: *const c_char,
    argv: *const *const c_char,
    env: *const *const c_char,
    hosts: *const GreedyHost,
    nhosts: usize,
}

/// `greedy_backend`.
#[repr(C)]
pub struct GreedyBackend {
    kind: c_int,
    rsh: *const c_char,
    session: *const c_char,
    job: c_uint,
    step: c_int,
    bcast: *const *const c_char,
}

/// One `greedy_proc_dist` as a host group.
///
/// # Safety
/// Every pointer in `d` follows the header's contract.
unsafe fn group(d: &GreedyProcDist, g: usize) -> Result<HostGroup, String> {
    // SAFETY: the caller's contract, field by field.
    let mut group = HostGroup::new(unsafe { text(d.program, &format!("group {g}'s program")) }?);
    // SAFETY: as above.
    group.args = unsafe { texts(d.argv, "an argument") }?;
    // SAFETY: as above.
    for pair in unsafe { texts(d.env, "a variable") }? {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| format!("group {g}: {pair:?} is not NAME=value"))?;
        group.env.push((k.into(), v.into()));
    }
    for h in 0..d.nhosts {
        // SAFETY: `hosts` holds `nhosts` entries.
        let host = unsafe { &*d.hosts.add(h) };
        // SAFETY: as above.
        let name = unsafe { text(host.name, &format!("group {g}'s host {h}")) }?;
        group.hosts.push((name, host.count));
    }
    Ok(group)
}

/// The back end a `greedy_backend` names.
///
/// # Safety
/// Its strings follow the header's contract.
unsafe fn backend(b: &GreedyBackend) -> Result<Backend, String> {
    Ok(match b.kind {
        0 => Backend::Greedyrun {
            // SAFETY: the caller's contract.
            rsh: unsafe { text(b.rsh, "rsh") }?,
        },
        1 => Backend::Session {
            // SAFETY: the caller's contract.
            socket: PathBuf::from(unsafe { text(b.session, "session") }?),
        },
        2 => Backend::Srun,
        3 => Backend::SlurmJob {
            job: b.job,
            step: u32::try_from(b.step).ok(),
        },
        other => {
            return Err(format!(
                "back end kind {other} is not one of greedy_backend_kind"
            ));
        }
    })
}

/// A session.
pub struct GreedySession(Session);

/// `greedy_fe_launch`.
///
/// # Safety
/// `fe` from `greedy_fe_init`; `dists` holds `ndists` entries; `backend` and `session` valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn greedy_fe_launch(
    fe: *mut GreedyFe,
    dists: *const GreedyProcDist,
    ndists: usize,
    backend_: *const GreedyBackend,
    session: *mut *mut GreedySession,
) -> c_int {
    entry(|| {
        if fe.is_null() || backend_.is_null() || (dists.is_null() && ndists > 0) {
            return Err("fe, dists or backend is NULL".into());
        }
        let mut groups = Vec::new();
        for g in 0..ndists {
            // SAFETY: `dists` holds `ndists` entries.
            groups.push(unsafe { group(&*dists.add(g), g) }?);
        }
        // SAFETY: non-null, the caller's contract.
        let (backend, bcast) = unsafe {
            (
                backend(&*backend_)?,
                texts((*backend_).bcast, "a bcast file")?,
            )
        };
        let distribution =
            (Distribution::new(groups).and_then(|d| d.with_bcast(bcast))).map_err(fail)?;
        // SAFETY: non-null, made by greedy_fe_init.
        let fe = unsafe { &*fe };
        let launched = fe.0.launch(&distribution, &backend).map_err(fail)?;
        let handle = Box::into_raw(Box::new(GreedySession(launched)));
        // SAFETY: the caller's contract.
        unsafe { put(session, handle, "session") }
    })
}

/// The session behind a handle.
///
/// # Safety
/// `s` is null or from `greedy_fe_launch` and not freed.
unsafe fn session<'a>(s: *mut GreedySession) -> Result<&'a mut Session, String> {
    // SAFETY: the caller's contract.
    unsafe { s.as_mut() }
        .map(|s| &mut s.0)
        .ok_or_else(|| "session is NULL".into())
}

/// `greedy_fe_send`.
///
/// # Safety
/// `s` from `greedy_fe_launch`; `data` holds `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn greedy_fe_send(
    s: *mut GreedySession,
    data: *const c_void,
    len: usize,
) -> c_int {
    entry(|| {
        // SAFETY: the caller's contract.
        let (s, data) = unsafe { (session(s)?, bytes(data, len)?) };
        s.send(data).map_err(fail)
    })
}

/// `greedy_fe_recv`.
///
/// # Safety
/// `s` from `greedy_fe_launch`; `data` and `len` valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn greedy_fe_recv(
    s: *mut GreedySession,
    timeout_ms: c_int,
    data: *mut *mut c_void,
    len: *mut usize,
) -> c_int {
    entry(|| {
        // SAFETY: the caller's contract.
        let s = unsafe { session(s) }?;
        let timeout = u64::try_from(timeout_ms).ok().map(Duration::from_millis);
        let message = s.recv(timeout).map_err(fail)?;
        // SAFETY: the caller's contract.
        unsafe { put_bytes(&message, data, len) }
    })
}

/// `greedy_fe_wait`.
///
/// # Safety
/// `s` from `greedy_fe_launch`; `code` null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn greedy_fe_wait(s: *mut GreedySession, code: *mut c_int) -> c_int {
    entry(|| {
        // SAFETY: the caller's contract.
        let outcome = unsafe { session(s) }?.wait().map_err(fail)?;
        if !code.is_null() {
            // SAFETY: non-null, writable by the caller's contract.
            unsafe { code.write(outcome.code) };
        }
        match outcome.success() {
            true => Ok(()),
            false => Err(format!(
                "the session ended with {}: {}",
                outcome.code, outcome.why
            )),
        }
    })
}

/// `greedy_fe_kill`.
///
/// # Safety
/// `s` from `greedy_fe_launch`; `code` null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn greedy_fe_kill(s: *mut GreedySession, code: *mut c_int) -> c_int {
    entry(|| {
        // SAFETY: the caller's contract.
        let outcome = unsafe { session(s) }?.kill().map_err(fail)?;
        if !code.is_null() {
            // SAFETY: non-null, writable by the caller's contract.
            unsafe { code.write(outcome.code) };
        }
        Ok(())
    })
}

/// `greedy_session_free`.
///
/// # Safety
/// `s` null or from `greedy_fe_launch`, not used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn greedy_session_free(s: *mut GreedySession) {
    entry(|| {
        if !s.is_null() {
            // SAFETY: made by Box::into_raw in greedy_fe_launch, freed once.
            drop(unsafe { Box::from_raw(s) });
        }
        Ok(())
    });
}

/// A member.
pub struct GreedyMember(Member);

/// The member behind a handle.
///
/// # Safety
/// `m` is null or from `greedy_member_init` and not finalized.
unsafe fn member<'a>(m: *mut GreedyMember) -> Result<&'a mut Member, String> {
    // SAFETY: the caller's contract.
    unsafe { m.as_mut() }
        .map(|m| &mut m.0)
        .ok_or_else(|| "member is NULL".into())
}

/// `greedy_member_init`.
///
/// # Safety
/// `m` valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn greedy_member_init(m: *mut *mut GreedyMember) -> c_int {
    entry(|| {
        let handle = Box::into_raw(Box::new(GreedyMember(Member::init().map_err(fail)?)));
        // SAFETY: the caller's contract.
        unsafe { put(m, handle, "member") }
    })
}

/// `greedy_member_rank` (0 for a NULL member).
///
/// # Safety
/// `m` null or from `greedy_member_init`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn greedy_member_rank(m: *const GreedyMember) -> c_uint {
    // SAFETY: the caller's contract.
    unsafe { m.as_ref() }.map_or(0, |m| m.0.rank())
}

/// `greedy_member_size` (0 for a NULL member).
///
/// # Safety
/// `m` null or from `greedy_member_init`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn greedy_member_size(m: *const GreedyMember) -> c_uint {
    // SAFETY: the caller's contract.
    unsafe { m.as_ref() }.map_or(0, |m| m.0.size())
}

/// `greedy_barrier`.
///
/// # Safety
/// `m` from `greedy_member_init`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn greedy_barrier(m: *mut GreedyMember) -> c_int {
    // SAFETY: the caller's contract.
    entry(|| unsafe { member(m) }?.barrier().map_err(fail))
}

/// `greedy_broadcast`.
///
/// # Safety
/// `m` from `greedy_member_init`; `data` holds `len` bytes; `out`, `out_len` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn greedy_broadcast(
    m: *mut GreedyMember,
    root: c_uint,
    data: *const c_void,
    len: usize,
    out: *mut *mut c_void,
    out_len: *mut usize,
) -> c_int {
    entry(|| {
        // SAFETY: the caller's contract.
        let (m, data) = unsafe { (member(m)?, bytes(data, len)?) };
        let got = m.broadcast(root, data).map_err(fail)?;
        // SAFETY: the caller's contract.
        unsafe { put_bytes(&got, out, out_len) }
    })
}

/// `greedy_scatter`.
///
/// # Safety
/// `m` from `greedy_member_init`; on root, `parts` and `lens` hold `size` entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn greedy_scatter(
    m: *mut GreedyMember,
    root: c_uint,
    parts: *const *const c_void,
    lens: *const usize,
    out: *mut *mut c_void,
    out_len: *mut usize,
) -> c_int {
    entry(|| {
        // SAFETY: the caller's contract.
        let m = unsafe { member(m) }?;
        let mut owned = Vec::new();
        if m.rank() == root {
            if parts.is_null() || lens.is_null() {
                return Err("scatter: the root's parts or lens is NULL".into());
            }
            for r in 0..m.size() as usize {
                // SAFETY: `parts` and `lens` hold `size` entries on the root.
                owned.push(unsafe { bytes(*parts.add(r), *lens.add(r)) }?.to_vec());
            }
        }
        let got = m.scatter(root, &owned).map_err(fail)?;
        // SAFETY: the caller's contract.
        unsafe { put_bytes(&got, out, out_len) }
    })
}

/// `greedy_gather`.
///
/// # Safety
/// `m` from `greedy_member_init`; `data` holds `len` bytes; `out`, `lens` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn greedy_gather(
    m: *mut GreedyMember,
    root: c_uint,
    data: *const c_void,
    len: usize,
    out: *mut *mut c_void,
    lens: *mut *mut usize,
) -> c_int {
    entry(|| {
        // SAFETY: the caller's contract.
        let (m, data) = unsafe { (member(m)?, bytes(data, len)?) };
        let got = m.gather(root, data).map_err(fail)?;
        // SAFETY: the caller's contract.
        unsafe { put_many(got, out, lens) }
    })
}

/// `greedy_allgather`.
///
/// # Safety
/// `m` from `greedy_member_init`; `data` holds `len` bytes; `out`, `lens` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn greedy_allgather(
    m: *mut GreedyMember,
    data: *const c_void,
    len: usize,
    out: *mut *mut c_void,
    lens: *mut *mut usize,
) -> c_int {
    entry(|| {
        // SAFETY: the caller's contract.
        let (m, data) = unsafe { (member(m)?, bytes(data, len)?) };
        let got = m.allgather(data).map_err(fail)?;
        // SAFETY: the caller's contract.
        unsafe { put_many(Some(got), out, lens) }
    })
}

/// `greedy_member_send_fe`.
///
/// # Safety
/// `m` from `greedy_member_init`; `data` holds `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn greedy_member_send_fe(
    m: *mut GreedyMember,
    data: *const c_void,
    len: usize,
) -> c_int {
    entry(|| {
        // SAFETY: the caller's contract.
        let (m, data) = unsafe { (member(m)?, bytes(data, len)?) };
        m.send_to_front(data).map_err(fail)
    })
}

/// `greedy_member_recv_fe`.
///
/// # Safety
/// `m` from `greedy_member_init`; `data`, `len` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn greedy_member_recv_fe(
    m: *mut GreedyMember,
    data: *mut *mut c_void,
    len: *mut usize,
) -> c_int {
    entry(|| {
        // SAFETY: the caller's contract.
        let got = unsafe { member(m) }?.recv_from_front().map_err(fail)?;
        // SAFETY: the caller's contract.
        unsafe { put_bytes(&got, data, len) }
    })
}

/// `greedy_member_finalize`.
///
/// # Safety
/// `m` from `greedy_member_init`, not used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn greedy_member_finalize(m: *mut GreedyMember) -> c_int {
    entry(|| {
        if m.is_null() {
            return Err("member is NULL".into());
        }
        // SAFETY: made by Box::into_raw in greedy_member_init, freed once.
        let m = unsafe { Box::from_raw(m) };
        m.0.finalize().map_err(fail)
    })
}

/// `greedy_last_error`.
#[unsafe(no_mangle)]
pub extern "C" fn greedy_last_error() -> *const c_char {
    LAST_ERROR.with(|last| last.borrow().as_ptr())
}

/// `greedy_free`.
///
/// # Safety
/// `buffer` null or returned by libgreedy, freed once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn greedy_free(buffer: *mut c_void) {
    // SAFETY: every buffer libgreedy returns comes from malloc (`to_c`).
    unsafe { libc::free(buffer) }
}
