//! The library's layers only look down: a module may use what sits below it, never what sits
//! above (ARCHITECTURE.md, "Layers"). Read from the sources' `crate::` paths, so that a new
//! arrow upward fails here rather than in a review.
#![allow(unused_crate_dependencies)] // a test target sees every dependency of the package
use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

/// Bottom up. A module may use modules of a lower rank only.
const LAYERS: &[(&str, u8)] = &[
    ("model", 0),
    ("mem", 1),
    ("sync", 1),
    ("exposition", 1),
    ("ratelimit", 1),
    ("runner", 1),
    ("sched", 2),
    ("testlog", 2),
    ("cgroup", 2),
    ("kernel", 2),
    ("pleg", 3),
    ("cri", 3),
    ("pressure", 3),
    ("pipeline", 4),
    ("reconcile", 5),
    ("kube", 6),
    ("status", 7),
    ("fastpath", 8),
    ("present", 9),
    ("error", 10),
    ("agent", 11),
    ("cli", 12),
];

/// Arrows that point sideways or up on purpose, each with its reason.
const ALLOWED: &[(&str, &str, &str)] = &[
    (
        "sync",
        "testlog",
        "sync's own test captures the line a poisoned lock logs",
    ),
    (
        "testlog",
        "cli",
        "tests capture logs through the binary's own filter: they see what an operator sees",
    ),
];

fn rank(module: &str) -> Option<u8> {
    LAYERS.iter().find(|(m, _)| *m == module).map(|(_, r)| *r)
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level modules a source names through `crate::` paths, comments left out.
fn uses(text: &str) -> BTreeSet<String> {
    let code: String = text
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = BTreeSet::new();
    let mut rest = code.as_str();
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(inner) = rest.strip_prefix('{') {
            // `crate::{a::x, b::{y, z}}`: the first name of each top-level item.
            let mut depth = 0;
            let mut item_start = true;
            for (j, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if item_start && (c.is_ascii_alphabetic() || c == '_') => {
                        let name: String = inner[j..]
                            .chars()
                            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                            .collect();
                        out.insert(name);
                        item_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

#[test]
fn layers_only_look_down() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    files.sort();
    let mut wrong = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(&src).expect("under src");
        let top = rel
            .components()
            .next()
            .and_then(|c| c.as_os_str().to_str())
            .map(|s| s.trim_end_matches(".rs").to_string())
            .expect("a file name");
        if top == "lib" || top == "main" {
            continue;
        }
        let Some(own) = rank(&top) else {
            wrong.push(format!(
                "{}: module `{top}` has no place in LAYERS (tests/layers.rs): give it one",
                rel.display()
            ));
            continue;
        };
        let text = std::fs::read_to_string(file).expect("a readable source");
        for used in uses(&text) {
            if used == top || ALLOWED.iter().any(|(a, b, _)| *a == top && *b == used) {
                continue;
            }
            // Items of the crate root (`crate::Error`) are the root's re-exports.
            let Some(theirs) = rank(&used) else {
                if used.chars().next().is_some_and(char::is_uppercase) {
                    continue;
                }
                wrong.push(format!(
                    "{}: uses `crate::{used}`, which has no place in LAYERS",
                    rel.display()
                ));
                continue;
            };
            if theirs >= own {
                wrong.push(format!(
                    "{}: `{top}` (layer {own}) uses `crate::{used}` (layer {theirs}): \
                     a layer may only use those below it",
                    rel.display()
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "\n{}\n", wrong.join("\n"));
}

#[test]
fn the_reader_finds_braced_and_plain_paths() {
    let text = "use crate::{\n    kube::{self, x},\n    model::PodUid,\n};\n\
                // crate::cli is only said in a comment\n\
                fn f() { crate::status::g(); }\n";
    let got: Vec<_> = uses(text).into_iter().collect();
    assert_eq!(got, ["kube", "model", "status"]);
}
