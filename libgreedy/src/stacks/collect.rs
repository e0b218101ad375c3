//! The call stack of every thread of a process, from eu-stack, gdb or the kernel.
//!
//! Each collector runs its tool on one pid and parses what it prints; the parsers are pure
//! functions over the text, tested on output captured from real runs (`testdata/`). Frames come
//! out outermost first (`_start`, `main`, ..., innermost) so stacks of different ranks share
//! prefixes. A frame is the function name as the tool prints it, minus what differs between ranks
//! waiting in the same place: arguments, source lines, ELF symbol versions (`@GLIBC_2.2.5`) and
//! Rust's legacy hash suffix (`::h0123456789abcdef`). A frame with no symbol is `??@module` (the
//! module's file name) when the tool names the module, else `??`. A stack the tool could not
//! unwind to its outermost frame (frame limit, unwind error) starts with `...`, so such stacks
//! group under one node instead of rooting at whatever frame the unwind stopped in.
//!
//! The tool runs with a deadline ([`TOOL_TIMEOUT`]): a process stuck in uninterruptible sleep
//! can hang a ptrace attach, and the daemon must still answer for its other ranks.

use std::env;
use std::ffi::OsStr;
use std::fs;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::Error;

/// How long a tool may take for one process before it is killed. eu-stack takes 5-15 ms and
/// gdb about 200 ms for a small program here; gdb loading the symbols of a large MPI program
/// from a network file system takes seconds, so 20 s leaves room without letting a stuck
/// attach hold the daemon.
pub const TOOL_TIMEOUT: Duration = Duration::from_secs(20);

/// The first frame of a stack the tool could not unwind to its outermost frame.
pub const INCOMPLETE: &str = "...";

/// eu-stack's frame limit per thread. Its default, 256, cuts deep recursion, and the frames lost
/// are the outermost ones, which the tree needs; past 2048 a loop in a corrupt stack would only
/// make output.
const EU_STACK_MAX_FRAMES: &str = "2048";

/// A way to take the stacks of a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Collector {
    /// elfutils' `eu-stack -p PID`: fast, attaches only while it unwinds.
    EuStack,
    /// `gdb -batch -p PID -ex 'thread apply all bt'`: slower, loads all symbols first.
    Gdb,
    /// `/proc/PID/task/*/stack`: kernel frames only, needs root; a thread running in user space
    /// has an empty stack.
    Kernel,
}

impl Collector {
    /// The best collector usable here: eu-stack, else gdb (found on PATH), else kernel stacks
    /// if /proc/self/stack is readable (root), else none.
    pub fn available() -> Option<Collector> {
        let path = env::var_os("PATH").unwrap_or_default();
        if on_path("eu-stack", &path) {
            Some(Collector::EuStack)
        } else if on_path("gdb", &path) {
            Some(Collector::Gdb)
        } else if fs::read("/proc/self/stack").is_ok() {
            Some(Collector::Kernel)
        } else {
            None
        }
    }

    /// The tool's name, as errors show it.
    pub fn name(self) -> &'static str {
        match self {
            Collector::EuStack => "eu-stack",
            Collector::Gdb => "gdb",
            Collector::Kernel => "kernel",
        }
    }

    /// The stack of each thread of `pid`, frames outermost first; the tool gets
    /// [`TOOL_TIMEOUT`].
    pub fn stacks(&self, pid: u32) -> Result<Vec<Vec<String>>, Error> {
        self.stacks_within(pid, TOOL_TIMEOUT)
    }

    /// [`Collector::stacks`] with the tool's time limit given.
    pub fn stacks_within(&self, pid: u32, timeout: Duration) -> Result<Vec<Vec<String>>, Error> {
        let tool = self.name();
        if *self == Collector::Kernel {
            return kernel_stacks(Path::new("/proc"), pid);
        }
        let ran = run(tool, &self.args(pid), pid, timeout)?;
        let threads = match self {
            Collector::Gdb => parse_gdb(&ran.stdout),
            _ => parse_eu_stack(&ran.stdout, &ran.stderr),
        };
        if threads.is_empty() {
            let (status, message) = (ran.status.to_string(), last_line(&ran.stderr).to_string());
            return Err(Error::NoStack {
                pid,
                tool,
                status,
                message,
            });
        }
        Ok(threads)
    }

    /// The tool's arguments for `pid`. gdb gets no init files (a user's .gdbinit could change
    /// the output), no debuginfod (a download per library would blow the deadline) and no
    /// argument values (faster, and a string argument cannot confuse the parser).
    fn args(self, pid: u32) -> Vec<String> {
        let pid = pid.to_string();
        let args: &[&str] = match self {
            Collector::EuStack => &["-m", "-n", EU_STACK_MAX_FRAMES, "-p", &pid],
            Collector::Gdb => &[
                "-batch",
                "-nx",
                "-iex",
                "set debuginfod enabled off",
                "-ex",
                "set print frame-arguments none",
                "-p",
                &pid,
                "-ex",
                "thread apply all bt",
            ],
            Collector::Kernel => &[],
        };
        args.iter().map(|a| a.to_string()).collect()
    }
}

/// Whether `name` is an executable file in one of `path`'s directories.
fn on_path(name: &str, path: &OsStr) -> bool {
    env::split_paths(path).any(|dir| {
        let meta = fs::metadata(dir.join(name));
        meta.is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

/// What a tool printed.
#[derive(Debug)]
struct Ran {
    /// How it ended.
    status: ExitStatus,
    /// Its standard output, lossily UTF-8.
    stdout: String,
    /// Its standard error, lossily UTF-8.
    stderr: String,
}

/// Runs `tool args` on `pid`'s behalf, killing it after `timeout`.
fn run(tool: &'static str, args: &[String], pid: u32, timeout: Duration) -> Result<Ran, Error> {
    let mut child = Command::new(tool)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // elfutils would fetch debug info over the network when this is set (debuginfod).
        .env_remove("DEBUGINFOD_URLS")
        .spawn()
        .map_err(|source| Error::Spawn { pid, tool, source })?;
    // Read both pipes while waiting: a tool blocked on a full pipe would never exit.
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let Some(status) = wait_until(&mut child, Instant::now() + timeout) else {
        resume(pid);
        return Err(Error::Timeout {
            pid,
            tool,
            after: timeout,
        });
    };
    // A reader only fails to join if it panicked; its text is then lost, not the stacks'.
    let text = |h: thread::JoinHandle<String>| h.join().unwrap_or_default();
    Ok(Ran {
        status,
        stdout: text(stdout),
        stderr: text(stderr),
    })
}

/// A thread reading `pipe` to its end.
fn drain<R: Read + Send + 'static>(pipe: Option<R>) -> thread::JoinHandle<String> {
    thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_end(&mut bytes);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// Waits for `child` until `deadline`, then kills it; `None` if it had to be killed. std has no
/// wait with a timeout, so this polls; 5 ms is little beside a tool's 5-200 ms and costs nothing
/// while waiting.
fn wait_until(child: &mut Child, deadline: Instant) -> Option<ExitStatus> {
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(5)),
            // Past the deadline, or the wait itself failed: either way the tool is no use.
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
}

/// Sends SIGCONT to `pid` after its tracer was killed: a tracer that dies between attaching
/// (which stops the tracee) and detaching can leave the rank stopped. SIGCONT to a running
/// process does nothing. Best effort, through kill(1), as this crate has no unsafe code for
/// kill(2).
fn resume(pid: u32) {
    let _ = Command::new("kill")
        .args(["-s", "CONT", &pid.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// The last non-blank line of a tool's stderr: its reason for failing.
fn last_line(text: &str) -> &str {
    text.lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty())
        .unwrap_or("no message")
}

/// Parses `eu-stack -m -p PID` output (`TID t:` then `#n  0xADDR [name] - module` lines,
/// innermost first) into stacks, outermost first. Threads that `stderr` reports trouble with
/// (`eu-stack: tid 12: shown max number of frames ...`, `dwfl_thread_getframes tid 12 ...`)
/// start with [`INCOMPLETE`].
pub fn parse_eu_stack(stdout: &str, stderr: &str) -> Vec<Vec<String>> {
    let incomplete = troubled_tids(stderr);
    let mut threads: Vec<(u32, Vec<String>)> = Vec::new();
    for line in stdout.lines() {
        if let Some(tid) = line.strip_prefix("TID ") {
            let tid = tid.trim_end_matches(':').trim().parse().unwrap_or(0);
            threads.push((tid, Vec::new()));
        } else if let (Some(rest), Some((_, frames))) = (line.strip_prefix('#'), threads.last_mut())
        {
            frames.push(eu_stack_frame(rest));
        }
    }
    let outermost_first = |(tid, mut frames): (u32, Vec<String>)| {
        if incomplete.contains(&tid) {
            frames.push(INCOMPLETE.to_string());
        }
        frames.reverse();
        frames
    };
    threads.into_iter().map(outermost_first).collect()
}

/// The thread ids named in eu-stack's stderr (`... tid 12: ...`, `... tid 12 at 0x...`).
fn troubled_tids(stderr: &str) -> Vec<u32> {
    let tid_after = |(_, rest): (&str, &str)| {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        rest[..digits].parse().ok()
    };
    stderr
        .lines()
        .filter_map(|l| l.split_once("tid ").and_then(tid_after))
        .collect()
}

/// One eu-stack frame after its `#`: `3  0x00005623db2a9f81 name - /path/module`; the name is
/// missing when the address has no symbol. Demangled C++ names hold spaces, so the module is
/// split off at the last ` - `.
fn eu_stack_frame(rest: &str) -> String {
    // Skip the frame number and the address.
    let mut words = rest.trim_start().splitn(2, char::is_whitespace);
    let _number = words.next();
    let rest = words.next().unwrap_or("").trim_start();
    let rest = rest
        .split_once(char::is_whitespace)
        .map_or("", |(_addr, r)| r.trim());
    let (name, module) = match rest.strip_prefix("- ") {
        Some(module) => ("", module),
        None => rest.rsplit_once(" - ").unwrap_or((rest, "")),
    };
    if name.is_empty() {
        return unknown_in(module);
    }
    strip_rust_hash(strip_symbol_version(name)).to_string()
}

/// Parses `gdb -batch -ex 'thread apply all bt'` output (`Thread N (...):` then `#n ...` lines,
/// innermost first) into stacks, outermost first. gdb's messages before the first thread are
/// skipped; a `Backtrace stopped:` line marks its thread [`INCOMPLETE`].
pub fn parse_gdb(stdout: &str) -> Vec<Vec<String>> {
    let mut threads: Vec<Vec<String>> = Vec::new();
    for line in stdout.lines() {
        if line.starts_with("Thread ") && line.ends_with("):") {
            threads.push(Vec::new());
        } else if let (Some(rest), Some(frames)) = (line.strip_prefix('#'), threads.last_mut()) {
            frames.push(gdb_frame(rest));
        } else if let (true, Some(frames)) =
            (line.starts_with("Backtrace stopped"), threads.last_mut())
        {
            frames.push(INCOMPLETE.to_string());
        }
    }
    for frames in &mut threads {
        frames.reverse();
    }
    threads
}

/// One gdb frame after its `#`: `1  0x00007f... in name (args) at file.c:5`, or without the
/// address when the pc is at a line's start or the frame is inlined, or `... from /lib/x.so`
/// when there is no debug info, or `<signal handler called>`.
fn gdb_frame(rest: &str) -> String {
    let mut words = rest.trim_start().splitn(2, char::is_whitespace);
    let _number = words.next();
    let mut rest = words.next().unwrap_or("").trim_start();
    if rest.starts_with("0x") {
        let after_addr = rest
            .split_once(char::is_whitespace)
            .map_or("", |(_, r)| r.trim_start());
        rest = after_addr.strip_prefix("in ").unwrap_or(after_addr);
    }
    if rest.starts_with('<') {
        return rest.trim_end().to_string();
    }
    let Some((name, tail)) = split_gdb_args(rest) else {
        return rest.trim().to_string();
    };
    match tail.strip_prefix(" from ") {
        Some(module) if name == "??" => unknown_in(module),
        _ => strip_rust_hash(name).to_string(),
    }
}

/// Splits `name (args)[ at file:line| from lib]` into the name and what follows the args. Names
/// may hold ` (` themselves (`std::function<void (int)>::operator()`), so the args are the
/// first ` (...)` group whose closing paren ends the line or precedes ` at ` or ` from `.
fn split_gdb_args(text: &str) -> Option<(&str, &str)> {
    for (open, _) in text.match_indices(" (") {
        let Some(close) = matching_paren(text, open + 1) else {
            continue;
        };
        let tail = &text[close + 1..];
        if tail.is_empty() || tail.starts_with(" at ") || tail.starts_with(" from ") {
            return Some((text[..open].trim(), tail));
        }
    }
    None
}

/// The index of the `)` closing the `(` at `open`.
fn matching_paren(text: &str, open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in text[open..].char_indices() {
        match c {
            '(' => depth += 1,
            ')' if depth == 1 => return Some(open + i),
            ')' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    None
}

/// `??@libname` for an address with no symbol in `module` (a path), `??` if the module is
/// unknown. Pseudo-modules like `[vdso: 1234]` lose their pid, which differs per rank.
fn unknown_in(module: &str) -> String {
    let module = module.trim();
    let base = if module.starts_with('[') {
        module
            .split(':')
            .next()
            .unwrap_or(module)
            .trim_end_matches(']')
    } else {
        module.rsplit('/').next().unwrap_or(module)
    };
    match base {
        "" => "??".to_string(),
        b if b.starts_with('[') => format!("??@{b}]"),
        b => format!("??@{b}"),
    }
}

/// `clock_nanosleep@GLIBC_2.2.5` → `clock_nanosleep`: the ELF symbol version eu-stack prints.
fn strip_symbol_version(name: &str) -> &str {
    match name.split_once('@') {
        Some((base, version)) if !base.is_empty() && !version.contains([' ', '(', ':']) => base,
        _ => name,
    }
}

/// `rs::main::h6af98f44df74ee35` → `rs::main`: Rust legacy mangling's hash, which changes with
/// every build.
fn strip_rust_hash(name: &str) -> &str {
    match name.rsplit_once("::h") {
        Some((base, hash)) if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => {
            base
        }
        _ => name,
    }
}

/// The kernel stacks of `pid`'s threads from `proc_root/PID/task/TID/stack`, by thread id.
/// Threads that end while we read are skipped; if none can be read, the last error is returned.
fn kernel_stacks(proc_root: &Path, pid: u32) -> Result<Vec<Vec<String>>, Error> {
    let tasks = proc_root.join(pid.to_string()).join("task");
    let entries = fs::read_dir(&tasks).map_err(|source| Error::Read {
        path: tasks.clone(),
        source,
    })?;
    let mut tids: Vec<u32> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    tids.sort_unstable();
    let mut stacks = Vec::new();
    let mut last_err = None;
    for tid in tids {
        match fs::read_to_string(tasks.join(tid.to_string()).join("stack")) {
            Ok(text) => stacks.push(parse_kernel_stack(&text)),
            Err(e) => last_err = Some(e),
        }
    }
    match (stacks.is_empty(), last_err) {
        (true, Some(e)) => {
            let (tool, status) = ("kernel", "no exit status".to_string());
            Err(Error::NoStack {
                pid,
                tool,
                status,
                message: e.to_string(),
            })
        }
        _ => Ok(stacks),
    }
}

/// Parses a /proc/PID/task/TID/stack (`[<0>] do_nanosleep+0x71/0x280` lines, innermost first;
/// an optional `[module]` after) into function names, outermost first.
pub fn parse_kernel_stack(text: &str) -> Vec<String> {
    let frame = |line: &str| {
        let sym = line.split_once("] ").map_or(line, |(_, s)| s).trim();
        let name = sym.split(['+', ' ']).next().unwrap_or(sym);
        (!name.is_empty()).then(|| name.to_string())
    };
    let mut frames: Vec<String> = text.lines().filter_map(frame).collect();
    frames.reverse();
    frames
}

#[cfg(test)]
mod tests;
