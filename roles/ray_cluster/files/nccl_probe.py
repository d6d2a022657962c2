# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""Which libnccl the serving image's torch loads, and which build it and the node's are.

tasks/nccl_choice.yml runs it in a throwaway container of the serving image, as
``python3 -c <this file> <elf_notes.py's text> [<the node's libnccl, mounted read-only>]``, and
reads the last line that starts with MARK: one JSON object

* ``version``: what torch reports (``2.28.9``); a CPU build has none, and then the version of a
  pip NCCL wheel (nvidia-nccl-cu*) installed beside it, if any;
* ``library``: the build (elf_notes.library_build) of the file torch maps once it has asked
  NCCL for its version, with ``how`` saying so; where torch maps none, the wheel's
  ``libnccl.so.2`` (what torch's run path finds first), else the system's;
* ``files``: every libnccl file the image holds; ``node``: the build of the node's file, or
  None where none was mounted.

Standard library only, under whatever Python the image has.
"""

import glob
import json
import os
import sys
import sysconfig
from importlib import metadata

MARK = "dgx-spark-nccl: "
WHEELS = ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11")

notes = {}
exec(compile(sys.argv[1], "elf_notes.py", "exec"), notes)
library_build = notes["library_build"]
node_library = sys.argv[2] if len(sys.argv) > 2 else ""


def mapped():
    """The libnccl files this process maps (not NCCL's network plugins, libnccl-net*)."""
    found = set()
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(None, 5)
                name = os.path.basename(fields[-1].strip())
                if len(fields) == 6 and name.startswith("libnccl.so"):
                    found.add(fields[5].strip())
    except OSError:
        pass
    return sorted(path for path in found if path.startswith("/"))


try:
    import torch

    reported = torch.cuda.nccl.version()
    version = ".".join(map(str, reported)) if isinstance(reported, tuple) else str(reported)
except Exception as exc:
    version = "none in torch (" + type(exc).__name__ + ": a CPU build has no NCCL)"
    for name in WHEELS:
        try:
            version = metadata.version(name) + " (the " + name + " wheel; torch has none)"
            break
        except metadata.PackageNotFoundError:
            pass

sites = [sysconfig.get_paths()["purelib"]] + [p for p in sys.path if p.endswith("-packages")]
wheel_files = []
for site in dict.fromkeys(sites):
    wheel_files += sorted(glob.glob(os.path.join(site, "nvidia", "nccl*", "lib", "libnccl.so*")))
system_files = sorted(glob.glob("/usr/lib/*/libnccl.so*") + glob.glob("/usr/lib/libnccl.so*"))

loaded = mapped()
if loaded:
    chosen, how = loaded[0], "mapped by torch"
else:
    sonames = [f for f in wheel_files + system_files if f.endswith("/libnccl.so.2")]
    chosen = sonames[0] if sonames else ""
    whose = "a pip wheel's" if chosen in wheel_files else "the system's"
    how = whose + " libnccl.so.2 (torch maps none)"
library = dict(library_build(chosen), how=how) if chosen else None

answer = {
    "version": version,
    "library": library,
    "files": wheel_files + system_files,
    "node": library_build(node_library) if node_library else None,
}
print(MARK + json.dumps(answer, sort_keys=True))
sys.stdout.flush()
