//! The C library's soname: `libgreedy.so.0` (packages install `libgreedy_libi.so` under it),
//! and both symbol hash tables (the SysV one too, which older loaders and rpmlint look for).
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libgreedy.so.0");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--hash-style=both");
}
