"""Multi-buffer MD5: many files hashed at once, one file per SIMD lane.

Why our own code: DVC's digest is MD5, and MD5 is a strictly sequential chain inside one
file, so ``hashlib`` (OpenSSL) tops out near 0.6 GB/s per core here; a dataset is hashed
no faster than that times the cores.  But a dataset is many files, and the same MD5 step
can run on 16 files side by side in one vector register (the "multi-buffer" technique of
Intel's ISA-L), and with AVX-512 on 32 in two registers whose steps interleave.  No maintained Python
package offers that, so this module generates a small C library (GCC vector extensions:
AVX-512 / AVX2 / NEON, whatever ``-march=native`` gives), compiles it once with the system
C compiler into :func:`repro500.capture.cache.cache_dir`, and loads it with ``ctypes``
(which releases the GIL, so threads scale across cores).

Every digest equals ``hashlib.md5``'s: the library is self-tested against hashlib when it
is loaded, and anything unusual (no compiler, a big-endian machine, a failed self-test)
makes :func:`available` return False so callers use hashlib instead.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import heapq
import math
import os
import stat
import struct
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from repro500.capture.cache import cache_dir

# Two groups of 16 (md5x32); with 16 or fewer files left a round runs one group (md5x16).
LANES = 32
_GROUP = 16
# Per lane per round; a multiple of the 64-byte MD5 block.  A round's chunks are read and then
# hashed while still in cache: on a 2-core AMD EPYC (Zen 5, 32 lanes) two engines hashed 1 GB in
# 86-93 ms with 128 KiB, 93-98 ms with 256 KiB, 99-103 ms with 64 KiB (more reads) and 140 ms
# with 512 KiB (8 MiB a round per engine leaves the cache).
CHUNK_BYTES = 1 << 17
# files open at once per engine, among which each round's lanes are given (see _hash_files)
OPEN_FILES = 2 * LANES
_BLOCK = 64
_SHIFTS = ((7, 12, 17, 22), (5, 9, 14, 20), (4, 11, 16, 23), (6, 10, 15, 21))
_FUNCS = ("F", "G", "H", "I")
_INIT = (0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476)
# where lane i's word r (a, b, c, d) sits in the kernels' state: group-major, 16 lanes a row
_SLOT = [[(i // _GROUP) * 4 * _GROUP + r * _GROUP + i % _GROUP for r in range(4)] for i in range(LANES)]


def _steps(word: Callable[[int, int], str], groups: int = 1) -> str:
    """The 64 unrolled MD5 steps (RFC 1321) as C statements, for ``groups`` independent
    register sets (a0..d0, a1..d1, ...) interleaved step by step; ``word(group, k)`` names
    message word k of a group."""
    lines = []
    regs = [[f"{r}{g}" for r in "abcd"] for g in range(groups)]
    for i in range(64):
        rnd = i // 16
        k = (i, (5 * i + 1) % 16, (3 * i + 5) % 16, (7 * i) % 16)[rnd]
        t = int(abs(math.sin(i + 1)) * 2**32) & 0xFFFFFFFF
        for g in range(groups):
            a, b, c, d = regs[g]
            lines.append(f"  {a} = {b} + ROTL({a} + {_FUNCS[rnd]}({b}, {c}, {d}) + {word(g, k)} + "
                         f"0x{t:08x}u, {_SHIFTS[rnd][i % 4]});")
            regs[g] = [d, a, b, c]
    return "\n".join(lines)


def _fill(groups: int) -> str:
    """C that puts block ``blk`` of each lane into r0, r1, ... (row k: word k of the group's 16
    lanes) and marks the lanes still hashing in live0, live1, ...: with AVX-512 one register
    holds a row, and 16-word shuffles transpose the block in place; narrower, four 8 x 8
    transposes of 32-byte rows (``transpose8``)."""
    transpose = []
    for h in (8, 4, 2, 1):
        m1 = ", ".join(str(16 + c - h if c & h else c) for c in range(16))
        m2 = ", ".join(str(16 + c if c & h else c + h) for c in range(16))
        body = "\n".join(f"      {{ v x = r{g}[j], y = r{g}[j + {h}];\n"
                         f"        r{g}[j] = __builtin_shuffle(x, y, m1); "
                         f"r{g}[j + {h}] = __builtin_shuffle(x, y, m2); }}" for g in range(groups))
        transpose.append(f"    {{ const vu m1 = {{{m1}}}, m2 = {{{m2}}};\n"
                         f"      for (int j = 0; j < 16; j++) if (!(j & {h})) {{\n{body}\n      }} }}")
    fill = "\n".join(
        f"    for (int l = 0; l < 16; l++) {{\n"
        f"      int on = blk < nblocks[{16 * g} + l];\n"
        f"      memcpy(&r{g}[l], on ? ptrs[{16 * g} + l] + blk * 64 : zero, 64);\n"
        f"      live{g}[l] = on ? 0xffffffffu : 0u;\n"
        f"    }}" for g in range(groups))
    fill8 = "\n".join(
        f"    {{ const uint8_t *src[16];\n"
        f"      for (int l = 0; l < 16; l++) {{\n"
        f"        int on = blk < nblocks[{16 * g} + l];\n"
        f"        src[l] = on ? ptrs[{16 * g} + l] + blk * 64 : zero;\n"
        f"        live{g}[l] = on ? 0xffffffffu : 0u;\n"
        f"      }}\n"
        f"      transpose8(src, 0, (uint8_t *)r{g}, 0); transpose8(src, 8, (uint8_t *)r{g}, 0);\n"
        f"      transpose8(src + 8, 0, (uint8_t *)r{g}, 8); transpose8(src + 8, 8, (uint8_t *)r{g}, 8); }}"
        for g in range(groups))
    return f"#if defined(__AVX512F__)\n{fill}\n{chr(10).join(transpose)}\n#else\n{fill8}\n#endif"


def _vector_kernel(name: str, groups: int) -> str:
    """C for ``name``: 16 * ``groups`` lanes, each group of 16 one vector register wide.

    Why groups: each MD5 step waits on the one before (add, rotate, add), so one group of
    16 lanes leaves the vector units idle most cycles.  Two groups interleaved fill those
    cycles: on a 2-core AMD EPYC (Zen 5) one core hashed 7.4 GB/s with one group, 12.4 GB/s
    with two and 12.1 GB/s with three (registers run out)."""
    regs = [(g, j, x) for g in range(groups) for j, x in enumerate("abcd")]
    load = "\n".join(f"  memcpy(&s{x}{g}, state + {(4 * g + j) * 16}, 64);" for g, j, x in regs)
    store = "\n".join(f"  memcpy(state + {(4 * g + j) * 16}, &s{x}{g}, 64);" for g, j, x in regs)
    start = " ".join(f"v a{g} = sa{g}, b{g} = sb{g}, c{g} = sc{g}, d{g} = sd{g};" for g in range(groups))
    add = "\n".join(f"    s{x}{g} = (live{g} & (s{x}{g} + {x}{g})) | (~live{g} & s{x}{g});" for g, _, x in regs)
    return f"""
/* state: per group of 16 lanes a[16] b[16] c[16] d[16]; lane l hashes nblocks[l] blocks from ptrs[l]. */
void {name}(uint32_t *state, const uint8_t *const *ptrs, const int64_t *nblocks) {{
  static const uint8_t zero[64];
  v {", ".join(f"s{x}{g}" for g, _, x in regs)};
{load}
  int64_t most = 0;
  for (int l = 0; l < {16 * groups}; l++) if (nblocks[l] > most) most = nblocks[l];
  for (int64_t blk = 0; blk < most; blk++) {{
    v {", ".join(f"r{g}[16], live{g}" for g in range(groups))};
{_fill(groups)}
    {start}
{_steps(lambda g, k: f"r{g}[{k}]", groups)}
{add}
  }}
{store}
}}
"""


_HEADER = """/* generated by repro500.capture.md5mb: multi-buffer MD5 (RFC 1321) */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#if !defined(__GNUC__) || defined(__clang__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "needs GCC vector extensions on a little-endian machine"
#endif
typedef uint32_t v __attribute__((vector_size(64)));
typedef uint32_t vu __attribute__((vector_size(64)));
#define ROTL(x, s) (((x) << (s)) | ((x) >> (32 - (s))))
#if !defined(__AVX512F__)
/* The block transposed (row l: lane l's 16 words -> row k: word k of the 16 lanes) in 8 x 8 pieces
   of 32-byte rows, where a 64-byte vector is several registers.  GCC lowers a two-register shuffle of
   16 words (the AVX-512 path's vpermt2d) to scalar moves there, about 500 a block, and the kernel
   spent more time on them than on MD5 (one core of a Zen 4 EPYC, lanes in cache: AVX2 2.15 GB/s with
   them, 5.0 GB/s with these; SSE4 1.5 and 2.9 GB/s); the three steps below are each a single
   instruction on AVX2 (vpunpck[lh]dq, vpunpck[lh]qdq, vperm2i128/vinserti128), SSE and NEON.
   Words [word, word + 8) of rows[0..7] go to columns [col, col + 8) of out's 64-byte rows
   word..word + 7. */
typedef uint32_t h __attribute__((vector_size(32)));
static inline void transpose8(const uint8_t *const *rows, int word, uint8_t *out, int col) {
  h x[8], t[8], u[8];
  for (int i = 0; i < 8; i++) memcpy(&x[i], rows[i] + 4 * word, 32);
  const h lo = {0, 8, 1, 9, 4, 12, 5, 13}, hi = {2, 10, 3, 11, 6, 14, 7, 15};
  const h plo = {0, 1, 8, 9, 4, 5, 12, 13}, phi = {2, 3, 10, 11, 6, 7, 14, 15};
  const h qlo = {0, 1, 2, 3, 8, 9, 10, 11}, qhi = {4, 5, 6, 7, 12, 13, 14, 15};
  for (int i = 0; i < 8; i += 2) {
    t[i] = __builtin_shuffle(x[i], x[i + 1], lo);
    t[i + 1] = __builtin_shuffle(x[i], x[i + 1], hi);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = __builtin_shuffle(t[i], t[i + 2], plo);
    u[i + 1] = __builtin_shuffle(t[i], t[i + 2], phi);
    u[i + 2] = __builtin_shuffle(t[i + 1], t[i + 3], plo);
    u[i + 3] = __builtin_shuffle(t[i + 1], t[i + 3], phi);
  }
  for (int k = 0; k < 4; k++) {
    h first = __builtin_shuffle(u[k], u[k + 4], qlo), second = __builtin_shuffle(u[k], u[k + 4], qhi);
    memcpy(out + (word + k) * 64 + 4 * col, &first, 32);
    memcpy(out + (word + k + 4) * 64 + 4 * col, &second, 32);
  }
}
#endif
#define F(b, c, d) ((d) ^ ((b) & ((c) ^ (d))))
#if defined(__AVX512F__)
#define G(b, c, d) ((c) ^ ((d) & ((b) ^ (c))))  /* one vpternlogd */
#else
/* The two terms share no bit, so + is |; as a sum the compiler adds (c & ~d), which does not wait on
   b, into the step's other addends early, and a step waits on b for 2 operations instead of 3 (AVX2,
   one core of a Zen 4 EPYC: 5.1 against 4.9 GB/s). */
#define G(b, c, d) (((b) & (d)) + ((c) & ~(d)))
#endif
#define H(b, c, d) ((b) ^ (c) ^ (d))
#define I(b, c, d) ((c) ^ ((b) | ~(d)))
"""


def _scalar_kernel() -> str:
    """C for md5x1: one stream (the lanes of a round with fewer than 4 files left)."""
    return f"""
/* One stream: state[4], nblocks blocks from p (the tail of a lane when few files are left). */
void md5x1(uint32_t *state, const uint8_t *p, int64_t nblocks) {{
  uint32_t sa = state[0], sb = state[1], sc = state[2], sd = state[3];
  for (int64_t blk = 0; blk < nblocks; blk++) {{
    uint32_t w[16];
    memcpy(w, p + blk * 64, 64);
    uint32_t a0 = sa, b0 = sb, c0 = sc, d0 = sd;
{_steps(lambda g, k: f"w[{k}]")}
    sa += a0; sb += b0; sc += c0; sd += d0;
  }}
  state[0] = sa; state[1] = sb; state[2] = sc; state[3] = sd;
}}

"""


# One call per round, so that a round's 32 reads do not each take Python's lock.
_ROUND = """
/* A file of more than one chunk is hashed where the kernel keeps it (mmap) rather than copied into
   buf by read(): the copy cost a third of the time (on 2 cores of a Xeon at 2.5 GHz, 1.05 GB in
   100 files: 0.13 s mapped, 0.20 s read).  A mapped file cut short while it is hashed faults
   (SIGBUS) where a read would have returned less: inside md5_round the fault ends the round with
   -EFAULT instead of the process. */
static __thread sigjmp_buf *guard;
static struct sigaction previous;
static void on_sigbus(int sig, siginfo_t *info, void *ctx) {
  (void)info; (void)ctx;
  if (guard) siglongjmp(*guard, 1);
  sigaction(SIGBUS, &previous, NULL);  /* not a round's: as before this library came, once returned */
  raise(sig);
}
int md5_guard(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_sigbus;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  return sigaction(SIGBUS, &sa, &previous);
}
void *md5_map(int fd, int64_t size) {
  void *p = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (p == MAP_FAILED) return NULL;
  madvise(p, (size_t)size, MADV_SEQUENTIAL);
  return p;
}
void md5_unmap(void *p, int64_t size) { munmap(p, (size_t)size); }

/* One round over n <= 32 lanes, lane l hashing the file in slot slots[l]: a mapped file (maps[slot])
   gives its next chunk in place, and its last bytes (at most a chunk) are copied into lane l's part
   of buf; any other file is read into it, up to chunk bytes.  After a file's last bytes come its MD5
   padding, then done[slot].  Per slot: fds, maps and their sizes, total bytes hashed so far
   (lengths), state a b c d (states + 4 * slot).  Returns the data bytes hashed, or -errno with
   *failed = the lane's slot (-1 for a fault: a mapped file changed). */
static int64_t round_of(int n, const int32_t *slots, const int32_t *fds, const uint8_t *const *maps,
                        const int64_t *sizes, int64_t *lengths, uint32_t *states, int32_t *done,
                        uint8_t *buf, int64_t stride, int64_t chunk, int32_t *failed) {
  const uint8_t *ptrs[32];
  int64_t counts[32];
  uint32_t lanes[128];
  int64_t total = 0;
  for (int l = 0; l < n; l++) {
    int s = slots[l];
    uint8_t *p = buf + l * stride;
    int64_t got = 0;
    if (maps[s] && sizes[s] - lengths[s] > chunk) {
      ptrs[l] = maps[s] + lengths[s];
      counts[l] = chunk / 64;
      lengths[s] += chunk;
      total += chunk;
      continue;
    }
    if (maps[s]) {
      got = sizes[s] - lengths[s];
      memcpy(p, maps[s] + lengths[s], (size_t)got);
    } else {
      while (got < chunk) {  /* short reads do not mean the end on every file system */
        ssize_t r = read(fds[s], p + got, (size_t)(chunk - got));
        if (r < 0) {
          if (errno == EINTR) continue;
          *failed = s;
          return -errno;
        }
        if (r == 0) break;
        got += r;
      }
    }
    lengths[s] += got;
    total += got;
    if (maps[s] || got < chunk) {
      uint64_t bits = (uint64_t)lengths[s] * 8u;
      int64_t end = got + 1 + (int64_t)((55 - lengths[s] % 64 + 64) % 64);
      p[got] = 0x80;
      memset(p + got + 1, 0, (size_t)(end - got - 1));
      memcpy(p + end, &bits, 8);
      got = end + 8;
      done[s] = 1;
    }
    ptrs[l] = p;
    counts[l] = got / 64;
  }
  if (n < 4) {  /* a vector step costs a few scalar ones */
    for (int l = 0; l < n; l++) md5x1(states + 4 * slots[l], ptrs[l], counts[l]);
    return total;
  }
  int width = n > 16 ? 32 : 16;
  for (int l = 0; l < width; l++) {
    int g = l / 16 * 64 + l % 16;
    if (l >= n) { counts[l] = 0; ptrs[l] = buf; }
    for (int r = 0; r < 4; r++) lanes[g + 16 * r] = l < n ? states[4 * slots[l] + r] : 0;
  }
  if (width == 16) {
    md5x16(lanes, ptrs, counts);
  } else {
#if defined(__AVX512F__)
    md5x32(lanes, ptrs, counts);
#else
    /* narrower vectors already hold a group in 2-4 registers: two interleaved groups spill
       (one core of a Zen 4 EPYC, 32 lanes of 1 MiB: AVX2 4.0 against 4.9 GB/s; SSE4 1.1 against
       2.35 GB/s), so one group after the other */
    md5x16(lanes, ptrs, counts);
    md5x16(lanes + 64, ptrs + 16, counts + 16);
#endif
  }
  for (int l = 0; l < n; l++)
    for (int r = 0; r < 4; r++) states[4 * slots[l] + r] = lanes[l / 16 * 64 + l % 16 + 16 * r];
  return total;
}

int64_t md5_round(int n, const int32_t *slots, const int32_t *fds, const uint8_t *const *maps,
                  const int64_t *sizes, int64_t *lengths, uint32_t *states, int32_t *done, uint8_t *buf,
                  int64_t stride, int64_t chunk, int32_t *failed) {
  sigjmp_buf here;
  if (sigsetjmp(here, 1)) {
    guard = NULL;
    *failed = -1;
    return -EFAULT;
  }
  guard = &here;
  int64_t hashed = round_of(n, slots, fds, maps, sizes, lengths, states, done, buf, stride, chunk, failed);
  guard = NULL;
  return hashed;
}
"""


def _source() -> str:
    return "".join([_HEADER, _vector_kernel("md5x16", 1), _vector_kernel("md5x32", 2), _scalar_kernel(),
                    _ROUND])


# the instruction set the library is compiled for: this CPU's (a test narrows it to AVX2)
_MARCH = "native"
_lib: ctypes.CDLL | None = None
_lib_lock = threading.Lock()
_lib_failed = False


def _cpu_key() -> str:
    # -march=native code must not be loaded on a different CPU sharing this cache (NFS home)
    try:
        flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith(("flags", "Features"))), "")
    except OSError:
        flags = ""
    return f"{os.uname().machine}|{flags}"


def _build() -> ctypes.CDLL:
    source = _source()
    key = hashlib.sha256(f"{source}|{_cpu_key()}|{_MARCH}".encode()).hexdigest()[:16]
    target = cache_dir("ext") / f"md5mb-{key}.so"
    if not target.exists():
        # imported here: a process that finds the library built does not pay for them
        import subprocess
        import tempfile

        compiler = os.environ.get("CC", "cc")
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            src = Path(tmp) / "md5mb.c"
            src.write_text(source)
            out = Path(tmp) / "md5mb.so"
            try:
                subprocess.run([compiler, "-O3", f"-march={_MARCH}", "-fPIC", "-shared", "-o", str(out),
                                str(src)], check=True, capture_output=True, timeout=120)
            except subprocess.SubprocessError as err:  # failed or hung compiler: no kernel here
                raise OSError(f"cannot build the multi-buffer MD5 kernel: {err}") from err
            os.replace(out, target)  # atomic: concurrent builders race harmlessly
    lib = ctypes.CDLL(str(target))
    for kernel in (lib.md5x16, lib.md5x32):
        kernel.argtypes = [ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_void_p),
                           ctypes.POINTER(ctypes.c_int64)]
        kernel.restype = None
    lib.md5x1.argtypes = [ctypes.POINTER(ctypes.c_uint32), ctypes.c_void_p, ctypes.c_int64]
    lib.md5x1.restype = None
    i32, i64 = ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_int64)
    lib.md5_round.argtypes = [ctypes.c_int, i32, i32, ctypes.POINTER(ctypes.c_void_p), i64, i64,
                              ctypes.POINTER(ctypes.c_uint32), i32, ctypes.POINTER(ctypes.c_uint8),
                              ctypes.c_int64, ctypes.c_int64, i32]
    lib.md5_round.restype = ctypes.c_int64
    lib.md5_map.argtypes = [ctypes.c_int, ctypes.c_int64]
    lib.md5_map.restype = ctypes.c_void_p
    lib.md5_unmap.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.md5_unmap.restype = None
    lib.md5_guard.restype = ctypes.c_int
    return lib


def _self_test(lib: ctypes.CDLL) -> bool:
    """The three kernels, and one round read from pipes, against hashlib on padding-boundary
    lengths: about 1 ms per load (files of many chunks moving between lanes are the tests' to check)."""
    pattern = bytes(range(251)) * 280  # 70,280 bytes that do not repeat every 64
    lengths = [0, 1, 55, 56, 63, 64, 65, 119, 120, 127, 128, 1000, 4095, 4096, 10_000, 70_000]
    blobs = [pattern[i:i + n] for i, n in enumerate(lengths + [n + 7 for n in reversed(lengths)])]
    padded = [bytearray(b + _pad(len(b))) for b in blobs]
    addresses = [ctypes.addressof(ctypes.c_char.from_buffer(p)) for p in padded]
    want = [hashlib.md5(b).hexdigest() for b in blobs]
    for kernel, lanes in ((lib.md5x32, LANES), (lib.md5x16, _GROUP)):
        state = (ctypes.c_uint32 * (4 * LANES))()
        for i in range(lanes):
            for r in range(4):
                state[_SLOT[i][r]] = _INIT[r]
        ptrs = (ctypes.c_void_p * LANES)(*addresses[:lanes])
        counts = (ctypes.c_int64 * LANES)(*[len(p) // _BLOCK for p in padded[:lanes]])
        kernel(state, ptrs, counts)
        got = [struct.pack("<4I", *[state[_SLOT[i][r]] for r in range(4)]).hex() for i in range(lanes)]
        if got != want[:lanes]:
            return False
    for i in (2, 17, 31):
        one = (ctypes.c_uint32 * 4)(*_INIT)
        lib.md5x1(one, addresses[i], len(padded[i]) // _BLOCK)
        if struct.pack("<4I", *one).hex() != want[i]:
            return False
    short = [b for b in blobs if len(b) < 4096]  # each fits a pipe's buffer and one 4 KiB round
    return _round_matches(lib, short[:17]) and _round_matches(lib, short[-3:])


def _round_matches(lib: ctypes.CDLL, blobs: list[bytes]) -> bool:
    """md5_round, the call files go through, reading ``blobs`` from pipes in one round (17 lanes:
    both groups; 3: the scalar kernel)."""
    n, chunk = len(blobs), 4096
    pipes = [os.pipe() for _ in blobs]
    try:
        for (_, w), blob in zip(pipes, blobs, strict=True):
            os.write(w, blob)
            os.close(w)
        fds = (ctypes.c_int32 * n)(*[r for r, _ in pipes])
        slots = (ctypes.c_int32 * LANES)(*range(n))
        lengths, done, failed = (ctypes.c_int64 * n)(), (ctypes.c_int32 * n)(), ctypes.c_int32()
        states = (ctypes.c_uint32 * (4 * n))(*(_INIT * n))
        buf = (ctypes.c_uint8 * (LANES * (chunk + 2 * _BLOCK)))()
        unmapped, sizes = (ctypes.c_void_p * n)(), (ctypes.c_int64 * n)()
        read = lib.md5_round(n, slots, fds, unmapped, sizes, lengths, states, done, buf, chunk + 2 * _BLOCK,
                             chunk, ctypes.byref(failed))
    finally:
        for r, _ in pipes:
            os.close(r)
    got = [struct.pack("<4I", *states[4 * i: 4 * i + 4]).hex() for i in range(n)]
    return read == sum(map(len, blobs)) and all(done) and got == [hashlib.md5(b).hexdigest() for b in blobs]


def available() -> bool:
    """True when the compiled kernel is (or can be) built here and matches hashlib."""
    global _lib, _lib_failed
    if _lib is not None:
        return True
    if _lib_failed or os.environ.get("REPRO500_MD5MB", "1") == "0":
        return False
    with _lib_lock:
        if _lib is None and not _lib_failed:
            try:
                lib = _build()
                if _self_test(lib) and lib.md5_guard() == 0:
                    _lib = lib
                else:
                    _lib_failed = True
            except (OSError, AttributeError):
                _lib_failed = True  # no compiler, no vector extensions: hashlib it is
    return _lib is not None


def _pad(length: int) -> bytes:
    """MD5 padding for a message of ``length`` bytes (0x80, zeros, bit length LE)."""
    return b"\x80" + b"\x00" * ((55 - length) % 64) + struct.pack("<Q", (length * 8) & (2**64 - 1))


def _hash_files(lib: ctypes.CDLL, paths: Sequence[str], chunk_bytes: int = CHUNK_BYTES,
                on_bytes: Callable[[int], None] | None = None,
                stop: threading.Event | None = None) -> dict[str, str]:
    """{path: md5 hex} for ``paths``, hashed up to 32 at a time (one engine, one thread).

    A vector step costs as much with 2 live lanes as with 32, so a share of 50 equal files
    hashed 32 by 32 would spend its last rounds on 18 files.  Instead up to ``OPEN_FILES``
    files are open at once, each in a slot holding its MD5 state, and each round gives the
    lanes to the files with the most left to read: the files advance level and end together,
    and the lanes stay full until the last chunk (McNaughton's wrap-around rule).  A round's
    reading, padding and hashing is one call into C (``md5_round``), which releases the GIL:
    done in Python, 32 reads a round held the GIL long enough to serialize two engines.
    A regular file of more than one chunk is mapped (``md5_map``) and hashed in place; the others
    are read.  Returns early, with the files finished so far, once ``stop`` is set.
    """
    stride = chunk_bytes + 2 * _BLOCK  # room for the padding after a file's last bytes
    buf = (ctypes.c_uint8 * (LANES * stride))()
    fds = (ctypes.c_int32 * OPEN_FILES)()
    maps = (ctypes.c_void_p * OPEN_FILES)()  # NULL: read
    map_sizes = (ctypes.c_int64 * OPEN_FILES)()
    lengths = (ctypes.c_int64 * OPEN_FILES)()
    states = (ctypes.c_uint32 * (4 * OPEN_FILES))()
    done = (ctypes.c_int32 * OPEN_FILES)()
    lane_slots = (ctypes.c_int32 * LANES)()
    failed = ctypes.c_int32()
    open_paths: dict[int, str] = {}  # slot -> path of the file open there
    sizes: dict[int, int] = {}  # slot -> size at open, to rank files by what is left
    free = list(range(OPEN_FILES - 1, -1, -1))
    queue = list(reversed(paths))
    results: dict[str, str] = {}
    try:
        while stop is None or not stop.is_set():
            while queue and free:
                path, slot = queue.pop(), free.pop()
                fds[slot], sizes[slot], maps[slot], map_sizes[slot] = _open(lib, path, chunk_bytes)
                lengths[slot], done[slot], states[4 * slot: 4 * slot + 4] = 0, 0, _INIT
                open_paths[slot] = path
            if not open_paths:
                break
            lanes = (heapq.nlargest(LANES, open_paths, key=lambda k: sizes[k] - lengths[k])
                     if len(open_paths) > LANES else list(open_paths))
            lane_slots[:len(lanes)] = lanes
            read_bytes = lib.md5_round(len(lanes), lane_slots, fds, maps, map_sizes, lengths, states, done,
                                       buf, stride, chunk_bytes, ctypes.byref(failed))
            if read_bytes < 0 and failed.value < 0:
                raise _changed(lanes, fds, map_sizes, open_paths)
            if read_bytes < 0:  # name the file: EIO from a read carries none
                raise OSError(-read_bytes, os.strerror(-read_bytes), open_paths[failed.value])
            for slot in lanes:
                if done[slot]:
                    results[open_paths.pop(slot)] = struct.pack("<4I", *states[4 * slot: 4 * slot + 4]).hex()
                    _close(lib, slot, fds, maps, map_sizes)
                    free.append(slot)
            if on_bytes is not None:
                on_bytes(read_bytes)
    finally:
        for slot in open_paths:
            _close(lib, slot, fds, maps, map_sizes)
    return results


def _open(lib: ctypes.CDLL, path: str, chunk_bytes: int) -> tuple[int, int, int | None, int]:
    """(fd, size, mapping, size mapped) of a file opened for hashing.  Read, its size is a priority
    only (the end is where reads stop); mapped, the size hashed (a file that grows is hashed as it
    was when opened).  A regular file of more than a chunk is mapped, unless it cannot be (NULL)."""
    fd = os.open(path, os.O_RDONLY)
    st = os.fstat(fd)
    if stat.S_ISREG(st.st_mode) and st.st_size > chunk_bytes:
        where = lib.md5_map(fd, st.st_size)
        if where:
            return fd, st.st_size, where, st.st_size
    return fd, st.st_size, None, 0


class ChangedWhileHashing(OSError):
    """A mapped file shrank while it was hashed (a write to it, or its replacement in place)."""


def _close(lib: ctypes.CDLL, slot: int, fds: Any, maps: Any, map_sizes: Any) -> None:
    if maps[slot]:
        lib.md5_unmap(maps[slot], map_sizes[slot])
        maps[slot], map_sizes[slot] = None, 0
    with contextlib.suppress(OSError):
        os.close(fds[slot])


def _changed(lanes: list[int], fds: Any, map_sizes: Any, open_paths: dict[int, str]) -> ChangedWhileHashing:
    """The fault a round ended with, named: the mapped file of the round whose size is not the size
    it was mapped with (else, the round's first mapped file)."""
    mapped = [slot for slot in lanes if map_sizes[slot]]
    shrunk = [slot for slot in mapped if os.fstat(fds[slot]).st_size != map_sizes[slot]]
    path = open_paths[(shrunk or mapped or lanes)[0]]
    return ChangedWhileHashing(errno.EFAULT, "it changed while it was being hashed", path)


def md5_files(paths: Sequence[str], on_bytes: Callable[[int], None] | None = None,
              stop: threading.Event | None = None) -> dict[str, str]:
    """{path: md5 hex} via the multi-buffer kernel (call :func:`available` first)."""
    if not available():
        raise RuntimeError("the multi-buffer MD5 kernel is not available here")
    assert _lib is not None
    return _hash_files(_lib, paths, on_bytes=on_bytes, stop=stop)
