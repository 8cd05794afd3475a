//! Race: a directory inside the root is swapped, as fast as a thread can, for a symlink to an
//! outside directory holding a file of the same name, while one broker reads and lists
//! through it. Resolution must happen beneath the root at the moment of each open, so no
//! response may ever carry outside bytes or outside names, whatever the interleaving.

// Tests, benches and examples work on their own files with `std::fs` (clippy.toml keeps
// it out of the library's request paths).
#![allow(clippy::disallowed_methods)]

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::symlink;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{Fsb, PolicyToml, RootToml, code, tempdir, with_deadline};
use serde_json::json;

const MARKER: &str = "OUTSIDE-MARKER-7f3a";
/// A file that exists only in the outside directory: no listing may name it.
const OUTSIDE_ONLY: &str = "only-outside.txt";
const INSIDE: &str = "inside content of swap/file.txt\n";
const RACE_FOR: Duration = Duration::from_secs(4);
/// Refusals a request may meet while the name is missing or a symlink leading out.
const REFUSALS: &[&str] = &[
    "FILE_NOT_FOUND",
    "PERMISSION_DENIED",
    "IO_ERROR",
    "INVALID_PATH",
];

#[derive(Default, Debug)]
struct Tally {
    read_inside: u64,
    read_refused: BTreeMap<String, u64>,
    list_inside: u64,
    list_refused: BTreeMap<String, u64>,
}

#[test]
fn swapping_a_directory_for_an_outside_symlink_never_leaks() {
    let (tmp, base) = tempdir();
    let proj = base.join("proj");
    std::fs::create_dir_all(proj.join("swap")).unwrap();
    std::fs::write(proj.join("swap/file.txt"), INSIDE).unwrap();
    std::fs::create_dir_all(base.join("outside_dir")).unwrap();
    // A different size too, so a listing that described the outside file would show it.
    std::fs::write(
        base.join("outside_dir/file.txt"),
        format!("{MARKER} outside file.txt, a different length\n"),
    )
    .unwrap();
    std::fs::write(base.join("outside_dir").join(OUTSIDE_ONLY), MARKER).unwrap();
    // The prepared symlink waits beside the directory, inside the root.
    symlink("../outside_dir", proj.join(".swap_link")).unwrap();

    // Unlimited request rate, so the loop measures the race and not the rate limiter.
    let policy = PolicyToml::new()
        .root(RootToml::at(&proj).name("proj"))
        .unlimited()
        .write_to(&base.join("policy.toml"));

    let stop = Arc::new(AtomicBool::new(false));
    let flips = Arc::new(AtomicU64::new(0));
    let swapper = {
        let (stop, flips, proj) = (Arc::clone(&stop), Arc::clone(&flips), proj.clone());
        std::thread::spawn(move || {
            let (swap, dir, link) = (
                proj.join("swap"),
                proj.join(".swap_dir"),
                proj.join(".swap_link"),
            );
            // One flip: directory away, symlink onto the name, symlink away, directory back.
            // A symlink cannot be renamed over a directory, so each half leaves the name
            // missing for the time of one rename.
            while !stop.load(Ordering::Relaxed) {
                std::fs::rename(&swap, &dir).unwrap();
                std::fs::rename(&link, &swap).unwrap();
                std::fs::rename(&swap, &link).unwrap();
                std::fs::rename(&dir, &swap).unwrap();
                flips.fetch_add(1, Ordering::Relaxed);
            }
        })
    };

    let reader = {
        let stop = Arc::clone(&stop);
        move || {
            let mut b = Fsb::spawn(&["serve".as_ref(), "--policy".as_ref(), policy.as_os_str()]);
            let mut tally = Tally::default();
            let started = Instant::now();
            let mut i = 0u64;
            while started.elapsed() < RACE_FOR {
                i += 1;
                let list = i % 4 == 0;
                let (method, path) = if list {
                    ("files/list", "swap")
                } else {
                    ("files/read", "swap/file.txt")
                };
                let resp = b.request(method, json!({ "path": path }));
                let raw = &b.last_raw;
                assert!(!raw.contains(MARKER), "{method}: outside bytes: {raw}");
                assert!(!raw.contains(OUTSIDE_ONLY), "{method}: outside name: {raw}");
                if let Some(err) = resp.get("error") {
                    let c = code(err);
                    assert!(REFUSALS.contains(&c.as_str()), "{method}: {raw}");
                    assert_eq!(err["data"]["path"], path, "{raw}");
                    if c == "PERMISSION_DENIED" {
                        assert_eq!(err["data"]["reason"], "outside every root", "{raw}");
                    }
                    let per_code = if list {
                        &mut tally.list_refused
                    } else {
                        &mut tally.read_refused
                    };
                    *per_code.entry(c).or_default() += 1;
                } else if list {
                    let entries = resp["result"]["entries"].as_array().expect("entries");
                    assert_eq!(entries.len(), 1, "{raw}");
                    assert_eq!(entries[0]["path"], "proj/swap/file.txt", "{raw}");
                    assert_eq!(entries[0]["type"], "file", "{raw}");
                    assert_eq!(entries[0]["size"], INSIDE.len(), "{raw}");
                    tally.list_inside += 1;
                } else {
                    assert_eq!(resp["result"]["content"], INSIDE, "{raw}");
                    assert_eq!(resp["result"]["size"], INSIDE.len(), "{raw}");
                    tally.read_inside += 1;
                }
            }
            stop.store(true, Ordering::Relaxed);
            tally
        }
    };
    let stop_on_timeout = Arc::clone(&stop);
    let tally = with_deadline(
        RACE_FOR + Duration::from_secs(60),
        move || stop_on_timeout.store(true, Ordering::Relaxed),
        reader,
    );
    stop.store(true, Ordering::Relaxed);
    swapper.join().expect("swapper");
    let flips = flips.load(Ordering::Relaxed);

    let read_refused: u64 = tally.read_refused.values().sum();
    let list_refused: u64 = tally.list_refused.values().sum();
    println!(
        "race: {flips} flips; files/read: {} inside, {read_refused} refused {:?}; \
         files/list: {} inside, {list_refused} refused {:?}",
        tally.read_inside, tally.read_refused, tally.list_inside, tally.list_refused
    );
    assert!(flips > 0, "the swapper never flipped");
    assert!(
        tally.read_inside > 0,
        "no read ever saw the directory: {tally:?}"
    );
    assert!(read_refused > 0, "no read ever met the swap: {tally:?}");
    assert!(
        tally.list_inside + list_refused > 0,
        "files/list never ran: {tally:?}"
    );
    drop(tmp);
}
