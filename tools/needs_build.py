"""Exit 0 when the in-place extension is current for this Python and torch, 1 when it must be built.

Current = `import mla_ext` (from this checkout) loads, was built against the running torch, and its
library is newer than every compiled source, csrc/sources.txt and setup.py. `make setup` uses it
so that `make test` does not recompile every kernel each time. When a build is needed it says why
on stderr (pip then builds quietly: a CPU build takes seconds, a CUDA one minutes).
"""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROBE = """
import os, sys, torch, mla_ext
from mla_ext._load import _build_info
built_with = _build_info().get("torch_full_version")
where = os.path.dirname(os.path.abspath(mla_ext.__file__))
if where != os.path.join(sys.argv[1], "mla_ext"):
    print(f"why `import mla_ext` loads another checkout ({where})")
elif built_with != torch.__version__:
    print(f"why it was built against torch {built_with}, this Python has {torch.__version__}")
else:
    print("lib " + mla_ext._LIBRARY_PATH)
"""


def _say(why: str) -> int:
    print(f"mla_ext: building the extension: {why} (pip runs quietly: seconds for a CPU build, "
          "minutes for a CUDA one)", file=sys.stderr, flush=True)
    return 1


def main() -> int:
    try:
        out = subprocess.run([sys.executable, "-c", PROBE, ROOT], capture_output=True, text=True,
                             cwd=os.path.expanduser("~"), timeout=120)
    except Exception as e:  # any failure of the probe (timeout, no interpreter) means: build
        return _say(f"the import probe failed ({type(e).__name__})")
    last = out.stdout.strip().splitlines()[-1] if out.returncode == 0 and out.stdout.strip() else ""
    if last.startswith("why "):
        return _say(last[4:])
    lib = last[4:] if last.startswith("lib ") else ""
    if not lib or not os.path.exists(lib):
        return _say("`import mla_ext` fails in this Python (not built or not installed yet)")
    built = os.path.getmtime(lib)
    inputs = [os.path.join(ROOT, "setup.py"), os.path.join(ROOT, "csrc", "sources.txt")]
    for base, _, files in os.walk(os.path.join(ROOT, "csrc")):
        inputs += [os.path.join(base, f) for f in files]
    newer = [p for p in inputs if os.path.getmtime(p) > built]
    if newer:
        return _say(f"{os.path.relpath(newer[0], ROOT)} is newer than the built library"
                    + (f" (and {len(newer) - 1} more)" if len(newer) > 1 else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
