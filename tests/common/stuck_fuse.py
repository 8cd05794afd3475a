#!/usr/bin/env python3
"""A file system whose reads never finish: a hung network or FUSE mount, for tests.

Usage: stuck_fuse.py MOUNTPOINT

Speaks the kernel's FUSE protocol on /dev/fuse directly (no libfuse), mounts itself at
MOUNTPOINT with mount(8) (root only) and prints "ready" on stdout. It holds one directory with
one file, `slow.bin` (1 MiB): lookups, attributes, opens and closes are answered at once, and
every READ is left unanswered until this process ends, which aborts the connection (the
blocked readers then fail). Every other request gets ENOSYS. Ends on SIGTERM or when stdin
closes, unmounting lazily on the way.
"""
import os
import select
import signal
import struct
import subprocess
import sys

FUSE_LOOKUP, FUSE_FORGET, FUSE_GETATTR = 1, 2, 3
FUSE_OPEN, FUSE_READ, FUSE_STATFS, FUSE_RELEASE = 14, 15, 17, 18
FUSE_FLUSH, FUSE_INIT, FUSE_OPENDIR, FUSE_RELEASEDIR = 25, 26, 27, 29
FUSE_INTERRUPT, FUSE_DESTROY, FUSE_BATCH_FORGET = 36, 38, 42
ENOENT, ENOSYS = 2, 38
FILE_NODE, FILE_SIZE = 2, 1 << 20
IN_HEADER = struct.Struct("<IIQQIIIHH")  # len opcode unique nodeid uid gid pid extlen pad


def attr(node):
    # ino size blocks atime mtime ctime atimensec mtimensec ctimensec mode nlink uid gid
    # rdev blksize flags
    if node == 1:
        return struct.pack("<QQQQQQIIIIIIIIII", 1, 0, 0, 0, 0, 0, 0, 0, 0,
                           0o040755, 2, 0, 0, 0, 4096, 0)
    return struct.pack("<QQQQQQIIIIIIIIII", FILE_NODE, FILE_SIZE, FILE_SIZE // 512,
                       0, 0, 0, 0, 0, 0, 0o100644, 1, 0, 0, 0, 4096, 0)


def main():
    mountpoint = sys.argv[1]
    fd = os.open("/dev/fuse", os.O_RDWR)
    subprocess.run(
        ["mount", "-t", "fuse", "-o",
         f"fd={fd},rootmode=40000,user_id=0,group_id=0,allow_other", "stuckfs", mountpoint],
        pass_fds=[fd], check=True)

    def reply(unique, error=0, payload=b""):
        os.write(fd, struct.pack("<IiQ", 16 + len(payload), -error, unique) + payload)

    def stop(*_):
        subprocess.run(["umount", "-l", mountpoint], check=False)
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    print("ready", flush=True)
    while True:
        ready, _, _ = select.select([fd, sys.stdin], [], [])
        if sys.stdin in ready and not sys.stdin.buffer.read1(1):
            stop()
        if fd not in ready:
            continue
        data = os.read(fd, 1 << 20 | 4096)
        length, opcode, unique, node = IN_HEADER.unpack_from(data)[:4]
        body = data[IN_HEADER.size:length]
        if opcode == FUSE_INIT:
            major, minor, readahead, flags = struct.unpack_from("<IIII", body)
            # major minor max_readahead flags max_background congestion max_write time_gran
            # max_pages map_alignment flags2 max_stack_depth request_timeout unused[11]
            out = struct.pack("<IIIIHHIIHHIIH22x", 7, min(minor, 31), readahead, 0, 16, 12,
                              128 << 10, 1, 32, 0, 0, 0, 0)
            reply(unique, payload=out)
        elif opcode == FUSE_LOOKUP:
            name = body.split(b"\0", 1)[0]
            if node == 1 and name == b"slow.bin":
                reply(unique, payload=struct.pack("<QQQQII", FILE_NODE, 0, 1, 1, 0, 0)
                      + attr(FILE_NODE))
            else:
                reply(unique, ENOENT)
        elif opcode == FUSE_GETATTR:
            reply(unique, payload=struct.pack("<QII", 1, 0, 0) + attr(node))
        elif opcode in (FUSE_OPEN, FUSE_OPENDIR):
            reply(unique, payload=struct.pack("<QIi", 1, 0, 0))
        elif opcode == FUSE_READ:
            pass  # the point: never answered
        elif opcode in (FUSE_RELEASE, FUSE_RELEASEDIR, FUSE_FLUSH, FUSE_DESTROY):
            reply(unique)
        elif opcode in (FUSE_FORGET, FUSE_BATCH_FORGET, FUSE_INTERRUPT):
            pass  # no answer expected
        else:
            reply(unique, ENOSYS)


if __name__ == "__main__":
    main()
