//! Tests of the stack parsers on captured tool output (`../testdata/`), and of running the tools.
//!
//! The samples come from eu-stack 0.188 and gdb 13.1 (Debian 12) on small programs: `sleep 300`
//! (stripped), a C program spinning in one thread and sleeping in another, a C++ one (namespaces,
//! templates, a lambda), a Rust one (legacy and v0 mangling, inlined frames), a stripped
//! shared library, a signal handler, and a recursion cut by eu-stack's `-n`.

use std::process::Command;

use super::*;

/// Stacks as text: one line per thread, frames joined by ` > `.
fn show(threads: &[Vec<String>]) -> String {
    threads
        .iter()
        .map(|t| format!("{}\n", t.join(" > ")))
        .collect()
}

fn check_eu(stdout: &str, stderr: &str, expect: &str) {
    assert_eq!(show(&parse_eu_stack(stdout, stderr)), expect);
}

fn check_gdb(stdout: &str, expect: &str) {
    assert_eq!(show(&parse_gdb(stdout)), expect);
}

#[test]
fn eu_stack_threads() {
    check_eu(
        include_str!("../testdata/eu-stack-threads.txt"),
        "",
        "_start > __libc_start_main > __libc_start_call_main > main > outer > inner_spin
__clone3 > start_thread > worker > sleep > __nanosleep > clock_nanosleep
",
    );
}

#[test]
fn eu_stack_frames_without_symbol_name_their_module() {
    check_eu(
        include_str!("../testdata/eu-stack-stripped.txt"),
        "",
        "??@sleep > __libc_start_main > __libc_start_call_main > ??@sleep > ??@sleep > ??@sleep \
         > __nanosleep > clock_nanosleep\n",
    );
    check_eu(
        include_str!("../testdata/eu-stack-lib.txt"),
        "",
        "_start > __libc_start_main > __libc_start_call_main > main > foo_wait > ??@libfoo.so \
         > pause\n",
    );
}

#[test]
fn eu_stack_cxx_names_keep_their_spaces() {
    check_eu(
        include_str!("../testdata/eu-stack-cxx.txt"),
        "",
        "_start > __libc_start_main > __libc_start_call_main > main \
         > main::{lambda()#1}::operator()() const > (anonymous namespace)::anon() \
         > ns::Box<std::vector<int, std::allocator<int> > >::wait(std::vector<int, \
         std::allocator<int> >) > sleep > __nanosleep > clock_nanosleep\n",
    );
}

#[test]
fn eu_stack_rust_names_lose_their_hash() {
    let threads = parse_eu_stack(include_str!("../testdata/eu-stack-rust.txt"), "");
    assert_eq!(threads.len(), 2);
    let main = &threads[0];
    // v0-mangled names (`_RNv...`) stay as eu-stack prints them.
    let sleep = "_RNvNtNtCsjrHSEGnQ3l9_3std6thread9functions5sleep";
    assert_eq!(
        main[main.len() - 4..],
        ["rs::main", "rs::waiter", sleep, "clock_nanosleep"]
    );
    assert_eq!(main[6], "std::rt::lang_start::_$u7b$$u7b$closure$u7d$$u7d$");
}

#[test]
fn eu_stack_cut_stack_starts_incomplete() {
    check_eu(
        include_str!("../testdata/eu-stack-truncated.txt"),
        include_str!("../testdata/eu-stack-truncated.stderr"),
        "... > rec > rec > rec > rec > rec > rec > rec > pause\n",
    );
    assert_eq!(
        troubled_tids("eu-stack: dwfl_thread_getframes tid 77 at 0x4005d0 in a.out: x"),
        [77]
    );
}

#[test]
fn eu_stack_odd_lines() {
    // No module (no -m), a pseudo-module with a pid, frames before any TID line.
    check_eu(
        "#0  0x1 lost\nPID 9 - process\nTID 9:\n#0  0x0000000000000001\n\
         #1  0x2 f - [vdso: 9]\n#2  0x3 - [vdso: 9]\n",
        "",
        "??@[vdso] > f > ??\n",
    );
    check_eu(
        "eu-stack: dwfl_linux_proc_report pid 1: No such file or directory\n",
        "",
        "",
    );
}

#[test]
fn gdb_threads() {
    let expect =
        "clone3 > start_thread > worker > __sleep > __GI___nanosleep > __GI___clock_nanosleep
main > outer > inner_spin
";
    check_gdb(include_str!("../testdata/gdb-threads.txt"), expect);
    check_gdb(include_str!("../testdata/gdb-threads-noargs.txt"), expect);
}

#[test]
fn gdb_frames_without_symbol() {
    check_gdb(
        include_str!("../testdata/gdb-stripped.txt"),
        "?? > __libc_start_main_impl > __libc_start_call_main > ?? > ?? > ?? > __GI___nanosleep \
         > __GI___clock_nanosleep\n",
    );
    check_gdb(
        include_str!("../testdata/gdb-lib.txt"),
        "main > foo_wait > ??@libfoo.so > __libc_pause\n",
    );
}

#[test]
fn gdb_signal_handler_and_cxx() {
    check_gdb(
        include_str!("../testdata/gdb-signal.txt"),
        "main > __libc_pause > <signal handler called> > handler > __libc_pause\n",
    );
    check_gdb(
        include_str!("../testdata/gdb-cxx.txt"),
        "main > operator() > (anonymous namespace)::anon \
         > ns::Box<std::vector<int, std::allocator<int> > >::wait > __sleep > __GI___nanosleep \
         > __GI___clock_nanosleep\n",
    );
}

#[test]
fn gdb_rust_inlined_frames_and_generics() {
    let threads = parse_gdb(include_str!("../testdata/gdb-rust.txt"));
    assert_eq!(threads.len(), 2);
    let main = &threads[1];
    let outer = [
        "_start",
        "__libc_start_main_impl",
        "__libc_start_call_main",
        "main",
    ];
    assert_eq!(
        main[..6],
        [
            &outer[..],
            &["std::rt::lang_start<()>", "std::rt::lang_start_internal"]
        ]
        .concat()
    );
    // Generic arguments with parentheses and spaces stay in the name.
    let dyn_fn = "(dyn core::ops::function::Fn<(), Output=i32> + core::marker::Sync \
                  + core::panic::unwind_safe::RefUnwindSafe)";
    let call_once = format!("core::ops::function::impls::{{impl#2}}::call_once<(), {dyn_fn}>");
    assert!(main.contains(&call_once), "{main:?}");
    // Inlined frames (no address) are frames too.
    let inner = [
        "rs::main",
        "rs::waiter",
        "std::thread::functions::sleep",
        "std::sys::thread::unix::sleep",
        "std::sys::thread::unix::sleep::nanosleep",
        "__GI___clock_nanosleep",
    ];
    assert_eq!(main[main.len() - 6..], inner);
}

#[test]
fn gdb_names_with_parens_and_odd_lines() {
    let text = "\
#0  0x1 in foo ()\n\
Thread 1 (Thread 0x7f (LWP 5) \"a (b)\"):
#0  0x0000000000401136 in std::function<void (int)>::operator() (this=...) at f.cc:3
#1  0x1 in bar (s=0x2 \"x) at y\") from /lib/libbar.so.1
#2  0x1 in weird
Backtrace stopped: previous frame inner to this frame (corrupt stack?)
";
    check_gdb(
        text,
        "... > weird > bar > std::function<void (int)>::operator()\n",
    );
    check_gdb("ptrace: No such process.\nNo stack.\n", "");
}

#[test]
fn names_are_cleaned_only_of_versions_and_hashes() {
    let check = |raw: &str, expect: &str| {
        assert_eq!(strip_rust_hash(strip_symbol_version(raw)), expect, "{raw}");
    };
    check("__libc_start_main@@GLIBC_2.34", "__libc_start_main");
    check("clock_nanosleep@GLIBC_2.2.5", "clock_nanosleep");
    check("rs::waiter::h56ae0d701b5b897f", "rs::waiter");
    check("a::h56ae0d701b5b897", "a::h56ae0d701b5b897");
    check("a::hello", "a::hello");
    check("@", "@");
    check("operator@(x, y)", "operator@(x, y)");
}

#[test]
fn kernel_stack_text() {
    let text = "[<0>] hrtimer_nanosleep+0x99/0x120\n[<0>] nfs_wait_bit_killable+0x1f/0x80 [nfs]\n\
                [<0>] do_syscall_64+0x5b/0x1b0\n";
    assert_eq!(
        parse_kernel_stack(text),
        [
            "do_syscall_64",
            "nfs_wait_bit_killable",
            "hrtimer_nanosleep"
        ]
    );
    assert!(parse_kernel_stack("").is_empty());
}

#[test]
fn kernel_stacks_of_a_fake_proc() {
    let root = tempfile::tempdir().unwrap();
    for (tid, stack) in [(12, "[<0>] b+0x1/0x2\n[<0>] a+0x1/0x2\n"), (9, "")] {
        let dir = root.path().join("7/task").join(tid.to_string());
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("stack"), stack).unwrap();
    }
    // A task that ended while we read: its directory has no stack file.
    fs::create_dir_all(root.path().join("7/task/13")).unwrap();
    let stacks = kernel_stacks(root.path(), 7).unwrap();
    assert_eq!(stacks, [vec![], vec!["a".to_string(), "b".to_string()]]);
    let err = kernel_stacks(root.path(), 8).unwrap_err().to_string();
    assert!(err.contains("/8/task: "), "{err}");
}

#[test]
fn path_lookup() {
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("tool");
    fs::write(&exe, "#!/bin/sh\n").unwrap();
    fs::write(dir.path().join("plain"), "").unwrap();
    fs::set_permissions(&exe, fs::Permissions::from_mode(0o755)).unwrap();
    let path = env::join_paths(["/nonexistent".as_ref(), dir.path()]).unwrap();
    assert!(on_path("tool", &path));
    assert!(!on_path("plain", &path), "not executable");
    assert!(!on_path("missing", &path));
}

#[test]
fn a_stuck_tool_is_killed_at_its_deadline() {
    let start = Instant::now();
    let err = run(
        "sleep",
        &["10".to_string()],
        NO_PID,
        Duration::from_millis(100),
    )
    .unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(5));
    assert_eq!(
        err.to_string(),
        "pid 4194305: sleep: no answer after 100ms, killed"
    );
    let err = run("no-such-tool-here", &[], 5, TOOL_TIMEOUT)
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("pid 5: no-such-tool-here: cannot start: "),
        "{err}"
    );
}

/// A pid no process can have: above Linux's PID_MAX_LIMIT (2^22), so the SIGCONT sent after a
/// timeout reaches nobody.
const NO_PID: u32 = (1 << 22) + 1;

/// Kills and reaps a spawned process when the test ends, passed or not.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether a tool started by this test may ptrace this test's other child: root, or Yama's
/// ptrace_scope 0 (with scope 1 only an ancestor may, and the tool is a sibling).
fn may_trace_siblings() -> bool {
    let scope = fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").unwrap_or_default();
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    let root = status
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"));
    root || scope.trim().is_empty() || scope.trim() == "0"
}

/// Each tool present here, on a real `sleep`: a stack that ends in a sleep call; and a dead pid
/// gives an error naming the pid and the tool.
#[test]
fn tools_on_a_real_process() {
    let path = env::var_os("PATH").unwrap_or_default();
    let tools = [(Collector::EuStack, "eu-stack"), (Collector::Gdb, "gdb")];
    let present: Vec<Collector> = tools
        .into_iter()
        .filter(|(_, t)| on_path(t, &path))
        .map(|(c, _)| c)
        .collect();
    if present.is_empty() || !may_trace_siblings() {
        eprintln!("skipped: no eu-stack or gdb, or no right to ptrace here");
        return;
    }
    let sleep = Reaped(Command::new("sleep").arg("30").spawn().unwrap());
    // Let sleep reach its nanosleep; before exec the stack is the test's own fork path.
    thread::sleep(Duration::from_millis(200));
    for collector in present {
        let stacks = collector.stacks(sleep.0.id()).unwrap();
        let innermost = stacks[0].last().cloned().unwrap_or_default();
        assert!(innermost.contains("nanosleep"), "{collector:?}: {stacks:?}");
        let err = collector.stacks(NO_PID).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("pid 4194305: {}: no stack", collector.name())),
            "{err}"
        );
    }
}
