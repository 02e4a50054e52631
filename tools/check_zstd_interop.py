#!/usr/bin/env python3
"""Check that libfsdp's zstd filter (HDF5 filter id 32015) and hdf5plugin's Zstd read each
other's files. Optional and run by hand: it needs h5py and hdf5plugin, which libfsdp never
does, and a build of libfsdp with its tests (the test binary writes our file, h5dump and the
plugin read theirs).

    python3 -m venv .venv && .venv/bin/pip install h5py hdf5plugin
    .venv/bin/python tools/check_zstd_interop.py --build build

Checks, each in a fresh Python process so that hdf5plugin's filter and ours never meet:
  1. a file written by libfsdp's registered filter (test_ckpt_zstd's roundtrip case) reads
     back bitwise with h5py + `import hdf5plugin`;
  2. a file written with hdf5plugin.Zstd reads back bitwise through libfsdp's plugin, in h5dump
     (the system's HDF5) and in h5py's own HDF5 with HDF5_PLUGIN_PATH and no hdf5plugin;
  3. a file written through libfsdp's plugin by h5py reads back with hdf5plugin.

--write-fixture PATH writes the file of check 2 to PATH: tests/fixtures/zstd_hdf5plugin.h5, which
test_ckpt_zstd reads through the library's filter, was made this way.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

FILL = """
import numpy as np
def fill(n):  # tests/test_ckpt_zstd.c fill(): (float)((i * 7) % 13) * 0.1f - 0.35f
    return (np.arange(n) * 7 % 13).astype(np.float32) * np.float32(0.1) - np.float32(0.35)
"""

# Writes `path` with hdf5plugin.Zstd: /x (16, 64) f32 in (4, 64) chunks, level 5.
WRITE_HDF5PLUGIN = FILL + """
import sys, h5py, hdf5plugin
with h5py.File(sys.argv[1], "w", libver="earliest") as f:
    f.create_dataset("x", data=fill(16 * 64).reshape(16, 64), chunks=(4, 64),
                     **hdf5plugin.Zstd(clevel=5))
"""

# Reads dataset argv[2] of argv[1] (with hdf5plugin when argv[3] is "hdf5plugin") and checks it
# equals fill() bitwise and goes through filter 32015.
READ = FILL + """
import sys, h5py
if sys.argv[3] == "hdf5plugin":
    import hdf5plugin
with h5py.File(sys.argv[1], "r") as f:
    d = f[sys.argv[2]]
    plist = d.id.get_create_plist()
    assert 32015 in [plist.get_filter(i)[0] for i in range(plist.get_nfilters())], "no 32015"
    got = d[()].ravel()
    want = fill(got.size)
    assert got.dtype == np.float32 and got.tobytes() == want.tobytes(), "values differ"
    print(f"  {sys.argv[1]}:/{sys.argv[2]} {d.shape} read bitwise ({sys.argv[3]})")
"""

# Writes argv[1] through whatever filter 32015 HDF5_PLUGIN_PATH provides (no hdf5plugin).
WRITE_PLUGIN = FILL + """
import sys, h5py
with h5py.File(sys.argv[1], "w") as f:
    f.create_dataset("y", data=fill(32 * 128).reshape(32, 128), chunks=(8, 128),
                     compression=32015, compression_opts=(7,), allow_unknown_filter=False)
"""


def python(script, *args, env=None):
    subprocess.run([sys.executable, "-c", script, *args], check=True, env=env)


def h5dump_values(path, dataset, plugin_dir):
    env = dict(os.environ, HDF5_PLUGIN_PATH=plugin_dir)
    out = subprocess.run(["h5dump", "-y", "-w", "0", "-m", "%.9g", "-d", dataset, path],
                         check=True, capture_output=True, text=True, env=env).stdout
    body = out.split("DATA {", 1)[1].split("}", 1)[0]
    return [float(v) for v in body.replace(",", " ").split()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build", help="libfsdp build folder (default: build)")
    ap.add_argument("--write-fixture", metavar="PATH", help="only write check 2's file to PATH")
    args = ap.parse_args()
    if args.write_fixture:
        python(WRITE_HDF5PLUGIN, args.write_fixture)
        return
    plugin_dir = os.path.abspath(os.path.join(args.build, "hdf5", "plugin"))
    test = os.path.join(args.build, "tests", "test_ckpt_zstd")
    with_plugin = dict(os.environ, HDF5_PLUGIN_PATH=plugin_dir)
    tmp = tempfile.mkdtemp()
    try:
        print("1. libfsdp's filter writes, h5py + hdf5plugin reads")
        subprocess.run([test, "roundtrip_bitwise_and_smaller"], check=True,
                       stdout=subprocess.DEVNULL)
        ours = os.path.join(args.build, "test_ckpt_zstd.h5")
        for name in ("w", "z"):
            python(READ, ours, name, "hdf5plugin")

        print("2. hdf5plugin.Zstd writes, libfsdp's plugin reads (h5dump, then h5py)")
        theirs = os.path.join(tmp, "hdf5plugin.h5")
        python(WRITE_HDF5PLUGIN, theirs)
        values = h5dump_values(theirs, "/x", plugin_dir)
        python(FILL + "import sys\nassert np.array(sys.argv[1:], dtype=np.float32).tobytes()"
               " == fill(16 * 64).tobytes(), 'h5dump values differ'", *map(repr, values))
        print(f"  h5dump {theirs}:/x: {len(values)} values equal")
        python(READ, theirs, "x", "plugin", env=with_plugin)

        print("3. h5py writes through libfsdp's plugin, h5py + hdf5plugin reads")
        through = os.path.join(tmp, "plugin.h5")
        python(WRITE_PLUGIN, through, env=with_plugin)
        python(READ, through, "y", "hdf5plugin")
        print("all interop checks passed")
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
