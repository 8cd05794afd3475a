//! `fsbroker bench`: the flags become `crate::bench`'s options (the `--quick` sizes, chunk
//! sizes without repeats), and its report is printed.

use std::process::ExitCode;

use super::{BenchArgs, print};

/// Runs `fsbroker bench`.
pub(super) fn run(args: BenchArgs) -> ExitCode {
    match crate::bench::main(args.options()) {
        Ok(report) => print(&report),
        Err(e) => {
            eprintln!("fsbroker bench: {e}");
            ExitCode::FAILURE
        }
    }
}

impl BenchArgs {
    fn options(self) -> crate::bench::Options {
        let (size, chunk, small) = if self.quick {
            (64 << 20, 1 << 20, 2_000)
        } else {
            (1 << 30, 8 << 20, 20_000)
        };
        let mut chunk_sizes = Vec::new();
        for c in self.chunk_size {
            if !chunk_sizes.contains(&c) {
                chunk_sizes.push(c);
            }
        }
        if chunk_sizes.is_empty() {
            chunk_sizes.push(chunk);
        }
        crate::bench::Options {
            file: self.file,
            size: self.size.unwrap_or(size),
            chunk_sizes,
            encoding: self.encoding,
            depth: self.depth,
            small_ops: self.small_ops.unwrap_or(small),
            small_depth: self.small_depth,
            verify: self.verify,
            json: self.json,
            compare_sftp: self.compare_sftp,
            broker_cmd: self.broker_cmd,
            only: self.only,
            watch_samples: self
                .watch_samples
                .unwrap_or(if self.quick { 20 } else { 200 })
                .max(1),
            list_entries: self
                .list_entries
                .unwrap_or(if self.quick { 10_000 } else { 100_000 })
                .max(1),
            mcp: self.mcp,
        }
    }
}
