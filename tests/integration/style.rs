//! Code conventions checked as tests: every Rust file opens with a `//!` line saying what it
//! owns, and no file is named `mod.rs` (`foo.rs` + `foo/` instead).

use super::support::repo;

fn rust_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn every_source_file_says_what_it_owns() {
    let mut files = Vec::new();
    for dir in ["src", "tests", "benches"] {
        rust_files(&repo().join(dir), &mut files);
    }
    assert!(files.len() > 50, "found only {files:?}");
    let missing: Vec<String> = files
        .iter()
        .filter(|f| {
            !std::fs::read_to_string(f)
                .unwrap()
                .lines()
                .next()
                .is_some_and(|l| l.starts_with("//!"))
        })
        .map(|f| f.display().to_string())
        .collect();
    assert!(
        missing.is_empty(),
        "files without a `//!` first line: {missing:?}"
    );
    let mod_rs: Vec<_> = files.iter().filter(|f| f.ends_with("mod.rs")).collect();
    assert!(mod_rs.is_empty(), "use foo.rs + foo/ instead: {mod_rs:?}");
}
