//! libgreedy end to end on loopback: a front end launches members through greedyrun (a fake
//! remote shell runs each host's agent here), from Rust (examples/libi_demo.rs) and from C
//! (examples/c/hostnames.c against include/greedy/libi.h and the cdylib).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The target directory this test runs from (`…/debug`), where greedyrun, the examples and
/// the cdylib are.
fn target() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

/// The C library as `cargo test` built it (a dependency's artifacts stay in `deps/`; a
/// `cargo build` also puts it beside the binaries).
fn cdylib() -> PathBuf {
    let built = ["deps/libgreedy_libi.so", "libgreedy_libi.so"].map(|p| target().join(p));
    let found = built.iter().find(|p| p.exists());
    found
        .cloned()
        .unwrap_or_else(|| panic!("no libgreedy_libi.so in {}", target().display()))
}

fn greedyrun() -> PathBuf {
    let path = target().join("greedyrun");
    assert!(
        path.exists(),
        "{} is missing: cargo build -p greedy-launcher",
        path.display()
    );
    path
}

/// A fake remote shell that ignores the host and runs the agent here.
fn localsh(dir: &Path) -> PathBuf {
    let sh = dir.join("localsh");
    std::fs::write(&sh, "#!/bin/sh\nshift\nexec sh -c \"exec $*\"\n").unwrap();
    std::fs::set_permissions(&sh, std::fs::Permissions::from_mode(0o755)).unwrap();
    sh
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn demo(rsh: &Path, hosts: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(target().join("examples/libi_demo"));
    cmd.env("GREEDYRUN", greedyrun()).arg(rsh).args(hosts);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

#[test]
fn every_collective_gives_its_known_answer_and_the_master_talks_to_the_front_end() {
    let dir = tempfile::tempdir().unwrap();
    let rsh = localsh(dir.path());
    let out = demo(&rsh, &["127.0.0.1:2", "127.0.0.2:3"], &[]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout} {stderr}");
    // The front end's word came back broadcast; the gather is in rank order; 0+1+2+3+4 = 10.
    assert!(
        stdout.contains("front end got: hello from the front end | 0,1,2,3,4 | sum 10"),
        "{stdout} {stderr}"
    );
    assert!(stdout.contains("session ended: 0"), "{stdout}");
}

#[test]
fn a_member_that_dies_ends_the_session_and_the_front_end_is_told_its_host() {
    let dir = tempfile::tempdir().unwrap();
    let rsh = localsh(dir.path());
    let out = demo(
        &rsh,
        &["127.0.0.1:2", "127.0.0.2:2"],
        &[("LIBI_DEMO_DIE", "3")],
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    // greedyrun names the rank and its host; the front end's error carries it.
    assert!(stderr.contains("the session ended"), "{stderr}");
    assert!(
        stderr.contains("rank 3") && stderr.contains("127.0.0.2"),
        "{stderr}"
    );
}

#[test]
fn a_process_outside_a_session_is_told_it_is_not_a_member() {
    let out = Command::new(target().join("examples/libi_demo"))
        .env("PMI_RANK", "0")
        .env_remove("PMI_FD")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("not a libgreedy member: PMI_SIZE is not set"),
        "{}",
        text(&out.stderr)
    );
    // A descriptor that is not the agent's socket (here a pipe, stdin) is refused, not used.
    let out = Command::new(target().join("examples/libi_demo"))
        .env("PMI_RANK", "0")
        .env("PMI_SIZE", "1")
        .env("PMI_FD", "0")
        .output()
        .unwrap();
    assert!(
        text(&out.stderr).contains("PMI_FD=\"0\" is not valid"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_c_tool_launches_daemons_and_gathers_through_the_c_api() {
    let dir = tempfile::tempdir().unwrap();
    let rsh = localsh(dir.path());
    let lib = dir.path().join("lib");
    std::fs::create_dir(&lib).unwrap();
    // The soname is libgreedy.so.0, as the packages install it.
    std::os::unix::fs::symlink(cdylib(), lib.join("libgreedy.so.0")).unwrap();
    std::os::unix::fs::symlink("libgreedy.so.0", lib.join("libgreedy.so")).unwrap();
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let exe = dir.path().join("hostnames");
    let built = Command::new("cc")
        .args(["-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg(crate_dir.join("examples/c/hostnames.c"))
        .arg("-I")
        .arg(crate_dir.join("include"))
        .arg("-L")
        .arg(&lib)
        .arg("-lgreedy")
        .output()
        .unwrap();
    assert!(built.status.success(), "cc: {}", text(&built.stderr));
    let out = Command::new(&exe)
        .env("LD_LIBRARY_PATH", &lib)
        .env("GREEDYRUN", greedyrun())
        .args(["rsh"])
        .arg(&rsh)
        .args(["127.0.0.1:1", "127.0.0.2:2"])
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout} {}", text(&out.stderr));
    let lines: Vec<&str> = stdout.lines().filter(|l| l.starts_with("hello ")).collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    for (r, line) in lines.iter().enumerate() {
        assert!(line.starts_with(&format!("hello {r}/3 on ")), "{stdout}");
    }
}

#[test]
fn the_tool_builders_guide_shows_the_example_as_it_is() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let guide = std::fs::read_to_string(crate_dir.join("../docs/tool-builders.md")).unwrap();
    let example = std::fs::read_to_string(crate_dir.join("examples/c/hostnames.c")).unwrap();
    let block = guide
        .split("```c\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("docs/tool-builders.md has a C block");
    assert_eq!(
        block, example,
        "docs/tool-builders.md's C example differs from examples/c/hostnames.c"
    );
}

#[test]
fn a_front_end_broadcasts_files_its_members_find_on_their_hosts() {
    use greedy_libi::{Backend, Distribution, FrontEnd, HostGroup};
    let dir = tempfile::tempdir().unwrap();
    let rsh = localsh(dir.path());
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8).collect();
    let (file, expected) = (dir.path().join("table.dat"), dir.path().join("expected"));
    std::fs::write(&file, &data).unwrap();
    std::fs::write(&expected, &data).unwrap();
    let mut group = HostGroup::new("/bin/sh");
    let check = format!(r#"cmp "$GREEDY_BCAST/table.dat" {}"#, expected.display());
    group.args = vec!["-c".into(), check];
    group.hosts = vec![("127.0.0.1".into(), 1), ("127.0.0.2".into(), 2)];
    let distribution = Distribution::new(vec![group])
        .unwrap()
        .with_bcast(vec![file.display().to_string()])
        .unwrap();
    let backend = Backend::Greedyrun {
        rsh: rsh.display().to_string(),
    };
    let front = FrontEnd::with_greedyrun(greedyrun().display().to_string());
    let outcome = front
        .launch(&distribution, &backend)
        .unwrap()
        .wait()
        .unwrap();
    assert!(outcome.success(), "{outcome:?}");
    // Without the file's copy the same members fail: the check is real.
    std::fs::write(&expected, b"other").unwrap();
    let outcome = front
        .launch(&distribution, &backend)
        .unwrap()
        .wait()
        .unwrap();
    assert!(!outcome.success(), "{outcome:?}");
}

#[test]
fn the_python_binding_runs_the_same_collectives() {
    let dir = tempfile::tempdir().unwrap();
    let rsh = localsh(dir.path());
    let lib = dir.path().join("lib");
    std::fs::create_dir(&lib).unwrap();
    std::os::unix::fs::symlink(cdylib(), lib.join("libgreedy.so.0")).unwrap();
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../python/greedy-libi");
    let out = Command::new("python3")
        .arg(python.join("example.py"))
        .arg(&rsh)
        .args(["127.0.0.1:2", "127.0.0.2:1"])
        .env("PYTHONPATH", &python)
        .env("LD_LIBRARY_PATH", &lib)
        .env("GREEDYRUN", greedyrun())
        .output()
        .unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout} {stderr}");
    assert!(
        stdout.contains("front end got: hello from python | 0,1,2"),
        "{stdout} {stderr}"
    );
}
