//! The C library's soname: `libgreedy.so.0` (packages install `libgreedy_libi.so` under it).
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libgreedy.so.0");
}
