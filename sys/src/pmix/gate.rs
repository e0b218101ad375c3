//! The accept gate: every connection libpmix's listener accepts has passed the embedder's policy first.
//!
//! libpmix (4.2 to 6.1) cannot keep a stranger out by itself (research/endpoint-security.md
//! §2): psec `native` trusts the uid bytes the client sends, rejecting a client double-frees
//! the rank's info, and the connection handler reads the connect-ack with a blocking `recv`
//! on the progress thread, so a local user who connects and stays silent freezes the whole
//! server (and `PMIx_server_finalize` with it). No PMIx attribute or host callback runs
//! before that read.
//!
//! So the gate sits below libpmix: [`install`] rewrites libpmix's GOT entry for `accept`
//! (the only function its listener thread accepts with; `listen_thread` in
//! `ptl_base_listener.c@v4.2.2`) to point at [`gated_accept`]. That function calls the real
//! `accept`, asks the policy about the new connection (peer address, our address), and
//! closes a refused one before libpmix ever sees it, returning -1 with the errno on which
//! that libpmix simply waits for the next connection ([`refusal_errno`]: `ECONNABORTED` for
//! 4.x's listener thread, `EAGAIN` for the event handler of 5 and later).
//! On 4.x the policy runs on libpmix's listener thread, which does nothing else; from 5.0 on
//! `accept` is called from the progress thread's event loop, so the policy's work (a
//! `NETLINK_SOCK_DIAG` lookup, a walk of `/proc`) holds the node's other clients that long:
//! a policy must be quick, and must never wait for anything libpmix itself has to do.
//!
//! **Invariant: a connection libpmix accepts has passed the policy.** Everything fails
//! closed: no policy, a panicking policy, a connection that is not TCP/IP, or a peer whose
//! addresses cannot be read is refused; a libpmix whose `accept` slot cannot be found or
//! written makes [`install`] fail, and [`super::server::Server::init`] with it.
//!
//! How the slot is found: `dl_iterate_phdr` yields every loaded object; for each whose name
//! contains `libpmix.so`, its `PT_DYNAMIC` gives the relocation tables (`DT_JMPREL` /
//! `DT_PLTRELSZ`, `DT_RELA` / `DT_RELASZ`), the symbol table (`DT_SYMTAB`) and the string table
//! (`DT_STRTAB` / `DT_STRSZ`); a `JUMP_SLOT` or `GLOB_DAT` relocation whose symbol is named
//! `accept` locates the slot at load address + `r_offset`. A slot in a `PT_GNU_RELRO` page
//! (Debian's `-z relro`, and `-z now` builds) is made writable for the store and read-only
//! again, as the dynamic linker left it. Every address read is checked against the object's
//! `PT_LOAD` segments first.

use std::ffi::{CStr, c_int, c_void};
use std::fmt;
use std::mem::ManuallyDrop;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::FromRawFd;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use object::NativeEndian as NE;
use object::elf;

/// Decides whether a new connection to libpmix's listener may reach libpmix:
/// `policy(peer, local)`, the client's address and ours. Runs where libpmix accepts (its
/// listener thread on 4.x, its progress thread from 5.0): it must be quick; a panic counts
/// as a refusal.
pub type Policy = Arc<dyn Fn(SocketAddr, SocketAddr) -> bool + Send + Sync>;

/// Why the gate could not be installed.
#[derive(Debug)]
#[non_exhaustive]
pub enum GateError {
    /// This architecture's relocation types are not known to the gate.
    UnsupportedArch,
    /// No loaded object is named like `libpmix.so`.
    NoLibrary,
    /// libpmix's dynamic section is missing a table, or it points outside the object.
    BadDynamic {
        /// The object's path.
        library: String,
        /// What is wrong.
        what: &'static str,
    },
    /// libpmix has no `JUMP_SLOT`/`GLOB_DAT` relocation for `accept`: it accepts some other
    /// way, which the gate cannot see.
    NoAcceptSlot {
        /// The object's path.
        library: String,
    },
    /// libpmix also imports a function that accepts connections past the gate.
    OtherAccept {
        /// The object's path.
        library: String,
        /// The symbol, e.g. `accept4`.
        symbol: String,
    },
    /// A PMIx object loaded after the gate was installed accepts past it.
    Ungated {
        /// The object's path.
        library: String,
    },
    /// The slot could not be made writable, or did not hold the gate after the store.
    Patch {
        /// The object's path.
        library: String,
        /// The OS error.
        source: std::io::Error,
    },
}

impl fmt::Display for GateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GateError::UnsupportedArch => write!(
                f,
                "PMIx accept gate: unsupported architecture {}",
                std::env::consts::ARCH
            ),
            GateError::NoLibrary => {
                write!(f, "PMIx accept gate: no libpmix.so loaded in this process")
            }
            GateError::BadDynamic { library, what } => {
                write!(f, "PMIx accept gate: {library}: {what}")
            }
            GateError::NoAcceptSlot { library } => write!(
                f,
                "PMIx accept gate: {library} has no GOT slot for accept; refusing to serve PMIx unguarded"
            ),
            GateError::OtherAccept { library, symbol } => write!(
                f,
                "PMIx accept gate: {library} imports {symbol}, which the gate does not cover; refusing to serve PMIx unguarded"
            ),
            GateError::Ungated { library } => write!(
                f,
                "PMIx accept gate: {library} calls accept past the gate; refusing to serve PMIx unguarded"
            ),
            GateError::Patch { library, source } => {
                write!(f, "PMIx accept gate: {library}: patching accept: {source}")
            }
        }
    }
}

impl std::error::Error for GateError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            GateError::Patch { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// The policy [`gated_accept`] asks; `None` refuses everyone.
static POLICY: RwLock<Option<Policy>> = RwLock::new(None);
/// Serialises [`install`] (the slot is written once per process).
static INSTALL: Mutex<bool> = Mutex::new(false);
/// Connections the gate admitted and refused so far.
static ADMITTED: AtomicU64 = AtomicU64::new(0);
/// The errno a refusal returns with, for the libpmix loaded ([`refusal_errno`]).
static REFUSAL_ERRNO: AtomicI32 = AtomicI32::new(libc::ECONNABORTED);
static REFUSED: AtomicU64 = AtomicU64::new(0);

/// Installs `policy` and, the first time, points libpmix's `accept` at the gate. Idempotent:
/// a later call only replaces the policy. Call it before `PMIx_server_init` (which starts the
/// listener); [`super::server::Server::init`] does.
pub fn install(policy: Policy) -> Result<(), GateError> {
    *POLICY.write().unwrap_or_else(|p| p.into_inner()) = Some(policy);
    let mut patched = INSTALL.lock().unwrap_or_else(|p| p.into_inner());
    if *patched {
        return Ok(());
    }
    let (r_jump, r_glob) = reloc_types()?;
    let objects: Vec<Object> = loaded_pmix_objects()
        .into_iter()
        .filter(|o| is_libpmix(&o.name))
        .collect();
    if objects.is_empty() {
        return Err(GateError::NoLibrary);
    }
    REFUSAL_ERRNO.store(refusal_errno(&libpmix_version()), Ordering::Relaxed);
    let gate = gated_accept as *const () as usize;
    for obj in &objects {
        let slots = obj.accept_slots(r_jump, r_glob)?;
        if slots.is_empty() {
            return Err(GateError::NoAcceptSlot {
                library: obj.name.clone(),
            });
        }
        for slot in slots {
            obj.write_slot(slot, gate)
                .map_err(|source| GateError::Patch {
                    library: obj.name.clone(),
                    source,
                })?;
        }
        tracing::debug!(library = obj.name, "PMIx accept gate installed");
    }
    *patched = true;
    Ok(())
}

/// Checks, once `PMIx_server_init` has loaded its components, that every PMIx object that
/// imports `accept` (libpmix, and any `pmix_mca_*` component: 4.2's TCP listener is built
/// into libpmix, but a build could ship it as a plugin) calls the gate. An object that would
/// accept past the gate is an error: the caller must not serve PMIx.
pub fn verify() -> Result<(), GateError> {
    let (r_jump, r_glob) = reloc_types()?;
    let gate = gated_accept as *const () as usize;
    for obj in loaded_pmix_objects() {
        for slot in obj.accept_slots(r_jump, r_glob)? {
            // SAFETY: `accept_slots` checked the word lies in the object's mapped segments;
            // an atomic load reads it whole even if another thread stored it.
            let target =
                unsafe { AtomicUsize::from_ptr(slot as *mut usize) }.load(Ordering::SeqCst);
            if target != gate {
                return Err(GateError::Ungated { library: obj.name });
            }
        }
    }
    Ok(())
}

/// Connections the gate has admitted so far in this process.
pub fn admitted() -> u64 {
    ADMITTED.load(Ordering::Relaxed)
}

/// Connections the gate has refused (and closed) so far in this process.
pub fn refused() -> u64 {
    REFUSED.load(Ordering::Relaxed)
}

#[cfg(target_arch = "x86_64")]
fn reloc_types() -> Result<(u32, u32), GateError> {
    Ok((elf::R_X86_64_JUMP_SLOT.0, elf::R_X86_64_GLOB_DAT.0))
}

#[cfg(target_arch = "aarch64")]
fn reloc_types() -> Result<(u32, u32), GateError> {
    Ok((elf::R_AARCH64_JUMP_SLOT.0, elf::R_AARCH64_GLOB_DAT.0))
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn reloc_types() -> Result<(u32, u32), GateError> {
    Err(GateError::UnsupportedArch)
}

/// What libpmix's listener calls instead of `accept(2)`: the real `accept`, then the policy.
///
/// # Safety
/// The contract of `accept(2)`: `addr` and `len` are NULL or valid as `accept` requires.
unsafe extern "C" fn gated_accept(
    fd: c_int,
    addr: *mut libc::sockaddr,
    len: *mut libc::socklen_t,
) -> c_int {
    // SAFETY: the caller's arguments are passed on unchanged, under accept(2)'s own contract.
    let conn = unsafe { libc::accept(fd, addr, len) };
    if conn < 0 {
        return conn; // errno is accept's
    }
    let verdict = catch_unwind(AssertUnwindSafe(|| judge(conn)));
    let (peer, refusal) = match verdict {
        Ok(Ok(_)) => {
            ADMITTED.fetch_add(1, Ordering::Relaxed);
            return conn;
        }
        Ok(Err((peer, why))) => (peer, why),
        Err(_) => (None, "the policy panicked"),
    };
    REFUSED.fetch_add(1, Ordering::Relaxed);
    // SAFETY: `conn` is the descriptor accept just returned to us; nothing else has seen it.
    unsafe { libc::close(conn) };
    // One line per refusal, never a warning: a stranger must not be able to fill the user's
    // terminal. A panicking logger must not unwind into C either.
    let _ = catch_unwind(AssertUnwindSafe(|| match peer {
        Some(p) => tracing::info!(peer = %p, "PMIx connection refused: {refusal}"),
        None => tracing::info!("PMIx connection refused: {refusal}"),
    }));
    // The errno on which this libpmix waits for the next connection ([`refusal_errno`]).
    // Set last: close and the logger may have changed errno.
    // SAFETY: __errno_location returns this thread's errno, always valid.
    unsafe { *libc::__errno_location() = REFUSAL_ERRNO.load(Ordering::Relaxed) };
    -1
}

/// The loaded libpmix's version string (`OpenPMIx 5.0.7, repo rev: …`).
pub(crate) fn libpmix_version() -> String {
    let Ok(pmix) = super::library::pmix() else {
        return String::new();
    };
    // SAFETY: PMIx_Get_version returns a static string (or NULL), callable before init.
    let version = unsafe { pmix.PMIx_Get_version() };
    if version.is_null() {
        return String::new();
    }
    // SAFETY: non-NULL, NUL-terminated and static (above).
    unsafe { CStr::from_ptr(version) }
        .to_string_lossy()
        .into_owned()
}

/// The errno on which libpmix's listener, given a refused `accept`, waits for the next
/// connection. The two designs want opposite ones:
/// - 4.x `listen_thread` (ptl_base_listener.c@v4.2.2 l.202–223) continues on
///   `ECONNABORTED` ("they aborted the attempt") but ends the thread on `EAGAIN` (its test
///   `errno != EAGAIN || errno != EWOULDBLOCK` is always true);
/// - from 5.0 `connection_event_handler` (@v5.0.7 l.131–165, the same in 6.x) returns on
///   `EAGAIN`/`EWOULDBLOCK`/`EINTR`, but on any other error closes the listening socket.
///
/// A version string without a number counts as 4.x, the oldest libpmix greedy supports.
pub fn refusal_errno(version: &str) -> c_int {
    let major = version
        .split(|c: char| !c.is_ascii_digit())
        .find(|w| !w.is_empty())
        .and_then(|w| w.parse::<u32>().ok());
    match major {
        Some(m) if m >= 5 => libc::EAGAIN,
        _ => libc::ECONNABORTED,
    }
}

/// Asks the policy about the connection on `conn`: `Ok` admits, `Err` names why not.
fn judge(conn: c_int) -> Result<(), (Option<SocketAddr>, &'static str)> {
    // SAFETY: `conn` is an open socket we own; ManuallyDrop keeps TcpStream from closing it.
    // Only getpeername/getsockname are called through it.
    let stream = ManuallyDrop::new(unsafe { TcpStream::from_raw_fd(conn) });
    let (Ok(peer), Ok(local)) = (stream.peer_addr(), stream.local_addr()) else {
        return Err((
            None,
            "not a TCP/IP connection, or its addresses are unreadable",
        ));
    };
    let policy = POLICY.read().unwrap_or_else(|p| p.into_inner()).clone();
    let Some(policy) = policy else {
        return Err((Some(peer), "no admission policy installed"));
    };
    if policy(peer, local) {
        Ok(())
    } else {
        Err((Some(peer), "not admitted by the policy"))
    }
}

/// A mapped segment of a loaded object, at its run-time address.
#[derive(Debug, Clone, Copy)]
struct Segment {
    start: usize,
    end: usize,
    writable: bool,
}

/// A loaded libpmix, as `dl_iterate_phdr` describes it.
#[derive(Debug)]
struct Object {
    name: String,
    base: usize,
    loads: Vec<Segment>,
    /// The `PT_GNU_RELRO` range, if any.
    relro: Option<(usize, usize)>,
    /// The run-time address and length (bytes) of `PT_DYNAMIC`.
    dynamic: Option<(usize, usize)>,
}

/// libpmix itself, or one of the MCA components it `dlopen`s (`pmix_mca_<framework>_<name>.so`).
fn is_pmix_object(path: &str) -> bool {
    let file = path.rsplit('/').next().unwrap_or(path);
    path.contains("libpmix.so") || file.starts_with("pmix_mca_")
}

/// Whether `path` is libpmix itself.
fn is_libpmix(path: &str) -> bool {
    path.contains("libpmix.so")
}

/// Every loaded libpmix and PMIx MCA component.
fn loaded_pmix_objects() -> Vec<Object> {
    let mut found: Vec<Object> = Vec::new();
    // SAFETY: `collect` has the callback signature dl_iterate_phdr expects and only reads the
    // `dl_phdr_info` it is handed, for the duration of the call; `data` is `&mut found`,
    // alive for the whole iteration and touched by nothing else meanwhile.
    unsafe { libc::dl_iterate_phdr(Some(collect), (&mut found as *mut Vec<Object>).cast()) };
    found
}

/// `dl_iterate_phdr` callback: records libpmix objects.
///
/// # Safety
/// `info` must be a valid `dl_phdr_info` for the call, `data` a `*mut Vec<Object>`.
unsafe extern "C" fn collect(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    data: *mut c_void,
) -> c_int {
    let result = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: by the contract above.
        let (info, found) = unsafe { (&*info, &mut *data.cast::<Vec<Object>>()) };
        if info.dlpi_name.is_null() || info.dlpi_phdr.is_null() {
            return;
        }
        // SAFETY: dlpi_name is a NUL-terminated path owned by the loader, valid for the call.
        let name = unsafe { CStr::from_ptr(info.dlpi_name) }
            .to_string_lossy()
            .into_owned();
        if !is_pmix_object(&name) {
            return;
        }
        // SAFETY: the loader hands dlpi_phnum program headers at dlpi_phdr.
        let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum.into()) };
        let base = info.dlpi_addr as usize;
        let mut obj = Object {
            name,
            base,
            loads: Vec::new(),
            relro: None,
            dynamic: None,
        };
        for ph in phdrs {
            let start = base.wrapping_add(ph.p_vaddr as usize);
            let end = start.wrapping_add(ph.p_memsz as usize);
            match ph.p_type {
                libc::PT_LOAD => obj.loads.push(Segment {
                    start,
                    end,
                    writable: ph.p_flags & libc::PF_W != 0,
                }),
                libc::PT_GNU_RELRO => obj.relro = Some((start, end)),
                libc::PT_DYNAMIC => obj.dynamic = Some((start, ph.p_memsz as usize)),
                _ => {}
            }
        }
        found.push(obj);
    }));
    // Keep iterating; a panic just leaves that object out (and install then fails closed).
    let _ = result;
    0
}

/// Tables of an object's dynamic section, at run-time addresses.
#[derive(Debug, Default)]
struct Tables {
    rela: Option<(usize, usize)>,
    jmprel: Option<(usize, usize)>,
    pltrel_is_rela: bool,
    symtab: Option<usize>,
    strtab: Option<(usize, usize)>,
}

impl Object {
    /// Whether `[addr, addr + len)` lies inside one mapped segment.
    fn contains(&self, addr: usize, len: usize) -> bool {
        let Some(end) = addr.checked_add(len) else {
            return false;
        };
        self.loads.iter().any(|s| s.start <= addr && end <= s.end)
    }

    /// A pointer from the dynamic section: glibc relocates them in place (`l_info`), other
    /// loaders leave them relative to the load address. Whichever lands inside the object.
    fn pointer(&self, p: u64, len: usize) -> Option<usize> {
        let p = usize::try_from(p).ok()?;
        if self.contains(p, len) {
            return Some(p);
        }
        let q = self.base.checked_add(p)?;
        self.contains(q, len).then_some(q)
    }

    fn bad(&self, what: &'static str) -> GateError {
        GateError::BadDynamic {
            library: self.name.clone(),
            what,
        }
    }

    /// Reads `T` at `addr` after checking it lies in the object.
    fn read<T: Copy>(&self, addr: usize) -> Option<T> {
        if !self.contains(addr, size_of::<T>()) {
            return None;
        }
        // SAFETY: the bytes lie inside a mapped PT_LOAD segment of a loaded object (all of
        // which are readable); `read_unaligned` needs no alignment; T is plain data.
        Some(unsafe { std::ptr::read_unaligned(addr as *const T) })
    }

    fn tables(&self) -> Result<Tables, GateError> {
        let (dynamic, size) = self.dynamic.ok_or_else(|| self.bad("no PT_DYNAMIC"))?;
        let mut raw = Vec::new();
        let n = size / size_of::<elf::Dyn64<NE>>();
        for i in 0..n {
            let d: elf::Dyn64<NE> = self
                .read(dynamic + i * size_of::<elf::Dyn64<NE>>())
                .ok_or_else(|| self.bad("PT_DYNAMIC outside the object"))?;
            let tag = d.d_tag.get(NE);
            if tag == elf::DT_NULL {
                break;
            }
            raw.push((tag, d.d_val.get(NE)));
        }
        let val = |t: elf::DynamicTag| raw.iter().find(|(tag, _)| *tag == t).map(|&(_, v)| v);
        let table = |addr_tag, size_tag, what| -> Result<Option<(usize, usize)>, GateError> {
            match (val(addr_tag), val(size_tag)) {
                (Some(a), Some(n)) if n > 0 => {
                    let len = usize::try_from(n).map_err(|_| self.bad(what))?;
                    let at = self.pointer(a, len).ok_or_else(|| self.bad(what))?;
                    Ok(Some((at, len)))
                }
                _ => Ok(None),
            }
        };
        if let Some(ent) = val(elf::DT_RELAENT)
            && ent as usize != size_of::<elf::Rela64<NE>>()
        {
            return Err(self.bad("DT_RELAENT is not the size of Elf64_Rela"));
        }
        let symtab = val(elf::DT_SYMTAB)
            .and_then(|a| self.pointer(a, size_of::<elf::Sym64<NE>>()))
            .ok_or_else(|| self.bad("no DT_SYMTAB inside the object"))?;
        Ok(Tables {
            rela: table(elf::DT_RELA, elf::DT_RELASZ, "DT_RELA outside the object")?,
            jmprel: table(
                elf::DT_JMPREL,
                elf::DT_PLTRELSZ,
                "DT_JMPREL outside the object",
            )?,
            pltrel_is_rela: val(elf::DT_PLTREL) == Some(elf::DT_RELA.0 as u64),
            symtab: Some(symtab),
            strtab: table(
                elf::DT_STRTAB,
                elf::DT_STRSZ,
                "DT_STRTAB outside the object",
            )?,
        })
    }

    /// The name of dynamic symbol `index`, if it can be read.
    fn symbol_name(&self, t: &Tables, index: u32) -> Option<Vec<u8>> {
        let sym_at = t
            .symtab?
            .checked_add((index as usize).checked_mul(size_of::<elf::Sym64<NE>>())?)?;
        let sym: elf::Sym64<NE> = self.read(sym_at)?;
        let (strtab, strsz) = t.strtab?;
        let off = sym.st_name.get(NE) as usize;
        if off >= strsz {
            return None;
        }
        // SAFETY: strtab..strtab+strsz lies in the object (checked by `tables`); the slice
        // stays within it.
        let strings = unsafe { std::slice::from_raw_parts(strtab as *const u8, strsz) };
        let name = &strings[off..];
        let end = name.iter().position(|&b| b == 0)?;
        Some(name[..end].to_vec())
    }

    /// The GOT slots (run-time addresses) through which the object calls `accept`.
    fn accept_slots(&self, r_jump: u32, r_glob: u32) -> Result<Vec<usize>, GateError> {
        let t = self.tables()?;
        if t.strtab.is_none() {
            return Err(self.bad("no DT_STRTAB"));
        }
        let mut tables = Vec::new();
        if let Some(r) = t.rela {
            tables.push(r);
        }
        if let Some(r) = t.jmprel {
            if !t.pltrel_is_rela {
                return Err(self.bad("DT_PLTREL is not DT_RELA"));
            }
            tables.push(r);
        }
        let mut slots = Vec::new();
        for (start, len) in tables {
            let entry = size_of::<elf::Rela64<NE>>();
            for i in 0..len / entry {
                let r: elf::Rela64<NE> = self
                    .read(start + i * entry)
                    .ok_or_else(|| self.bad("relocation outside the object"))?;
                let kind = r.r_type(NE, false).0;
                if kind != r_jump && kind != r_glob {
                    continue;
                }
                let Some(name) = self.symbol_name(&t, r.r_sym(NE, false)) else {
                    return Err(self.bad("unreadable symbol of a GOT relocation"));
                };
                match name.as_slice() {
                    b"accept" => {
                        let slot = self
                            .base
                            .checked_add(r.r_offset.get(NE) as usize)
                            .filter(|&s| self.contains(s, size_of::<usize>()))
                            .ok_or_else(|| self.bad("accept's GOT slot outside the object"))?;
                        slots.push(slot);
                    }
                    b"accept4" | b"__accept" | b"__accept4" | b"paccept" => {
                        return Err(GateError::OtherAccept {
                            library: self.name.clone(),
                            symbol: String::from_utf8_lossy(&name).into_owned(),
                        });
                    }
                    _ => {}
                }
            }
        }
        Ok(slots)
    }

    /// Stores `value` in the GOT slot at `slot`, lifting RELRO protection for the store.
    fn write_slot(&self, slot: usize, value: usize) -> std::io::Result<()> {
        use std::io::{Error, ErrorKind};
        if !slot.is_multiple_of(align_of::<usize>()) {
            return Err(Error::new(ErrorKind::InvalidData, "misaligned GOT slot"));
        }
        if !self
            .loads
            .iter()
            .any(|s| s.writable && s.start <= slot && slot + size_of::<usize>() <= s.end)
        {
            return Err(Error::new(
                ErrorKind::InvalidData,
                "GOT slot outside a writable segment",
            ));
        }
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
            .ok()
            .filter(|p| p.is_power_of_two())
            .ok_or_else(|| Error::new(ErrorKind::Unsupported, "no page size"))?;
        let page_start = slot & !(page - 1);
        // The pages the loader made read-only: whole pages of PT_GNU_RELRO (glibc's
        // _dl_protect_relro rounds both ends down). A slot past them is plainly writable.
        let read_only = self.relro.is_some_and(|(s, e)| {
            (s & !(page - 1)) <= page_start && page_start < (e & !(page - 1))
        });
        if read_only {
            // SAFETY: the page belongs to this object's RELRO region (checked above); making
            // it writable for a moment changes no content.
            let rc = unsafe {
                libc::mprotect(
                    page_start as *mut c_void,
                    page,
                    libc::PROT_READ | libc::PROT_WRITE,
                )
            };
            if rc != 0 {
                return Err(Error::last_os_error());
            }
        }
        // SAFETY: `slot` is an aligned, mapped and (now) writable word of the object's GOT;
        // an atomic store lets a concurrent caller see either the old or the new target.
        let cell = unsafe { AtomicUsize::from_ptr(slot as *mut usize) };
        cell.store(value, Ordering::SeqCst);
        let stored = cell.load(Ordering::SeqCst);
        if read_only {
            // SAFETY: as above; back to the protection the loader set.
            let rc = unsafe { libc::mprotect(page_start as *mut c_void, page, libc::PROT_READ) };
            if rc != 0 {
                return Err(Error::last_os_error());
            }
        }
        if stored != value {
            return Err(Error::other("the GOT slot did not keep the gate"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::TcpListener;
    use std::os::fd::AsRawFd;

    /// One connection through `gated_accept` under `policy`: the descriptor (or -1 and errno)
    /// and whether the client then sees its connection closed.
    fn through_gate(policy: Option<Policy>) -> (c_int, i32, bool) {
        *POLICY.write().unwrap() = policy;
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        // SAFETY: a listening socket with a pending connection; NULL address and length are
        // allowed by accept(2).
        let fd = unsafe {
            gated_accept(
                listener.as_raw_fd(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        client
            .set_read_timeout(Some(std::time::Duration::from_millis(500)))
            .unwrap();
        let closed = matches!(client.read(&mut [0u8; 8]), Ok(0) | Err(_))
            && fd < 0
            && errno == libc::ECONNABORTED;
        if fd >= 0 {
            // SAFETY: the admitted descriptor is ours to close.
            unsafe { libc::close(fd) };
        }
        (fd, errno, closed)
    }

    #[test]
    fn refusals_use_the_errno_each_libpmix_waits_on() {
        let v4 = "OpenPMIx 4.2.2, repo rev: v4.2.2, Oct 20, 2022";
        assert_eq!(refusal_errno(v4), libc::ECONNABORTED);
        assert_eq!(
            refusal_errno("OpenPMIx 5.0.7a1, repo rev: v5.0.7"),
            libc::EAGAIN
        );
        assert_eq!(refusal_errno("OpenPMIx 7.0.0"), libc::EAGAIN);
        assert_eq!(refusal_errno(""), libc::ECONNABORTED);
    }

    #[test]
    fn the_gate_admits_only_what_the_policy_admits() {
        let (fd, _, _) = through_gate(Some(Arc::new(|peer, local| {
            peer.ip().is_loopback() && local.ip().is_loopback()
        })));
        assert!(fd >= 0);
        // Refused, no policy, or a panicking policy: closed, ECONNABORTED.
        for policy in [
            Some(Arc::new(|_, _| false) as Policy),
            None,
            Some(
                Arc::new(|_: SocketAddr, _: SocketAddr| -> bool { panic!("policy bug") }) as Policy,
            ),
        ] {
            let (fd, errno, closed) = through_gate(policy);
            assert_eq!((fd, errno), (-1, libc::ECONNABORTED));
            assert!(closed);
        }
        *POLICY.write().unwrap() = None;
    }

    /// The permissions `/proc/self/maps` shows for the mapping holding `addr` (`r--p`, …).
    fn perms_at(addr: usize) -> String {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        maps.lines()
            .find_map(|l| {
                let (range, rest) = l.split_once(' ')?;
                let (a, b) = range.split_once('-')?;
                let (a, b) = (
                    usize::from_str_radix(a, 16).ok()?,
                    usize::from_str_radix(b, 16).ok()?,
                );
                (a <= addr && addr < b).then(|| rest[..4].to_string())
            })
            .unwrap()
    }

    #[test]
    fn a_slot_in_relro_is_written_and_left_read_only() {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        // SAFETY: a fresh anonymous private mapping of two pages, ours alone.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                2 * page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(map, libc::MAP_FAILED);
        let start = map as usize;
        // SAFETY: the first page of our mapping, made read-only as a loader's RELRO would be.
        assert_eq!(unsafe { libc::mprotect(map, page, libc::PROT_READ) }, 0);
        let obj = Object {
            name: "fake".into(),
            base: start,
            loads: vec![Segment {
                start,
                end: start + 2 * page,
                writable: true,
            }],
            relro: Some((start, start + page + 64)),
            dynamic: None,
        };
        let slot = start + 128;
        obj.write_slot(slot, 0x1234_5678).unwrap();
        // SAFETY: an aligned word inside our mapping.
        assert_eq!(unsafe { *(slot as *const usize) }, 0x1234_5678);
        assert_eq!(perms_at(slot), "r--p");
        // Past the whole RELRO pages: written in place, still writable.
        let slot = start + page + 8;
        obj.write_slot(slot, 7).unwrap();
        assert_eq!(perms_at(slot), "rw-p");
        assert!(obj.write_slot(start + 4, 1).is_err(), "misaligned");
        // SAFETY: unmapping what we mapped; nothing refers to it any more.
        unsafe { libc::munmap(map, 2 * page) };
    }

    #[test]
    fn a_unix_socket_is_refused() {
        // A descriptor that is not TCP/IP is refused whatever the policy says.
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        assert!(judge(a.as_raw_fd()).is_err());
    }

    #[test]
    fn finds_libpmix_and_its_accept_slot() {
        super::super::library::pmix().expect("libpmix opens");
        let objects = loaded_pmix_objects();
        assert!(!objects.is_empty(), "libpmix is open in the test binary");
        let (j, g) = reloc_types().unwrap();
        for obj in objects.iter().filter(|o| is_libpmix(&o.name)) {
            let slots = obj.accept_slots(j, g).unwrap();
            assert_eq!(slots.len(), 1, "{obj:?}: {slots:x?}");
        }
        assert!(is_pmix_object(
            "/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix/pmix_mca_ptl_tcp.so"
        ));
        assert!(!is_pmix_object("/usr/lib/libmunge.so.2"));
    }
}
