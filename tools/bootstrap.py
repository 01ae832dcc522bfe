"""Install what building and testing mla_ext needs, and nothing that is already there.

- torch: kept if a torch >= 2.10 is importable (e.g. a CUDA build on a GPU
  machine with no network); otherwise ``torch==2.13.0`` is installed from pip's configured
  index (the CPU wheel on this project's build machines; PyPI's default Linux wheel is the CUDA
  build).
- Python packages named on the command line: installed only if missing.
- Packages after ``--optional`` (e.g. matplotlib, for ``mla-ext decode --plot``): installed if
  missing and possible; when pip cannot get them (a GPU machine without network) a warning is
  printed and setup goes on.
"""
import importlib.util
import subprocess
import sys


def have_torch() -> bool:
    try:
        import torch
    except Exception:
        return False
    major, minor = (int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    return (major, minor) >= (2, 10)


def pip(*args: str) -> None:
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", *args])


def main(modules: list[str], optional: list[str] = ()) -> None:
    if not have_torch():
        print("bootstrap: no torch >= 2.10 found; installing torch==2.13.0", flush=True)
        pip("torch==2.13.0")
    # module name -> pip name
    names = {"yaml": "pyyaml"}
    missing = [names.get(m, m) for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        print(f"bootstrap: installing {' '.join(missing)}", flush=True)
        pip(*missing)
    for m in optional:
        if importlib.util.find_spec(m) is None:
            print(f"bootstrap: installing {names.get(m, m)} (optional)", flush=True)
            try:
                pip("--retries", "1", "--timeout", "15", names.get(m, m))
            except subprocess.CalledProcessError:
                print(f"bootstrap: warning: could not install {names.get(m, m)}; going on without it", flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    cut = args.index("--optional") if "--optional" in args else len(args)
    main(args[:cut], args[cut + 1:])
