//! The delegate: the site's own topology plugin (`topology_NAME.so`), loaded from PluginDir and
//! called through for every hook but the split, so scheduling, `scontrol show topology` and the
//! topoinfo that travels between daemons are exactly the delegate's.
//!
//! Slurm has no delegation and does not install the plugins' common code, so the delegate is
//! loaded as Slurm's own loader loads a plugin (src/common/plugin.c): `dlopen(RTLD_LAZY)` (a
//! plugin refers to symbols that only slurmctld defines, which `RTLD_NOW` would refuse in srun
//! and scontrol: research/slurm-releases.md), its `plugin_type` checked, its `init` called;
//! every symbol the release's interface needs is resolved at load, so a call never finds one
//! missing. Our `plugin_id` becomes the delegate's: topoinfo is stamped and looked up by it.

use libloading::os::unix::{Library, RTLD_LAZY, RTLD_LOCAL};
use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

/// Where Debian's Slurm looks for plugins when slurm.conf has no `PluginDir`.
pub const DEBIAN_PLUGIN_DIR: &str = "/usr/lib/x86_64-linux-gnu/slurm-wlm";

/// A loaded delegate: its library, identity and the addresses of its hooks.
#[derive(Debug)]
pub struct Delegate {
    /// `NAME` of `topology/NAME`.
    pub name: String,
    /// The file it was loaded from.
    pub path: PathBuf,
    /// Its `plugin_id` (e.g. 100 flat/default, 102 tree, 103 block).
    pub plugin_id: u32,
    /// Its `supports_exclusive_topo`, where the release has it (26.05).
    pub supports_exclusive_topo: Option<bool>,
    symbols: HashMap<&'static str, usize>,
    // Kept open for the life of the process (dropping it would dlclose the hooks).
    _lib: Library,
}

impl Delegate {
    /// Loads `topology_<name>.so` from the first of `dirs` that has it, resolves `hooks` and
    /// calls its `init`; the error names what is missing.
    pub fn load(name: &str, dirs: &[PathBuf], hooks: &[&'static str]) -> Result<Delegate, String> {
        let file = format!("topology_{name}.so");
        let path = dirs
            .iter()
            .map(|d| d.join(&file))
            .find(|p| p.is_file())
            .ok_or_else(|| format!("no {file} in {}", join(dirs)))?;
        // SAFETY: loading a Slurm plugin runs its constructors, as Slurm's own loader would;
        // RTLD_LAZY defers the slurmctld-only symbols it refers to until (never) called here.
        let lib = unsafe { Library::open(Some(&path), RTLD_LAZY | RTLD_LOCAL) }
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let want = format!("topology/{name}");
        // SAFETY: `plugin_type` is a NUL-terminated char array in every Slurm plugin; the
        // symbol's address is the array's.
        let plugin_type = match unsafe { lib.get::<*const c_char>(b"plugin_type\0") } {
            // SAFETY: as above.
            Ok(s) => unsafe { CStr::from_ptr(*s) }.to_string_lossy().into_owned(),
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        if plugin_type != want {
            return Err(format!(
                "{}: plugin_type is {plugin_type:?}, not {want:?}",
                path.display()
            ));
        }
        // SAFETY: `plugin_id` is a `const uint32_t` in every topology plugin (syms[] of
        // src/interfaces/topology.c); the symbol's address is the variable's.
        let plugin_id = unsafe { lib.get::<*const u32>(b"plugin_id\0") }
            .map(|s| unsafe { **s })
            .map_err(|e| format!("{}: {e}", path.display()))?;
        // SAFETY: where present (26.05), a `const bool`.
        let supports_exclusive_topo =
            unsafe { lib.get::<*const bool>(b"supports_exclusive_topo\0") }
                .ok()
                .map(|s| unsafe { **s });
        let mut symbols = HashMap::new();
        for &hook in hooks {
            let c = format!("{hook}\0");
            // SAFETY: only the address is taken; exports.rs calls it with the release's
            // prototype of that hook.
            let sym = unsafe { lib.get::<*const ()>(c.as_bytes()) }
                .map_err(|e| format!("{} lacks {hook}: {e}", path.display()))?;
            symbols.insert(hook, *sym as usize);
        }
        // SAFETY: `int init(void)`, what Slurm's loader calls right after dlopen.
        if let Ok(init) = unsafe { lib.get::<unsafe extern "C" fn() -> c_int>(b"init\0") } {
            // SAFETY: as above; called once per load, as Slurm does.
            let rc = unsafe { init() };
            if rc != 0 {
                return Err(format!("{}: init returned {rc}", path.display()));
            }
        }
        Ok(Delegate {
            name: name.to_owned(),
            path,
            plugin_id,
            supports_exclusive_topo,
            symbols,
            _lib: lib,
        })
    }

    /// The address of `hook`, resolved at load.
    pub fn symbol(&self, hook: &str) -> Option<usize> {
        self.symbols.get(hook).copied()
    }

    /// Calls the delegate's `fini`, if it has one.
    pub fn fini(&self) {
        // SAFETY: `int fini(void)`, what Slurm's loader calls before dlclose.
        if let Ok(fini) = unsafe { self._lib.get::<unsafe extern "C" fn() -> c_int>(b"fini\0") } {
            // SAFETY: as above.
            unsafe { fini() };
        }
    }
}

/// The delegate in force; `None` before `init` or when loading failed.
static CURRENT: RwLock<Option<Arc<Delegate>>> = RwLock::new(None);

/// Makes `delegate` the one every hook calls.
pub fn install(delegate: Delegate) {
    *CURRENT.write().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(delegate));
}

/// The delegate in force.
pub fn current() -> Option<Arc<Delegate>> {
    CURRENT.read().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Removes the delegate in force (at `fini`), returning it.
pub fn take() -> Option<Arc<Delegate>> {
    CURRENT.write().unwrap_or_else(|p| p.into_inner()).take()
}

/// The directories a delegate is looked for in: slurm.conf's `PluginDir` entries (the file
/// `SLURM_CONF` names, else /etc/slurm/slurm.conf), then `own_dir` (where this plugin was
/// loaded from), then Debian's default.
pub fn plugin_dirs(slurm_conf: Option<&str>, own_dir: Option<&Path>) -> Vec<PathBuf> {
    let path = slurm_conf
        .filter(|p| !p.is_empty())
        .unwrap_or("/etc/slurm/slurm.conf");
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut dirs: Vec<PathBuf> = plugin_dir_entries(&text)
        .into_iter()
        .map(PathBuf::from)
        .collect();
    dirs.extend(own_dir.map(Path::to_path_buf));
    dirs.push(PathBuf::from(DEBIAN_PLUGIN_DIR));
    dirs.dedup();
    dirs
}

/// The `:`-separated entries of the last `PluginDir=` line of slurm.conf text.
fn plugin_dir_entries(text: &str) -> Vec<String> {
    let mut entries = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        if key.trim().eq_ignore_ascii_case("PluginDir") {
            entries = value
                .split(':')
                .map(str::trim)
                .filter(|d| !d.is_empty())
                .map(str::to_owned)
                .collect();
        }
    }
    entries
}

/// The directory of the library that holds this code (the installed topology_greedy.so).
pub fn own_dir() -> Option<PathBuf> {
    // SAFETY: Dl_info is plain data (pointers), for which all zeroes is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let here = own_dir as *const ();
    // SAFETY: dladdr only reads the address and fills `info`; the strings it points to stay
    // valid while the library is loaded, and are copied at once.
    let found = unsafe { libc::dladdr(here.cast(), &mut info) };
    if found == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: non-NULL, NUL-terminated (checked above).
    let file = unsafe { CStr::from_ptr(info.dli_fname) };
    Path::new(&*file.to_string_lossy())
        .parent()
        .map(Path::to_path_buf)
}

fn join(dirs: &[PathBuf]) -> String {
    dirs.iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(":")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_dir_is_read_from_slurm_conf() {
        let text = "ClusterName=x\n# PluginDir=/no\nPluginDir=/a/b:/c \nNodeName=n1 CPUs=2\n";
        assert_eq!(plugin_dir_entries(text), ["/a/b", "/c"]);
        assert!(plugin_dir_entries("pluginDIR=/x").len() == 1);
        assert!(plugin_dir_entries("").is_empty());
        let dirs = plugin_dirs(Some("/nonexistent/slurm.conf"), Some(Path::new("/own")));
        assert_eq!(
            dirs,
            [PathBuf::from("/own"), PathBuf::from(DEBIAN_PLUGIN_DIR)]
        );
    }

    #[test]
    fn a_missing_delegate_names_where_it_looked() {
        let err = Delegate::load("nosuch", &[PathBuf::from("/nonexistent")], &[]).unwrap_err();
        assert!(
            err.contains("no topology_nosuch.so in /nonexistent"),
            "{err}"
        );
    }

    #[test]
    fn a_library_that_is_not_the_named_plugin_is_refused() {
        // libc is a shared object with no plugin_type.
        let dir = PathBuf::from("/var/tmp").join(format!("topo-delegate-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let libc_path = [
            "/lib/x86_64-linux-gnu/libm.so.6",
            "/usr/lib/x86_64-linux-gnu/libm.so.6",
        ]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .unwrap();
        std::fs::copy(libc_path, dir.join("topology_fake.so")).unwrap();
        let err = Delegate::load("fake", std::slice::from_ref(&dir), &[]).unwrap_err();
        assert!(err.contains("plugin_type"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn own_dir_is_where_this_code_is() {
        // In a test binary, the executable's own directory.
        let exe = std::env::current_exe().unwrap();
        assert_eq!(own_dir().as_deref(), exe.parent());
    }
}
