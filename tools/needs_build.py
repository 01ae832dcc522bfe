"""Exit 0 when the in-place extension is current for this Python and torch, 1 when it must be built.

Current = `import mla_ext` (from this checkout) loads, was built against the running torch, and its
library is newer than every compiled source, csrc/sources.txt and setup.py. `make setup` uses it
so that `make test` does not recompile every kernel each time.
"""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROBE = """
import os, sys, torch, mla_ext
from mla_ext._load import _build_info
info = _build_info()
ok = (os.path.dirname(os.path.abspath(mla_ext.__file__)) == os.path.join(sys.argv[1], "mla_ext")
      and info.get("torch_full_version") == torch.__version__)
print(mla_ext._LIBRARY_PATH if ok else "")
"""


def main() -> int:
    try:
        out = subprocess.run([sys.executable, "-c", PROBE, ROOT], capture_output=True, text=True,
                             cwd=os.path.expanduser("~"), timeout=120)
    except Exception:
        return 1
    lib = out.stdout.strip().splitlines()[-1] if out.returncode == 0 and out.stdout.strip() else ""
    if not lib or not os.path.exists(lib):
        return 1
    built = os.path.getmtime(lib)
    inputs = [os.path.join(ROOT, "setup.py"), os.path.join(ROOT, "csrc", "sources.txt")]
    for base, _, files in os.walk(os.path.join(ROOT, "csrc")):
        inputs += [os.path.join(base, f) for f in files]
    return 0 if all(os.path.getmtime(p) <= built for p in inputs) else 1


if __name__ == "__main__":
    sys.exit(main())
