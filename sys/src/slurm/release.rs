//! Which Slurm release a plugin was built for, and which one loads it: a plugin built for
//! another release is refused with one line naming both.
//!
//! Slurm's loader compares a plugin's `plugin_version` with its own `SLURM_VERSION_NUMBER`
//! (all of major, minor and micro) before it calls the plugin's `init`, and on a mismatch logs
//! only the plugin's side: `Incompatible Slurm plugin PATH version (23.02.7)`
//! (`_verify_syms`, src/common/plugin.c:135-148@slurm-22-05-8-1, unchanged in 24.05). `init`
//! never runs then, so the plugin's only chance to say more is an ELF constructor, which the
//! dynamic loader runs inside `dlopen`, before Slurm looks at any symbol:
//! [`refuse_other_release!`](crate::refuse_other_release) installs one that calls
//! [`check_at_load`]. It only logs: refusing is Slurm's job, and the constructor never fails
//! the `dlopen`.
//!
//! The running release is not exported by Slurm (`slurm_api_version()` is the libslurm API
//! number, 38 for 22.05), so [`running`] reads the `plugin_version` of a plugin Slurm always
//! builds (`mpi_none.so`), beside the `libslurmfull.so` the process uses (Slurm installs both
//! in its plugin directory; Debian: /usr/lib/x86_64-linux-gnu/slurm-wlm).

use std::ffi::{CStr, CString, c_char, c_int, c_void};

/// `SLURM_VERSION_NUMBER` as Slurm writes releases: `0x160508` is `22.05.8`.
pub fn describe(version: u32) -> String {
    format!(
        "{}.{:02}.{}",
        version >> 16,
        (version >> 8) & 0xff,
        version & 0xff
    )
}

/// The line to log when `plugin` (e.g. `mpi/greedy`), built for `built`, is loaded by a Slurm
/// of release `running`; `None` when they are equal, as the loader demands.
pub fn mismatch(plugin: &str, built: u32, running: u32) -> Option<String> {
    (built != running).then(|| {
        format!(
            "{plugin}: this plugin was built for Slurm {} but this is Slurm {}, so Slurm \
             refuses to load it; install the greedy-slurm package built for Slurm {} (or \
             rebuild greedy against this Slurm's headers)",
            describe(built),
            describe(running),
            describe(running)
        )
    })
}

/// Plugins Slurm builds in every configuration; the first found tells the running release.
/// `mpi_none.so` is gone from 23.11 on; `auth_none.so` is there in Debian's 24.11.5 and 26.05.5.
const WITNESSES: [&CStr; 2] = [c"mpi_none.so", c"auth_none.so"];

/// The release of the Slurm this process runs (its `SLURM_VERSION_NUMBER`), or `None` outside
/// a Slurm process or when no witness plugin is found.
pub fn running() -> Option<u32> {
    let dir = slurm_library_dir()?;
    WITNESSES
        .iter()
        .find_map(|name| plugin_version_of(&dir, name))
}

/// The directory of the `libslurmfull.so` (or `libslurm.so`) that defines
/// `slurm_api_version` in this process.
fn slurm_library_dir() -> Option<Vec<u8>> {
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only searches the global
    // scope; a NULL result (not a Slurm process) is handled.
    let sym = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"slurm_api_version".as_ptr()) };
    if sym.is_null() {
        return None;
    }
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: `sym` is an address inside a loaded object; dladdr only fills `info`.
    if unsafe { libc::dladdr(sym, info.as_mut_ptr()) } == 0 {
        return None;
    }
    // SAFETY: dladdr returned non-zero, so it initialised `info`.
    let info = unsafe { info.assume_init() };
    if info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is the loader's NUL-terminated path of a loaded object, alive while
    // that object stays loaded (libslurmfull is never unloaded).
    let path = unsafe { CStr::from_ptr(info.dli_fname) }.to_bytes();
    let slash = path.iter().rposition(|&b| b == b'/')?;
    Some(path[..slash].to_vec())
}

/// `plugin_version` of `dir/name`, opened and closed again without running Slurm's `init`.
fn plugin_version_of(dir: &[u8], name: &CStr) -> Option<u32> {
    let mut path = dir.to_vec();
    path.push(b'/');
    path.extend_from_slice(name.to_bytes());
    let path = CString::new(path).ok()?;
    // SAFETY: a Slurm plugin links only libraries the Slurm process already has; dlopen runs
    // no Slurm code (Slurm's plugins have no ELF constructors; `init` is Slurm's to call).
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return None;
    }
    // SAFETY: `handle` is live until the dlclose below; the name is NUL-terminated.
    let sym = unsafe { libc::dlsym(handle, c"plugin_version".as_ptr()) } as *const u32;
    let version = (!sym.is_null()).then(|| {
        // SAFETY: every Slurm plugin defines `const uint32_t plugin_version` (plugin.h), so a
        // non-NULL symbol points at an aligned, initialised u32 of the open object.
        unsafe { sym.read() }
    });
    // SAFETY: `handle` came from dlopen above and nothing from it is used afterwards.
    unsafe { libc::dlclose(handle) };
    version
}

/// Logs at Slurm's `error` level through the process's own logger, looked up by name so this
/// runs (and does nothing harmful) outside Slurm too; stderr when there is no logger.
fn log_error(line: &str) {
    type ErrorFn = unsafe extern "C" fn(*const c_char, ...) -> c_int;
    let line = CString::new(line.replace('\0', "?")).unwrap_or_default();
    // SAFETY: dlsym with RTLD_DEFAULT only searches the global scope; NULL is handled.
    let sym: *mut c_void = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"slurm_error".as_ptr()) };
    if sym.is_null() {
        eprintln!("{}", line.to_string_lossy());
        return;
    }
    // SAFETY: `slurm_error` is `void slurm_error(const char *fmt, ...)` in every release
    // (log.h); reading its (ignored) result as c_int is harmless on x86-64 and aarch64.
    let error: ErrorFn = unsafe { std::mem::transmute::<*mut c_void, ErrorFn>(sym) };
    // SAFETY: literal "%s" format with one live NUL-terminated argument.
    unsafe { error(c"%s".as_ptr(), line.as_ptr()) };
}

/// The constructor's body: compares `built` (the plugin's own `plugin_version`) with the
/// running release and logs [`mismatch`]'s line. Never panics out (it runs inside `dlopen`).
pub fn check_at_load(plugin: &str, built: u32) {
    let _ = std::panic::catch_unwind(|| {
        if let Some(line) = running().and_then(|running| mismatch(plugin, built, running)) {
            log_error(&line);
        }
    });
}

/// Installs an ELF constructor in the calling plugin that runs [`check_at_load`] when the
/// plugin is `dlopen`ed, with `plugin_version` read from the plugin's own static (so a copy
/// whose symbol was changed reports what Slurm will see).
///
/// `refuse_other_release!("mpi/greedy", plugin_version);` next to the `plugin_version` static.
#[macro_export]
macro_rules! refuse_other_release {
    ($plugin:literal, $version:path) => {
        const _: () = {
            extern "C" fn greedy_release_check() {
                // black_box: the load must read the symbol, not the constant it started as.
                let built = *::std::hint::black_box(&$version);
                $crate::slurm::release::check_at_load($plugin, built);
            }
            /// Run by the dynamic loader when the plugin is loaded (before Slurm's checks).
            #[used]
            #[unsafe(link_section = ".init_array")]
            static GREEDY_RELEASE_CHECK: extern "C" fn() = greedy_release_check;
        };
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_the_line_naming_both() {
        assert_eq!(describe(0x160508), "22.05.8");
        assert_eq!(describe(0x17020b), "23.02.11");
        assert_eq!(mismatch("mpi/greedy", 0x160508, 0x160508), None);
        let line = mismatch("mpi/greedy", 0x170207, 0x160508).unwrap();
        assert!(
            line.starts_with(
                "mpi/greedy: this plugin was built for Slurm 23.02.7 but this is Slurm 22.05.8"
            ),
            "{line}"
        );
    }

    #[test]
    fn outside_slurm_nothing_is_found_or_logged() {
        // A test binary defines no slurm_api_version: no release, and the check is silent.
        assert_eq!(running(), None);
        check_at_load("mpi/greedy", 1);
    }
}
